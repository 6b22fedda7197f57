//! The operator's wait lines for a JavaScript host (`tokenwarden serve` on workerd): the
//! gateway crate's [`WaitLog`](Inner) told the driver's call events (numbers as JavaScript
//! has them, the metrics as JSON text where a line reads them), answering the lines to print.

use serde_json::Value;
use tokenwarden_gateway::waitlog::{Look, WaitLog as Inner};

use crate::timeline::{pool, whole};

/// [`WaitLog`](Inner) at the JavaScript boundary.
#[derive(Debug)]
pub struct WaitLog {
    inner: Inner,
}

/// The metrics a host passed (JSON text), read; `Null` for none or not JSON.
fn metrics(text: Option<&str>) -> Value {
    text.and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(Value::Null)
}

impl WaitLog {
    /// A log whose first minute starts at `now` (Unix ms).
    #[must_use]
    pub fn new(now: f64) -> WaitLog {
        WaitLog {
            inner: Inner::new(whole(now)),
        }
    }

    /// Whether a line at `now` about a wait of `wait_ms` may read the metrics (the host
    /// passes them only then).
    #[must_use]
    pub fn wants_metrics(&self, now: f64, wait_ms: f64) -> bool {
        self.inner.wants_metrics(whole(now), whole(wait_ms))
    }

    /// Ticket `lease` of agent `agent` named `name` queued in `pool` until `eta` at the
    /// latest (`eta_ms` from now).
    #[allow(clippy::too_many_arguments)]
    pub fn queued(
        &mut self,
        now: f64,
        lease: f64,
        name: &str,
        pool_: f64,
        agent: f64,
        eta: f64,
        eta_ms: f64,
        checkpoint: bool,
        metrics_json: Option<&str>,
    ) -> Vec<String> {
        let m = metrics(metrics_json);
        let look = Look::of(&m, pool(pool_), whole(agent));
        self.inner.queued(
            whole(now),
            whole(lease),
            name,
            pool(pool_),
            whole(eta),
            whole(eta_ms),
            checkpoint,
            &look,
        )
    }

    /// Lease `lease` granted after `waited_ms` in line.
    pub fn granted(
        &mut self,
        now: f64,
        lease: f64,
        waited_ms: f64,
        metrics_json: Option<&str>,
    ) -> Vec<String> {
        let m = metrics(metrics_json);
        let look = Look::of(&m, 0, u64::MAX);
        self.inner
            .granted(whole(now), whole(lease), whole(waited_ms), &look)
    }

    /// A call of agent `agent` named `name` waits `delay_ms` in `pool` (`message`: what
    /// the call says of it).
    #[allow(clippy::too_many_arguments)]
    pub fn waiting(
        &mut self,
        now: f64,
        name: &str,
        pool_: f64,
        agent: f64,
        delay_ms: f64,
        message: &str,
        metrics_json: Option<&str>,
    ) -> Vec<String> {
        let m = metrics(metrics_json);
        let look = Look::of(&m, pool(pool_), whole(agent));
        self.inner.waiting(
            whole(now),
            name,
            pool(pool_),
            whole(delay_ms),
            message,
            &look,
        )
    }

    /// A 429 reported.
    pub fn rate_limited(&mut self, now: f64, metrics_json: Option<&str>) -> Vec<String> {
        let m = metrics(metrics_json);
        self.inner
            .rate_limited(whole(now), &Look::of(&m, 0, u64::MAX))
    }

    /// A refusal.
    pub fn rejected(&mut self, now: f64, metrics_json: Option<&str>) -> Vec<String> {
        let m = metrics(metrics_json);
        self.inner.rejected(whole(now), &Look::of(&m, 0, u64::MAX))
    }
}
