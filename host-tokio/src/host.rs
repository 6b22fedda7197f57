//! The coordinator in this process: its clock task, grants handed to the tasks that wait on
//! them, and the estimator beside it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokenwarden_core::{
    Config, ConfigError, Coordinator, Event, Input, LeaseError, LeaseId, Millis, Output, Timeout,
    Timeouts,
};
use tokenwarden_provider::bpe::{self, Bpe, Encoding};
use tokenwarden_provider::estimate::{Estimator, Options, OptionsError, Provider};
use tokio::sync::{Notify, broadcast, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What went wrong in this crate (a refusal the core decided is not an error: it is answered
/// as the provider would, see [`crate::Refusal`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The core config is not valid (the field named).
    Config(ConfigError),
    /// An estimator option is out of its range (the option named).
    Estimator(OptionsError),
    /// An upstream timeout out of its range (`first_byte_ms` or `idle_ms`: 1 ms to the
    /// core's `MAX_DURATION_MS`).
    Timeouts {
        /// The field.
        field: &'static str,
    },
    /// [`Builder::build`] was called outside a tokio runtime: the clock task needs one.
    NoRuntime,
    /// The core refused an input this host made (a bug to report, or a pool the config does
    /// not have).
    Core(LeaseError),
    /// The agent's long-wait hook declined to wait ([`crate::Agent::on_long_wait`]): the
    /// call was withdrawn, its ticket cancelled.
    Withdrawn {
        /// The hook's message.
        message: String,
    },
    /// The provider sent nothing within an upstream timeout; the request was aborted and
    /// the lease ended as an interrupted call (`upstream_timeout`).
    UpstreamTimeout {
        /// Which timeout.
        timeout: Timeout,
        /// Its length, ms.
        ms: u64,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(e) => write!(f, "tokenwarden: the core config is not valid: {e}"),
            Error::Estimator(e) => write!(f, "tokenwarden: estimator option {e}"),
            Error::Timeouts { field } => write!(
                f,
                "tokenwarden: timeouts.{field} must be from 1 ms to {} ms",
                tokenwarden_core::MAX_DURATION_MS
            ),
            Error::NoRuntime => f.write_str(
                "tokenwarden: Builder::build() must run inside a tokio runtime (it starts the clock task)",
            ),
            Error::Core(e) => write!(f, "tokenwarden: the core refused the host's input: {e}"),
            Error::Withdrawn { message } => write!(
                f,
                "tokenwarden: the call was withdrawn before a long wait: {message}"
            ),
            Error::UpstreamTimeout { timeout, ms } => {
                let what = match timeout {
                    Timeout::FirstByte => "no response headers",
                    Timeout::Idle => "no more of the body",
                };
                write!(
                    f,
                    "tokenwarden: upstream_timeout: the provider sent {what} in {ms} ms; the request was aborted"
                )
            }
        }
    }
}

impl std::error::Error for Error {}

/// A function told every event the core raises, at the instant it was raised, while the
/// coordinator is held (see [`Builder::on_event`]).
pub type EventHook = Arc<dyn Fn(&Coordinator, &Event, Millis) + std::marker::Send + Sync>;

/// A function told every input this host applied with the core's output, at the instant
/// it was applied, while the coordinator is held (see [`Builder::on_output`]).
pub type OutputHook = Arc<dyn Fn(&Coordinator, &Input, &Output, Millis) + std::marker::Send + Sync>;

/// Where the coordinator starts from.
#[derive(Clone, Debug)]
enum Start {
    /// A new coordinator for a config.
    Config(Box<Config>),
    /// A coordinator as it was (restored from a snapshot).
    Restored(Box<Coordinator>),
}

