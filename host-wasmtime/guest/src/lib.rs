//! `tokenwarden-core` exported through the `tokenwarden:quota/coordinator` interface
//! (`../wit/v3`). Every function converts its arguments, calls the core once and converts
//! the result back: there is no logic here, so the component decides exactly as the
//! native crate does.
//!
//! Built for `wasm32-unknown-unknown` by `../build.rs` and wrapped into a component with
//! `wit-component`; the module imports nothing (no WASI), which the host's tests assert.

use std::cell::RefCell;

use tokenwarden_core as tw;

wit_bindgen::generate!({
    path: "../wit/v3",
    world: "plugin",
});

use exports::tokenwarden::quota::coordinator as w;

struct Component;

/// The resource's representation: a `Coordinator` behind a `RefCell` (resource methods
/// take `&self`; a component instance is single-threaded).
struct Coord(RefCell<tw::Coordinator>);

impl w::Guest for Component {
    type Coordinator = Coord;
}

fn lease_error(e: tw::LeaseError) -> w::LeaseError {
    match e {
        tw::LeaseError::UnknownPool => w::LeaseError::UnknownPool,
        tw::LeaseError::UnknownLease => w::LeaseError::UnknownLease,
        tw::LeaseError::NotGranted => w::LeaseError::NotGranted,
        tw::LeaseError::TooLarge { field } => w::LeaseError::TooLarge(field.into()),
        tw::LeaseError::UnknownTask => w::LeaseError::UnknownTask,
        tw::LeaseError::TooManyTasks => w::LeaseError::TooManyTasks,
        // The core may grow variants; the host maps an unknown code to an error too.
        _ => w::LeaseError::TooLarge(String::from("unknown")),
    }
}

fn axis(a: tw::Axis) -> w::Axis {
    match a {
        tw::Axis::InputTokens => w::Axis::InputTokens,
        tw::Axis::OutputTokens => w::Axis::OutputTokens,
        tw::Axis::Tokens => w::Axis::Tokens,
        tw::Axis::Requests => w::Axis::Requests,
    }
}

fn demand(d: tw::Demand) -> w::Demand {
    let [input_tokens, output_tokens, tokens, requests] = d.0;
    w::Demand {
        input_tokens,
        output_tokens,
        tokens,
        requests,
    }
}

fn decision(d: tw::Decision) -> w::Decision {
    match d {
        tw::Decision::Grant { lease, expires_at } => w::Decision::Grant(w::Grant {
            lease: lease.0,
            expires_at: expires_at.0,
        }),
        tw::Decision::Queued { lease, eta } => w::Decision::Queued(w::Queued {
            lease: lease.0,
            eta: eta.0,
        }),
        tw::Decision::Reject { retry_at, reason } => w::Decision::Reject(w::Reject {
            retry_at: retry_at.0,
            reason: reject_reason(reason),
        }),
        tw::Decision::NeverFits { reason } => w::Decision::NeverFits(reject_reason(reason)),
    }
}

fn lease_request(r: w::LeaseRequest) -> tw::LeaseRequest {
    tw::LeaseRequest {
        agent: tw::AgentId(r.agent),
        pool: tw::PoolId(r.pool),
        input_tokens: r.input_tokens,
        cached_prefix_tokens: r.cached_prefix_tokens,
        cached_prefix_confirmed: r.cached_prefix_confirmed,
        max_tokens: r.max_tokens,
        role: role(r.role),
        unblocks: r.unblocks,
        failure_signature: r.failure_signature,
        task: r.task.map(tw::TaskId),
        family: r.family.map(tw::AgentId),
    }
}

fn role(r: w::Role) -> tw::Role {
    match r {
        w::Role::Planner => tw::Role::Planner,
        w::Role::Reviewer => tw::Role::Reviewer,
        w::Role::Worker => tw::Role::Worker,
    }
}

fn reject_reason(reason: tw::RejectReason) -> w::RejectReason {
    match reason {
        tw::RejectReason::ExceedsCapacity { axis: a } => w::RejectReason::ExceedsCapacity(axis(a)),
        tw::RejectReason::WaitTooLong => w::RejectReason::WaitTooLong,
        tw::RejectReason::QueueFull => w::RejectReason::QueueFull,
        tw::RejectReason::TooManyLeases => w::RejectReason::TooManyLeases,
        tw::RejectReason::TooManyAgents => w::RejectReason::TooManyAgents,
    }
}

fn call_in(c: w::CallState) -> tw::Call {
    tw::Call {
        failed: c.failed,
        refusals: c.refusals,
        last_retry_after_ms: c.last_retry_after_ms,
    }
}

