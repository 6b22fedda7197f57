//! Snapshot and restore: the whole state as versioned JSON, refused when inconsistent.

use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use super::Coordinator;
use crate::agents::Agents;
use crate::config::Config;
use crate::decision::Event;
use crate::error::RestoreError;
use crate::lease::LeaseTable;
use crate::pool::Pool;
use crate::rng::Rng;
use crate::tasks::Tasks;
use crate::time::Millis;

/// A coordinator's fields as serialized, before they are checked: deserializing a
/// [`Coordinator`] reads one and converts it with [`Coordinator::from_state`].
#[derive(Deserialize)]
pub(crate) struct State {
    config: Config,
    rng: Rng,
    now: Millis,
    started: Millis,
    seq: u64,
    pools: Vec<Pool>,
    leases: LeaseTable,
    agents: Agents,
    events: VecDeque<Event>,
    #[serde(default)]
    tasks: Tasks,
}

impl TryFrom<State> for Coordinator {
    type Error = RestoreError;
    fn try_from(s: State) -> Result<Coordinator, RestoreError> {
        Coordinator::from_state(s)
    }
}

/// [`Snapshot`] with its state not yet checked, so [`Coordinator::restore_json`] can tell
/// a parse error from a refused state.
#[derive(Deserialize)]
struct RawSnapshot {
    version: u32,
    state: State,
}

/// A serialized coordinator: restore it to get one that makes the same decisions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Format version; [`Snapshot::VERSION`] for this build.
    pub version: u32,
    /// The whole state.
    pub state: Coordinator,
}

impl Snapshot {
    /// The format this build writes and reads.
    pub const VERSION: u32 = 1;
}

