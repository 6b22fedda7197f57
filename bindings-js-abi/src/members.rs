//! The members of one quota for a JavaScript host (the edge Worker's Durable Object): the
//! gateway crate's [`Members`] with JSON text at the boundary.
//!
//! The host checks a member's input ([`MemberTable::route`]: the core's input as camelCase
//! JSON, or the refusal to answer), applies it through its driver, and hands the output back
//! ([`MemberTable::applied`]); the driver's events go to [`MemberTable::granted`],
//! [`MemberTable::revised`] and [`MemberTable::expired`]; the long polls to answer come from
//! [`MemberTable::take_wakes`]. Every answer that can be refused is `{"refused": {status,
//! error, message, field?}}` beside its result, never a throw: a refusal is an HTTP answer.

use serde_json::{Value, json};
use tokenwarden_core as core;
use tokenwarden_gateway::Refusal;
use tokenwarden_gateway::members::{Answer, Checked, Members, Poll, Record};

use crate::ArgError;

/// [`Members`] with the checked input between [`MemberTable::route`] and
/// [`MemberTable::applied`].
#[derive(Debug)]
pub struct MemberTable {
    inner: Members,
    pending: Option<Checked>,
    /// Whether agent ids are keyed by the fleet's secret yet.
    keyed: bool,
}

/// `{"refused": …}` as JSON text.
pub(crate) fn refused(r: &Refusal) -> String {
    let mut body = r.body();
    body["status"] = Value::from(r.status);
    json!({ "refused": body }).to_string()
}

/// A lease id as JavaScript gave it (a `number`, possibly not an integer).
fn lease_value(lease: f64) -> Value {
    serde_json::Number::from_f64(lease).map_or(Value::Null, |n| {
        // An integral float reads as the integer it is.
        match n.as_f64() {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Some(f) if f >= 0.0 && f.fract() == 0.0 && f <= 9_007_199_254_740_991.0 => {
                Value::from(f as u64)
            }
            _ => Value::Number(n),
        }
    })
}

impl MemberTable {
    /// The members of a quota with its pools by name and the lease table stored before a
    /// restart (`[[id, record], …]` JSON, as [`MemberTable::records`] writes it). Agent ids
    /// are keyed once the host knows the fleet ([`MemberTable::key`]).
    pub fn new(pools: Vec<String>, records: &str) -> Result<MemberTable, ArgError> {
        let mut t = MemberTable {
            inner: Members::new("", pools.clone()),
            pending: None,
            keyed: false,
        };
        t.restore(pools, records)?;
        Ok(t)
    }

    /// The table replaced by `records` (JSON), with the quota's pools.
    pub fn restore(&mut self, pools: Vec<String>, records: &str) -> Result<(), ArgError> {
        let bad = || {
            ArgError::type_error("the stored leases are not [[id, record], …]".into())
                .with_field("records")
        };
        let records = tokenwarden_gateway::json::parse(records)
            .and_then(|v| match v {
                Value::Array(pairs) => pairs
                    .iter()
                    .map(|p| Some((p.get(0)?.as_u64()?, Record::from_json(p.get(1)?)?)))
                    .collect::<Option<Vec<_>>>(),
                _ => None,
            })
            .ok_or_else(bad)?;
        self.inner.set_pools(pools);
        self.inner.restore(records);
        Ok(())
    }

    /// Keys agent ids by the fleet's secret, with the agent names stored before a restart
    /// (`[[id, name], …]` JSON).
    pub fn key(&mut self, secret: &str, names: &str) -> Result<(), ArgError> {
        let names = tokenwarden_gateway::json::parse(names)
            .and_then(|v| match v {
                Value::Array(pairs) => pairs
                    .iter()
                    .map(|p| Some((p.get(0)?.as_u64()?, String::from(p.get(1)?.as_str()?))))
                    .collect::<Option<Vec<_>>>(),
                _ => None,
            })
            .ok_or_else(|| {
                ArgError::type_error("the stored names are not [[id, name], …]".into())
                    .with_field("names")
            })?;
        self.inner.key(secret, names);
        self.keyed = true;
        Ok(())
    }

    fn keyed(&self) -> Result<(), ArgError> {
        if self.keyed {
            Ok(())
        } else {
            Err(ArgError::state(
                "invalid_state",
                "the member table names agents once it is keyed by the fleet's secret (key())"
                    .into(),
            ))
        }
    }

