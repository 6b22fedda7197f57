//! One quota (one provider API key of one fleet): the coordinator on the tokio host, the
//! gateway crate's member table beside it (who holds which lease, what a long poll
//! answers), the remote drivers seen, and its state on disk.
//!
//! Locks: the coordinator's (the tokio host's) is taken before the member table's, never
//! after: the table is kept inside [`Tokenwarden::with_coordinator`] and from the host's
//! event hook, both of which hold the coordinator.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokenwarden_core::{Coordinator, Event, Input, Millis, Output, Timeouts};
use tokenwarden_gateway::Refusal;
use tokenwarden_gateway::config;
use tokenwarden_gateway::json::camel_keys;
use tokenwarden_gateway::limiter;
use tokenwarden_gateway::members::{Members, Poll, Record};
use tokenwarden_gateway::timeline::{CallEvent, Timeline};
use tokenwarden_gateway::waitlog::{Look, WaitLog};
use tokenwarden_tokio::{Builder, Tokenwarden};
use tokio::sync::oneshot;

use crate::store::{BACKGROUND, Saved, Store};

/// The coordinator of the quota's current epoch (a reset starts another).
#[derive(Clone)]
pub(crate) struct Live {
    /// The coordinator on the tokio host.
    pub(crate) tw: Tokenwarden,
    /// The epoch of its state: part of every lease handle.
    pub(crate) epoch: String,
}

/// What is kept beside the coordinator.
pub(crate) struct Side {
    pub(crate) members: Members,
    /// Long polls by ticket.
    polls: BTreeMap<u64, Vec<oneshot::Sender<()>>>,
    /// The agent names the table remembers (what it told to write), id → name.
    names: BTreeMap<u64, String>,
    /// Recent call events and the ceilings hit, in memory only.
    pub(crate) timeline: Timeline,
    /// The lines about waits printed for the operator, if serve prints them.
    waitlog: Option<WaitLog>,
}

impl Side {
    /// Keeps call events `evs` at `now` (the coordinator `c` at hand): the timeline, and
    /// the wait log's lines printed.
    fn note_calls(&mut self, c: &Coordinator, evs: &[CallEvent], now: Millis) {
        let Side {
            members,
            timeline,
            waitlog,
            ..
        } = self;
        for ev in evs {
            timeline.note(ev, now.0);
            let Some(log) = waitlog.as_mut() else {
                continue;
            };
            let (agent, pool) = match ev {
                CallEvent::Granted { agent, pool, .. }
                | CallEvent::Queued { agent, pool, .. }
                | CallEvent::Rejected { agent, pool, .. } => (Some(*agent), *pool),
                CallEvent::Waiting { lease, pool, .. } => (timeline.agent_of(*lease), *pool),
                CallEvent::RateLimited { pool, .. } => (None, *pool),
                CallEvent::Expired { .. } => (None, 0),
            };
            let name = agent.map_or_else(String::new, |a| {
                members
                    .name_of(a)
                    .map_or_else(|| format!("agent {a}"), str::to_owned)
            });
            let metrics = log
                .needs_look(ev, now.0)
                .then(|| serde_json::to_value(c.metrics(now)).map(camel_keys).ok())
                .flatten();
            let look = metrics
                .as_ref()
                .map(|m| Look::of(m, pool, agent.unwrap_or(u64::MAX)))
                .unwrap_or_default();
            for line in log.note(ev, now.0, &name, &look) {
                println!("{line}");
            }
        }
    }

    /// The member table and names as `saved` holds them (keyed by `secret`); answers the
    /// leases and tickets it holds, for the core's `restarted` to keep.
    fn restore(&mut self, secret: &str, saved: &Saved) -> Vec<u64> {
        let records: Vec<(u64, Record)> = saved
            .leases
            .iter()
            .filter_map(|(id, r)| Some((*id, Record::from_json(r)?)))
            .collect();
        let keep = records.iter().map(|(id, _)| *id).collect();
        self.members.restore(records);
        self.members.key(secret, saved.names.iter().cloned());
        self.names = saved.names.iter().cloned().collect();
        keep
    }

    /// Answers the long polls the table says are due; keeps the names it learned.
    fn settle(&mut self) {
        for id in self.members.take_wakes() {
            for tx in self.polls.remove(&id).unwrap_or_default() {
                let _ = tx.send(());
            }
        }
        for (id, name) in self.members.take_name_writes() {
            match name {
                Some(n) => self.names.insert(id, n),
                None => self.names.remove(&id),
            };
        }
    }
}

