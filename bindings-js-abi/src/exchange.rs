//! One send of a model call for a JavaScript host: the provider crate's
//! [`Send`] (the core's exchange with the usage reader),
//! so the host passes bytes and the time and does what it is told.
//!
//! The events cross the boundary as one call with a code ([`EVENTS`]: the index of the
//! event's name; the TypeScript mirror is generated from it), bytes as another
//! ([`Exchange::push`]). Every event answers a small number: [`ACTIONS`] set when actions
//! wait ([`Exchange::actions`]), [`TIMER`] set when the deadline moved
//! ([`Exchange::deadline`]).

use tokenwarden_core as core;
use tokenwarden_provider::Api;
use tokenwarden_provider::send::{Send, SendAction};

use crate::{ArgError, u64_from_f64};

/// An event's answer bit: actions wait.
pub const ACTIONS: u32 = 1;
/// An event's answer bit: the deadline moved.
pub const TIMER: u32 = 2;

/// The events of [`Exchange::event`], by code (the index): the four answers to the head
/// (`arg`: the time left on the lease), the caller reading, the body's end, a break, no
/// answer, the timer, a renewal answered (`arg`: the time left) or refused, a settle or an
/// interrupted refused (`arg`: 1 when the lease is gone).
pub const EVENTS: [&str; 13] = [
    "settled",
    "empty",
    "json",
    "stream",
    "reading",
    "end",
    "broken",
    "failed",
    "timeout",
    "renewed",
    "renew_refused",
    "settle_refused",
    "interrupted_refused",
];

/// A send's machine and its answer's reader (see the module doc).
#[derive(Debug)]
pub struct Exchange {
    machine: Send,
}

/// The API named as [`crate::model_call`] names it.
pub fn api(name: &str) -> Result<Api, ArgError> {
    match name {
        "anthropic_messages" => Ok(Api::AnthropicMessages),
        "openai_chat" => Ok(Api::OpenaiChat),
        "openai_responses" => Ok(Api::OpenaiResponses),
        other => Err(ArgError::range(
            "invalid_argument",
            format!(
                "`api` must be anthropic_messages, openai_chat or openai_responses, got {other:?}"
            ),
        )
        .with_field("api")),
    }
}

/// The upstream timeouts from the host's options, checked: each `undefined` for the default,
/// `Infinity` for none, else whole milliseconds in the core's range
/// ([`core::Timeouts::check`]); an error names the option (`timeouts.firstByteMs`,
/// `timeouts.idleMs`).
fn options(first_byte_ms: Option<f64>, idle_ms: Option<f64>) -> Result<core::Timeouts, ArgError> {
    const FIELDS: [&str; 2] = ["timeouts.firstByteMs", "timeouts.idleMs"];
    let given = [first_byte_ms, idle_ms];
    let refused = |i: usize| {
        ArgError::range(
            "invalid_argument",
            format!(
                "`{}` must be an integer number of milliseconds from 1 to {}, or Infinity for none; got {}",
                FIELDS[i],
                core::MAX_DURATION_MS,
                given[i].map_or_else(|| "undefined".into(), crate::shown)
            ),
        )
        .with_field(FIELDS[i])
    };
    let d = core::Timeouts::default();
    let ms = |i: usize, default: Option<u64>| match given[i] {
        None => Ok(default),
        Some(f) if f == f64::INFINITY => Ok(None),
        Some(f) => u64_from_f64(f, FIELDS[i]).map(Some).map_err(|_| refused(i)),
    };
    let t = core::Timeouts {
        first_byte_ms: ms(0, d.first_byte_ms)?,
        idle_ms: ms(1, d.idle_ms)?,
    };
    t.check()
        .map_err(|field| refused(usize::from(field == "idle_ms")))?;
    Ok(t)
}

/// The upstream timeouts from the host's options, checked (`undefined`: the default,
/// `Infinity`: none, else whole milliseconds in the core's range), as
/// `[firstByteMs, idleMs]` with `Infinity` for none: the form [`Exchange::sent`] takes.
pub fn timeouts(first_byte_ms: Option<f64>, idle_ms: Option<f64>) -> Result<[f64; 2], ArgError> {
    let t = options(first_byte_ms, idle_ms)?;
    #[allow(clippy::cast_precision_loss)] // at most 30 days of ms: exact
    let f = |t: Option<u64>| t.map_or(f64::INFINITY, |ms| ms as f64);
    Ok([f(t.first_byte_ms), f(t.idle_ms)])
}

/// An instant from the host's clock (whole milliseconds).
fn at(now: f64) -> Result<core::Millis, ArgError> {
    u64_from_f64(now, "now").map(core::Millis)
}

