//! The reference host loop: what every shipped host does (the fetch wrapper, the edge
//! limiter, `serve`), on a simulated clock, through the host protocol only. The core's
//! simulation, starvation and fairness tests and the fleet simulator (`tokenwarden-examples`) drive
//! their scenarios through it, so the guarantees they check and the figures they report
//! are the loop's that ships, not a re-ask loop of their own.
//!
//! A call is asked with `call_lease`; the core's output is obeyed: `send` (the [`World`]
//! answers after the call's duration, and the answer goes back with `call_response`), `wait`
//! with a ticket (sent when its `granted` event comes), `wait` without one (asked again at
//! `until`), `give_up`; a success is settled with the usage the world reports. Time moves
//! to the earlier of the next job and `poll_timeout`, where `timeout` is handled; events
//! are drained after every input.
//!
//! What real clients also do, when the world says so: leave a queued ticket (`cancel`, as
//! the fetch wrapper does when its caller aborts), give back a granted lease unused
//! (`cancel`), or die after sending (no answer: the lease is reaped at its expiry). And a
//! host may be restored from a snapshot: from [`Host::twin_at`] on, a twin restored from
//! the snapshot of that instant is fed every input too, and [`Host::twin_diverged`] says
//! where its outputs, events or wake-ups first differ.
//!
//! From the send to the lease's end, each call is the core's [`Exchange`], as in every
//! shipped host: the lease renewed while the provider works on a long answer, the
//! first-byte timeout (a call that takes longer fails, [`Ended::TimedOut`], its lease ended
//! as interrupted), a success settled when its body ends (at once for a JSON answer, at
//! [`Reply::settle_after_ms`] for a stream). The simulated body carries no pieces, so nothing
//! is seen of a call cut short and no idle timeout runs.
//!
//! The world may also re-estimate a call at each ask ([`World::request`]), tell the core
//! what the host would besides calls (a task opened or ended: [`World::outbox`]), answer
//! with the provider's state as of the answer ([`World::answered`]), settle late
//! ([`Reply::settle_after_ms`]), and act on its own clock ([`World::tick`]).

use std::collections::{BTreeMap, BTreeSet};

use tokenwarden_core::{
    Action, Answer, Call, Coordinator, Event, Exchange, Input, LeaseError, LeaseId, LeaseRequest,
    Millis, Output, Settlement, Timeouts, Usage, Wait,
};

/// What a call asks for and what the provider will make of it.
#[derive(Clone, Debug, Default)]
pub struct CallSpec {
    /// The lease request of every ask of this call (unless [`World::request`] says
    /// otherwise).
    pub request: LeaseRequest,
    /// The world's own mark for the call (the simulator: the agent that makes it).
    pub tag: u64,
}

/// The provider's answer to one send.
#[derive(Clone, Debug)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// Response headers.
    pub headers: Vec<(String, String)>,
    /// How long the call takes, ms.
    pub duration_ms: u64,
    /// The usage a success reports.
    pub usage: Usage,
    /// How long after the answer the host settles a success, ms (0: at once, as the
    /// `fetch` wrapper does for a JSON answer; later for a stream's final usage report).
    pub settle_after_ms: u64,
}

/// What became of a send.
#[derive(Clone, Debug)]
pub enum Sent {
    /// The provider answers after the reply's duration.
    Reply(Reply),
    /// The client dies after sending: no answer reaches the host; the provider is done
    /// with the call after `duration_ms` (the world hears of it then) and the lease is
    /// reaped at its expiry.
    Crash {
        /// When the provider is done with the call, ms after the send.
        duration_ms: u64,
    },
    /// The client changes its mind and gives the lease back unused (`cancel`).
    Unused,
}

/// How a call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Delivered to the agent (a success, settled from its usage, or a status the core
    /// settled and said to hand over).
    Delivered,
    /// The core said to give up.
    GaveUp,
    /// The client left: a ticket withdrawn or a lease given back (`cancel`).
    Cancelled,
    /// The client died after sending.
    Crashed,
    /// The provider sent no answer within the first-byte timeout: the request was aborted
    /// and the lease ended as interrupted.
    TimedOut,
}

