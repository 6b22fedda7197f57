//! A host that runs the coordinator as a wasmtime plugin: a small fleet shares one pool,
//! the host drives time with poll_timeout/handle_timeout, and halfway through it hot-swaps
//! the component (here: the same build, or the file given as the first argument) without
//! losing a lease.
//!
//! ```text
//! cargo run -p tokenwarden-wasmtime --example host [path/to/tokenwarden-quota-v3.wasm]
//! ```

use tokenwarden_core::{AgentId, Decision, Event, LeaseId, LeaseRequest, Millis, Usage};
use tokenwarden_wasmtime::{COMPONENT, Error, Plugin};

const CONFIG: &str = r#"{
    "pools": [{ "name": "sonnet", "input_tokens_per_minute": 40000,
                "output_tokens_per_minute": 8000, "requests_per_minute": 50,
                "max_concurrent": 20 }]
}"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Plugin::default_engine()?;
    let plugin = Plugin::new(&engine, COMPONENT)?;
    println!(
        "compiled the built-in component ({} bytes)",
        COMPONENT.len()
    );

    let mut coord = plugin.coordinator(CONFIG, 42, Millis(0))?;
    let pool = coord.pool_id("sonnet")?.ok_or("no pool named sonnet")?;

    // Six agents ask for 15k input tokens each: two fit under the 85% margin, the rest queue.
    let mut now = Millis(0);
    let mut running: Vec<LeaseId> = Vec::new();
    for agent in 1..=6 {
        let req = LeaseRequest {
            agent: AgentId(agent),
            pool,
            input_tokens: 15_000,
            max_tokens: 800,
            ..Default::default()
        };
        match coord.request_lease(now, &req)? {
            Decision::Grant { lease, .. } => {
                println!("agent {agent}: granted {lease}");
                running.push(lease);
            }
            Decision::Queued { lease, eta } => println!("agent {agent}: {lease} queued, eta {eta}"),
            Decision::Reject { reason, retry_at } => {
                println!("agent {agent}: rejected ({reason:?}), retry at {retry_at:?}");
            }
            Decision::NeverFits { reason } => {
                println!("agent {agent}: never fits ({reason:?})");
            }
        }
    }

    // A provider answer with rate-limit headers: parsed inside the plugin.
    let report = coord.handle_response(
        now,
        pool,
        running.first().copied(),
        200,
        [
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "9000"),
        ],
        None,
    )?;
    println!(
        "headers: {} recognised, {} malformed",
        report.recognised, report.malformed
    );

    // Hot reload halfway: a new component (or the same build) takes over the state.
    let next = match std::env::args().nth(1) {
        Some(path) => Plugin::new(&engine, &std::fs::read(path)?)?,
        None => plugin.clone(),
    };
    let before = coord.snapshot()?;
    coord.reload(&next)?;
    assert_eq!(
        coord.snapshot()?,
        before,
        "reload keeps every lease, ticket and debt"
    );
    println!(
        "hot-reloaded: {} live leases carried over",
        coord.metrics(now)?.live_leases
    );

    // Settle the running calls, then drive time until every queued ticket is granted.
    for lease in running.drain(..) {
        now = now.plus(3_000);
        let usage = Usage {
            input_tokens: 14_000,
            output_tokens: 400,
            ..Default::default()
        };
        let s = coord.settle(now, lease, &usage)?;
        println!(
            "{lease} settled at {now}: used {:?} of {:?}",
            s.used.0, s.reserved.0
        );
    }
    let mut granted = 0;
    while let Some(t) = coord.poll_timeout()? {
        now = t;
        coord.handle_timeout(now)?;
        while let Some(event) = coord.poll_event()? {
            if let Event::Granted {
                lease,
                agent,
                waited_ms,
                ..
            } = event
            {
                println!(
                    "{now}: {lease} granted to agent {} after {waited_ms} ms",
                    agent.0
                );
                granted += 1;
                let usage = Usage {
                    input_tokens: 15_000,
                    output_tokens: 500,
                    ..Default::default()
                };
                coord.settle(now, lease, &usage)?;
            }
        }
        if granted == 2 {
            break;
        }
    }

    // Misuse is the core's error; a plugin failure would be Error::Plugin.
    match coord.cancel(now, LeaseId(999_999)) {
        Err(Error::Lease(e)) => println!("cancel of a forged id: {}", e.code()),
        other => println!("unexpected: {other:?}"),
    }
    Ok(())
}
