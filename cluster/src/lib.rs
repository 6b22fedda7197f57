//! tokenwarden beyond one machine: one owner per quota, elected in a shared store, with a
//! fencing token.
//!
//! Each quota has one owner at a time: the instance that runs the core for it (every other
//! instance forwards to it). The owner holds an *owner lease* in the store for `ttl` and
//! renews it every third of that; when it cannot, it stops acting as owner at
//! [`Term::valid_until`], measured on its own monotonic clock from the moment it sent the
//! request that took or renewed the lease. The store starts the lease's expiry when it
//! runs the command, which is after that moment, so the store's lease always outlives the
//! owner's belief in it (less a margin for the two clocks' rates, [`MARGIN_DIVISOR`]):
//! when another instance can take the lease, the old owner has already stopped.
//!
//! Every new owner gets a larger *fencing token* ([`Term::token`]). The quota's state is
//! saved under it ([`Elector::save`]), and a save is refused unless its token holds the
//! lease now and no save of a larger token has landed ([`Saved::Fenced`]): an owner that
//! was paused past its lease (a stopped process, a partition) and wakes believing it still
//! owns cannot overwrite its successor's state, and since the owner answers a change only
//! once it is saved, it cannot acknowledge one either.
//!
//! # Failure model
//!
//! - **The owner dies** (killed, its machine gone): its lease lapses within `ttl`; the next
//!   instance to campaign takes it with a larger token, loads the last saved state and
//!   decides from it. Everything the old owner acknowledged was saved first, so no
//!   acknowledged lease is lost (its settle lands on the new owner) and no lease id is
//!   handed out twice to callers who were told of it.
//! - **A partition, or a paused owner**: the old owner stops acting at [`Term::valid_until`]
//!   (its own monotonic clock), before the store's lease ends, so two instances never act as
//!   owner at once unless the store's clock runs more than `1/MARGIN_DIVISOR` faster than the
//!   owner's. If it wakes late and saves anyway, the save is [`Saved::Fenced`].
//! - **Clock skew** between machines does not matter: an owner times its term on its own
//!   monotonic clock from its own send time, and heartbeats are counted by the store's
//!   clock (`TIME` in the script), not the instances'.
//! - **The store unreachable**: no term can be renewed or taken. What a host does then is its
//!   rule; `tokenwarden serve` grants from `1/N` of the quota per instance, `N` the
//!   instances the last heartbeat counted, and takes the owner's state back when the store
//!   answers.
//! - **The store loses its data** (restarted without persistence, or failed over to a
//!   replica that had not seen the last writes): the owner lease can be given again while
//!   the old owner still believes in its term, so for up to one term two instances act as
//!   owner. The old one cannot save (its lease key is gone or not its own): its next reply
//!   that waits for a save fails, and it stops at its term's end; calls it sent meanwhile
//!   were not counted by the new owner. The next owner starts from the state the store has
//!   (none: the quota's config). Run the store with persistence, and one primary.
//! - **A partial partition** (an instance cut off from the store, the owner not): the cut-off
//!   instance grants from its share while the owner grants the whole quota, so the key sees
//!   up to `1 + 1/N` of its limits until the store answers that instance again.
//! - **Calls in flight** when a term ends (its owner lapsed rather than died) run to their
//!   end; the next owner does not count them.
//!
//! [`RedisElector`] speaks to one server: the keys are tagged for one Redis Cluster slot,
//! but the client does not follow a cluster's `MOVED` and `ASK` redirects.
//!
//! [`Elector`] is the whole interface: [`RedisElector`] implements it on Redis or Valkey
//! (a few Lua scripts, every key of a quota in one hash slot); another store (a Kubernetes
//! Lease, a Postgres row) implements the same five calls.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

pub mod redis;
pub mod resp;

pub use redis::RedisElector;

/// The owner stops believing in its lease `ttl / MARGIN_DIVISOR` before the lease's own end
/// on its clock: room for the store's clock to run faster than this one.
pub const MARGIN_DIVISOR: u32 = 10;

