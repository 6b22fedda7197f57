//! The names the host gives agents and the coordinator gives pools.

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
