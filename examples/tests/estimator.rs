//! The `estimator` scenario: the simulator drives the product's own estimator (the provider
//! crate's `Estimator`, the code every engine package runs for the driver's
//! `DefaultEstimator`, in this process) on the request bodies it generates, and the provider
//! counts them exactly.

use tokenwarden_examples::sim::{self, Strategy, bridge};

fn scenario() -> sim::Scenario {
    sim::scenario("estimator").expect("the estimator scenario exists")
}

#[test]
fn the_bridge_answers_with_the_product_s_estimate() {
    let mut b = bridge::EstimatorBridge::new();
    assert!(b.describe.starts_with("DefaultEstimator"), "{}", b.describe);
    let body = r#"{"model":"claude-sonnet-4-5","max_tokens":128000,"system":[{"type":"text","text":"You are a coding agent.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"Fix the failing test in src/lib.rs, please."}]}]}"#;
    let e = b.estimate(1, 0, Some(body));
    assert_eq!(e.max_tokens, 128_000, "callShape reads max_tokens");
    assert!(e.input_tokens > 0 && e.cached_prefix_tokens == 0, "{e:?}");
    // The same call asked again: the same body object, the same estimate.
    assert_eq!(b.estimate(1, 1_000, None), e);
    let usage = tokenwarden_core::Usage {
        input_tokens: 20,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 0,
        output_tokens: 40,
    };
    b.observe(1, 2_000, &usage);
    // Observed calls are forgotten: a second observation is the simulator's mistake.
    let twice =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.observe(1, 3_000, &usage)));
    assert!(twice.is_err(), "a call observed twice");
    // After the observation the estimator knows this prompt exactly.
    let again = b.estimate(2, 4_000, Some(body));
    assert_eq!(
        again.input_tokens + again.cached_prefix_tokens,
        20,
        "{again:?}"
    );
}

#[test]
fn the_estimator_scenario_meets_its_goals_on_the_product_s_estimates() {
    let sc = scenario();
    assert_eq!(sc.strategies, vec![Strategy::Coordinator]);
    assert!(sc.agents.iter().any(|a| a.shape.max_tokens == 128_000));
    let r = sim::run(&sc, Strategy::Coordinator, 1);
    assert!(r.sent > 500, "{} calls", r.sent);
    // Every call the provider took in settles with its estimate, but those still running at the end.
    let settled = r.estimates.len() as u64;
    assert!(
        settled + r.rate_limited + sc.agents.len() as u64 >= r.sent,
        "{settled} settled of {} sent",
        r.sent
    );
    // The coordinator leased by the product's figures, not exact counts.
    let off = r
        .estimates
        .iter()
        .filter(|x| x.reserved_input != x.used_input)
        .count();
    assert!(
        off * 2 > r.estimates.len(),
        "{off} of {} estimates differ from the counts",
        r.estimates.len()
    );
    // The rolling breakpoint: most prompt tokens are cache reads, and the estimator saw many.
    let read: u64 = r.estimates.iter().map(|x| x.cache_read).sum();
    let prompt: u64 = r.estimates.iter().map(|x| x.prompt).sum();
    assert!(read * 10 > prompt * 8, "cache reads {read} of {prompt}");
    assert!(r.estimates.iter().filter(|x| x.estimate_cached > 0).count() * 2 > r.estimates.len());
    // The provider never let more through than its limits.
    assert!(r.max_in_flight <= sc.limits.concurrent);
    for m in &r.minutes {
        assert!(m.input <= 2 * sc.limits.input_tpm && m.requests <= 2 * sc.limits.rpm);
    }
    for g in sim::report::goals(&sc, std::slice::from_ref(&r)) {
        assert!(g.met, "{} — measured {}", g.what, g.measured);
    }
    // Deterministic: the estimator runs on the simulator's clock.
    let again = sim::run(&sc, Strategy::Coordinator, 1);
    let figures = |r: &sim::RunResult| {
        r.estimates
            .iter()
            .map(|x| (x.agent, x.estimate_input, x.estimate_cached, x.used_input))
            .collect::<Vec<_>>()
    };
    assert_eq!(figures(&r), figures(&again));
}