/// The world around the coordinator: the provider, and the agents that start calls.
pub trait World {
    /// The request of call `id`'s ask at `now` (`first`: the call's first ask): by default
    /// the call's own. `None`: the call is not made after all (the host forgets it;
    /// [`World::ended`] is not called for it).
    fn request(
        &mut self,
        _now: u64,
        _id: u64,
        call: &CallSpec,
        _first: bool,
    ) -> Option<LeaseRequest> {
        Some(call.request)
    }
    /// What becomes of `call`, sent at `now` under `lease`.
    fn send(&mut self, now: u64, id: u64, call: &CallSpec, lease: LeaseId) -> Sent;
    /// The provider is done with call `id` (answered or not): at the reply's time, before
    /// the host hears the answer (`reply`, which the world may still change: the
    /// provider's headers as of now, say), and at a crashed call's `duration_ms` (`None`).
    fn answered(&mut self, _now: u64, _id: u64, _lease: LeaseId, _reply: Option<&mut Reply>) {}
    /// The host settled call `id`'s lease from the usage the provider reported.
    fn settled(&mut self, _now: u64, _id: u64, _lease: LeaseId, _s: &Settlement) {}
    /// Call `id` was told to wait in line under `ticket`: when its client leaves, if the
    /// ticket is not granted by then (`None`: it waits).
    fn leave_at(&mut self, _now: u64, _id: u64, _ticket: LeaseId) -> Option<u64> {
        None
    }
    /// The call `id` ended at `now`: the calls to start next, at their times.
    fn ended(&mut self, now: u64, id: u64, call: &CallSpec, how: Ended) -> Vec<(u64, CallSpec)>;
    /// Every output the core gave for call `id` (for a test's observations).
    fn output(&mut self, _now: u64, _id: u64, _call: &CallSpec, _out: &Output) {}
    /// Every event the core raised.
    fn event(&mut self, _now: u64, _event: &Event) {}
    /// What the world has to tell the core, and the calls it starts, since the host last
    /// asked: inputs a host sends besides its calls (a task opened, failed or ended), handled
    /// in order, and calls to start at their times. Asked after every callback, and before
    /// each ask's `call_lease`.
    fn outbox(&mut self) -> (Vec<Input>, Vec<(u64, CallSpec)>) {
        (Vec::new(), Vec::new())
    }
    /// When the world next acts on its own (a clock it samples, traffic the host does not
    /// see): [`World::tick`] is called then.
    fn next_tick(&self) -> Option<u64> {
        None
    }
    /// The world's own step at `now`, seeing the coordinator (for its metrics).
    fn tick(&mut self, _now: u64, _coord: &Coordinator) {}
    /// Whether the test has seen what it waits for: the loop stops after this step.
    fn done(&self) -> bool {
        false
    }
}

enum Job {
    /// Ask (again) for capacity for call `id`.
    Ask(u64),
    /// The provider answers call `id`, sent under `lease` (`None`: it crashed).
    Answer(u64, LeaseId, Option<Reply>),
    /// Call `id`'s client leaves its place in line under `ticket`.
    Leave(u64, LeaseId),
    /// A success of call `id`, answered earlier, is settled with the usage it reported.
    Settle(u64, Usage),
}

/// One thing the coordinator said, to compare a host with its restored twin.
#[derive(Clone, Debug, PartialEq)]
pub enum Said {
    /// The answer to an input.
    Output(Box<Result<Output, LeaseError>>),
    /// The events drained after it.
    Events(Vec<Event>),
    /// `poll_timeout` when the loop looked.
    Wake(Option<Millis>),
}

struct Twin {
    coord: Coordinator,
    at: u64,
    main: Vec<Said>,
    twin: Vec<Said>,
}

struct Running {
    spec: CallSpec,
    state: Call,
    /// Whether the call has been asked for yet.
    asked: bool,
}

