//! A short history of recent figures (settled output tokens, estimate errors) and the order
//! statistics the core decides with: a high percentile for the output reservation, the
//! median for the estimate alert.
//!
//! Fixed-size and `Copy`, so an agent's per-pool state stays a plain value; stored as the
//! list of figures, oldest first.

use alloc::vec::Vec;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Most figures a history holds.
pub(crate) const CAPACITY: usize = 16;

/// The last (at most [`CAPACITY`]) figures recorded, oldest first in `values[..len]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct History {
    values: [u32; CAPACITY],
    /// How many of `values` are in use.
    len: u8,
}

impl History {
    /// Whether nothing has been recorded.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many figures are held.
    pub(crate) fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Records `v` (saturated at `u32::MAX`), keeping at most `keep` figures (1 to
    /// [`CAPACITY`]): the oldest go first.
    pub(crate) fn push(&mut self, v: u64, keep: usize) {
        let keep = keep.clamp(1, CAPACITY);
        let v = u32::try_from(v).unwrap_or(u32::MAX);
        let len = self.len();
        if len >= keep {
            // Drop the oldest (more than one if the window was made smaller).
            let drop = len + 1 - keep;
            self.values.copy_within(drop..len, 0);
            self.len = u8::try_from(keep - 1).unwrap_or(0);
        }
        self.values[self.len()] = v;
        self.len += 1;
    }

    /// The figure the next `push` with this `keep` drops first, if it drops one.
    pub(crate) fn leaving(&self, keep: usize) -> Option<u64> {
        (self.len() >= keep.clamp(1, CAPACITY)).then(|| u64::from(self.values[0]))
    }

    /// How many of the figures are at most `v`.
    pub(crate) fn count_at_most(&self, v: u64) -> usize {
        self.ordered()
            .iter()
            .filter(|&&x| u64::from(x) <= v)
            .count()
    }

    /// The figures, oldest first.
    fn ordered(&self) -> &[u32] {
        &self.values[..self.len()]
    }

    /// The nearest-rank `permille` percentile of the figures (`None` when empty): the
    /// smallest figure with at least that share of the figures at or below it.
    pub(crate) fn percentile(&self, permille: u32) -> Option<u64> {
        if self.is_empty() {
            return None;
        }
        let n = self.len();
        let rank = (usize::try_from(permille.min(1000)).unwrap_or(1000) * n)
            .div_ceil(1000)
            .clamp(1, n);
        // The ends are one pass: with at most 16 figures a high percentile (the output
        // reservation's 95th, asked on every lease) is the largest.
        let v = if rank == n {
            self.ordered().iter().fold(0, |m, &x| m.max(x))
        } else if rank == 1 {
            self.ordered().iter().fold(u32::MAX, |m, &x| m.min(x))
        } else {
            let mut v = self.values;
            let v = &mut v[..n];
            v.sort_unstable();
            v[rank - 1]
        };
        Some(u64::from(v))
    }

    /// The median (the lower of the two middle figures for an even count).
    pub(crate) fn median(&self) -> Option<u64> {
        self.percentile(500)
    }

    /// Whether the median is above `v` (false when empty): one pass, no sort. The median
    /// is the figure of rank ⌈n/2⌉, so it is above `v` exactly when fewer than that many
    /// figures are at most `v`.
    pub(crate) fn median_above(&self, v: u64) -> bool {
        !self.is_empty() && self.count_at_most(v) < self.len().div_ceil(2)
    }
}

impl Serialize for History {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.ordered().serialize(s)
    }
}

impl<'de> Deserialize<'de> for History {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Vec::<u32>::deserialize(d)?;
        if v.len() > CAPACITY {
            return Err(serde::de::Error::invalid_length(
                v.len(),
                &"at most 16 figures",
            ));
        }
        let mut h = History::default();
        for x in v {
            h.push(u64::from(x), CAPACITY);
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_and_ranks_them() {
        let mut h = History::default();
        assert_eq!(h.percentile(950), None);
        for v in 1..=20u64 {
            h.push(v * 100, 16);
        }
        assert_eq!(h.len(), 16);
        // 500..=2000 held: the 95th percentile of 16 is the 16th (ceil(15.2)).
        assert_eq!(h.percentile(950), Some(2000));
        assert_eq!(h.percentile(900), Some(1900));
        assert_eq!(h.median(), Some(1200));
        assert_eq!(h.percentile(0), Some(500));
    }

    #[test]
    fn every_percentile_is_the_sorted_figure_at_its_rank() {
        let mut seed = 0x2545_f491_u64;
        for round in 0..400 {
            let mut h = History::default();
            // Fill to capacity, then shrink the window to `len` (as a smaller `keep` in
            // the configuration does), so dropped slots are exercised.
            let len = round % CAPACITY + 1;
            for i in 0..CAPACITY + len {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let keep = if i < CAPACITY { CAPACITY } else { len };
                // Few distinct values, so ties are common.
                h.push((seed >> 33) % 7 + 1, keep);
            }
            assert_eq!(h.len(), len);
            let mut sorted = h.ordered().to_vec();
            sorted.sort_unstable();
            for t in 0..9 {
                assert_eq!(h.median_above(t), h.median().unwrap() > t, "{t} {sorted:?}");
            }
            for permille in (0..=1000).step_by(25).chain([999, 1001, u32::MAX]) {
                let rank = (permille.min(1000) as usize * len)
                    .div_ceil(1000)
                    .clamp(1, len);
                assert_eq!(
                    h.percentile(permille),
                    Some(u64::from(sorted[rank - 1])),
                    "{permille}‰ of {sorted:?}"
                );
            }
        }
    }

    #[test]
    fn a_smaller_window_keeps_its_newest_figures() {
        let mut h = History::default();
        for v in 1..=10u64 {
            h.push(v, 4);
        }
        assert_eq!(h.len(), 4);
        assert_eq!(h.ordered(), [7, 8, 9, 10]);
        h.push(11, 2);
        assert_eq!(h.ordered(), [10, 11]);
        h.push(12, 3);
        assert_eq!(h.ordered(), [10, 11, 12]);
        h.push(13, 3);
        assert_eq!(h.ordered(), [11, 12, 13]);
    }

    #[test]
    fn serializes_oldest_first_and_refuses_too_many() {
        let mut h = History::default();
        for v in [5u64, u64::MAX, 7] {
            h.push(v, 16);
        }
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(json, "[5,4294967295,7]");
        let back: History = serde_json::from_str(&json).unwrap();
        assert_eq!(back, h);
        let long = serde_json::to_string(&[1u32; 17]).unwrap();
        assert!(serde_json::from_str::<History>(&long).is_err());
    }
}
