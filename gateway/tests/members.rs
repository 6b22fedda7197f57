//! The members' inputs through a real coordinator: who may act, the fields refused and
//! named, the lease table kept from outputs and events, and the long polls it wakes.

use serde_json::{Value, json};
use tokenwarden_core::{Config, Coordinator, Input, Millis, Output};
use tokenwarden_gateway::Refusal;
use tokenwarden_gateway::members::{LeaseState, Members, Poll, Record, Who};
use tokenwarden_provider::identity::agent_id_for;

const SECRET: &str = "a-fleet-secret-of-32-characters";

fn setup(concurrent: u32) -> (Coordinator, Members) {
    let config = Config::from_json(&format!(
        r#"{{"pools":[{{"name":"main","input_tokens_per_minute":100000,"max_concurrent":{concurrent}}},
            {{"name":"batch","input_tokens_per_minute":100000}}]}}"#
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let c = Coordinator::new(config, 7, Millis(0)).unwrap_or_else(|e| panic!("{e}"));
    (c, Members::new(SECRET, vec!["main".into(), "batch".into()]))
}

fn apply(
    c: &mut Coordinator,
    m: &mut Members,
    who: Option<&Who>,
    input: Value,
) -> Result<Output, Refusal> {
    let out = m.apply(c, Millis(0), who, &input);
    while let Some(e) = c.poll_event() {
        m.event(&e, Millis(0));
    }
    out
}

fn lease_of(out: &Output) -> u64 {
    match out {
        Output::Granted { lease, .. } | Output::Queued { lease, .. } => lease.0,
        other => panic!("no lease in {other:?}"),
    }
}

fn refused(r: Result<Output, Refusal>) -> (u16, &'static str, Option<String>) {
    let e = r.expect_err("refused");
    (e.status, e.code, e.field)
}

fn ask(agent: Value) -> Value {
    json!({ "op": "request_lease", "request": { "agent": agent, "inputTokens": 100 } })
}

#[test]
fn a_credential_acts_for_its_own_agent_only() {
    let (mut c, mut m) = setup(4);
    let alice = m.who("alice");
    // Its own name, id or the fetch wrapper's number for it, or no agent at all.
    for given in [
        json!("alice"),
        json!(alice.id),
        json!(agent_id_for("alice")),
        Value::Null,
    ] {
        let out = apply(&mut c, &mut m, Some(&alice), ask(given.clone())).unwrap();
        let rec = &m.record(lease_of(&out)).unwrap();
        assert_eq!(
            (rec.agent, rec.name.as_deref()),
            (alice.id, Some("alice")),
            "{given}"
        );
    }
    assert_eq!(
        refused(apply(&mut c, &mut m, Some(&alice), ask(json!("bob")))),
        (403, "forbidden", None)
    );
    // A family named by a credential is refused unless it is its own (and then dropped).
    let fam = json!({ "op": "request_lease", "request": { "agent": "alice", "family": "bob" } });
    assert_eq!(refused(apply(&mut c, &mut m, Some(&alice), fam)).0, 403);
    // The fleet secret names anyone, by name (keyed id) or number.
    let out = apply(&mut c, &mut m, None, ask(json!("bob"))).unwrap();
    let bob = m.who("bob");
    assert_eq!(m.record(lease_of(&out)).unwrap().agent, bob.id);
    let out = apply(&mut c, &mut m, None, ask(json!(42))).unwrap();
    assert_eq!(m.record(lease_of(&out)).unwrap().name, None);
    assert_eq!(m.name_of(bob.id), Some("bob"));
}

