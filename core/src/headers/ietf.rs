//! IETF `RateLimit` / `RateLimit-Policy` header fields
//! (draft-ietf-httpapi-ratelimit-headers), in every shape seen in the wild:
//!
//! * the current Structured Field lists (draft-08 and later):
//!   `RateLimit-Policy: "default";q=100;w=60` and `RateLimit: "default";r=50;t=30`;
//! * draft-07's policy list with a bare integer quota: `RateLimit-Policy: 100;w=60`;
//! * draft-07's dictionary: `RateLimit: limit=100, remaining=50, reset=5`;
//! * the separate `RateLimit-Limit` / `-Remaining` / `-Reset` fields of drafts up to 06
//!   (handled by [`old_limit`], [`super::num::parse_count`] and delta seconds).
//!
//! Parsing follows RFC 8941 closely but leniently (keys of any case, integers of any
//! length saturate); a syntax error anywhere makes the whole field malformed, as RFC
//! 8941 requires. Nothing allocates: items are yielded lazily as slices of the value.

use super::num::{Parsed, clamp_wait, parse_count, parse_decimal_scaled, parse_digit_bytes};
use super::{AxisReport, RateAxis, eq_norm};

/// Most items read from one field value; later items are ignored. Bounds the work
/// a hostile header can cause when policies are matched to limits by name.
pub(super) const MAX_ITEMS_PER_FIELD: usize = 64;

/// One item of an IETF `RateLimit` or `RateLimit-Policy` field.
///
/// A `RateLimit-Policy` item carries `quota` (and maybe `quota_unit`, `window_s`); a
/// `RateLimit` item carries `remaining` (and maybe `reset_after_ms`). draft-07's
/// dictionary form carries `quota`, `remaining` and `reset_after_ms` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IetfItem<'a> {
    /// Policy name (the String or Token item, without quotes); `None` for draft-07
    /// forms, which name no policy.
    pub policy: Option<&'a str>,
    /// Quota per window: `q=`, draft-07 `limit=`, or draft-07's bare integer item.
    pub quota: Option<u64>,
    /// Quota unit from `qu=` as sent (`"requests"` when absent, per the draft).
    pub quota_unit: Option<&'a str>,
    /// Window length in seconds from `w=`.
    pub window_s: Option<u64>,
    /// Available quota from `r=` or draft-07 `remaining=`; a negative value is
    /// clamped to 0 (`-1`, the "unknown" sentinel, gives `None`).
    pub remaining: Option<u64>,
    /// Time until the quota is restored, from `t=` or draft-07 `reset=` (delta
    /// seconds, a decimal fraction rounded up), clamped to
    /// [`MAX_WAIT_MS`](super::MAX_WAIT_MS).
    pub reset_after_ms: Option<u64>,
}

impl IetfItem<'_> {
    /// The axis this item's quota unit measures: `Requests` when no unit is given,
    /// `None` for units the coordinator does not track (e.g. `content-bytes`).
    #[must_use]
    pub fn axis(&self) -> Option<RateAxis> {
        match self.quota_unit {
            None => Some(RateAxis::Requests),
            Some(unit) => ietf_quota_unit_axis(unit),
        }
    }
}

/// Maps an IETF quota unit (`qu=`) to an axis, ignoring case and treating `_` like `-`:
/// `requests`; `tokens`; `input-tokens`; `output-tokens`; `concurrent-requests`.
/// Other units (`content-bytes`, ...) give `None`.
#[must_use]
pub fn ietf_quota_unit_axis(unit: &str) -> Option<RateAxis> {
    const UNITS: [(&str, RateAxis); 8] = [
        ("requests", RateAxis::Requests),
        ("tokens", RateAxis::Tokens),
        ("total-tokens", RateAxis::Tokens),
        ("input-tokens", RateAxis::InputTokens),
        ("output-tokens", RateAxis::OutputTokens),
        ("concurrent-requests", RateAxis::Concurrent),
        ("concurrent", RateAxis::Concurrent),
        ("parallel-requests", RateAxis::Concurrent),
    ];
    let unit = unit.trim_ascii();
    UNITS
        .iter()
        .find(|(name, _)| eq_norm(unit, name))
        .map(|&(_, axis)| axis)
}

