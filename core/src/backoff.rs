//! Backoff, demoted to a fallback: used when a call fails despite a lease (a 429 on a
//! granted lease, a coordinator that cannot be reached). Pure: it answers what the next
//! delay is and moves only when told.

use serde::{Deserialize, Serialize};

use crate::config::BackoffConfig;
use crate::rng::Rng;

/// What to do after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[must_use]
pub enum BackoffStep {
    /// Try again after this many milliseconds.
    Retry {
        /// The delay.
        delay_ms: u64,
        /// Attempts failed so far, this one included.
        attempt: u32,
    },
    /// Stop: the attempts are used up. Surface the failure with the last Retry-After so a
    /// reader can tell whether the fix is patience or a higher tier.
    GiveUp {
        /// Attempts made.
        attempts: u32,
        /// The last Retry-After the provider sent, in ms.
        last_retry_after_ms: Option<u64>,
    },
}

/// Backoff state for one call: how many attempts failed and the last Retry-After seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// Attempts failed so far.
    pub failed: u32,
    /// The most recent Retry-After, in ms.
    pub last_retry_after_ms: Option<u64>,
}

impl Backoff {
    /// A fresh state: nothing has failed yet.
    #[must_use]
    pub fn new() -> Backoff {
        Backoff::default()
    }

    /// Records a failed attempt and returns what to do. With a Retry-After the delay is that
    /// value plus a random offset in `0..=retry_after_jitter_ms`; without one it is full
    /// jitter, uniform in `0..=min(cap, base × 2^(failed − 1))`.
    pub fn on_failure(
        &mut self,
        config: &BackoffConfig,
        rng: &mut Rng,
        retry_after_ms: Option<u64>,
    ) -> BackoffStep {
        self.failed = self.failed.saturating_add(1);
        if retry_after_ms.is_some() {
            self.last_retry_after_ms = retry_after_ms;
        }
        if self.failed >= config.max_attempts {
            return BackoffStep::GiveUp {
                attempts: self.failed,
                last_retry_after_ms: self.last_retry_after_ms,
            };
        }
        let delay_ms = match retry_after_ms {
            Some(ra) => ra.saturating_add(rng.below_or_eq(config.retry_after_jitter_ms)),
            None => rng.below_or_eq(ceiling(config.base_ms, self.failed, config.cap_ms)),
        };
        BackoffStep::Retry {
            delay_ms,
            attempt: self.failed,
        }
    }
}

/// `min(cap, base × 2^(failed − 1))`, without overflow.
pub(crate) fn ceiling(base: u64, failed: u32, cap: u64) -> u64 {
    let exp = failed.saturating_sub(1).min(63);
    base.checked_shl(exp)
        .filter(|c| c >> exp == base)
        .map_or(cap, |c| c.min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> BackoffConfig {
        BackoffConfig::default()
    }

    #[test]
    fn full_jitter_stays_below_doubling_ceiling_and_cap() {
        let mut rng = Rng::new(3);
        for _ in 0..200 {
            let mut b = Backoff::new();
            let mut ceiling = 1000u64;
            for _ in 0..5 {
                match b.on_failure(&cfg(), &mut rng, None) {
                    BackoffStep::Retry { delay_ms, .. } => assert!(delay_ms <= ceiling.min(30_000)),
                    BackoffStep::GiveUp { .. } => panic!("gave up early"),
                }
                ceiling *= 2;
            }
        }
    }

    #[test]
    fn honours_retry_after_plus_small_offset() {
        let mut rng = Rng::new(9);
        let mut b = Backoff::new();
        let BackoffStep::Retry { delay_ms, .. } = b.on_failure(&cfg(), &mut rng, Some(12_000))
        else {
            panic!("expected retry")
        };
        assert!((12_000..=13_000).contains(&delay_ms), "{delay_ms}");
    }

    #[test]
    fn gives_up_after_max_attempts_with_last_retry_after() {
        let mut rng = Rng::new(1);
        let mut b = Backoff::new();
        let mut last = None;
        for i in 0..6 {
            let ra = if i == 2 { Some(60_000) } else { None };
            last = Some(b.on_failure(&cfg(), &mut rng, ra));
        }
        assert_eq!(
            last,
            Some(BackoffStep::GiveUp {
                attempts: 6,
                last_retry_after_ms: Some(60_000)
            })
        );
    }

    #[test]
    fn huge_base_never_overflows() {
        let c = BackoffConfig {
            base_ms: u64::MAX / 2,
            cap_ms: u64::MAX,
            max_attempts: 64,
            retry_after_jitter_ms: u64::MAX,
        };
        let mut rng = Rng::new(5);
        let mut b = Backoff::new();
        for _ in 0..63 {
            let _ = b.on_failure(&c, &mut rng, Some(u64::MAX));
            let _ = b.on_failure(&c, &mut rng, None);
        }
    }
}
