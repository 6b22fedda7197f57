//! Rate-limit information from HTTP response headers.
//!
//! [`parse_headers`] reads one response's headers into a [`HeaderReport`]: what each
//! provider said about its request and token limits, how long to wait, and which limit
//! a 429 was about. It understands
//!
//! * Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`,
//!   resets as RFC 3339 times; remaining tokens are rounded to thousands (granularity 1000;
//!   a figure that is not a multiple of 1000 was not rounded, and is exact);
//! * OpenAI: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go
//!   durations (`6m0s`, `1.5s`, `20ms`);
//! * Azure OpenAI: the same names (also spelled `x-rate-limit-*`) with resets in plain
//!   seconds and `-1` sentinels (see [`parse_headers`]);
//! * the IETF draft `RateLimit` / `RateLimit-Policy` fields, old and new (see
//!   [`parse_ietf_ratelimit`]);
//! * `retry-after`, `retry-after-ms`, `x-should-retry`;
//! * the gateway's `rate_limit_type` and `reset_at` (also with hyphens, and `x-` prefixed).
//!
//! Parsing is total: every input, however hostile, gives a report. Nothing panics,
//! arithmetic saturates, no float is used, and no wait exceeds [`MAX_WAIT_MS`].

mod date;
mod duration;
mod ietf;
mod num;
mod retry;
#[cfg(test)]
mod tests;

pub use date::{parse_http_date_ms, parse_rfc3339_ms};
pub use duration::parse_go_duration_ms;
pub use ietf::{IetfItem, IetfItems, ietf_quota_unit_axis, parse_ietf_ratelimit};
pub use retry::parse_retry_after_ms;

use num::Parsed;
use serde::{Deserialize, Serialize};

/// Longest wait any parsed header may ask for; larger values are clamped to it.
pub const MAX_WAIT_MS: u64 = 86_400_000; // one day

/// Granularity of Anthropic's remaining-token counts, which it rounds to the nearest
/// thousand.
const ANTHROPIC_TOKEN_GRANULARITY: u64 = 1_000;

/// Most `RateLimit` (and, separately, `RateLimit-Policy`) fields kept from one
/// response; further ones are counted malformed and ignored.
const MAX_IETF_FIELDS: usize = 8;

/// A rate-limit dimension a provider reports on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RateAxis {
    /// Requests per window.
    Requests,
    /// Tokens per window, input and output together.
    Tokens,
    /// Input (prompt) tokens per window.
    InputTokens,
    /// Output (completion) tokens per window.
    OutputTokens,
    /// Requests in flight at once.
    Concurrent,
}

/// What one response said about one axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AxisReport {
    /// The limit per window as the provider states it.
    pub limit: Option<u64>,
    /// Remaining now (clamped at 0 if the provider sent a negative).
    pub remaining: Option<u64>,
    /// Time until the axis is fully replenished, relative ms, clamped to [`MAX_WAIT_MS`].
    pub reset_after_ms: Option<u64>,
    /// Rounding quantum of `remaining`: 1 when exact, 1000 for Anthropic token axes (unless
    /// the figure is not a multiple of 1000: not rounded, so exact).
    pub granularity: u64,
}

impl Default for AxisReport {
    fn default() -> Self {
        AxisReport {
            limit: None,
            remaining: None,
            reset_after_ms: None,
            granularity: 1,
        }
    }
}

impl AxisReport {
    /// Whether the response said anything about this axis.
    #[must_use]
    pub fn is_reported(&self) -> bool {
        self.limit.is_some() || self.remaining.is_some() || self.reset_after_ms.is_some()
    }
}

