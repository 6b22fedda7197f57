//! One send of a model call, from the request leaving under its lease to the lease's end,
//! as a sans-IO machine: the host tells it what happened (the answer's head, a piece of
//! the body, the body's end, a break, the time) and does what it says (renew the lease,
//! settle it, end it as interrupted, hand the answer over, abort for a timeout).
//!
//! The ask before it (lease, wait, retry, give up) is the core's call lifecycle
//! ([`Coordinator::call_lease`](crate::Coordinator::call_lease) and
//! [`call_response`](crate::Coordinator::call_response)); this is the rest of the call, so
//! that no host decides when a lease is renewed, how long the provider may keep a call
//! waiting, when an answer is handed over, or whether a call that ended is settled from its
//! usage or charged by the core's rule for an interrupted call.
//!
//! The rules:
//! - **Renewal.** While the provider works on the answer (a non-streamed call sends nothing
//!   until it is ready) the lease is renewed on a keep-alive tick every quarter of its span,
//!   and while the body flows on the pieces that arrive: at most once a third of the span
//!   (the time left on the lease when the phase began, then what each renewal gives), never
//!   while a renewal is on its way. A lease the core no longer knows stops it, and so does
//!   a renewal that left the expiry where it was (the lease is at the end of its life,
//!   `max_lease_life_ms`); another failed renewal is tried again a third of the span later.
//! - **Timeouts.** No head within `first_byte_ms` of the send, or no piece within `idle_ms`
//!   while the caller waits for one: the request is aborted ([`Action::TimedOut`]) and the
//!   lease ends as interrupted with what the body showed.
//! - **Delivery.** A stream is handed over at its head; a JSON body is held until it ends
//!   or passes [`HOLD_BYTES`] (so a JSON answer is settled by the time its caller has it).
//! - **The end.** A body that ended with its usage settles the lease with it (and the
//!   estimator learns from it, unless a figure is clamped: an absurd report); one that ended
//!   without it, broke, was cancelled or timed out ends it as interrupted with what it
//!   showed; a send with no answer ends it as interrupted with nothing seen. A settle the core
//!   refuses for any reason but the lease being gone falls back to interrupted, and an
//!   interrupted with a `seen` the core refuses to one without.
//!
//! ```
//! use tokenwarden_core::{Action, Answer, Exchange, Millis, Timeouts, Usage};
//!
//! let t = Timeouts { first_byte_ms: Some(600_000), idle_ms: Some(300_000) };
//! let mut x = Exchange::sent(Millis(0), 60_000, t);
//! assert_eq!(x.poll_timeout(), Some(Millis(15_000))); // the keep-alive tick
//! x.handle_timeout(Millis(15_000));
//! assert_eq!(x.poll_action(), None); // a quarter of the span: too early to renew
//! x.handle_timeout(Millis(30_000));
//! assert_eq!(x.poll_action(), Some(Action::Renew));
//! x.renewed(Millis(30_010), 60_000);
//! x.answered(Millis(31_000), Answer::Json, 29_000);
//! x.reading(Millis(31_000));
//! x.piece(Millis(31_500), 512);
//! let usage = Usage { input_tokens: 10, output_tokens: 20, ..Usage::default() };
//! x.end(Millis(31_600), Some(usage));
//! assert_eq!(x.poll_action(), Some(Action::Settle { usage, learn: true }));
//! assert_eq!(x.poll_action(), Some(Action::Deliver));
//! assert!(x.is_ended());
//! ```

use alloc::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::request::Usage;
use crate::time::{MAX_DURATION_MS, Millis};

/// A JSON answer up to this size is read whole before it is handed over (the provider
/// crate's reader parses a body of up to 1 MiB whole); a larger one streams through.
pub const HOLD_BYTES: u64 = (1 << 20) + 1;

/// The shortest keep-alive tick, ms.
const MIN_TICK_MS: u64 = 10;

/// The largest figure a usage report is taken at: a figure at it was clamped.
const CLAMPED: u64 = (1 << 53) - 1;

