//! A quota's timeline for a JavaScript host (the edge Worker's Durable Object): the gateway
//! crate's [`Timeline`] told the driver's call events (numbers as JavaScript has them,
//! reasons as JSON text) and answering its views as JSON text.

use serde_json::Value;
use tokenwarden_gateway::timeline::Timeline as Inner;

/// A whole non-negative number from JavaScript (ids, instants, durations); 0 for anything
/// else (a driver's own figures are never negative or fractional).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub(crate) fn whole(v: f64) -> u64 {
    if v.is_finite() && v >= 0.0 {
        v as u64
    } else {
        0
    }
}

/// A pool's index from JavaScript.
pub(crate) fn pool(v: f64) -> u32 {
    u32::try_from(whole(v)).unwrap_or(u32::MAX)
}

/// The pool names a host passes as a JSON array of strings (anything else: none).
fn pools(json: &str) -> Vec<String> {
    serde_json::from_str(json).unwrap_or_default()
}

/// [`Timeline`](Inner) at the JavaScript boundary.
#[derive(Debug)]
pub struct Timeline {
    inner: Inner,
}

impl Timeline {
    /// An empty timeline whose counters start at `now` (Unix ms).
    #[must_use]
    pub fn new(now: f64) -> Timeline {
        Timeline {
            inner: Inner::new(whole(now)),
        }
    }

    /// A call starts: `lease` of `agent` granted in `pool` after `waited_ms` in line.
    pub fn granted(&mut self, t: f64, lease: f64, agent: f64, pool_: f64, waited_ms: f64) {
        self.inner.granted(
            whole(t),
            whole(lease),
            whole(agent),
            pool(pool_),
            whole(waited_ms),
        );
    }

    /// A lease ended unsettled.
    pub fn forget(&mut self, lease: f64) {
        self.inner.forget(whole(lease));
    }

    /// `agent` refused in `pool` for `reason` (the core's reason, JSON text) until
    /// `retry_at` (`None`: never as asked).
    pub fn rejected(
        &mut self,
        t: f64,
        agent: f64,
        pool_: f64,
        reason: &str,
        retry_at: Option<f64>,
    ) {
        let reason: Value = serde_json::from_str(reason).unwrap_or(Value::Null);
        self.inner.rejected(
            whole(t),
            whole(agent),
            pool(pool_),
            &reason,
            retry_at.map(whole),
        );
    }

    /// A 429 reported in `pool` for `lease`.
    pub fn rate_limited(
        &mut self,
        t: f64,
        pool_: f64,
        lease: Option<f64>,
        retry_after_ms: Option<f64>,
        exceeded: Option<&str>,
    ) {
        self.inner.rate_limited(
            whole(t),
            pool(pool_),
            lease.map(whole),
            retry_after_ms.map(whole),
            exceeded,
        );
    }

    /// A proxied call's wait after a 429 or an overload.
    pub fn waiting(&mut self, t: f64, agent: f64, pool_: f64, delay_ms: f64, cause: &str) {
        self.inner
            .waiting(whole(t), whole(agent), pool(pool_), whole(delay_ms), cause);
    }

    /// Forgets everything; counters start again at `now`.
    pub fn clear(&mut self, now: f64) {
        self.inner.clear(whole(now));
    }

    /// Events held.
    #[must_use]
    pub fn size(&self) -> usize {
        self.inner.len()
    }

    /// What `GET …/timeline` answers at `now` (JSON text), pools by the names in
    /// `pools_json`; agents by id (as text), for the host to name.
    #[must_use]
    pub fn view(&self, now: f64, pools_json: &str) -> String {
        self.inner
            .view(whole(now), |_| None, &pools(pools_json))
            .to_string()
    }

    /// The ceilings hit, by pool name (JSON text).
    #[must_use]
    pub fn ceilings(&self, pools_json: &str) -> String {
        self.inner.ceilings(&pools(pools_json)).to_string()
    }
}
