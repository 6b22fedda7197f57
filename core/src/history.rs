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
        let mut v = self.values;
        let v = &mut v[..self.len()];
        v.sort_unstable();
        let n = v.len();
        let rank = (usize::try_from(permille.min(1000)).unwrap_or(1000) * n).div_ceil(1000);
        Some(u64::from(v[rank.clamp(1, n) - 1]))
    }

    /// The median (the lower of the two middle figures for an even count).
    pub(crate) fn median(&self) -> Option<u64> {
        self.percentile(500)
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
