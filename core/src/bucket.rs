//! Token buckets with continuous refill, exact in scaled integers.
//!
//! A bucket's level is kept in *token-milliseconds*: one token is `window_ms` units, and
//! each millisecond adds `cap` units, where `cap` is the effective capacity per window.
//! Refill therefore never rounds a token away, whatever the rate. The level may go negative
//! (debt) when a settle charges more than a lease reserved, or a provider header says the
//! key has less left than we thought.
//!
//! [`TokenBucket`] is the same arithmetic offered on its own, for one limit without leases.

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, FieldPath};
use crate::time::{MAX_DURATION_MS, Millis};

/// Largest token, request or limit figure the core accepts: 2^53 − 1, the largest integer
/// a JavaScript `number` holds exactly.
pub const MAX_TOKENS: u64 = (1 << 53) - 1;

/// The parts a limit is divided into for a call's share of it: a call taking a whole
/// window's limit on its binding axis has a share of 10⁹.
pub(crate) const SHARE_UNIT: u64 = 1_000_000_000;

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
    /// Capacity per window ignoring the ramp (limit × margin), at least 1 when the limit is
    /// known, 0 while it is not: no request above it can ever be granted.
    pub(crate) nominal: u64,
    /// Level in token-milliseconds; may be negative (debt).
    pub(crate) level: i128,
    /// Whether the provider charges this axis when a call arrives (Anthropic input tokens)
    /// rather than reserving and correcting like the coordinator does. See
    /// [`Bucket::refund_room`].
    #[serde(default)]
    pub(crate) charged_on_arrival: bool,
    /// Refill still withheld, ms from the pool's last refill: a take from a full bucket
    /// starts the provider's refill only when the call reaches it (see [`Bucket::take`]).
    #[serde(default)]
    pub(crate) lag_ms: u64,
}

/// `a × b` in token-milliseconds: exact, since two `u64`s multiply within `u128` (one
/// machine multiply, where `i128::saturating_mul` calls a checked 128-bit routine), and
/// saturated at `i128::MAX` beyond it, which no configured limit and window reach.
#[inline]
pub(crate) fn product(a: u64, b: u64) -> i128 {
    i128::try_from(u128::from(a) * u128::from(b)).unwrap_or(i128::MAX)
}

impl Bucket {
    pub(crate) fn new(limit: Option<u64>) -> Bucket {
        Bucket {
            limit,
            cap: 0,
            nominal: 0,
            level: 0,
            charged_on_arrival: false,
            lag_ms: 0,
        }
    }

    pub(crate) fn gates(&self) -> bool {
        self.limit.is_some()
    }

    fn full(&self, window: u64) -> i128 {
        product(self.cap, window)
    }

    /// Adds `elapsed` ms of refill at the capacity in force.
    pub(crate) fn refill(&mut self, elapsed: u64, window: u64) {
        if !self.gates() || elapsed == 0 {
            return;
        }
        // The refill a take from full withheld comes first.
        let withheld = self.lag_ms.min(elapsed);
        self.lag_ms -= withheld;
        let elapsed = elapsed - withheld;
        if elapsed == 0 {
            return;
        }
        let full = self.full(window);
        if self.level >= full {
            return;
        }
        let add = product(elapsed, self.cap);
        self.level = self.level.saturating_add(add).min(full);
    }

