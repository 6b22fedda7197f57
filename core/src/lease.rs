//! The lease table: a slab of live leases and queued tickets with generation-checked ids,
//! and the expiry queue.

use alloc::collections::{BTreeSet, BinaryHeap, VecDeque};
use alloc::vec::Vec;
use core::cmp::Reverse;
use serde::{Deserialize, Serialize};

use crate::AgentId;
use crate::bucket::Demand;
use crate::ids::{GEN_MASK, LeaseId, TaskId};
use crate::queue::Key;
use crate::request::Ask;
use crate::time::Millis;

fn no_promise() -> Millis {
    Millis::MAX
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_false(b: &bool) -> bool {
    !*b
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

fn is_zero_u8(n: &u8) -> bool {
    *n == 0
}

// Externally tagged: serde's buffering of internally tagged enums cannot hold a u128.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Phase {
    Queued {
        key: Key,
        vstart: u128,
        enqueued_at: Millis,
        /// The bound the ticket was promised (its queued decision's `eta`, or the latest
        /// revision of it: see `coordinator/promise.rs`). A ticket stored before promises
        /// were kept has none (`Millis::MAX`) and is never revised.
        #[serde(default = "no_promise")]
        promised: Millis,
        /// The refill time, ms, of the demand queued ahead of it and its own when it was
        /// queued (0 for none): its wait against it teaches the pool's expected waits.
        #[serde(default, skip_serializing_if = "is_zero_u64")]
        in_line_ms: u64,
        /// A `Revised` event for it waits in the event queue: a later revision updates
        /// `promised`, which the event carries when it is polled (one pending event per
        /// ticket, however many revisions).
        #[serde(default, skip_serializing_if = "is_false")]
        revising: bool,
        /// The pool's debt delay (`Pool::delay`) when its promise was last checked
        /// against its bound, and that plus the promise's slack over the bound then: the
        /// promise needs checking again only once the pool's delay passes `budget` (see
        /// `coordinator/promise.rs`).
        #[serde(default, skip_serializing_if = "is_zero_u64")]
        checked: u64,
        #[serde(default, skip_serializing_if = "is_zero_u64")]
        budget: u64,
        /// A warm-cache bump the ticket is due while it waits (see
        /// [`LeaseTable::schedule_bump`]); in the table's bump set at the same instant.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bump: Option<Bump>,
    },
    Active {
        granted_at: Millis,
        expires_at: Millis,
        /// The reservation by the pool's counting rules.
        charged: Demand,
        /// Bit per axis (in `Axis::ALL` order) the reservation was taken from.
        gated: u8,
        rate_limited: bool,
        /// The input bucket's level (token-ms) right after this lease was taken from it,
        /// which bounds a late refund (see `Bucket::refund_room`).
        grant_level: i128,
        /// Bit per axis (charged on arrival) whose level was set from a remaining figure
        /// on this lease's own answer, which holds its real usage (and so does every
        /// figure the level follows after it, see `Pool::figure_bound`): settled there with
        /// no refund and no debt, and held in later figures.
        #[serde(default, skip_serializing_if = "is_zero_u8")]
        held: u8,
    },
}

/// A queued ticket's pending warm-cache bump: at `at` its agent's prompt cache comes within
/// the bump window, and the ticket's place is recomputed with weight `weight`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Bump {
    pub(crate) at: Millis,
    pub(crate) weight: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub(crate) id: LeaseId,
    pub(crate) agent: AgentId,
    /// The agent's slot in the agent table (see `crate::agents`).
    pub(crate) agent_slot: u32,
    pub(crate) pool: u32,
    pub(crate) ask: Ask,
    pub(crate) phase: Phase,
    /// The task the lease is charged to, if the request named one the table holds.
    #[serde(default)]
    pub(crate) task: Option<TaskId>,
    /// Its place's price in the fair order: the weight it was placed with and the virtual
    /// time its dominant share cost at that weight (what its agent's latest virtual finish
    /// moved by). A settle corrects the agent's virtual finish to what the call used; a
    /// lease stored before these existed (weight 0) is not corrected.
    #[serde(default)]
    pub(crate) fair: Fair,
}