fn call_out(c: tw::Call) -> w::CallState {
    w::CallState {
        failed: c.failed,
        refusals: c.refusals,
        last_retry_after_ms: c.last_retry_after_ms,
    }
}

fn usage_in(u: w::Usage) -> tw::Usage {
    tw::Usage {
        input_tokens: u.input_tokens,
        cache_creation_input_tokens: u.cache_creation_input_tokens,
        cache_read_input_tokens: u.cache_read_input_tokens,
        output_tokens: u.output_tokens,
    }
}

fn call_step(s: impl Into<tw::CallStep>) -> w::CallStep {
    match s.into() {
        tw::CallStep::Send { lease, expires_at } => w::CallStep::Send(w::Grant {
            lease: lease.0,
            expires_at: expires_at.0,
        }),
        tw::CallStep::Wait(tw::Wait {
            until,
            expected,
            reason,
            ticket,
            refusal,
            attempt,
            checkpoint,
        }) => w::CallStep::Wait(w::CallWait {
            until: until.0,
            expected: expected.0,
            reason: match reason {
                tw::WaitReason::Queued => w::WaitReason::Queued,
                tw::WaitReason::Refused => w::WaitReason::Refused,
                tw::WaitReason::RateLimited => w::WaitReason::RateLimited,
                tw::WaitReason::Overloaded => w::WaitReason::Overloaded,
            },
            ticket: ticket.map(|t| t.0),
            refusal: refusal.map(reject_reason),
            attempt,
            checkpoint,
        }),
        tw::CallStep::Deliver => w::CallStep::Deliver,
        tw::CallStep::GiveUp(tw::GiveUp {
            reason,
            refusal,
            attempts,
            last_retry_after_ms,
        }) => w::CallStep::GiveUp(w::CallGiveUp {
            reason: match reason {
                tw::GiveUpReason::NeverFits => w::GiveUpReason::NeverFits,
                tw::GiveUpReason::Refusals => w::GiveUpReason::Refusals,
                tw::GiveUpReason::Attempts => w::GiveUpReason::Attempts,
            },
            refusal: refusal.map(reject_reason),
            attempts,
            last_retry_after_ms,
        }),
    }
}

fn event(e: tw::Event) -> w::Event {
    match e {
        tw::Event::Granted {
            lease,
            agent,
            pool,
            expires_at,
            waited_ms,
        } => w::Event::Granted(w::Granted {
            lease: lease.0,
            agent: agent.0,
            pool: pool.0,
            expires_at: expires_at.0,
            waited_ms,
        }),
        tw::Event::Revised {
            lease,
            agent,
            pool,
            eta,
        } => w::Event::Revised(w::Revised {
            lease: lease.0,
            agent: agent.0,
            pool: pool.0,
            eta: eta.0,
        }),
        tw::Event::Expired { lease, agent, pool } => w::Event::Expired(w::Expired {
            lease: lease.0,
            agent: agent.0,
            pool: pool.0,
        }),
        tw::Event::MarginChanged {
            pool,
            from_permille,
            to_permille,
            reason,
        } => w::Event::MarginChanged(w::MarginChanged {
            pool: pool.0,
            from_permille,
            to_permille,
            reason: match reason {
                tw::MarginReason::RateLimited => w::MarginReason::RateLimited,
                tw::MarginReason::Recovered => w::MarginReason::Recovered,
                tw::MarginReason::Confirmed => w::MarginReason::Confirmed,
                tw::MarginReason::HeadersDisagreed => w::MarginReason::HeadersDisagreed,
            },
        }),
        tw::Event::Paused { pool, until } => w::Event::Paused(w::Paused {
            pool: pool.0,
            until: until.0,
        }),
        tw::Event::EstimateAlert {
            agent,
            error_permille,
        } => w::Event::EstimateAlert(w::EstimateAlert {
            agent: agent.0,
            error_permille,
        }),
        tw::Event::MarginAtFloor {
            pool,
            axis: a,
            margin_permille,
            since,
        } => w::Event::MarginAtFloor(w::MarginAtFloor {
            pool: pool.0,
            axis: a.map(axis),
            margin_permille,
            since: since.0,
        }),
    }
}

fn axis_report(a: &tw::headers::AxisReport) -> w::AxisReport {
    w::AxisReport {
        limit: a.limit,
        remaining: a.remaining,
        reset_after_ms: a.reset_after_ms,
        granularity: a.granularity,
    }
}

