use super::*;

#[test]
fn camel_recases_keys_only() {
    assert_eq!(camel("input_tokens_per_minute"), "inputTokensPerMinute");
    assert_eq!(camel("p50_ms"), "p50Ms");
    assert_eq!(camel("agent"), "agent");
    let v = serde_json::json!({"binding_axis": "input_tokens", "axes": [{"last_minute": 1}]});
    assert_eq!(
        camel_keys(v),
        serde_json::json!({"bindingAxis": "input_tokens", "axes": [{"lastMinute": 1}]})
    );
}

#[test]
fn numbers_are_exact_integers_only() {
    assert_eq!(u64_from_f64(5.0, "x").ok(), Some(5));
    assert_eq!(u64_from_f64(-0.0, "x").ok(), Some(0));
    // The largest double below 2^64, and 2^53 + 2 (exact as a double).
    assert_eq!(
        u64_from_f64(18_446_744_073_709_549_568.0, "x").ok(),
        Some(18_446_744_073_709_549_568)
    );
    assert_eq!(
        u64_from_f64(9_007_199_254_740_994.0, "x").ok(),
        Some(9_007_199_254_740_994)
    );
    for bad in [
        -1.0,
        1.5,
        0.5,
        1e-300,
        4_503_599_627_370_495.5,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::INFINITY,
        18_446_744_073_709_551_616.0,
    ] {
        let e = u64_from_f64(bad, "x").unwrap_err();
        assert_eq!(
            (e.kind, e.code, e.field.as_deref()),
            (ErrorKind::Range, "invalid_argument", Some("x"))
        );
    }
    assert!(
        u64_from_f64(-1.0, "now")
            .unwrap_err()
            .message
            .contains("got -1")
    );
    assert_eq!(u32_from_f64(7.0, "pool").ok(), Some(7));
    assert!(u32_from_f64(4_294_967_296.0, "pool").is_err());
    assert_eq!(u32_from_f64(4_294_967_295.0, "pool").ok(), Some(u32::MAX));
    for bad in [-1.0, 0.5, 7.25, f64::NAN, f64::INFINITY] {
        assert!(u32_from_f64(bad, "pool").is_err(), "{bad}");
    }
    assert_eq!(
        u64_from_bigint(false, u64::MAX, true, "x").ok(),
        Some(u64::MAX)
    );
    assert!(u64_from_bigint(true, 1, true, "x").is_err());
    assert!(u64_from_bigint(false, 1, false, "x").is_err());
}

#[test]
fn core_errors_keep_their_codes() {
    let e = ArgError::from(core::LeaseError::TooLarge {
        field: "input_tokens",
    });
    assert_eq!(
        (e.kind, e.code, e.field.as_deref()),
        (ErrorKind::Range, "too_large", Some("inputTokens"))
    );
    let e = ArgError::from(core::LeaseError::UnknownLease);
    assert_eq!((e.kind, e.code), (ErrorKind::Error, "unknown_lease"));
}

#[test]
fn a_decision_that_fits_is_written_and_one_that_does_not_is_wide() {
    let mut io = [0.0; io::IO_SLOTS];
    let d = core::Decision::Queued {
        lease: core::LeaseId(7),
        eta: core::Millis(1234),
    };
    assert_eq!(io::io_decision(&mut io, &d), io::DECISION_QUEUED);
    assert_eq!(&io[..2], &[7.0, 1234.0]);
    let d = core::Decision::Grant {
        lease: core::LeaseId(7),
        expires_at: core::Millis(MAX_SAFE + 1),
    };
    assert_eq!(io::io_decision(&mut io, &d), io::WIDE);
    let d = core::Decision::Reject {
        retry_at: core::Millis(5_000),
        reason: core::RejectReason::QueueFull,
    };
    assert_eq!(io::io_decision(&mut io, &d), io::DECISION_REJECT);
    assert_eq!(&io[..3], &[0.0, 5_000.0, 2.0]);
    let d = core::Decision::NeverFits {
        reason: core::RejectReason::ExceedsCapacity {
            axis: core::Axis::OutputTokens,
        },
    };
    assert_eq!(io::io_decision(&mut io, &d), io::DECISION_NEVER);
    assert_eq!(&io[..4], &[0.0, -1.0, 0.0, 1.0]);
}

