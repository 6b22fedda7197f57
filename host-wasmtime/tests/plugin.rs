//! The plugin's contract beyond the traces: it imports nothing, errors map to the core's,
//! a misbehaving plugin ends in an error value, and hot reload loses nothing.

mod common;

use common::plugin;
use tokenwarden_core::{
    AgentId, Call, Config, Coordinator, Event, Input, LeaseError, LeaseId, LeaseRequest, Millis,
    Output, PoolId, Role, Usage, Wait,
};
use tokenwarden_wasmtime::{COMPONENT, Error, Limits, Plugin, PluginError, WIT_INTERFACE};
use wasmtime::component::Component;

const CONFIG: &str = r#"{ "pools": [{ "name": "sonnet", "input_tokens_per_minute": 40000,
    "output_tokens_per_minute": 8000, "requests_per_minute": 50, "max_concurrent": 20 }] }"#;

/// The core's `request_lease` input.
fn lease(request: LeaseRequest) -> Input {
    Input::RequestLease { request }
}

/// The core's `settle` input.
fn settle(lease: LeaseId, usage: Usage) -> Input {
    Input::Settle { lease, usage }
}

fn ask(agent: u64, input_tokens: u64) -> LeaseRequest {
    LeaseRequest {
        agent: AgentId(agent),
        pool: PoolId(0),
        input_tokens,
        max_tokens: 1_000,
        ..Default::default()
    }
}

#[test]
fn the_component_imports_nothing_and_exports_the_interface() {
    let engine = plugin().engine();
    let component = Component::new(engine, COMPONENT).unwrap();
    let ty = component.component_type();
    let imports: Vec<&str> = ty.imports(engine).map(|(name, _)| name).collect();
    assert!(imports.is_empty(), "the component imports {imports:?}");
    let exports: Vec<&str> = ty.exports(engine).map(|(name, _)| name).collect();
    assert_eq!(exports, [WIT_INTERFACE]);
}

#[test]
fn not_a_plugin_is_incompatible() {
    let engine = plugin().engine();
    // A core module, an empty component, garbage.
    let core_module = b"\0asm\x01\0\0\0";
    let empty_component = b"\0asm\x0d\0\x01\0";
    for bytes in [&core_module[..], &empty_component[..], b"not wasm"] {
        match Plugin::new(engine, bytes) {
            Err(Error::Plugin(PluginError::Incompatible(_))) => {}
            other => panic!("expected incompatible, got {other:?}"),
        }
    }
}