/// Parses one IETF `RateLimit` or `RateLimit-Policy` field value.
///
/// Returns `None` when the value is not a well-formed list or dictionary, or a known
/// parameter has an impossible value (negative quota or window, negative `t`).
/// Otherwise returns an iterator over its items (draft-07's dictionary form is one
/// item). Unknown parameters such as `pk` are skipped.
#[must_use]
pub fn parse_ietf_ratelimit(v: &str) -> Option<IetfItems<'_>> {
    let mut probe = Lexer::new(v);
    probe.skip_ows();
    if probe.at_end() {
        return None;
    }
    let start = probe.pos;
    if probe.key().is_some() && probe.peek() == Some(b'=') {
        let mut dict = Lexer { src: v, pos: start };
        let item = dict.dictionary()?;
        return Some(IetfItems {
            inner: Inner::Single(Some(item)),
        });
    }
    let items = IetfItems {
        inner: Inner::List(Lexer { src: v, pos: start }, true),
    };
    // Validate the whole list once so that a syntax error anywhere rejects the field.
    let mut check = items.clone();
    loop {
        match check.next_member() {
            Ok(Some(_)) => {}
            Ok(None) => return Some(items),
            Err(()) => return None,
        }
    }
}

/// Iterator over the items of one IETF field value; see [`parse_ietf_ratelimit`].
#[derive(Debug, Clone)]
pub struct IetfItems<'a> {
    inner: Inner<'a>,
}

#[derive(Debug, Clone)]
enum Inner<'a> {
    /// A list, the lexer positioned before the next member; `true` before the first.
    List(Lexer<'a>, bool),
    /// The one item of a dictionary field.
    Single(Option<IetfItem<'a>>),
}

impl<'a> IetfItems<'a> {
    fn next_member(&mut self) -> Result<Option<IetfItem<'a>>, ()> {
        match &mut self.inner {
            Inner::Single(item) => Ok(item.take()),
            Inner::List(lx, first) => {
                lx.skip_ows();
                if *first {
                    *first = false;
                } else {
                    if lx.at_end() {
                        return Ok(None);
                    }
                    if !lx.eat(b',') {
                        return Err(());
                    }
                    lx.skip_ows();
                }
                if lx.at_end() {
                    return Err(());
                }
                lx.list_member().map(Some).ok_or(())
            }
        }
    }
}

impl<'a> Iterator for IetfItems<'a> {
    type Item = IetfItem<'a>;

    fn next(&mut self) -> Option<IetfItem<'a>> {
        self.next_member().ok().flatten()
    }
}

