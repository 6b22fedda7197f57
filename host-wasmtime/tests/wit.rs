//! The WIT interface names the core's fields: its `lease-request`, `usage`, `call-wait` and
//! `revised` records have exactly the fields of `tokenwarden_core::LeaseRequest`, `Usage`,
//! `Wait` and `Event::Revised` (kebab-cased), so a field added to the core fails here until
//! the interface, guest and host carry it.

use std::collections::BTreeSet;

use tokenwarden_core::{
    AgentId, Event, LeaseId, LeaseRequest, Millis, PoolId, Usage, Wait, WaitReason,
};
use tokenwarden_wasmtime::{WIT_INTERFACE, WIT_PACKAGE};

const WIT: &str = include_str!("../wit/v3/tokenwarden.wit");

/// The field names of `record <name> { … }` in the WIT text.
fn record_fields(name: &str) -> BTreeSet<String> {
    let start = WIT
        .find(&format!("record {name} {{"))
        .unwrap_or_else(|| panic!("no record {name} in the WIT"));
    let body = &WIT[start..];
    let body = &body[body.find('{').unwrap_or(0) + 1..body.find('}').unwrap_or(0)];
    body.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .filter_map(|l| l.split(':').next())
        .map(|f| f.trim().to_owned())
        .collect()
}

/// The serialized field names of a core value, kebab-cased (an enum's `kind` tag left out).
fn core_fields<T: serde::Serialize>(v: &T) -> BTreeSet<String> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(map)) => map
            .keys()
            .filter(|k| *k != "kind")
            .map(|k| k.replace('_', "-"))
            .collect(),
        other => panic!("not an object: {other:?}"),
    }
}

#[test]
fn lease_request_record_has_the_cores_fields() {
    assert_eq!(
        record_fields("lease-request"),
        core_fields(&LeaseRequest::default())
    );
}

#[test]
fn call_wait_record_has_the_cores_fields() {
    let wait = Wait {
        until: Millis(0),
        expected: Millis(0),
        reason: WaitReason::Queued,
        ticket: None,
        refusal: None,
        attempt: 0,
        checkpoint: false,
    };
    assert_eq!(record_fields("call-wait"), core_fields(&wait));
}

#[test]
fn revised_record_has_the_cores_fields() {
    let revised = Event::Revised {
        lease: LeaseId(0),
        agent: AgentId(0),
        pool: PoolId(0),
        eta: Millis(0),
    };
    assert_eq!(record_fields("revised"), core_fields(&revised));
}

#[test]
fn one_record_per_core_type_and_the_version_the_host_speaks() {
    for gone in [
        "lease-request2",
        "request-lease2",
        "call-lease2",
        "margin-changed2",
        "event2",
        "poll-event2",
    ] {
        let defined = WIT
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .any(|l| l.contains(gone));
        assert!(!defined, "the WIT still has `{gone}`");
    }
    let package = WIT_PACKAGE.trim_start_matches("tokenwarden:quota@");
    assert!(WIT.contains(&format!("package {WIT_PACKAGE};")));
    assert_eq!(
        WIT_INTERFACE,
        format!("tokenwarden:quota/coordinator@{package}")
    );
}

#[test]
fn usage_record_has_the_cores_fields() {
    assert_eq!(record_fields("usage"), core_fields(&Usage::default()));
}