/// The weight a lease was placed in the fair order with, the virtual time it cost,
/// whether it was its agent's first call in the pool (placed by at most a quantum), and
/// whether it was placed by its agent's small-call clock (see `weight::small`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Fair {
    pub(crate) weight: u64,
    pub(crate) cost: u128,
    #[serde(default, skip_serializing_if = "core::ops::Not::not")]
    pub(crate) first: bool,
    #[serde(default, skip_serializing_if = "core::ops::Not::not")]
    pub(crate) small: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Slot {
    generation: u32,
    entry: Option<Entry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LeaseTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: u32,
    /// (expires_at, id) in grant (or renewal) order, which is expiry order because the TTL
    /// is fixed and time never goes back. Entries of leases that ended early, or were
    /// renewed since, are skipped when reached.
    expiries: VecDeque<(Millis, LeaseId)>,
    /// (at, id) of every queued ticket with a pending [`Bump`], earliest first: exactly
    /// the tickets whose phase names one, at the same instant.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    bumps: BTreeSet<(Millis, LeaseId)>,
    /// Per pool, min-heaps of (promise, id) and (budget, id) of its queued tickets with a
    /// promise, so the lapsing promises and those a debt may have moved are found without
    /// a walk over the line. Derived from the entries (rebuilt on restore, see
    /// [`LeaseTable::rebuild_index`]): an entry whose ticket was granted, withdrawn or
    /// re-promised since stays until it reaches the top, where it is dropped (no top is
    /// ever stale), or until the heap holds twice its tickets and is rebuilt.
    #[serde(skip)]
    index: Derived<Vec<PoolIndex>>,
}

/// A pool's promise and budget heaps (see [`LeaseTable`]).
#[derive(Clone, Debug, Default)]
struct PoolIndex {
    promises: BinaryHeap<Reverse<(Millis, LeaseId)>>,
    budgets: BinaryHeap<Reverse<(u64, LeaseId)>>,
    /// Its queued tickets with a promise.
    tickets: usize,
}

/// State derived from the rest of a structure: not stored, and not part of its equality
/// (two tables with the same entries are equal whatever their heaps hold).
#[derive(Clone, Debug, Default)]
struct Derived<T>(T);

impl<T> PartialEq for Derived<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<T> Eq for Derived<T> {}

impl LeaseTable {
    pub(crate) fn new() -> LeaseTable {
        LeaseTable {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            expiries: VecDeque::new(),
            bumps: BTreeSet::new(),
            index: Derived(Vec::new()),
        }
    }

    /// Whether `e` is a queued ticket promised `at` (an entry of its promise heap that
    /// still stands).
    fn promised_at(e: Option<&Entry>, at: Millis) -> bool {
        matches!(e, Some(Entry { phase: Phase::Queued { promised, .. }, .. }) if *promised == at)
    }

    /// Whether `e` is a queued ticket with budget `b` (an entry of its budget heap that
    /// still stands).
    fn budgeted(e: Option<&Entry>, b: u64) -> bool {
        matches!(e, Some(Entry { phase: Phase::Queued { budget, promised, .. }, .. }) if *budget == b && *promised != Millis::MAX)
    }

    /// Adds queued entry `e`'s promise and budget to its pool's heaps (nothing for a
    /// granted one, or one stored before promises were kept).
    fn index_add(&mut self, e: &Entry) {
        let Phase::Queued {
            promised, budget, ..
        } = e.phase
        else {
            return;
        };
        if promised == Millis::MAX {
            return;
        }
        // The coordinator makes tickets of its pools only (a restored table is rebuilt
        // for them first).
        let p = e.pool as usize;
        if self.index.0.len() <= p {
            self.index
                .0
                .resize_with(p.saturating_add(1), PoolIndex::default);
        }
        if let Some(ix) = self.index.0.get_mut(p) {
            ix.promises.push(Reverse((promised, e.id)));
            ix.budgets.push(Reverse((budget, e.id)));
        }
    }

    /// Whether `e` is a queued ticket with a promise (one its pool's heaps index).
    fn has_promise(e: &Entry) -> bool {
        matches!(e.phase, Phase::Queued { promised, .. } if promised != Millis::MAX)
    }

    /// Counts a ticket with a promise in or out of pool `pool`'s tickets (its heap entries
    /// go stale on their own), then drops stale tops and rebuilds heaps grown past twice
    /// their tickets.
    fn index_count(&mut self, pool: u32, add: bool) {
        if let Some(ix) = self.index.0.get_mut(pool as usize) {
            ix.tickets = if add {
                ix.tickets.saturating_add(1)
            } else {
                ix.tickets.saturating_sub(1)
            };
        }
        self.tidy(pool);
    }

