//! `serve --cluster redis://…`: instances on several machines share a key through one owner
//! per quota, elected in Redis or Valkey (`tokenwarden-cluster`).
//!
//! Each quota has a [`Seat`] on every instance, and a task that campaigns for its owner
//! lease every third of the lease's length:
//! - **Owner**: the coordinator runs here, restored from the state the last owner saved;
//!   every change is saved in the shared store under this instance's term (fenced: a save
//!   after the term ended is refused), and a reply that changes the state waits for its
//!   save. It stops acting as owner at the term's end on its own clock unless renewed.
//! - **Follower**: every request of the quota is forwarded to the owner's advertised URL,
//!   as it came (the owner authenticates it), and its answer streamed back.
//! - **No owner known** (the store unreachable, or the owner's term just ended): this
//!   instance grants from a coordinator of its own holding `1/N` of every limit (the core's
//!   `share`), `N` the instances whose heartbeats the store last counted; leases granted
//!   then are not carried into the owner's state when one is known again.
//!
//! Taking over, an instance closes the coordinator it had (calls waiting on it are answered
//! 503, retry) and restores the saved state: leases granted and acknowledged by the last
//! owner are there (their settles land), proxied calls that were in flight through the old
//! owner died with it and are charged as cut short.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use http::{HeaderValue, Request, Response, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokenwarden_cluster::{Elector, QuotaKey, Saved as Landed, Term};
use tokenwarden_gateway::limiter;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::app::{read_body, unix_now};
use crate::proxy::Upstream;
use crate::quota::Quota;
use crate::reply::{BoxError, Failure, Reply, refusal};
use crate::store::Saved;

/// The header a forwarded request carries: the owner answers it itself, never forwards it.
pub(crate) const FORWARDED: &str = "x-tokenwarden-forwarded";

/// This instance in the cluster.
pub(crate) struct Cluster {
    pub(crate) elector: Arc<dyn Elector>,
    /// The store's URL without its password (for the banner).
    pub(crate) shown: String,
    /// How other instances reach this one (`http://host:port`).
    pub(crate) advertise: String,
    /// This process's id in the store: its URL and a nonce (a restart is a new candidate).
    pub(crate) me: String,
    /// The owner lease's length.
    pub(crate) ttl: Duration,
}

/// Who owns a quota, as this instance knows it.
#[derive(Clone, Debug)]
pub(crate) enum Role {
    /// This instance, for this term.
    Owner(Term),
    /// Another instance, at this URL.
    Follower(String),
    /// No owner known: this instance grants from a share of the quota.
    Unknown,
}

/// One quota's place in the cluster.
pub(crate) struct Seat {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) key: QuotaKey,
    /// `fleet/quota`, for what is printed.
    name: String,
    role: Mutex<Role>,
    /// Held while the quota's coordinator is replaced and its role set, and while the
    /// writer reads the term and takes the snapshot it saves under it: a snapshot is never
    /// saved under a term it is not of.
    transition: Mutex<()>,
    /// A save was refused: the term is over whatever the clock says.
    fenced: AtomicBool,
    /// The instances alive at the last heartbeat (at least 1).
    alive: AtomicU64,
    wake: Notify,
    /// Told every time the role is set: a forwarded request waiting on an owner that is no
    /// longer the owner gives up.
    changed: Notify,
}

impl std::fmt::Debug for Seat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Seat({})", self.name)
    }
}

impl Seat {
    pub(crate) fn new(cluster: Arc<Cluster>, fleet: &str, quota: &str) -> Seat {
        Seat {
            cluster,
            key: QuotaKey::new(fleet, quota),
            name: format!("{fleet}/{quota}"),
            role: Mutex::new(Role::Unknown),
            transition: Mutex::new(()),
            fenced: AtomicBool::new(false),
            alive: AtomicU64::new(1),
            wake: Notify::new(),
            changed: Notify::new(),
        }
    }

    pub(crate) fn role(&self) -> Role {
        self.role
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, role: Role) {
        *self.role.lock().unwrap_or_else(PoisonError::into_inner) = role;
        self.changed.notify_waiters();
    }

