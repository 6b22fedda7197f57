//! One model call, as the core's call lifecycle says: ask (`call_lease`), wait in line or
//! until asked to ask again, send, tell the answer (`call_response`), and from the send to
//! the lease's end the provider crate's [`Send`] machine.

use std::sync::Arc;

use tokenwarden_core::{
    AgentId, Answer, Call, Input, LeaseError, LeaseId, LeaseRequest, Millis, Output, PoolId, Role,
    TaskId, Wait, WaitReason,
};
use tokenwarden_provider::estimate::{CallShape, Parsed, Provider, call_shape, prompt_tokens};
use tokenwarden_provider::send::{Send, SendAction};
use tokenwarden_provider::{Api, Usage, model_call};

use crate::host::{Error, Shared, Tokenwarden, ready_estimator, unix_now_ms};
use crate::refusal::Refusal;

/// What the hook of [`Agent::on_long_wait`] is told of the wait ahead.
#[derive(Clone, Debug)]
pub struct LongWait {
    /// The agent.
    pub agent: AgentId,
    /// The pool.
    pub pool: PoolId,
    /// Why: queued, refused for now, or waiting out a 429 or an overload.
    pub reason: WaitReason,
    /// The wait expected from now, ms (queued: the core's expected grant).
    pub wait_ms: u64,
    /// Until when at the latest, on the coordinator's clock ([`crate::Tokenwarden::now`]).
    pub until: Millis,
    /// Failed sends so far.
    pub attempt: u32,
    /// The call this wait holds, as it will be sent: keep its body as the next call, and
    /// send it again on resume. Its headers are not in it (the API key stays with the client).
    pub call: HeldCall,
}

/// A model call held in a wait (see [`LongWait::call`]).
#[derive(Clone, Debug)]
pub struct HeldCall {
    /// `anthropic` or `openai`.
    pub provider: &'static str,
    /// The model named.
    pub model: String,
    /// The HTTP method.
    pub method: String,
    /// The URL it goes to, as the client built it.
    pub url: String,
    /// The request body, as sent.
    pub body: Arc<str>,
}

/// The hook an agent runs before a long wait (see [`Agent::on_long_wait`]).
pub type LongWaitHook = Arc<dyn Fn(&LongWait) -> Result<(), String> + std::marker::Send + Sync>;

/// Who makes the calls of one client, and how the core weighs them: what the fetch
/// wrapper's options say for a JavaScript agent.
#[derive(Clone)]
pub struct Agent {
    pub(crate) id: AgentId,
    role: Role,
    task: Option<TaskId>,
    family: Option<AgentId>,
    unblocks: u32,
    failure_signature: Option<u64>,
    pool: Option<String>,
    long_wait: Option<LongWaitHook>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("id", &self.id)
            .field("role", &self.role)
            .field("task", &self.task)
            .field("family", &self.family)
            .field("unblocks", &self.unblocks)
            .field("failure_signature", &self.failure_signature)
            .field("pool", &self.pool)
            .field("on_long_wait", &self.long_wait.is_some())
            .finish()
    }
}

impl Agent {
    /// The agent named `name`: its id is the fetch wrapper's for the same name (FNV-1a,
    /// 32 bits, over its UTF-16 code units), so a Rust and a JavaScript agent of one name
    /// are one agent to a shared limiter.
    #[must_use]
    pub fn named(name: &str) -> Agent {
        let mut h: u32 = 0x811c_9dc5;
        for unit in name.encode_utf16() {
            h ^= u32::from(unit);
            h = h.wrapping_mul(0x0100_0193);
        }
        Agent::id(u64::from(h))
    }

    /// The agent with this id.
    #[must_use]
    pub fn id(id: u64) -> Agent {
        Agent {
            id: AgentId(id),
            role: Role::Auto,
            task: None,
            family: None,
            unblocks: 0,
            failure_signature: None,
            pool: None,
            long_wait: None,
        }
    }

    /// Its id.
    #[must_use]
    pub fn agent_id(&self) -> AgentId {
        self.id
    }

    /// Its role (default: `auto`, the core decides by the agent's family).
    #[must_use]
    pub fn role(mut self, role: Role) -> Agent {
        self.role = role;
        self
    }

