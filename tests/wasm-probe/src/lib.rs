//! A probe, not a product: it links every part of `tokenwarden-core` (config parsing,
//! leases, the queue, headers, metrics, snapshots, the host protocol) into one exported function so
//! that `scripts/check-wasm-imports.py` can prove the core compiled for
//! `wasm32-unknown-unknown` needs nothing from its host: no clock, no randomness, no I/O.

use tokenwarden_core::{
    AgentId, Config, Coordinator, Decision, Input, LeaseRequest, Millis, Usage, parse_headers,
};

/// Runs a short lease cycle and returns a checksum of what happened (0 on a config error).
// Exporting an unmangled symbol is the point of this probe.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub extern "C" fn tokenwarden_probe(seed: u64) -> u64 {
    let Ok(config) = Config::from_json(
        r#"{"pools":[{"name":"p","input_tokens_per_minute":1000,"output_tokens_per_minute":100,"requests_per_minute":10,"max_concurrent":2}]}"#,
    ) else {
        return 0;
    };
    let Ok(mut c) = Coordinator::new(config, seed, Millis(0)) else {
        return 0;
    };
    let mut sum = 0u64;
    for i in 0..4u64 {
        let req = LeaseRequest {
            agent: AgentId(i),
            input_tokens: 400,
            max_tokens: 10,
            ..Default::default()
        };
        if let Ok(Decision::Grant { lease, .. }) = c.request_lease(Millis(i), &req) {
            let usage = Usage {
                input_tokens: 300,
                output_tokens: 5,
                ..Default::default()
            };
            let _ = c.settle(Millis(i + 1), lease, &usage);
            sum = sum.wrapping_add(lease.0);
        }
    }
    let report = parse_headers(
        [
            ("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ],
        Some(seed),
    );
    let _ = c.handle_response(Millis(10), tokenwarden_core::PoolId(0), None, 429, &report);
    while let Some(t) = c.poll_timeout() {
        c.handle_timeout(t);
        while c.poll_event().is_some() {
            sum = sum.wrapping_add(1);
        }
        if t > Millis(1_000_000) {
            break;
        }
    }
    // The host protocol, its input decoded from JSON as a host sends it.
    if let Ok(input) = serde_json::from_str::<Input>(
        r#"{"op":"call_lease","request":{"agent":9,"pool":0,"input_tokens":10}}"#,
    ) {
        if c.handle(Millis(30), &input).is_ok() {
            sum = sum.wrapping_add(1);
        }
    }
    let json = c.snapshot_json();
    if let Ok(restored) = Coordinator::restore_json(&json) {
        sum = sum.wrapping_add(restored.metrics(Millis(20)).pools.len() as u64);
    }
    sum.wrapping_add(json.len() as u64)
}