    /// Until the quota's owner is no longer the one at `url`.
    async fn moved_from(&self, url: &str) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !matches!(self.role(), Role::Follower(u) if u == url) {
                return;
            }
            changed.await;
        }
    }

    /// Whether this instance acts as the quota's owner now.
    pub(crate) fn owns(&self) -> bool {
        matches!(self.role(), Role::Owner(t) if t.owns(Instant::now()))
            && !self.fenced.load(Ordering::SeqCst)
    }

    /// Saves the quota's state (`state`: its snapshot now) under this instance's term, read
    /// with it. Answers whether a reply that waits for it may be given: saved as owner, or
    /// nothing to save (no owner known: the state is this instance's share alone); not
    /// when the term is over or the store did not answer.
    pub(crate) async fn save(&self, state: impl FnOnce() -> Option<Vec<u8>>) -> bool {
        let (term, bytes) = {
            let _t = self
                .transition
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let term = match self.role() {
                Role::Owner(t) if t.owns(Instant::now()) => t,
                Role::Unknown => return true,
                _ => return false,
            };
            let Some(bytes) = state() else { return true };
            (term, bytes)
        };
        match self.cluster.elector.save(&self.key, &term, &bytes).await {
            Ok(Landed::Written) => true,
            Ok(Landed::Fenced) => {
                eprintln!(
                    "tokenwarden: quota {}: the store refused a save under term {}: another instance owns the quota",
                    self.name, term.token
                );
                self.fenced.store(true, Ordering::SeqCst);
                self.wake.notify_one();
                false
            }
            Err(e) => {
                eprintln!(
                    "tokenwarden: quota {}: the state was not saved: {e}",
                    self.name
                );
                false
            }
        }
    }
}

/// One campaign and its consequences for quota `q`; answers when to campaign next.
async fn step(seat: &Seat, q: &Quota) -> Duration {
    let c = &seat.cluster;
    let third = c.ttl / 3;
    let campaign = c.elector.campaign(&seat.key, &c.me, c.ttl).await;
    let before = seat.role();
    match campaign {
        Ok(term) if term.mine => {
            // The same term, still acting (not fenced, its coordinator not closed at a lapse).
            let renewed = matches!(&before, Role::Owner(t) if t.token == term.token)
                && !seat.fenced.load(Ordering::SeqCst)
                && !q.live().tw.is_closed();
            if renewed {
                seat.set(Role::Owner(term));
            } else {
                match c.elector.load(&seat.key).await {
                    Ok(stored) => {
                        let saved = stored.as_ref().and_then(|s| Saved::from_bytes(&s.state));
                        if stored.is_some() && saved.is_none() {
                            eprintln!(
                                "tokenwarden: quota {}: the saved state is not this program's; starting from the config",
                                seat.name
                            );
                        }
                        let token = term.token;
                        if let Err(e) = seat.become_(q, saved, 1, Role::Owner(term.clone())) {
                            eprintln!("tokenwarden: quota {}: cannot take over: {e}", seat.name);
                            let _ = c.elector.resign(&seat.key, &term).await;
                            return third;
                        }
                        seat.fenced.store(false, Ordering::SeqCst);
                        println!(
                            "tokenwarden: quota {}: this instance owns the quota (term {token})",
                            seat.name
                        );
                        // The state restored is saved under the new term at once.
                        q.store.changed(Duration::ZERO);
                    }
                    Err(e) => {
                        eprintln!(
                            "tokenwarden: quota {}: won the owner lease but cannot load the state: {e}",
                            seat.name
                        );
                        return third;
                    }
                }
            }
        }
        Ok(term) => {
            let url = term
                .owner
                .split_once('#')
                .map_or(term.owner.as_str(), |(u, _)| u)
                .to_owned();
            if !matches!(&before, Role::Follower(u) if *u == url) {
                println!(
                    "tokenwarden: quota {}: the quota's owner is {url} (term {})",
                    seat.name, term.token
                );
                if matches!(before, Role::Follower(_)) {
                    seat.set(Role::Follower(url));
                } else {
                    // What this instance granted on its own ends here (calls waiting on it are
                    // answered 503); the owner's state is the quota's.
                    let n = share_of(seat.alive.load(Ordering::SeqCst));
                    if let Err(e) = seat.become_(q, None, n, Role::Follower(url)) {
                        eprintln!("tokenwarden: quota {}: {e}", seat.name);
                    }
                }
            }
        }
        Err(e) => {
            let keep = match &before {
                Role::Owner(t) => t.owns(Instant::now()) && !seat.fenced.load(Ordering::SeqCst),
                Role::Unknown => true,
                Role::Follower(_) => false,
            };
            if !keep {
                seat.on_its_own(q, &e.to_string());
            }
        }
    }
    if let Ok(n) = c.elector.heartbeat(&seat.key, &c.me, c.ttl).await {
        seat.alive.store(n, Ordering::SeqCst);
    }
    match seat.role() {
        Role::Owner(t) => third.min(t.valid_until.saturating_duration_since(Instant::now())),
        _ => third,
    }
}

impl Seat {
    /// Replaces the quota's coordinator (`saved`: the owner's state; else a fresh one of
    /// `share`) and takes `role`, in one step for the writer.
    fn become_(
        &self,
        q: &Quota,
        saved: Option<Saved>,
        share: u32,
        role: Role,
    ) -> Result<(), String> {
        let _t = self
            .transition
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let done = q.replace(saved, share, unix_now());
        self.set(if done.is_ok() { role } else { Role::Unknown });
        done
    }

