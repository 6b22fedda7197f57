//! The operator's view of waiting, as lines of text: one for each wait longer than
//! [`LONG_WAIT_MS`] (who waits, on which pool and ceiling, for how long at most, how many
//! are in line), one when such a wait ends, and a short summary once a minute while
//! anything happens. `tokenwarden serve` prints them in the terminal it runs in.
//!
//! It decides nothing: a host tells it what happened (the same call events the timeline
//! keeps) with the coordinator's metrics (camelCase JSON) where a line needs them, and
//! prints the lines it answers. Names are the callers' (a header, a path segment): shown
//! with their control characters escaped ([`printable`]), so no name can end a line and
//! forge another (issue 43, N9).

use alloc::collections::VecDeque;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde_json::Value;

use crate::timeline::CallEvent;

/// A wait shorter than this is not worth a line, ms.
pub const LONG_WAIT_MS: u64 = 3_000;
/// Between two summaries, ms.
pub const SUMMARY_MS: u64 = 60_000;
/// Waits remembered until they end (the oldest forgotten first).
const MAX_OPEN: usize = 4_096;

/// Seconds as the lines write them: tenths below 10 s, whole seconds above.
#[must_use]
pub fn seconds(ms: u64) -> String {
    if ms < 10_000 {
        let tenths = (ms + 50) / 100;
        format!("{}.{}", tenths / 10, tenths % 10)
    } else {
        ((ms + 500) / 1000).to_string()
    }
}

fn axis_words(axis: &str) -> &str {
    match axis {
        "input_tokens" => "input tokens/min",
        "output_tokens" => "output tokens/min",
        "tokens" => "tokens/min",
        "requests" => "requests/min",
        "concurrent" => "parallel requests",
        other => other,
    }
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// The ceiling a pool (its metrics, camelCase) is held by now: every concurrency slot
/// taken, else the recent binding axis, else the gating axis with the least room as a share
/// of its capacity; `unknown` without one.
#[must_use]
pub fn ceiling_of(pool: Option<&Value>) -> String {
    let Some(p) = pool else {
        return "unknown".into();
    };
    if let Some(max) = p.get("maxConcurrent").filter(|m| !m.is_null()) {
        if num(&p["inFlight"]) >= num(max) {
            return format!("concurrency ({}/{} in flight)", p["inFlight"], max);
        }
    }
    if let Some(axis) = p
        .get("bindingAxis")
        .and_then(Value::as_str)
        .filter(|a| !a.is_empty())
    {
        return axis_words(axis).into();
    }
    let mut worst: Option<(&str, f64)> = None;
    for a in p
        .get("axes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if a.get("limit").is_none_or(Value::is_null) || num(&a["capacity"]) <= 0.0 {
            continue;
        }
        let room = num(&a["available"]) / num(&a["capacity"]);
        if worst.is_none_or(|(_, r)| room < r) {
            worst = Some((a["axis"].as_str().unwrap_or("unknown"), room));
        }
    }
    worst.map_or_else(|| "unknown".into(), |(axis, _)| axis_words(axis).into())
}

/// `text` with every control character (C0, DEL, C1, the Unicode line and paragraph
/// separators) as a `\uXXXX` escape: one line, and no terminal escape sequence.
#[must_use]
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let n = u32::from(c);
        if n < 0x20 || (0x7f..=0x9f).contains(&n) || n == 0x2028 || n == 0x2029 {
            out.push_str(&format!("\\u{n:04x}"));
        } else {
            out.push(c);
        }
    }
    out
}

#[derive(Clone, Debug, Default)]
struct Minute {
    start: u64,
    waits: u64,
    longest: u64,
    granted: u64,
    rate_limited: u64,
    refused: u64,
}

/// A quota's wait log (see the module doc). Each method answers the lines to print.
#[derive(Clone, Debug)]
pub struct WaitLog {
    /// Waits announced and not yet ended: lease, the agent's name, since.
    open: VecDeque<(u64, String)>,
    minute: Minute,
}

