//! The WIT interface is the core's host protocol and nothing beside it: the resource has
//! `handle`, the polls and the queries, and no record mirrors a core type (each was a second
//! encoding kept in step with the core by hand; the JSON the core defines crosses instead).

use std::collections::BTreeSet;

use tokenwarden_wasmtime::{WIT_INTERFACE, WIT_PACKAGE};

const WIT: &str = include_str!("../wit/v4/tokenwarden.wit");

/// The WIT text without its comments.
fn code() -> String {
    WIT.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_resource_is_the_protocol_and_its_queries() {
    let code = code();
    let functions: BTreeSet<&str> = code
        .lines()
        .filter_map(|l| l.trim().split_once(": "))
        .filter(|(_, rest)| rest.starts_with("func(") || rest.starts_with("static func("))
        .map(|(name, _)| name)
        .collect();
    let want: BTreeSet<&str> = [
        "create",
        "restore",
        "handle",
        "poll-timeout",
        "poll-event",
        "metrics",
        "snapshot",
        "now",
        "pool-by-name",
        "check",
    ]
    .into_iter()
    .collect();
    assert_eq!(functions, want);
}

#[test]
fn no_record_mirrors_a_core_type() {
    let code = code();
    for gone in [
        "lease-request",
        "usage",
        "decision",
        "settlement",
        "event",
        "call-state",
        "call-step",
        "header-report",
        "task-spec",
    ] {
        let defined = ["record", "variant", "enum"]
            .iter()
            .any(|kind| code.contains(&format!("{kind} {gone} {{")));
        assert!(!defined, "the WIT defines `{gone}` again");
    }
}

#[test]
fn the_version_the_host_speaks() {
    let package = WIT_PACKAGE.trim_start_matches("tokenwarden:quota@");
    assert!(WIT.contains(&format!("package {WIT_PACKAGE};")));
    assert_eq!(
        WIT_INTERFACE,
        format!("tokenwarden:quota/coordinator@{package}")
    );
}
