//! The weighted fair queue: a treap keyed by virtual finish time, augmented with the
//! demand of each subtree so the demand queued ahead of any key is an O(log n) query.
//!
//! Nodes live in an arena (`Vec`) with a free list, so once the queue has reached its
//! largest size, inserting and popping allocate nothing. Priorities are a hash of the
//! node's sequence number: the shape is deterministic and survives snapshot/restore.

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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Node {
    key: Key,
    prio: u64,
    left: u32,
    right: u32,
    demand: Demand,
    sum: Demand,
    /// The lease-table slot this ticket belongs to.
    slot: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Queue {
    nodes: Vec<Node>,
    free: Vec<u32>,
    root: u32,
    len: u32,
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
            free: Vec::new(),
            root: NIL,
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

    fn sum_of(&self, i: u32) -> Demand {
        self.node(i).map(|n| n.sum).unwrap_or_default()
    }

    fn update(&mut self, i: u32) {
        let Some(n) = self.node(i) else { return };
        let (l, r, d) = (n.left, n.right, n.demand);
        let sum = self
            .sum_of(l)
            .saturating_add(d)
            .saturating_add(self.sum_of(r));
        if let Some(n) = self.nodes.get_mut(i as usize) {
            n.sum = sum;
        }
    }

    fn set_children(&mut self, i: u32, left: u32, right: u32) {
        if let Some(n) = self.nodes.get_mut(i as usize) {
            n.left = left;
            n.right = right;
        }
        self.update(i);
    }

    /// Splits `t` into keys `< key` and keys `>= key`.
    fn split(&mut self, t: u32, key: Key) -> (u32, u32) {
        let Some(n) = self.node(t) else {
            return (NIL, NIL);
        };
        let (nk, l, r) = (n.key, n.left, n.right);
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
        if na.prio >= nb.prio {
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

    /// Adds a ticket. Keys are unique because `seq` is.
    pub(crate) fn insert(&mut self, key: Key, demand: Demand, slot: u32) {
        let node = Node {
            key,
            prio: mix(key.seq),
            left: NIL,
            right: NIL,
            demand,
            sum: demand,
            slot,
        };
        let i = match self.free.pop() {
            Some(i) => {
                if let Some(n) = self.nodes.get_mut(i as usize) {
                    *n = node;
                }
                i
            }
            None => {
                self.nodes.push(node);
                u32::try_from(self.nodes.len().saturating_sub(1)).unwrap_or(NIL)
            }
        };
        let (a, b) = self.split(self.root, key);
        let left = self.merge(a, i);
        self.root = self.merge(left, b);
        self.len = self.len.saturating_add(1);
    }

    /// The ticket with the smallest key: (key, demand, slot).
    pub(crate) fn peek_min(&self) -> Option<(Key, Demand, u32)> {
        let mut t = self.root;
        let mut found = None;
        while let Some(n) = self.node(t) {
            found = Some((n.key, n.demand, n.slot));
            t = n.left;
        }
        found
    }

    /// Removes the ticket with this key; returns its slot.
    pub(crate) fn remove(&mut self, key: Key) -> Option<u32> {
        let (root, removed) = self.remove_in(self.root, key);
        self.root = root;
        if removed.is_some() {
            self.len = self.len.saturating_sub(1);
        }
        removed
    }

    fn remove_in(&mut self, t: u32, key: Key) -> (u32, Option<u32>) {
        let Some(n) = self.node(t) else {
            return (NIL, None);
        };
        let (nk, l, r, slot) = (n.key, n.left, n.right, n.slot);
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
                self.free.push(t);
                (self.merge(l, r), Some(slot))
            }
        }
    }

    /// Total demand of tickets with a key below `key`.
    pub(crate) fn demand_before(&self, key: Key) -> Demand {
        let mut acc = Demand::default();
        let mut t = self.root;
        while let Some(n) = self.node(t) {
            if n.key < key {
                acc = acc
                    .saturating_add(self.sum_of(n.left))
                    .saturating_add(n.demand);
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

    /// Slots in key order (for checks and snapshots; allocates).
    pub(crate) fn slots_in_order(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len as usize);
        let mut stack = Vec::new();
        let mut t = self.root;
        loop {
            while let Some(n) = self.node(t) {
                stack.push(t);
                t = n.left;
            }
            let Some(i) = stack.pop() else { break };
            if let Some(n) = self.node(i) {
                out.push(n.slot);
                t = n.right;
            }
        }
        out
    }

    /// Structural check used on restore: every reachable index is in range, the key order
    /// and heap order hold, sums are right and `len` matches.
    pub(crate) fn is_consistent(&self) -> bool {
        let mut count = 0u32;
        let mut stack = alloc::vec![(self.root, None::<Key>, None::<Key>, u64::MAX)];
        while let Some((t, lo, hi, max_prio)) = stack.pop() {
            if t == NIL {
                continue;
            }
            let Some(n) = self.node(t) else { return false };
            if lo.is_some_and(|lo| n.key <= lo)
                || hi.is_some_and(|hi| n.key >= hi)
                || n.prio > max_prio
            {
                return false;
            }
            let expect = self
                .sum_of(n.left)
                .saturating_add(n.demand)
                .saturating_add(self.sum_of(n.right));
            if expect != n.sum {
                return false;
            }
            count = count.saturating_add(1);
            if count > self.len {
                return false;
            }
            stack.push((n.left, lo, Some(n.key), n.prio));
            stack.push((n.right, Some(n.key), hi, n.prio));
        }
        count == self.len
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
        let slots = q.slots_in_order();
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
}