fn rate_axis(a: tw::headers::RateAxis) -> w::RateAxis {
    match a {
        tw::headers::RateAxis::Requests => w::RateAxis::Requests,
        tw::headers::RateAxis::Tokens => w::RateAxis::Tokens,
        tw::headers::RateAxis::InputTokens => w::RateAxis::InputTokens,
        tw::headers::RateAxis::OutputTokens => w::RateAxis::OutputTokens,
        tw::headers::RateAxis::Concurrent => w::RateAxis::Concurrent,
    }
}

fn header_report(r: &tw::HeaderReport) -> w::HeaderReport {
    w::HeaderReport {
        requests: axis_report(&r.requests),
        tokens: axis_report(&r.tokens),
        input_tokens: axis_report(&r.input_tokens),
        output_tokens: axis_report(&r.output_tokens),
        concurrent: axis_report(&r.concurrent),
        retry_after_ms: r.retry_after_ms,
        should_retry: r.should_retry,
        exceeded: r.exceeded.map(rate_axis),
        reset_at_ms: r.reset_at_ms,
        recognised: r.recognised,
        malformed: r.malformed,
    }
}

fn restore_error(e: tw::RestoreError) -> w::RestoreError {
    match e {
        tw::RestoreError::UnsupportedVersion(v) => w::RestoreError::UnsupportedVersion(v),
        tw::RestoreError::Parse(e) => w::RestoreError::Parse(e.to_string()),
        tw::RestoreError::Config(e) => w::RestoreError::Config(e.to_string()),
        tw::RestoreError::Corrupt(what) => w::RestoreError::Corrupt(what.into()),
        other => w::RestoreError::Corrupt(other.to_string()),
    }
}

impl Coord {
    fn wrap(c: tw::Coordinator) -> w::Coordinator {
        w::Coordinator::new(Coord(RefCell::new(c)))
    }
}

impl w::GuestCoordinator for Coord {
    fn create(config_json: String, seed: u64, now: u64) -> Result<w::Coordinator, w::ConfigError> {
        let config_error = |e: tw::ConfigError| match e {
            tw::ConfigError::Invalid { field, reason } => {
                w::ConfigError::Invalid(w::InvalidField {
                    field: field.to_string(),
                    reason: reason.into(),
                })
            }
            other => w::ConfigError::Parse(other.to_string()),
        };
        let config = tw::Config::from_json(&config_json).map_err(config_error)?;
        tw::Coordinator::new(config, seed, tw::Millis(now))
            .map(Coord::wrap)
            .map_err(config_error)
    }

    fn restore(snapshot_json: String) -> Result<w::Coordinator, w::RestoreError> {
        tw::Coordinator::restore_json(&snapshot_json)
            .map(Coord::wrap)
            .map_err(restore_error)
    }

    fn request_lease(
        &self,
        now: u64,
        request: w::LeaseRequest,
    ) -> Result<w::Decision, w::LeaseError> {
        let req = lease_request(request);
        self.0
            .borrow_mut()
            .request_lease(tw::Millis(now), &req)
            .map(decision)
            .map_err(lease_error)
    }

    fn settle(
        &self,
        now: u64,
        lease: u64,
        usage: w::Usage,
    ) -> Result<w::Settlement, w::LeaseError> {
        let usage = usage_in(usage);
        self.0
            .borrow_mut()
            .settle(tw::Millis(now), tw::LeaseId(lease), &usage)
            .map(|s| w::Settlement {
                reserved: demand(s.reserved),
                used: demand(s.used),
            })
            .map_err(lease_error)
    }

    fn cancel(&self, now: u64, lease: u64) -> Result<(), w::LeaseError> {
        self.0
            .borrow_mut()
            .cancel(tw::Millis(now), tw::LeaseId(lease))
            .map_err(lease_error)
    }

    fn renew(&self, now: u64, lease: u64) -> Result<u64, w::LeaseError> {
        self.0
            .borrow_mut()
            .renew(tw::Millis(now), tw::LeaseId(lease))
            .map(|t| t.0)
            .map_err(lease_error)
    }

    fn handle_response(
        &self,
        now: u64,
        pool: u32,
        lease: Option<u64>,
        status: u16,
        headers: Vec<(String, String)>,
        unix_now_ms: Option<u64>,
    ) -> Result<w::HeaderReport, w::LeaseError> {
        let report = tw::parse_headers(
            headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
            unix_now_ms,
        );
        self.0
            .borrow_mut()
            .handle_response(
                tw::Millis(now),
                tw::PoolId(pool),
                lease.map(tw::LeaseId),
                status,
                &report,
            )
            .map(|()| header_report(&report))
            .map_err(lease_error)
    }

    fn handle_timeout(&self, now: u64) {
        self.0.borrow_mut().handle_timeout(tw::Millis(now));
    }