    /// No owner known (`why`): this instance grants from its share of the quota.
    fn on_its_own(&self, q: &Quota, why: &str) {
        let n = self.alive.load(Ordering::SeqCst);
        if let Err(e) = self.become_(q, None, share_of(n), Role::Unknown) {
            eprintln!("tokenwarden: quota {}: {e}", self.name);
        }
        eprintln!(
            "tokenwarden: quota {}: no owner known ({why}); granting 1/{n} of the quota here until one is",
            self.name
        );
    }
}

fn share_of(n: u64) -> u32 {
    u32::try_from(n.clamp(1, 4096)).unwrap_or(1)
}

/// Campaigns for quota `q`'s seat until the quota is gone. An owner whose term ends before
/// a campaign renews it (the store slow or cut off) stops at the term's end, not when the
/// campaign gives up.
pub(crate) async fn run(seat: Arc<Seat>, q: Weak<Quota>) {
    loop {
        let Some(quota) = q.upgrade() else { return };
        let end = match seat.role() {
            Role::Owner(t) => Some(t.valid_until),
            _ => None,
        };
        let next = {
            let stepping = step(&seat, &quota);
            tokio::pin!(stepping);
            match end {
                None => stepping.await,
                Some(end) => tokio::select! {
                    next = &mut stepping => next,
                    () = tokio::time::sleep_until(end) => {
                        // The term is over: the coordinator grants nothing more (requests are
                        // answered 503 meanwhile), and the campaign's answer decides what next.
                        if matches!(seat.role(), Role::Owner(t) if t.valid_until <= Instant::now()) {
                            quota.live().tw.close();
                            eprintln!(
                                "tokenwarden: quota {}: the owner lease was not renewed in time; this instance decides nothing for the quota until the store answers",
                                seat.name
                            );
                        }
                        stepping.await
                    }
                },
            }
        };
        drop(quota);
        tokio::select! {
            () = tokio::time::sleep(next) => {}
            () = seat.wake.notified() => {}
        }
    }
}

/// The first campaign, before the instance serves (so that it starts knowing its role).
pub(crate) async fn first(seat: &Seat, q: &Quota) {
    let _ = step(seat, q).await;
}

/// At shutdown: the state saved and the term given up, so that another instance takes over
/// at once; this instance no longer counted.
pub(crate) async fn leave(seat: &Seat, q: &Quota) {
    let c = &seat.cluster;
    if let Role::Owner(term) = seat.role() {
        let _ = seat.save(|| Some(q.saved().to_bytes())).await;
        let _ = c.elector.resign(&seat.key, &term).await;
    }
    let _ = c.elector.leave(&seat.key, &c.me).await;
}

/// The hop-by-hop headers, which a forwarded request and its answer do not carry on: the
/// standard ones, `host`, and any `headers` name in `Connection`.
fn hop_by_hop(name: &header::HeaderName, headers: &http::HeaderMap) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
    ) || headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(name.as_str()))
}

/// Forwards a request of the quota to its owner at `url` and hands its answer back as it
/// comes (a stream stays a stream). The body is read first, up to `max` bytes. An owner
/// that stops answering (a machine gone, a process stopped) loses its term, and a request
/// still waiting for its answer's head then gets 503 (retry) rather than hanging on a
/// connection nobody will answer.
pub(crate) async fn forward(
    seat: &Seat,
    url: &str,
    parts: &http::request::Parts,
    body: &mut Incoming,
    max: usize,
) -> Result<Reply, Failure> {
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok());
    let bytes = read_body(body, declared, max).await?;
    let target = format!(
        "{url}{}",
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut req = Request::builder().method(parts.method.clone()).uri(&target);
    for (name, value) in &parts.headers {
        if !hop_by_hop(name, &parts.headers) {
            req = req.header(name, value);
        }
    }
    let req = req
        .header(FORWARDED, HeaderValue::from_static("1"))
        .body(Full::new(bytes))
        .map_err(|e| refusal(400, "invalid_request", format!("cannot forward: {e}")))?;
    let upstream = Upstream::here();
    let res = tokio::select! {
        res = upstream.send(req) => res.map_err(|e| {
            refusal(
                503,
                limiter::OWNER_UNREACHABLE,
                format!("the quota's owner ({url}) could not be reached: {e}; retry"),
            )
        })?,
        () = seat.moved_from(url) => {
            return Err(refusal(
                503,
                limiter::OWNER_MOVED,
                format!("the quota's owner ({url}) stopped answering and its term ended; retry"),
            ));
        }
    };
    let (mut head, incoming) = res.into_parts();
    let hop: Vec<header::HeaderName> = head
        .headers
        .keys()
        .filter(|n| hop_by_hop(n, &head.headers))
        .cloned()
        .collect();
    for n in hop {
        head.headers.remove(n);
    }
    Ok(Response::from_parts(
        head,
        incoming
            .map_err(|e| -> BoxError { Box::new(e) })
            .boxed_unsync(),
    ))
}
