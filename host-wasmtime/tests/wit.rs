//! The WIT interface names the core's fields: its `lease-request` record with the fields
//! `lease-request2` adds (1.2.0), and its `usage` record, have exactly the fields of
//! `tokenwarden_core::LeaseRequest` and `Usage` (kebab-cased), so a field added to the core
//! fails here until the interface, guest and host carry it.

use std::collections::BTreeSet;

use tokenwarden_core::{LeaseRequest, Usage};

const WIT: &str = include_str!("../wit/v2/tokenwarden.wit");

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

/// The serialized field names of a core value, kebab-cased.
fn core_fields<T: serde::Serialize>(v: &T) -> BTreeSet<String> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(map)) => map.keys().map(|k| k.replace('_', "-")).collect(),
        other => panic!("not an object: {other:?}"),
    }
}

#[test]
fn lease_request_record_has_the_cores_fields() {
    let mut fields = record_fields("lease-request");
    let added = record_fields("lease-request2");
    assert!(
        added.contains("request"),
        "lease-request2 wraps a lease-request"
    );
    fields.extend(added.into_iter().filter(|f| f != "request"));
    assert_eq!(fields, core_fields(&LeaseRequest::default()));
}

#[test]
fn usage_record_has_the_cores_fields() {
    assert_eq!(record_fields("usage"), core_fields(&Usage::default()));
}
