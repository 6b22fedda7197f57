//! Forged and corrupted states: deserializing or restoring one is an error, or gives a
//! coordinator that works (no panic, whatever is called next). Issue 25: `Coordinator`
//! derived `Deserialize` without the restore checks, and 2 of 10 forged states panicked
//! with an index out of bounds; every restore path accepted a bucket level above its cap.

use serde_json::{Value, json};
use std::panic::{AssertUnwindSafe, catch_unwind};
use tokenwarden_core::*;

fn busy() -> Coordinator {
    let config = Config::from_json(
        r#"{"pools":[{"name":"p","input_tokens_per_minute":40000,"output_tokens_per_minute":8000,
            "requests_per_minute":50,"max_concurrent":2},{"name":"q","requests_per_minute":10}],
            "metrics_minutes":3,"max_tasks":8}"#,
    )
    .unwrap();
    let mut c = Coordinator::new(config, 1, Millis(0)).unwrap();
    for (t, agent, pool, task) in [
        (0, 1, 0, Some(1)),
        (10, 2, 0, None),
        (20, 3, 0, Some(2)),
        (30, 2, 1, None),
        (40, 4, 0, None),
    ] {
        let req = LeaseRequest {
            agent: AgentId(agent),
            pool: PoolId(pool),
            input_tokens: 1_000,
            max_tokens: 500,
            task: task.map(TaskId),
            ..Default::default()
        };
        let _ = c.request_lease(Millis(t), &req);
    }
    c.task_failed(Millis(50), TaskId(1), 3).unwrap();
    c.check().unwrap();
    c
}

/// Everything a host may call, on a coordinator that came out of a restore.
fn exercise(c: &mut Coordinator) {
    let now = c.now();
    for i in 0..6u64 {
        let _ = c.request_lease(
            now.plus(i),
            &LeaseRequest {
                agent: AgentId(i % 3 + 1),
                pool: PoolId((i % 2) as u32),
                input_tokens: 100,
                max_tokens: 10,
                task: Some(TaskId(i % 3)),
                ..Default::default()
            },
        );
    }
    for id in [
        0u64,
        1,
        1 << 32,
        (1 << 32) + 1,
        (1 << 32) + 2,
        (2 << 32) + 3,
    ] {
        let _ = c.renew(now.plus(10), LeaseId(id));
        let _ = c.settle(
            now.plus(10),
            LeaseId(id),
            &Usage {
                input_tokens: 50,
                output_tokens: 5,
                ..Default::default()
            },
        );
        let _ = c.cancel(now.plus(11), LeaseId(id));
    }
    let r = parse_headers(
        [
            ("retry-after", "3"),
            ("anthropic-ratelimit-input-tokens-remaining", "10"),
        ],
        None,
    );
    let _ = c.handle_response(now.plus(12), PoolId(0), None, 429, &r);
    let _ = c.open_task(
        now.plus(13),
        &TaskSpec {
            task: TaskId(9),
            ..Default::default()
        },
    );
    let _ = c.end_task(now.plus(13), TaskId(1), TaskOutcome::Merged);
    for _ in 0..50 {
        match c.poll_timeout() {
            Some(t) => c.handle_timeout(t),
            None => break,
        }
        while c.poll_event().is_some() {}
    }
    c.handle_timeout(now.plus(400_000));
    let _ = c.metrics(now.plus(400_000));
    let _ = c.snapshot_json();
}

/// Every numeric leaf of `v`, by JSON pointer.
fn numbers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Number(_) => out.push(at),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .for_each(|(i, x)| numbers(x, format!("{at}/{i}"), out)),
        Value::Object(map) => map
            .iter()
            .for_each(|(k, x)| numbers(x, format!("{at}/{k}"), out)),
        _ => {}
    }
}

