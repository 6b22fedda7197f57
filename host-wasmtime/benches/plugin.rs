//! The cost of running the coordinator as a wasmtime component instead of natively.
//!
//! * `call/request_lease+settle`: one grant and one settle, native vs plugin, same
//!   configuration and inputs, in the same run: natively by the typed methods and through
//!   `handle` (the protocol, as values), and in the plugin through `handle` (the protocol,
//!   as the core's JSON across the component boundary); the difference over two calls is
//!   the per-call overhead of the boundary and its encoding, fuel metering included;
//! * `instantiate`: a fresh instance from the shared `InstancePre` (store, limiter, fuel),
//!   then also creating a coordinator in it (which parses the JSON config in the guest).
//!
//! Run with `cargo bench -p tokenwarden-wasmtime --bench plugin`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_main};
use tokenwarden_core::{
    AgentId, Config, Coordinator, Decision, Input, LeaseId, LeaseRequest, Millis, Output, PoolId,
    Usage,
};
use tokenwarden_wasmtime::{COMPONENT, Limits, Plugin};

/// Limits far above what one request per millisecond uses, so every request is granted.
const CONFIG: &str = r#"{ "pools": [{ "name": "p", "input_tokens_per_minute": 1000000000000,
    "output_tokens_per_minute": 100000000000, "requests_per_minute": 1000000000 }] }"#;

fn request(i: u64) -> LeaseRequest {
    LeaseRequest {
        agent: AgentId(i % 64),
        pool: PoolId(0),
        input_tokens: 2_000 + i % 1_000,
        max_tokens: 500,
        ..Default::default()
    }
}

fn usage(i: u64) -> Usage {
    Usage {
        input_tokens: 1_900 + i % 1_000,
        output_tokens: 300,
        ..Default::default()
    }
}

fn granted(d: Decision) -> LeaseId {
    match d {
        Decision::Grant { lease, .. } => lease,
        other => panic!("bench expected a grant, got {other:?}"),
    }
}

fn granted_out(o: Output) -> LeaseId {
    match o {
        Output::Granted { lease, .. } => lease,
        other => panic!("bench expected a grant, got {other:?}"),
    }
}

fn ask(i: u64) -> Input {
    Input::RequestLease {
        request: request(i),
    }
}

fn settle(lease: LeaseId, i: u64) -> Input {
    Input::Settle {
        lease,
        usage: usage(i),
    }
}

fn plugin() -> Plugin {
    let engine = Plugin::default_engine().expect("engine");
    Plugin::new(&engine, COMPONENT).expect("component loads")
}

fn calls(c: &mut Criterion) {
    let mut g = c.benchmark_group("call");
    g.measurement_time(Duration::from_secs(5));
    let mut native = Coordinator::new(Config::from_json(CONFIG).unwrap(), 42, Millis(0)).unwrap();
    let mut i = 0u64;
    g.bench_function("request_lease+settle/native", |b| {
        b.iter(|| {
            i += 1;
            let now = Millis(i);
            let lease = granted(native.request_lease(now, black_box(&request(i))).unwrap());
            black_box(native.settle(now, lease, &usage(i)).unwrap());
        });
    });
    let mut native = Coordinator::new(Config::from_json(CONFIG).unwrap(), 42, Millis(0)).unwrap();
    let mut i = 0u64;
    g.bench_function("request_lease+settle/native_handle", |b| {
        b.iter(|| {
            i += 1;
            let now = Millis(i);
            let lease = granted_out(native.handle(now, black_box(&ask(i))).unwrap());
            let _ = black_box(native.handle(now, &settle(lease, i)).unwrap());
        });
    });
    let p = plugin();
    for (name, limits) in [
        ("request_lease+settle/plugin", Limits::default()),
        (
            "request_lease+settle/plugin_unmetered",
            Limits {
                fuel_per_call: None,
                ..Limits::default()
            },
        ),
    ] {
        let mut wasm = p
            .clone()
            .with_limits(limits)
            .coordinator(CONFIG, 42, Millis(0))
            .unwrap();
        let mut i = 0u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                i += 1;
                let now = Millis(i);
                let lease = granted_out(wasm.handle(now, black_box(&ask(i))).unwrap());
                let _ = black_box(wasm.handle(now, &settle(lease, i)).unwrap());
            });
        });
    }
    // Without fuel metering compiled in at all (an engine with consume_fuel off).
    let engine = wasmtime::Engine::default();
    let bare = Plugin::new(&engine, COMPONENT).unwrap();
    let mut wasm = bare.coordinator(CONFIG, 42, Millis(0)).unwrap();
    let mut i = 0u64;
    g.bench_function("request_lease+settle/plugin_no_fuel_engine", |b| {
        b.iter(|| {
            i += 1;
            let now = Millis(i);
            let lease = granted_out(wasm.handle(now, black_box(&ask(i))).unwrap());
            let _ = black_box(wasm.handle(now, &settle(lease, i)).unwrap());
        });
    });
    g.finish();
}

fn instantiate(c: &mut Criterion) {
    let mut g = c.benchmark_group("instantiate");
    let p = plugin();
    g.bench_function("instance_pre", |b| {
        b.iter(|| p.instantiate_only().unwrap());
    });
    g.bench_function("instance_pre+coordinator", |b| {
        b.iter(|| black_box(p.coordinator(CONFIG, 42, Millis(0)).unwrap()));
    });
    g.finish();
}

/// Every group, with criterion's command-line options.
fn benches() {
    let mut c = Criterion::default().configure_from_args();
    calls(&mut c);
    instantiate(&mut c);
}

criterion_main!(benches);
