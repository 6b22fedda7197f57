//! The names the host gives agents and tasks, and the coordinator gives pools and leases.

use core::fmt;

use serde::{Deserialize, Serialize};

/// An agent, named by the host. Any `u64`; JavaScript hosts keep it below 2^53.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct AgentId(pub u64);

/// A pool, by its index in [`Config::pools`](crate::Config::pools).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct PoolId(pub u32);

/// A task, named by the host. Any `u64`; JavaScript hosts keep it below 2^53 (the npm
/// package hashes a string id into one).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct TaskId(pub u64);

/// Names a lease from the moment it is requested: a queued ticket keeps its id when it is
/// granted. Ids are below 2^53 so they survive a trip through a JavaScript `number`; an id
/// is never reused while its slot's 20-bit generation has not wrapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease#{}", self.0)
    }
}

const GEN_BITS: u32 = 20;
pub(crate) const GEN_MASK: u32 = (1 << GEN_BITS) - 1;

impl LeaseId {
    pub(crate) fn new(slot: u32, generation: u32) -> LeaseId {
        LeaseId((u64::from(generation & GEN_MASK) << 32) | u64::from(slot))
    }

    pub(crate) fn slot(self) -> u32 {
        (self.0 & 0xFFFF_FFFF) as u32
    }

    pub(crate) fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}