#[test]
fn another_agents_lease_is_403_an_unknown_one_404_before_the_fields() {
    let (mut c, mut m) = setup(4);
    let alice = m.who("alice");
    let mallory = m.who("mallory");
    let lease = lease_of(&apply(&mut c, &mut m, Some(&alice), ask(json!("alice"))).unwrap());
    // Whatever the body holds, another agent's lease is 403.
    for op in ["settle", "cancel", "renew", "call_interrupted"] {
        let input = json!({ "op": op, "lease": lease, "junk": 1 });
        assert_eq!(
            refused(apply(&mut c, &mut m, Some(&mallory), input)),
            (403, "forbidden", None),
            "{op}"
        );
        let input = json!({ "op": op, "lease": 999_999 });
        assert_eq!(
            refused(apply(&mut c, &mut m, Some(&alice), input)).1,
            "unknown_lease",
            "{op}"
        );
    }
    // The owner's fields are then checked.
    let input =
        json!({ "op": "settle", "lease": lease, "usage": { "inputTokens": 90, "cached": 1 } });
    assert_eq!(
        refused(apply(&mut c, &mut m, Some(&alice), input)),
        (400, "invalid_argument", Some("cached".into()))
    );
    let input = json!({ "op": "settle", "lease": lease, "usage": { "inputTokens": 90 } });
    assert!(matches!(
        apply(&mut c, &mut m, Some(&alice), input),
        Ok(Output::Settled { .. })
    ));
    assert!(m.records().is_empty(), "a settled lease leaves the table");
}

#[test]
fn bad_fields_are_named() {
    let (mut c, mut m) = setup(4);
    let cases = [
        (json!({ "op": "hold", "pool": 0 }), "op"),
        (json!([1]), "input"),
        (json!({ "op": "request_lease", "request": 3 }), "request"),
        (
            json!({ "op": "request_lease", "request": { "agent": 1, "inputTokenz": 3 } }),
            "inputTokenz",
        ),
        (
            json!({ "op": "request_lease", "request": { "agent": 1 }, "extra": 1 }),
            "extra",
        ),
        (
            json!({ "op": "request_lease", "request": { "agent": "" } }),
            "agent",
        ),
        (
            json!({ "op": "request_lease", "request": { "agent": 1, "inputTokens": -1 } }),
            "inputTokens",
        ),
        (
            json!({ "op": "request_lease", "request": { "agent": 1, "task": "" } }),
            "task",
        ),
        (
            json!({ "op": "call_lease", "call": { "failed": -1 }, "request": { "agent": 1 } }),
            "call.failed",
        ),
        (
            json!({ "op": "call_lease", "call": { "x": 1 }, "request": { "agent": 1 } }),
            "call.x",
        ),
        (
            json!({ "op": "open_task", "task": { "task": 1, "role": "admiral" } }),
            "role",
        ),
        (
            json!({ "op": "open_task", "task": { "task": 1, "unblocks": 4_294_967_296_u64 } }),
            "unblocks",
        ),
        (
            json!({ "op": "task_failed", "task": 1, "signature": -3 }),
            "signature",
        ),
        (
            json!({ "op": "end_task", "task": 1, "outcome": "won" }),
            "outcome",
        ),
    ];
    for (input, field) in cases {
        let (status, _, named) = refused(apply(&mut c, &mut m, None, input.clone()));
        assert_eq!((status, named.as_deref()), (400, Some(field)), "{input}");
    }
    let r = apply(
        &mut c,
        &mut m,
        None,
        json!({ "op": "request_lease", "request": { "agent": 1, "pool": "nope" } }),
    );
    assert_eq!(refused(r), (400, "unknown_pool", Some("pool".into())));
    // A pool by name is its index.
    let out = apply(
        &mut c,
        &mut m,
        None,
        json!({ "op": "request_lease", "request": { "agent": 1, "pool": "batch" } }),
    )
    .unwrap();
    assert_eq!(m.record(lease_of(&out)).unwrap().pool, 1);
}

#[test]
fn a_report_is_evidence_about_one_granted_call_of_the_reporters() {
    let (mut c, mut m) = setup(1);
    let alice = m.who("alice");
    let granted = lease_of(&apply(&mut c, &mut m, Some(&alice), ask(json!("alice"))).unwrap());
    let ticket = lease_of(&apply(&mut c, &mut m, Some(&alice), ask(json!("alice"))).unwrap());
    let report = |lease: u64, pool: Value, headers: Value, status: u64| json!({ "op": "response", "lease": lease, "pool": pool, "status": status, "headers": headers });
    let ok = json!([["retry-after", "1"]]);
    let cases = [
        (
            report(ticket, Value::Null, ok.clone(), 429),
            409,
            Some("lease"),
        ),
        (
            report(granted, json!(1), ok.clone(), 429),
            400,
            Some("pool"),
        ),
        (
            report(granted, Value::Null, ok.clone(), 99),
            400,
            Some("status"),
        ),
        (
            report(granted, Value::Null, json!([["a"]]), 429),
            400,
            Some("headers[0]"),
        ),
        (
            report(granted, Value::Null, json!("a: b"), 429),
            400,
            Some("headers"),
        ),
        (
            report(granted, Value::Null, json!([["a", "x".repeat(8193)]]), 429),
            400,
            Some("headers[0]"),
        ),
        (
            json!({ "op": "response", "status": 429, "headers": [] }),
            400,
            Some("lease"),
        ),
    ];
    for (input, status, field) in cases {
        let (s, _, f) = refused(apply(&mut c, &mut m, Some(&alice), input.clone()));
        assert_eq!((s, f.as_deref()), (status, field), "{input}");
    }
    // Accepted: marked as reported (the core bounds the pause one report causes).
    let checked = m
        .check(Some(&alice), &report(granted, json!("main"), ok, 429))
        .unwrap();
    assert!(matches!(
        checked.input,
        Input::Response { reported: true, .. }
    ));
}