    /// Drops pool `pool`'s stale heap tops; rebuilds a heap holding more than twice its
    /// tickets (and 16).
    fn tidy(&mut self, pool: u32) {
        // Both tops standing and neither heap past its bound (the common case): nothing to do.
        if let Some(ix) = self.index.0.get(pool as usize) {
            let limit = ix.tickets.saturating_mul(2).saturating_add(16);
            let fine = ix.promises.len() <= limit
                && ix.budgets.len() <= limit
                && ix
                    .promises
                    .peek()
                    .is_none_or(|&Reverse((at, id))| Self::promised_at(self.get(id), at))
                && ix
                    .budgets
                    .peek()
                    .is_none_or(|&Reverse((b, id))| Self::budgeted(self.get(id), b));
            if fine {
                return;
            }
        }
        let Some(mut ix) = self.index.0.get_mut(pool as usize).map(core::mem::take) else {
            return;
        };
        let limit = ix.tickets.saturating_mul(2).saturating_add(16);
        if ix.promises.len() > limit || ix.budgets.len() > limit {
            ix = self.index_of(pool);
        }
        while let Some(&Reverse((at, id))) = ix.promises.peek() {
            if Self::promised_at(self.get(id), at) {
                break;
            }
            ix.promises.pop();
        }
        while let Some(&Reverse((b, id))) = ix.budgets.peek() {
            if Self::budgeted(self.get(id), b) {
                break;
            }
            ix.budgets.pop();
        }
        if let Some(slot) = self.index.0.get_mut(pool as usize) {
            *slot = ix;
        }
    }

    /// The heaps from the entries, for `pools` pools (after a restore: they are not
    /// stored; an entry naming a pool past them is left out, and refused by the check).
    pub(crate) fn rebuild_index(&mut self, pools: usize) {
        let index = (0..pools)
            .map(|p| self.index_of(u32::try_from(p).unwrap_or(u32::MAX)))
            .collect();
        self.index.0 = index;
    }

    /// Pool `pool`'s heaps built from its tickets with a promise, in one pass (each heap
    /// made from its entries at once: linear, not a push per entry).
    fn index_of(&self, pool: u32) -> PoolIndex {
        let (mut promises, mut budgets) = (Vec::new(), Vec::new());
        for e in self.entries().filter(|e| e.pool == pool) {
            if let Phase::Queued {
                promised, budget, ..
            } = e.phase
            {
                if promised != Millis::MAX {
                    promises.push(Reverse((promised, e.id)));
                    budgets.push(Reverse((budget, e.id)));
                }
            }
        }
        PoolIndex {
            tickets: promises.len(),
            promises: BinaryHeap::from(promises),
            budgets: BinaryHeap::from(budgets),
        }
    }

    /// Sets queued ticket `id`'s promise and its check (`checked`, `budget`: see
    /// [`Phase::Queued`]), keeping the heaps. Returns the promise it had.
    pub(crate) fn set_promise(
        &mut self,
        id: LeaseId,
        promise: Millis,
        (check, within): (u64, u64),
    ) -> Option<Millis> {
        let Some(Entry {
            phase:
                Phase::Queued {
                    promised,
                    checked,
                    budget,
                    ..
                },
            ..
        }) = self.get_mut(id)
        else {
            return None;
        };
        let old = core::mem::replace(promised, promise);
        *checked = check;
        *budget = within;
        let e = *self.get(id)?;
        // A promise of the end of time (a bound that never comes: no refill) is no
        // promise: the ticket is out of the heaps while it has one.
        if (old == Millis::MAX) != (promise == Millis::MAX) {
            if let Some(ix) = self.index.0.get_mut(e.pool as usize) {
                ix.tickets = if promise == Millis::MAX {
                    ix.tickets.saturating_sub(1)
                } else {
                    ix.tickets.saturating_add(1)
                };
            }
        }
        self.index_add(&e);
        self.tidy(e.pool);
        Some(old)
    }

    /// A queued ticket granted: its phase becomes `phase` and it leaves the heaps.
    pub(crate) fn activate(&mut self, id: LeaseId, phase: Phase) {
        let Some(entry) = self.get_mut(id) else {
            return;
        };
        let (pool, indexed) = (entry.pool, Self::has_promise(entry));
        entry.phase = phase;
        if indexed {
            self.index_count(pool, false);
        }
    }

