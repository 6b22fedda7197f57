//! A host that runs the coordinator as a wasmtime plugin: a small fleet shares one pool,
//! the host speaks the core's protocol (`handle` with an `Input`, its `Output` back), drives
//! time with `poll_timeout` and the `timeout` input, and halfway through it hot-swaps
//! the component (here: the same build, or the file given as the first argument) without
//! losing a lease.
//!
//! ```text
//! cargo run -p tokenwarden-wasmtime --example host [path/to/tokenwarden-quota-v4.wasm]
//! ```

use tokenwarden_core::{AgentId, Event, Input, LeaseId, LeaseRequest, Millis, Output, Usage};
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
        let request = LeaseRequest {
            agent: AgentId(agent),
            pool,
            input_tokens: 15_000,
            max_tokens: 800,
            ..Default::default()
        };
        match coord.handle(now, &Input::RequestLease { request })? {
            Output::Granted { lease, .. } => {
                println!("agent {agent}: granted {lease}");
                running.push(lease);
            }
            Output::Queued { lease, eta } => println!("agent {agent}: {lease} queued, eta {eta}"),
            Output::Refused { reason, retry_at } => {
                println!("agent {agent}: refused ({reason:?}), retry at {retry_at:?}");
            }
            Output::NeverFits { reason } => {
                println!("agent {agent}: never fits ({reason:?})");
            }
            other => println!("agent {agent}: {other:?}"),
        }
    }

    // A provider answer with rate-limit headers: parsed inside the plugin.
    let answer = Input::Response {
        pool,
        lease: running.first().copied(),
        status: 200,
        headers: vec![
            (
                "anthropic-ratelimit-input-tokens-limit".into(),
                "40000".into(),
            ),
            (
                "anthropic-ratelimit-input-tokens-remaining".into(),
                "9000".into(),
            ),
        ],
        unix_now_ms: None,
        reported: false,
    };
    let Output::Reported { report } = coord.handle(now, &answer)? else {
        return Err("a response is answered with its report".into());
    };
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
        if let Output::Settled { settlement } =
            coord.handle(now, &Input::Settle { lease, usage })?
        {
            println!(
                "{lease} settled at {now}: used {:?} of {:?}",
                settlement.used.0, settlement.reserved.0
            );
        }
    }
    let mut granted = 0;
    while let Some(t) = coord.poll_timeout()? {
        now = t;
        let _timed_out = coord.handle(now, &Input::Timeout {})?;
        while let Some(event) = coord.poll_event()? {
            match event {
                Event::Granted {
                    lease,
                    agent,
                    waited_ms,
                    ..
                } => {
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
                    let _settled = coord.handle(now, &Input::Settle { lease, usage })?;
                }
                // The provider's headers said less was left than the core counted: the
                // promises behind it moved, each re-issued before its old one passed.
                Event::Revised { lease, eta, .. } => println!("{now}: {lease} now due by {eta}"),
                _ => {}
            }
        }
        if granted == 2 {
            break;
        }
    }

    // Misuse is the core's error; a plugin failure would be Error::Plugin.
    let forged = Input::Cancel {
        lease: LeaseId(999_999),
    };
    match coord.handle(now, &forged) {
        Err(Error::Lease(e)) => println!("cancel of a forged id: {}", e.code()),
        other => println!("unexpected: {other:?}"),
    }
    Ok(())
}