/// One quota.
pub(crate) struct Quota {
    pub(crate) fleet: String,
    pub(crate) name: String,
    pub(crate) conf: config::Quota,
    secret: String,
    live: Mutex<Live>,
    side: Arc<Mutex<Side>>,
    pub(crate) store: Arc<Store>,
    /// Its place in a cluster (`serve --cluster`), if this instance is in one.
    pub(crate) seat: Option<Arc<crate::cluster::Seat>>,
    /// The share of the quota the coordinator holds (1 but while a cluster's instance knows
    /// no owner, or follows one): a reset keeps it.
    share: AtomicU32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A fresh epoch: the time in base 36 and 32 random bits (as the Worker draws it).
fn new_epoch(now: u64) -> String {
    let mut bytes = [0u8; 4];
    let _ = getrandom::fill(&mut bytes);
    format!(
        "{}{}",
        base36(now),
        base36(u64::from(u32::from_le_bytes(bytes)))
    )
}

fn base36(mut n: u64) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(digits[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// A request applied to a coordinator that was replaced while it was read.
fn replaced() -> Refusal {
    Refusal::new(
        503,
        limiter::CLOSED,
        "this quota's state was replaced while the request was read (a reset, or in a cluster another owner term or a share of the quota); retry".into(),
    )
}

/// The core's timeouts for a quota's (the host's defaults where it names none).
fn timeouts(t: config::Timeouts) -> Timeouts {
    let d = Timeouts::default();
    Timeouts {
        first_byte_ms: t.first_byte_ms.or(d.first_byte_ms),
        idle_ms: t.idle_ms.or(d.idle_ms),
    }
}

impl Quota {
    /// The quota `fleet`/`name`, restored from `store` if it holds a state, else created
    /// from its config at `now` (Unix ms). Proxied calls in flight when the last process
    /// stopped died with it: the core ends their leases and tickets now.
    pub(crate) fn open(
        fleet: &str,
        name: &str,
        conf: &config::Quota,
        secret: &str,
        store: Store,
        now: u64,
        wait_log: bool,
    ) -> Result<Arc<Quota>, String> {
        let pools: Vec<String> = conf.config.pools.iter().map(|p| p.name.clone()).collect();
        let saved = store.read()?;
        let side = Arc::new(Mutex::new(Side {
            members: Members::new(secret, pools),
            polls: BTreeMap::new(),
            names: BTreeMap::new(),
            timeline: Timeline::new(now),
            waitlog: wait_log.then(|| WaitLog::new(now)),
        }));
        let store = Arc::new(store);
        let (coordinator, epoch, keep) = match saved {
            Some(s) => {
                let c = Coordinator::restore_json(&s.snapshot).map_err(|e| {
                    format!("the stored state of quota {fleet}/{name} cannot be restored: {e}")
                })?;
                let keep = lock(&side).restore(secret, &s);
                (Some(c), s.epoch, keep)
            }
            None => (None, new_epoch(now), Vec::new()),
        };
        let restored = coordinator.is_some();
        let tw = build(conf, coordinator, now, &side, &store)?;
        let q = Arc::new(Quota {
            fleet: fleet.to_owned(),
            name: name.to_owned(),
            conf: conf.clone(),
            secret: secret.to_owned(),
            live: Mutex::new(Live { tw, epoch }),
            side,
            seat: store.seat(),
            share: AtomicU32::new(1),
            store,
        });
        if restored {
            let keep = keep.into_iter().map(tokenwarden_core::LeaseId).collect();
            let ended = q.live().tw.handle(&Input::Restarted { keep });
            if let Ok(Output::Ended {
                interrupted,
                withdrawn,
            }) = ended
                && (!interrupted.is_empty() || !withdrawn.is_empty())
            {
                q.store.changed(Duration::ZERO);
            }
        } else {
            q.store.changed(Duration::ZERO);
        }
        Ok(q)
    }

    /// The coordinator of the current epoch.
    pub(crate) fn live(&self) -> Live {
        lock(&self.live).clone()
    }

    /// The member table (never held while the coordinator is asked for).
    pub(crate) fn side(&self) -> MutexGuard<'_, Side> {
        lock(&self.side)
    }

    /// The quota's state as its file holds it.
    pub(crate) fn saved(&self) -> Saved {
        let live = self.live();
        // The coordinator first, then the table: the lock order.
        let snapshot = live.tw.inspect(|c, _| c.snapshot_json());
        let side = self.side();
        Saved {
            snapshot,
            epoch: live.epoch,
            leases: side
                .members
                .records()
                .iter()
                .map(|(id, r)| (*id, r.to_json()))
                .collect(),
            names: side.names.iter().map(|(id, n)| (*id, n.clone())).collect(),
        }
    }

    /// A member's request to `route` (the gateway crate's member routes: `handle`, `lease`,
    /// `settle`, …) naming lease or task `id`, from `who` (an agent credential's agent) or
    /// the fleet's secret (`None`): checked by the member table, applied, the table kept.
    /// Answers the input as read and the output (camelCase JSON), with the live coordinator.
    pub(crate) fn member(
        &self,
        live: &Live,
        route: &str,
        id: Option<&Value>,
        who: Option<&str>,
        body: &Value,
    ) -> Result<(Value, Value), Refusal> {
        let out = live.tw.with_coordinator(|c, now| {
            // Replaced while the request was read (a reset, or in a cluster another term or
            // a share): the closed coordinator decides nothing more.
            if live.tw.is_closed() {
                return Err(replaced());
            }
            let mut side = self.side();
            let who = who.map(|n| side.members.who(n));
            let checked = side.members.route(route, id, who.as_ref(), body);
            let res = checked.and_then(|checked| {
                let out = c.handle(now, &checked.input).map_err(Refusal::from)?;
                side.members.applied(&checked, &out);
                side.note_calls(c, &CallEvent::of_output(&checked.input, &out), now);
                Ok((checked.json, out))
            });
            side.settle();
            res
        })?;
        let json = serde_json::to_value(&out.1)
            .map(camel_keys)
            .unwrap_or(Value::Null);
        Ok((out.0, json))
    }

    /// The operator's hold (`{ pool?, forMs }`): the pool's name and until when.
    pub(crate) fn hold(&self, live: &Live, body: &Value) -> Result<(String, u64), Refusal> {
        live.tw.with_coordinator(|c, now| {
            if live.tw.is_closed() {
                return Err(replaced());
            }
            let input = self.side().members.hold(body, now)?;
            match c.handle(now, &input).map_err(Refusal::from)? {
                Output::Held { pool, until } => {
                    let name = c
                        .config()
                        .pools
                        .get(pool.0 as usize)
                        .map(|p| p.name.clone());
                    Ok((name.unwrap_or_default(), until.0))
                }
                other => Err(Refusal::new(
                    500,
                    "internal",
                    format!("hold answered {other:?}"),
                )),
            }
        })
    }

    /// A long poll on ticket `lease` for up to `timeout_ms`: 200 with its grant, 202 with
    /// its promise, or why not.
    pub(crate) async fn wait(
        &self,
        lease: u64,
        who: Option<&str>,
        timeout_ms: u64,
    ) -> Result<(u16, Value), Refusal> {
        let id = Value::from(lease);
        let (poll, woken) = {
            let mut side = self.side();
            let who = who.map(|n| side.members.who(n));
            side.settle();
            let poll = side.members.wait(Some(&id), who.as_ref(), timeout_ms)?;
            let woken = match poll {
                Poll::Hold(_) => {
                    let (tx, rx) = oneshot::channel();
                    side.polls.entry(lease).or_default().push(tx);
                    Some(rx)
                }
                Poll::Answer { .. } => None,
            };
            (poll, woken)
        };
        let poll = match (poll, woken) {
            (Poll::Hold(ms), Some(rx)) => {
                let _ = tokio::time::timeout(Duration::from_millis(ms), rx).await;
                let mut side = self.side();
                let who = who.map(|n| side.members.who(n));
                side.settle();
                match side.members.wait(Some(&id), who.as_ref(), 0) {
                    Err(r) if r.status == 404 => {
                        return Err(Refusal::new(
                            404,
                            "unknown_lease",
                            "the ticket ended while waiting".into(),
                        ));
                    }
                    other => other?,
                }
            }
            (p, _) => p,
        };
        match poll {
            Poll::Answer { status, body } => Ok((status, body)),
            Poll::Hold(_) => Err(Refusal::new(500, "internal", "a poll held twice".into())),
        }
    }

    /// Remembers a remote driver's process (the member table's rule); answers how many
    /// share the quota (at least 1: the caller).
    pub(crate) fn seen(&self, client: Option<&str>, now: u64) -> u64 {
        self.side().members.seen(client, now)
    }

    /// The id of agent `name` (keyed by the fleet's secret), its name remembered.
    pub(crate) fn agent_id(&self, name: &str) -> u64 {
        let mut side = self.side();
        let id = side.members.names().id(name);
        side.settle();
        id
    }

    /// The operator's reset: the quota starts afresh from its configuration (a new epoch);
    /// every lease and ticket ends (long polls answer 404). Answers how many ended.
    pub(crate) fn reset(&self, now: u64) -> Result<usize, String> {
        let tw = build(&self.shared_conf(), None, now, &self.side, &self.store)?;
        // The old coordinator decides nothing more (calls waiting on it are answered 503).
        self.live().tw.close();
        let ended = {
            let mut side = self.side();
            let n = side.members.clear();
            side.timeline.clear(now);
            side.settle();
            n
        };
        *lock(&self.live) = Live {
            tw,
            epoch: new_epoch(now),
        };
        self.store.remove();
        Ok(ended)
    }

    /// Starts the quota afresh in a cluster: from `saved` (the last owner's state, this
    /// instance taking over), or from its config with every limit divided by `share` (this
    /// instance on its own while no owner is known, or a follower). The coordinator it had
    /// is closed first: calls waiting on it are answered 503 (retry), its leases end, and
    /// nothing it does after reaches the new one's tables.
    pub(crate) fn replace(&self, saved: Option<Saved>, share: u32, now: u64) -> Result<(), String> {
        let restored = match &saved {
            Some(s) => Some(
                Coordinator::restore_json(&s.snapshot)
                    .map_err(|e| format!("the saved state cannot be restored: {e}"))?,
            ),
            None => None,
        };
        self.share.store(share.max(1), Ordering::SeqCst);
        self.live().tw.close();
        let (epoch, keep) = {
            let mut side = self.side();
            side.members.clear();
            let kept = match &saved {
                Some(s) => (s.epoch.clone(), Some(side.restore(&self.secret, s))),
                None => (new_epoch(now), None),
            };
            side.settle();
            kept
        };
        let tw = build(&self.shared_conf(), restored, now, &self.side, &self.store)?;
        if let Some(keep) = keep {
            let keep = keep.into_iter().map(tokenwarden_core::LeaseId).collect();
            let _ = tw.handle(&Input::Restarted { keep });
        }
        *lock(&self.live) = Live { tw, epoch };
        Ok(())
    }

    /// The quota's config with its current share.
    fn shared_conf(&self) -> config::Quota {
        let mut conf = self.conf.clone();
        conf.config.share = self.share.load(Ordering::SeqCst);
        conf
    }

    /// The fleet's secret (agent ids and lease handles are keyed by it).
    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }
}

/// The coordinator on the tokio host: `restored`, or new from the quota's config, on the
/// Unix clock; its events kept in the member table and written to disk.
fn build(
    conf: &config::Quota,
    restored: Option<Coordinator>,
    now: u64,
    side: &Arc<Mutex<Side>>,
    store: &Arc<Store>,
) -> Result<Tokenwarden, String> {
    let hook_side = Arc::clone(side);
    let hook_store = Arc::clone(store);
    let hook = move |c: &Coordinator, e: &Event, at: Millis| {
        let mut side = lock(&hook_side);
        side.members.event(e, at);
        if let Some(ev) = CallEvent::of_event(e) {
            side.note_calls(c, &[ev], at);
        }
        side.settle();
        drop(side);
        hook_store.changed(BACKGROUND);
    };
    let calls = Arc::clone(side);
    let on_output = move |c: &Coordinator, input: &Input, out: &Output, at: Millis| {
        lock(&calls).note_calls(c, &CallEvent::of_output(input, out), at);
    };
    let builder = match restored {
        Some(c) => Builder::restored(c),
        None => Builder::new(conf.config.clone()),
    };
    builder
        .clock_origin(Millis(now))
        .timeouts(timeouts(conf.timeouts))
        .on_event(Arc::new(hook))
        .on_output(Arc::new(on_output))
        .build()
        .map_err(|e| e.to_string())
}