/// How long the provider may keep a call waiting, ms; `None` turns one off. The defaults
/// are generous on purpose: a non-streamed call to a large model sends nothing until the
/// whole answer is ready, which can take minutes, and the official SDKs wait 10 minutes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeouts {
    /// From the send until the answer's head (default 600,000: 10 minutes, as the official
    /// SDKs' own request timeout).
    pub first_byte_ms: Option<u64>,
    /// Between two pieces of the body, while the caller waits for one (default 300,000:
    /// 5 minutes).
    pub idle_ms: Option<u64>,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            first_byte_ms: Some(600_000),
            idle_ms: Some(300_000),
        }
    }
}

impl Timeouts {
    /// No timeouts at all.
    pub const NONE: Timeouts = Timeouts {
        first_byte_ms: None,
        idle_ms: None,
    };

    /// The field (`first_byte_ms` or `idle_ms`) that is not from 1 ms to
    /// [`MAX_DURATION_MS`](crate::MAX_DURATION_MS), if one is not.
    pub fn check(&self) -> Result<(), &'static str> {
        let ok = |t: Option<u64>| t.is_none_or(|ms| (1..=MAX_DURATION_MS).contains(&ms));
        if !ok(self.first_byte_ms) {
            Err("first_byte_ms")
        } else if !ok(self.idle_ms) {
            Err("idle_ms")
        } else {
            Ok(())
        }
    }
}

/// What the core made of the answer's head ([`Coordinator::call_response`](crate::Coordinator::call_response)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// Not a success: the core settled the lease; the answer is handed over as it is.
    Settled,
    /// A success without a body.
    Empty,
    /// A success with a JSON body.
    Json,
    /// A success with an event stream.
    Stream,
}

/// Which timeout passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Timeout {
    /// No head within [`Timeouts::first_byte_ms`].
    FirstByte,
    /// No piece of the body within [`Timeouts::idle_ms`].
    Idle,
}

/// What the host does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "do")]
pub enum Action {
    /// Renew the lease; tell [`Exchange::renewed`] or [`Exchange::renew_refused`].
    Renew,
    /// Settle the lease with `usage`; when the core takes it and `learn`, the estimator
    /// learns from it. A refusal goes to [`Exchange::settle_refused`].
    Settle {
        /// What the call used.
        usage: Usage,
        /// Whether the estimator may learn from it.
        learn: bool,
    },
    /// End the lease by the core's rule for an interrupted call, with what the body showed
    /// (the host's reader knows it; nothing for a send without an answer). A refusal goes
    /// to [`Exchange::interrupted_refused`].
    Interrupted {
        /// Whether the body's `seen` goes with it (false: nothing seen, the whole
        /// reservation).
        seen: bool,
    },
    /// Hand the answer over to the caller now (what is held, then the rest as it comes).
    Deliver,
    /// Abort the request: a timeout passed (the caller's error is `upstream_timeout`).
    TimedOut {
        /// Which one.
        timeout: Timeout,
        /// Its length, ms.
        ms: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Sent; the head is awaited.
    Awaiting,
    /// The body is read.
    Reading,
    /// The lease's end is decided.
    Ended,
}

/// The renewal cadence (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Renewal {
    from: Millis,
    span: u64,
    /// The lease's expiry as last known (`from + span` when it was learned).
    until: Millis,
    busy: bool,
    stopped: bool,
}

impl Renewal {
    fn new(now: Millis, left_ms: u64) -> Renewal {
        Renewal {
            from: now,
            span: left_ms,
            until: now.plus(left_ms),
            busy: false,
            stopped: left_ms == 0,
        }
    }

    /// Whether to renew at `now` (and so a renewal is on its way).
    fn due(&mut self, now: Millis) -> bool {
        if self.stopped || self.busy || now.since(self.from).saturating_mul(3) < self.span {
            return false;
        }
        self.from = now;
        self.busy = true;
        true
    }
}

