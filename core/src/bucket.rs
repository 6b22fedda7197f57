//! Token buckets with continuous refill, exact in scaled integers.
//!
//! A bucket's level is kept in *token-milliseconds*: one token is `window_ms` units, and
//! each millisecond adds `cap` units, where `cap` is the effective capacity per window.
//! Refill therefore never rounds a token away, whatever the rate. The level may go negative
//! (debt) when a settle charges more than a lease reserved, or a provider header says the
//! key has less left than we thought.

use serde::{Deserialize, Serialize};

/// A rate-limited dimension of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Axis {
    /// Input tokens per window.
    InputTokens,
    /// Output tokens per window.
    OutputTokens,
    /// Input plus output tokens per window.
    Tokens,
    /// Requests per window.
    Requests,
}

impl Axis {
    /// Every rate axis, in the order used by [`Demand`].
    pub const ALL: [Axis; 4] = [
        Axis::InputTokens,
        Axis::OutputTokens,
        Axis::Tokens,
        Axis::Requests,
    ];

    pub(crate) const fn index(self) -> usize {
        match self {
            Axis::InputTokens => 0,
            Axis::OutputTokens => 1,
            Axis::Tokens => 2,
            Axis::Requests => 3,
        }
    }
}

/// An amount on each rate axis, in [`Axis::ALL`] order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Demand(pub [u64; 4]);

impl Demand {
    /// The amount on one axis.
    #[must_use]
    pub const fn get(&self, axis: Axis) -> u64 {
        self.0[axis.index()]
    }

    pub(crate) fn saturating_add(self, other: Demand) -> Demand {
        let mut out = self;
        for (o, b) in out.0.iter_mut().zip(other.0) {
            *o = o.saturating_add(b);
        }
        out
    }
}

/// One axis of one pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Bucket {
    /// The provider's real limit per window; `None` while unknown (the axis does not gate).
    pub(crate) limit: Option<u64>,
    /// Effective capacity per window (limit × margin × ramp), at least 1 when the limit is known.
    pub(crate) cap: u64,
    /// Level in token-milliseconds; may be negative (debt).
    pub(crate) level: i128,
}

impl Bucket {
    pub(crate) fn new(limit: Option<u64>) -> Bucket {
        Bucket {
            limit,
            cap: 0,
            level: 0,
        }
    }

    pub(crate) fn gates(&self) -> bool {
        self.limit.is_some()
    }

    fn full(&self, window: u64) -> i128 {
        i128::from(self.cap) * i128::from(window)
    }

    /// Adds `elapsed` ms of refill at the capacity in force.
    pub(crate) fn refill(&mut self, elapsed: u64, window: u64) {
        if !self.gates() || elapsed == 0 {
            return;
        }
        let full = self.full(window);
        if self.level >= full {
            return;
        }
        let add = i128::from(elapsed).saturating_mul(i128::from(self.cap));
        self.level = self.level.saturating_add(add).min(full);
    }

    /// Changes the effective capacity; a level above the new capacity is cut to it.
    /// `start_full` fills the bucket (used when a limit first becomes known).
    pub(crate) fn set_cap(&mut self, cap: u64, window: u64, start_full: bool) {
        self.cap = cap;
        let full = self.full(window);
        if start_full {
            self.level = full;
        } else {
            self.level = self.level.min(full);
        }
    }

    /// Whole tokens available now (negative in debt).
    pub(crate) fn available(&self, window: u64) -> i128 {
        self.level.div_euclid(i128::from(window.max(1)))
    }

    /// Whether `n` fits now. A full bucket admits any request (up to the capacity checked at
    /// request time), so a request larger than a capacity shrunk by a margin cut still
    /// progresses; the overshoot is at most one request, recorded as debt.
    pub(crate) fn fits(&self, n: u64, window: u64) -> bool {
        if !self.gates() {
            return true;
        }
        let need = i128::from(n).saturating_mul(i128::from(window));
        self.level >= need || self.level >= self.full(window)
    }