/// A Structured Field bare item, as far as rate limits care.
#[derive(Debug, Clone, Copy)]
enum Bare<'a> {
    /// A String (content without quotes, escapes left as sent) or a Token.
    Text(&'a str),
    /// An Integer; `neg` and magnitude.
    Int(bool, u64),
    /// A Decimal; `neg` and the unsigned text.
    Dec(bool, &'a str),
    /// Boolean, Byte Sequence, Date: skipped.
    Other,
}

/// A byte-level reader over a field value.
#[derive(Debug, Clone)]
struct Lexer<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn new(src: &'a str) -> Self {
        Lexer { src, pos: 0 }
    }

    fn peek(&self) -> Option<u8> {
        self.src.as_bytes().get(self.pos).copied()
    }

    fn at_end(&self) -> bool {
        self.pos >= self.src.len()
    }

    fn bump(&mut self) {
        self.pos = self.pos.saturating_add(1);
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn skip_while(&mut self, pred: impl Fn(u8) -> bool) {
        while self.peek().is_some_and(&pred) {
            self.bump();
        }
    }

    fn skip_ows(&mut self) {
        self.skip_while(|b| b == b' ' || b == b'\t');
    }

    /// `src[from..self.pos]`; the bounds always sit on ASCII bytes.
    fn since(&self, from: usize) -> Option<&'a str> {
        self.src.get(from..self.pos)
    }

    /// A parameter or dictionary key: `(ALPHA / "*") *( ALPHA / DIGIT / "_" / "-" / "." / "*" )`.
    fn key(&mut self) -> Option<&'a str> {
        let start = self.pos;
        if !self
            .peek()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'*')
        {
            return None;
        }
        self.bump();
        self.skip_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'*'));
        self.since(start)
    }

    fn bare_item(&mut self) -> Option<Bare<'a>> {
        match self.peek()? {
            b'"' => self.string(),
            b'-' | b'0'..=b'9' => self.number(),
            b if b.is_ascii_alphabetic() || b == b'*' => {
                let start = self.pos;
                self.bump();
                self.skip_while(is_token_char);
                self.since(start).map(Bare::Text)
            }
            b'?' => {
                self.bump();
                let ok = self.eat(b'0') || self.eat(b'1');
                ok.then_some(Bare::Other)
            }
            b':' => {
                self.bump();
                self.skip_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
                self.eat(b':').then_some(Bare::Other)
            }
            b'@' => {
                self.bump();
                matches!(self.number()?, Bare::Int(..)).then_some(Bare::Other)
            }
            _ => None,
        }
    }

    fn string(&mut self) -> Option<Bare<'a>> {
        self.bump(); // opening quote
        let start = self.pos;
        loop {
            match self.peek()? {
                b'"' => {
                    let text = self.since(start)?;
                    self.bump();
                    return Some(Bare::Text(text));
                }
                b'\\' => {
                    self.bump();
                    if !matches!(self.peek()?, b'"' | b'\\') {
                        return None;
                    }
                    self.bump();
                }
                0x20..=0x7e => self.bump(),
                _ => return None,
            }
        }
    }

    fn number(&mut self) -> Option<Bare<'a>> {
        let neg = self.eat(b'-');
        let int_start = self.pos;
        self.skip_while(|b| b.is_ascii_digit());
        let whole = self.since(int_start)?;
        if whole.is_empty() {
            return None;
        }
        if self.eat(b'.') {
            let frac_start = self.pos;
            self.skip_while(|b| b.is_ascii_digit());
            if self.pos == frac_start {
                return None;
            }
            return self.since(int_start).map(|text| Bare::Dec(neg, text));
        }
        parse_digit_bytes(whole.as_bytes()).map(|n| Bare::Int(neg, n))
    }

    /// `*( ";" *SP key [ "=" bare-item ] )`, feeding each to `apply`.
    fn params(&mut self, item: &mut IetfItem<'a>) -> Option<()> {
        while self.eat(b';') {
            self.skip_while(|b| b == b' ');
            let key = self.key()?;
            let value = if self.eat(b'=') {
                self.bare_item()?
            } else {
                Bare::Other
            };
            apply(item, key, value)?;
        }
        Some(())
    }

    /// One list member: bare item and parameters.
    fn list_member(&mut self) -> Option<IetfItem<'a>> {
        let mut item = IetfItem::default();
        match self.bare_item()? {
            Bare::Text(name) => item.policy = Some(name),
            // draft-07 policy: `100;w=60`, the integer is the quota.
            Bare::Int(false, quota) => item.quota = Some(quota),
            Bare::Int(true, _) | Bare::Dec(..) | Bare::Other => return None,
        }
        self.params(&mut item)?;
        Some(item)
    }

    /// A whole draft-07 dictionary, merged into one item.
    fn dictionary(&mut self) -> Option<IetfItem<'a>> {
        let mut item = IetfItem::default();
        loop {
            self.skip_ows();
            let key = self.key()?;
            let value = if self.eat(b'=') {
                self.bare_item()?
            } else {
                Bare::Other
            };
            match key {
                k if k.eq_ignore_ascii_case("limit") => apply(&mut item, "q", value)?,
                k if k.eq_ignore_ascii_case("remaining") => apply(&mut item, "r", value)?,
                k if k.eq_ignore_ascii_case("reset") => apply(&mut item, "t", value)?,
                _ => {}
            }
            // Parameters on dictionary members carry nothing we use.
            let mut ignored = IetfItem::default();
            self.params(&mut ignored)?;
            self.skip_ows();
            if self.at_end() {
                return Some(item);
            }
            if !self.eat(b',') {
                return None;
            }
            self.skip_ows();
            if self.at_end() {
                return None;
            }
        }
    }
}

/// RFC 9110 `tchar` plus `:` and `/`, as allowed after a Token's first character.
fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
                | b':'
                | b'/'
        )
}

/// Applies one known parameter to `item`; `None` when its value is impossible.
fn apply<'a>(item: &mut IetfItem<'a>, key: &str, value: Bare<'a>) -> Option<()> {
    match key_of(key) {
        Key::Q => match value {
            Bare::Int(false, n) => item.quota = Some(n),
            _ => return None,
        },
        Key::Qu => match value {
            Bare::Text(unit) => item.quota_unit = Some(unit),
            _ => return None,
        },
        Key::W => match value {
            Bare::Int(false, n) => item.window_s = Some(n),
            _ => return None,
        },
        Key::R => match value {
            Bare::Int(false, n) => item.remaining = Some(n),
            // -1 is "unknown"; any other negative available quota means none left.
            Bare::Int(true, 1) => item.remaining = None,
            Bare::Int(true, _) => item.remaining = Some(0),
            _ => return None,
        },
        Key::T => match value {
            Bare::Int(false, n) => item.reset_after_ms = Some(clamp_wait(n.saturating_mul(1_000))),
            Bare::Dec(false, text) => {
                item.reset_after_ms = Some(clamp_wait(parse_decimal_scaled(text, 3)?));
            }
            _ => return None,
        },
        Key::Other => {}
    }
    Some(())
}