/// Everything rate-limit related in one response's headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HeaderReport {
    /// Requests per window.
    pub requests: AxisReport,
    /// Combined tokens (OpenAI `x-ratelimit-*-tokens`; Anthropic
    /// `anthropic-ratelimit-tokens-*`, the most restrictive of input and output).
    pub tokens: AxisReport,
    /// Input tokens per window.
    pub input_tokens: AxisReport,
    /// Output tokens per window.
    pub output_tokens: AxisReport,
    /// The gateway's parallel-request limit, if reported.
    pub concurrent: AxisReport,
    /// From `retry-after-ms` (preferred) or `retry-after` (seconds or HTTP-date);
    /// clamped to `[0, MAX_WAIT_MS]`.
    pub retry_after_ms: Option<u64>,
    /// `x-should-retry`: whether the provider advises retrying.
    pub should_retry: Option<bool>,
    /// Which limit was exceeded, from the gateway's `rate_limit_type`.
    pub exceeded: Option<RateAxis>,
    /// The gateway's `reset_at`, as relative ms from now, clamped to [`MAX_WAIT_MS`].
    pub reset_at_ms: Option<u64>,
    /// Number of rate-limit headers recognised (name matched).
    pub recognised: u32,
    /// Number of recognised headers whose value could not be parsed (and was ignored).
    pub malformed: u32,
}

impl HeaderReport {
    /// The report for `axis`.
    #[must_use]
    pub fn axis(&self, axis: RateAxis) -> &AxisReport {
        match axis {
            RateAxis::Requests => &self.requests,
            RateAxis::Tokens => &self.tokens,
            RateAxis::InputTokens => &self.input_tokens,
            RateAxis::OutputTokens => &self.output_tokens,
            RateAxis::Concurrent => &self.concurrent,
        }
    }

    /// The limit a 429 was about: the one the provider named, or else the first whose
    /// remaining figure the headers show spent (input, output, combined tokens, requests).
    #[must_use]
    pub fn limit_hit(&self) -> Option<RateAxis> {
        self.exceeded.or_else(|| {
            [
                RateAxis::InputTokens,
                RateAxis::OutputTokens,
                RateAxis::Tokens,
                RateAxis::Requests,
            ]
            .into_iter()
            .find(|a| self.axis(*a).remaining == Some(0))
        })
    }

    fn axis_mut(&mut self, axis: RateAxis) -> &mut AxisReport {
        match axis {
            RateAxis::Requests => &mut self.requests,
            RateAxis::Tokens => &mut self.tokens,
            RateAxis::InputTokens => &mut self.input_tokens,
            RateAxis::OutputTokens => &mut self.output_tokens,
            RateAxis::Concurrent => &mut self.concurrent,
        }
    }
}

/// A time a header points at: relative to the response, or absolute (Unix ms) and
/// still to be compared with a reference clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    /// This many milliseconds from now (already clamped).
    After(u64),
    /// At this Unix time in milliseconds.
    At(u64),
}

impl When {
    /// The wait in milliseconds, clamped to `[0, MAX_WAIT_MS]`; an absolute time
    /// needs `reference` (Unix ms) and gives `None` without it.
    fn resolve(self, reference: Option<u64>) -> Option<u64> {
        match self {
            When::After(ms) => Some(num::clamp_wait(ms)),
            When::At(at) => reference.map(|now| num::clamp_wait(at.saturating_sub(now))),
        }
    }
}

/// Normalises a header-name byte for matching: ASCII lower case, `_` and space as `-`.
const fn norm(b: u8) -> u8 {
    match b {
        b'_' | b' ' => b'-',
        _ => b.to_ascii_lowercase(),
    }
}

/// Whether `a` and `b` are equal ignoring ASCII case and `_`/`-`/space differences.
fn eq_norm(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| norm(x) == norm(y))
}

/// `s` without `suffix`, compared as in [`eq_norm`].
fn strip_suffix_norm<'s>(s: &'s str, suffix: &str) -> Option<&'s str> {
    let cut = s.len().checked_sub(suffix.len())?;
    let tail = s.get(cut..)?;
    if eq_norm(tail, suffix) {
        s.get(..cut)
    } else {
        None
    }
}

/// The three things a provider says about an axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Limit,
    Remaining,
    Reset,
}