    /// Takes pool `pool`'s tickets promised at or before `now` off its promise heap,
    /// earliest first: each is to be promised anew ([`LeaseTable::set_promise`]).
    pub(crate) fn take_lapsed(&mut self, pool: u32, now: Millis) -> Vec<LeaseId> {
        self.take_due(
            pool,
            |ix| &mut ix.promises,
            |at| at <= now,
            Self::promised_at,
        )
    }

    /// Pool `pool`'s earliest promise.
    pub(crate) fn first_promise(&self, pool: u32) -> Option<Millis> {
        let ix = self.index.0.get(pool as usize)?;
        ix.promises.peek().map(|Reverse((at, _))| *at)
    }

    /// Takes pool `pool`'s tickets whose budget is below `delay` off its budget heap:
    /// promises a debt may have moved, each to be checked ([`LeaseTable::set_promise`]).
    pub(crate) fn take_over_budget(&mut self, pool: u32, delay: u64) -> Vec<LeaseId> {
        self.take_due(pool, |ix| &mut ix.budgets, |b| b < delay, Self::budgeted)
    }

    /// Pops the entries of one of pool `pool`'s heaps (`heap`) while `due`, returning the
    /// tickets of those that still stand (`stands`), in heap order. The caller promises
    /// each anew ([`LeaseTable::set_promise`] drops the stale tops of both heaps); if none
    /// stood, the stale tops are dropped here: [`LeaseTable::first_promise`] is always a
    /// standing promise.
    fn take_due<K: Ord + Copy>(
        &mut self,
        pool: u32,
        heap: impl Fn(&mut PoolIndex) -> &mut BinaryHeap<Reverse<(K, LeaseId)>>,
        due: impl Fn(K) -> bool,
        stands: impl Fn(Option<&Entry>, K) -> bool,
    ) -> Vec<LeaseId> {
        let mut out = Vec::new();
        // Nothing due (the common case): the heap is left as it is.
        match self
            .index
            .0
            .get_mut(pool as usize)
            .map(|ix| heap(ix).peek().copied())
        {
            Some(Some(Reverse((k, _)))) if due(k) => {}
            _ => return out,
        }
        let Some(mut ix) = self.index.0.get_mut(pool as usize).map(core::mem::take) else {
            return out;
        };
        let h = heap(&mut ix);
        let mut popped = false;
        while let Some(&Reverse((k, id))) = h.peek() {
            if !due(k) {
                break;
            }
            h.pop();
            popped = true;
            if stands(self.get(id), k) {
                out.push(id);
            }
        }
        if let Some(slot) = self.index.0.get_mut(pool as usize) {
            *slot = ix;
        }
        // The tickets taken are promised anew, which tidies; if only stale entries were
        // popped, tidy here.
        if popped && out.is_empty() {
            self.tidy(pool);
        }
        out
    }

    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    /// Allocates a slot; `make` builds the entry from its id.
    #[inline]
    pub(crate) fn insert(&mut self, make: impl FnOnce(LeaseId) -> Entry) -> LeaseId {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    entry: None,
                });
                u32::try_from(self.slots.len().saturating_sub(1)).unwrap_or(u32::MAX)
            }
        };
        let mut id = LeaseId(0);
        if let Some(s) = self.slots.get_mut(slot as usize) {
            s.generation = (s.generation % GEN_MASK) + 1;
            id = LeaseId::new(slot, s.generation);
            s.entry = Some(make(id));
        }
        // Only a ticket with a promise goes in the heaps (a grant is not copied for it).
        if let Some(e) = self.get(id).filter(|e| Self::has_promise(e)).copied() {
            self.index_add(&e);
            self.index_count(e.pool, true);
        }
        self.live = self.live.saturating_add(1);
        id
    }

    #[inline]
    pub(crate) fn get(&self, id: LeaseId) -> Option<&Entry> {
        let s = self.slots.get(id.slot() as usize)?;
        if s.generation != id.generation() {
            return None;
        }
        s.entry.as_ref()
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, id: LeaseId) -> Option<&mut Entry> {
        let s = self.slots.get_mut(id.slot() as usize)?;
        if s.generation != id.generation() {
            return None;
        }
        s.entry.as_mut()
    }

    #[inline]
    pub(crate) fn by_slot(&self, slot: u32) -> Option<&Entry> {
        self.slots.get(slot as usize)?.entry.as_ref()
    }

    pub(crate) fn slot_of(id: LeaseId) -> u32 {
        id.slot()
    }

    #[inline(always)]
    pub(crate) fn remove(&mut self, id: LeaseId) -> Option<Entry> {
        let s = self.slots.get_mut(id.slot() as usize)?;
        if s.generation != id.generation() {
            return None;
        }
        let e = s.entry.take()?;
        if let Phase::Queued { bump: Some(b), .. } = e.phase {
            self.bumps.remove(&(b.at, id));
        }
        if Self::has_promise(&e) {
            self.index_count(e.pool, false);
        }
        self.free.push(id.slot());
        self.live = self.live.saturating_sub(1);
        Some(e)
    }

    #[inline]
    pub(crate) fn push_expiry(&mut self, at: Millis, id: LeaseId, max_leases: u32) {
        self.expiries.push_back((at, id));
        if self.expiries.len() > (max_leases as usize).saturating_mul(2).saturating_add(16) {
            let slots = &self.slots;
            self.expiries.retain(|(at, id)| {
                slots.get(id.slot() as usize).is_some_and(|s| {
                    s.generation == id.generation()
                        && matches!(s.entry, Some(Entry { phase: Phase::Active { expires_at, .. }, .. }) if expires_at == *at)
                })
            });
        }
    }

    #[inline]
    fn is_due(&self, at: Millis, id: LeaseId) -> bool {
        matches!(
            self.get(id),
            Some(Entry { phase: Phase::Active { expires_at, .. }, .. }) if *expires_at == at
        )
    }

    /// Drops entries at the front of the expiry queue whose leases already ended, so the
    /// front is always a live lease and [`LeaseTable::next_expiry`] is exact.
    #[inline]
    pub(crate) fn prune_expiries(&mut self) {
        while let Some(&(at, id)) = self.expiries.front() {
            if self.is_due(at, id) {
                return;
            }
            self.expiries.pop_front();
        }
    }

    /// The earliest expiry of a live lease (the front is kept live by `prune_expiries`).
    #[inline]
    pub(crate) fn next_expiry(&self) -> Option<Millis> {
        self.expiries.front().map(|(at, _)| *at)
    }

    /// The expiries of pool `pool`'s granted leases, earliest first, at most `k` of them.
    pub(crate) fn expiries_in(&self, pool: u32, k: usize) -> Vec<Millis> {
        let mut out = Vec::new();
        for &(at, id) in &self.expiries {
            if out.len() >= k {
                break;
            }
            if self.is_due(at, id) && self.get(id).is_some_and(|e| e.pool == pool) {
                out.push(at);
            }
        }
        out
    }

    /// Pops the next lease due at or before `now` that is still active.
    #[inline]
    pub(crate) fn pop_expired(&mut self, now: Millis) -> Option<LeaseId> {
        while let Some(&(at, id)) = self.expiries.front() {
            if at > now {
                return None;
            }
            self.expiries.pop_front();
            if self.is_due(at, id) {
                return Some(id);
            }
        }
        None
    }

    /// Gives queued ticket `id` a pending bump (replacing any it had).
    pub(crate) fn schedule_bump(&mut self, id: LeaseId, bump: Option<Bump>) {
        let Some(Entry {
            phase: Phase::Queued { bump: old, .. },
            ..
        }) = self.get_mut(id)
        else {
            return;
        };
        let prev = core::mem::replace(old, bump);
        if let Some(b) = prev {
            self.bumps.remove(&(b.at, id));
        }
        if let Some(b) = bump {
            self.bumps.insert((b.at, id));
        }
    }

    /// The earliest pending bump.
    pub(crate) fn next_bump(&self) -> Option<Millis> {
        self.bumps.first().map(|(at, _)| *at)
    }

    /// Takes the earliest pending bump due at or before `now`: the ticket and its bump,
    /// which is no longer pending.
    pub(crate) fn pop_bump(&mut self, now: Millis) -> Option<(LeaseId, Bump)> {
        while let Some(&(at, id)) = self.bumps.first().filter(|(at, _)| *at <= now) {
            self.bumps.remove(&(at, id));
            if let Some(Entry {
                phase: Phase::Queued { bump, .. },
                ..
            }) = self.get_mut(id)
            {
                if let Some(b) = bump.take() {
                    return Some((id, b));
                }
            }
        }
        None
    }

    /// Live entries in slot order (allocates; for metrics and checks).
    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().filter_map(|s| s.entry.as_ref())
    }

    pub(crate) fn is_consistent(&self) -> bool {
        let live = self.slots.iter().filter(|s| s.entry.is_some()).count();
        // Each free slot empty and listed once: a slot listed twice would be handed out
        // twice.
        let mut listed = alloc::vec![false; self.slots.len()];
        let free_ok = self.free.iter().all(|f| {
            let empty = self
                .slots
                .get(*f as usize)
                .is_some_and(|s| s.entry.is_none());
            match listed.get_mut(*f as usize) {
                Some(l) if empty && !*l => {
                    *l = true;
                    true
                }
                _ => false,
            }
        });
        let ids_ok = self.slots.iter().enumerate().all(|(i, s)| {
            s.entry
                .is_none_or(|e| e.id.slot() as usize == i && e.id.generation() == s.generation)
        });
        // The expiry queue in expiry order (`pop_expired` stops at the first entry not
        // due), and every granted lease in it at its expiry: one missing would never be
        // reaped, and its reservation and concurrency slot would be held forever.
        let ordered = self
            .expiries
            .iter()
            .zip(self.expiries.iter().skip(1))
            .all(|(a, b)| a.0 <= b.0);
        let queued: alloc::collections::BTreeSet<(Millis, LeaseId)> =
            self.expiries.iter().copied().collect();
        let expiries_ok = ordered
            && self.entries().all(|e| match e.phase {
                Phase::Active { expires_at, .. } => queued.contains(&(expires_at, e.id)),
                Phase::Queued { .. } => true,
            });
        // The bump set and the tickets' pending bumps one to one.
        let pending = self
            .entries()
            .filter(|e| match e.phase {
                Phase::Queued { bump: Some(b), .. } => self.bumps.contains(&(b.at, e.id)),
                _ => false,
            })
            .count();
        let bumps_ok = pending == self.bumps.len();
        // Every queued ticket's promise and budget in its pool's heaps, their tops
        // standing, and the ticket counts right.
        let index_ok = self.entries().all(|e| match e.phase {
            Phase::Queued { promised, budget, .. } if promised != Millis::MAX => self
                .index
                .0
                .get(e.pool as usize)
                .is_some_and(|ix| {
                    ix.promises.iter().any(|r| r.0 == (promised, e.id))
                        && ix.budgets.iter().any(|r| r.0 == (budget, e.id))
                }),
            _ => true,
        }) && self.index.0.iter().enumerate().all(|(p, ix)| {
            let p = u32::try_from(p).unwrap_or(u32::MAX);
            let tickets = self
                .entries()
                .filter(|e| e.pool == p && matches!(e.phase, Phase::Queued { promised, .. } if promised != Millis::MAX))
                .count();
            ix.tickets == tickets
                && ix.promises.peek().is_none_or(|r| Self::promised_at(self.get(r.0.1), r.0.0))
                && ix.budgets.peek().is_none_or(|r| Self::budgeted(self.get(r.0.1), r.0.0))
        });
        live == self.live as usize
            && bumps_ok
            && index_ok
            && free_ok
            && ids_ok
            && expiries_ok
            && self.free.len() + live == self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: LeaseId) -> Entry {
        Entry {
            id,
            agent: AgentId(1),
            agent_slot: 0,
            pool: 0,
            ask: Ask {
                input_tokens: 1,
                cached_prefix_tokens: 0,
                cached_prefix_confirmed: false,
                max_tokens: 1,
                output: 1,
            },
            phase: Phase::Queued {
                key: Key { vfinish: 0, seq: 0 },
                vstart: 0,
                enqueued_at: Millis(0),
                promised: Millis(0),
                in_line_ms: 0,
                revising: false,
                checked: 0,
                budget: 0,
                bump: None,
            },
            task: None,
            fair: Fair::default(),
        }
    }

    #[test]
    fn a_free_slot_listed_twice_is_inconsistent() {
        let mut t = LeaseTable::new();
        let a = t.insert(entry);
        let _b = t.insert(entry);
        assert!(t.remove(a).is_some());
        assert!(t.is_consistent());

        let mut dup = t.clone();
        dup.free.push(LeaseTable::slot_of(a));
        dup.slots.push(Slot {
            generation: 0,
            entry: None,
        });
        assert!(
            !dup.is_consistent(),
            "the same slot would be handed out twice"
        );

        let mut live = t.clone();
        live.free = alloc::vec![1];
        assert!(!live.is_consistent(), "a live slot on the free list");
    }
}
