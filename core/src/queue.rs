//! The weighted fair queue: a treap keyed by virtual finish time, augmented with the
//! demand of each subtree so the demand queued ahead of any key is an O(log n) query.
//!
//! Nodes live in an arena with a free list, so once the queue has reached its largest
//! size, inserting and popping allocate nothing. A node's priority is a hash of its
//! sequence number (a bijection, so no two live tickets share one): the shape is
//! deterministic, depends only on the set of tickets, and survives snapshot/restore.
//!
//! The arena is split in two parallel vectors: what a walk down the tree reads (key,
//! children, subtree demand) is one 64-byte, cache-line-aligned [`Node`]; the ticket's
//! own demand and lease slot sit apart in a [`Ticket`]. The head (smallest key) is
//! cached, so peeking at it is O(1). Inserting walks down once and reports the demand
//! queued ahead of the new key in the same pass.

use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::bucket::Demand;

const NIL: u32 = u32::MAX;

/// Position in the queue: virtual finish time, then arrival order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct Key {
    pub(crate) vfinish: u128,
    pub(crate) seq: u64,
}

/// The part of a queue entry a walk down the tree reads: exactly one cache line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[repr(C, align(64))]
struct Node {
    /// The key's virtual finish time, high and low 64 bits (a `u128` would pad the node
    /// past a cache line).
    vfinish_hi: u64,
    vfinish_lo: u64,
    seq: u64,
    left: u32,
    right: u32,
    /// Demand of the subtree rooted here (saturating).
    sum: Demand,
}

/// The rest of a queue entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Ticket {
    demand: Demand,
    /// The lease-table slot this ticket belongs to.
    slot: u32,
}

impl Node {
    fn key(&self) -> Key {
        Key {
            vfinish: (u128::from(self.vfinish_hi) << 64) | u128::from(self.vfinish_lo),
            seq: self.seq,
        }
    }

    /// The heap priority: a fixed hash of the sequence number.
    fn prio(&self) -> u64 {
        mix(self.seq)
    }
}

/// What a free arena entry holds, so that an entry's past never shows in a snapshot and an
/// undone insert leaves the arena exactly as it was.
const FREE_NODE: Node = Node {
    vfinish_hi: 0,
    vfinish_lo: 0,
    seq: 0,
    left: NIL,
    right: NIL,
    sum: Demand([0; 4]),
};
const FREE_TICKET: Ticket = Ticket {
    demand: Demand([0; 4]),
    slot: NIL,
};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Queue {
    nodes: Vec<Node>,
    /// Parallel to `nodes`.
    tickets: Vec<Ticket>,
    free: Vec<u32>,
    root: u32,
    /// The node with the smallest key (`NIL` when empty).
    head: u32,
    len: u32,
}

impl Default for Queue {
    fn default() -> Self {
        Queue::new()
    }
}

/// Where a subtree hangs: the root, or a node's left or right child.
#[derive(Clone, Copy)]
enum Link {
    Root,
    Left(u32),
    Right(u32),
}

/// A ticket just inserted: its arena entry and the demand queued ahead of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Inserted {
    node: u32,
    /// The arena grew by this entry (rather than reusing a free one).
    fresh: bool,
    /// Total demand of the tickets with a smaller key (saturating), exactly what a separate
    /// walk summing the tickets below the key would give.
    pub(crate) before: Demand,
}