/// A send in flight: its lease, the lease's expiry as last known, and the core's machine.
struct Sending {
    lease: LeaseId,
    expires_at: Millis,
    exchange: Exchange,
}

/// The loop and its state.
pub struct Host {
    /// The coordinator, for a test's own inspection.
    pub coord: Coordinator,
    /// The simulated clock, ms.
    pub now: u64,
    jobs: BTreeMap<(u64, u64), Job>,
    seq: u64,
    calls: BTreeMap<u64, Running>,
    next_id: u64,
    /// Queued tickets, to the call they belong to.
    tickets: BTreeMap<LeaseId, u64>,
    /// The sends in flight, by call (kept past the call's end until the lease's end is done).
    sending: BTreeMap<u64, Sending>,
    /// Their deadlines: (when, call).
    deadlines: BTreeSet<(u64, u64)>,
    /// The upstream timeouts of every send (the shipped default unless set).
    timeouts: Timeouts,
    /// When to restore a twin, and the twin once restored.
    twin_at: Option<u64>,
    twin: Option<Twin>,
    /// The wall clock (Unix ms) at simulated time 0, for headers that carry dates.
    wall_epoch: Option<u64>,
}

impl Host {
    /// A host over `coord`, with `first` calls to start at their times.
    pub fn new(coord: Coordinator, first: Vec<(u64, CallSpec)>) -> Host {
        let mut h = Host {
            now: coord.now().0,
            coord,
            jobs: BTreeMap::new(),
            seq: 0,
            calls: BTreeMap::new(),
            next_id: 0,
            tickets: BTreeMap::new(),
            sending: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            timeouts: Timeouts::default(),
            twin_at: None,
            twin: None,
            wall_epoch: None,
        };
        for (at, spec) in first {
            h.start(at, spec);
        }
        h
    }

    fn at(&mut self, t: u64, job: Job) {
        self.seq += 1;
        self.jobs.insert((t, self.seq), job);
    }

    fn start(&mut self, at: u64, spec: CallSpec) {
        self.next_id += 1;
        let id = self.next_id;
        self.calls.insert(
            id,
            Running {
                spec,
                state: Call::new(),
                asked: false,
            },
        );
        self.at(at, Job::Ask(id));
    }

    /// With these upstream timeouts for every send instead of the shipped default.
    #[must_use]
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Host {
        self.timeouts = timeouts;
        self
    }

    /// With a wall clock: simulated time 0 is `epoch_unix_ms`, told with every response
    /// (`unix_now_ms`) as a host tells its own clock, for headers that carry dates.
    #[must_use]
    pub fn with_wall_clock(mut self, epoch_unix_ms: u64) -> Host {
        self.wall_epoch = Some(epoch_unix_ms);
        self
    }

    /// From the first step at or after `at` ms, a twin restored from the host's snapshot
    /// is fed every input too.
    pub fn twin_at(&mut self, at: u64) {
        self.twin_at = Some(at);
    }

    /// Where the twin first said something else than the host (`None`: it never did, and
    /// ends in an equal state). Panics if no twin was restored.
    pub fn twin_diverged(&self) -> Option<String> {
        let t = self.twin.as_ref().expect("a twin was restored");
        if let Err(e) = t.coord.check() {
            return Some(format!("twin check(): {e}"));
        }
        let (m, w) = (&t.main, &t.twin);
        if let Some(i) = (0..m.len().max(w.len())).find(|&i| m.get(i) != w.get(i)) {
            return Some(format!(
                "twin restored at {} ms diverged at output {i}: {:?} vs {:?}",
                t.at,
                m.get(i),
                w.get(i)
            ));
        }
        (t.coord != self.coord).then(|| "the twin's final state differs".to_string())
    }