    /// A member's request to `route` of the HTTP API (see
    /// [`Members::route`]; `handle` takes a member input as it is), naming lease or task `id`
    /// in its path (the segment as text, percent-decoded: a lease's id, a task's id or name),
    /// with the body's JSON text, from the agent credential `who` (its name) or
    /// the fleet's secret: `{"input": …}` (the core's input, camelCase) or `{"refused": …}`.
    pub fn route(
        &mut self,
        route: &str,
        id: Option<&str>,
        who: Option<&str>,
        body: &str,
    ) -> Result<String, ArgError> {
        self.pending = None;
        self.keyed()?;
        let Some(value) = tokenwarden_gateway::json::parse(body) else {
            return Ok(refused(&Refusal::new(
                400,
                "invalid_argument",
                format!(
                    "the body is not JSON, or nests deeper than {} levels",
                    tokenwarden_gateway::json::MAX_DEPTH
                ),
            )));
        };
        let who = who.map(|name| self.inner.who(name));
        let id = id.map(|text| {
            if route.starts_with("task") {
                Value::from(text)
            } else {
                // A lease's id: digits, or nothing that names one.
                text.parse::<u64>().map_or(Value::Null, Value::from)
            }
        });
        match self.inner.route(route, id.as_ref(), who.as_ref(), &value) {
            Ok(checked) => {
                let text = json!({ "input": checked.json }).to_string();
                self.pending = Some(checked);
                Ok(text)
            }
            Err(r) => Ok(refused(&r)),
        }
    }

    /// The output (JSON text, camelCase) the coordinator answered to the input
    /// [`MemberTable::route`] last returned: the table kept from it.
    pub fn applied(&mut self, output: &str) -> Result<(), ArgError> {
        let checked = self.pending.take().ok_or_else(|| {
            ArgError::state(
                "invalid_state",
                "applied() follows a route() that answered an input".into(),
            )
        })?;
        let value: Value = serde_json::from_str(output)
            .map_err(|e| ArgError::type_error(format!("the output is not JSON: {e}")))?;
        self.inner.answered(&checked, Answer::of_json(&value));
        Ok(())
    }

    /// Lease `lease`'s record for `who`: `{"record": …}` or `{"refused": …}` (404, 403).
    pub fn known(&mut self, lease: f64, who: Option<&str>) -> Result<String, ArgError> {
        self.keyed()?;
        let who = who.map(|name| self.inner.who(name));
        Ok(
            match self.inner.known(Some(&lease_value(lease)), who.as_ref()) {
                Ok(rec) => json!({ "record": rec.to_json() }).to_string(),
                Err(r) => refused(&r),
            },
        )
    }

    /// A long poll on ticket `lease` by `who` with `timeout_ms` left: `{"hold": ms}`,
    /// `{"status", "body"}` or `{"refused": …}`.
    pub fn wait(
        &mut self,
        lease: f64,
        who: Option<&str>,
        timeout_ms: f64,
    ) -> Result<String, ArgError> {
        self.keyed()?;
        let who = who.map(|name| self.inner.who(name));
        let timeout = if timeout_ms.is_finite() && timeout_ms > 0.0 {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let t = timeout_ms.min(1e15) as u64;
            t
        } else {
            0
        };
        Ok(
            match self
                .inner
                .wait(Some(&lease_value(lease)), who.as_ref(), timeout)
            {
                Ok(Poll::Hold(ms)) => json!({ "hold": ms }).to_string(),
                Ok(Poll::Answer { status, body }) => {
                    json!({ "status": status, "body": body }).to_string()
                }
                Err(r) => refused(&r),
            },
        )
    }

    /// The operator's hold body (JSON text) at `now`: `{"input": …}` or `{"refused": …}`.
    pub fn hold(&self, body: &str, now: f64) -> Result<String, ArgError> {
        let Ok(value) = serde_json::from_str::<Value>(body) else {
            return Ok(refused(&Refusal::new(
                400,
                "invalid_argument",
                "the body is not JSON".into(),
            )));
        };
        let now = crate::u64_from_f64(now, "now")?;
        Ok(match self.inner.hold(&value, core::Millis(now)) {
            Ok(core::Input::Hold { pool, until }) => {
                json!({ "input": { "op": "hold", "pool": pool.0, "until": until.0 } }).to_string()
            }
            Ok(_) => {
                return Err(ArgError::state(
                    "internal",
                    "a hold's body read as another input".into(),
                ));
            }
            Err(r) => refused(&r),
        })
    }

