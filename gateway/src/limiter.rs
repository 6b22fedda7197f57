//! What a client of the HTTP API (the remote driver) makes of the limiter's answer: read
//! it, report a refused secret, ask again shortly, or lease locally because no limiter
//! answered.
//!
//! A limiter that is there but cannot decide this moment answers 503 with one of
//! [`RETRY_CODES`]: a quota's owner moving to another instance, an owner term lapsed and
//! being renewed, a change not saved under the owner's term, a state replaced while a
//! request was read, a Worker restarting. Those are not outages: a client that leased
//! locally at its share meanwhile would lease beside the new owner, which grants the whole
//! quota to the clients that reach it. So they are asked again after a short wait, until
//! the call's own time runs out; any other 5xx (a proxy in front with no limiter behind
//! it) is an outage.

/// A quota's owner moved to another instance while the request was forwarded.
pub const OWNER_MOVED: &str = "owner_moved";
/// The instance's owner term lapsed and is being renewed or handed on.
pub const OWNER_LAPSED: &str = "owner_lapsed";
/// The quota's owner could not be reached by the instance that forwarded to it.
pub const OWNER_UNREACHABLE: &str = "owner_unreachable";
/// The change could not be saved under the instance's state of the quota.
pub const NOT_SAVED: &str = "not_saved";
/// The quota's state was replaced while the request was read (also a Worker restarting).
pub const CLOSED: &str = "closed";

/// The codes of a 503 that mean "the limiter is here; ask again shortly".
pub const RETRY_CODES: [&str; 5] = [
    OWNER_MOVED,
    OWNER_LAPSED,
    OWNER_UNREACHABLE,
    NOT_SAVED,
    CLOSED,
];

/// How long to wait before asking again when the answer names no `Retry-After`, ms.
pub const RETRY_AFTER_MS: u64 = 200;
/// The shortest wait between two asks, ms, whatever `Retry-After` says (`0` would ask again
/// at once, over and over).
pub const RETRY_AFTER_MIN_MS: u64 = 50;
/// The longest wait between two asks, ms, whatever `Retry-After` says.
pub const RETRY_AFTER_MAX_MS: u64 = 2_000;

/// What to do with one answer of the limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Read its JSON body: a decision, or an error reported by its code.
    Read,
    /// The fleet secret was refused (401, 403): a misconfiguration, reported as such and
    /// never answered by leasing locally.
    Refused,
    /// The limiter is there but cannot decide this moment: ask again after `after_ms`.
    Retry {
        /// The wait before the next ask, ms.
        after_ms: u64,
    },
    /// No limiter answered: lease locally at this process's share until one does.
    Unreachable,
}

/// The verdict on an answer with HTTP `status`, the `error` code of its JSON body (if it
/// had one), its `Retry-After` header, after `waited_ms` of asking this input again
/// (0 on the first answer) within the client's `timeout_ms` for it.
///
/// ```
/// use tokenwarden_gateway::limiter::{Verdict, limiter_answer};
///
/// assert_eq!(limiter_answer(200, None, None, 0, 10_000), Verdict::Read);
/// assert_eq!(limiter_answer(409, Some("gone"), None, 0, 10_000), Verdict::Read);
/// assert_eq!(limiter_answer(401, Some("unauthorized"), None, 0, 10_000), Verdict::Refused);
/// assert_eq!(
///     limiter_answer(503, Some("owner_moved"), None, 0, 10_000),
///     Verdict::Retry { after_ms: 200 }
/// );
/// // Out of time: the limiter is as good as unreachable for this input.
/// assert_eq!(limiter_answer(503, Some("owner_moved"), None, 9_900, 10_000), Verdict::Unreachable);
/// assert_eq!(limiter_answer(502, None, None, 0, 10_000), Verdict::Unreachable);
/// ```
#[must_use]
pub fn limiter_answer(
    status: u16,
    code: Option<&str>,
    retry_after: Option<&str>,
    waited_ms: u64,
    timeout_ms: u64,
) -> Verdict {
    match status {
        401 | 403 => Verdict::Refused,
        500..=599 => {
            if status != 503 || !code.is_some_and(|c| RETRY_CODES.contains(&c)) {
                return Verdict::Unreachable;
            }
            let after_ms = retry_after
                .and_then(|v| tokenwarden_core::headers::parse_retry_after_ms(v, None))
                .unwrap_or(RETRY_AFTER_MS)
                .clamp(RETRY_AFTER_MIN_MS, RETRY_AFTER_MAX_MS);
            if waited_ms.saturating_add(after_ms) >= timeout_ms {
                Verdict::Unreachable
            } else {
                Verdict::Retry { after_ms }
            }
        }
        _ => Verdict::Read,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_retry_code_is_asked_again_and_any_other_5xx_is_an_outage() {
        for c in RETRY_CODES {
            assert_eq!(
                limiter_answer(503, Some(c), None, 0, 10_000),
                Verdict::Retry { after_ms: 200 },
                "{c}"
            );
            // The same code under another 5xx is not the limiter's.
            assert_eq!(
                limiter_answer(502, Some(c), None, 0, 10_000),
                Verdict::Unreachable
            );
        }
        assert_eq!(
            limiter_answer(503, None, None, 0, 10_000),
            Verdict::Unreachable
        );
        assert_eq!(
            limiter_answer(503, Some("internal"), None, 0, 10_000),
            Verdict::Unreachable
        );
        assert_eq!(
            limiter_answer(500, None, None, 0, 10_000),
            Verdict::Unreachable
        );
    }

    #[test]
    fn retry_after_is_obeyed_within_bounds_and_the_client_s_time() {
        let v = |ra, waited| limiter_answer(503, Some(CLOSED), ra, waited, 10_000);
        assert_eq!(v(Some("1"), 0), Verdict::Retry { after_ms: 1_000 });
        assert_eq!(v(Some("60"), 0), Verdict::Retry { after_ms: 2_000 });
        assert_eq!(v(Some("soon"), 0), Verdict::Retry { after_ms: 200 });
        assert_eq!(v(Some("0"), 0), Verdict::Retry { after_ms: 50 });
        assert_eq!(v(None, 9_799), Verdict::Retry { after_ms: 200 });
        assert_eq!(v(None, 9_800), Verdict::Unreachable);
        assert_eq!(v(None, u64::MAX), Verdict::Unreachable);
    }

    #[test]
    fn answers_that_are_not_outages_are_read() {
        for s in [200, 201, 400, 404, 409, 413, 429] {
            assert_eq!(
                limiter_answer(s, Some("x"), None, 0, 10_000),
                Verdict::Read,
                "{s}"
            );
        }
        assert_eq!(limiter_answer(403, None, None, 0, 10_000), Verdict::Refused);
    }
}