/// The committed TypeScript mirror is what the tables generate.
#[test]
fn typescript_mirror_is_current() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../driver/ts/abi.ts");
    let want = typescript();
    if std::env::var_os("UPDATE_ABI").is_some() {
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is out of date: run `UPDATE_ABI=1 cargo test -p tokenwarden-js-abi` and commit it",
        path.display()
    );
}

/// The object keys of a serialized core value, camelCased.
fn camel_fields<T: serde::Serialize>(v: &T) -> std::collections::BTreeSet<String> {
    match serde_json::to_value(v) {
        Ok(Value::Object(map)) => map.keys().map(|k| camel(k)).collect(),
        other => panic!("not an object: {other:?}"),
    }
}

fn tag<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        Ok(Value::Object(map)) => map["kind"].as_str().unwrap_or_default().to_owned(),
        other => panic!("no tag: {other:?}"),
    }
}

#[test]
fn lease_request_fields_are_the_cores_in_slot_order() {
    let names: std::collections::BTreeSet<String> = io::LEASE_REQUEST_FIELDS
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    assert_eq!(names, camel_fields(&core::LeaseRequest::default()));
    // Slot 1 + i carries field i: give each a distinct value and read it back by name.
    let mut regs = [0.0; io::IO_SLOTS];
    for (i, slot) in regs[1..=io::LEASE_REQUEST_FIELDS.len()]
        .iter_mut()
        .enumerate()
    {
        *slot = 10.0 + i as f64;
    }
    let role = io::LEASE_REQUEST_FIELDS
        .iter()
        .position(|f| *f == "role")
        .unwrap_or(99);
    regs[1 + role] = 1.0;
    let flag = io::LEASE_REQUEST_FIELDS
        .iter()
        .position(|f| *f == "cachedPrefixConfirmed")
        .unwrap_or(99);
    regs[1 + flag] = 1.0;
    let req = io::io_lease_request(&regs).unwrap_or_else(|e| panic!("{e:?}"));
    let read = camel_value(&req).unwrap_or_else(|e| panic!("{e:?}"));
    for (i, field) in io::LEASE_REQUEST_FIELDS.iter().enumerate() {
        let want = if i == role {
            serde_json::json!(tag(&io::ROLES[1]))
        } else if i == flag {
            serde_json::json!(true)
        } else {
            serde_json::json!(10 + i)
        };
        assert_eq!(read[*field], want, "slot {} is `{field}`", 1 + i);
    }
}

#[test]
fn usage_fields_are_the_cores_in_slot_order() {
    let names: std::collections::BTreeSet<String> =
        io::USAGE_FIELDS.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(names, camel_fields(&core::Usage::default()));
    let mut regs = [0.0; io::IO_SLOTS];
    for (i, slot) in regs[2..2 + io::USAGE_FIELDS.len()].iter_mut().enumerate() {
        *slot = 10.0 + i as f64;
    }
    let (_, usage) = io::io_settle(&regs).unwrap_or_else(|e| panic!("{e:?}"));
    let read = camel_value(&usage).unwrap_or_else(|e| panic!("{e:?}"));
    for (i, field) in io::USAGE_FIELDS.iter().enumerate() {
        assert_eq!(
            read[*field],
            serde_json::json!(10 + i),
            "slot {} is `{field}`",
            2 + i
        );
    }
}

