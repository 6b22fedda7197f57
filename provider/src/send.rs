//! One send of a model call for a host that passes the answer's bytes: the core's
//! [`Exchange`] (when to renew the lease, the upstream timeouts, when the answer is handed
//! over, how the lease ends) with this crate's [`UsageReader`] for the body, so the host
//! moves bytes and time and does what [`Send::poll_action`] says. Every JavaScript host runs
//! it through its engine; a Rust host runs it as it is.
//!
//! ```
//! use tokenwarden_core::{Answer, Millis, Timeouts};
//! use tokenwarden_provider::{Api, Usage};
//! use tokenwarden_provider::send::{Send, SendAction};
//!
//! let mut s = Send::sent(Api::AnthropicMessages, Millis(0), 60_000, Timeouts::default());
//! s.answered(Millis(900), Answer::Stream, 59_100);
//! assert_eq!(s.poll_action(), Some(SendAction::Deliver));
//! s.reading(Millis(900));
//! s.push(Millis(950), b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n");
//! s.push(Millis(990), b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":42}}\n\n");
//! s.end(Millis(1_000));
//! let usage = Usage { input_tokens: 12, output_tokens: 42, ..Usage::default() };
//! assert_eq!(s.poll_action(), Some(SendAction::Settle { usage, learn: true }));
//! assert!(s.is_ended());
//! ```

use tokenwarden_core::{Action, Answer, Exchange, Millis, Timeout, Timeouts};

use crate::Api;
use crate::usage::{Format, Usage, UsageReader};

/// What the host does next (the core's [`Action`], with what the body showed resolved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendAction {
    /// Renew the lease; tell [`Send::renewed`] or [`Send::renew_refused`].
    Renew,
    /// Settle the lease with `usage`; when the core takes it and `learn`, the estimator
    /// learns from it. A refusal goes to [`Send::settle_refused`].
    Settle {
        /// What the call used, as the answer reported it.
        usage: Usage,
        /// Whether the estimator may learn from it (no figure clamped).
        learn: bool,
    },
    /// End the lease by the core's rule for an interrupted call with what the body showed
    /// (`None`: nothing, the whole reservation). A refusal goes to
    /// [`Send::interrupted_refused`].
    Interrupted {
        /// What the body showed.
        seen: Option<Usage>,
    },
    /// Hand the answer over now (what is held, then the rest as it comes).
    Deliver,
    /// Abort the request: a timeout passed (the caller's error is `upstream_timeout`).
    TimedOut {
        /// Which one.
        timeout: Timeout,
        /// Its length, ms.
        ms: u64,
    },
}

/// One send (see the module doc). Feed it events; after each, take its actions and arm one
/// timer for [`Send::poll_timeout`].
#[derive(Debug)]
pub struct Send {
    machine: Exchange,
    format: Format,
    reader: Option<UsageReader>,
}

impl Send {
    /// An `api` call was sent at `now` under a lease with `lease_left_ms` to run.
    #[must_use]
    pub fn sent(api: Api, now: Millis, lease_left_ms: u64, timeouts: Timeouts) -> Send {
        Send {
            machine: Exchange::sent(now, lease_left_ms, timeouts),
            format: Format::from(api),
            reader: None,
        }
    }

    /// The head came at `now`; the core made `answer` of it; the lease has `lease_left_ms`.
    pub fn answered(&mut self, now: Millis, answer: Answer, lease_left_ms: u64) {
        if matches!(answer, Answer::Json | Answer::Stream) && !self.machine.is_ended() {
            self.reader = Some(UsageReader::new(self.format, answer == Answer::Stream));
        }
        self.machine.answered(now, answer, lease_left_ms);
    }

    /// The caller waits for the next piece from `now`.
    pub fn reading(&mut self, now: Millis) {
        self.machine.reading(now);
    }

    /// A piece of the body came at `now`.
    pub fn push(&mut self, now: Millis, chunk: &[u8]) {
        if !self.machine.is_ended() {
            if let Some(r) = self.reader.as_mut() {
                r.push(chunk);
            }
        }
        self.machine.piece(now, chunk.len() as u64);
    }

    /// The body ended cleanly at `now`.
    pub fn end(&mut self, now: Millis) {
        let usage = match self.reader.as_mut() {
            Some(r) if !self.machine.is_ended() => {
                r.end();
                r.usage().map(Into::into)
            }
            _ => None,
        };
        self.machine.end(now, usage);
    }

    /// The body broke or was cancelled.
    pub fn broken(&mut self) {
        self.machine.broken();
    }

    /// No answer came, or the core could not take it in.
    pub fn failed(&mut self) {
        self.machine.failed();
    }

    /// The timer fired at `now`.
    pub fn handle_timeout(&mut self, now: Millis) {
        self.machine.handle_timeout(now);
    }

    /// The renewal was answered at `now`: the lease has `lease_left_ms` to run.
    pub fn renewed(&mut self, now: Millis, lease_left_ms: u64) {
        self.machine.renewed(now, lease_left_ms);
    }

    /// The renewal was refused (`gone`: the lease is unknown).
    pub fn renew_refused(&mut self, gone: bool) {
        self.machine.renew_refused(gone);
    }

    /// The settle was refused (`gone`: the lease had ended).
    pub fn settle_refused(&mut self, gone: bool) {
        self.machine.settle_refused(gone);
    }

    /// The interrupted end was refused (`gone`: the lease had ended).
    pub fn interrupted_refused(&mut self, gone: bool) {
        self.machine.interrupted_refused(gone);
    }

    /// The next action, if any.
    pub fn poll_action(&mut self) -> Option<SendAction> {
        Some(match self.machine.poll_action()? {
            Action::Renew => SendAction::Renew,
            Action::Deliver => SendAction::Deliver,
            Action::Settle { usage, learn } => SendAction::Settle {
                usage: usage.into(),
                learn,
            },
            Action::Interrupted { seen } => SendAction::Interrupted {
                seen: if seen {
                    self.reader.as_ref().and_then(UsageReader::seen)
                } else {
                    None
                },
            },
            Action::TimedOut { timeout, ms } => SendAction::TimedOut { timeout, ms },
        })
    }

    /// Whether an action is waiting.
    #[must_use]
    pub fn has_action(&self) -> bool {
        self.machine.has_action()
    }

    /// When [`Send::handle_timeout`] is to be called next, if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.machine.poll_timeout()
    }

    /// Whether the lease's end is decided.
    #[must_use]
    pub fn is_ended(&self) -> bool {
        self.machine.is_ended()
    }
}