/// What a line about a wait reads of the metrics: the pool's and the agent's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Look<'a> {
    /// The pool's metrics.
    pub pool: Option<&'a Value>,
    /// The agent's metrics.
    pub agent: Option<&'a Value>,
    /// Every pool's metrics (for the summary).
    pub pools: &'a [Value],
}

impl Look<'_> {
    /// The pool and agent of `metrics` (the coordinator's, camelCase).
    #[must_use]
    pub fn of(metrics: &Value, pool: u32, agent: u64) -> Look<'_> {
        let pools = metrics
            .get("pools")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        let agent = metrics
            .get("agents")
            .and_then(Value::as_array)
            .and_then(|a| {
                a.iter()
                    .find(|x| x.get("agent").and_then(Value::as_u64) == Some(agent))
            });
        Look {
            pool: pools.get(pool as usize),
            agent,
            pools,
        }
    }
}

impl WaitLog {
    /// A log whose first minute starts at `now` (Unix ms).
    #[must_use]
    pub fn new(now: u64) -> WaitLog {
        WaitLog {
            open: VecDeque::new(),
            minute: Minute {
                start: now,
                ..Minute::default()
            },
        }
    }

    /// Whether a line about `ev` at `now` may read the metrics ([`Look`]): a long wait, or
    /// the minute's summary due. (A host computes them only then.)
    #[must_use]
    pub fn needs_look(&self, ev: &CallEvent, now: u64) -> bool {
        let wait_ms = match ev {
            CallEvent::Queued { eta, .. } => eta.saturating_sub(now),
            CallEvent::Waiting { until, .. } => until.saturating_sub(now),
            _ => 0,
        };
        self.wants_metrics(now, wait_ms)
    }

    /// Whether a line at `now` about a wait of `wait_ms` (0 for an event that is no wait)
    /// may read the metrics: a long wait, or the minute's summary due.
    #[must_use]
    pub fn wants_metrics(&self, now: u64, wait_ms: u64) -> bool {
        now.saturating_sub(self.minute.start) >= SUMMARY_MS || wait_ms >= LONG_WAIT_MS
    }

    /// Call event `ev` at `now`, of the agent named `name` (a queued ticket's, a waiting
    /// call's): the lines to print.
    pub fn note(&mut self, ev: &CallEvent, now: u64, name: &str, look: &Look<'_>) -> Vec<String> {
        match ev {
            CallEvent::Granted {
                lease, waited_ms, ..
            } => self.granted(now, *lease, *waited_ms, look),
            CallEvent::Queued {
                lease,
                pool,
                eta,
                checkpoint,
                ..
            } => self.queued(
                now,
                *lease,
                name,
                *pool,
                *eta,
                eta.saturating_sub(now),
                *checkpoint,
                look,
            ),
            CallEvent::Rejected { .. } => self.rejected(now, look),
            CallEvent::RateLimited { .. } => self.rate_limited(now, look),
            CallEvent::Waiting {
                pool,
                until,
                cause,
                attempt,
                ..
            } => {
                let delay = until.saturating_sub(now);
                let message = if *cause == "overloaded" {
                    format!(
                        "waiting on an overloaded provider, retrying in {} s (attempt {attempt})",
                        seconds(delay)
                    )
                } else {
                    format!(
                        "waiting on rate limit, retrying in {} s (attempt {attempt})",
                        seconds(delay)
                    )
                };
                self.waiting(now, name, *pool, delay, &message, look)
            }
            CallEvent::Expired { .. } => Vec::new(),
        }
    }