    /// A member's ticket granted from the line.
    pub fn granted(&mut self, lease: f64, expires_at: f64, waited_ms: f64) -> Result<(), ArgError> {
        self.inner.granted(
            crate::u64_from_f64(lease, "lease")?,
            crate::u64_from_f64(expires_at, "expiresAt")?,
            crate::u64_from_f64(waited_ms, "waitedMs")?,
        );
        Ok(())
    }

    /// A ticket's promise revised to `eta` at `now`.
    pub fn revised(&mut self, lease: f64, eta: f64, now: f64) -> Result<(), ArgError> {
        self.inner.revised(
            crate::u64_from_f64(lease, "lease")?,
            crate::u64_from_f64(eta, "eta")?,
            crate::u64_from_f64(now, "now")?,
        );
        Ok(())
    }

    /// A lease expired.
    pub fn expired(&mut self, lease: f64) -> Result<(), ArgError> {
        self.inner.expired(crate::u64_from_f64(lease, "lease")?);
        Ok(())
    }

    /// The long polls to answer now.
    pub fn take_wakes(&mut self) -> Vec<f64> {
        #[allow(clippy::cast_precision_loss)]
        self.inner
            .take_wakes()
            .into_iter()
            .map(|id| id as f64)
            .collect()
    }

    /// The id of agent `name`.
    #[allow(clippy::cast_precision_loss)]
    pub fn agent_id(&mut self, name: &str) -> Result<f64, ArgError> {
        self.keyed()?;
        Ok(self.inner.names().id(name) as f64)
    }

    /// The name agent `id` was made from, if remembered.
    pub fn name_of(&self, id: f64) -> Option<String> {
        let id = crate::u64_from_f64(id, "id").ok()?;
        self.inner.name_of(id).map(String::from)
    }

    /// Remembers remote driver `client` seen at `now` (Unix ms): how many processes share
    /// the quota (at least 1). See [`Members::seen`].
    pub fn seen(&mut self, client: Option<&str>, now: f64) -> f64 {
        let now = crate::u64_from_f64(now, "now").unwrap_or(0);
        #[allow(clippy::cast_precision_loss)]
        let n = self.inner.seen(client, now) as f64;
        n
    }

    /// The metrics (JSON text, camelCase) with the agents' names and, when given, the
    /// ceilings (JSON text): JSON text. See [`Members::name_metrics`].
    pub fn named_metrics(&self, metrics: &str, ceilings: Option<&str>) -> Result<String, ArgError> {
        let mut m: Value = serde_json::from_str(metrics).map_err(|e| {
            ArgError::type_error(format!("the metrics are not JSON: {e}")).with_field("metrics")
        })?;
        let c = match ceilings {
            None => None,
            Some(t) => Some(serde_json::from_str(t).map_err(|e| {
                ArgError::type_error(format!("the ceilings are not JSON: {e}"))
                    .with_field("ceilings")
            })?),
        };
        self.inner.name_metrics(&mut m, c);
        Ok(m.to_string())
    }

    /// The agent names' store writes since the last call: `[[id, name or null], …]` JSON.
    pub fn take_name_writes(&mut self) -> String {
        let writes: Vec<Value> = self
            .inner
            .take_name_writes()
            .into_iter()
            .map(|(id, name)| json!([id, name]))
            .collect();
        Value::Array(writes).to_string()
    }

    /// The lease table to store: `[[id, record], …]` JSON.
    pub fn records(&self) -> String {
        let pairs: Vec<Value> = self
            .inner
            .records()
            .iter()
            .map(|(id, rec)| json!([id, rec.to_json()]))
            .collect();
        Value::Array(pairs).to_string()
    }

    /// The ids in the table (what a restarted host keeps).
    #[allow(clippy::cast_precision_loss)]
    pub fn ids(&self) -> Vec<f64> {
        self.inner
            .records()
            .iter()
            .map(|(id, _)| *id as f64)
            .collect()
    }

    /// Ends every record (a reset); every long poll woken. Answers how many there were.
    #[allow(clippy::cast_precision_loss)]
    pub fn clear(&mut self) -> f64 {
        self.inner.clear() as f64
    }
}
