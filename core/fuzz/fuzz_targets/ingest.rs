#![no_main]

//! The header-ingestion entry point: arbitrary response headers and statuses fed into a
//! coordinator with live leases and queued tickets must never panic, never break its
//! invariants, and never make an error change state.

mod common;

use libfuzzer_sys::fuzz_target;
use tokenwarden_core::{
    AgentId, Config, Coordinator, Decision, LeaseRequest, Millis, PoolId, parse_headers,
};

fn coordinator() -> (Coordinator, Vec<tokenwarden_core::LeaseId>) {
    let config = Config::from_json(
        r#"{"pools":[
            {"name":"a","input_tokens_per_minute":100000,"output_tokens_per_minute":20000,"requests_per_minute":100,"max_concurrent":3},
            {"name":"b","counting":"openai","tokens_per_minute":50000}
        ]}"#,
    )
    .expect("valid config");
    let mut c = Coordinator::new(config, 7, Millis(1_000)).expect("valid");
    let mut leases = Vec::new();
    for i in 0..5u64 {
        let req = LeaseRequest {
            agent: AgentId(i),
            pool: PoolId((i % 2) as u32),
            input_tokens: 30_000,
            max_tokens: 1_000,
            ..Default::default()
        };
        match c.request_lease(Millis(1_000), &req).expect("valid request") {
            Decision::Grant { lease, .. } | Decision::Queued { lease, .. } => leases.push(lease),
            Decision::Reject { .. } | Decision::NeverFits { .. } => {}
        }
    }
    (c, leases)
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else { return };
    let (clock, rest) = common::split_clock(rest);
    let text = String::from_utf8_lossy(rest);
    let pairs: Vec<(&str, &str)> = text
        .split('\n')
        .map(|line| line.split_once(':').unwrap_or((line, "")))
        .collect();
    let report = parse_headers(pairs.iter().copied(), clock);

    let (mut c, leases) = coordinator();
    let status = [200u16, 429, 500, 529][usize::from(control & 3)];
    let pool = PoolId(u32::from((control >> 2) & 1));
    let lease = match (control >> 3) & 7 {
        0 => None,
        7 => Some(tokenwarden_core::LeaseId(u64::from(control) << 40)),
        k => leases.get(usize::from(k) - 1).copied(),
    };
    let now = Millis(clock.unwrap_or(1_000) % 10_000_000);
    let before = c.snapshot_json();
    match c.handle_response(now, pool, lease, status, &report) {
        Ok(()) => {}
        Err(_) => assert_eq!(c.snapshot_json(), before, "an error changed state"),
    }
    c.check().expect("invariants after ingestion");
    while c.poll_event().is_some() {}
    if let Some(t) = c.poll_timeout() {
        c.handle_timeout(t);
    }
    c.handle_timeout(Millis(now.0.saturating_add(86_400_000)));
    c.check().expect("invariants after time passes");
});