/// Whose naming scheme a per-axis header follows (they differ in reset format).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    /// `anthropic-ratelimit-*`: resets are RFC 3339 times.
    Anthropic,
    /// `x-ratelimit-*`: resets are Go durations or (Azure) plain seconds.
    OpenAi,
}

/// A recognised header name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Header {
    Axis(Family, RateAxis, Kind),
    IetfLimit,
    IetfRemaining,
    IetfReset,
    IetfRateLimit,
    IetfPolicy,
    RetryAfter,
    RetryAfterMs,
    ShouldRetry,
    LimitType,
    ResetAt,
    /// `Date`: the reference clock; not itself a rate-limit header.
    Date,
}

/// Longer than any header name [`classify`] recognises (the longest,
/// `anthropic-ratelimit-output-tokens-remaining`, has 43 bytes).
const MAX_NAME: usize = 48;

/// A normalised axis-kind name (`limit`, `remaining`, `reset`).
fn kind_of(s: &[u8]) -> Option<Kind> {
    match s {
        b"limit" => Some(Kind::Limit),
        b"remaining" => Some(Kind::Remaining),
        b"reset" => Some(Kind::Reset),
        _ => None,
    }
}

/// A normalised axis name in `anthropic-ratelimit-*` headers.
fn axis_of(s: &[u8]) -> Option<RateAxis> {
    match s {
        b"requests" => Some(RateAxis::Requests),
        b"tokens" => Some(RateAxis::Tokens),
        b"input-tokens" => Some(RateAxis::InputTokens),
        b"output-tokens" => Some(RateAxis::OutputTokens),
        _ => None,
    }
}

/// A normalised axis name in `x-ratelimit-*` headers, including the gateway's
/// concurrency axis.
fn x_axis_of(s: &[u8]) -> Option<RateAxis> {
    match s {
        b"concurrent-requests" | b"parallel-requests" | b"concurrent" => Some(RateAxis::Concurrent),
        _ => axis_of(s),
    }
}

/// Recognises a header name (case-insensitively, `_` and `-` alike).
///
/// The name is normalised once (see [`norm`]) into a stack buffer, then matched by its
/// first letter and exact byte strings: no name is compared twice.
fn classify(name: &str) -> Option<Header> {
    let raw = name.trim_ascii().as_bytes();
    // Every recognised name starts with `a`, `d`, `r` or `x` (in either case); most other
    // headers are turned away here, before any copying.
    let first = norm(*raw.first()?);
    if !matches!(first, b'a' | b'd' | b'r' | b'x') || raw.len() > MAX_NAME {
        return None;
    }
    let mut buf = [0u8; MAX_NAME];
    let n = buf.get_mut(..raw.len())?;
    for (o, b) in n.iter_mut().zip(raw) {
        *o = norm(*b);
    }
    let n: &[u8] = n;
    match first {
        b'a' => {
            // `anthropic-ratelimit-{axis}-{kind}`; kinds hold no `-`.
            let rest = n.strip_prefix(b"anthropic-ratelimit-")?;
            let cut = rest.iter().rposition(|b| *b == b'-')?;
            let kind = kind_of(rest.get(cut + 1..)?)?;
            let axis = axis_of(rest.get(..cut)?)?;
            Some(Header::Axis(Family::Anthropic, axis, kind))
        }
        b'x' => {
            // `x-ratelimit-{kind}-{axis}` (also `x-rate-limit-`), split at the first `-`
            // or `_` of the name as sent (a space is not a separator there).
            for prefix in [&b"x-ratelimit-"[..], &b"x-rate-limit-"[..]] {
                let Some(rest) = n.strip_prefix(prefix) else {
                    continue;
                };
                let sent = raw.get(prefix.len()..).unwrap_or_default();
                let Some(cut) = sent.iter().position(|b| matches!(b, b'-' | b'_')) else {
                    continue;
                };
                let kind = rest.get(..cut).and_then(kind_of);
                let axis = rest.get(cut + 1..).and_then(x_axis_of);
                if let (Some(kind), Some(axis)) = (kind, axis) {
                    return Some(Header::Axis(Family::OpenAi, axis, kind));
                }
            }
            match n {
                b"x-should-retry" => Some(Header::ShouldRetry),
                b"x-rate-limit-type" => Some(Header::LimitType),
                b"x-reset-at" => Some(Header::ResetAt),
                _ => None,
            }
        }
        b'r' => match n {
            b"ratelimit-limit" => Some(Header::IetfLimit),
            b"ratelimit-remaining" => Some(Header::IetfRemaining),
            b"ratelimit-reset" => Some(Header::IetfReset),
            b"ratelimit" => Some(Header::IetfRateLimit),
            b"ratelimit-policy" => Some(Header::IetfPolicy),
            b"retry-after" => Some(Header::RetryAfter),
            b"retry-after-ms" => Some(Header::RetryAfterMs),
            b"rate-limit-type" => Some(Header::LimitType),
            b"reset-at" => Some(Header::ResetAt),
            _ => None,
        },
        _ => (n == b"date").then_some(Header::Date),
    }
}