#[test]
fn the_table_follows_grants_revisions_expiries_and_cancels_and_wakes_polls() {
    let (mut c, mut m) = setup(1);
    let alice = m.who("alice");
    let first = lease_of(&apply(&mut c, &mut m, Some(&alice), ask(json!("alice"))).unwrap());
    let ticket = lease_of(&apply(&mut c, &mut m, Some(&alice), ask(json!("alice"))).unwrap());
    let id = json!(ticket);
    assert_eq!(m.record(ticket).unwrap().state, LeaseState::Queued);
    assert_eq!(
        m.wait(Some(&id), Some(&alice), 90_000),
        Ok(Poll::Hold(30_000))
    );
    assert!(matches!(
        m.wait(Some(&id), Some(&alice), 0),
        Ok(Poll::Answer { status: 202, .. })
    ));
    // The first settles: the ticket is granted from the line, and its poll woken.
    m.take_wakes();
    let settle = json!({ "op": "settle", "lease": first, "usage": { "inputTokens": 100 } });
    let _ = apply(&mut c, &mut m, Some(&alice), settle).unwrap();
    assert_eq!(m.take_wakes(), [ticket]);
    assert_eq!(m.record(ticket).unwrap().state, LeaseState::Granted);
    let Ok(Poll::Answer { status: 200, body }) = m.wait(Some(&id), Some(&alice), 5_000) else {
        panic!("granted answers at once")
    };
    assert_eq!(body["kind"], "grant");
    // Renewed: the new expiry kept.
    let renewed = apply(
        &mut c,
        &mut m,
        Some(&alice),
        json!({ "op": "renew", "lease": ticket }),
    )
    .unwrap();
    let Output::Renewed { expires_at } = renewed else {
        panic!("{renewed:?}")
    };
    assert_eq!(m.record(ticket).unwrap().expires_at, Some(expires_at.0));
    // Expired: gone, and a poll woken (to answer 404).
    let far = Millis(expires_at.0 + 1);
    let _ = c.handle(far, &Input::Timeout {}).unwrap();
    while let Some(e) = c.poll_event() {
        m.event(&e, far);
    }
    assert!(m.records().is_empty());
    assert_eq!(m.take_wakes(), [ticket]);
    assert_eq!(m.wait(Some(&id), None, 1).unwrap_err().status, 404);
}

#[test]
fn a_revision_wakes_a_poll_only_when_its_old_promise_would_pass_during_it() {
    let mut m = Members::new(SECRET, vec!["main".into()]);
    let rec = |eta| Record {
        state: LeaseState::Queued,
        agent: 1,
        name: None,
        pool: 0,
        eta: Some(eta),
        expires_at: None,
        waited_ms: None,
    };
    m.restore([(1, rec(10_000)), (2, rec(100_000))]);
    m.revised(1, 20_000, 0);
    m.revised(2, 120_000, 0);
    assert_eq!(m.take_wakes(), [1]);
    assert_eq!(m.record(2).unwrap().eta, Some(120_000));
}