/// How a [`Tokenwarden`] is made: the core config, and what the host adds to it.
#[derive(Clone)]
pub struct Builder {
    start: Start,
    seed: Option<u64>,
    estimator: Options,
    timeouts: Timeouts,
    origin: Millis,
    on_event: Option<EventHook>,
    on_output: Option<OutputHook>,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("start", &self.start)
            .field("seed", &self.seed)
            .field("estimator", &self.estimator)
            .field("timeouts", &self.timeouts)
            .field("origin", &self.origin)
            .field("on_event", &self.on_event.is_some())
            .field("on_output", &self.on_output.is_some())
            .finish()
    }
}

impl Builder {
    /// A coordinator for `config` (its pools, limits and policy).
    #[must_use]
    pub fn new(config: Config) -> Builder {
        Builder::starting(Start::Config(Box::new(config)))
    }

    /// A builder with the defaults, the coordinator to start from `start`.
    fn starting(start: Start) -> Builder {
        Builder {
            start,
            seed: None,
            estimator: Options::default(),
            timeouts: Timeouts::default(),
            origin: Millis(0),
            on_event: None,
            on_output: None,
        }
    }

    /// A coordinator as it was: restored from a snapshot ([`Coordinator::restore`]), its
    /// instants on the same clock as this host's ([`Builder::clock_origin`]).
    #[must_use]
    pub fn restored(coordinator: Coordinator) -> Builder {
        Builder::starting(Start::Restored(Box::new(coordinator)))
    }

    /// Tells `hook` every input the calls of this host apply (leases asked, answers
    /// reported, renewals, settles) with the core's output, while the coordinator is held:
    /// a host that keeps a record of calls (a timeline of grants, refusals and 429s) sees
    /// them in order. Inputs applied through [`Tokenwarden::with_coordinator`] are the
    /// caller's to record. The hook must not call this [`Tokenwarden`].
    #[must_use]
    pub fn on_output(mut self, hook: OutputHook) -> Builder {
        self.on_output = Some(hook);
        self
    }

    /// The core's time when the coordinator is built (default 0: ms since it was built). A
    /// host that keeps state across restarts starts it at the Unix time, so the instants
    /// in a snapshot mean the same after a restart.
    #[must_use]
    pub fn clock_origin(mut self, origin: Millis) -> Builder {
        self.origin = origin;
        self
    }

    /// Tells `hook` every event the core raises (a grant from the line, a revised promise,
    /// an expiry, …), in order, while the coordinator is held: a host that keeps a table
    /// beside the core (its members' leases) keeps it in the core's order. The hook must
    /// not call this [`Tokenwarden`] (it would wait on itself).
    #[must_use]
    pub fn on_event(mut self, hook: EventHook) -> Builder {
        self.on_event = Some(hook);
        self
    }

    /// The core's seed (default: from the wall clock). The same seed and inputs at the same
    /// times give the same decisions.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Builder {
        self.seed = Some(seed);
        self
    }

    /// The estimator's options (default: the provider crate's, with the tokenizers).
    #[must_use]
    pub fn estimator(mut self, options: Options) -> Builder {
        self.estimator = options;
        self
    }

    /// The upstream timeouts of every send (default: the core's, 10 minutes to the first
    /// byte, 5 minutes between two pieces of the body).
    #[must_use]
    pub fn timeouts(mut self, timeouts: Timeouts) -> Builder {
        self.timeouts = timeouts;
        self
    }

    /// The coordinator, its clock task started on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::Config`], [`Error::Estimator`] naming what is wrong; [`Error::NoRuntime`]
    /// outside a runtime.
    pub fn build(self) -> Result<Tokenwarden, Error> {
        if let Err(field) = self.timeouts.check() {
            return Err(Error::Timeouts { field });
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let estimator = Estimator::new(self.estimator).map_err(Error::Estimator)?;
        let seed = self.seed.unwrap_or_else(|| {
            let t = wall_clock().unwrap_or_default();
            t.as_secs() ^ u64::from(t.subsec_nanos()).rotate_left(32)
        });
        let coord = match self.start {
            Start::Config(config) => {
                Coordinator::new(*config, seed, self.origin).map_err(Error::Config)?
            }
            Start::Restored(coord) => *coord,
        };
        let (events, _) = broadcast::channel(1024);
        let (manual, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                coord,
                waiters: BTreeMap::new(),
            }),
            estimator: Mutex::new(estimator),
            wake: Notify::new(),
            armed: AtomicU64::new(u64::MAX),
            closed: AtomicBool::new(false),
            epoch: Instant::now(),
            origin: self.origin,
            manual,
            events,
            on_event: self.on_event,
            on_output: self.on_output,
            timeouts: self.timeouts,
        });
        let clock = runtime.spawn(clock(Arc::clone(&shared)));
        Ok(Tokenwarden {
            inner: Arc::new(Inner { shared, clock }),
        })
    }
}

