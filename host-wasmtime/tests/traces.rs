//! Every conformance trace through the component: identical records to the native runner,
//! with and without a hot reload before every input.

mod common;

use common::{PluginEngine, compare, traces};
use tokenwarden_conformance::{Engine, run_with};

fn replay_all<E: Engine>(what: &str) {
    let all = traces();
    assert!(all.len() >= 37, "found only {} traces", all.len());
    let mut failures = Vec::new();
    for (name, trace) in &all {
        let result = run_with::<E>(trace).and_then(|got| {
            tokenwarden_conformance::check_expected_events(trace, &got)?;
            let expected = trace
                .get("expected")
                .and_then(|e| e.as_array())
                .ok_or("trace has no `expected`")?;
            compare(expected, &got)?;
            // And record for record what the native reference runner produces today.
            let native = tokenwarden_conformance::run(trace)?;
            compare(&native, &got).map_err(|e| format!("vs native runner: {e}"))
        });
        if let Err(e) = result {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} traces differ ({what}):\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[test]
fn every_trace_matches_the_native_runner() {
    replay_all::<PluginEngine<false>>("no reload");
}

#[test]
fn hot_reload_before_every_input_changes_no_record() {
    replay_all::<PluginEngine<true>>("reload before every input");
}