/// What the headers said about one axis, before absolute times are resolved.
#[derive(Debug, Clone, Copy, Default)]
struct AxisAcc {
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<When>,
    /// A provider header for this axis was seen (valid or not): IETF fields then stay
    /// out of this axis.
    seen: bool,
    /// A `-1` "not tracked" sentinel was seen in this axis's `x-ratelimit-*` limit or
    /// remaining (or the draft-06 `RateLimit-Limit` / `-Remaining`).
    sentinel: bool,
    /// Values came from Anthropic token headers, rounded to thousands.
    coarse: bool,
}

/// Everything gathered while walking the headers.
#[derive(Default)]
struct Acc<'a> {
    requests: AxisAcc,
    tokens: AxisAcc,
    input_tokens: AxisAcc,
    output_tokens: AxisAcc,
    concurrent: AxisAcc,
    /// draft-06 `RateLimit-Limit` / `-Remaining` / `-Reset` (requests).
    ietf_old: AxisAcc,
    /// Valid `RateLimit` fields, in order.
    ietf_fields: [Option<IetfItems<'a>>; MAX_IETF_FIELDS],
    /// Valid `RateLimit-Policy` fields, in order.
    policy_fields: [Option<IetfItems<'a>>; MAX_IETF_FIELDS],
    retry_after_ms: Option<u64>,
    retry_after: Option<When>,
    should_retry: Option<bool>,
    exceeded: Option<RateAxis>,
    reset_at: Option<When>,
    date: Option<u64>,
    recognised: u32,
    malformed: u32,
}

impl<'a> Acc<'a> {
    fn axis_mut(&mut self, axis: RateAxis) -> &mut AxisAcc {
        match axis {
            RateAxis::Requests => &mut self.requests,
            RateAxis::Tokens => &mut self.tokens,
            RateAxis::InputTokens => &mut self.input_tokens,
            RateAxis::OutputTokens => &mut self.output_tokens,
            RateAxis::Concurrent => &mut self.concurrent,
        }
    }

    /// Handles one recognised header; returns whether its value was malformed.
    fn apply(&mut self, header: Header, value: &'a str) -> bool {
        match header {
            Header::Axis(family, axis, kind) => {
                let acc = self.axis_mut(axis);
                acc.seen = true;
                if family == Family::Anthropic && axis != RateAxis::Requests {
                    acc.coarse = true;
                }
                apply_axis(acc, family, kind, value)
            }
            Header::IetfLimit => {
                let parsed = ietf::old_limit(value);
                store_count(
                    &mut self.ietf_old.limit,
                    &mut self.ietf_old.sentinel,
                    parsed,
                )
            }
            Header::IetfRemaining => {
                let parsed = num::parse_count(value, Parsed::Value(0));
                store_count(
                    &mut self.ietf_old.remaining,
                    &mut self.ietf_old.sentinel,
                    parsed,
                )
            }
            Header::IetfReset => match num::parse_seconds_ms(value) {
                Some(ms) => store(&mut self.ietf_old.reset, Parsed::Value(When::After(ms))),
                None => true,
            },
            Header::IetfRateLimit => push_field(&mut self.ietf_fields, value),
            Header::IetfPolicy => push_field(&mut self.policy_fields, value),
            Header::RetryAfter => store(&mut self.retry_after, retry::retry_after(value)),
            Header::RetryAfterMs => store(&mut self.retry_after_ms, retry::retry_after_ms(value)),
            Header::ShouldRetry => store(&mut self.should_retry, retry::should_retry(value)),
            Header::LimitType => store(&mut self.exceeded, retry::rate_limit_type(value)),
            Header::ResetAt => store(&mut self.reset_at, retry::reset_at(value)),
            Header::Date => {
                if let Some(ms) = parse_http_date_ms(value) {
                    self.date = Some(ms);
                }
                false
            }
        }
    }

    fn finish(&self, unix_now_ms: Option<u64>) -> HeaderReport {
        // Prefer the response's own Date: both it and the reset times come from the
        // provider's clock, so their difference is immune to local clock skew.
        let reference = self.date.or(unix_now_ms);
        let mut report = HeaderReport {
            retry_after_ms: self
                .retry_after_ms
                .or_else(|| self.retry_after.and_then(|w| w.resolve(reference))),
            should_retry: self.should_retry,
            exceeded: self.exceeded,
            reset_at_ms: self.reset_at.and_then(|w| w.resolve(reference)),
            recognised: self.recognised,
            malformed: self.malformed,
            ..HeaderReport::default()
        };
        let ietf = ietf::combine(&self.ietf_fields, &self.policy_fields);
        let old = finish_axis(&self.ietf_old, reference);
        let requests_ietf = ietf.requests.or(old.is_reported().then_some(old));
        for (axis, acc, from_ietf) in [
            (RateAxis::Requests, &self.requests, requests_ietf),
            (RateAxis::Tokens, &self.tokens, ietf.tokens),
            (RateAxis::InputTokens, &self.input_tokens, ietf.input_tokens),
            (
                RateAxis::OutputTokens,
                &self.output_tokens,
                ietf.output_tokens,
            ),
            (RateAxis::Concurrent, &self.concurrent, ietf.concurrent),
        ] {
            let out = report.axis_mut(axis);
            *out = finish_axis(acc, reference);
            // Provider-specific headers are more precise than the generic IETF ones;
            // the two are never mixed within one axis.
            if !acc.seen {
                if let Some(from_ietf) = from_ietf {
                    *out = from_ietf;
                }
            }
        }
        report
    }
}

/// Resolves one axis's gathered values.
fn finish_axis(acc: &AxisAcc, reference: Option<u64>) -> AxisReport {
    let mut reset_after_ms = acc.reset.and_then(|w| w.resolve(reference));
    // Azure OpenAI answers `x-ratelimit-limit-tokens: -1`, `x-ratelimit-remaining-tokens: -1`,
    // `x-ratelimit-reset-tokens: 0` for an axis it does not track (seen on the Responses
    // API). A 0 reset next to a -1 sentinel therefore means "unknown", not "replenished
    // now"; anywhere else 0 means the axis is already full again.
    if acc.sentinel && reset_after_ms == Some(0) {
        reset_after_ms = None;
    }
    AxisReport {
        limit: acc.limit,
        remaining: acc.remaining,
        reset_after_ms,
        // A figure that is not a multiple of the quantum was not rounded (a gateway or a
        // test server in front of the provider reports exact figures): it is exact.
        granularity: if acc.coarse
            && acc
                .remaining
                .is_none_or(|r| r % ANTHROPIC_TOKEN_GRANULARITY == 0)
        {
            ANTHROPIC_TOKEN_GRANULARITY
        } else {
            1
        },
    }
}

/// Stores a parsed value (last valid one wins); returns whether it was malformed.
fn store<T>(slot: &mut Option<T>, parsed: Parsed<T>) -> bool {
    match parsed {
        Parsed::Value(v) => {
            *slot = Some(v);
            false
        }
        Parsed::Unknown => false,
        Parsed::Malformed => true,
    }
}

/// [`store`] for counts, remembering a `-1` sentinel.
fn store_count(slot: &mut Option<u64>, sentinel: &mut bool, parsed: Parsed<u64>) -> bool {
    if parsed == Parsed::Unknown {
        *sentinel = true;
    }
    store(slot, parsed)
}

/// Keeps a valid IETF field for later; returns whether it was malformed (or had to
/// be dropped because too many fields came).
fn push_field<'a>(fields: &mut [Option<IetfItems<'a>>; MAX_IETF_FIELDS], value: &'a str) -> bool {
    let Some(items) = parse_ietf_ratelimit(value) else {
        return true;
    };
    match fields.iter_mut().find(|slot| slot.is_none()) {
        Some(slot) => {
            *slot = Some(items);
            false
        }
        None => true,
    }
}