    fn poll_timeout(&self) -> Option<u64> {
        self.0.borrow().poll_timeout().map(|t| t.0)
    }

    fn poll_event(&self) -> Option<w::Event> {
        self.0.borrow_mut().poll_event().map(event)
    }

    fn handle(&self, now: u64, input: String) -> Result<String, w::ProtocolError> {
        let input: tw::Input = serde_json::from_str(&input)
            .map_err(|e| w::ProtocolError::InvalidInput(e.to_string()))?;
        let output = self
            .0
            .borrow_mut()
            .handle(tw::Millis(now), &input)
            .map_err(|e| w::ProtocolError::Lease(lease_error(e)))?;
        serde_json::to_string(&output).map_err(|e| w::ProtocolError::InvalidInput(e.to_string()))
    }

    fn call_lease(
        &self,
        now: u64,
        call: w::CallState,
        request: w::LeaseRequest,
    ) -> Result<(w::CallState, w::CallStep), w::LeaseError> {
        let mut c = call_in(call);
        let step = self
            .0
            .borrow_mut()
            .call_lease(tw::Millis(now), &mut c, &lease_request(request))
            .map_err(lease_error)?;
        Ok((call_out(c), call_step(step)))
    }

    fn call_response(
        &self,
        now: u64,
        call: w::CallState,
        pool: u32,
        lease: Option<u64>,
        status: u16,
        headers: Vec<(String, String)>,
        unix_now_ms: Option<u64>,
    ) -> Result<w::CallAnswer, w::LeaseError> {
        let report = tw::parse_headers(
            headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
            unix_now_ms,
        );
        let mut c = call_in(call);
        let answer = self
            .0
            .borrow_mut()
            .call_response(
                tw::Millis(now),
                &mut c,
                tw::PoolId(pool),
                lease.map(tw::LeaseId),
                status,
                &report,
            )
            .map_err(lease_error)?;
        Ok(w::CallAnswer {
            call: call_out(c),
            step: call_step(answer.step),
            settled: answer.settled.map(|s| w::Settlement {
                reserved: demand(s.reserved),
                used: demand(s.used),
            }),
            report: header_report(&report),
        })
    }

    fn call_interrupted(
        &self,
        now: u64,
        lease: u64,
        seen: Option<w::Usage>,
    ) -> Result<w::Settlement, w::LeaseError> {
        let seen = seen.map(usage_in);
        self.0
            .borrow_mut()
            .call_interrupted(tw::Millis(now), tw::LeaseId(lease), seen.as_ref())
            .map(|s| w::Settlement {
                reserved: demand(s.reserved),
                used: demand(s.used),
            })
            .map_err(lease_error)
    }

    fn open_task(&self, now: u64, spec: w::TaskSpec) -> Result<(), w::LeaseError> {
        let spec = tw::TaskSpec {
            task: tw::TaskId(spec.task),
            role: role(spec.role),
            unblocks: spec.unblocks,
        };
        self.0
            .borrow_mut()
            .open_task(tw::Millis(now), &spec)
            .map_err(lease_error)
    }

    fn task_failed(&self, now: u64, task: u64, signature: u64) -> Result<u32, w::LeaseError> {
        self.0
            .borrow_mut()
            .task_failed(tw::Millis(now), tw::TaskId(task), signature)
            .map_err(lease_error)
    }

    fn end_task(
        &self,
        now: u64,
        task: u64,
        outcome: w::TaskOutcome,
    ) -> Result<String, w::LeaseError> {
        let outcome = match outcome {
            w::TaskOutcome::Merged => tw::TaskOutcome::Merged,
            w::TaskOutcome::Abandoned => tw::TaskOutcome::Abandoned,
            w::TaskOutcome::Failed => tw::TaskOutcome::Failed,
        };
        let s = self
            .0
            .borrow_mut()
            .end_task(tw::Millis(now), tw::TaskId(task), outcome)
            .map_err(lease_error)?;
        Ok(serde_json::to_string(&s).unwrap_or_default())
    }

    fn metrics(&self, now: u64) -> String {
        let m = self.0.borrow().metrics(tw::Millis(now));
        serde_json::to_string(&m).unwrap_or_default()
    }

    fn snapshot(&self) -> String {
        self.0.borrow().snapshot_json()
    }

    fn now(&self) -> u64 {
        self.0.borrow().now().0
    }

    fn pool_by_name(&self, name: String) -> Option<u32> {
        self.0.borrow().pool_id(&name).map(|p| p.0)
    }

    fn check(&self) -> Result<(), String> {
        self.0.borrow().check().map_err(String::from)
    }
}

export!(Component);