#[test]
fn every_role_has_its_code() {
    for role in [
        core::Role::Worker,
        core::Role::Reviewer,
        core::Role::Planner,
        core::Role::Auto,
    ] {
        // (A new role fails to compile here until it is listed.)
        match role {
            core::Role::Worker | core::Role::Reviewer | core::Role::Planner | core::Role::Auto => {}
        }
        let code = io::ROLES.iter().position(|r| *r == role);
        let mut regs = [0.0; io::IO_SLOTS];
        regs[6] = code.unwrap_or_else(|| panic!("{role:?} has no code")) as f64;
        assert_eq!(io::io_lease_request(&regs).map(|r| r.role), Ok(role));
    }
    for (name, role) in io::ROLE_NAMES.iter().zip(io::ROLES) {
        assert_eq!(tag(&role), *name, "ROLE_NAMES follows the core's tags");
    }
    let mut regs = [0.0; io::IO_SLOTS];
    regs[6] = f64::NAN;
    let e = io::io_lease_request(&regs).unwrap_err();
    assert_eq!(
        (e.field.as_deref(), e.message.as_str()),
        (
            Some("role"),
            "`role` must be planner, reviewer, worker or auto"
        )
    );
}

#[test]
fn reject_reasons_and_axes_are_written_as_their_codes() {
    let reasons = [
        core::RejectReason::ExceedsCapacity {
            axis: core::Axis::Requests,
        },
        core::RejectReason::WaitTooLong,
        core::RejectReason::QueueFull,
        core::RejectReason::TooManyLeases,
        core::RejectReason::TooManyAgents,
    ];
    for reason in reasons {
        match reason {
            core::RejectReason::ExceedsCapacity { .. }
            | core::RejectReason::WaitTooLong
            | core::RejectReason::QueueFull
            | core::RejectReason::TooManyLeases
            | core::RejectReason::TooManyAgents => {}
        }
        let mut regs = [0.0; io::IO_SLOTS];
        let d = core::Decision::Reject {
            retry_at: core::Millis(1),
            reason,
        };
        assert_eq!(io::io_decision(&mut regs, &d), io::DECISION_REJECT);
        assert_eq!(io::REJECT_REASONS[regs[2] as usize], tag(&reason));
    }
    for (code, axis) in io::AXES.iter().enumerate() {
        let mut regs = [0.0; io::IO_SLOTS];
        let d = core::Decision::NeverFits {
            reason: core::RejectReason::ExceedsCapacity { axis: *axis },
        };
        let _ = io::io_decision(&mut regs, &d);
        assert_eq!(regs[3] as usize, code, "{axis:?}");
    }
    assert_eq!(io::AXES, core::Axis::ALL);
}

#[test]
fn events_are_returned_as_their_codes() {
    let (lease, agent, pool, t) = (
        core::LeaseId(1),
        core::AgentId(2),
        core::PoolId(0),
        core::Millis(3),
    );
    let events = [
        core::Event::Granted {
            lease,
            agent,
            pool,
            expires_at: t,
            waited_ms: 4,
        },
        core::Event::Expired { lease, agent, pool },
        core::Event::MarginChanged {
            pool,
            from_permille: 850,
            to_permille: 800,
            reason: core::MarginReason::RateLimited,
        },
        core::Event::Paused { pool, until: t },
        core::Event::EstimateAlert {
            agent,
            error_permille: 300,
        },
        core::Event::MarginAtFloor {
            pool,
            axis: Some(core::Axis::InputTokens),
            margin_permille: 600,
            since: t,
        },
        core::Event::Revised {
            lease,
            agent,
            pool,
            eta: t,
        },
    ];
    assert_eq!(events.len(), io::EVENTS.len());
    for e in events {
        let mut regs = [0.0; io::IO_SLOTS];
        let code = io::io_event(&mut regs, &e);
        assert_eq!(
            io::EVENTS.get(code as usize).copied(),
            Some(tag(&e).as_str())
        );
    }
    for reason in [
        core::MarginReason::RateLimited,
        core::MarginReason::Recovered,
        core::MarginReason::Confirmed,
        core::MarginReason::HeadersDisagreed,
    ] {
        let mut regs = [0.0; io::IO_SLOTS];
        let e = core::Event::MarginChanged {
            pool,
            from_permille: 850,
            to_permille: 860,
            reason,
        };
        io::io_event(&mut regs, &e);
        let tag = serde_json::to_value(reason).unwrap_or_default();
        assert_eq!(
            io::MARGIN_REASONS.get(regs[3] as usize).copied(),
            tag.as_str(),
            "{reason:?}"
        );
    }
}