/// Applies a per-axis provider header; returns whether it was malformed.
fn apply_axis(acc: &mut AxisAcc, family: Family, kind: Kind, value: &str) -> bool {
    // Only Azure's `x-ratelimit-*` pairs a -1 sentinel with a meaningless 0 reset; an
    // Anthropic -1 is just unknown and leaves its (absolute) reset alone.
    let mut not_azure = false;
    let sentinel = match family {
        Family::OpenAi => &mut acc.sentinel,
        Family::Anthropic => &mut not_azure,
    };
    match kind {
        Kind::Limit => {
            let parsed = num::parse_count(value, Parsed::Malformed);
            store_count(&mut acc.limit, sentinel, parsed)
        }
        Kind::Remaining => {
            let parsed = num::parse_count(value, Parsed::Value(0));
            store_count(&mut acc.remaining, sentinel, parsed)
        }
        Kind::Reset => {
            let parsed = match family {
                Family::Anthropic => match parse_rfc3339_ms(value) {
                    Some(at) => Parsed::Value(When::At(at)),
                    None => Parsed::Malformed,
                },
                Family::OpenAi => match duration::parse_reset_duration(value) {
                    Parsed::Value(ms) => Parsed::Value(When::After(ms)),
                    Parsed::Unknown => Parsed::Unknown,
                    Parsed::Malformed => Parsed::Malformed,
                },
            };
            store(&mut acc.reset, parsed)
        }
    }
}