    /// The task its calls work on (opened with `open_task`).
    #[must_use]
    pub fn task(mut self, task: TaskId) -> Agent {
        self.task = Some(task);
        self
    }

    /// The agent that spawned it (its calls count toward that agent's family).
    #[must_use]
    pub fn family(mut self, root: AgentId) -> Agent {
        self.family = Some(root);
        self
    }

    /// How many agents wait on its calls.
    #[must_use]
    pub fn unblocks(mut self, n: u32) -> Agent {
        self.unblocks = n;
        self
    }

    /// The failure its calls work on (a hash of the failing test and the diff): the same
    /// failure over and over is weighed down by the core.
    #[must_use]
    pub fn failure_signature(mut self, signature: u64) -> Agent {
        self.failure_signature = Some(signature);
        self
    }

    /// The pool its calls go to, by name (default: the pool named after the call's model,
    /// else the only pool).
    #[must_use]
    pub fn pool(mut self, name: &str) -> Agent {
        self.pool = Some(name.into());
        self
    }

    /// Runs `hook` before a long wait: the core marks a wait `checkpoint` when it is longer
    /// than `call.checkpoint_after_ms` (default 30 s, or the prompt cache's lifetime). Write
    /// the turn down there (the held call included), so that a process killed during the
    /// wait resumes without a re-plan. An `Err` withdraws the call (its ticket cancelled):
    /// it fails with [`crate::Error::Withdrawn`] carrying the message.
    #[must_use]
    pub fn on_long_wait(
        mut self,
        hook: impl Fn(&LongWait) -> Result<(), String> + std::marker::Send + Sync + 'static,
    ) -> Agent {
        self.long_wait = Some(Arc::new(hook));
        self
    }
}

/// What becomes of a request.
pub(crate) enum Prepared {
    /// Not a model call: it passes through.
    Pass,
    /// A model call whose body is no JSON object: sent unleased (the provider refuses it).
    Unleased,
    /// A model call to govern.
    Call(Box<Governed>),
}

/// What a request is to tokenwarden: `method`, `path` (of `url`) and its body, if any.
pub(crate) fn prepare(
    tw: &Tokenwarden,
    agent: &Agent,
    (method, path, url): (&str, &str, &str),
    body: Option<&[u8]>,
) -> Prepared {
    let Some(api) = model_call(method, path) else {
        return Prepared::Pass;
    };
    let Some(text) = body.and_then(|b| std::str::from_utf8(b).ok()) else {
        return Prepared::Unleased;
    };
    let Ok(parsed) = Parsed::new(text) else {
        return Prepared::Unleased;
    };
    let provider = match api.provider() {
        "anthropic" => Provider::Anthropic,
        _ => Provider::Openai,
    };
    let shape = call_shape(provider, parsed.body());
    Prepared::Call(Box::new(Governed {
        shared: Arc::clone(tw.shared()),
        agent: agent.clone(),
        api,
        provider,
        text: text.into(),
        parsed,
        shape,
        pool: None,
        state: Call::new(),
        wait_until: None,
        checkpoint: None,
        method: method.to_owned(),
        url: url.to_owned(),
    }))
}

/// A model call being governed (see the module doc).
pub(crate) struct Governed {
    shared: Arc<Shared>,
    agent: Agent,
    api: Api,
    provider: Provider,
    text: Arc<str>,
    /// The body parsed once, with what its estimates made of it.
    parsed: Parsed,
    shape: CallShape,
    pool: Option<PoolId>,
    state: Call,
    /// Ask again no earlier than this (the core said to wait).
    wait_until: Option<Millis>,
    /// A long wait after an answer, for the agent's hook before it is waited.
    checkpoint: Option<Wait>,
    method: String,
    url: String,
}

/// How a call stops before an answer is handed over.
pub(crate) enum Stopped {
    /// tokenwarden answers in the provider's place.
    Refused(Refusal),
    /// A failure of the host's own.
    Failed(Error),
}

/// What the core made of the provider's answer.
pub(crate) enum Next {
    /// Ask again (the core settled the lease; it waits first).
    Retry,
    /// Hand the answer over as it is (the core settled the lease as nothing used).
    Handover,
    /// A success: hand it over through the meter, which settles it from its body.
    Deliver,
}

/// Leaves a ticket's place in line if its caller goes away before the grant.
struct Leave<'a> {
    shared: &'a Shared,
    ticket: Option<LeaseId>,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.shared.leave(t);
        }
    }
}

