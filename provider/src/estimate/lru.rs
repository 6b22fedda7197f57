//! A bounded map that forgets its least recently used entries first (deterministic: no
//! hashing, no clock).

use alloc::collections::BTreeMap;

/// At most `capacity` entries; `get` and `insert` make an entry the most recently used.
#[derive(Clone, Debug)]
pub(crate) struct Lru<K: Ord + Copy, V> {
    entries: BTreeMap<K, (V, u64)>,
    order: BTreeMap<u64, K>,
    next: u64,
    capacity: usize,
}

impl<K: Ord + Copy, V> Lru<K, V> {
    pub(crate) fn new(capacity: usize) -> Lru<K, V> {
        Lru {
            entries: BTreeMap::new(),
            order: BTreeMap::new(),
            next: 0,
            capacity: capacity.max(1),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn contains(&self, k: &K) -> bool {
        self.entries.contains_key(k)
    }

    fn touch(&mut self, k: K) {
        if let Some((_, stamp)) = self.entries.get_mut(&k) {
            self.order.remove(stamp);
            *stamp = self.next;
            self.order.insert(self.next, k);
            self.next += 1;
        }
    }

    /// The entry of `k`, made the most recently used.
    pub(crate) fn get(&mut self, k: &K) -> Option<&V> {
        self.touch(*k);
        self.entries.get(k).map(|(v, _)| v)
    }

    /// The entry of `k` without using it.
    pub(crate) fn peek(&self, k: &K) -> Option<&V> {
        self.entries.get(k).map(|(v, _)| v)
    }

    /// Sets `k`, made the most recently used; the least recently used entries past the
    /// capacity are forgotten.
    pub(crate) fn insert(&mut self, k: K, v: V) {
        if let Some((_, stamp)) = self.entries.remove(&k) {
            self.order.remove(&stamp);
        }
        self.entries.insert(k, (v, self.next));
        self.order.insert(self.next, k);
        self.next += 1;
        while self.entries.len() > self.capacity {
            if self.pop_oldest().is_none() {
                break;
            }
        }
    }

    pub(crate) fn remove(&mut self, k: &K) -> Option<V> {
        let (v, stamp) = self.entries.remove(k)?;
        self.order.remove(&stamp);
        Some(v)
    }

    /// Forgets the least recently used entry.
    pub(crate) fn pop_oldest(&mut self) -> Option<(K, V)> {
        let (_, k) = self.order.pop_first()?;
        self.entries.remove(&k).map(|(v, _)| (k, v))
    }
}