/// One send's machine (see the module doc). Feed it events; after each, take its actions
/// ([`Exchange::poll_action`]) and arm one timer for [`Exchange::poll_timeout`], calling
/// [`Exchange::handle_timeout`] when it fires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange {
    phase: Phase,
    timeouts: Timeouts,
    /// The first-byte or idle deadline.
    deadline: Option<Millis>,
    /// The keep-alive tick while the head is awaited: when, and how often.
    tick: Option<(Millis, u64)>,
    renewal: Renewal,
    hold: u64,
    held: u64,
    delivered: bool,
    /// The lease's end last asked, so that a refusal falls back once, to a more
    /// conservative end.
    asked: Option<Action>,
    actions: VecDeque<Action>,
}

impl Exchange {
    /// The request was sent at `now` under a lease with `lease_left_ms` to run (0: none
    /// known, no renewal).
    #[must_use]
    pub fn sent(now: Millis, lease_left_ms: u64, timeouts: Timeouts) -> Exchange {
        let renewal = Renewal::new(now, lease_left_ms);
        let tick = (!renewal.stopped).then(|| {
            let every = (lease_left_ms / 4).max(MIN_TICK_MS);
            (now.plus(every), every)
        });
        Exchange {
            phase: Phase::Awaiting,
            timeouts,
            deadline: timeouts.first_byte_ms.map(|ms| now.plus(ms)),
            tick,
            renewal,
            hold: 0,
            held: 0,
            delivered: false,
            asked: None,
            actions: VecDeque::new(),
        }
    }

    /// The next action, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether an action is waiting.
    #[must_use]
    pub fn has_action(&self) -> bool {
        !self.actions.is_empty()
    }