    /// Changes the effective capacity; a level above a lower capacity is cut to it (a level
    /// the provider's figure raised above the capacity, see [`Bucket::resync`], is kept
    /// while the capacity does not fall). `start_full` fills the bucket (used when a limit
    /// first becomes known).
    pub(crate) fn set_cap(&mut self, cap: u64, window: u64, start_full: bool) {
        let lower = cap < self.cap;
        self.cap = cap;
        let full = self.full(window);
        if start_full {
            self.level = full;
        } else if lower {
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
        let need = product(n, window);
        self.level >= need || self.level >= self.full(window)
    }

    /// Reserves `n` for a lease. A take from a full bucket may withhold the next `lag_ms` of
    /// refill: the provider's bucket, full as well, starts refilling only when the call
    /// reaches it, up to `lag_ms` after the grant (`feedback.arrival_ms`), so ours, refilled
    /// from the grant, runs ahead of it by what the limit refills in the call's way there.
    /// A margin's reserve (the limit above the capacity) absorbs that; where it is smaller
    /// (an axis counted exactly, a margin risen near 100 %) the first call granted from the
    /// refill would reach the provider a little early and meet a 429, so the refill is
    /// withheld. What is spendable now is unchanged.
    pub(crate) fn take(&mut self, n: u64, lag_ms: u64, window: u64) {
        if let Some(limit) = self.limit {
            let full = self.full(window);
            let reserve = product(limit.saturating_sub(self.cap), window);
            if n > 0 && self.level >= full && reserve < product(lag_ms, limit) {
                self.lag_ms = lag_ms;
            }
            let need = product(n, window);
            self.level = self.level.saturating_sub(need);
        }
    }

    /// The most a lease granted at level `grant_level` (token-ms, after its own take)
    /// `elapsed` ms ago may have refunded, in token-ms. The provider charged what the call
    /// really used when it arrived, so its bucket was fuller than ours by the
    /// over-reservation and stopped filling at full sooner: refill ours has gained since
    /// past `full − over-reservation` is refill the provider wasted, and refunding it would
    /// count the same headroom twice. The bound ignores other leases' takes, which only
    /// lowered our level, so it errs on the side of refunding less.
    pub(crate) fn refund_room(&self, grant_level: i128, elapsed: u64, window: u64) -> i128 {
        if !self.charged_on_arrival {
            return i128::MAX;
        }
        let full = self.full(window);
        let high = grant_level
            .saturating_add(product(elapsed, self.cap))
            .min(full);
        full.saturating_sub(high).max(0)
    }

    /// Ends a reservation of `reserved` that really used `used`: an under-reservation is
    /// charged at once (debt); an over-reservation is refunded, at most `room` token-ms
    /// (see [`Bucket::refund_room`]). A reaped lease ends with `used == reserved`.
    pub(crate) fn release(&mut self, reserved: u64, used: u64, room: i128, window: u64) {
        if !self.gates() {
            return;
        }
        let reserved = product(reserved, window);
        let used = product(used, window);
        if used > reserved {
            self.level = self.level.saturating_sub(used - reserved);
        } else {
            // A refund fills up to the capacity, or keeps a level the provider's figure
            // raised above it.
            let refund = (reserved - used).min(room.max(0));
            let top = self.full(window).max(self.level);
            self.level = self.level.saturating_add(refund).min(top);
        }
    }

    /// Charges `used` with no reservation behind it (an axis that became known after the
    /// lease was granted).
    pub(crate) fn charge(&mut self, used: u64, window: u64) {
        if self.gates() {
            let used = product(used, window);
            self.level = self.level.saturating_sub(used);
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
        let need = product(n, window).min(self.full(window));
        let deficit = need.saturating_sub(self.level);
        let cap = i128::from(self.cap);
        let ms = deficit.saturating_add(cap - 1) / cap;
        Some(
            u64::try_from(ms)
                .unwrap_or(u64::MAX)
                .saturating_add(self.lag_ms),
        )
    }

    /// Brings the level to what the provider reports: `remaining` of the real `limit`
    /// (`figure`: with the provider's rounding `granularity`; differences within it are
    /// ignored), as [`Resync`] says. Returns how far the model was above the figure (0 when
    /// the provider agrees or has more room) and whether the level was set, or `None` while
    /// the limit is unknown (nothing to compare with).
    pub(crate) fn resync(
        &mut self,
        (remaining, granularity): (u64, u64),
        how: Resync,
        window: u64,
    ) -> Option<(u64, bool)> {
        let limit = self.limit?;
        let ours = self.available(window);
        // A figure rounded to `granularity` may be that much off; an exact one (1) is not,
        // and on an axis of a few units (requests) one unit is a call.
        let g = if granularity > 1 {
            i128::from(granularity)
        } else {
            0
        };
        let remaining = i128::from(remaining);
        let (theirs, above, raise) = match how {
            Resync::Follow { uncounted, spend } => {
                // The figure is the provider's own count of what is left; the level is in
                // estimates, which the calls spending it may exceed by `1000 / spend`: the
                // share `spend` of the figure, less the calls it may not hold yet.
                let theirs = if remaining > 0 {
                    remaining * i128::from(spend.min(1000)) / 1000
                } else {
                    remaining
                } - i128::from(uncounted);
                // The model disagrees only if it is above the figure even were every call
                // not counted yet counted already (each may have arrived).
                let above = ours - remaining;
                (theirs, above, true)
            }
            Resync::Lower => {
                let theirs = remaining - (i128::from(limit) - i128::from(self.cap));
                (theirs, ours - theirs, false)
            }
        };
        let above = u64::try_from(above.max(0)).unwrap_or(u64::MAX);
        // A level set from the provider's figure refills from now, behind the provider's
        // (which refilled since it wrote the figure): no refill is withheld any more.
        if ours > theirs.saturating_add(g) {
            self.level = theirs.saturating_mul(i128::from(window));
            self.lag_ms = 0;
            return Some((above, true));
        }
        let raised = (theirs - g).min(i128::from(limit));
        if raise && raised > ours {
            self.level = raised.saturating_mul(i128::from(window));
            self.lag_ms = 0;
            return Some((0, true));
        }
        Some((0, false))
    }
}

/// How a provider's remaining figure sets a level ([`Bucket::resync`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resync {
    /// The figure holds every call that reached the provider (an axis it charges on
    /// arrival): the level is set to `spend` (thousandths) of `remaining`, less
    /// `uncounted`, lowered or raised (less the rounding), up to the limit itself, so the
    /// provider's own burst is spent. The level is in estimates and the figure in what
    /// calls really cost: `spend` is the share the calls granted from it may take, by how
    /// far their estimates have lately fallen short (`Pool::spend_permille`: all of it when
    /// they have not, the margin at least). `uncounted` is the reservations the figure
    /// may not hold yet (the model disagrees with the figure only by what it is above it
    /// were they all held already).
    Follow { uncounted: u64, spend: u32 },
    /// The figure does not hold what calls in flight will still use (an axis charged as
    /// calls produce): `remaining` maps to `remaining − (limit − cap)` here, and the level is
    /// only ever lowered.
    Lower,
}

/// A standalone token bucket: one limit per window, exact, for callers who want a plain
/// rate limiter rather than the [`Coordinator`](crate::Coordinator)'s leases.
///
/// It holds up to `limit_per_window` tokens and refills continuously at
/// `limit_per_window` per `window_ms`, in integer token-milliseconds, so no fraction of a
/// token is ever rounded away: 7 tokens per minute give back exactly 7 tokens in 60 000
/// ms, one every 8 571.43 ms. It starts full. Like the coordinator it never reads a clock
/// (every call takes `now`, on an epoch the caller chooses), time that goes backwards is
/// clamped to the latest instant seen, and nothing panics, whatever the inputs.
///
/// ```
/// use tokenwarden_core::{Denied, Millis, TokenBucket};
///
/// // 3 requests per second.
/// let mut rps = TokenBucket::new(3, 1_000).unwrap();
/// assert_eq!(rps.check(Millis(0), 1), Ok(()));
/// assert_eq!(rps.check(Millis(0), 2), Ok(()));
/// // Empty: the next token is back a third of a second later (rounded up to the ms).
/// assert_eq!(rps.check(Millis(0), 1), Err(Denied::NotUntil { at: Millis(334) }));
/// assert_eq!(rps.check(Millis(334), 1), Ok(()));
/// // Asking for more than the bucket ever holds can never succeed.
/// assert_eq!(rps.check(Millis(5_000), 4), Err(Denied::InsufficientCapacity { limit: 3 }));
/// assert_eq!(rps.available(Millis(5_000)), 3);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    limit: u64,
    window_ms: u64,
    /// `limit × window_ms`: a full bucket, in token-milliseconds.
    full: u128,
    /// Level in token-milliseconds, `0..=full`.
    level: u128,
    /// Refilled up to this instant; the latest instant seen.
    updated: Millis,
}

