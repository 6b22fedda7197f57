//! The criterion benchmarks `grant_settle` and `wfq/enqueue_dequeue/10000` as plain loops,
//! for counting their instructions: deterministic where wall time on a shared machine is
//! not (BENCHMARKS.md, issue 41). Count with valgrind, and subtract the set-up run:
//!
//! ```text
//! cargo build --release -p tokenwarden-core --example instructions
//! valgrind --tool=lackey --basic-counts=yes target/release/examples/instructions gs 200000
//! valgrind --tool=lackey --basic-counts=yes target/release/examples/instructions wfq 20000
//! valgrind --tool=lackey --basic-counts=yes target/release/examples/instructions wfq 20000 setup
//! ```
//!
//! `gs N`: N grant+settle pairs over eight agents; `wfq N`: 10,000 tickets queued, then N
//! rounds of one more queued and the held lease settled (its successor granted); with
//! `setup`, only the queueing.
use std::hint::black_box;

use tokenwarden_core::{AgentId, Decision, Event, LeaseRequest, Millis, Usage};

#[path = "../benches/support/mod.rs"]
mod support;

use support::{ROOMY_POOL, Sizes, coordinator, eight_agents, granted, role};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: instructions gs|wfq N [setup]";
    let n: u64 = args.get(2).and_then(|a| a.parse().ok()).expect(usage);
    if args.get(1).map(String::as_str) == Some("gs") {
        let mut coord = coordinator(&format!(
            r#"{{"pools":[{{"name":"p",{ROOMY_POOL},"max_concurrent":1000}}]}}"#
        ));
        let reqs = eight_agents();
        let mut now = 0;
        let mut i = 0;
        for _ in 0..n {
            now += 1;
            i = (i + 1) % reqs.len();
            let req = &reqs[i];
            let lease = granted(coord.request_lease(Millis(now), black_box(req)).unwrap());
            let usage = Usage {
                input_tokens: req.input_tokens,
                output_tokens: 300,
                ..Default::default()
            };
            black_box(coord.settle(Millis(now), lease, &usage).unwrap());
            while let Some(e) = coord.poll_event() {
                black_box(e);
            }
        }
    } else {
        let mut coord = coordinator(&format!(
            r#"{{"pools":[{{"name":"p",{ROOMY_POOL},"max_concurrent":1}}],
                    "max_queue_depth":1000000,"max_leases":1000000,"max_agents":4096,
                    "max_queue_wait_ms":2592000000,"lease_ttl_ms":2592000000}}"#
        ));
        let mut sizes = Sizes(0x9E37_79B9_7F4A_7C15);
        let mut k = 0u64;
        let mut next_req = move || {
            k += 1;
            let agent = k % 256;
            LeaseRequest {
                agent: AgentId(agent),
                input_tokens: sizes.next(500, 8_000),
                max_tokens: sizes.next(1_000, 4_000),
                role: role(agent),
                ..Default::default()
            }
        };
        let mut now = 1u64;
        let mut held = granted(coord.request_lease(Millis(now), &next_req()).unwrap());
        for _ in 0..10_000 {
            assert!(matches!(
                coord.request_lease(Millis(now), &next_req()).unwrap(),
                Decision::Queued { .. }
            ));
        }
        let usage = Usage {
            input_tokens: 3_000,
            output_tokens: 500,
            ..Default::default()
        };
        let base = if args.len() > 3 { 0 } else { n };
        for _ in 0..base {
            now += 1;
            let d = coord.request_lease(Millis(now), &next_req()).unwrap();
            let _ = black_box(d);
            coord.settle(Millis(now), held, &usage).unwrap();
            while let Some(e) = coord.poll_event() {
                if let Event::Granted { lease, .. } = e {
                    held = lease;
                }
            }
        }
    }
}