impl Governed {
    fn pool(&mut self) -> Result<PoolId, Refusal> {
        if let Some(p) = self.pool {
            return Ok(p);
        }
        let st = self.shared.lock();
        let coord = &st.coord;
        let by = |name: &str| coord.pool_id(name);
        let pools = &coord.config().pools;
        let found = match self.agent.pool.as_deref() {
            Some(name) => by(name),
            None => by(&self.shape.model).or((pools.len() == 1).then_some(PoolId(0))),
        };
        found.inspect(|p| self.pool = Some(*p)).ok_or_else(|| {
            let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
            let model = self.agent.pool.as_deref().unwrap_or(&self.shape.model);
            Refusal::unknown_pool(self.provider, model, &names.join(", "))
        })
    }

    /// Asks until the core says to send: the lease to send under, and the estimate's id.
    /// Dropped while queued, the ticket is withdrawn.
    pub(crate) async fn lease(&mut self) -> Result<Held, Stopped> {
        let pool = self.pool().map_err(Stopped::Refused)?;
        loop {
            if self.shared.closed.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Stopped::Refused(Refusal::closed(self.provider)));
            }
            if let Some(wait) = self.checkpoint.take() {
                self.long_wait(pool, &wait).map_err(Stopped::Failed)?;
            }
            if let Some(until) = self.wait_until.take() {
                self.shared.sleep_until(until).await;
            }
            let now = self.shared.now();
            let (estimate_id, estimate) = {
                let mut est = ready_estimator(&self.shared, self.provider, &self.shape.model);
                est.estimate_parsed(now.0, self.provider, &self.shape.model, &mut self.parsed)
            };
            let request = LeaseRequest {
                agent: self.agent.id,
                pool,
                input_tokens: estimate.input_tokens,
                cached_prefix_tokens: estimate.cached_prefix_tokens,
                cached_prefix_confirmed: estimate.cached_prefix_confirmed,
                max_tokens: self.shape.max_tokens,
                role: self.agent.role,
                unblocks: self.agent.unblocks,
                failure_signature: self.agent.failure_signature,
                task: self.agent.task,
                family: self.agent.family,
            };
            let input = Input::CallLease {
                call: self.state,
                request,
            };
            let (out, granted) = {
                let mut st = self.shared.lock();
                let out = self.shared.handle_in(&mut st, &input);
                let granted = match &out {
                    Ok(Output::Wait { wait, .. }) => {
                        wait.ticket.map(|t| (t, self.shared.wait_for(&mut st, t)))
                    }
                    _ => None,
                };
                (out, granted)
            };
            match out.map_err(|e| self.core_error(e))? {
                Output::Send {
                    call,
                    lease,
                    expires_at,
                } => {
                    self.state = call;
                    return Ok(Held {
                        lease,
                        expires_at,
                        estimate_id,
                    });
                }
                Output::Wait { call, wait, .. } => {
                    self.state = call;
                    let Some((ticket, rx)) = granted else {
                        self.wait_until = Some(wait.until);
                        self.checkpoint = wait.checkpoint.then_some(wait);
                        continue;
                    };
                    let mut leave = Leave {
                        shared: &self.shared,
                        ticket: Some(ticket),
                    };
                    if wait.checkpoint {
                        // Declined: the ticket is withdrawn as `leave` drops.
                        self.long_wait(pool, &wait).map_err(Stopped::Failed)?;
                    }
                    if let Ok(expires_at) = rx.await {
                        leave.ticket = None;
                        return Ok(Held {
                            lease: ticket,
                            expires_at,
                            estimate_id,
                        });
                    }
                    // Withdrawn without a grant (the core restarted it): ask again.
                    leave.ticket = None;
                }
                Output::GiveUp { give_up, .. } => {
                    return Err(Stopped::Refused(Refusal::gave_up(self.provider, &give_up)));
                }
                other => {
                    unreachable!("call_lease answers send, wait or give_up, not {other:?}")
                }
            }
        }
    }

    /// The agent's hook before a long wait, if it has one.
    fn long_wait(&self, pool: PoolId, wait: &Wait) -> Result<(), Error> {
        let Some(hook) = self.agent.long_wait.as_ref() else {
            return Ok(());
        };
        let told = LongWait {
            agent: self.agent.id,
            pool,
            reason: wait.reason,
            wait_ms: wait.expected.since(self.shared.now()),
            until: wait.until,
            attempt: wait.attempt,
            call: HeldCall {
                provider: self.api.provider(),
                model: self.shape.model.clone(),
                method: self.method.clone(),
                url: self.url.clone(),
                body: Arc::clone(&self.text),
            },
        };
        hook(&told).map_err(|message| Error::Withdrawn { message })
    }

    fn core_error(&self, e: LeaseError) -> Stopped {
        match e {
            LeaseError::UnknownPool => Stopped::Refused(Refusal::unknown_pool(
                self.provider,
                &self.shape.model,
                "(none)",
            )),
            e => Stopped::Failed(Error::Core(e)),
        }
    }

    /// The meter of a send under `held`, started now.
    pub(crate) fn meter(&self, held: &Held) -> Meter {
        let now = self.shared.now();
        Meter {
            shared: Arc::clone(&self.shared),
            send: Send::sent(
                self.api,
                now,
                held.expires_at.since(now),
                self.shared.timeouts,
            ),
            lease: held.lease,
            expires_at: held.expires_at,
            provider: self.provider,
            model: self.shape.model.clone(),
            text: Arc::clone(&self.text),
            estimate_id: held.estimate_id,
            answered: false,
            delivered: false,
            timed_out: None,
        }
    }

    /// The provider answered `status` with `headers`: what the core makes of it. A retry
    /// or a hand-over is settled by the core, and the meter told so.
    pub(crate) fn answered(
        &mut self,
        meter: &mut Meter,
        status: u16,
        headers: &http::HeaderMap,
    ) -> Next {
        let pairs = headers
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        let input = Input::CallResponse {
            call: self.state,
            pool: self.pool.unwrap_or(PoolId(0)),
            lease: Some(meter.lease),
            status,
            headers: pairs,
            unix_now_ms: unix_now_ms(),
            reported: false,
        };
        let next = match self.shared.handle(&input) {
            Ok(Output::Wait { call, wait, .. }) => {
                self.state = call;
                self.wait_until = Some(wait.until);
                self.checkpoint = wait.checkpoint.then_some(wait);
                Next::Retry
            }
            Ok(Output::Deliver {
                call,
                settled: None,
                ..
            }) if (200..300).contains(&status) => {
                self.state = call;
                return Next::Deliver;
            }
            Ok(Output::Deliver { call, .. } | Output::GiveUp { call, .. }) => {
                self.state = call;
                Next::Handover
            }
            // The core could not take the answer in: the caller still gets it.
            _ => {
                meter.failed();
                return Next::Handover;
            }
        };
        meter.answer(Answer::Settled);
        next
    }
}