/// Why [`TokenBucket::check`] turned a request down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Denied {
    /// Not enough tokens now; the request fits at `at` (if nothing else takes tokens
    /// first). Saturates at [`Millis::MAX`].
    NotUntil {
        /// The first instant the request fits.
        at: Millis,
    },
    /// The request is larger than the bucket ever holds: it can never succeed.
    InsufficientCapacity {
        /// The bucket's limit per window.
        limit: u64,
    },
}

impl TokenBucket {
    /// A full bucket of `limit_per_window` tokens refilling over `window_ms`.
    ///
    /// The limit must be between 1 and 2^53 − 1 ([`MAX_TOKENS`]) and the window between
    /// 1 ms and 30 days ([`MAX_DURATION_MS`]); anything else is a
    /// [`ConfigError::Invalid`] naming `limit_per_window` or `window_ms`.
    pub fn new(limit_per_window: u64, window_ms: u64) -> Result<TokenBucket, ConfigError> {
        let invalid = |name, reason| ConfigError::Invalid {
            field: FieldPath { pool: None, name },
            reason,
        };
        if !(1..=MAX_TOKENS).contains(&limit_per_window) {
            return Err(invalid(
                "limit_per_window",
                "must be between 1 and 2^53 - 1",
            ));
        }
        if !(1..=MAX_DURATION_MS).contains(&window_ms) {
            return Err(invalid("window_ms", "must be between 1 ms and 30 days"));
        }
        let full = u128::from(limit_per_window) * u128::from(window_ms);
        Ok(TokenBucket {
            limit: limit_per_window,
            window_ms,
            full,
            level: full,
            updated: Millis::ZERO,
        })
    }