fn mix(seq: u64) -> u64 {
    let mut z = seq.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Queue {
    pub(crate) fn new() -> Queue {
        Queue {
            nodes: Vec::new(),
            tickets: Vec::new(),
            free: Vec::new(),
            root: NIL,
            head: NIL,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn node(&self, i: u32) -> Option<&Node> {
        self.nodes.get(i as usize)
    }

    fn ticket(&self, i: u32) -> Option<&Ticket> {
        self.tickets.get(i as usize)
    }

    fn demand_of(&self, i: u32) -> Demand {
        self.ticket(i).map(|t| t.demand).unwrap_or_default()
    }

    fn sum_of(&self, i: u32) -> Demand {
        self.node(i).map(|n| n.sum).unwrap_or_default()
    }

    fn set_children(&mut self, i: u32, left: u32, right: u32) {
        let sum = self
            .sum_of(left)
            .saturating_add(self.demand_of(i))
            .saturating_add(self.sum_of(right));
        if let Some(n) = self.nodes.get_mut(i as usize) {
            n.left = left;
            n.right = right;
            n.sum = sum;
        }
    }

    /// Points `link` at `child`.
    fn relink(&mut self, link: Link, child: u32) {
        match link {
            Link::Root => self.root = child,
            Link::Left(p) => {
                if let Some(n) = self.nodes.get_mut(p as usize) {
                    n.left = child;
                }
            }
            Link::Right(p) => {
                if let Some(n) = self.nodes.get_mut(p as usize) {
                    n.right = child;
                }
            }
        }
    }

    /// The leftmost node under `t` (`NIL` for an empty subtree).
    fn leftmost(&self, mut t: u32) -> u32 {
        while let Some(n) = self.node(t) {
            if n.left == NIL {
                return t;
            }
            t = n.left;
        }
        NIL
    }

    /// Splits `t` into keys `< key` and keys `>= key`.
    fn split(&mut self, t: u32, key: Key) -> (u32, u32) {
        let Some(n) = self.node(t) else {
            return (NIL, NIL);
        };
        let (nk, l, r) = (n.key(), n.left, n.right);
        if nk < key {
            let (a, b) = self.split(r, key);
            self.set_children(t, l, a);
            (t, b)
        } else {
            let (a, b) = self.split(l, key);
            self.set_children(t, b, r);
            (a, t)
        }
    }

    /// Joins two treaps where every key of `a` is below every key of `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        let (Some(na), Some(nb)) = (self.node(a), self.node(b)) else {
            return if a == NIL { b } else { a };
        };
        if na.prio() >= nb.prio() {
            let (al, ar) = (na.left, na.right);
            let m = self.merge(ar, b);
            self.set_children(a, al, m);
            a
        } else {
            let (bl, br) = (nb.left, nb.right);
            let m = self.merge(a, bl);
            self.set_children(b, m, br);
            b
        }
    }

    /// Adds a ticket (keys are unique because `seq` is) and returns, from the same walk,
    /// the demand queued ahead of it. The result is the treap the set of tickets
    /// determines, whatever the order they came in.
    pub(crate) fn insert(&mut self, key: Key, demand: Demand, slot: u32) -> Inserted {
        let node = Node {
            vfinish_hi: (key.vfinish >> 64) as u64,
            vfinish_lo: key.vfinish as u64,
            seq: key.seq,
            left: NIL,
            right: NIL,
            sum: demand,
        };
        let ticket = Ticket { demand, slot };
        let (i, fresh) = match self.free.pop() {
            Some(i) => {
                if let Some(n) = self.nodes.get_mut(i as usize) {
                    *n = node;
                }
                if let Some(t) = self.tickets.get_mut(i as usize) {
                    *t = ticket;
                }
                (i, false)
            }
            None => {
                self.nodes.push(node);
                self.tickets.push(ticket);
                let i = u32::try_from(self.nodes.len().saturating_sub(1)).unwrap_or(NIL);
                (i, true)
            }
        };
        // Walk down while the nodes stay above the new one (higher priority). Each of them
        // gains `demand` (sums are saturating sums of non-negative figures, so adding it
        // here is exact); each one passed on the left is ahead of the new key, with its
        // left subtree.
        let prio = mix(key.seq);
        let mut before = Demand::default();
        let mut link = Link::Root;
        let mut t = self.root;
        while let Some(n) = self.nodes.get_mut(t as usize) {
            if prio > n.prio() {
                break;
            }
            n.sum = n.sum.saturating_add(demand);
            if n.key() < key {
                let (l, r) = (n.left, n.right);
                before = before
                    .saturating_add(self.sum_of(l))
                    .saturating_add(self.demand_of(t));
                link = Link::Right(t);
                t = r;
            } else {
                link = Link::Left(t);
                t = n.left;
            }
        }
        // The new node takes the place of the subtree `t`, split around it.
        let (a, b) = self.split(t, key);
        before = before.saturating_add(self.sum_of(a));
        self.set_children(i, a, b);
        self.relink(link, i);
        if self.node(self.head).is_none_or(|h| key < h.key()) {
            self.head = i;
        }
        self.len = self.len.saturating_add(1);
        Inserted {
            node: i,
            fresh,
            before,
        }
    }

    /// Takes back the ticket `insert` just added (nothing else may have changed the queue
    /// in between): the queue, arena and free list are exactly as before the insert.
    pub(crate) fn undo_insert(&mut self, key: Key, inserted: Inserted) {
        if self.remove(key).is_some() && inserted.fresh && self.free.last() == Some(&inserted.node)
        {
            self.free.pop();
            self.nodes.pop();
            self.tickets.pop();
        }
    }

    /// Records the lease-table slot of an inserted ticket.
    pub(crate) fn set_slot(&mut self, inserted: Inserted, slot: u32) {
        if let Some(t) = self.tickets.get_mut(inserted.node as usize) {
            t.slot = slot;
        }
    }

    /// The ticket with the smallest key: (key, demand, slot).
    pub(crate) fn peek_min(&self) -> Option<(Key, Demand, u32)> {
        let n = self.node(self.head)?;
        let t = self.ticket(self.head)?;
        Some((n.key(), t.demand, t.slot))
    }

    /// The last key in line (O(depth)).
    pub(crate) fn last_key(&self) -> Option<Key> {
        let mut n = self.node(self.root)?;
        while let Some(r) = self.node(n.right) {
            n = r;
        }
        Some(n.key())
    }

    /// Clears arena entry `i` and puts it on the free list.
    fn release(&mut self, i: u32) {
        if let Some(n) = self.nodes.get_mut(i as usize) {
            *n = FREE_NODE;
        }
        if let Some(t) = self.tickets.get_mut(i as usize) {
            *t = FREE_TICKET;
        }
        self.free.push(i);
    }

    /// Removes the head (the ticket [`Queue::peek_min`] shows); returns its slot. The head
    /// is the bottom of the left spine, so this walks down the spine only, once.
    pub(crate) fn pop_head(&mut self) -> Option<u32> {
        let h = self.head;
        let (key, right) = self.node(h).map(|n| (n.key(), n.right))?;
        let Ticket { demand, slot } = self.ticket(h)?.clone();
        // Each spine node above the head loses its demand; a saturated sum cannot be
        // lowered exactly, and then the general removal (which recomputes) takes over.
        let mut parent = NIL;
        let mut t = self.root;
        while t != h {
            let Some(n) = self.nodes.get_mut(t as usize) else {
                break;
            };
            if n.sum.0.contains(&u64::MAX) {
                break;
            }
            for (s, d) in n.sum.0.iter_mut().zip(demand.0) {
                *s = s.saturating_sub(d);
            }
            parent = t;
            t = n.left;
        }
        if t != h {
            // Give back what was taken (exact: those sums held the head's demand).
            let mut u = self.root;
            while u != t {
                let Some(n) = self.nodes.get_mut(u as usize) else {
                    break;
                };
                n.sum = n.sum.saturating_add(demand);
                u = n.left;
            }
            return self.remove(key);
        }
        let link = if parent == NIL {
            Link::Root
        } else {
            Link::Left(parent)
        };
        self.relink(link, right);
        self.release(h);
        self.head = if right != NIL {
            self.leftmost(right)
        } else {
            parent
        };
        self.len = self.len.saturating_sub(1);
        Some(slot)
    }

    /// Removes the ticket with this key; returns its slot.
    pub(crate) fn remove(&mut self, key: Key) -> Option<u32> {
        // First walk: find the node, and whether a sum on the way is saturated (then it
        // cannot simply be lowered, and every sum on the path is recomputed instead).
        let mut t = self.root;
        let mut saturated = false;
        let (l, r) = loop {
            let n = self.node(t)?;
            saturated |= n.sum.0.contains(&u64::MAX);
            match key.cmp(&n.key()) {
                core::cmp::Ordering::Less => t = n.left,
                core::cmp::Ordering::Greater => t = n.right,
                core::cmp::Ordering::Equal => break (n.left, n.right),
            }
        };
        let found = t;
        let Ticket { demand, slot } = self.ticket(found)?.clone();
        let was_head = found == self.head;
        if saturated {
            let (root, _) = self.remove_in(self.root, key);
            self.root = root;
            if was_head {
                self.head = self.leftmost(self.root);
            }
        } else {
            // Second walk (the same nodes): each ancestor's exact sum loses `demand`.
            let mut link = Link::Root;
            let mut t = self.root;
            while t != found {
                let Some(n) = self.nodes.get_mut(t as usize) else {
                    break;
                };
                for (s, d) in n.sum.0.iter_mut().zip(demand.0) {
                    *s = s.saturating_sub(d);
                }
                if key < n.key() {
                    link = Link::Left(t);
                    t = n.left;
                } else {
                    link = Link::Right(t);
                    t = n.right;
                }
            }
            let merged = self.merge(l, r);
            self.relink(link, merged);
            self.release(found);
            if was_head {
                // The head has no left child: the next smallest key is the smallest of its
                // right subtree, or else its parent.
                self.head = match link {
                    _ if merged != NIL => self.leftmost(merged),
                    Link::Left(p) => p,
                    Link::Root => NIL,
                    Link::Right(_) => self.leftmost(self.root),
                };
            }
        }
        self.len = self.len.saturating_sub(1);
        Some(slot)
    }

    /// Removes `key` from the subtree `t`, recomputing every sum on the way back up.
    fn remove_in(&mut self, t: u32, key: Key) -> (u32, Option<u32>) {
        let Some(n) = self.node(t) else {
            return (NIL, None);
        };
        let (nk, l, r) = (n.key(), n.left, n.right);
        match key.cmp(&nk) {
            core::cmp::Ordering::Less => {
                let (l2, removed) = self.remove_in(l, key);
                self.set_children(t, l2, r);
                (t, removed)
            }
            core::cmp::Ordering::Greater => {
                let (r2, removed) = self.remove_in(r, key);
                self.set_children(t, l, r2);
                (t, removed)
            }
            core::cmp::Ordering::Equal => {
                let slot = self.ticket(t).map(|x| x.slot);
                let merged = self.merge(l, r);
                self.release(t);
                (merged, slot)
            }
        }
    }

    /// Total demand of tickets with a key below `key` (O(log n)).
    pub(crate) fn demand_before(&self, key: Key) -> Demand {
        let mut acc = Demand::default();
        let mut t = self.root;
        while let Some(n) = self.node(t) {
            if n.key() < key {
                acc = acc
                    .saturating_add(self.sum_of(n.left))
                    .saturating_add(self.demand_of(t));
                t = n.right;
            } else {
                t = n.left;
            }
        }
        acc
    }

    /// Demand of the whole queue.
    #[cfg(test)]
    pub(crate) fn total(&self) -> Demand {
        self.sum_of(self.root)
    }

    /// (key, slot) of every ticket in key order (for checks; allocates).
    pub(crate) fn in_order(&self) -> Vec<(Key, u32)> {
        self.map_in_order(|n, t| (n.key(), t.slot))
    }

    /// (key, slot, demand) of the first `n` tickets in key order (allocates).
    pub(crate) fn first_in_order(&self, n: usize) -> Vec<(Key, u32, Demand)> {
        self.map_first(n, |node, t| (node.key(), t.slot, t.demand))
    }

    /// `f` of every ticket (with its node) in key order.
    fn map_in_order<T>(&self, f: impl Fn(&Node, &Ticket) -> T) -> Vec<T> {
        self.map_first(self.len as usize, f)
    }

    /// `f` of the first `n` tickets (with their nodes) in key order.
    fn map_first<T>(&self, n: usize, f: impl Fn(&Node, &Ticket) -> T) -> Vec<T> {
        let mut out = Vec::with_capacity(n.min(self.len as usize));
        let mut stack = Vec::new();
        let mut t = self.root;
        while out.len() < n {
            while let Some(n) = self.node(t) {
                stack.push(t);
                t = n.left;
            }
            let Some(i) = stack.pop() else { break };
            if let (Some(n), Some(x)) = (self.node(i), self.ticket(i)) {
                out.push(f(n, x));
                t = n.right;
            }
        }
        out
    }

    /// Structural check used on restore: every reachable index is in range and reached
    /// once, the key order and heap order hold, sums are right, `len` matches, the head
    /// is the smallest key, and the free list holds each unreachable (and cleared) entry
    /// exactly once.
    pub(crate) fn is_consistent(&self) -> bool {
        if self.tickets.len() != self.nodes.len() {
            return false;
        }
        let mut used = alloc::vec![false; self.nodes.len()];
        let mut count = 0u32;
        let mut stack = alloc::vec![(self.root, None::<Key>, None::<Key>, u64::MAX)];
        while let Some((t, lo, hi, max_prio)) = stack.pop() {
            if t == NIL {
                continue;
            }
            let Some(n) = self.node(t) else { return false };
            match used.get_mut(t as usize) {
                Some(u) if !*u => *u = true,
                _ => return false,
            }
            let key = n.key();
            if lo.is_some_and(|lo| key <= lo)
                || hi.is_some_and(|hi| key >= hi)
                || n.prio() > max_prio
            {
                return false;
            }
            let expect = self
                .sum_of(n.left)
                .saturating_add(self.demand_of(t))
                .saturating_add(self.sum_of(n.right));
            if expect != n.sum {
                return false;
            }
            count = count.saturating_add(1);
            if count > self.len {
                return false;
            }
            stack.push((n.left, lo, Some(key), n.prio()));
            stack.push((n.right, Some(key), hi, n.prio()));
        }
        for f in &self.free {
            let cleared =
                self.node(*f) == Some(&FREE_NODE) && self.ticket(*f) == Some(&FREE_TICKET);
            match used.get_mut(*f as usize) {
                Some(u) if !*u && cleared => *u = true,
                _ => return false,
            }
        }
        count == self.len
            && self.head == self.leftmost(self.root)
            && self.free.len() + self.len as usize == self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(v: u128, seq: u64) -> Key {
        Key { vfinish: v, seq }
    }

    fn d(n: u64) -> Demand {
        Demand([n, 0, n, 1])
    }

    #[test]
    fn pops_in_virtual_finish_order_then_arrival() {
        let mut q = Queue::new();
        q.insert(key(30, 0), d(1), 10);
        q.insert(key(10, 1), d(1), 11);
        q.insert(key(10, 2), d(1), 12);
        q.insert(key(20, 3), d(1), 13);
        let mut order = alloc::vec::Vec::new();
        while let Some((k, _, slot)) = q.peek_min() {
            order.push(slot);
            assert_eq!(q.remove(k), Some(slot));
        }
        assert_eq!(order, [11, 12, 13, 10]);
        assert!(q.is_empty());
        q.insert(key(30, 0), d(1), 10);
        q.insert(key(10, 1), d(1), 11);
        q.insert(key(10, 2), d(1), 12);
        q.insert(key(20, 3), d(1), 13);
        let mut order = alloc::vec::Vec::new();
        while let Some(slot) = q.pop_head() {
            order.push(slot);
            assert!(q.is_consistent());
        }
        assert_eq!(order, [11, 12, 13, 10]);
        assert!(q.is_empty());
    }

    #[test]
    fn demand_before_sums_strictly_smaller_keys() {
        let mut q = Queue::new();
        for i in 0..100u64 {
            q.insert(key(u128::from(i) * 10, i), d(i), i as u32);
        }
        assert_eq!(q.demand_before(key(0, 0)).0[0], 0);
        assert_eq!(q.demand_before(key(55, 1000)).0[0], (0..6).sum::<u64>());
        assert_eq!(q.demand_before(key(u128::MAX, 0)).0[3], 100);
        assert_eq!(q.total().0[0], (0..100).sum::<u64>());
        assert!(q.is_consistent());
    }

    #[test]
    fn removing_from_the_middle_keeps_structure() {
        let mut q = Queue::new();
        for i in 0..50u64 {
            q.insert(key(u128::from(i % 7), i), d(1), i as u32);
        }
        for i in (0..50u64).step_by(3) {
            assert_eq!(q.remove(key(u128::from(i % 7), i)), Some(i as u32));
        }
        assert_eq!(q.remove(key(3, 3)), None, "already removed");
        assert!(q.is_consistent());
        assert_eq!(q.len(), 50 - 17);
        let slots = q
            .in_order()
            .into_iter()
            .map(|(_, s)| s)
            .collect::<alloc::vec::Vec<u32>>();
        assert_eq!(slots.len(), 33);
    }

    #[test]
    fn reuses_freed_nodes() {
        let mut q = Queue::new();
        for round in 0..10u64 {
            for i in 0..100u64 {
                q.insert(key(u128::from(i), round * 100 + i), d(1), 0);
            }
            while let Some((k, _, _)) = q.peek_min() {
                q.remove(k);
            }
        }
        assert_eq!(q.nodes.len(), 100);
        assert_eq!(q.tickets.len(), 100);
    }

    #[test]
    fn extreme_keys_are_handled() {
        let mut q = Queue::new();
        q.insert(key(u128::MAX, u64::MAX), d(u64::MAX), 1);
        q.insert(key(u128::MAX, 0), d(u64::MAX), 2);
        assert_eq!(q.total().0[0], u64::MAX);
        assert_eq!(q.remove(key(u128::MAX, u64::MAX)), Some(1));
        assert_eq!(q.remove(key(u128::MAX, 0)), Some(2));
        assert!(q.is_empty());
    }

    /// Keys in pre-order: the tree's shape.
    fn shape(q: &Queue) -> alloc::vec::Vec<Key> {
        let mut out = alloc::vec::Vec::new();
        let mut stack = alloc::vec![q.root];
        while let Some(t) = stack.pop() {
            if let Some(n) = q.node(t) {
                out.push(n.key());
                stack.push(n.right);
                stack.push(n.left);
            }
        }
        out
    }

    /// A scrambled but deterministic order of 0..n.
    fn scrambled(n: u64, salt: u64) -> alloc::vec::Vec<u64> {
        let mut v: alloc::vec::Vec<u64> = (0..n).collect();
        v.sort_by_key(|i| mix(i ^ salt));
        v
    }

    #[test]
    fn insert_reports_the_demand_queued_ahead() {
        let mut q = Queue::new();
        for (k, i) in scrambled(300, 7).into_iter().enumerate() {
            let key = key(u128::from(i % 50) * 1000, k as u64);
            let expect = q.demand_before(key);
            let ins = q.insert(key, d(i + 1), k as u32);
            assert_eq!(ins.before, expect, "insert {k}");
        }
        assert!(q.is_consistent());
    }

    #[test]
    fn saturated_sums_give_the_same_demand_ahead() {
        let mut q = Queue::new();
        for i in 0..20u64 {
            q.insert(
                key(u128::from(i), i),
                Demand([u64::MAX / 3, 1, u64::MAX, 1]),
                0,
            );
        }
        let k = key(10, 100);
        let expect = q.demand_before(k);
        assert_eq!(expect.0, [u64::MAX, 11, u64::MAX, 11], "keys 0 to (10, 10)");
        assert_eq!(q.insert(k, d(1), 0).before, expect);
        assert!(q.is_consistent());
    }

    #[test]
    fn shape_depends_only_on_the_set_of_tickets() {
        let mut a = Queue::new();
        let mut b = Queue::new();
        for i in scrambled(200, 1) {
            a.insert(key(u128::from(i / 3), i), d(i), i as u32);
        }
        for i in scrambled(200, 2) {
            b.insert(key(u128::from(i / 3), i), d(i), i as u32);
        }
        assert_eq!(shape(&a), shape(&b));
        // Removing and re-inserting gives the same shape again.
        for i in scrambled(200, 3).into_iter().take(50) {
            a.remove(key(u128::from(i / 3), i));
            a.insert(key(u128::from(i / 3), i), d(i), i as u32);
        }
        assert_eq!(shape(&a), shape(&b));
        assert_eq!(a.in_order(), b.in_order());
    }

    #[test]
    fn undo_insert_restores_the_queue_exactly() {
        let mut q = Queue::new();
        for i in 0..40u64 {
            q.insert(key(u128::from(i * 7 % 13), i), d(i), i as u32);
        }
        for i in (0..40u64).step_by(4) {
            q.remove(key(u128::from(i * 7 % 13), i));
        }
        // Reuses a free node, then (free list empty) grows the arena.
        for seq in 100..115u64 {
            let before = q.clone();
            let k = key(u128::from(seq % 9), seq);
            let ins = q.insert(k, d(seq), 1);
            assert!(q.is_consistent());
            q.undo_insert(k, ins);
            assert_eq!(q, before, "undo of ticket {seq}");
            q.insert(k, d(seq), 1);
        }
        assert!(q.is_consistent());
    }

    #[test]
    fn head_follows_inserts_and_removals() {
        let mut q = Queue::new();
        assert_eq!(q.peek_min(), None);
        for i in scrambled(100, 9) {
            q.insert(key(u128::from(i), i), d(1), i as u32);
            assert!(q.is_consistent());
        }
        assert_eq!(q.peek_min().map(|m| m.2), Some(0));
        q.remove(key(50, 50));
        assert_eq!(
            q.peek_min().map(|m| m.2),
            Some(0),
            "removing another key keeps the head"
        );
        for i in (0..100u64).filter(|i| *i != 50) {
            assert_eq!(q.peek_min().map(|m| m.2), Some(i as u32));
            q.remove(key(u128::from(i), i));
            assert!(q.is_consistent());
        }
        assert_eq!(q.peek_min(), None);
    }

    #[test]
    fn corrupt_structures_are_detected() {
        let mut q = Queue::new();
        for i in 0..10u64 {
            q.insert(key(u128::from(i), i), d(1), i as u32);
        }
        q.remove(key(4, 4));
        assert!(q.is_consistent());

        let mut bad = q.clone();
        bad.free.push(bad.root);
        bad.nodes.push(FREE_NODE);
        bad.tickets.push(FREE_TICKET);
        assert!(!bad.is_consistent(), "a live node on the free list");

        let mut bad = q.clone();
        bad.free.push(bad.free[0]);
        bad.nodes.push(FREE_NODE);
        bad.tickets.push(FREE_TICKET);
        assert!(!bad.is_consistent(), "a free node listed twice");

        let mut bad = q.clone();
        bad.head = bad.root;
        assert!(
            bad.root == q.head || !bad.is_consistent(),
            "a head that is not the minimum"
        );

        let mut bad = q.clone();
        let r = bad.root as usize;
        bad.nodes[r].left = bad.root;
        assert!(!bad.is_consistent(), "a cycle");
    }

    /// Random inserts, removals and undone inserts against a sorted map, with demands
    /// large enough that some sums saturate.
    #[test]
    fn matches_a_sorted_map_under_random_operations() {
        use alloc::collections::BTreeMap;
        let mut q = Queue::new();
        let mut model: BTreeMap<Key, (Demand, u32)> = BTreeMap::new();
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for seq in 0..4_000u64 {
            let r = next();
            let huge = r % 11 == 0;
            let dem = Demand([
                if huge { u64::MAX / 4 } else { r % 1000 },
                r % 7,
                if huge { u64::MAX } else { r % 5000 },
                1,
            ]);
            let k = key(u128::from(r % 97), seq);
            match r % 5 {
                0..=2 => {
                    let ins = q.insert(k, dem, seq as u32);
                    let expect = model
                        .range(..k)
                        .fold(Demand::default(), |a, (_, (d, _))| a.saturating_add(*d));
                    assert_eq!(ins.before, expect, "demand ahead at {seq}");
                    if r % 17 == 0 {
                        q.undo_insert(k, ins);
                    } else {
                        model.insert(k, (dem, seq as u32));
                    }
                }
                3 => {
                    let first = model.keys().next().copied();
                    assert_eq!(q.peek_min().map(|m| m.0), first);
                    if let Some(f) = first {
                        let (_, slot) = model.remove(&f).unwrap_or_default();
                        if r % 2 == 0 {
                            assert_eq!(q.pop_head(), Some(slot));
                        } else {
                            assert_eq!(q.remove(f), Some(slot));
                        }
                    } else {
                        assert_eq!(q.pop_head(), None);
                    }
                }
                _ => {
                    let nth = (r as usize / 5) % (model.len().max(1));
                    if let Some(k) = model.keys().nth(nth).copied() {
                        let (_, slot) = model.remove(&k).unwrap_or_default();
                        assert_eq!(q.remove(k), Some(slot));
                    }
                }
            }
            assert_eq!(q.len() as usize, model.len());
            if seq % 64 == 0 {
                assert!(q.is_consistent(), "after operation {seq}");
            }
        }
        assert!(q.is_consistent());
        let slots: alloc::vec::Vec<u32> = model.values().map(|(_, s)| *s).collect();
        assert_eq!(
            q.in_order()
                .into_iter()
                .map(|(_, s)| s)
                .collect::<alloc::vec::Vec<u32>>(),
            slots
        );
    }
}