    /// Ticket `lease` of agent `name` queued at `now` in `pool` (its index), its bound
    /// `eta` (`eta_ms` from now), told to checkpoint or not.
    #[expect(clippy::too_many_arguments, reason = "one event's fields")]
    pub fn queued(
        &mut self,
        now: u64,
        lease: u64,
        name: &str,
        pool: u32,
        eta: u64,
        eta_ms: u64,
        checkpoint: bool,
        look: &Look<'_>,
    ) -> Vec<String> {
        let mut lines = Vec::new();
        if eta_ms >= LONG_WAIT_MS {
            let name = printable(name);
            if self.open.len() >= MAX_OPEN {
                self.open.pop_front();
            }
            self.open.push_back((lease, name.clone()));
            let depth = look
                .pool
                .and_then(|p| p.get("queueDepth"))
                .map_or_else(|| "?".to_string(), ToString::to_string);
            let pool_name = look
                .pool
                .and_then(|p| p.get("name"))
                .and_then(Value::as_str)
                .map_or_else(|| format!("pool {pool}"), ToString::to_string);
            // The expected wait (the core's expected grant for the agent's first ticket in
            // line) and the bound (the decision's eta).
            let activity = look.agent.and_then(|a| a.get("activity"));
            let expected = activity
                .filter(|a| a.get("state").and_then(Value::as_str) == Some("queued"))
                .and_then(|a| a.get("expectedGrant"))
                .and_then(Value::as_u64)
                .map(|at| (at + eta_ms).saturating_sub(eta));
            lines.push(format!(
                "tokenwarden: {name} waits for quota on {pool_name} (ceiling: {}), {}at most {} s, {depth} in line{}",
                ceiling_of(look.pool),
                expected.map_or_else(String::new, |e| format!("expected {} s, ", seconds(e))),
                seconds(eta_ms),
                if checkpoint { "; told to checkpoint its turn" } else { "" },
            ));
        }
        lines.extend(self.tick(now, look));
        lines
    }

    /// Lease `lease` granted at `now` after `waited_ms` in line.
    pub fn granted(
        &mut self,
        now: u64,
        lease: u64,
        waited_ms: u64,
        look: &Look<'_>,
    ) -> Vec<String> {
        let mut lines = Vec::new();
        self.minute.granted += 1;
        if waited_ms > 0 {
            self.minute.longest = self.minute.longest.max(waited_ms);
        }
        if let Some(i) = self.open.iter().position(|(l, _)| *l == lease) {
            let (_, name) = self.open.remove(i).unwrap_or_default();
            self.minute.waits += 1;
            lines.push(format!(
                "tokenwarden: {name} served after {} s in line",
                seconds(waited_ms)
            ));
        } else if waited_ms >= LONG_WAIT_MS {
            self.minute.waits += 1;
        }
        lines.extend(self.tick(now, look));
        lines
    }

    /// A call of agent `name` waits `delay_ms` from `now` in `pool` after a 429 or an
    /// overload (`message`: what the call says of it).
    pub fn waiting(
        &mut self,
        now: u64,
        name: &str,
        pool: u32,
        delay_ms: u64,
        message: &str,
        look: &Look<'_>,
    ) -> Vec<String> {
        let mut lines = Vec::new();
        if delay_ms >= LONG_WAIT_MS {
            self.minute.waits += 1;
            // The ceiling: the limit a 429 named or showed spent, else the pool's.
            let activity = look.agent.and_then(|a| a.get("activity"));
            let axis = activity
                .filter(|a| a.get("state").and_then(Value::as_str) == Some("rate_limited"))
                .and_then(|a| a.get("axis"))
                .and_then(Value::as_str);
            let ceiling = axis.map_or_else(|| ceiling_of(look.pool), |a| axis_words(a).to_string());
            let pool_name = look
                .pool
                .and_then(|p| p.get("name"))
                .and_then(Value::as_str)
                .map_or_else(|| format!("pool {pool}"), ToString::to_string);
            lines.push(format!(
                "tokenwarden: {} on {pool_name} (ceiling: {ceiling}): {message}",
                printable(name)
            ));
        }
        lines.extend(self.tick(now, look));
        lines
    }

    /// A 429 reported at `now`.
    pub fn rate_limited(&mut self, now: u64, look: &Look<'_>) -> Vec<String> {
        self.minute.rate_limited += 1;
        self.tick(now, look).into_iter().collect()
    }

    /// A refusal at `now`.
    pub fn rejected(&mut self, now: u64, look: &Look<'_>) -> Vec<String> {
        self.minute.refused += 1;
        self.tick(now, look).into_iter().collect()
    }