#[test]
fn tasks_are_named_as_the_npm_package_names_them_and_members_own_theirs() {
    let (mut c, mut m) = setup(4);
    let alice = m.who("alice");
    let checked = m
        .check(
            Some(&alice),
            &json!({ "op": "open_task", "task": { "task": "fix-login", "unblocks": "3" } }),
        )
        .unwrap();
    let Input::OpenTask { task, member } = checked.input else {
        panic!()
    };
    assert_eq!(task.task.0, 358_998_486_657_506);
    assert_eq!(task.unblocks, 3);
    assert_eq!(member.map(|a| a.0), Some(alice.id));
    let open = json!({ "op": "open_task", "task": { "task": "fix-login" } });
    let _ = apply(&mut c, &mut m, Some(&alice), open).unwrap();
    let bob = m.who("bob");
    let end = json!({ "op": "end_task", "task": "fix-login", "outcome": "merged" });
    assert_eq!(
        refused(apply(&mut c, &mut m, Some(&bob), end.clone())).0,
        403
    );
    assert!(matches!(
        apply(&mut c, &mut m, Some(&alice), end),
        Ok(Output::TaskEnded { .. })
    ));
}

#[test]
fn a_hold_is_checked_and_the_table_stores_as_the_worker_stored_it() {
    let m = Members::new(SECRET, vec!["main".into(), "batch".into()]);
    assert!(matches!(
        m.hold(&json!({ "pool": "batch", "forMs": 5000 }), Millis(10)),
        Ok(Input::Hold { pool, until }) if pool.0 == 1 && until.0 == 5010
    ));
    for (body, field) in [
        (json!({ "forMs": 86_400_001 }), "forMs"),
        (json!({ "pool": "x", "forMs": 1 }), "pool"),
        (json!({ "pool": 2, "forMs": 1 }), "pool"),
        (json!({ "forMs": 1, "until": 3 }), "until"),
    ] {
        assert_eq!(
            m.hold(&body, Millis(0)).unwrap_err().field.as_deref(),
            Some(field),
            "{body}"
        );
    }
    // A record as the Worker's JavaScript wrote it reads back the same.
    let stored = r#"{"state":"granted","agent":5,"name":"a","pool":0,"expiresAt":9,"waitedMs":0}"#;
    let stored: Value = serde_json::from_str(stored).unwrap();
    let rec = Record::from_json(&stored).unwrap();
    assert_eq!(rec.to_json(), stored);
    let queued = r#"{"state":"queued","agent":5,"pool":1,"eta":12}"#;
    let queued: Value = serde_json::from_str(queued).unwrap();
    let rec = Record::from_json(&queued).unwrap();
    assert_eq!(
        (rec.state, rec.name.clone(), rec.eta),
        (LeaseState::Queued, None, Some(12))
    );
    assert_eq!(rec.to_json(), queued);
    assert!(Record::from_json(&json!({ "state": "gone", "agent": 1, "pool": 0 })).is_none());
}

#[test]
fn remote_drivers_are_counted_bounded_and_forgotten_after_a_minute() {
    let mut m = Members::new("secret-secret-secret", vec!["default".into()]);
    assert_eq!(m.seen(None, 0), 1, "the caller at least");
    assert_eq!(m.seen(Some("proc-a"), 0), 1);
    assert_eq!(m.seen(Some("proc-b"), 1_000), 2);
    assert_eq!(
        m.seen(Some("not a valid id!"), 1_000),
        2,
        "an id out of shape is not counted"
    );
    assert_eq!(m.seen(Some("proc-a"), 30_000), 2, "seen again: still one");
    assert_eq!(m.seen(None, 61_500), 1, "proc-b not seen for over a minute");
    for i in 0..2_000 {
        m.seen(Some(&format!("p{i}")), 62_000);
    }
    assert_eq!(m.seen(None, 62_000), 1_024, "bounded");
}

#[test]
fn metrics_name_their_agents_and_carry_the_ceilings() {
    let mut m = Members::new("secret-secret-secret", vec!["default".into()]);
    let alice = m.names().id("alice");
    let mut metrics = json!({ "agents": [
        { "agent": alice },
        { "agent": 7, "family": alice },
    ] });
    m.name_metrics(&mut metrics, Some(json!({ "since": 0, "pools": [] })));
    assert_eq!(metrics["agents"][0]["name"], "alice");
    assert_eq!(
        metrics["agents"][1]["name"],
        Value::Null,
        "a numeric agent has no name"
    );
    assert_eq!(metrics["agents"][1]["familyName"], "alice");
    assert!(metrics["agents"][0].get("familyName").is_none());
    assert_eq!(metrics["ceilings"]["pools"], json!([]));
}