/// A lease to send under.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    lease: LeaseId,
    expires_at: Millis,
    estimate_id: u64,
}

/// One send's [`Send`] machine with what it needs to obey it: renew, settle or end the
/// lease as interrupted (a refusal told back), learn from a settled call, note a timeout.
/// Dropped before the lease's end is decided, the call is ended as it stands (no answer:
/// failed; a body cut short: broken).
pub(crate) struct Meter {
    shared: Arc<Shared>,
    send: Send,
    lease: LeaseId,
    /// The lease's expiry, as last known.
    expires_at: Millis,
    provider: Provider,
    model: String,
    text: Arc<str>,
    estimate_id: u64,
    answered: bool,
    /// The machine said to hand the answer over.
    pub(crate) delivered: bool,
    /// A timeout passed: the request is to be aborted.
    pub(crate) timed_out: Option<Error>,
}

impl Meter {
    /// Does what the machine says until it says nothing more.
    fn act(&mut self) {
        while let Some(action) = self.send.poll_action() {
            let lease = self.lease;
            let now = self.shared.now();
            match action {
                SendAction::Renew => match self.shared.handle(&Input::Renew { lease }) {
                    Ok(Output::Renewed { expires_at }) => {
                        self.expires_at = expires_at;
                        self.send.renewed(now, expires_at.since(now));
                    }
                    Err(e) => self.send.renew_refused(gone(e)),
                    Ok(_) => self.send.renew_refused(false),
                },
                SendAction::Settle { usage, learn } => {
                    let input = Input::Settle {
                        lease,
                        usage: usage.into(),
                    };
                    match self.shared.handle(&input) {
                        Ok(_) if learn => self.learn(now, &usage),
                        Ok(_) => {}
                        Err(e) => self.send.settle_refused(gone(e)),
                    }
                }
                SendAction::Interrupted { seen } => {
                    let input = Input::CallInterrupted {
                        lease,
                        seen: seen.map(Into::into),
                    };
                    if let Err(e) = self.shared.handle(&input) {
                        self.send.interrupted_refused(gone(e));
                    }
                }
                SendAction::Deliver => self.delivered = true,
                SendAction::TimedOut { timeout, ms } => {
                    self.timed_out = Some(Error::UpstreamTimeout { timeout, ms });
                }
            }
        }
    }

