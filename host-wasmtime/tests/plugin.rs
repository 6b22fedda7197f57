//! The plugin's contract beyond the traces: it imports nothing, errors map to the core's,
//! a misbehaving plugin ends in an error value, and hot reload loses nothing.

mod common;

use common::plugin;
use tokenwarden_core::{
    AgentId, Call, Config, Coordinator, Decision, Event, LeaseError, LeaseId, LeaseRequest,
    LeaseStep, Millis, PoolId, Usage, Wait,
};
use tokenwarden_wasmtime::{COMPONENT, Error, Limits, Plugin, PluginError, WIT_INTERFACE};
use wasmtime::component::Component;

const CONFIG: &str = r#"{ "pools": [{ "name": "sonnet", "input_tokens_per_minute": 40000,
    "output_tokens_per_minute": 8000, "requests_per_minute": 50, "max_concurrent": 20 }] }"#;

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
        c.request_lease(Millis(0), &bad_pool),
        Err(Error::Lease(LeaseError::UnknownPool))
    );
    let mut huge = ask(1, 1 << 53);
    huge.input_tokens = 1 << 53;
    let e = c.request_lease(Millis(0), &huge).unwrap_err();
    assert_eq!(
        e.lease_error(),
        Some(LeaseError::TooLarge {
            field: "input_tokens"
        })
    );
    assert_eq!(e.code(), "too_large");
    assert_eq!(
        c.settle(Millis(0), LeaseId(12345), &Usage::default()),
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
        assert_eq!(
            Ok(native.request_lease(now, &ask(i, 15_000)).unwrap()),
            wasm.request_lease(now, &ask(i, 15_000))
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
    let Decision::Grant { lease, .. } = c.request_lease(Millis(0), &ask(1, 10_000)).unwrap() else {
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
    revived
        .settle(Millis(10), lease, &Usage::default())
        .expect("the lease survived in the checkpoint");
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
    let e = c
        .handle_response(
            Millis(0),
            PoolId(0),
            None,
            200,
            [("x-big", big.as_str())],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::Plugin(PluginError::MemoryLimit { limit_bytes }) if limit_bytes == 4 << 20),
        "{e:?}"
    );
    assert!(c.is_poisoned());
    // Below the cap all is well.
    let mut ok = capped.coordinator(CONFIG, 1, Millis(0)).unwrap();
    let report = ok
        .handle_response(
            Millis(0),
            PoolId(0),
            None,
            429,
            [("retry-after", "3"), ("x-big", &big[..1 << 20])],
            None,
        )
        .unwrap();
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
        let d = native.request_lease(Millis(i), &ask(i, 12_000)).unwrap();
        assert_eq!(Ok(d), wasm.request_lease(Millis(i), &ask(i, 12_000)));
        leases.push(d);
    }
    // Under-estimate one lease: debt.
    let Decision::Grant { lease, .. } = leases[0] else {
        panic!("first fits")
    };
    let usage = Usage {
        input_tokens: 30_000,
        output_tokens: 10,
        ..Default::default()
    };
    assert_eq!(
        Ok(native.settle(Millis(10), lease, &usage).unwrap()),
        wasm.settle(Millis(10), lease, &usage)
    );
    wasm.reload(&other).unwrap();
    assert_eq!(native.snapshot_json(), wasm.snapshot_json().unwrap());
    // Drive both to the end: the queued tickets are granted identically.
    let mut granted = 0;
    while let Some(t) = native.poll_timeout() {
        assert_eq!(Some(t), wasm.poll_timeout().unwrap());
        native.handle_timeout(t);
        wasm.handle_timeout(t).unwrap();
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
fn typed_calls_carry_every_field_of_the_cores_types() {
    // Agent 3 is agent 2's subagent, asking with a prefix the host saw cached.
    let family = |agent: u64, input_tokens: u64| LeaseRequest {
        family: Some(AgentId(2)),
        cached_prefix_tokens: 5_000,
        cached_prefix_confirmed: true,
        ..ask(agent, input_tokens)
    };
    let config = r#"{ "pools": [{ "name": "sonnet", "input_tokens_per_minute": 100000,
        "output_tokens_per_minute": 20000, "requests_per_minute": 1000,
        "max_concurrent": 4 }] }"#;
    let mut native = Coordinator::new(Config::from_json(config).unwrap(), 1, Millis(0)).unwrap();
    let mut wasm = plugin().coordinator(config, 1, Millis(0)).unwrap();
    let big = ask(1, 80_000);
    let Decision::Grant { lease, .. } = native.request_lease(Millis(0), &big).unwrap() else {
        panic!("the first call fits")
    };
    assert_eq!(
        wasm.request_lease(Millis(0), &big),
        Ok(Decision::Grant {
            lease,
            expires_at: Millis(120_000)
        })
    );
    // Queued calls through the call lifecycle: the wait's `expected` crosses too.
    let mut waits = Vec::new();
    for (agent, input_tokens) in [(2, 10_000), (3, 8_000)] {
        let (mut n, mut p) = (Call::default(), Call::default());
        let req = family(agent, input_tokens);
        let step = native.call_lease(Millis(0), &mut n, &req).unwrap();
        assert_eq!(wasm.call_lease(Millis(0), &mut p, &req), Ok(step));
        assert_eq!(n, p);
        let LeaseStep::Wait(
            wait @ Wait {
                ticket: Some(_), ..
            },
        ) = step
        else {
            panic!("queued behind the big call: {step:?}")
        };
        assert!(wait.expected <= wait.until, "{wait:?}");
        waits.push(wait);
    }
    // The family and the confirmed prefix reached the core: same state as native.
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
    assert_eq!(
        Ok(native.settle(Millis(100), lease, &usage).unwrap()),
        wasm.settle(Millis(100), lease, &usage)
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
fn the_core_s_role_crosses_through_handle_and_the_typed_call_says_so() {
    let mut c = plugin().coordinator(CONFIG, 1, Millis(0)).unwrap();
    let auto = LeaseRequest {
        role: tokenwarden_core::Role::Auto,
        ..ask(1, 10)
    };
    // WIT 3's typed records have no `auto`: the typed call refuses it by name.
    let e = c.request_lease(Millis(0), &auto).unwrap_err();
    assert_eq!(e.code(), "plugin_incompatible");
    assert!(e.to_string().contains("role `auto`"), "{e}");
    // Through `handle` (the core's Input as JSON) the plugin takes it.
    let out = c
        .handle(
            Millis(0),
            &tokenwarden_core::Input::RequestLease { request: auto },
        )
        .unwrap();
    assert!(
        matches!(out, tokenwarden_core::Output::Granted { .. }),
        "{out:?}"
    );
}