    /// The summary of the minute just past, once a minute passed since the last one.
    fn tick(&mut self, now: u64, look: &Look<'_>) -> Option<String> {
        let m = &self.minute;
        if now.saturating_sub(m.start) < SUMMARY_MS {
            return None;
        }
        let state: Vec<String> = look
            .pools
            .iter()
            .map(|p| {
                format!(
                    "{}: margin {} %, {} in line, {} in flight, held by {}",
                    p["name"].as_str().unwrap_or_default(),
                    ((num(&p["marginPermille"]) / 10.0) + 0.5).floor(),
                    p["queueDepth"],
                    p["inFlight"],
                    ceiling_of(Some(p))
                )
            })
            .collect();
        let state = state.join("; ");
        let line = format!(
            "tokenwarden: last {} s: {} calls granted, {} waited over {} s{}, {} answered 429 by the provider, {} refused{}",
            (now - m.start + 500) / 1000,
            m.granted,
            m.waits,
            LONG_WAIT_MS / 1000,
            if m.longest > 0 {
                format!(" (longest {} s)", seconds(m.longest))
            } else {
                String::new()
            },
            m.rate_limited,
            m.refused,
            if state.is_empty() {
                String::new()
            } else {
                format!(" — {state}")
            },
        );
        self.minute = Minute {
            start: now,
            ..Minute::default()
        };
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn metrics() -> Value {
        json!({
            "pools": [{ "name": "claude", "queueDepth": 2, "inFlight": 1, "maxConcurrent": null, "marginPermille": 850,
                        "bindingAxis": null,
                        "axes": [{ "axis": "requests", "limit": 100, "capacity": 85, "available": 50 },
                                 { "axis": "input_tokens", "limit": 6000, "capacity": 5100, "available": 100 }] }],
            "agents": [{ "agent": 7, "activity": { "state": "queued", "since": 0, "expectedGrant": 1_008_000 } }],
        })
    }

    #[test]
    fn a_long_wait_its_end_and_the_minute_are_lines() {
        let m = metrics();
        let look = Look::of(&m, 0, 7);
        let mut log = WaitLog::new(1_000_000);
        let lines = log.queued(
            1_000_000,
            5,
            "bob\u{1b}[2J\nforged",
            0,
            1_010_000,
            10_000,
            true,
            &look,
        );
        assert_eq!(
            lines,
            [
                "tokenwarden: bob\\u001b[2J\\u000aforged waits for quota on claude (ceiling: input tokens/min), expected 8.0 s, at most 10 s, 2 in line; told to checkpoint its turn"
            ]
        );
        assert!(
            log.queued(1_000_000, 6, "quick", 0, 1_001_000, 1_000, false, &look)
                .is_empty(),
            "a short wait: no line"
        );
        assert_eq!(
            log.granted(1_009_000, 5, 9_000, &look),
            ["tokenwarden: bob\\u001b[2J\\u000aforged served after 9.0 s in line"]
        );
        assert!(log.rate_limited(1_010_000, &look).is_empty());
        let w = log.waiting(
            1_020_000,
            "carol",
            0,
            4_000,
            "waiting on rate limit, retrying in 4.0 s (attempt 1)",
            &look,
        );
        assert_eq!(
            w,
            [
                "tokenwarden: carol on claude (ceiling: input tokens/min): waiting on rate limit, retrying in 4.0 s (attempt 1)"
            ]
        );
        let summary = log.rejected(1_061_000, &look);
        assert_eq!(
            summary,
            [
                "tokenwarden: last 61 s: 1 calls granted, 2 waited over 3 s (longest 9.0 s), 1 answered 429 by the provider, 1 refused — claude: margin 85 %, 2 in line, 1 in flight, held by input tokens/min"
            ]
        );
    }

    #[test]
    fn the_ceiling_is_concurrency_then_the_binding_axis_then_the_least_room() {
        assert_eq!(ceiling_of(None), "unknown");
        assert_eq!(
            ceiling_of(Some(&json!({ "maxConcurrent": 2, "inFlight": 2 }))),
            "concurrency (2/2 in flight)"
        );
        assert_eq!(
            ceiling_of(Some(
                &json!({ "maxConcurrent": 4, "inFlight": 2, "bindingAxis": "requests" })
            )),
            "requests/min"
        );
        assert_eq!(seconds(9_949), "9.9");
        assert_eq!(seconds(10_500), "11");
    }
}