    /// When [`Exchange::handle_timeout`] is to be called next, if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        if self.phase == Phase::Ended {
            return None;
        }
        match (self.deadline, self.tick.map(|(at, _)| at)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the lease's end is decided (nothing more will be asked but the answers to
    /// actions already taken).
    #[must_use]
    pub fn is_ended(&self) -> bool {
        self.phase == Phase::Ended
    }

    /// Whether the answer was handed over.
    #[must_use]
    pub fn is_delivered(&self) -> bool {
        self.delivered
    }

    /// The time is `now`: a deadline or a keep-alive tick that has come is acted on.
    pub fn handle_timeout(&mut self, now: Millis) {
        if self.phase == Phase::Ended {
            return;
        }
        if self.deadline.is_some_and(|d| d <= now) {
            let (timeout, ms) = match self.phase {
                Phase::Awaiting => (Timeout::FirstByte, self.timeouts.first_byte_ms),
                _ => (Timeout::Idle, self.timeouts.idle_ms),
            };
            self.actions.push_back(Action::TimedOut {
                timeout,
                ms: ms.unwrap_or(0),
            });
            self.interrupted(timeout == Timeout::Idle);
            return;
        }
        if let Some((at, every)) = self.tick {
            if at <= now {
                if self.renewal.due(now) {
                    self.actions.push_back(Action::Renew);
                }
                self.tick = Some((now.plus(every), every));
            }
        }
    }

    /// No answer came (the send failed, or the core could not take the answer in): the
    /// provider may have processed all of it.
    pub fn failed(&mut self) {
        if self.phase != Phase::Ended {
            self.interrupted(false);
        }
    }

    /// The answer's head came at `now` and the core made `answer` of it; the lease has
    /// `lease_left_ms` to run.
    pub fn answered(&mut self, now: Millis, answer: Answer, lease_left_ms: u64) {
        if self.phase != Phase::Awaiting {
            return;
        }
        self.tick = None;
        self.deadline = None;
        match answer {
            Answer::Settled => {
                self.phase = Phase::Ended;
                self.deliver();
            }
            Answer::Empty => {
                self.interrupted(false);
                self.deliver();
            }
            Answer::Json | Answer::Stream => {
                self.phase = Phase::Reading;
                // A renewal still on its way stays so.
                let busy = self.renewal.busy;
                self.renewal = Renewal::new(now, lease_left_ms);
                self.renewal.busy = busy;
                self.hold = if answer == Answer::Json {
                    HOLD_BYTES
                } else {
                    0
                };
                if self.hold == 0 {
                    self.deliver();
                }
            }
        }
    }

    /// The caller waits for the next piece of the body from `now` (the idle timeout runs
    /// until it comes).
    pub fn reading(&mut self, now: Millis) {
        if self.phase == Phase::Reading {
            self.deadline = self.timeouts.idle_ms.map(|ms| now.plus(ms));
        }
    }

    /// A piece of `len` bytes of the body came at `now` (the host's reader has read it).
    pub fn piece(&mut self, now: Millis, len: u64) {
        if self.phase != Phase::Reading {
            return;
        }
        self.deadline = None;
        if self.renewal.due(now) {
            self.actions.push_back(Action::Renew);
        }
        self.held = self.held.saturating_add(len);
        if !self.delivered && self.held >= self.hold {
            self.deliver();
        }
    }

    /// The body ended cleanly at `now`; `usage` is the usage it reported in full, if it did.
    pub fn end(&mut self, _now: Millis, usage: Option<Usage>) {
        if self.phase != Phase::Reading {
            return;
        }
        self.deadline = None;
        match usage {
            Some(usage) => {
                let learn = [
                    usage.input_tokens,
                    usage.cache_creation_input_tokens,
                    usage.cache_read_input_tokens,
                    usage.output_tokens,
                ]
                .iter()
                .all(|&n| n < CLAMPED);
                self.phase = Phase::Ended;
                self.ask(Action::Settle { usage, learn });
            }
            None => self.interrupted(true),
        }
        self.deliver();
    }

    /// The body broke (a read failed, or the caller cancelled it).
    pub fn broken(&mut self) {
        if self.phase == Phase::Reading {
            self.interrupted(true);
        } else if self.phase == Phase::Awaiting {
            self.interrupted(false);
        }
    }

    /// The renewal asked at the last [`Action::Renew`] was answered at `now`: the lease has
    /// `lease_left_ms` to run. One that did not move the expiry (the lease is at the end of
    /// its life) ends the renewals.
    pub fn renewed(&mut self, now: Millis, lease_left_ms: u64) {
        self.renewal.busy = false;
        if lease_left_ms > 0 {
            let until = now.plus(lease_left_ms);
            if until <= self.renewal.until {
                self.renewal.stopped = true;
                return;
            }
            self.renewal.from = now;
            self.renewal.span = lease_left_ms;
            self.renewal.until = until;
        }
    }

    /// The renewal was refused; `gone`: the core no longer knows the lease (reaped or
    /// ended), so renewing stops. Otherwise it is tried again a third of the span later.
    pub fn renew_refused(&mut self, gone: bool) {
        self.renewal.busy = false;
        if gone {
            self.renewal.stopped = true;
        }
    }

    /// The settle was refused; `gone`: the lease had already ended. Otherwise the call is
    /// charged as interrupted instead.
    pub fn settle_refused(&mut self, gone: bool) {
        if !gone && matches!(self.asked, Some(Action::Settle { .. })) {
            self.ask(Action::Interrupted { seen: true });
        }
    }

    /// The interrupted end was refused; `gone`: the lease had already ended. Otherwise, if
    /// it carried what the body showed, the lease ends as if nothing was seen.
    pub fn interrupted_refused(&mut self, gone: bool) {
        if !gone && self.asked == Some(Action::Interrupted { seen: true }) {
            self.ask(Action::Interrupted { seen: false });
        }
    }

    fn interrupted(&mut self, seen: bool) {
        self.phase = Phase::Ended;
        self.deadline = None;
        self.tick = None;
        self.ask(Action::Interrupted { seen });
    }

    fn ask(&mut self, end: Action) {
        self.asked = Some(end);
        self.actions.push_back(end);
    }

    fn deliver(&mut self) {
        if !self.delivered {
            self.delivered = true;
            self.actions.push_back(Action::Deliver);
        }
    }
}