#[test]
fn error_codes_are_listed_once_each() {
    let codes: Vec<&str> = [
        core::LeaseError::UnknownPool.code(),
        core::LeaseError::UnknownLease.code(),
        core::LeaseError::NotGranted.code(),
        core::LeaseError::TooLarge { field: "x" }.code(),
        core::LeaseError::UnknownTask.code(),
        core::LeaseError::TooManyTasks.code(),
        core::LeaseError::Forbidden.code(),
        core::RestoreError::UnsupportedVersion(9).code(),
        core::RestoreError::Corrupt("x").code(),
        ArgError::type_error(String::new()).code,
        "internal",
    ]
    .into_iter()
    .chain(core::Config::from_json("{").err().map(|e| e.code()))
    .chain(
        core::Config::from_json(r#"{"pools":[]}"#)
            .err()
            .map(|e| e.code()),
    )
    .chain(core::Coordinator::restore_json("{").err().map(|e| e.code()))
    .collect();
    for c in &codes {
        assert!(ERROR_CODES.contains(c), "{c} is not in ERROR_CODES");
    }
    let mut sorted = ERROR_CODES.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), ERROR_CODES.len(), "a code is listed twice");
}

#[test]
fn call_steps_are_written_with_the_cores_tags() {
    let call = core::Call {
        failed: 2,
        refusals: 1,
        last_retry_after_ms: Some(7000),
    };
    let waits = [
        core::WaitReason::Queued,
        core::WaitReason::Refused,
        core::WaitReason::RateLimited,
        core::WaitReason::Overloaded,
    ];
    for reason in waits {
        let step = core::CallStep::Wait(core::Wait {
            until: core::Millis(5000),
            expected: core::Millis(3000),
            reason,
            ticket: Some(core::LeaseId(42)),
            refusal: Some(core::RejectReason::ExceedsCapacity {
                axis: core::Axis::OutputTokens,
            }),
            attempt: 3,
            checkpoint: true,
        });
        let mut regs = [0.0; io::IO_SLOTS];
        assert_eq!(io::io_call_step(&mut regs, &call, &step), io::STEP_WAIT);
        assert_eq!(
            &regs[..11],
            &[
                2.0, 1.0, 7000.0, 42.0, 5000.0, regs[5], 0.0, 1.0, 3.0, 1.0, -1.0
            ]
        );
        assert_eq!(io::WAIT_REASONS[regs[5] as usize], tag(&reason));
        assert_eq!(regs[io::call::EXPECTED], 3000.0);
    }
    for reason in [
        core::GiveUpReason::NeverFits,
        core::GiveUpReason::Refusals,
        core::GiveUpReason::Attempts,
    ] {
        let step = core::CallStep::GiveUp(core::GiveUp {
            reason,
            refusal: None,
            attempts: 4,
            last_retry_after_ms: None,
        });
        let mut regs = [0.0; io::IO_SLOTS];
        assert_eq!(io::io_call_step(&mut regs, &call, &step), io::STEP_GIVE_UP);
        assert_eq!(
            (regs[3], regs[6], regs[8], regs[10]),
            (-1.0, -1.0, 4.0, -1.0)
        );
        assert_eq!(io::GIVE_UP_REASONS[regs[5] as usize], tag(&reason));
    }
    let mut regs = [0.0; io::IO_SLOTS];
    let send = core::CallStep::Send {
        lease: core::LeaseId(9),
        expires_at: core::Millis(u64::MAX),
    };
    assert_eq!(
        io::io_call_step(&mut regs, &call, &send),
        io::WIDE,
        "an instant above 2^53 needs takeWide"
    );
    assert_eq!(
        io::io_call_step(&mut regs, &call, &core::CallStep::Deliver),
        io::STEP_DELIVER
    );
}

