//! The seeded PRNG held in the coordinator's state.

use serde::{Deserialize, Serialize};

/// SplitMix64: tiny, fast, and its whole state is one `u64`, so it serializes with the
/// snapshot and a restored coordinator draws the same numbers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded by the host (from the OS entropy source in production).
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..=max`, without modulo bias (Lemire's multiply-shift with
    /// rejection), so every runtime draws the same value from the same state.
    pub fn below_or_eq(&mut self, max: u64) -> u64 {
        let Some(range) = max.checked_add(1) else {
            return self.next_u64();
        };
        let threshold = range.wrapping_neg() % range;
        loop {
            let product = u128::from(self.next_u64()) * u128::from(range);
            // The low half is below 2^64 by construction.
            let low = product as u64;
            if low >= threshold {
                return (product >> 64) as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_gives_same_sequence() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn below_or_eq_stays_in_range_including_extremes() {
        let mut r = Rng::new(1);
        for max in [0u64, 1, 2, 999, u64::MAX - 1, u64::MAX] {
            for _ in 0..200 {
                assert!(r.below_or_eq(max) <= max);
            }
        }
        assert_eq!(r.below_or_eq(0), 0);
    }
}