    /// Applies `f` to the coordinator, and to the twin when there is one, noting both.
    fn both<T>(&mut self, f: impl Fn(&mut Coordinator) -> T, said: impl Fn(&T) -> Said) -> T {
        let r = f(&mut self.coord);
        if let Some(t) = self.twin.as_mut() {
            let w = f(&mut t.coord);
            t.main.push(said(&r));
            t.twin.push(said(&w));
        }
        r
    }

    fn try_handle(&mut self, input: &Input) -> Result<Output, LeaseError> {
        let now = Millis(self.now);
        self.both(
            |c| c.handle(now, input),
            |r| Said::Output(Box::new(r.clone())),
        )
    }

    fn handle(&mut self, input: &Input) -> Output {
        self.try_handle(input)
            .unwrap_or_else(|e| panic!("at {} ms, {input:?}: {e}", self.now))
    }

    /// Sends the core what the world has to tell it, and starts the calls it started.
    fn flush(&mut self, world: &mut impl World) {
        let (inputs, calls) = world.outbox();
        for input in &inputs {
            let _ = self.handle(input);
        }
        for (at, spec) in calls {
            self.start(at.max(self.now), spec);
        }
    }

    /// Tells call `id`'s exchange of an event (`f`), then does what it says: renews,
    /// settles or ends the lease as interrupted (a lease the core no longer knows is an
    /// outcome the host lives with, told back as such), fails the call on a timeout; and
    /// keeps its deadline indexed. An exchange whose end is done is dropped.
    fn exchange(&mut self, world: &mut impl World, id: u64, f: impl FnOnce(&mut Exchange, Millis)) {
        let Some(mut s) = self.sending.remove(&id) else {
            return;
        };
        if let Some(t) = s.exchange.poll_timeout() {
            self.deadlines.remove(&(t.0, id));
        }
        let now = Millis(self.now);
        f(&mut s.exchange, now);
        let lease = s.lease;
        while let Some(action) = s.exchange.poll_action() {
            match action {
                Action::Renew => match self.try_handle(&Input::Renew { lease }) {
                    Ok(Output::Renewed { expires_at }) => {
                        s.expires_at = expires_at;
                        s.exchange.renewed(now, expires_at.since(now));
                    }
                    Err(LeaseError::UnknownLease) => s.exchange.renew_refused(true),
                    other => panic!("at {} ms, renew of {lease}: {other:?}", self.now),
                },
                Action::Settle { usage, .. } => {
                    match self.try_handle(&Input::Settle { lease, usage }) {
                        Ok(Output::Settled { settlement }) => {
                            world.settled(self.now, id, lease, &settlement);
                        }
                        Err(LeaseError::UnknownLease) => s.exchange.settle_refused(true),
                        other => panic!("at {} ms, settle of {lease}: {other:?}", self.now),
                    }
                }
                // Nothing of a simulated body is seen: the whole reservation.
                Action::Interrupted { .. } => {
                    match self.try_handle(&Input::CallInterrupted { lease, seen: None }) {
                        Ok(Output::Settled { .. }) => {}
                        Err(LeaseError::UnknownLease) => s.exchange.interrupted_refused(true),
                        other => panic!("at {} ms, interrupted {lease}: {other:?}", self.now),
                    }
                }
                // Handed over: the call's step (`deliver`) ends it.
                Action::Deliver => {}
                Action::TimedOut { .. } => self.end(world, id, Ended::TimedOut),
            }
        }
        if s.exchange.is_ended() {
            return;
        }
        if let Some(t) = s.exchange.poll_timeout() {
            self.deadlines.insert((t.0, id));
        }
        self.sending.insert(id, s);
    }

    fn poll_timeout(&mut self) -> Option<Millis> {
        self.both(|c| c.poll_timeout(), |t| Said::Wake(*t))
    }