    pub(crate) fn take(&mut self, n: u64, window: u64) {
        if self.gates() {
            let need = i128::from(n).saturating_mul(i128::from(window));
            self.level = self.level.saturating_sub(need);
        }
    }

    /// Refund (positive) or charge (negative) whole tokens; never fills beyond capacity.
    pub(crate) fn adjust(&mut self, tokens: i128, window: u64) {
        if self.gates() {
            let delta = tokens.saturating_mul(i128::from(window));
            self.level = self.level.saturating_add(delta).min(self.full(window));
        }
    }

    /// Milliseconds until `n` tokens fit (0 if they fit now), or `None` if the bucket
    /// cannot refill.
    pub(crate) fn ms_until_fits(&self, n: u64, window: u64) -> Option<u64> {
        if self.fits(n, window) {
            return Some(0);
        }
        if self.cap == 0 {
            return None;
        }
        let need = i128::from(n)
            .saturating_mul(i128::from(window))
            .min(self.full(window));
        let deficit = need.saturating_sub(self.level);
        let cap = i128::from(self.cap);
        let ms = deficit.saturating_add(cap - 1) / cap;
        Some(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    /// Lowers the level to what the provider reports, never raises it: `remaining` of the
    /// real `limit` maps to `remaining − (limit − cap)` here. Differences within the
    /// provider's rounding `granularity` are ignored. Returns whether the level moved.
    pub(crate) fn resync(&mut self, remaining: u64, granularity: u64, window: u64) -> bool {
        let Some(limit) = self.limit else {
            return false;
        };
        let headroom = i128::from(limit) - i128::from(self.cap);
        let theirs = i128::from(remaining) - headroom;
        let ours = self.available(window);
        if ours > theirs.saturating_add(i128::from(granularity)) {
            self.level = theirs.saturating_mul(i128::from(window));
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 60_000;

    fn bucket(limit: u64) -> Bucket {
        let mut b = Bucket::new(Some(limit));
        b.set_cap(limit, W, true);
        b
    }

    #[test]
    fn refill_is_exact_for_rates_below_one_token_per_ms() {
        let mut b = bucket(7);
        b.take(7, W);
        for _ in 0..60_000 {
            b.refill(1, W);
        }
        assert_eq!(
            b.available(W),
            7,
            "7 tokens/min must refill exactly in 60000 1-ms steps"
        );
    }

    #[test]
    fn refill_never_exceeds_capacity() {
        let mut b = bucket(100);
        b.refill(u64::MAX, W);
        assert_eq!(b.available(W), 100);
    }

    #[test]
    fn debt_is_allowed_and_repaid_by_refill() {
        let mut b = bucket(600);
        b.take(600, W);
        b.adjust(-300, W);
        assert_eq!(b.available(W), -300);
        assert_eq!(b.ms_until_fits(1, W), Some(30_100));
    }

    #[test]
    fn full_bucket_admits_oversize_request() {
        let mut b = bucket(1000);
        b.set_cap(600, W, false);
        assert!(b.fits(900, W));
        b.take(900, W);
        assert!(!b.fits(1, W));
    }

    #[test]
    fn unknown_limit_never_gates() {
        let mut b = Bucket::new(None);
        assert!(b.fits(u64::MAX, W));
        b.take(u64::MAX, W);
        assert_eq!(b.ms_until_fits(u64::MAX, W), Some(0));
    }

    #[test]
    fn resync_only_lowers_and_respects_granularity() {
        let mut b = Bucket::new(Some(1000));
        b.set_cap(850, W, true);
        assert!(
            !b.resync(1000, 0, W),
            "provider has more room than we think: keep ours"
        );
        assert!(!b.resync(900, 100, W), "900-150=750 within 100 of 850");
        assert!(b.resync(500, 0, W));
        assert_eq!(b.available(W), 350);
    }
}