/// A quota's name in the store: `tokenwarden:{<fleet>/<quota>}`, the braces a hash tag, so a
/// Redis Cluster keeps every key of a quota in one slot.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QuotaKey(String);

impl QuotaKey {
    /// The key of quota `quota` of fleet `fleet` (names as the config gives them).
    #[must_use]
    pub fn new(fleet: &str, quota: &str) -> QuotaKey {
        // Braces would end the hash tag early: a name holding one is written without it.
        let clean = |s: &str| s.replace(['{', '}'], "_");
        QuotaKey(format!("tokenwarden:{{{}/{}}}", clean(fleet), clean(quota)))
    }

    /// The key of one of the quota's records (`owner`, `token`, `state`, `members`).
    #[must_use]
    pub fn of(&self, record: &str) -> String {
        format!("{}:{record}", self.0)
    }
}

impl fmt::Display for QuotaKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who owns a quota, as a campaign found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    /// The owner's fencing token: larger for every new owner of the quota.
    pub token: u64,
    /// The owner's id (as it campaigned: unique per process, e.g. its URL and a nonce).
    pub owner: String,
    /// Whether the owner is the caller.
    pub mine: bool,
    /// For the caller's own term, until when it may act as owner: the campaign's send time
    /// plus `ttl` less the margin. For another's term, when its lease will have ended if it
    /// is not renewed (no earlier than that may the caller take over).
    pub valid_until: Instant,
}

impl Term {
    /// Whether the caller owns the quota at `now`.
    #[must_use]
    pub fn owns(&self, now: Instant) -> bool {
        self.mine && now < self.valid_until
    }
}

/// A saved state, as [`Elector::load`] finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The token of the owner that saved it.
    pub token: u64,
    /// The state's bytes.
    pub state: Vec<u8>,
}

/// What became of a save.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saved {
    /// Saved.
    Written,
    /// Refused: the term is over (another owner, or the lease lapsed), or a later owner saved.
    Fenced,
}

/// Why the store did not answer as asked: unreachable or slow (past the elector's
/// timeout), refusing (a wrong password), or answering what the elector does not expect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreError {}

/// A call to the store in flight.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Owner election and fenced state for quotas (see the crate doc).
pub trait Elector: Send + Sync {
    /// Takes `quota`'s owner lease for `me` for `ttl` if no one holds it, or renews it if
    /// `me` does; answers who owns it. A lease `me` held before that lapsed is a new term
    /// (a larger token): the caller compares tokens to know.
    fn campaign<'a>(&'a self, quota: &'a QuotaKey, me: &'a str, ttl: Duration)
    -> Pending<'a, Term>;

    /// Gives up `term` (at shutdown) so that another instance takes over at once; nothing
    /// if the term is already over.
    fn resign<'a>(&'a self, quota: &'a QuotaKey, term: &'a Term) -> Pending<'a, ()>;

    /// Saves `state` under `term` (see [`Saved`]).
    fn save<'a>(
        &'a self,
        quota: &'a QuotaKey,
        term: &'a Term,
        state: &'a [u8],
    ) -> Pending<'a, Saved>;

    /// The latest saved state, if any.
    fn load<'a>(&'a self, quota: &'a QuotaKey) -> Pending<'a, Option<Stored>>;

    /// Says `me` is alive for `ttl`; answers how many instances are (at least 1), by the
    /// store's clock, not the instances' own.
    fn heartbeat<'a>(&'a self, quota: &'a QuotaKey, me: &'a str, ttl: Duration)
    -> Pending<'a, u64>;

    /// Says `me` is gone (at shutdown).
    fn leave<'a>(&'a self, quota: &'a QuotaKey, me: &'a str) -> Pending<'a, ()>;
}

/// The end of a term the caller took or renewed with a request sent at `sent`.
#[must_use]
pub fn term_end(sent: Instant, ttl: Duration) -> Instant {
    sent + ttl.saturating_sub(ttl / MARGIN_DIVISOR)
}
