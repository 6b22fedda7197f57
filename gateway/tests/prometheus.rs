//! The Prometheus exposition against golden files: each `fixtures/prometheus/<case>.json` is
//! a `gatewayRule` input (`{ op: "prometheus", metrics, fleet, quota }`) and `<case>.txt` what
//! the edge's JavaScript implementation (`edge/src/prometheus.js` before it called this
//! crate) wrote for it, byte for byte. The metrics are the real engine's (`scenario`,
//! `hostile_labels`, `busy_engine`) and hand-made ones: more than 20 agents and families,
//! hostile names, bigints, NaN and infinities (as the strings a host passes them as), tasks,
//! ceilings, counters the core does not have.

use std::fs;
use std::path::PathBuf;

use serde_json::Value;
use tokenwarden_gateway::prometheus;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prometheus")
}

#[test]
fn the_exposition_is_the_javascript_one_byte_for_byte() {
    let mut cases: Vec<PathBuf> = fs::read_dir(fixtures())
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|e| e.unwrap_or_else(|e| panic!("{e}")).path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 16, "{} cases", cases.len());
    for case in cases {
        let name = case.file_stem().map(|s| s.to_string_lossy().into_owned());
        let input: Value = serde_json::from_str(&fs::read_to_string(&case).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{name:?}: {e}"));
        let expected = fs::read_to_string(case.with_extension("txt"))
            .unwrap_or_else(|e| panic!("{name:?}: {e}"));
        let text = prometheus::text(
            &input["metrics"],
            input["fleet"].as_str().unwrap_or_default(),
            input["quota"].as_str().unwrap_or_default(),
        );
        if text != expected {
            let line = text
                .lines()
                .zip(expected.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| text.lines().count().min(expected.lines().count()));
            panic!(
                "{name:?}: first difference at line {}:\n  got:      {:?}\n  expected: {:?}",
                line + 1,
                text.lines().nth(line),
                expected.lines().nth(line),
            );
        }
    }
}

#[test]
fn the_engines_metrics_make_every_family() {
    let input: Value = serde_json::from_str(
        &fs::read_to_string(fixtures().join("busy_engine.json")).unwrap_or_default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let text = prometheus::text(&input["metrics"], "acme", "main");
    let types: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .collect();
    for family in [
        "tokenwarden_live_leases gauge",
        "tokenwarden_agent_settled_total counter",
        "tokenwarden_family_members gauge",
        "tokenwarden_granted_now_total counter",
        "tokenwarden_rejected_by_reason_total counter",
        "tokenwarden_tasks_ended_total counter",
        "tokenwarden_rate_limited_ratio gauge",
    ] {
        assert!(types.contains(&family), "{family} in {types:?}");
    }
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            line.starts_with("tokenwarden_") && line.contains("{fleet=\"acme\",quota=\"main\""),
            "{line}"
        );
    }
}