    fn send(&mut self, world: &mut impl World, id: u64, lease: LeaseId, expires_at: Millis) {
        let spec = self.calls[&id].spec.clone();
        match world.send(self.now, id, &spec, lease) {
            Sent::Reply(reply) => {
                let now = Millis(self.now);
                let exchange = Exchange::sent(now, expires_at.since(now), self.timeouts);
                if let Some(t) = exchange.poll_timeout() {
                    self.deadlines.insert((t.0, id));
                }
                self.sending.insert(
                    id,
                    Sending {
                        lease,
                        expires_at,
                        exchange,
                    },
                );
                self.at(
                    self.now + reply.duration_ms,
                    Job::Answer(id, lease, Some(reply)),
                );
            }
            Sent::Crash { duration_ms } => {
                self.at(self.now + duration_ms, Job::Answer(id, lease, None));
                // The client is gone: nobody settles, the core reaps the lease.
                self.end(world, id, Ended::Crashed);
            }
            Sent::Unused => {
                let out = self.handle(&Input::Cancel { lease });
                assert_eq!(out, Output::Cancelled);
                self.end(world, id, Ended::Cancelled);
            }
        }
    }

    fn end(&mut self, world: &mut impl World, id: u64, how: Ended) {
        let Some(r) = self.calls.remove(&id) else {
            return;
        };
        for (at, spec) in world.ended(self.now, id, &r.spec, how) {
            self.start(at.max(self.now), spec);
        }
    }

    /// Obeys an output for call `id`.
    fn obey(&mut self, world: &mut impl World, id: u64, out: Output) {
        if let Some(r) = self.calls.get(&id) {
            world.output(self.now, id, &r.spec, &out);
        }
        match out {
            Output::Send {
                call,
                lease,
                expires_at,
                ..
            } => {
                self.set_state(id, call);
                self.send(world, id, lease, expires_at);
            }
            Output::Wait { call, wait, .. } => {
                self.set_state(id, call);
                match wait {
                    Wait {
                        ticket: Some(t), ..
                    } => {
                        self.tickets.insert(t, id);
                        if let Some(at) = world.leave_at(self.now, id, t) {
                            self.at(at.max(self.now), Job::Leave(id, t));
                        }
                    }
                    Wait { until, .. } => self.at(until.0.max(self.now + 1), Job::Ask(id)),
                }
            }
            Output::GiveUp { .. } => self.end(world, id, Ended::GaveUp),
            Output::Deliver { .. } => self.end(world, id, Ended::Delivered),
            other => panic!("not a call step: {other:?}"),
        }
    }

    fn set_state(&mut self, id: u64, call: Call) {
        if let Some(r) = self.calls.get_mut(&id) {
            r.state = call;
        }
    }

    /// Drains the events and acts on them in order; events raised while acting (a send
    /// that cancels) come after the ones already drained, as with a host's event queue.
    fn drain(&mut self, world: &mut impl World) {
        let mut pending = std::collections::VecDeque::new();
        loop {
            let events = self.both(
                |c| std::iter::from_fn(|| c.poll_event()).collect::<Vec<_>>(),
                |e| Said::Events(e.clone()),
            );
            pending.extend(events);
            let Some(e) = pending.pop_front() else { break };
            world.event(self.now, &e);
            if let Event::Granted {
                lease, expires_at, ..
            } = e
            {
                if let Some(id) = self.tickets.remove(&lease) {
                    self.send(world, id, lease, expires_at);
                }
            }
        }
    }