/// One coordinator for a key the agents of this process share. Cheap to clone: every clone
/// is the same coordinator. Its clock task stops when the last clone is dropped.
#[derive(Clone)]
pub struct Tokenwarden {
    inner: Arc<Inner>,
}

impl fmt::Debug for Tokenwarden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenwarden")
            .field("now_ms", &self.now().0)
            .finish_non_exhaustive()
    }
}

struct Inner {
    shared: Arc<Shared>,
    clock: JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.clock.abort();
    }
}

impl Tokenwarden {
    /// [`Builder::new`] with a config given as the core's JSON, then built.
    ///
    /// # Errors
    ///
    /// The config is not valid ([`Error::Config`], the field named), or no runtime.
    pub fn from_config_json(json: &str) -> Result<Tokenwarden, Error> {
        Builder::new(Config::from_json(json).map_err(Error::Config)?).build()
    }

    /// The core's protocol: one input at this instant, its output. Every event it raises is
    /// handled (a grant reaches the call that waits on it) and sent to [`Tokenwarden::events`].
    ///
    /// # Errors
    ///
    /// The core's refusal of the input (unknown lease, pool or task, a field too large, …);
    /// the state is unchanged then.
    pub fn handle(&self, input: &Input) -> Result<Output, LeaseError> {
        self.inner.shared.handle(input)
    }

    /// Every event the core raises from now on (grants, revised promises, pauses, margin
    /// changes, expired leases). A receiver that falls more than 1,024 events behind loses
    /// the oldest (`RecvError::Lagged`).
    #[must_use]
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.inner.shared.events.subscribe()
    }

    /// The core's clock: ms since this coordinator was built.
    #[must_use]
    pub fn now(&self) -> Millis {
        self.inner.shared.now()
    }

    /// Reads the coordinator (its metrics, a snapshot, a pool's id) at this instant.
    pub fn inspect<R>(&self, f: impl FnOnce(&Coordinator, Millis) -> R) -> R {
        let shared = &self.inner.shared;
        let now = shared.now();
        f(&shared.lock().coord, now)
    }

    /// The coordinator itself, held for `f` at this instant: a host that checks an input
    /// against a table of its own and keeps the table from the output, in one step. The
    /// events `f`'s inputs raise are handled after it returns (grants reach their calls,
    /// [`Builder::on_event`]'s hook is told).
    pub fn with_coordinator<R>(&self, f: impl FnOnce(&mut Coordinator, Millis) -> R) -> R {
        let shared = &self.inner.shared;
        let mut st = shared.lock();
        let now = shared.now();
        let r = f(&mut st.coord, now);
        shared.drain(&mut st);
        r
    }

    /// Stops the core's clock (the first time) and moves it `ms` forward by hand; from
    /// then on it moves only so. For tests of waits: what happens at an instant, not
    /// within a wall-time bound. The deadlines passed fire (the core told the time; calls
    /// waiting for an instant ask again). Answers the new time.
    pub fn advance(&self, ms: u64) -> Millis {
        let shared = &self.inner.shared;
        let now = shared.now().plus(ms);
        shared.manual.send_replace(Some(now));
        let _ = shared.handle(&Input::Timeout {});
        now
    }

    /// Closes the coordinator: another takes its place (its quota moved to another process,
    /// or to a share of it). Every lease and ticket ends (the core's `restarted` with none
    /// kept: a granted lease charged as a call cut short, a ticket withdrawn), and every call
    /// waiting in line or asking again is answered as a limiter restarting (503, a retry
    /// helps) instead of being granted here. Inputs given directly after it are still the
    /// core's to answer.
    pub fn close(&self) {
        let shared = &self.inner.shared;
        shared.closed.store(true, Ordering::SeqCst);
        let mut st = shared.lock();
        st.waiters.clear();
        let _ = shared.handle_in(&mut st, &Input::Restarted { keep: Vec::new() });
    }

    /// Whether [`Tokenwarden::close`] was called.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.inner.shared.closed.load(Ordering::SeqCst)
    }

    /// Whether the clock is moved by hand ([`Tokenwarden::advance`]).
    #[must_use]
    pub fn manual_clock(&self) -> bool {
        self.inner.shared.manual.borrow().is_some()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }
}