    /// The most tokens the bucket holds, and hands out per window.
    #[must_use]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The refill window in milliseconds.
    #[must_use]
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// The level at `now` (clamped to the latest instant seen) and that instant.
    fn level_at(&self, now: Millis) -> (u128, Millis) {
        if now <= self.updated || self.level >= self.full {
            return (self.level, self.updated.max(now));
        }
        // Cannot overflow: a u64 × u64 product plus a level below 2^85.
        let add = u128::from(now.since(self.updated)) * u128::from(self.limit);
        ((self.level + add).min(self.full), now)
    }

    /// Takes `n` tokens at `now` if they are there. Otherwise nothing changes (beyond
    /// the bucket refilling up to `now`) and the answer says when they will be, or that
    /// they never will (`n` above the limit). `n = 0` always succeeds.
    pub fn check(&mut self, now: Millis, n: u64) -> Result<(), Denied> {
        if n > self.limit {
            return Err(Denied::InsufficientCapacity { limit: self.limit });
        }
        let (level, now) = self.level_at(now);
        self.updated = now;
        // `n ≤ limit`, so `need ≤ full`.
        let need = u128::from(n) * u128::from(self.window_ms);
        if level >= need {
            self.level = level - need;
            Ok(())
        } else {
            self.level = level;
            let ms = (need - level).div_ceil(u128::from(self.limit));
            Err(Denied::NotUntil {
                at: now.plus(u64::try_from(ms).unwrap_or(u64::MAX)),
            })
        }
    }

