//! The simulator's own guarantees: its provider never lets more through than its limits,
//! tokens are conserved, runs are deterministic, and the coordinator beats per-agent
//! backoff and SDK defaults on the write-up's fleet, and in a mix of call sizes no call
//! waits past the bound the core documents (behaviour, not timing).

use tokenwarden_examples::sim::{self, Strategy};

fn short(mut sc: sim::Scenario, minutes: u64) -> sim::Scenario {
    sc.minutes = minutes;
    sc
}

#[test]
fn provider_never_admits_beyond_its_limits_in_any_scenario() {
    // The scenario with the product's estimator is checked by tests/estimator.rs.
    for sc in sim::scenarios()
        .into_iter()
        .filter(|s| !s.product_estimator)
    {
        let sc = short(sc, 15);
        for &s in &sc.strategies {
            let r = sim::run(&sc, s, 3);
            assert!(
                r.max_in_flight <= sc.limits.concurrent,
                "{} {:?}: {} in flight",
                sc.name,
                s,
                r.max_in_flight
            );
            for (i, m) in r.minutes.iter().enumerate() {
                // A continuous bucket admits at most its capacity plus one window of refill
                // within any minute.
                assert!(
                    m.input <= 2 * sc.limits.input_tpm,
                    "{} {:?} minute {i}: {} input",
                    sc.name,
                    s,
                    m.input
                );
                assert!(
                    m.requests <= 2 * sc.limits.rpm,
                    "{} {:?} minute {i}: {} requests",
                    sc.name,
                    s,
                    m.requests
                );
            }
        }
    }
}

#[test]
fn tokens_are_conserved() {
    for name in ["seed003", "fairness", "saturate"] {
        let sc = short(sim::scenario(name).unwrap(), 20);
        for &s in &sc.strategies {
            let r = sim::run(&sc, s, 5);
            let by_tenant: u64 = r.tenant_tokens.iter().sum();
            let by_minute: u64 = r.minutes.iter().map(|m| m.input + m.output).sum();
            assert_eq!(by_tenant, r.fleet_tokens, "{name} {s:?}");
            assert_eq!(
                by_minute, r.fleet_tokens,
                "{name} {s:?}: no traffic outside the fleet here"
            );
        }
    }
}

#[test]
fn same_seed_same_run() {
    let sc = short(sim::scenario("seed003").unwrap(), 20);
    for s in Strategy::ALL {
        let a = sim::run(&sc, s, 11);
        let b = sim::run(&sc, s, 11);
        assert_eq!(
            (a.sent, a.rate_limited, a.fleet_tokens, a.task_times.clone()),
            (b.sent, b.rate_limited, b.fleet_tokens, b.task_times)
        );
    }
}

#[test]
fn coordinator_beats_backoff_and_sdk_defaults_on_the_seed003_fleet() {
    let sc = sim::scenario("seed003").unwrap();
    for seed in 1..=3 {
        let e = sim::run(&sc, Strategy::Coordinator, seed);
        for other in [Strategy::Backoff, Strategy::SdkDefaults] {
            let o = sim::run(&sc, other, seed);
            assert!(
                e.rate_limited_ratio() < o.rate_limited_ratio(),
                "seed {seed}: 429 rate {} vs {other:?} {}",
                e.rate_limited_ratio(),
                o.rate_limited_ratio()
            );
            let (te, to) = (
                e.tokens_per_task().unwrap(),
                o.tokens_per_task().unwrap_or(f64::INFINITY),
            );
            assert!(
                te < to,
                "seed {seed}: tokens per task {te} vs {other:?} {to}"
            );
        }
        assert!(
            e.rate_limited_ratio() <= 0.001,
            "seed {seed}: {} 429s of {}",
            e.rate_limited,
            e.sent
        );
    }
}

#[test]
fn outsider_traffic_never_pushes_the_margin_below_its_floor() {
    let sc = sim::scenario("outsider").unwrap();
    let r = sim::run(&sc, Strategy::Coordinator, 1);
    let min = r.min_margin.expect("the coordinator reports its margin");
    assert!(min >= r.margin_floor, "{min} < {}", r.margin_floor);
}

#[test]
fn mixed_sizes_no_call_waits_past_its_bound_and_big_calls_are_not_starved() {
    let sc = sim::scenario("mixed").unwrap();
    for seed in 1..=3 {
        let results: Vec<_> = sc
            .strategies
            .iter()
            .map(|&s| sim::run(&sc, s, seed))
            .collect();
        let goals = sim::report::goals(&sc, &results);
        for g in &goals {
            // Jain within a role is reported, not asserted: with four planners and 30
            // minutes of Poisson think times it is below 0.95 on some seeds (see the report).
            if g.what.starts_with("Jain") {
                continue;
            }
            assert!(g.met, "seed {seed}: {} — measured {}", g.what, g.measured);
        }
        assert_eq!(goals.len(), 4, "seed {seed}: {goals:?}");
    }
}

/// The coordinators' figures in the report are the product's task metrics: they must agree
/// with what the simulator itself counted of the same run.
#[test]
fn the_product_s_task_figures_agree_with_the_simulator_s_count() {
    for name in ["seed003", "seed003-tight"] {
        let sc = sim::scenario(name).unwrap();
        for s in [Strategy::CoordinatorEqual, Strategy::Coordinator] {
            let r = sim::run(&sc, s, 1);
            let p = r
                .product
                .expect("a coordinator run has the product's figures");
            assert_eq!(p.merged, r.tasks_finished, "{name} {s:?}: merged tasks");
            assert_eq!(r.tasks_unfinished, 0, "{name} {s:?}: a finite backlog ends");
            // Every token the provider counted for the fleet was charged to a task, and so
            // was the part counted against the limits.
            for (own, product) in [
                (r.own_tokens_per_task(), r.tokens_per_task()),
                (r.own_limited_tokens_per_task(), r.limited_tokens_per_task()),
            ] {
                let (own, product) = (own.unwrap(), product.unwrap());
                assert!(
                    (product - own).abs() <= own * 0.01,
                    "{name} {s:?}: tokens per task {product} vs {own}"
                );
            }
            // Percentiles: a bucket upper bound, at most 3.2 % above the exact value.
            for permille in [500, 950] {
                let own = r.own_task_time_s(permille).unwrap();
                let product = r.task_time_s(permille).unwrap();
                assert!(
                    product >= own - 1.0 && product <= own * 1.033 + 1.0,
                    "{name} {s:?}: p{permille} {product} s vs {own} s"
                );
            }
            // Both integrate the agents blocked on a task over the time one of its calls is
            // outstanding (the simulator tells the core as agents block): the product to the
            // settle, the simulator to the answer, the same instant here.
            let (product, own) = (r.critical_path_wait(), r.critical_path_wait_ms);
            assert!(
                product.abs_diff(own) <= 1_000,
                "{name} {s:?}: critical-path wait {product} vs {own} agent-ms"
            );
            assert_eq!(p.rate_limited, 0, "{name} {s:?}");
        }
    }
}