    fn learn(&self, now: Millis, usage: &Usage) {
        let mut est = self.shared.estimator();
        let actual = prompt_tokens(usage);
        let (id, p, m) = (self.estimate_id, self.provider, self.model.as_str());
        if !est.observe(id, now.0, p, m, None, actual, Some(usage)) {
            // Forgotten meanwhile: learned from the body, analyzed again.
            if let Ok(body) = serde_json::from_str(&self.text) {
                est.observe(id, now.0, p, m, Some(&body), actual, Some(usage));
            }
        }
    }

    /// When [`Meter::timeout`] is due.
    pub(crate) fn deadline(&self) -> Option<tokio::time::Instant> {
        self.send.poll_timeout().map(|t| self.shared.instant(t))
    }

    /// The deadline passed.
    pub(crate) fn timeout(&mut self) {
        self.send.handle_timeout(self.shared.now());
        self.act();
    }

    /// The head came; the core made `answer` of it.
    pub(crate) fn answer(&mut self, answer: Answer) {
        self.answered = true;
        let now = self.shared.now();
        let left = self.lease_left(now);
        self.send.answered(now, answer, left);
        self.act();
    }

    fn lease_left(&self, now: Millis) -> u64 {
        self.expires_at.since(now)
    }

    /// The caller waits for the next piece.
    pub(crate) fn reading(&mut self) {
        self.send.reading(self.shared.now());
        self.act();
    }

    /// A piece of the body came.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.send.push(self.shared.now(), chunk);
        self.act();
    }

    /// The body ended cleanly.
    pub(crate) fn end(&mut self) {
        self.send.end(self.shared.now());
        self.act();
    }

    /// The body broke or its reader left.
    pub(crate) fn broken(&mut self) {
        self.send.broken();
        self.act();
    }

    /// No answer came.
    pub(crate) fn failed(&mut self) {
        self.answered = true;
        self.send.failed();
        self.act();
    }

    /// `fut` (the request), unless a timeout passes first; the lease renewed meanwhile as the
    /// machine says.
    pub(crate) async fn until_head<F: Future>(&mut self, fut: F) -> Result<F::Output, Error> {
        let mut fut = std::pin::pin!(fut);
        loop {
            let Some(at) = self.deadline() else {
                return Ok(fut.await);
            };
            tokio::select! {
                biased;
                out = &mut fut => return Ok(out),
                () = tokio::time::sleep_until(at) => {
                    self.timeout();
                    if let Some(e) = self.timed_out.take() {
                        self.answered = true;
                        return Err(e);
                    }
                }
            }
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if !self.send.is_ended() {
            if self.answered {
                self.send.broken();
            } else {
                self.send.failed();
            }
            self.act();
        }
    }
}

/// A refusal that means the lease has already ended.
fn gone(e: LeaseError) -> bool {
    matches!(e, LeaseError::UnknownLease | LeaseError::NotGranted)
}

#[cfg(test)]
mod tests {
    use super::Agent;

    /// The ids the fetch wrapper's `agentIdFor` gives the same names (Node:
    /// `agentIdFor("agent-1")` and so on), surrogate pairs included.
    #[test]
    fn a_name_is_the_same_agent_as_in_javascript() {
        for (name, id) in [
            ("agent-1", 3_813_959_584),
            ("planner", 1_390_391_395),
            ("é🙂x", 704_295_417),
            ("", 2_166_136_261),
        ] {
            assert_eq!(Agent::named(name).agent_id().0, id, "{name}");
        }
    }
}
