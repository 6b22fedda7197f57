//! The two figures of a wait in a saturated mixed fleet (issue 28): the expected grant
//! (`Coordinator::expected_grant`, what a person is shown and the checkpoint flag follows)
//! against the grant as it happened, and the queued decision's `eta`, the bound, which must
//! never be exceeded.
//!
//! The fleet: 30 agents (3 planners, 6 reviewers, 21 workers) on one pool, each asking
//! again 0–3 s after its previous call ended, a quarter of the calls big (15–20k input
//! tokens, 2,000 max_tokens), the rest 1–2k with 500, offering about twice the input limit;
//! calls take 1–6 s and use 70–100 % of their input estimate and 10–100 % of the output
//! reserved. `cargo test -p tokenwarden-core --test expected_wait -- --nocapture` prints
//! the figures.

use std::collections::BTreeMap;

use tokenwarden_core::*;

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

#[derive(Clone, Copy)]
enum State {
    Idle { at: u64 },
    Queued,
    Calling { lease: LeaseId, until: u64 },
}

struct Wait {
    asked: u64,
    expected: u64,
    bound: u64,
    granted: Option<u64>,
}

fn run(seed: u64, minutes: u64) -> (Vec<(u64, u64, u64)>, u64) {
    let config = Config::from_json(
        r#"{"pools":[{"name":"p","input_tokens_per_minute":400000,"output_tokens_per_minute":80000,
            "requests_per_minute":2000,"max_concurrent":64}],"max_queue_wait_ms":600000}"#,
    )
    .unwrap();
    let mut c = Coordinator::new(config, seed, Millis(0)).unwrap();
    let mut rng = Lcg(seed);
    let agents = 30usize;
    let role = |a: usize| match a % 10 {
        0 => Role::Planner,
        1 | 2 => Role::Reviewer,
        _ => Role::Worker,
    };
    let mut state: Vec<State> = (0..agents)
        .map(|_| State::Idle {
            at: rng.range(0, 2_000),
        })
        .collect();
    let mut asks: Vec<Option<LeaseRequest>> = vec![None; agents];
    let mut waits: BTreeMap<LeaseId, Wait> = BTreeMap::new();
    let mut owner: BTreeMap<LeaseId, usize> = BTreeMap::new();
    let end = minutes * 60_000;
    let mut now = 0u64;
    let mut late = 0u64;
    while now < end {
        // Agents whose turn it is.
        for a in 0..agents {
            match state[a] {
                State::Idle { at } if at <= now => {
                    let big = rng.range(0, 3) == 0;
                    let req = LeaseRequest {
                        agent: AgentId(a as u64 + 1),
                        input_tokens: if big {
                            rng.range(15_000, 20_000)
                        } else {
                            rng.range(1_000, 2_000)
                        },
                        max_tokens: if big { 2_000 } else { 500 },
                        role: role(a),
                        ..Default::default()
                    };
                    asks[a] = Some(req);
                    match c.request_lease(Millis(now), &req).unwrap() {
                        Decision::Grant { lease, .. } => {
                            state[a] = State::Calling {
                                lease,
                                until: now + rng.range(1_000, 6_000),
                            }
                        }
                        Decision::Queued { lease, eta } => {
                            let expected = c.expected_grant(lease).expect("a queued ticket");
                            assert!(
                                expected <= eta,
                                "expected {expected:?} past the bound {eta:?}"
                            );
                            waits.insert(
                                lease,
                                Wait {
                                    asked: now,
                                    expected: expected.0,
                                    bound: eta.0,
                                    granted: None,
                                },
                            );
                            owner.insert(lease, a);
                            state[a] = State::Queued;
                        }
                        Decision::Reject { retry_at, .. } => {
                            state[a] = State::Idle {
                                at: retry_at.0.max(now + 1),
                            }
                        }
                        Decision::NeverFits { reason } => panic!("never fits: {reason:?}"),
                    }
                }
                State::Calling { lease, until } if until <= now => {
                    let req = asks[a].unwrap();
                    let input = req.input_tokens * rng.range(700, 1000) / 1000;
                    let output = req.max_tokens * rng.range(100, 1000) / 1000;
                    c.settle(
                        Millis(now),
                        lease,
                        &Usage {
                            input_tokens: input,
                            output_tokens: output,
                            ..Default::default()
                        },
                    )
                    .unwrap();
                    state[a] = State::Idle {
                        at: now + rng.range(0, 3_000),
                    };
                }
                _ => {}
            }
        }
        while let Some(e) = c.poll_event() {
            if let Event::Granted { lease, .. } = e {
                let a = owner[&lease];
                let w = waits.get_mut(&lease).unwrap();
                w.granted = Some(now);
                if now > w.bound {
                    late += 1;
                }
                state[a] = State::Calling {
                    lease,
                    until: now + rng.range(1_000, 6_000),
                };
            }
        }
        // The next instant anything happens.
        let mut next = now + 1_000;
        for s in &state {
            match *s {
                State::Idle { at } => next = next.min(at),
                State::Calling { until, .. } => next = next.min(until),
                State::Queued => {}
            }
        }
        if let Some(t) = c.poll_timeout() {
            next = next.min(t.0);
        }
        now = next.max(now + 1);
        c.handle_timeout(Millis(now));
    }
    let done = waits
        .values()
        .filter_map(|w| {
            w.granted
                .map(|g| (g - w.asked, w.expected - w.asked, w.bound - w.asked))
        })
        .collect();
    (done, late)
}

fn percentile(mut v: Vec<u64>, p: usize) -> u64 {
    v.sort_unstable();
    v[(v.len() * p / 100).min(v.len() - 1)]
}

#[test]
fn expected_grant_tracks_the_actual_wait_and_the_bound_holds() {
    let mut errors = Vec::new();
    let mut bound_ratio = Vec::new();
    let mut total = 0usize;
    for seed in 1..=4u64 {
        let (waits, late) = run(seed, 6);
        assert_eq!(late, 0, "seed {seed}: a grant came after its bound");
        total += waits.len();
        // Waits of a second or more: the ones a person is told about.
        for (actual, expected, bound) in waits.into_iter().filter(|w| w.0 >= 1_000) {
            errors.push(actual.abs_diff(expected) * 1000 / actual);
            bound_ratio.push(bound * 10 / actual);
        }
    }
    assert!(
        errors.len() > 200,
        "a saturated fleet: {} waits of 1 s or more",
        errors.len()
    );
    let median = percentile(errors.clone(), 50);
    let p90 = percentile(errors.clone(), 90);
    let bound_median = percentile(bound_ratio, 50);
    println!(
        "expected vs actual wait over {} waits of >= 1 s ({total} queued): median |error| {}.{} %, p90 {}.{} %; median bound / actual {}.{}x",
        errors.len(),
        median / 10,
        median % 10,
        p90 / 10,
        p90 % 10,
        bound_median / 10,
        bound_median % 10
    );
    // Issue 28's goal: the median within 25 % of the actual wait.
    assert!(
        median <= 250,
        "median |expected − actual| is {median}‰ of the actual wait"
    );
}
