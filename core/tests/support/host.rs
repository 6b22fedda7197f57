//! The reference host loop: what every shipped host does (the fetch wrapper, the edge
//! limiter, `serve`), on a simulated clock, through the host protocol only. Tests drive
//! their scenarios through it, so the guarantees they check are the loop's that ships, not
//! a re-ask loop of their own.
//!
//! A call is asked with `call_lease`; the core's output is obeyed: `send` (the [`World`]
//! answers after the call's duration, and the answer goes back with `call_response`), `wait`
//! with a ticket (sent when its `granted` event comes), `wait` without one (asked again at
//! `until`), `give_up`; a success is settled with the usage the world reports. Time moves
//! to the earlier of the next job and `poll_timeout`, where `timeout` is handled; events
//! are drained after every input.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;

use tokenwarden_core::{
    Call, Coordinator, Event, Input, LeaseId, LeaseRequest, Millis, Output, Usage, Wait,
};

/// What a call asks for and what the provider will make of it.
#[derive(Clone, Debug)]
pub struct CallSpec {
    /// The lease request of every ask of this call.
    pub request: LeaseRequest,
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
}

/// How a call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Delivered to the agent (a success, settled from its usage, or a status the core
    /// settled and said to hand over).
    Delivered,
    /// The core said to give up.
    GaveUp,
}

/// The world around the coordinator: the provider, and the agents that start calls.
pub trait World {
    /// The provider's answer to `call`, sent at `now`.
    fn send(&mut self, now: u64, id: u64, call: &CallSpec) -> Reply;
    /// The call `id` ended at `now`: the calls to start next, at their times.
    fn ended(&mut self, now: u64, id: u64, call: &CallSpec, how: Ended) -> Vec<(u64, CallSpec)>;
    /// Every output the core gave for call `id` (for a test's observations).
    fn output(&mut self, _now: u64, _id: u64, _call: &CallSpec, _out: &Output) {}
    /// Every event the core raised.
    fn event(&mut self, _now: u64, _event: &Event) {}
    /// Whether the test has seen what it waits for: the loop stops after this step.
    fn done(&self) -> bool {
        false
    }
}

enum Job {
    /// Ask (again) for capacity for call `id`.
    Ask(u64),
    /// The provider answers call `id`, sent under `lease`.
    Answer(u64, LeaseId, Reply),
}

struct Running {
    spec: CallSpec,
    state: Call,
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
            },
        );
        self.at(at, Job::Ask(id));
    }

    fn handle(&mut self, input: &Input) -> Output {
        self.coord
            .handle(Millis(self.now), input)
            .unwrap_or_else(|e| panic!("at {} ms, {input:?}: {e}", self.now))
    }

    fn send(&mut self, world: &mut impl World, id: u64, lease: LeaseId) {
        let spec = self.calls[&id].spec.clone();
        let reply = world.send(self.now, id, &spec);
        self.at(self.now + reply.duration_ms, Job::Answer(id, lease, reply));
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
            Output::Send { call, lease, .. } => {
                self.set_state(id, call);
                self.send(world, id, lease);
            }
            Output::Wait { call, wait, .. } => {
                self.set_state(id, call);
                match wait {
                    Wait {
                        ticket: Some(t), ..
                    } => {
                        self.tickets.insert(t, id);
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

    fn drain(&mut self, world: &mut impl World) {
        while let Some(e) = self.coord.poll_event() {
            world.event(self.now, &e);
            if let Event::Granted { lease, .. } = e {
                if let Some(id) = self.tickets.remove(&lease) {
                    self.send(world, id, lease);
                }
            }
        }
    }

    /// Runs until nothing is left to do, or the world is done, or past `until` ms.
    pub fn run(&mut self, world: &mut impl World, until: u64) {
        loop {
            let job = self.jobs.keys().next().map(|k| k.0);
            let wake = self.coord.poll_timeout().map(|t| t.0);
            let next = match (job, wake) {
                (Some(j), Some(w)) => j.min(w),
                (Some(j), None) => j,
                (None, Some(w)) => w,
                (None, None) => break,
            };
            if next > until {
                break;
            }
            self.now = self.now.max(next);
            if wake == Some(next) && job.is_none_or(|j| j > next) {
                let out = self.handle(&Input::Timeout);
                assert_eq!(out, Output::TimedOut);
            } else if let Some((_, job)) = self.jobs.pop_first() {
                self.step(world, job);
            }
            self.drain(world);
            if world.done() {
                break;
            }
        }
    }

    fn step(&mut self, world: &mut impl World, job: Job) {
        match job {
            Job::Ask(id) => {
                let Some(r) = self.calls.get(&id) else { return };
                let input = Input::CallLease {
                    call: r.state,
                    request: r.spec.request,
                };
                let out = self.handle(&input);
                self.obey(world, id, out);
            }
            Job::Answer(id, lease, reply) => {
                let Some(r) = self.calls.get(&id) else { return };
                let input = Input::CallResponse {
                    call: r.state,
                    pool: r.spec.request.pool,
                    lease: Some(lease),
                    status: reply.status,
                    headers: reply.headers.clone(),
                    unix_now_ms: None,
                };
                let out = self.handle(&input);
                if let Output::Deliver { settled: None, .. } = &out {
                    // A success: the host settles it from the usage the provider reported.
                    let settled = self.handle(&Input::Settle {
                        lease,
                        usage: reply.usage,
                    });
                    assert!(matches!(settled, Output::Settled { .. }), "{settled:?}");
                }
                self.obey(world, id, out);
            }
        }
    }
}