/// The parameter keys the draft defines that we use.
enum Key {
    Q,
    Qu,
    W,
    R,
    T,
    Other,
}

/// Which known parameter `key` names, ignoring case.
fn key_of(key: &str) -> Key {
    const KEYS: [(&str, Key); 5] = [
        ("q", Key::Q),
        ("qu", Key::Qu),
        ("w", Key::W),
        ("r", Key::R),
        ("t", Key::T),
    ];
    KEYS.into_iter()
        .find(|(name, _)| key.eq_ignore_ascii_case(name))
        .map_or(Key::Other, |(_, k)| k)
}

/// The leading integer of a draft-06 `RateLimit-Limit` value, which may be followed by
/// policy comments: `100` or `100, 100;w=10, 1000;w=3600`.
pub(super) fn old_limit(v: &str) -> Parsed<u64> {
    let first = v.split([',', ';']).next().unwrap_or(v);
    parse_count(first, Parsed::Malformed)
}

/// The most restrictive report per axis from a response's IETF fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct IetfAxes {
    pub(super) requests: Option<AxisReport>,
    pub(super) tokens: Option<AxisReport>,
    pub(super) input_tokens: Option<AxisReport>,
    pub(super) output_tokens: Option<AxisReport>,
    pub(super) concurrent: Option<AxisReport>,
}

/// A candidate per axis while folding, and whether it came from a `RateLimit` item
/// (`true`) or only from a policy (`false`).
#[derive(Default)]
struct Slots {
    requests: Option<(AxisReport, bool)>,
    tokens: Option<(AxisReport, bool)>,
    input_tokens: Option<(AxisReport, bool)>,
    output_tokens: Option<(AxisReport, bool)>,
    concurrent: Option<(AxisReport, bool)>,
}

impl Slots {
    fn get(&mut self, axis: RateAxis) -> &mut Option<(AxisReport, bool)> {
        match axis {
            RateAxis::Requests => &mut self.requests,
            RateAxis::Tokens => &mut self.tokens,
            RateAxis::InputTokens => &mut self.input_tokens,
            RateAxis::OutputTokens => &mut self.output_tokens,
            RateAxis::Concurrent => &mut self.concurrent,
        }
    }
}

