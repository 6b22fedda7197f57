//! Every trace in `tests/traces` replays through the native core exactly as recorded.

#[test]
fn every_trace_replays_exactly() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let mut count = 0;
    let mut failures = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        count += 1;
        let trace: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        if let Err(e) = tokenwarden_conformance::verify(&trace) {
            failures.push(format!("{}: {e}", path.display()));
        }
    }
    assert!(count >= 25, "expected at least 25 traces, found {count}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