pub(crate) struct Shared {
    state: Mutex<State>,
    pub(crate) estimator: Mutex<Estimator>,
    wake: Notify,
    /// The core's deadline the clock task sleeps until (`u64::MAX`: none), written and read
    /// under the state's lock: an input wakes the clock task only when it brings the next
    /// deadline earlier, not on every call (each wake is a switch to another thread).
    armed: AtomicU64,
    /// Closed ([`Tokenwarden::close`]): a call asks no more.
    pub(crate) closed: AtomicBool,
    epoch: Instant,
    /// The core's time at `epoch`.
    origin: Millis,
    /// The time set by hand, once a test moves it ([`Tokenwarden::advance`]).
    manual: watch::Sender<Option<Millis>>,
    events: broadcast::Sender<Event>,
    on_event: Option<EventHook>,
    on_output: Option<OutputHook>,
    pub(crate) timeouts: Timeouts,
}

pub(crate) struct State {
    pub(crate) coord: Coordinator,
    /// Queued tickets, to the call that waits for its grant.
    waiters: BTreeMap<LeaseId, oneshot::Sender<Millis>>,
}

impl Shared {
    pub(crate) fn now(&self) -> Millis {
        if let Some(t) = *self.manual.borrow() {
            return t;
        }
        let ms = self.epoch.elapsed().as_millis();
        self.origin.plus(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    pub(crate) fn instant(&self, at: Millis) -> Instant {
        self.epoch + Duration::from_millis(at.since(self.origin).min(1 << 40))
    }

    /// Until the core's clock reads `at`: on the runtime's timer, or, while a test moves
    /// the clock by hand, until it moves past `at`.
    pub(crate) async fn sleep_until(&self, at: Millis) {
        let mut moved = self.manual.subscribe();
        loop {
            if self.now() >= at {
                return;
            }
            if moved.borrow_and_update().is_some() {
                if moved.changed().await.is_err() {
                    return;
                }
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep_until(self.instant(at)) => return,
                r = moved.changed() => if r.is_err() { return },
            }
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn estimator(&self) -> MutexGuard<'_, Estimator> {
        self.estimator
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn handle(&self, input: &Input) -> Result<Output, LeaseError> {
        let mut st = self.lock();
        self.handle_in(&mut st, input)
    }

    /// One input under the held lock; events handled, the clock task told.
    pub(crate) fn handle_in(&self, st: &mut State, input: &Input) -> Result<Output, LeaseError> {
        let now = self.now();
        let out = st.coord.handle(now, input);
        if let (Some(hook), Ok(o)) = (&self.on_output, &out) {
            hook(&st.coord, input, o, now);
        }
        self.drain(st);
        out
    }

    /// A ticket's waiter: its grant's expiry comes on the receiver (dropped unanswered: the
    /// ticket was withdrawn).
    pub(crate) fn wait_for(&self, st: &mut State, ticket: LeaseId) -> oneshot::Receiver<Millis> {
        let (tx, rx) = oneshot::channel();
        st.waiters.insert(ticket, tx);
        // A grant raised by the same input is in the queue still: hand it over now.
        self.drain(st);
        rx
    }

    /// The caller of a ticket left: the ticket is withdrawn, or its lease (granted, never
    /// used) given back.
    pub(crate) fn leave(&self, ticket: LeaseId) {
        let mut st = self.lock();
        st.waiters.remove(&ticket);
        let _ = self.handle_in(&mut st, &Input::Cancel { lease: ticket });
    }

    fn drain(&self, st: &mut State) {
        while let Some(event) = st.coord.poll_event() {
            if let Event::Granted {
                lease, expires_at, ..
            } = event
            {
                if let Some(tx) = st.waiters.remove(&lease) {
                    if tx.send(expires_at).is_err() {
                        // Its caller left as it was granted: give the lease back unused.
                        let _ = st.coord.handle(self.now(), &Input::Cancel { lease });
                    }
                }
            }
            if let Some(hook) = &self.on_event {
                hook(&st.coord, &event, self.now());
            }
            let _ = self.events.send(event);
        }
        let next = st.coord.poll_timeout().map_or(u64::MAX, |t| t.0);
        if next < self.armed.load(Ordering::Relaxed) {
            self.armed.store(next, Ordering::Relaxed);
            self.wake.notify_one();
        }
    }
}

/// The clock task: wakes at the core's next deadline (or when an input brought it earlier),
/// tells the core the time, and hands out what it granted. A deadline that moved later
/// wakes it early, once: it reads the new one and sleeps again.
async fn clock(shared: Arc<Shared>) {
    loop {
        let next = {
            let st = shared.lock();
            let next = st.coord.poll_timeout();
            shared
                .armed
                .store(next.map_or(u64::MAX, |t| t.0), Ordering::Relaxed);
            next
        };
        let woken = shared.wake.notified();
        match next {
            Some(at) => {
                tokio::select! {
                    () = shared.sleep_until(at) => {
                        let _ = shared.handle(&Input::Timeout {});
                    }
                    () = woken => {}
                }
            }
            None => woken.await,
        }
    }
}

/// A tokenizer's ranks, parsed once for the process.
pub(crate) fn tokenizer(encoding: Encoding) -> Option<Arc<Bpe>> {
    static O200K: OnceLock<Option<Arc<Bpe>>> = OnceLock::new();
    static CL100K: OnceLock<Option<Arc<Bpe>>> = OnceLock::new();
    let (cell, ranks) = match encoding {
        Encoding::O200kBase => (&O200K, bpe::O200K_BASE),
        Encoding::Cl100kBase => (&CL100K, bpe::CL100K_BASE),
    };
    cell.get_or_init(|| Bpe::new(encoding, ranks).ok().map(Arc::new))
        .clone()
}

/// The estimator ready for `provider`'s `model` (its tokenizer parsed outside the lock).
pub(crate) fn ready_estimator<'a>(
    shared: &'a Shared,
    provider: Provider,
    model: &str,
) -> MutexGuard<'a, Estimator> {
    let est = shared.estimator();
    let Some(need) = est.needs_tokenizer(provider, model) else {
        return est;
    };
    drop(est);
    // Without the ranks (never, for the embedded ones) the estimate goes by the byte rule.
    let bpe = tokenizer(need);
    let mut est = shared.estimator();
    if let Some(bpe) = bpe {
        est.use_tokenizer(bpe);
    }
    est
}

/// The wall clock, Unix ms (for headers that carry dates).
pub(crate) fn unix_now_ms() -> Option<u64> {
    u64::try_from(wall_clock()?.as_millis()).ok()
}

/// Since the Unix epoch, by the machine's clock: a host's to read, never the core's.
#[expect(
    clippy::disallowed_methods,
    reason = "the host owns the wall clock; the core is told it"
)]
fn wall_clock() -> Option<Duration> {
    SystemTime::now().duration_since(UNIX_EPOCH).ok()
}