/// Whether `cand` is more restrictive than `cur`: less remaining, or as much
/// remaining but a later reset.
fn more_restrictive(cand: &AxisReport, cur: &AxisReport) -> bool {
    match (cand.remaining, cur.remaining) {
        (Some(a), Some(b)) => a < b || (a == b && cand.reset_after_ms > cur.reset_after_ms),
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Finds the policy named `name` among `policies`: `(axis, quota)`.
fn find_policy(
    policies: &[Option<IetfItems<'_>>],
    name: &str,
) -> Option<(Option<RateAxis>, Option<u64>)> {
    policies
        .iter()
        .flatten()
        .flat_map(|items| items.clone().take(MAX_ITEMS_PER_FIELD))
        .find(|item| item.policy == Some(name))
        .map(|item| (item.axis(), item.quota))
}

/// Folds the (already validated) `RateLimit` and `RateLimit-Policy` fields of one
/// response into the most restrictive report per axis.
///
/// A `RateLimit` item takes its axis and limit from the policy of the same name (the
/// default unit, requests, when there is none). Per axis the item with the lowest
/// remaining quota wins. An axis with policies but no `RateLimit` item reports the
/// lowest quota as its limit.
pub(super) fn combine(
    ratelimit: &[Option<IetfItems<'_>>],
    policies: &[Option<IetfItems<'_>>],
) -> IetfAxes {
    let mut slots = Slots::default();
    for item in ratelimit
        .iter()
        .flatten()
        .flat_map(|items| items.clone().take(MAX_ITEMS_PER_FIELD))
    {
        let policy = item.policy.and_then(|name| find_policy(policies, name));
        let axis = match policy {
            Some((axis, _)) => axis,
            None => item.axis(),
        };
        let Some(axis) = axis else { continue };
        let cand = AxisReport {
            limit: item.quota.or(policy.and_then(|(_, q)| q)),
            remaining: item.remaining,
            reset_after_ms: item.reset_after_ms,
            granularity: 1,
        };
        let slot = slots.get(axis);
        match slot {
            Some((cur, true)) if !more_restrictive(&cand, cur) => {}
            _ => *slot = Some((cand, true)),
        }
    }
    for item in policies
        .iter()
        .flatten()
        .flat_map(|items| items.clone().take(MAX_ITEMS_PER_FIELD))
    {
        let (Some(axis), Some(quota)) = (item.axis(), item.quota) else {
            continue;
        };
        let slot = slots.get(axis);
        match slot {
            Some((_, true)) => {}
            Some((cur, false)) => cur.limit = Some(cur.limit.map_or(quota, |l| l.min(quota))),
            None => {
                *slot = Some((
                    AxisReport {
                        limit: Some(quota),
                        ..AxisReport::default()
                    },
                    false,
                ));
            }
        }
    }
    let take = |s: Option<(AxisReport, bool)>| s.map(|(r, _)| r);
    IetfAxes {
        requests: take(slots.requests),
        tokens: take(slots.tokens),
        input_tokens: take(slots.input_tokens),
        output_tokens: take(slots.output_tokens),
        concurrent: take(slots.concurrent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::MAX_WAIT_MS;
    use alloc::vec::Vec;

    fn items(v: &str) -> Option<Vec<IetfItem<'_>>> {
        parse_ietf_ratelimit(v).map(Iterator::collect)
    }

    /// [`combine`] on field values, all of which must be valid.
    fn combine_values<'a>(ratelimit: &[&'a str], policies: &[&'a str]) -> IetfAxes {
        let parse = |vs: &[&'a str]| -> Vec<Option<IetfItems<'a>>> {
            vs.iter()
                .map(|v| Some(parse_ietf_ratelimit(v).unwrap()))
                .collect()
        };
        combine(&parse(ratelimit), &parse(policies))
    }

    #[test]
    fn parses_structured_ratelimit_items() {
        let got = items(r#""default";r=50;t=30"#).unwrap();
        assert_eq!(
            got,
            [IetfItem {
                policy: Some("default"),
                remaining: Some(50),
                reset_after_ms: Some(30_000),
                ..IetfItem::default()
            }]
        );
        let got = items(r#""burst";r=0;t=1, "daily";r=900;t=86000;pk=:QXBwLTk5OQ==:"#).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].remaining, Some(0));
        assert_eq!(got[1].policy, Some("daily"));
        assert_eq!(got[1].reset_after_ms, Some(86_000_000));
    }

    #[test]
    fn parses_structured_policies_with_units() {
        let got =
            items(r#""burst";q=100;w=60,"daily";q=1000;w=86400, "tpm";q=40000;qu="tokens";w=60"#)
                .unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(
            (got[0].quota, got[0].window_s, got[0].axis()),
            (Some(100), Some(60), Some(RateAxis::Requests))
        );
        assert_eq!(got[2].axis(), Some(RateAxis::Tokens));
        let bytes =
            items(r#""peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:"#).unwrap();
        assert_eq!(bytes[0].axis(), None);
    }

    #[test]
    fn parses_draft_07_forms() {
        let got = items("limit=100, remaining=50, reset=5").unwrap();
        assert_eq!(
            got,
            [IetfItem {
                quota: Some(100),
                remaining: Some(50),
                reset_after_ms: Some(5_000),
                ..IetfItem::default()
            }]
        );
        let got = items("100;w=60, 10000;w=86400").unwrap();
        assert_eq!((got[0].quota, got[0].window_s), (Some(100), Some(60)));
        assert_eq!(
            (got[1].quota, got[1].window_s),
            (Some(10_000), Some(86_400))
        );
    }

    #[test]
    fn ietf_values_clamp_and_saturate() {
        let got = items(r#""d";r=99999999999999999999999;t=18446744073709551615"#).unwrap();
        assert_eq!(got[0].remaining, Some(u64::MAX));
        assert_eq!(got[0].reset_after_ms, Some(MAX_WAIT_MS));
        let got = items(r#""d";r=-5;t=1.0001"#).unwrap();
        assert_eq!(got[0].remaining, Some(0));
        assert_eq!(got[0].reset_after_ms, Some(1_001));
        let got = items(r#""d";r=-1"#).unwrap();
        assert_eq!(got[0].remaining, None);
    }

    #[test]
    fn rejects_malformed_ietf_fields() {
        for bad in [
            "",
            "   ",
            r#""default";r=50,"#,
            r#","default";r=50"#,
            r#""default";r=50 "other""#,
            r#""unterminated;r=5"#,
            r#""default";q=-1"#,
            r#""default";t=-3"#,
            r#""default";w=1.5"#,
            r#""default";qu=5"#,
            r#""default";r=abc"#,
            r#""default";"#,
            "limit=100, remaining=",
            "limit=100,",
            "limit=100 remaining=50",
            r#""caf\u{e9}";r=1"#,
            "\"café\";r=1",
            "-5;w=60",
            "(1 2);r=3",
            r#""a";r=1;"#,
        ] {
            assert!(parse_ietf_ratelimit(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn tolerates_unknown_params_and_types() {
        let got =
            items(r#"default;r=5;acme-burst=?1;pk=:AAAA:;x="y";when=@1700000000;R=7"#).unwrap();
        assert_eq!(got[0].policy, Some("default"));
        assert_eq!(got[0].remaining, Some(7));
    }

    #[test]
    fn combines_policies_and_limits_taking_the_most_restrictive() {
        let axes = combine_values(
            &[
                r#""burst";r=40;t=10, "daily";r=3;t=7200"#,
                r#""tok";r=500;t=20"#,
            ],
            &[
                r#""burst";q=100;w=60, "daily";q=1000;w=86400"#,
                r#""tok";q=40000;qu="tokens";w=60"#,
            ],
        );
        assert_eq!(
            axes.requests,
            Some(AxisReport {
                limit: Some(1000),
                remaining: Some(3),
                reset_after_ms: Some(7_200_000),
                granularity: 1
            })
        );
        assert_eq!(
            axes.tokens.map(|t| (t.limit, t.remaining)),
            Some((Some(40_000), Some(500)))
        );
        assert_eq!(axes.concurrent, None);
    }

    #[test]
    fn policy_without_ratelimit_gives_lowest_quota() {
        let axes = combine_values(
            &[],
            &[
                r#""a";q=100;w=60, "b";q=50;w=1"#,
                r#""c";q=9;qu="concurrent-requests""#,
            ],
        );
        assert_eq!(
            axes.requests.map(|r| (r.limit, r.remaining)),
            Some((Some(50), None))
        );
        assert_eq!(axes.concurrent.map(|r| r.limit), Some(Some(9)));
    }

    #[test]
    fn ratelimit_item_without_known_policy_counts_as_requests() {
        let axes = combine_values(&[r#""unlisted";r=7;t=3"#], &[]);
        assert_eq!(
            axes.requests
                .map(|r| (r.limit, r.remaining, r.reset_after_ms)),
            Some((None, Some(7), Some(3_000)))
        );
    }

    #[test]
    fn content_byte_policies_are_ignored() {
        let axes = combine_values(
            &[r#""bytes";r=10"#],
            &[r#""bytes";q=65535;qu="content-bytes""#],
        );
        assert_eq!(axes, IetfAxes::default());
    }

    #[test]
    fn old_limit_takes_the_leading_integer() {
        assert_eq!(old_limit("100"), Parsed::Value(100));
        assert_eq!(old_limit("100, 100;w=10, 1000;w=3600"), Parsed::Value(100));
        assert_eq!(old_limit("-1"), Parsed::Unknown);
        assert_eq!(old_limit("lots"), Parsed::Malformed);
    }

    #[test]
    fn quota_units_map_to_axes() {
        assert_eq!(ietf_quota_unit_axis("requests"), Some(RateAxis::Requests));
        assert_eq!(ietf_quota_unit_axis("TOKENS"), Some(RateAxis::Tokens));
        assert_eq!(
            ietf_quota_unit_axis("input_tokens"),
            Some(RateAxis::InputTokens)
        );
        assert_eq!(
            ietf_quota_unit_axis("output-tokens"),
            Some(RateAxis::OutputTokens)
        );
        assert_eq!(
            ietf_quota_unit_axis("concurrent-requests"),
            Some(RateAxis::Concurrent)
        );
        assert_eq!(ietf_quota_unit_axis("content-bytes"), None);
    }
}