/// Parses a response's headers into a [`HeaderReport`].
///
/// Names are matched case-insensitively (and `_` like `-`); unknown headers are
/// ignored. `unix_now_ms` is the host's wall clock (ms since the Unix epoch) if it has
/// one. Absolute times (RFC 3339 resets, HTTP-dates, `reset_at`) are converted to
/// relative waits against the response's own `Date` header when present and
/// parseable (that avoids clock skew), else against `unix_now_ms`, else they are
/// ignored (not malformed). A time in the past gives 0.
///
/// A header appearing twice: the last valid value wins; malformed values are ignored
/// and counted in [`HeaderReport::malformed`]. `-1` in a limit or remaining count is
/// the "not tracked" sentinel Azure OpenAI sends: it gives `None` and is not counted
/// as malformed, and a `0` reset on the same axis is then read as unknown too. Any
/// other negative remaining count is clamped to 0.
///
/// When both provider-specific headers (`anthropic-ratelimit-*`, `x-ratelimit-*`) and
/// IETF `RateLimit*` fields describe an axis, the provider-specific ones are used.
/// Multiple IETF policies on one axis: the one with the lowest remaining quota wins.
#[must_use]
pub fn parse_headers<'a, I>(headers: I, unix_now_ms: Option<u64>) -> HeaderReport
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let mut acc = Acc::default();
    for (name, value) in headers {
        let Some(header) = classify(name) else {
            continue;
        };
        let malformed = acc.apply(header, value);
        if header != Header::Date {
            acc.recognised = acc.recognised.saturating_add(1);
            if malformed {
                acc.malformed = acc.malformed.saturating_add(1);
            }
        }
    }
    acc.finish(unix_now_ms)
}