#[test]
fn response_headers_cross_as_one_string_and_the_report_as_slots() {
    let mut regs = [0.0; io::IO_SLOTS];
    regs[..8].copy_from_slice(&[
        1000.0,
        0.0,
        -1.0,
        429.0,
        1_700_000_000_000.0,
        0.0,
        0.0,
        -1.0,
    ]);
    let text = "retry-after\n7\nanthropic-ratelimit-input-tokens-limit\n80000\nx-empty\n\n";
    let r = io::io_response(&regs, text).expect("parses");
    assert_eq!((r.now, r.lease, r.status), (core::Millis(1000), None, 429));
    let pairs = [
        ("retry-after", "7"),
        ("anthropic-ratelimit-input-tokens-limit", "80000"),
        ("x-empty", ""),
    ];
    let want = core::parse_headers(pairs, Some(1_700_000_000_000));
    assert_eq!(r.report, want);
    assert!(io::io_report(&mut regs, &r.report));
    let at = io::REPORT_SLOT;
    assert_eq!(regs[at], f64::from(want.recognised));
    assert_eq!(regs[at + 2], 7000.0, "retry after, ms");
    let input = io::RATE_AXES
        .iter()
        .position(|a| *a == "input_tokens")
        .unwrap();
    assert_eq!(regs[at + 6 + 4 * input], 80000.0, "input tokens limit");
    assert_eq!(regs[at + 6 + 4 * input + 1], -1.0, "no remaining given");
    // The axes' tags are the core's.
    for (i, name) in io::RATE_AXES.iter().enumerate() {
        let _ = i;
        let v: core::headers::RateAxis =
            serde_json::from_value(Value::String((*name).into())).expect("a rate axis tag");
        assert_eq!(tag(&v), *name);
    }
    assert!(
        io::io_response(&regs, "")
            .expect("no headers")
            .report
            .recognised
            == 0
    );
    for bad in ["retry-after\n7", "retry-after\n"] {
        let e = io::io_response(&regs, bad).err().expect("refused");
        assert_eq!(e.field.as_deref(), Some("headers"), "{bad:?}");
    }
}

#[test]
fn camel_json_is_camel_keys_as_text() {
    let config = core::Config::from_json(
        r#"{"pools":[{"name":"p","input_tokens_per_minute":100000,"output_tokens_per_minute":20000,"requests_per_minute":100,"max_concurrent":2}]}"#,
    )
    .expect("config");
    let mut c = core::Coordinator::new(config, 7, core::Millis(0)).expect("coordinator");
    c.open_task(
        core::Millis(0),
        &core::TaskSpec {
            task: core::TaskId(3),
            role: core::Role::Planner,
            unblocks: 2,
        },
    )
    .expect("task");
    for agent in 1..=4 {
        let req = core::LeaseRequest {
            agent: core::AgentId(agent),
            input_tokens: 1_000,
            max_tokens: 500,
            task: Some(core::TaskId(3)),
            ..Default::default()
        };
        let _ = c.request_lease(core::Millis(agent), &req).expect("lease");
    }
    let report = core::parse_headers(
        [("retry-after", "7"), ("x-ratelimit-limit-requests", "100")],
        Some(0),
    );
    let metrics = c.metrics(core::Millis(70_000));
    for (what, text, value) in [
        (
            "metrics",
            camel_json(&metrics),
            serde_json::to_value(&metrics),
        ),
        ("report", camel_json(&report), serde_json::to_value(report)),
    ] {
        let text = text.unwrap_or_else(|| panic!("{what}: every number fits"));
        let parsed: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(parsed, camel_keys(value.expect("serializes")), "{what}");
        assert!(!text.contains("_ms\""), "{what}: keys recased");
    }
    // Enum tags (values) keep their snake_case; a wide integer is refused.
    let step = core::CallStep::Wait(core::Wait {
        until: core::Millis(5),
        expected: core::Millis(5),
        reason: core::WaitReason::RateLimited,
        ticket: None,
        refusal: None,
        attempt: 1,
        checkpoint: false,
    });
    assert!(
        camel_json(&step)
            .expect("fits")
            .contains("\"rate_limited\"")
    );
    let wide = core::CallStep::Send {
        lease: core::LeaseId(1),
        expires_at: core::Millis(MAX_SAFE + 1),
    };
    assert_eq!(camel_json(&wide), None);
    let edge = core::CallStep::Send {
        lease: core::LeaseId(1),
        expires_at: core::Millis(MAX_SAFE),
    };
    assert!(
        camel_json(&edge)
            .expect("2^53 - 1 fits")
            .contains("9007199254740991")
    );
    let escaped =
        serde_json::json!({ "a_b": "say \"c_d\": e_f", "g_h": [-12, 1.5e3, { "i_j": null }] });
    let parsed: Value = serde_json::from_str(&camel_json(&escaped).expect("fits")).expect("JSON");
    assert_eq!(parsed, camel_keys(escaped));
}