    /// Whole tokens available at `now` (clamped to the latest instant seen), without
    /// taking any.
    #[must_use]
    pub fn available(&self, now: Millis) -> i64 {
        let (level, _) = self.level_at(now);
        // At most `limit` ≤ 2^53 − 1.
        i64::try_from(level / u128::from(self.window_ms)).unwrap_or(i64::MAX)
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
        b.take(7, 0, W);
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
    fn a_take_from_a_full_exact_bucket_withholds_the_way_to_the_provider() {
        // 60 a minute, capacity the whole limit: one refills every second.
        let mut b = bucket(60);
        b.take(60, 1_000, W);
        // The first second's refill is withheld, and a forecast counts it.
        assert_eq!(b.ms_until_fits(1, W), Some(2_000));
        b.refill(1_500, W);
        assert_eq!(b.available(W), 0);
        b.refill(500, W);
        assert_eq!(b.available(W), 1);
        // Below full, a take withholds nothing more.
        b.take(1, 1_000, W);
        assert_eq!(b.ms_until_fits(1, W), Some(1_000));
        // Nothing spendable now is withheld: the whole burst goes at once.
        let mut b = bucket(60);
        for _ in 0..60 {
            assert!(b.fits(1, W));
            b.take(1, 1_000, W);
        }
        assert!(!b.fits(1, W));
    }

    #[test]
    fn a_margin_s_reserve_covers_the_way_to_the_provider() {
        // Capacity 85 of a limit of 100: the reserve (15 tokens) exceeds what the limit
        // refills in a second (1.67): the refill starts at the grant.
        let mut b = Bucket::new(Some(100));
        b.set_cap(85, W, true);
        b.take(85, 1_000, W);
        assert_eq!(b.lag_ms, 0);
        // At 99 of 100 the reserve (1) is less: withheld.
        let mut b = Bucket::new(Some(100));
        b.set_cap(99, W, true);
        b.take(1, 1_000, W);
        assert_eq!(b.lag_ms, 1_000);
    }

    #[test]
    fn a_level_set_from_the_provider_s_figure_withholds_nothing() {
        let mut b = bucket(60);
        b.take(60, 1_000, W);
        assert_eq!(b.lag_ms, 1_000);
        let set = b.resync((0, 1), Resync::Lower, W);
        assert_eq!(set, Some((0, false)), "agreed: nothing set");
        assert_eq!(b.lag_ms, 1_000);
        b.resync(
            (10, 1),
            Resync::Follow {
                uncounted: 0,
                spend: 1000,
            },
            W,
        );
        assert_eq!(b.lag_ms, 0);
        assert_eq!(
            b.available(W),
            10,
            "an exact figure is followed to the unit"
        );
    }

    #[test]
    fn an_exact_figure_is_followed_to_the_unit_a_rounded_one_less_its_rounding() {
        // Two requests left of 30: both spendable (a unit is a whole call here).
        let mut b = Bucket::new(Some(30));
        b.set_cap(30, W, false);
        assert_eq!(b.resync((2, 1), follow(0, 1000), W), Some((0, true)));
        assert_eq!(b.available(W), 2);
        // One request more than the figure is a disagreement: lowered to it.
        b.level += i128::from(W);
        assert_eq!(b.available(W), 3);
        assert_eq!(b.resync((2, 1), follow(0, 1000), W), Some((1, true)));
        assert_eq!(b.available(W), 2);
        // A figure rounded to thousands raises the level only to a thousand below it.
        let mut b = Bucket::new(Some(100_000));
        b.set_cap(85_000, W, false);
        assert_eq!(
            b.resync((40_000, 1000), follow(0, 1000), W),
            Some((0, true))
        );
        assert_eq!(b.available(W), 39_000);
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
        b.take(600, 0, W);
        b.release(600, 900, i128::MAX, W);
        assert_eq!(b.available(W), -300);
        assert_eq!(b.ms_until_fits(1, W), Some(30_100));
    }

    #[test]
    fn refund_before_the_bucket_tops_out_is_returned_in_full() {
        let mut b = bucket(85_000);
        b.charged_on_arrival = true;
        b.take(80_000, 0, W);
        let at_grant = b.level;
        b.refill(10_000, W); // +14_166
        let room = b.refund_room(at_grant, 10_000, W);
        b.release(80_000, 40_000, room, W);
        assert_eq!(b.available(W), 5_000 + 14_166 + 40_000);
    }

    #[test]
    fn refund_after_the_bucket_topped_out_counts_no_headroom_twice() {
        // The provider charged the real 40k on arrival and was full again long before
        // the lease settled; ours refilled underneath the 80k reservation. Spending the
        // full bucket and then refunding must not create 40k the provider does not have.
        let mut b = bucket(85_000);
        b.charged_on_arrival = true;
        b.take(80_000, 0, W);
        let at_grant = b.level;
        b.refill(56_471, W);
        assert_eq!(b.available(W), 85_000);
        b.take(85_000, 0, W);
        let room = b.refund_room(at_grant, 56_471, W);
        b.release(80_000, 40_000, room, W);
        assert_eq!(b.available(W), 0);
    }

    #[test]
    fn axes_the_provider_reserves_refund_in_full() {
        let mut b = bucket(1_000);
        b.take(900, 0, W);
        b.refill(60_000, W);
        assert_eq!(b.refund_room(0, 60_000, W), i128::MAX);
        b.take(1_000, 0, W);
        b.release(900, 100, i128::MAX, W);
        assert_eq!(b.available(W), 800);
    }

    #[test]
    fn full_bucket_admits_oversize_request() {
        let mut b = bucket(1000);
        b.set_cap(600, W, false);
        assert!(b.fits(900, W));
        b.take(900, 0, W);
        assert!(!b.fits(1, W));
    }

    #[test]
    fn unknown_limit_never_gates() {
        let mut b = Bucket::new(None);
        assert!(b.fits(u64::MAX, W));
        b.take(u64::MAX, 0, W);
        assert_eq!(b.ms_until_fits(u64::MAX, W), Some(0));
    }

    fn follow(uncounted: u64, spend: u32) -> Resync {
        Resync::Follow { uncounted, spend }
    }

    #[test]
    fn resync_follows_the_spendable_share_of_the_figure_both_ways_up_to_the_limit() {
        let mut b = Bucket::new(Some(1000));
        b.set_cap(850, W, true);
        // The provider's bucket is full (it starts so), 100 of it claimed by calls in
        // flight it has not counted. Estimates that may fall 15 % short spend 850 of its
        // 1000: less the 100, 750.
        assert_eq!(b.resync((1000, 0), follow(100, 850), W), Some((0, true)));
        assert_eq!(b.available(W), 750);
        // Estimates that do not fall short spend all of it: the level rises past the
        // capacity to the figure less the calls in flight.
        assert_eq!(b.resync((1000, 0), follow(100, 1000), W), Some((0, true)));
        assert_eq!(b.available(W), 900);
        // Refill stops above the capacity; a refund keeps the level, never raises it past.
        b.refill(5_000, W);
        assert_eq!(b.available(W), 900);
        b.take(200, 0, W);
        b.release(200, 50, i128::MAX, W);
        assert_eq!(b.available(W), 850, "150 refunded up to the capacity");
        // Within the provider's rounding nothing moves.
        assert_eq!(
            b.resync((1000, 100), follow(100, 1000), W),
            Some((0, false))
        );
        assert_eq!(b.available(W), 850);
        // Below the figure: lowered, and how far the model was above the figure itself (as
        // if every call not counted yet had been) is reported.
        assert_eq!(b.resync((700, 0), follow(100, 1000), W), Some((150, true)));
        assert_eq!(b.available(W), 600);
        // Spending 85 % of it: lowered to 425.
        assert_eq!(b.resync((500, 0), follow(0, 850), W), Some((100, true)));
        assert_eq!(b.available(W), 425);
        // Never above the limit, whatever the figure says; a figure claimed whole leaves
        // the level in debt.
        assert_eq!(b.resync((5_000, 0), follow(0, 1000), W), Some((0, true)));
        assert_eq!(b.available(W), 1000);
        assert_eq!(b.resync((100, 0), follow(300, 850), W), Some((900, true)));
        assert_eq!(b.available(W), 85 - 300);
        // A lower capacity (a margin cut) cuts a raised level to it.
        assert_eq!(b.resync((5_000, 0), follow(0, 1000), W), Some((0, true)));
        b.set_cap(800, W, false);
        assert_eq!(b.available(W), 800);
        assert_eq!(
            Bucket::new(None).resync((1, 0), follow(0, 850), W),
            None,
            "no limit: nothing to compare"
        );
    }

    #[test]
    fn resync_of_an_axis_charged_as_calls_produce_only_lowers_keeping_the_reserve() {
        let mut b = Bucket::new(Some(1000));
        b.set_cap(850, W, true);
        assert_eq!(
            b.resync((1000, 0), Resync::Lower, W),
            Some((0, false)),
            "provider has more room than we think: keep ours"
        );
        assert_eq!(
            b.resync((900, 100), Resync::Lower, W),
            Some((0, false)),
            "900-150=750 within 100 of 850"
        );
        assert_eq!(
            b.resync((500, 0), Resync::Lower, W),
            Some((500, true)),
            "850 lowered to 350"
        );
        assert_eq!(b.available(W), 350);
    }

    #[test]
    fn token_bucket_refill_is_exact_below_one_token_per_ms() {
        let mut b = TokenBucket::new(7, 60_000).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.check(Millis(0), 7), Ok(()));
        // One token is back after 60000 / 7 = 8571.43 ms, i.e. at 8572.
        assert_eq!(
            b.check(Millis(0), 1),
            Err(Denied::NotUntil { at: Millis(8_572) })
        );
        let mut granted = 0;
        for t in 1..=60_000 {
            if b.check(Millis(t), 1).is_ok() {
                granted += 1;
            }
        }
        assert_eq!(granted, 7, "exactly 7 tokens come back in one window");
        assert_eq!(b.available(Millis(60_000)), 0);
        assert_eq!(b.available(Millis(120_000)), 7);
    }

