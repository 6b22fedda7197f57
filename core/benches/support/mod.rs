//! What the criterion benchmarks (`core.rs`) and `examples/instructions.rs` share: the
//! coordinators they drive and the requests they make, so the instruction counts are of the
//! same loops as the timings.
use tokenwarden_core::{
    AgentId, Config, Coordinator, Decision, LeaseId, LeaseRequest, Millis, Role,
};

/// Limits far above what one request per millisecond uses, so every request is granted.
pub(crate) const ROOMY_POOL: &str = r#""input_tokens_per_minute":1000000000000,
    "output_tokens_per_minute":100000000000,"requests_per_minute":1000000000"#;

pub(crate) fn coordinator(json: &str) -> Coordinator {
    let config = Config::from_json(json).expect("bench config is valid");
    Coordinator::new(config, 42, Millis(0)).expect("bench config is valid")
}

pub(crate) fn granted(d: Decision) -> LeaseId {
    match d {
        Decision::Grant { lease, .. } => lease,
        other => panic!("bench expected a grant, got {other:?}"),
    }
}

/// A small deterministic generator for request sizes (xorshift).
pub(crate) struct Sizes(pub(crate) u64);

impl Sizes {
    pub(crate) fn next(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        lo + self.0 % (hi - lo)
    }
}

pub(crate) fn role(i: u64) -> Role {
    match i % 8 {
        0 => Role::Planner,
        1 | 2 => Role::Reviewer,
        _ => Role::Worker,
    }
}

/// Eight agents in turn, mixed roles, 2,000–5,500 input tokens with `max_tokens` 1,000.
pub(crate) fn eight_agents() -> Vec<LeaseRequest> {
    (0..8)
        .map(|i| LeaseRequest {
            agent: AgentId(i),
            input_tokens: 2_000 + 500 * i,
            max_tokens: 1_000,
            role: role(i),
            ..Default::default()
        })
        .collect()
}
