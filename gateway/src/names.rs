//! Agent names and the ids the core knows them by.
//!
//! A name's id is the first 53 bits of HMAC-SHA-256 over the name, keyed by the fleet's
//! secret: two names share an id only by a 2^-53 chance nobody can steer without the secret
//! (an unkeyed hash gives a name with another agent's id in a fraction of a second). Who may
//! act on a lease is also checked by the full name (see [`crate::members`]).
//!
//! The table remembers at most [`MAX_AGENT_NAMES`] names each way, least recently used
//! forgotten first. What a host stores of it (one entry per id, so that metrics, the
//! dashboard and logs name agents at once after a restart) comes out as writes
//! ([`AgentNames::take_writes`]); only the id → name side is seeded back from them, since a
//! name's id is made again from the secret, which may have changed.

use alloc::string::String;
use alloc::vec::Vec;

/// Agent ids remembered (names are bounded: 1 to 128 characters).
pub const MAX_AGENT_NAMES: usize = 4096;

/// A store write of the table: id → name, or `None` to forget the id.
pub type NameWrite = (u64, Option<String>);

/// The names and ids of one quota's agents (see the module doc). Each side is a vector
/// sorted by its key (a binary search to find, a shift to insert: the table is small, and
/// this costs the wasm build far less code than a map per side), each entry stamped with its
/// last use.
#[derive(Clone, Debug)]
pub struct AgentNames {
    /// The HMAC key: the domain and the fleet's secret.
    key: Vec<u8>,
    /// (name, id, last use), by name.
    ids: Vec<(String, u64, u64)>,
    /// (id, name, last use), by id.
    names: Vec<(u64, String, u64)>,
    /// The use counter.
    clock: u64,
    /// Writes not yet taken by the host.
    writes: Vec<NameWrite>,
}

impl AgentNames {
    /// The table for a fleet whose secret is `secret`, empty.
    #[must_use]
    pub fn new(secret: &str) -> AgentNames {
        let mut key = Vec::with_capacity(22 + secret.len());
        key.extend_from_slice(b"tokenwarden agent ids\0");
        key.extend_from_slice(secret.as_bytes());
        AgentNames {
            key,
            ids: Vec::new(),
            names: Vec::new(),
            clock: 0,
            writes: Vec::new(),
        }
    }

    /// Seeds the id → name side with what a host stored before a restart (at most
    /// [`MAX_AGENT_NAMES`] are kept; nothing is written back).
    pub fn seed(&mut self, stored: impl IntoIterator<Item = (u64, String)>) {
        for (id, name) in stored {
            if self.names.len() >= MAX_AGENT_NAMES {
                break;
            }
            self.clock += 1;
            self.set_name(id, name, self.clock);
        }
    }

    /// The id of `name` (remembered as the most recently used).
    pub fn id(&mut self, name: &str) -> u64 {
        let id = match self.find_name(name) {
            Ok(i) => self.ids[i].1,
            Err(_) => keyed_id(&self.key, name),
        };
        self.remember(name, id);
        id
    }

    /// The name an id was made from, if it is still remembered.
    #[must_use]
    pub fn name_of(&self, id: u64) -> Option<&str> {
        self.find_id(id).ok().map(|i| self.names[i].1.as_str())
    }

    /// The store writes since the last call, oldest first.
    pub fn take_writes(&mut self) -> Vec<NameWrite> {
        core::mem::take(&mut self.writes)
    }

    /// Writes every remembered name again (after a reset emptied the store).
    pub fn rewrite_all(&mut self) {
        for (id, name, _) in &self.names {
            self.writes.push((*id, Some(name.clone())));
        }
    }

    /// How many ids are remembered.
    #[must_use]
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether no id is remembered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn find_name(&self, name: &str) -> Result<usize, usize> {
        self.ids.binary_search_by(|(n, _, _)| n.as_str().cmp(name))
    }

    fn find_id(&self, id: u64) -> Result<usize, usize> {
        self.names.binary_search_by_key(&id, |(i, _, _)| *i)
    }