impl Coordinator {
    /// The whole state, ready to serialize.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            version: Snapshot::VERSION,
            state: self.clone(),
        }
    }

    /// The snapshot as JSON text.
    #[must_use]
    pub fn snapshot_json(&self) -> String {
        // Serializing plain data to a String cannot fail.
        serde_json::to_string(&self.snapshot()).unwrap_or_default()
    }

    /// A coordinator from a snapshot; it makes the same decisions the original would.
    pub fn restore(snapshot: Snapshot) -> Result<Coordinator, RestoreError> {
        if snapshot.version != Snapshot::VERSION {
            return Err(RestoreError::UnsupportedVersion(snapshot.version));
        }
        snapshot.state.validated()
    }

    /// A coordinator from its deserialized fields, refused unless the configuration is
    /// valid and every table agrees with every other.
    fn from_state(s: State) -> Result<Coordinator, RestoreError> {
        let mut c = Coordinator {
            config: s.config,
            rng: s.rng,
            now: s.now,
            started: s.started,
            seq: s.seq,
            pools: s.pools,
            leases: s.leases,
            agents: s.agents,
            events: s.events,
            tasks: s.tasks,
        };
        // Derived from the lease table, so not trusted from the text (and absent from
        // snapshots written before it was kept).
        let mut live = alloc::collections::BTreeMap::new();
        for t in c.leases.entries().filter_map(|e| e.task) {
            *live.entry(t).or_insert(0u32) += 1;
        }
        c.tasks.set_live(live);
        c.validated()
    }

    fn validated(mut self) -> Result<Coordinator, RestoreError> {
        // A snapshot from before the pause had parts: all of it is the provider's.
        for pool in &mut self.pools {
            if pool.limited_until == Millis(0) && pool.held_until == Millis(0) {
                pool.limited_until = pool.paused_until;
            }
        }
        // Not stored: derived from the lease table.
        let pools = self.pools.len();
        self.leases.rebuild_index(pools);
        self.config.validate().map_err(RestoreError::Config)?;
        self.check().map_err(RestoreError::Corrupt)?;
        Ok(self)
    }

    /// [`Coordinator::restore`] from JSON text.
    pub fn restore_json(json: &str) -> Result<Coordinator, RestoreError> {
        #[derive(Deserialize)]
        struct Version {
            version: u32,
        }
        let v: Version = serde_json::from_str(json).map_err(RestoreError::Parse)?;
        if v.version != Snapshot::VERSION {
            return Err(RestoreError::UnsupportedVersion(v.version));
        }
        let s: RawSnapshot = serde_json::from_str(json).map_err(RestoreError::Parse)?;
        if s.version != Snapshot::VERSION {
            return Err(RestoreError::UnsupportedVersion(s.version));
        }
        Coordinator::from_state(s.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AgentId, Config, LeaseRequest, Millis};
    use serde_json::{Value, json};

    /// Two pools' worth of state: agents, a granted lease, queued tickets, minutes used.
    fn busy() -> Coordinator {
        let config = Config::from_json(
            r#"{"pools":[{"name":"p","input_tokens_per_minute":40000,
                "output_tokens_per_minute":8000,"requests_per_minute":50,"max_concurrent":1}],
                "metrics_minutes":7}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut c = Coordinator::new(config, 1, Millis(0)).unwrap_or_else(|e| panic!("{e}"));
        for (t, agent) in [(0, 1), (10, 2), (20, 3), (30, 2), (70_000, 4)] {
            let req = LeaseRequest {
                agent: AgentId(agent),
                input_tokens: 1_000,
                max_tokens: 500,
                ..Default::default()
            };
            let _ = c.request_lease(Millis(t), &req);
        }
        c.check().unwrap_or_else(|e| panic!("{e}"));
        c
    }

    fn restore_edited(c: &Coordinator, edit: impl FnOnce(&mut Value)) -> Result<(), RestoreError> {
        let mut v = serde_json::to_value(c.snapshot()).unwrap_or(Value::Null);
        edit(&mut v["state"]);
        let text = alloc::string::ToString::to_string(&v);
        let restored = Coordinator::restore_json(&text).map(|_| ());
        // Deserializing a `Coordinator` (or a `Snapshot`) directly refuses the same states.
        let direct = serde_json::from_value::<Coordinator>(v["state"].clone());
        assert_eq!(
            restored.is_ok(),
            direct.is_ok(),
            "{restored:?} vs {direct:?}"
        );
        assert_eq!(
            restored.is_ok(),
            serde_json::from_str::<Snapshot>(&text).is_ok()
        );
        restored
    }

    #[test]
    fn snapshots_round_trip_with_the_new_tables() {
        let c = busy();
        let back = Coordinator::restore_json(&c.snapshot_json()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, c);
        assert!(restore_edited(&c, |_| {}).is_ok());
    }

    #[test]
    fn restore_refuses_corrupt_indices() {
        let c = busy();
        let corrupt = |what: &str, edit: &dyn Fn(&mut Value)| {
            assert!(
                matches!(restore_edited(&c, edit), Err(RestoreError::Corrupt(_))),
                "{what} must be refused"
            );
        };
        corrupt("a lease naming another agent's slot", &|s| {
            s["leases"]["slots"][0]["entry"]["agent_slot"] = json!(1);
        });
        corrupt("a lease naming a slot past the table", &|s| {
            s["leases"]["slots"][0]["entry"]["agent_slot"] = json!(99);
        });
        corrupt("an agent index naming the wrong slot", &|s| {
            s["agents"]["index"]["1"] = json!(2);
        });
        corrupt("an agent slot on the free list", &|s| {
            s["agents"]["free"] = json!([0]);
        });
        corrupt("a queue head that is not the smallest key", &|s| {
            let q = &mut s["pools"][0]["queue"];
            let root = q["root"].clone();
            let head = q["head"].clone();
            q["head"] = if root == head { json!(99) } else { root };
        });
        corrupt("a queue ticket naming another lease slot", &|s| {
            s["pools"][0]["queue"]["tickets"][0]["slot"] = json!(0);
        });
        corrupt("a queue key that differs from its lease's", &|s| {
            let v = &mut s["pools"][0]["queue"]["nodes"][0]["vfinish_lo"];
            *v = json!(v.as_u64().unwrap_or(0) + 1);
        });
        corrupt("a cached minute slot that is not minute % len", &|s| {
            s["pools"][0]["minute_slot"] = json!(0);
        });
        corrupt(
            "a nominal capacity that does not match limit and margin",
            &|s| {
                s["pools"][0]["buckets"][0]["nominal"] = json!(40_000);
            },
        );
    }
}