    #[test]
    fn token_bucket_not_until_is_the_first_instant_that_fits() {
        for (limit, window, n) in [(3, 1_000, 2), (1_000, 7, 999), (5, 60_000, 5), (1, 1, 1)] {
            let mut b = TokenBucket::new(limit, window).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(b.check(Millis(100), limit), Ok(()));
            let Err(Denied::NotUntil { at }) = b.check(Millis(100), n) else {
                panic!("an empty bucket refuses {n}");
            };
            let mut early = b.clone();
            assert!(
                matches!(early.check(Millis(at.0 - 1), n), Err(Denied::NotUntil { at: a }) if a == at),
                "{limit}/{window}: one ms early still says {at}"
            );
            assert_eq!(b.check(at, n), Ok(()), "{limit}/{window}: fits at {at}");
        }
    }

    #[test]
    fn token_bucket_clamps_time_that_goes_backwards() {
        let mut b = TokenBucket::new(10, 1_000).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.check(Millis(5_000), 10), Ok(()));
        // Earlier instants count as 5000: no refill, and no refund of "future" time.
        assert_eq!(b.available(Millis(0)), 0);
        assert_eq!(
            b.check(Millis(1_000), 1),
            Err(Denied::NotUntil { at: Millis(5_100) })
        );
        assert_eq!(b.check(Millis(5_100), 1), Ok(()));
        assert_eq!(b.check(Millis(0), 0), Ok(()), "zero tokens always fit");
    }

    #[test]
    fn token_bucket_reports_insufficient_capacity_without_taking_anything() {
        let mut b = TokenBucket::new(100, 60_000).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            b.check(Millis(0), 101),
            Err(Denied::InsufficientCapacity { limit: 100 })
        );
        assert_eq!(
            b.check(Millis(0), u64::MAX),
            Err(Denied::InsufficientCapacity { limit: 100 })
        );
        assert_eq!(b.available(Millis(0)), 100);
        assert_eq!(b.check(Millis(0), 100), Ok(()));
    }

    #[test]
    fn token_bucket_survives_huge_jumps_and_extreme_figures() {
        let mut b = TokenBucket::new(MAX_TOKENS, MAX_DURATION_MS).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.check(Millis(0), MAX_TOKENS), Ok(()));
        assert_eq!(
            b.available(Millis(1)),
            3_474_999,
            "2^53 - 1 per 30 days: 3474999.7 per ms"
        );
        assert_eq!(b.check(Millis::MAX, MAX_TOKENS), Ok(()));
        assert_eq!(b.available(Millis::MAX), 0);
        // At the end of time the answer saturates rather than overflowing.
        assert_eq!(
            b.check(Millis::MAX, 1),
            Err(Denied::NotUntil { at: Millis::MAX })
        );
        let mut tiny = TokenBucket::new(1, MAX_DURATION_MS).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(tiny.check(Millis(u64::MAX - 1), 1), Ok(()));
        assert_eq!(
            tiny.check(Millis(u64::MAX - 1), 1),
            Err(Denied::NotUntil { at: Millis::MAX })
        );
    }

    #[test]
    fn token_bucket_validates_its_limit_and_window() {
        let field = |r: Result<TokenBucket, ConfigError>| match r {
            Err(ConfigError::Invalid { field, .. }) => field.name,
            other => panic!("expected an invalid field, got {other:?}"),
        };
        assert_eq!(field(TokenBucket::new(0, 1_000)), "limit_per_window");
        assert_eq!(
            field(TokenBucket::new(MAX_TOKENS + 1, 1_000)),
            "limit_per_window"
        );
        assert_eq!(field(TokenBucket::new(1, 0)), "window_ms");
        assert_eq!(field(TokenBucket::new(1, MAX_DURATION_MS + 1)), "window_ms");
        let b = TokenBucket::new(MAX_TOKENS, 1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((b.limit(), b.window_ms()), (MAX_TOKENS, 1));
        assert_eq!(
            b.available(Millis::ZERO),
            i64::try_from(MAX_TOKENS).unwrap_or(0)
        );
    }
}