    /// Runs until nothing is left to do, or the world is done, or past `until` ms.
    pub fn run(&mut self, world: &mut impl World, until: u64) {
        let mut last_wake = None;
        let mut spins = 0;
        loop {
            if self.twin.is_none() && self.twin_at.is_some_and(|t| self.now >= t) {
                let json = self.coord.snapshot_json();
                let coord = Coordinator::restore_json(&json)
                    .unwrap_or_else(|e| panic!("at {} ms, restore: {e}", self.now));
                self.twin = Some(Twin {
                    coord,
                    at: self.now,
                    main: Vec::new(),
                    twin: Vec::new(),
                });
            }
            let job = self.jobs.keys().next().map(|k| k.0);
            let wake = self.poll_timeout().map(|t| t.0);
            let tick = world.next_tick();
            let due = self.deadlines.first().copied();
            let Some(next) = [job, wake, tick, due.map(|d| d.0)]
                .into_iter()
                .flatten()
                .min()
            else {
                break;
            };
            if next > until {
                break;
            }
            assert!(
                wake.is_none_or(|w| w >= self.now),
                "poll_timeout {wake:?} before now ({} ms)",
                self.now
            );
            self.now = self.now.max(next);
            if tick == Some(next) {
                world.tick(self.now, &self.coord);
                self.flush(world);
            } else if let Some((_, id)) = due.filter(|d| d.0 == next) {
                self.exchange(world, id, Exchange::handle_timeout);
            } else if wake == Some(next) && job.is_none_or(|j| j > next) {
                // A wake-up that changes nothing, again and again, would hang a host.
                if last_wake == wake {
                    spins += 1;
                    assert!(spins <= 3, "poll_timeout stuck at {wake:?}");
                } else {
                    spins = 0;
                }
                last_wake = wake;
                let out = self.handle(&Input::Timeout {});
                assert_eq!(out, Output::TimedOut);
            } else if let Some((_, job)) = self.jobs.pop_first() {
                self.step(world, job);
                self.flush(world);
            }
            self.drain(world);
            self.flush(world);
            if world.done() {
                break;
            }
        }
    }

    fn step(&mut self, world: &mut impl World, job: Job) {
        match job {
            Job::Ask(id) => {
                let Some(r) = self.calls.get_mut(&id) else {
                    return;
                };
                let (spec, first) = (r.spec.clone(), !r.asked);
                r.asked = true;
                let Some(request) = world.request(self.now, id, &spec, first) else {
                    self.calls.remove(&id);
                    return;
                };
                // What the world told the core before the ask comes first (a task opened).
                self.flush(world);
                let Some(r) = self.calls.get(&id) else { return };
                let input = Input::CallLease {
                    call: r.state,
                    request,
                };
                let out = self.handle(&input);
                self.obey(world, id, out);
            }
            Job::Leave(id, ticket) => {
                // Still in line (not granted in the meantime): the client withdraws.
                if self.tickets.remove(&ticket).is_some() {
                    let out = self.handle(&Input::Cancel { lease: ticket });
                    assert_eq!(out, Output::Cancelled);
                    self.end(world, id, Ended::Cancelled);
                }
            }
            Job::Settle(id, usage) => {
                self.exchange(world, id, |x, now| x.end(now, Some(usage)));
            }
            Job::Answer(id, lease, mut reply) => {
                world.answered(self.now, id, lease, reply.as_mut());
                let Some(reply) = reply else { return };
                let Some(r) = self.calls.get(&id) else { return };
                let input = Input::CallResponse {
                    call: r.state,
                    pool: r.spec.request.pool,
                    lease: Some(lease),
                    status: reply.status,
                    headers: reply.headers.clone(),
                    unix_now_ms: self.wall_epoch.map(|e| e + self.now),
                    reported: false,
                };
                let out = self.handle(&input);
                // A success is settled from the usage the provider reported when its body
                // ends: at once for a JSON answer, later for a stream's final report.
                let answer = match &out {
                    Output::Deliver { settled: None, .. } if reply.settle_after_ms == 0 => {
                        Answer::Json
                    }
                    Output::Deliver { settled: None, .. } => Answer::Stream,
                    _ => Answer::Settled,
                };
                let left = self
                    .sending
                    .get(&id)
                    .map_or(0, |s| s.expires_at.since(Millis(self.now)));
                self.exchange(world, id, |x, now| x.answered(now, answer, left));
                match answer {
                    Answer::Json => {
                        self.exchange(world, id, |x, now| x.end(now, Some(reply.usage)))
                    }
                    Answer::Stream => {
                        let at = self.now + reply.settle_after_ms;
                        self.at(at, Job::Settle(id, reply.usage));
                    }
                    _ => {}
                }
                self.obey(world, id, out);
            }
        }
    }
}