#[test]
fn errors_are_the_cores() {
    let mut c = plugin().coordinator(CONFIG, 1, Millis(0)).unwrap();
    let mut bad_pool = ask(1, 10);
    bad_pool.pool = PoolId(7);
    assert_eq!(
        c.handle(Millis(0), &lease(bad_pool)),
        Err(Error::Lease(LeaseError::UnknownPool))
    );
    let e = c.handle(Millis(0), &lease(ask(1, 1 << 53))).unwrap_err();
    assert_eq!(
        e.lease_error(),
        Some(LeaseError::TooLarge {
            field: "input_tokens"
        })
    );
    assert_eq!(e.code(), "too_large");
    assert_eq!(
        c.handle(Millis(0), &settle(LeaseId(12345), Usage::default())),
        Err(Error::Lease(LeaseError::UnknownLease))
    );
    assert_eq!(
        c.handle(
            Millis(0),
            &Input::Renew {
                lease: LeaseId(12345)
            }
        ),
        Err(Error::Lease(LeaseError::UnknownLease))
    );
    assert_eq!(c.pool_id("sonnet").unwrap(), Some(PoolId(0)));
    assert_eq!(c.pool_id("opus").unwrap(), None);

    let e = plugin().coordinator("{", 1, Millis(0)).unwrap_err();
    assert_eq!(e.code(), "config_parse");
    let e = plugin()
        .coordinator(
            r#"{ "pools": [{ "name": "a", "input_tokens_per_minute": 9007199254740992 }] }"#,
            1,
            Millis(0),
        )
        .unwrap_err();
    match &e {
        Error::Config { code, field, .. } => {
            assert_eq!(*code, "invalid_config");
            assert_eq!(field.as_deref(), Some("pools[0].input_tokens_per_minute"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        plugin().restore_json("{}").unwrap_err().code(),
        "snapshot_parse"
    );
    assert_eq!(
        plugin()
            .restore_json(r#"{"version": 99}"#)
            .unwrap_err()
            .code(),
        "snapshot_version"
    );
}

#[test]
fn same_answers_as_native_metrics_and_snapshot_included() {
    let mut native = Coordinator::new(Config::from_json(CONFIG).unwrap(), 9, Millis(0)).unwrap();
    let mut wasm = plugin().coordinator(CONFIG, 9, Millis(0)).unwrap();
    for i in 0..5u64 {
        let now = Millis(i * 100);
        let input = lease(ask(i, 15_000));
        assert_eq!(
            Ok(native.handle(now, &input).unwrap()),
            wasm.handle(now, &input)
        );
    }
    assert_eq!(native.poll_timeout(), wasm.poll_timeout().unwrap());
    assert_eq!(
        native.metrics(Millis(900)),
        wasm.metrics(Millis(900)).unwrap()
    );
    assert_eq!(native.snapshot(), wasm.snapshot().unwrap());
    assert_eq!(native.snapshot_json(), wasm.snapshot_json().unwrap());
}

#[test]
fn fuel_exhaustion_is_an_error_and_the_host_recovers() {
    let mut c = plugin().coordinator(CONFIG, 1, Millis(0)).unwrap();
    let Output::Granted { lease: held, .. } = c.handle(Millis(0), &lease(ask(1, 10_000))).unwrap()
    else {
        panic!("fits")
    };
    let checkpoint = c.snapshot_json().unwrap();

    // A budget too small to even parse the configuration.
    let starved = plugin().clone().with_limits(Limits {
        fuel_per_call: Some(1_000),
        ..Limits::default()
    });
    assert_eq!(
        starved.coordinator(CONFIG, 1, Millis(0)).unwrap_err(),
        Error::Plugin(PluginError::FuelExhausted)
    );

    // A failed hot reload leaves the coordinator on its old component, unchanged.
    assert_eq!(
        c.reload(&starved).unwrap_err(),
        Error::Plugin(PluginError::FuelExhausted)
    );
    assert!(!c.is_poisoned());
    assert_eq!(c.snapshot_json().unwrap(), checkpoint);

    // Running out in the middle of a call poisons that instance, not the host.
    c.set_fuel_per_call(Some(2_000));
    let e = c.metrics(Millis(0)).unwrap_err();
    assert_eq!(e, Error::Plugin(PluginError::FuelExhausted));
    assert_eq!(e.code(), "plugin_fuel_exhausted");
    assert!(c.is_poisoned());
    assert_eq!(c.poll_event(), Err(Error::Plugin(PluginError::Poisoned)));

    // Recovery: the last checkpoint in a fresh instance; the lease is still there.
    let mut revived = plugin().restore_json(&checkpoint).unwrap();
    let out = revived
        .handle(Millis(10), &settle(held, Usage::default()))
        .expect("the lease survived in the checkpoint");
    assert!(matches!(out, Output::Settled { .. }), "{out:?}");
}

#[test]
fn memory_limit_is_an_error_not_a_crash() {
    let capped = plugin().clone().with_limits(Limits {
        memory_bytes: 4 << 20,
        ..Limits::default()
    });
    let mut c = capped.coordinator(CONFIG, 1, Millis(0)).unwrap();
    // 8 MiB of headers must be copied into the plugin's memory: more than the cap.
    let big = "x".repeat(8 << 20);
    let response = |status: u16, headers: &[(&str, &str)]| Input::Response {
        pool: PoolId(0),
        lease: None,
        status,
        headers: headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
        unix_now_ms: None,
        reported: false,
    };
    let e = c
        .handle(Millis(0), &response(200, &[("x-big", big.as_str())]))
        .unwrap_err();
    assert!(
        matches!(e, Error::Plugin(PluginError::MemoryLimit { limit_bytes }) if limit_bytes == 4 << 20),
        "{e:?}"
    );
    assert!(c.is_poisoned());
    // Below the cap all is well.
    let mut ok = capped.coordinator(CONFIG, 1, Millis(0)).unwrap();
    let out = ok
        .handle(
            Millis(0),
            &response(429, &[("retry-after", "3"), ("x-big", &big[..1 << 20])]),
        )
        .unwrap();
    let Output::Reported { report } = out else {
        panic!("{out:?}")
    };
    assert_eq!(report.retry_after_ms, Some(3_000));
}

#[test]
fn hot_reload_keeps_leases_tickets_debt_and_events() {
    let config = Config::from_json(CONFIG).unwrap();
    let mut native = Coordinator::new(config, 5, Millis(0)).unwrap();
    let mut wasm = plugin().coordinator(CONFIG, 5, Millis(0)).unwrap();
    let other = Plugin::new(plugin().engine(), COMPONENT).unwrap();
    let mut leases = Vec::new();
    for i in 0..4u64 {
        let input = lease(ask(i, 12_000));
        let d = native.handle(Millis(i), &input).unwrap();
        assert_eq!(Ok(d.clone()), wasm.handle(Millis(i), &input));
        leases.push(d);
    }
    // Under-estimate one lease: debt.
    let Output::Granted { lease: first, .. } = leases[0] else {
        panic!("first fits")
    };
    let usage = Usage {
        input_tokens: 30_000,
        output_tokens: 10,
        ..Default::default()
    };
    let input = settle(first, usage);
    assert_eq!(
        Ok(native.handle(Millis(10), &input).unwrap()),
        wasm.handle(Millis(10), &input)
    );
    wasm.reload(&other).unwrap();
    assert_eq!(native.snapshot_json(), wasm.snapshot_json().unwrap());
    // Drive both to the end: the queued tickets are granted identically.
    let mut granted = 0;
    while let Some(t) = native.poll_timeout() {
        assert_eq!(Some(t), wasm.poll_timeout().unwrap());
        native.handle_timeout(t);
        assert_eq!(
            wasm.handle(t, &Input::Timeout {}).unwrap(),
            Output::TimedOut
        );
        wasm.reload(&other).unwrap();
        loop {
            let e = native.poll_event();
            assert_eq!(e, wasm.poll_event().unwrap());
            match e {
                Some(Event::Granted { .. }) => granted += 1,
                Some(_) => {}
                None => break,
            }
        }
        if t > Millis(600_000) {
            break;
        }
    }
    assert!(granted > 0, "queued tickets were granted after reloads");
    assert_eq!(native.snapshot_json(), wasm.snapshot_json().unwrap());
}

#[test]
fn every_field_of_the_cores_types_crosses() {
    // Agent 3 is agent 2's subagent, asking with a prefix the host saw cached, in the
    // `auto` role (the core's newest fields and variants).
    let family = |agent: u64, input_tokens: u64| LeaseRequest {
        family: Some(AgentId(2)),
        cached_prefix_tokens: 5_000,
        cached_prefix_confirmed: true,
        role: Role::Auto,
        ..ask(agent, input_tokens)
    };
    let config = r#"{ "pools": [{ "name": "sonnet", "input_tokens_per_minute": 100000,
        "output_tokens_per_minute": 20000, "requests_per_minute": 1000,
        "max_concurrent": 4 }] }"#;
    let mut native = Coordinator::new(Config::from_json(config).unwrap(), 1, Millis(0)).unwrap();
    let mut wasm = plugin().coordinator(config, 1, Millis(0)).unwrap();
    let big = lease(ask(1, 80_000));
    let Output::Granted { lease: held, .. } = native.handle(Millis(0), &big).unwrap() else {
        panic!("the first call fits")
    };
    assert_eq!(
        wasm.handle(Millis(0), &big),
        Ok(Output::Granted {
            lease: held,
            expires_at: Millis(120_000)
        })
    );
    // Queued calls through the call lifecycle: the wait's `expected` crosses too.
    let mut waits = Vec::new();
    for (agent, input_tokens) in [(2, 10_000), (3, 8_000)] {
        let input = Input::CallLease {
            call: Call::default(),
            request: family(agent, input_tokens),
        };
        let step = native.handle(Millis(0), &input).unwrap();
        assert_eq!(wasm.handle(Millis(0), &input), Ok(step.clone()));
        let Output::Wait {
            wait: wait @ Wait {
                ticket: Some(_), ..
            },
            ..
        } = step
        else {
            panic!("queued behind the big call: {step:?}")
        };
        assert!(wait.expected <= wait.until, "{wait:?}");
        waits.push(wait);
    }
    // The family, the role and the confirmed prefix reached the core: same state as native.
    assert_eq!(native.snapshot_json(), wasm.snapshot_json().unwrap());
    assert_eq!(
        native.metrics(Millis(50)),
        wasm.metrics(Millis(50)).unwrap()
    );
    // A call over its reservation revises the promises behind it.
    let usage = Usage {
        input_tokens: 95_000,
        output_tokens: 10,
        ..Default::default()
    };
    let input = settle(held, usage);
    assert_eq!(
        Ok(native.handle(Millis(100), &input).unwrap()),
        wasm.handle(Millis(100), &input)
    );
    let mut revised = Vec::new();
    loop {
        let e = native.poll_event();
        assert_eq!(wasm.poll_event(), Ok(e));
        match e {
            Some(Event::Revised { lease, eta, .. }) => revised.push((lease, eta)),
            Some(_) => {}
            None => break,
        }
    }
    assert!(
        !revised.is_empty(),
        "the queued tickets' promises were revised"
    );
    for (ticket, eta) in revised {
        let wait = waits.iter().find(|w| w.ticket == Some(ticket)).unwrap();
        assert!(
            eta > wait.until,
            "a revised promise is later: {eta:?} {wait:?}"
        );
    }
}

#[test]
fn a_refused_input_changes_nothing_and_leaves_the_plugin_usable() {
    let mut c = plugin().coordinator(CONFIG, 1, Millis(0)).unwrap();
    let before = c.snapshot_json().unwrap();
    let e = c
        .handle(
            Millis(0),
            &Input::Renew {
                lease: LeaseId(1 << 60),
            },
        )
        .unwrap_err();
    assert!(matches!(e, Error::Lease(_)), "{e:?}");
    assert_eq!(c.snapshot_json().unwrap(), before);
    assert!(!c.is_poisoned());
    assert!(matches!(
        c.handle(Millis(1), &lease(ask(1, 10))),
        Ok(Output::Granted { .. })
    ));
}