#[test]
fn handle_decodes_camel_case_input_and_names_the_bad_field() {
    let config = core::Config::from_json(
        r#"{"pools":[{"name":"p","input_tokens_per_minute":100000,"output_tokens_per_minute":20000}]}"#,
    )
    .unwrap();
    let mut c = core::Coordinator::new(config, 1, core::Millis(0)).unwrap();
    let out = crate::handle(
        &mut c,
        0,
        r#"{"op":"request_lease","request":{"agent":1,"pool":0,"inputTokens":1000,"maxTokens":10}}"#,
    )
    .unwrap();
    assert!(matches!(out, core::Output::Granted { .. }), "{out:?}");
    let mut bad = |input: &str| crate::handle(&mut c, 1, input).unwrap_err();
    let e = bad(r#"{"op":"request_lease","request":{"agent":1,"pool":0,"inputTokens":-1}}"#);
    assert_eq!(
        (e.code, e.field.as_deref()),
        ("invalid_argument", Some("inputTokens")),
        "{e:?}"
    );
    assert!(e.message.contains("`request.inputTokens`"), "{}", e.message);
    let e = bad(r#"{"op":"request_lease","request":{"agent":1,"pool":1099511627776}}"#);
    assert_eq!(e.field.as_deref(), Some("pool"), "{e:?}");
    let e = bad(r#"{"op":"request_lease","request":{"agent":1,"pool":0,"role":"admiral"}}"#);
    assert_eq!(e.field.as_deref(), Some("role"), "{e:?}");
    let e = bad(r#"{"op":"settle","lease":1,"usage":{"input_tokens":5}}"#);
    assert_eq!(e.field.as_deref(), Some("input_tokens"), "{e:?}");
    assert!(
        e.message.contains("did you mean `inputTokens`"),
        "{}",
        e.message
    );
    let e = bad(r#"{"op":"settle","lease":1,"usage":{"outputTokenz":5}}"#);
    assert_eq!(e.field.as_deref(), Some("outputTokenz"), "{e:?}");
    let e = bad(r#"{"op":"fly"}"#);
    assert!(e.message.contains("unknown variant `fly`"), "{}", e.message);
    let e = bad("not json");
    assert!(
        e.message.starts_with("the input is not JSON"),
        "{}",
        e.message
    );
    // A refusal by the state keeps the core's code; nothing changed.
    let e = bad(r#"{"op":"cancel","lease":999}"#);
    assert_eq!(e.code, "unknown_lease");
}

/// The member table through the JSON the Worker passes: every output a member's input can
/// have reads back (camelCase) for `applied`, and the table follows.
#[test]
fn member_table_reads_back_every_member_output() {
    use crate::members::MemberTable;
    use serde_json::Value;
    let config = core::Config::from_json(
        r#"{"pools":[{"name":"main","input_tokens_per_minute":100000,"max_concurrent":1}]}"#,
    )
    .unwrap();
    let mut c = core::Coordinator::new(config, 3, core::Millis(0)).unwrap();
    let mut t = MemberTable::new(vec!["main".into()], "[]").unwrap();
    // Not keyed yet: no agent is named.
    assert!(t.route("handle", None, None, "{}").is_err());
    t.key("a-fleet-secret-of-32-characters", "[]").unwrap();
    let mut step = |t: &mut MemberTable, who: Option<&str>, input: Value| -> Value {
        let checked: Value =
            serde_json::from_str(&t.route("handle", None, who, &input.to_string()).unwrap())
                .unwrap();
        let Some(input) = checked.get("input") else {
            return checked;
        };
        let out = handle(&mut c, 0, &input.to_string()).unwrap();
        let out = camel_value(&out).unwrap();
        t.applied(&out.to_string()).unwrap();
        while let Some(e) = c.poll_event() {
            if let core::Event::Granted {
                lease,
                expires_at,
                waited_ms,
                ..
            } = e
            {
                #[allow(clippy::cast_precision_loss)]
                t.granted(lease.0 as f64, expires_at.0 as f64, waited_ms as f64)
                    .unwrap();
            }
        }
        out
    };
    let ask = serde_json::json!({ "op": "call_lease", "request": { "agent": "alice", "inputTokens": 10 } });
    let sent = step(&mut t, Some("alice"), ask.clone());
    assert_eq!(sent["output"], "send", "{sent}");
    let waiting = step(&mut t, Some("alice"), ask);
    assert_eq!(waiting["output"], "wait", "{waiting}");
    let (lease, ticket) = (sent["lease"].clone(), waiting["wait"]["ticket"].clone());
    assert_eq!(t.ids().len(), 2);
    // A provider's answer with rate-limit headers: `deliver` with its report, read back.
    let answered = step(
        &mut t,
        Some("alice"),
        serde_json::json!({ "op": "call_response", "lease": lease, "status": 200,
            "headers": [["anthropic-ratelimit-input-tokens-remaining", "99000"],
                        ["anthropic-ratelimit-input-tokens-limit", "100000"]] }),
    );
    assert_eq!(answered["output"], "deliver", "{answered}");
    let settled = step(
        &mut t,
        Some("alice"),
        serde_json::json!({ "op": "settle", "lease": lease, "usage": { "inputTokens": 10 } }),
    );
    assert_eq!(settled["output"], "settled", "{settled}");
    // The ticket was granted from the line: the table says so, and its poll wakes.
    assert!(t.take_wakes().contains(&ticket.as_f64().unwrap()));
    let record: Value =
        serde_json::from_str(&t.known(ticket.as_f64().unwrap(), Some("alice")).unwrap()).unwrap();
    assert_eq!(record["record"]["state"], "granted", "{record}");
    // A refused one is an answer, not a throw.
    let other: Value =
        serde_json::from_str(&t.known(ticket.as_f64().unwrap(), Some("bob")).unwrap()).unwrap();
    assert_eq!(other["refused"]["status"], 403);
    // Tasks: opened, failed, ended with their summary.
    for input in [
        serde_json::json!({ "op": "open_task", "task": { "task": "t-1" } }),
        serde_json::json!({ "op": "task_failed", "task": "t-1", "signature": 5 }),
        serde_json::json!({ "op": "end_task", "task": "t-1", "outcome": "merged" }),
    ] {
        let out = step(&mut t, Some("alice"), input.clone());
        assert!(out.get("output").is_some(), "{input}: {out}");
    }
    // Stored and read back.
    let again = MemberTable::new(vec!["main".into()], &t.records()).unwrap();
    assert_eq!(again.records(), t.records());
}