/// Time left on a lease: a negative figure (its expiry passed on the host's clock) is none.
fn left(ms: f64) -> Result<u64, ArgError> {
    if ms.is_nan() {
        return Err(ArgError::range(
            "invalid_argument",
            "`leaseLeftMs` must be a number of milliseconds, got NaN".into(),
        )
        .with_field("leaseLeftMs"));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // clamped first
    Ok(ms.clamp(0.0, 1.8e19).floor() as u64)
}

impl Exchange {
    /// The request of an `api` call was sent at `now` under a lease with `lease_left_ms` to
    /// run, with `timeouts` as [`timeouts`] answers them.
    pub fn sent(
        api_name: &str,
        now: f64,
        lease_left_ms: f64,
        first_byte_ms: f64,
        idle_ms: f64,
    ) -> Result<Exchange, ArgError> {
        Ok(Exchange {
            machine: Send::sent(
                api(api_name)?,
                at(now)?,
                left(lease_left_ms)?,
                options(Some(first_byte_ms), Some(idle_ms))?,
            ),
        })
    }

    fn step(&mut self, f: impl FnOnce(&mut Send)) -> u32 {
        let before = self.machine.poll_timeout();
        f(&mut self.machine);
        let mut bits = 0;
        if self.machine.has_action() {
            bits |= ACTIONS;
        }
        if self.machine.poll_timeout() != before {
            bits |= TIMER;
        }
        bits
    }

    /// Event `code` ([`EVENTS`]) at `now`, with its `arg`.
    pub fn event(&mut self, code: u32, now: f64, arg: f64) -> Result<u32, ArgError> {
        let t = at(now)?;
        let gone = arg != 0.0;
        Ok(match code {
            0..=3 => {
                let answer = [
                    core::Answer::Settled,
                    core::Answer::Empty,
                    core::Answer::Json,
                    core::Answer::Stream,
                ][code as usize];
                let left = left(arg)?;
                self.step(|m| m.answered(t, answer, left))
            }
            4 => self.step(|m| m.reading(t)),
            5 => self.step(|m| m.end(t)),
            6 => self.step(Send::broken),
            7 => self.step(Send::failed),
            8 => self.step(|m| m.handle_timeout(t)),
            9 => {
                let left = left(arg)?;
                self.step(|m| m.renewed(t, left))
            }
            10 => self.step(|m| m.renew_refused(gone)),
            11 => self.step(|m| m.settle_refused(gone)),
            12 => self.step(|m| m.interrupted_refused(gone)),
            other => {
                return Err(ArgError::range(
                    "invalid_argument",
                    format!("`event` must be a code from 0 to 12, got {other}"),
                )
                .with_field("event"));
            }
        })
    }

    /// A piece of the body came at `now`.
    pub fn push(&mut self, now: f64, chunk: &[u8]) -> Result<u32, ArgError> {
        let now = at(now)?;
        Ok(self.step(|m| m.push(now, chunk)))
    }

    /// When to send the `timeout` event next, on the host's clock; -1 for never.
    #[must_use]
    pub fn deadline(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)] // a clock reading in ms: below 2^53
        self.machine
            .poll_timeout()
            .map_or(-1.0, |t| t.as_u64() as f64)
    }

    /// The actions waiting, as a JSON array: `{"do":"renew"}`, `{"do":"settle","usage":…,
    /// "learn":…}`, `{"do":"interrupted","seen":…}` (a usage object or `null`),
    /// `{"do":"deliver"}`, `{"do":"timed_out","timeout":"first_byte"|"idle","ms":…}`.
    pub fn actions(&mut self) -> String {
        let mut out = String::from("[");
        while let Some(a) = self.machine.poll_action() {
            if out.len() > 1 {
                out.push(',');
            }
            match a {
                SendAction::Renew => out.push_str(r#"{"do":"renew"}"#),
                SendAction::Deliver => out.push_str(r#"{"do":"deliver"}"#),
                SendAction::Settle { usage, learn } => out.push_str(&format!(
                    r#"{{"do":"settle","usage":{},"learn":{learn}}}"#,
                    crate::usage_json(Some(usage))
                )),
                SendAction::Interrupted { seen } => out.push_str(&format!(
                    r#"{{"do":"interrupted","seen":{}}}"#,
                    crate::usage_json(seen)
                )),
                SendAction::TimedOut { timeout, ms } => {
                    let which = match timeout {
                        core::Timeout::FirstByte => "first_byte",
                        core::Timeout::Idle => "idle",
                    };
                    out.push_str(&format!(
                        r#"{{"do":"timed_out","timeout":"{which}","ms":{ms}}}"#
                    ));
                }
            }
        }
        out.push(']');
        out
    }
}