    /// Sets id → name, used at `t`.
    fn set_name(&mut self, id: u64, name: String, t: u64) {
        match self.find_id(id) {
            Ok(i) => self.names[i] = (id, name, t),
            Err(i) => self.names.insert(i, (id, name, t)),
        }
    }

    /// Moves `name` to the most recently used end of both sides, forgetting the least
    /// recently used past the bound.
    fn remember(&mut self, name: &str, id: u64) {
        self.clock += 1;
        let t = self.clock;
        match self.find_name(name) {
            Ok(i) => self.ids[i].2 = t,
            Err(i) => self.ids.insert(i, (String::from(name), id, t)),
        }
        if self.name_of(id) != Some(name) {
            self.writes.push((id, Some(String::from(name))));
        }
        self.set_name(id, String::from(name), t);
        while self.ids.len() > MAX_AGENT_NAMES {
            let Some(oldest) = least_used(self.ids.iter().map(|e| e.2)) else {
                break;
            };
            let (old_name, old_id, _) = self.ids.remove(oldest);
            if self.name_of(old_id) == Some(old_name.as_str()) {
                self.forget(old_id);
            }
        }
        while self.names.len() > MAX_AGENT_NAMES {
            let Some(oldest) = least_used(self.names.iter().map(|e| e.2)) else {
                break;
            };
            let id = self.names[oldest].0;
            self.forget(id);
        }
    }

    fn forget(&mut self, id: u64) {
        if let Ok(i) = self.find_id(id) {
            self.names.remove(i);
        }
        self.writes.push((id, None));
    }
}

/// The index of the smallest stamp (a scan: only when a side is past its bound).
fn least_used(stamps: impl Iterator<Item = u64>) -> Option<usize> {
    stamps.enumerate().min_by_key(|(_, t)| *t).map(|(i, _)| i)
}

/// The first 53 bits (big-endian) of HMAC-SHA-256(`key`, `name`).
fn keyed_id(key: &[u8], name: &str) -> u64 {
    let mac = crate::mac::hmac_sha256(key, name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&mac[..8]);
    u64::from_be_bytes(first) & ((1 << 53) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_the_web_crypto_hmac() {
        // Node's `createHmac('sha256', 'tokenwarden agent ids\0' + secret).update(name)`.
        let mut t = AgentNames::new("a-fleet-secret-of-32-characters");
        assert_eq!(t.id("alice"), 817_713_504_371_212);
        assert_eq!(AgentNames::new("x").id("bob/7"), 4_544_882_760_224_121);
        // A key longer than a block is hashed first.
        let long = "s".repeat(100);
        assert_ne!(AgentNames::new(&long).id("a"), AgentNames::new("s").id("a"));
        assert_eq!(t.name_of(817_713_504_371_212), Some("alice"));
        assert_eq!(
            t.take_writes(),
            [(817_713_504_371_212, Some(String::from("alice")))]
        );
        // Known: no second write.
        t.id("alice");
        assert!(t.take_writes().is_empty());
    }

    #[test]
    fn bounded_least_recently_used_first() {
        let mut t = AgentNames::new("k");
        let first = t.id("agent-0");
        for i in 1..=MAX_AGENT_NAMES {
            t.id(&alloc::format!("agent-{i}"));
        }
        assert_eq!(t.len(), MAX_AGENT_NAMES);
        assert_eq!(t.name_of(first), None);
        let writes = t.take_writes();
        assert_eq!(
            writes.len(),
            MAX_AGENT_NAMES + 2,
            "every name written, one forgotten"
        );
        assert!(writes.contains(&(first, None)));
        // Seeded names answer at once and are not written again.
        let mut fresh = AgentNames::new("k");
        fresh.seed([(7, String::from("seven"))]);
        assert_eq!(fresh.name_of(7), Some("seven"));
        assert!(fresh.take_writes().is_empty());
        fresh.rewrite_all();
        assert_eq!(fresh.take_writes(), [(7, Some(String::from("seven")))]);
    }
}