#[test]
fn forged_states_are_refused_or_work_never_panic() {
    let c = busy();
    let snap: Value = serde_json::from_str(&c.snapshot_json()).unwrap();
    let mut leaves = Vec::new();
    numbers(&snap["state"], String::new(), &mut leaves);
    // Histogram counts are thousands of leaves of one kind: a sample of them is enough.
    let leaves: Vec<_> = leaves
        .into_iter()
        .enumerate()
        .filter(|(i, p)| !(p.contains("/counts/")) || i % 97 == 0)
        .map(|(_, p)| p)
        .collect();
    assert!(leaves.len() > 150, "{} leaves", leaves.len());
    let forged_values = [
        json!(0),
        json!(1),
        json!(3),
        json!(99),
        json!(4_294_967_295u64),
        json!(u64::MAX),
        json!(-1),
        json!(1e300),
    ];
    let (mut refused, mut accepted) = (0, 0);
    for path in &leaves {
        for value in &forged_values {
            let mut state = snap["state"].clone();
            *state.pointer_mut(path).unwrap() = value.clone();
            let text = json!({ "version": 1, "state": state }).to_string();
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                let direct = serde_json::from_value::<Coordinator>(state.clone());
                let restored = Coordinator::restore_json(&text);
                assert_eq!(direct.is_ok(), restored.is_ok(), "{path} = {value}");
                if let Ok(mut c) = restored {
                    c.check().unwrap();
                    exercise(&mut c);
                    c.check().unwrap();
                    true
                } else {
                    false
                }
            }));
            match outcome {
                Ok(true) => accepted += 1,
                Ok(false) => refused += 1,
                Err(_) => panic!("{path} = {value}: a panic"),
            }
        }
    }
    assert!(
        refused > 0 && accepted > 0,
        "{refused} refused, {accepted} accepted"
    );
}

fn edited(edit: impl FnOnce(&mut Value)) -> Result<Coordinator, RestoreError> {
    let mut v: Value = serde_json::from_str(&busy().snapshot_json()).unwrap();
    edit(&mut v["state"]);
    let direct = serde_json::from_value::<Coordinator>(v["state"].clone());
    let restored = Coordinator::restore_json(&v.to_string());
    assert_eq!(direct.is_ok(), restored.is_ok());
    restored
}

#[test]
fn a_bucket_level_above_its_limit_is_refused() {
    // The input bucket of pool 0: limit × window token-ms is the most a level can hold (the
    // provider's own figure may raise it above the capacity, never above the limit); one
    // more is forged.
    let full = |s: &Value| s["pools"][0]["buckets"][0]["limit"].as_u64().unwrap() as i128 * 60_000;
    assert!(edited(|s| s["pools"][0]["buckets"][0]["level"] = json!(full(s))).is_ok());
    let e = edited(|s| s["pools"][0]["buckets"][0]["level"] = json!(full(s) + 1)).unwrap_err();
    assert_eq!(e.code(), "snapshot_corrupt", "{e}");
    let e = edited(|s| s["pools"][0]["buckets"][0]["level"] = json!(i64::MAX)).unwrap_err();
    assert_eq!(e.code(), "snapshot_corrupt", "{e}");
    // A capacity above the nominal one (limit × margin) would grant past the limit too.
    let e = edited(|s| s["pools"][0]["buckets"][0]["cap"] = json!(40_000)).unwrap_err();
    assert_eq!(e.code(), "snapshot_corrupt", "{e}");
}

/// An edit of a snapshot's state.
type Edit = Box<dyn Fn(&mut Value)>;

#[test]
fn out_of_range_indices_and_guarantee_breaking_fields_are_refused() {
    let cases: [(&str, Edit); 9] = [
        (
            "a lease in a pool that does not exist",
            Box::new(|s| s["leases"]["slots"][0]["entry"]["pool"] = json!(7)),
        ),
        (
            "a lease of an agent slot past the table",
            Box::new(|s| s["leases"]["slots"][0]["entry"]["agent_slot"] = json!(4_294_967_295u64)),
        ),
        (
            "an agent index past the slots",
            Box::new(|s| s["agents"]["index"]["1"] = json!(99)),
        ),
        (
            "a free lease slot past the table",
            Box::new(|s| s["leases"]["free"] = json!([99])),
        ),
        (
            "a queue head past its nodes",
            Box::new(|s| s["pools"][0]["queue"]["head"] = json!(99)),
        ),
        (
            "a metrics minute slot past the minutes",
            Box::new(|s| s["pools"][0]["minute_slot"] = json!(99)),
        ),
        (
            "a granted lease missing from the expiry queue",
            Box::new(|s| s["leases"]["expiries"] = json!([])),
        ),
        (
            "a lease expiring past now + lease_ttl_ms",
            Box::new(|s| {
                let e = &mut s["leases"]["slots"][0]["entry"]["phase"]["active"]["expires_at"];
                *e = json!(u64::MAX);
                s["leases"]["expiries"][0][0] = json!(u64::MAX);
            }),
        ),
        (
            "a pool paused past now + feedback.max_pause_ms",
            Box::new(|s| s["pools"][0]["paused_until"] = json!(u64::MAX)),
        ),
    ];
    for (what, edit) in cases {
        match edited(|s| edit(s)) {
            Err(e) => assert!(
                matches!(e.code(), "snapshot_corrupt" | "snapshot_parse"),
                "{what}: {e}"
            ),
            Ok(_) => panic!("{what} must be refused"),
        }
    }
}
