//! Behaviour of the coordinator through its public API, one test per rule.

use tokenwarden_core::*;

const W: u64 = 60_000;

fn coord(extra: &str) -> Coordinator {
    let json = format!(
        r#"{{"pools":[{{"name":"p","input_tokens_per_minute":100000,"output_tokens_per_minute":20000,
            "requests_per_minute":1000,"max_concurrent":4}}]{extra}}}"#
    );
    Coordinator::new(Config::from_json(&json).unwrap(), 7, Millis(0)).unwrap()
}

fn ask(agent: u64, input: u64, max_tokens: u64) -> LeaseRequest {
    LeaseRequest {
        agent: AgentId(agent),
        input_tokens: input,
        max_tokens,
        ..Default::default()
    }
}

fn grant(d: Decision) -> LeaseId {
    match d {
        Decision::Grant { lease, .. } => lease,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// The promise made at `now` on a bound `at` from the rates: the bound plus an eighth of
/// the wait (the headroom that absorbs small debts; see `Coordinator::request_lease`).
fn promise(now: u64, at: u64) -> Millis {
    Millis(at + (at - now) / 8)
}

fn queued(d: Decision) -> (LeaseId, Millis) {
    match d {
        Decision::Queued { lease, eta } => (lease, eta),
        other => panic!("expected queued, got {other:?}"),
    }
}

/// Wakes the coordinator at each poll_timeout up to `until`; returns the events with times.
fn drive(c: &mut Coordinator, until: Millis) -> Vec<(Millis, Event)> {
    let mut out = Vec::new();
    while let Some(e) = c.poll_event() {
        out.push((c.now(), e));
    }
    while let Some(t) = c.poll_timeout() {
        if t > until {
            break;
        }
        c.handle_timeout(t);
        while let Some(e) = c.poll_event() {
            out.push((t, e));
        }
    }
    out
}

fn used(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        ..Default::default()
    }
}

fn available(c: &Coordinator, axis: Axis) -> i64 {
    c.metrics(c.now()).pools[0]
        .axes
        .iter()
        .find(|a| a.axis == axis)
        .unwrap()
        .available
}

#[test]
fn hands_out_limit_times_margin() {
    let mut c = coord("");
    // 85% of 100k input = 85k.
    grant(c.request_lease(Millis(0), &ask(1, 85_000, 10)).unwrap());
    let (_, eta) = queued(c.request_lease(Millis(0), &ask(2, 1, 10)).unwrap());
    assert_eq!(available(&c, Axis::InputTokens), 0, "now=0");
    // The ETA is an upper bound: its own token, plus what agent 1 could still be served
    // ahead of it at equal weight: the ticket's virtual span is its dominant share, one
    // request of 1,000 a minute (10⁶ parts per 10⁹, more than its token's share of the
    // input limit), so agent 1 may take 10⁶ + 1 parts of every limit first: 101 input
    // tokens; and its small calls' lead, 5 % of every limit (`small_lead_permille`):
    // 5,000. Refill of 5,102 in 5,102 × 60000/85000 ms, rounded up; promised with an
    // eighth of the wait as headroom.
    assert_eq!(eta, promise(0, (5_102 * W).div_ceil(85_000)));
}

#[test]
fn queued_ticket_is_granted_by_refill_within_its_eta() {
    let mut c = coord("");
    grant(c.request_lease(Millis(0), &ask(1, 85_000, 10)).unwrap());
    let (t, eta) = queued(c.request_lease(Millis(0), &ask(2, 8_500, 10)).unwrap());
    // The ETA leaves room for agent 1 to be served first as much of the input limit as the
    // ticket's place in line accounts for: it is agent 2's first call, placed by a quantum
    // of 5 % (5,001 tokens, rounded up), its 8.5 % being above it; and agent 1's small
    // calls' lead (5 %: 5,000).
    assert_eq!(
        eta,
        promise(0, ((8_500 + 5_001 + 5_000) * W).div_ceil(85_000))
    );
    let ev = drive(&mut c, Millis(10_000));
    assert!(
        matches!(ev.as_slice(), [(Millis(6_000), Event::Granted { lease, waited_ms: 6_000, .. })] if *lease == t),
        "{ev:?}"
    );
}

#[test]
fn settle_refunds_unused_reservation_at_once() {
    let mut c = coord("");
    let l = grant(c.request_lease(Millis(0), &ask(1, 80_000, 5_000)).unwrap());
    let (t, _) = queued(c.request_lease(Millis(0), &ask(2, 20_000, 100)).unwrap());
    let s = c.settle(Millis(100), l, &used(60_000, 500)).unwrap();
    assert_eq!(s.reserved.get(Axis::InputTokens), 80_000);
    assert_eq!(s.used.get(Axis::InputTokens), 60_000);
    assert_eq!(
        c.poll_event()
            .map(|e| matches!(e, Event::Granted { lease, .. } if lease == t)),
        Some(true)
    );
}

#[test]
fn settle_charges_underestimate_as_debt() {
    let mut c = coord("");
    let l = grant(c.request_lease(Millis(0), &ask(1, 80_000, 10)).unwrap());
    c.settle(Millis(0), l, &used(100_000, 10)).unwrap();
    assert_eq!(
        available(&c, Axis::InputTokens),
        5_000 - 20_000,
        "debt of 15k at now=0"
    );
    let (_, eta) = queued(c.request_lease(Millis(0), &ask(2, 1_000, 10)).unwrap());
    // 16k tokens to refill at 85k/min, plus agent 1's share ahead of it (1,001 tokens) and
    // its small calls' lead (5,000).
    assert_eq!(
        eta,
        promise(0, ((16_000 + 1_001 + 5_000) * W).div_ceil(85_000))
    );
}

#[test]
fn settle_above_the_limit_is_clamped_to_one_window() {
    let mut c = coord("");
    let l = grant(c.request_lease(Millis(0), &ask(1, 1_000, 10)).unwrap());
    let s = c.settle(Millis(0), l, &used(MAX_TOKENS, 10)).unwrap();
    assert_eq!(
        s.used.get(Axis::InputTokens),
        100_000,
        "clamped to the 100k limit"
    );
    assert_eq!(available(&c, Axis::InputTokens), 85_000 - 100_000);
}

#[test]
fn does_not_refund_expired_lease() {
    let mut c = coord(r#","lease_ttl_ms":1000"#);
    let l = grant(c.request_lease(Millis(0), &ask(1, 85_000, 10)).unwrap());
    let ev = drive(&mut c, Millis(1_000));
    assert!(
        matches!(ev.as_slice(), [(Millis(1_000), Event::Expired { lease, .. })] if *lease == l),
        "{ev:?}"
    );
    // Only refill since 0 is available, nothing refunded: 1000 ms × 85k/60k = 1416.
    assert_eq!(available(&c, Axis::InputTokens), 1_416);
    assert_eq!(
        c.settle(Millis(1_001), l, &used(1, 1)),
        Err(LeaseError::UnknownLease)
    );
}

#[test]
fn reaping_is_idempotent() {
    let mut c = coord(r#","lease_ttl_ms":1000"#);
    grant(c.request_lease(Millis(0), &ask(1, 10, 10)).unwrap());
    c.handle_timeout(Millis(5_000));
    assert!(matches!(c.poll_event(), Some(Event::Expired { .. })));
    c.handle_timeout(Millis(5_000));
    c.handle_timeout(Millis(6_000));
    assert_eq!(c.poll_event(), None);
    assert_eq!(c.metrics(Millis(6_000)).pools[0].counters.expired, 1);
}

#[test]
fn concurrency_slot_is_held_until_settle() {
    let mut c = coord("");
    let leases: Vec<_> = (0..4)
        .map(|i| grant(c.request_lease(Millis(0), &ask(i, 10, 10)).unwrap()))
        .collect();
    let (t, eta) = queued(c.request_lease(Millis(0), &ask(9, 10, 10)).unwrap());
    // Every slot held: it is promised the expiry that frees one at the latest.
    assert_eq!(eta, Millis(120_000));
    assert_eq!(
        c.poll_timeout(),
        Some(Millis(120_000)),
        "only lease expiry can free a slot"
    );
    c.settle(Millis(50), leases[2], &used(10, 10)).unwrap();
    assert!(matches!(c.poll_event(), Some(Event::Granted { lease, .. }) if lease == t));
}

#[test]
fn rejects_a_request_that_can_never_fit() {
    let mut c = coord("");
    let d = c.request_lease(Millis(0), &ask(1, 100_001, 10)).unwrap();
    assert_eq!(
        d,
        Decision::NeverFits {
            reason: RejectReason::ExceedsCapacity {
                axis: Axis::InputTokens
            }
        }
    );
}

#[test]
fn a_call_within_the_limit_but_above_the_margin_is_served_when_the_bucket_is_full() {
    // The provider serves 90k of a 100k limit from a full bucket: so does the core, though
    // the margin hands out 85k a window.
    let mut c = coord(r#","max_queue_wait_ms":120000"#);
    let first = grant(c.request_lease(Millis(0), &ask(1, 90_000, 10)).unwrap());
    c.settle(Millis(10), first, &used(90_000, 10)).unwrap();
    // In debt by 5k: the next one waits for the bucket to fill, 85k + 5k at 85k a minute.
    let (t, eta) = queued(c.request_lease(Millis(20), &ask(2, 90_000, 10)).unwrap());
    let events = drive(&mut c, Millis(10 * W));
    let granted = events
        .iter()
        .find(|(_, e)| matches!(e, Event::Granted { lease, .. } if *lease == t))
        .map(|(at, _)| *at)
        .expect("granted");
    // The 5k debt is from the grant at 0: the bucket refills from then.
    let full = Millis((90_000 * W).div_ceil(85_000));
    assert_eq!(granted, full, "when the bucket is full again");
    assert!(eta >= granted, "the promise holds: {eta:?} >= {granted:?}");
}

#[test]
fn a_long_conversation_whose_uncached_part_fits_is_not_refused_for_its_cached_prefix() {
    // 95k of cached prefix and 10k new on a 100k input limit: cold, 105k, above the limit;
    // warm, 10k. The provider serves it when the prefix is cached, so it is not refused.
    let mut c = coord("");
    let req = LeaseRequest {
        cached_prefix_tokens: 95_000,
        ..ask(1, 10_000, 100)
    };
    let d = c.request_lease(Millis(0), &req).unwrap();
    assert!(
        matches!(d, Decision::Grant { .. } | Decision::Queued { .. }),
        "served (from a full bucket while its cache is cold): {d:?}"
    );
    // Above the limit even warm: refused, as the provider would.
    let d = c
        .request_lease(
            Millis(0),
            &LeaseRequest {
                cached_prefix_tokens: 95_000,
                ..ask(2, 100_001, 100)
            },
        )
        .unwrap();
    assert!(matches!(d, Decision::NeverFits { .. }));
}

#[test]
fn anthropic_reserves_learned_output_not_max_tokens() {
    // Claude Code sends max_tokens 128000 on every call; the output limit is 20k a minute,
    // and the provider serves the call because it counts output as produced.
    let mut c = coord("");
    let first = grant(c.request_lease(Millis(0), &ask(1, 1_000, 128_000)).unwrap());
    let s = c.settle(Millis(100), first, &used(1_000, 700)).unwrap();
    assert_eq!(
        s.reserved.get(Axis::OutputTokens),
        4_096,
        "before any history: the initial reservation"
    );
    for i in 1..=16u64 {
        let l = grant(
            c.request_lease(Millis(i * 1_000), &ask(1, 1_000, 128_000))
                .unwrap(),
        );
        c.settle(Millis(i * 1_000 + 100), l, &used(1_000, 500 + i * 10))
            .unwrap();
    }
    // The last 16 outputs are 510..=660 (and 700 dropped off): the 95th percentile is 660.
    let l = grant(
        c.request_lease(Millis(20_000), &ask(1, 1_000, 128_000))
            .unwrap(),
    );
    let s = c.settle(Millis(20_100), l, &used(1_000, 5_000)).unwrap();
    assert_eq!(s.reserved.get(Axis::OutputTokens), 660);
    assert_eq!(
        s.used.get(Axis::OutputTokens),
        5_000,
        "more than reserved: debt"
    );
    // Another agent with no history of its own is reserved the pool's percentile.
    let l = grant(
        c.request_lease(Millis(21_000), &ask(2, 1_000, 128_000))
            .unwrap(),
    );
    let s = c.settle(Millis(21_100), l, &used(1_000, 10)).unwrap();
    assert_eq!(s.reserved.get(Axis::OutputTokens), 5_000);
    // Never above max_tokens.
    let l = grant(
        c.request_lease(Millis(22_000), &ask(1, 1_000, 300))
            .unwrap(),
    );
    let s = c.settle(Millis(22_100), l, &used(1_000, 10)).unwrap();
    assert_eq!(s.reserved.get(Axis::OutputTokens), 300);
}

#[test]
fn max_tokens_above_the_output_limit_is_never_refused_under_anthropic_counting() {
    let mut c = coord(r#","output_reserve":{"initial_tokens":1000000}"#);
    // The initial reservation is above the 20k output limit: the reservation is the limit.
    let d = c.request_lease(Millis(0), &ask(1, 1_000, 128_000)).unwrap();
    let l = grant(d);
    let s = c.settle(Millis(10), l, &used(1_000, 100)).unwrap();
    assert_eq!(s.reserved.get(Axis::OutputTokens), 20_000);
}

#[test]
fn openai_pre_charges_max_tokens_and_refuses_what_the_provider_refuses() {
    let json = r#"{"pools":[{"name":"o","counting":"openai","tokens_per_minute":100000}]}"#;
    let mut c = Coordinator::new(Config::from_json(json).unwrap(), 7, Millis(0)).unwrap();
    // OpenAI answers "Request too large" to max(max_tokens, input) above the TPM limit.
    assert_eq!(
        c.request_lease(Millis(0), &ask(1, 1_000, 128_000)).unwrap(),
        Decision::NeverFits {
            reason: RejectReason::ExceedsCapacity { axis: Axis::Tokens }
        }
    );
    let l = grant(c.request_lease(Millis(0), &ask(1, 1_000, 16_000)).unwrap());
    let s = c.settle(Millis(10), l, &used(1_000, 100)).unwrap();
    assert_eq!(
        s.reserved.get(Axis::Tokens),
        16_000,
        "max(max_tokens, input)"
    );
    assert_eq!(s.reserved.get(Axis::OutputTokens), 16_000);
}

#[test]
fn rejects_when_estimated_wait_is_too_long() {
    let mut c = coord(r#","max_queue_wait_ms":10000"#);
    grant(c.request_lease(Millis(0), &ask(1, 85_000, 10)).unwrap());
    let d = c.request_lease(Millis(0), &ask(2, 17_000, 10)).unwrap();
    // 17k tokens take 12 s; the wait bound is 10 s, so come back in 2 s.
    assert_eq!(
        d,
        Decision::Reject {
            retry_at: Millis(2_000),
            reason: RejectReason::WaitTooLong
        }
    );
    queued(c.request_lease(Millis(2_000), &ask(2, 17_000, 10)).unwrap());
}

#[test]
fn rejects_when_queue_is_full() {
    let mut c = coord(r#","max_queue_depth":2"#);
    grant(c.request_lease(Millis(0), &ask(1, 85_000, 10)).unwrap());
    queued(c.request_lease(Millis(0), &ask(2, 10, 10)).unwrap());
    queued(c.request_lease(Millis(0), &ask(3, 10, 10)).unwrap());
    let d = c.request_lease(Millis(0), &ask(4, 10, 10)).unwrap();
    assert!(
        matches!(
            d,
            Decision::Reject {
                reason: RejectReason::QueueFull,
                ..
            }
        ),
        "{d:?}"
    );
}

#[test]
fn cancel_withdraws_a_ticket_exactly_once() {
    let mut c = coord("");
    grant(c.request_lease(Millis(0), &ask(1, 85_000, 10)).unwrap());
    let (t, _) = queued(c.request_lease(Millis(0), &ask(2, 10, 10)).unwrap());
    c.cancel(Millis(0), t).unwrap();
    assert_eq!(c.cancel(Millis(0), t), Err(LeaseError::UnknownLease));
    assert_eq!(
        drive(&mut c, Millis(100_000)).len(),
        0,
        "a cancelled ticket is never granted"
    );
}

#[test]
fn cancel_of_unused_lease_refunds_everything() {
    let mut c = coord("");
    let l = grant(c.request_lease(Millis(0), &ask(1, 85_000, 10)).unwrap());
    c.cancel(Millis(0), l).unwrap();
    assert_eq!(available(&c, Axis::InputTokens), 85_000);
    assert_eq!(c.metrics(Millis(0)).pools[0].in_flight, 0);
}

#[test]
fn settling_a_queued_ticket_is_an_error_and_changes_nothing() {
    let mut c = coord("");
    grant(c.request_lease(Millis(0), &ask(1, 85_000, 10)).unwrap());
    let (t, _) = queued(c.request_lease(Millis(0), &ask(2, 10, 10)).unwrap());
    let before = c.snapshot_json();
    assert_eq!(
        c.settle(Millis(0), t, &used(1, 1)),
        Err(LeaseError::NotGranted)
    );
    assert_eq!(c.snapshot_json(), before);
}

#[test]
fn bad_input_is_an_error_and_leaves_state_unchanged() {
    let mut c = coord("");
    let l = grant(c.request_lease(Millis(0), &ask(1, 10, 10)).unwrap());
    let before = c.snapshot_json();
    let huge = ask(1, u64::MAX, 10);
    assert_eq!(
        c.request_lease(Millis(5), &huge),
        Err(LeaseError::TooLarge {
            field: "input_tokens"
        })
    );
    let other_pool = LeaseRequest {
        pool: PoolId(3),
        ..ask(1, 1, 1)
    };
    assert_eq!(
        c.request_lease(Millis(5), &other_pool),
        Err(LeaseError::UnknownPool)
    );
    let u = Usage {
        output_tokens: 1 << 53,
        ..Default::default()
    };
    assert_eq!(
        c.settle(Millis(5), l, &u),
        Err(LeaseError::TooLarge {
            field: "output_tokens"
        })
    );
    assert_eq!(
        c.settle(Millis(5), LeaseId(12345), &used(1, 1)),
        Err(LeaseError::UnknownLease)
    );
    assert_eq!(
        c.cancel(Millis(5), LeaseId(u64::MAX)),
        Err(LeaseError::UnknownLease)
    );
    assert_eq!(
        c.snapshot_json(),
        before,
        "errors must not move the clock or anything else"
    );
}

#[test]
fn planner_is_served_before_workers_queued_earlier() {
    let mut c = coord("");
    grant(c.request_lease(Millis(0), &ask(1, 85_000, 10)).unwrap());
    let (w, _) = queued(c.request_lease(Millis(0), &ask(2, 5_000, 10)).unwrap());
    let planner = LeaseRequest {
        role: Role::Planner,
        unblocks: 6,
        ..ask(3, 5_000, 10)
    };
    let (p, _) = queued(c.request_lease(Millis(0), &planner).unwrap());
    let ev = drive(&mut c, Millis(60_000));
    let order: Vec<LeaseId> = ev
        .iter()
        .filter_map(|(_, e)| {
            if let Event::Granted { lease, .. } = e {
                Some(*lease)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(order, vec![p, w]);
}

#[test]
fn weighted_queue_does_not_starve_workers() {
    // A planner keeps three requests queued at all times; a worker queued once still gets in.
    let mut c = coord("");
    grant(c.request_lease(Millis(0), &ask(1, 85_000, 10)).unwrap());
    let planner = LeaseRequest {
        role: Role::Planner,
        ..ask(2, 2_000, 10)
    };
    for _ in 0..3 {
        queued(c.request_lease(Millis(0), &planner).unwrap());
    }
    let (worker, _) = queued(c.request_lease(Millis(0), &ask(3, 2_000, 10)).unwrap());
    let mut planner_grants = 0;
    loop {
        let now = c.poll_timeout().unwrap();
        c.handle_timeout(now);
        let mut done = false;
        while let Some(e) = c.poll_event() {
            if let Event::Granted { lease, agent, .. } = e {
                c.settle(now, lease, &used(2_000, 10)).unwrap();
                if lease == worker {
                    done = true;
                } else if agent == AgentId(2) {
                    planner_grants += 1;
                    let _ = c.request_lease(now, &planner).unwrap();
                }
            }
        }
        if done {
            break;
        }
        assert!(now < Millis(600_000), "worker starved: now={now}");
    }
    assert!(
        (2..=6).contains(&planner_grants),
        "planner served {planner_grants} times before the worker"
    );
}

#[test]
fn repeated_identical_failure_halves_weight() {
    let mut c = coord("");
    grant(c.request_lease(Millis(0), &ask(1, 85_000, 10)).unwrap());
    // Agent 2 fails the same way twice in a row: weight 1 → 0.25. Agent 3 is fresh.
    let looping = LeaseRequest {
        failure_signature: Some(0xabc),
        ..ask(2, 1_000, 10)
    };
    let (a, _) = queued(c.request_lease(Millis(0), &looping).unwrap());
    c.cancel(Millis(0), a).unwrap();
    let (a2, _) = queued(c.request_lease(Millis(0), &looping).unwrap());
    c.cancel(Millis(0), a2).unwrap();
    let (a3, _) = queued(c.request_lease(Millis(0), &looping).unwrap());
    let (b, _) = queued(c.request_lease(Millis(0), &ask(3, 1_000, 10)).unwrap());
    let order: Vec<LeaseId> = drive(&mut c, Millis(60_000))
        .iter()
        .filter_map(|(_, e)| {
            if let Event::Granted { lease, .. } = e {
                Some(*lease)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(order, vec![b, a3]);
    let m = c.metrics(Millis(60_000));
    assert_eq!(
        m.agents
            .iter()
            .find(|a| a.agent == AgentId(2))
            .unwrap()
            .repeat_failures,
        2
    );
}

#[test]
fn cold_prompt_cache_charges_the_cached_prefix() {
    let mut c = coord(r#","prompt_cache_ttl_ms":300000"#);
    let req = LeaseRequest {
        cached_prefix_tokens: 50_000,
        ..ask(1, 2_000, 100)
    };
    let l = grant(c.request_lease(Millis(0), &req).unwrap());
    let s = c
        .settle(
            Millis(1_000),
            l,
            &Usage {
                input_tokens: 2_000,
                cache_creation_input_tokens: 50_000,
                output_tokens: 50,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        s.reserved.get(Axis::InputTokens),
        52_000,
        "first call: cache cold"
    );
    let l = grant(c.request_lease(Millis(100_000), &req).unwrap());
    let s = c
        .settle(
            Millis(101_000),
            l,
            &Usage {
                input_tokens: 2_000,
                cache_read_input_tokens: 50_000,
                output_tokens: 50,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        s.reserved.get(Axis::InputTokens),
        2_000,
        "warm cache: reads are free of ITPM"
    );
    assert_eq!(s.used.get(Axis::InputTokens), 2_000);
    let l = grant(c.request_lease(Millis(401_001), &req).unwrap());
    let s = c.settle(Millis(401_002), l, &used(52_000, 10)).unwrap();
    assert_eq!(
        s.reserved.get(Axis::InputTokens),
        52_000,
        "cache expired 300 s after the last call"
    );
}

#[test]
fn openai_counting_precharges_max_of_max_tokens_and_input() {
    let json = r#"{"pools":[{"name":"gpt","counting":"openai","tokens_per_minute":100000}]}"#;
    let mut c = Coordinator::new(Config::from_json(json).unwrap(), 1, Millis(0)).unwrap();
    let req = LeaseRequest {
        cached_prefix_tokens: 1_000,
        ..ask(1, 3_000, 10_000)
    };
    let l = grant(c.request_lease(Millis(0), &req).unwrap());
    let s = c
        .settle(
            Millis(10),
            l,
            &Usage {
                input_tokens: 3_000,
                cache_read_input_tokens: 1_000,
                output_tokens: 700,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(s.reserved.get(Axis::Tokens), 10_000);
    assert_eq!(
        s.used.get(Axis::Tokens),
        4_700,
        "cached tokens count toward OpenAI TPM"
    );
}

#[test]
fn rate_limit_on_granted_lease_cuts_margin_once_and_pauses_pool() {
    let mut c = coord("");
    let l = grant(c.request_lease(Millis(0), &ask(1, 1_000, 10)).unwrap());
    let report = parse_headers([("retry-after", "12")], None);
    c.handle_response(Millis(100), PoolId(0), Some(l), 429, &report)
        .unwrap();
    c.handle_response(Millis(100), PoolId(0), Some(l), 429, &report)
        .unwrap();
    let ev: Vec<Event> = std::iter::from_fn(|| c.poll_event()).collect();
    assert!(
        ev.contains(&Event::Paused {
            pool: PoolId(0),
            until: Millis(12_100)
        }),
        "{ev:?}"
    );
    let cuts = ev
        .iter()
        .filter(|e| matches!(e, Event::MarginChanged { .. }))
        .count();
    assert_eq!(cuts, 1, "one lease, one cut: {ev:?}");
    assert_eq!(c.metrics(Millis(100)).pools[0].margin_permille, 800);
    // The whole pool waits out the pause.
    let (t, eta) = queued(c.request_lease(Millis(200), &ask(2, 10, 10)).unwrap());
    assert_eq!(eta, promise(200, 12_100));
    let ev = drive(&mut c, Millis(20_000));
    assert!(
        ev.iter().any(|(at, e)| *at == Millis(12_100)
            && matches!(e, Event::Granted { lease, .. } if *lease == t))
    );
}

#[test]
fn margin_recovers_a_point_per_clean_interval_and_respects_the_floor() {
    let mut c = coord("");
    let r = parse_headers([("retry-after", "1")], None);
    for i in 0..10 {
        let l = grant(c.request_lease(Millis(i * 2_000), &ask(i, 10, 10)).unwrap());
        c.handle_response(Millis(i * 2_000 + 1), PoolId(0), Some(l), 429, &r)
            .unwrap();
        c.settle(Millis(i * 2_000 + 1), l, &used(0, 0)).unwrap();
    }
    assert_eq!(
        c.metrics(Millis(20_000)).pools[0].margin_permille,
        600,
        "floor"
    );
    let last_429 = 9 * 2_000 + 1;
    c.handle_timeout(Millis(last_429 + 60_000 - 1));
    assert_eq!(c.metrics(c.now()).pools[0].margin_permille, 600);
    c.handle_timeout(Millis(last_429 + 60_000));
    assert_eq!(c.metrics(c.now()).pools[0].margin_permille, 610);
    c.handle_timeout(Millis(last_429 + 100 * 60_000));
    assert_eq!(c.metrics(c.now()).pools[0].margin_permille, 850, "ceiling");
    assert_eq!(c.poll_timeout(), None, "nothing left to wake for");
}

#[test]
fn time_going_backwards_is_clamped() {
    let mut c = coord("");
    grant(
        c.request_lease(Millis(10_000), &ask(1, 85_000, 10))
            .unwrap(),
    );
    let (_, eta) = queued(c.request_lease(Millis(5), &ask(2, 850, 10)).unwrap());
    assert_eq!(c.now(), Millis(10_000));
    // 850 tokens and agent 1's share of 851 and small calls' lead of 5,000, from 10 s.
    assert_eq!(
        eta,
        promise(10_000, 10_000 + ((850 + 851 + 5_000) * W).div_ceil(85_000))
    );
}

#[test]
fn huge_time_jumps_saturate_without_panicking() {
    let mut c = coord("");
    let l = grant(
        c.request_lease(Millis(u64::MAX - 10), &ask(1, 85_000, 10))
            .unwrap(),
    );
    assert!(matches!(
        c.request_lease(Millis(u64::MAX - 6), &ask(2, 85_000, 10))
            .unwrap(),
        Decision::Queued { .. }
    ));
    c.settle(Millis(u64::MAX - 5), l, &used(1, 1)).unwrap();
    c.handle_timeout(Millis(u64::MAX));
    // At the end of time a lease would be born expired: requests queue, nothing is granted,
    // and waking at the end of time again changes nothing.
    while c.poll_event().is_some() {}
    let (l, _) = queued(c.request_lease(Millis(u64::MAX), &ask(3, 1, 1)).unwrap());
    c.handle_timeout(Millis(u64::MAX));
    assert!(!std::iter::from_fn(|| c.poll_event()).any(|e| matches!(e, Event::Granted { .. })));
    assert_eq!(
        c.settle(Millis(u64::MAX), l, &used(1, 1)),
        Err(LeaseError::NotGranted)
    );
    c.cancel(Millis(u64::MAX), l).unwrap();
    assert_eq!(
        c.settle(Millis(u64::MAX), l, &used(1, 1)),
        Err(LeaseError::UnknownLease)
    );
    let _ = c.poll_timeout();
    let _ = c.metrics(Millis(u64::MAX));
    c.check().unwrap();
}

#[test]
fn provider_headers_lower_the_bucket_and_update_the_tier() {
    let mut c = coord("");
    let r = parse_headers(
        [
            ("anthropic-ratelimit-input-tokens-limit", "100000"),
            ("anthropic-ratelimit-input-tokens-remaining", "40000"),
        ],
        None,
    );
    c.handle_response(Millis(0), PoolId(0), None, 200, &r)
        .unwrap();
    // Provider: 40k of 100k left, i.e. 60k used, and no call of ours in flight it has not
    // counted: the level is the 85 % margin's share of its figure (no call has settled
    // yet to say how far estimates fall short).
    assert_eq!(available(&c, Axis::InputTokens), 34_000);
    let r = parse_headers([("anthropic-ratelimit-input-tokens-limit", "200000")], None);
    c.handle_response(Millis(0), PoolId(0), None, 200, &r)
        .unwrap();
    let m = c.metrics(Millis(0));
    let a = m.pools[0]
        .axes
        .iter()
        .find(|a| a.axis == Axis::InputTokens)
        .unwrap();
    assert_eq!(
        (a.limit, a.capacity),
        (Some(200_000), 170_000),
        "a new tier changes capacity"
    );
}

#[test]
fn unknown_limit_is_learned_from_headers() {
    let json = r#"{"pools":[{"name":"p"}]}"#;
    let mut c = Coordinator::new(Config::from_json(json).unwrap(), 1, Millis(0)).unwrap();
    grant(c.request_lease(Millis(0), &ask(1, 1_000_000, 10)).unwrap());
    let r = parse_headers(
        [
            ("anthropic-ratelimit-input-tokens-limit", "50000"),
            ("anthropic-ratelimit-input-tokens-remaining", "0"),
        ],
        None,
    );
    c.handle_response(Millis(10), PoolId(0), None, 200, &r)
        .unwrap();
    assert!(matches!(
        c.request_lease(Millis(10), &ask(2, 1_000, 10)).unwrap(),
        Decision::Queued { .. }
    ));
}

#[test]
fn estimate_alert_fires_when_the_median_error_stays_high() {
    let mut c = coord("");
    let mut alerts = 0;
    for i in 0..14u64 {
        let l = grant(
            c.request_lease(Millis(i * 1_000), &ask(1, 1_000, 10))
                .unwrap(),
        );
        c.settle(Millis(i * 1_000 + 1), l, &used(1_500, 10))
            .unwrap();
        while let Some(e) = c.poll_event() {
            if let Event::EstimateAlert {
                agent,
                error_permille,
            } = e
            {
                assert_eq!(
                    (agent, i),
                    (AgentId(1), 8),
                    "the ninth sample: a median of nine"
                );
                assert_eq!(error_permille, 333);
                alerts += 1;
            }
        }
    }
    assert_eq!(alerts, 1, "raised once while it stays above the threshold");
}

#[test]
fn estimate_alert_ignores_a_few_calls_far_off() {
    let mut c = coord("");
    for i in 0..40u64 {
        let l = grant(
            c.request_lease(Millis(i * 1_000), &ask(1, 1_000, 10))
                .unwrap(),
        );
        // Four in every nine calls miss by 50 %: the median stays on the good ones.
        let actual = if i % 9 < 4 { 2_000 } else { 1_000 };
        c.settle(Millis(i * 1_000 + 1), l, &used(actual, 10))
            .unwrap();
        while let Some(e) = c.poll_event() {
            assert!(!matches!(e, Event::EstimateAlert { .. }), "call {i}: {e:?}");
        }
    }
}

#[test]
fn idle_agents_are_forgotten_when_the_table_is_full() {
    let mut c = coord(r#","max_agents":2"#);
    let a = grant(c.request_lease(Millis(0), &ask(1, 10, 10)).unwrap());
    let b = grant(c.request_lease(Millis(1), &ask(2, 10, 10)).unwrap());
    let d = c.request_lease(Millis(2), &ask(3, 10, 10)).unwrap();
    assert_eq!(
        d,
        Decision::Reject {
            retry_at: Millis(120_000),
            reason: RejectReason::TooManyAgents
        },
        "back when the first lease ends"
    );
    c.settle(Millis(3), a, &used(10, 10)).unwrap();
    grant(c.request_lease(Millis(4), &ask(3, 10, 10)).unwrap());
    c.settle(Millis(5), b, &used(10, 10)).unwrap();
    assert_eq!(c.metrics(Millis(5)).agents.len(), 2);
}

#[test]
fn lease_ids_stay_below_2_pow_53() {
    let mut c = coord("");
    for i in 0..5_000u64 {
        let l = grant(c.request_lease(Millis(i * 100), &ask(1, 10, 10)).unwrap());
        assert!(l.0 < 1 << 53);
        c.settle(Millis(i * 100), l, &used(10, 10)).unwrap();
    }
}

#[test]
fn snapshot_restore_makes_the_same_decisions() {
    let mut a = coord("");
    grant(a.request_lease(Millis(0), &ask(1, 80_000, 1_000)).unwrap());
    queued(a.request_lease(Millis(10), &ask(2, 30_000, 1_000)).unwrap());
    let mut b = Coordinator::restore_json(&a.snapshot_json()).unwrap();
    assert_eq!(a, b);
    for t in [100u64, 5_000, 30_000, 90_000] {
        let da = a.request_lease(Millis(t), &ask(t, 7_000, 500)).unwrap();
        let db = b.request_lease(Millis(t), &ask(t, 7_000, 500)).unwrap();
        assert_eq!(da, db, "now={t}");
        assert_eq!(
            drive(&mut a, Millis(t + 1_000)),
            drive(&mut b, Millis(t + 1_000))
        );
    }
    // A 429 without retry-after waits a full-jitter draw from the seeded PRNG.
    let limited = Input::CallResponse {
        call: Call::new(),
        pool: PoolId(0),
        lease: None,
        status: 429,
        headers: vec![],
        unix_now_ms: None,
        reported: false,
    };
    let (wa, wb) = (
        a.handle(Millis(100_000), &limited).unwrap(),
        b.handle(Millis(100_000), &limited).unwrap(),
    );
    assert!(matches!(wa, Output::Wait { .. }), "{wa:?}");
    assert_eq!(wa, wb, "same PRNG state");
}

#[test]
fn corrupt_or_foreign_snapshots_are_refused() {
    let c = coord("");
    let json = c.snapshot_json();
    assert!(matches!(
        Coordinator::restore_json("{}"),
        Err(RestoreError::Parse(_))
    ));
    let v2 = json.replacen("\"version\":1", "\"version\":2", 1);
    assert!(matches!(
        Coordinator::restore_json(&v2),
        Err(RestoreError::UnsupportedVersion(2))
    ));
    let bad = json.replacen("\"margin\":850", "\"margin\":10", 1);
    assert!(
        matches!(
            Coordinator::restore_json(&bad),
            Err(RestoreError::Corrupt(_))
        ),
        "margin below floor"
    );
}

#[test]
fn slow_start_ramps_token_capacity() {
    let mut c = coord(r#","slow_start":{"start_permille":500,"ramp_ms":60000}"#);
    let cap = |c: &Coordinator| c.metrics(c.now()).pools[0].axes[0].capacity;
    assert_eq!(cap(&c), 42_500);
    c.handle_timeout(Millis(30_000));
    assert_eq!(cap(&c), 63_750);
    c.handle_timeout(Millis(60_000));
    assert_eq!(cap(&c), 85_000);
    // Requests/min is not ramped, and keeps no margin: a request is counted exactly.
    assert_eq!(c.metrics(c.now()).pools[0].axes[3].capacity, 1000);
}

#[test]
fn metrics_report_usage_binding_axis_and_fleet_advice() {
    let mut c = coord("");
    for i in 0..10u64 {
        let l = grant(
            c.request_lease(Millis(i * 5_000), &ask(i % 2, 4_000, 500))
                .unwrap(),
        );
        c.settle(Millis(i * 5_000 + 10), l, &used(4_000, 300))
            .unwrap();
    }
    let m = c.metrics(Millis(60_000));
    let p = &m.pools[0];
    assert_eq!(p.axes[0].last_minute, 40_000);
    assert_eq!(p.axes[0].last_minute_permille, 400);
    assert_eq!(p.binding_axis, Some(Axis::InputTokens));
    let f = p.fleet.unwrap();
    assert_eq!((f.agents_measured, f.per_agent_per_minute), (2, 20_000));
    assert_eq!(f.agents_at_75_percent, 3, "75k / 20k per agent");
}

#[test]
fn settling_at_or_after_expiry_is_an_error_that_changes_nothing() {
    let mut c = coord(r#","lease_ttl_ms":1000"#);
    let l = grant(c.request_lease(Millis(0), &ask(1, 85_000, 10)).unwrap());
    let before = c.snapshot_json();
    assert_eq!(
        c.settle(Millis(1_000), l, &used(1, 1)),
        Err(LeaseError::UnknownLease)
    );
    assert_eq!(c.cancel(Millis(5_000), l), Err(LeaseError::UnknownLease));
    let r = parse_headers([("retry-after", "1")], None);
    assert_eq!(
        c.handle_response(Millis(1_000), PoolId(0), Some(l), 429, &r),
        Err(LeaseError::UnknownLease)
    );
    assert_eq!(
        c.snapshot_json(),
        before,
        "the reaping happens on the next real input, not inside an error"
    );
    c.handle_timeout(Millis(1_000));
    assert!(matches!(c.poll_event(), Some(Event::Expired { lease, .. }) if lease == l));
}

#[test]
fn a_429_on_a_lease_granted_before_the_limits_were_known_does_not_cut_the_margin() {
    let json = r#"{"pools":[{"name":"p"}]}"#;
    let mut c = Coordinator::new(Config::from_json(json).unwrap(), 1, Millis(0)).unwrap();
    let blind = grant(c.request_lease(Millis(0), &ask(1, 50_000, 10)).unwrap());
    let r = parse_headers(
        [
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "0"),
            ("retry-after", "2"),
        ],
        None,
    );
    c.handle_response(Millis(10), PoolId(0), Some(blind), 429, &r)
        .unwrap();
    assert_eq!(
        c.metrics(Millis(10)).pools[0].margin_permille,
        850,
        "granted blind: not the coordinator's error"
    );
    // Once the limit is known, a 429 on a lease granted under it does cut.
    c.handle_timeout(Millis(60_000));
    let known = grant(c.request_lease(Millis(60_000), &ask(2, 1_000, 10)).unwrap());
    c.handle_response(Millis(60_010), PoolId(0), Some(known), 429, &r)
        .unwrap();
    assert_eq!(c.metrics(Millis(60_010)).pools[0].margin_permille, 800);
}

#[test]
fn a_parallel_request_429_teaches_an_unknown_concurrency_limit_without_a_cut() {
    let json = r#"{"pools":[{"name":"p","input_tokens_per_minute":100000}]}"#;
    let mut c = Coordinator::new(Config::from_json(json).unwrap(), 1, Millis(0)).unwrap();
    let leases: Vec<_> = (0..5)
        .map(|i| grant(c.request_lease(Millis(0), &ask(i, 10, 10)).unwrap()))
        .collect();
    let r = parse_headers(
        [
            ("retry-after", "60"),
            ("rate_limit_type", "parallel_requests"),
        ],
        None,
    );
    c.handle_response(Millis(10), PoolId(0), Some(leases[4]), 429, &r)
        .unwrap();
    let m = c.metrics(Millis(10));
    assert_eq!(
        m.pools[0].max_concurrent,
        Some(4),
        "four others were in flight"
    );
    assert_eq!(
        m.pools[0].margin_permille, 850,
        "the limit was unknown: not a misjudgement"
    );
    assert_eq!(
        m.pools[0].paused_until,
        Millis(0),
        "a parallel-request limit clears as calls end"
    );
    c.settle(Millis(20), leases[4], &used(0, 0)).unwrap();
    queued(c.request_lease(Millis(20), &ask(9, 10, 10)).unwrap());
}

#[test]
fn transient_refusals_always_name_a_retry_time() {
    // One slot, one queue place: the head waits for the slot, whose release nobody can
    // foresee; a third request is refused as queue_full, with a time to come back all the
    // same (`None` would read as "never"). (The queued agent asks again.)
    let config = Config::from_json(
        r#"{"pools":[{"name":"p","input_tokens_per_minute":100000,"max_concurrent":1}],
            "max_queue_depth":1,"max_agents":2}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut c = Coordinator::new(config, 1, Millis(0)).unwrap_or_else(|e| panic!("{e}"));
    let _ = grant(c.request_lease(Millis(0), &ask(1, 10, 10)).unwrap());
    let _ = queued(c.request_lease(Millis(0), &ask(2, 10, 10)).unwrap());
    match c.request_lease(Millis(5), &ask(2, 10, 10)).unwrap() {
        Decision::Reject {
            retry_at: t,
            reason: RejectReason::QueueFull,
        } => assert_eq!(t, Millis(1_005), "one backoff base after now (5 ms)"),
        other => panic!("at 5 ms: {other:?}"),
    }
    // A full table of busy agents: back when a lease ends (the first expires at 120 s).
    match c.request_lease(Millis(5), &ask(3, 10, 10)).unwrap() {
        Decision::Reject {
            retry_at: t,
            reason: RejectReason::TooManyAgents,
        } => assert_eq!(t, Millis(120_000)),
        other => panic!("at 5 ms: {other:?}"),
    }
}

#[test]
fn unblocks_count_only_up_to_max_unblocks() {
    // One slot, held; two planners queue, the second claiming a billion unblocked tasks.
    // Counted as `weights.max_unblocks` (default 32) like the first, it does not jump ahead.
    let config = Config::from_json(
        r#"{"pools":[{"name":"p","input_tokens_per_minute":100000,"max_concurrent":1}]}"#,
    )
    .unwrap();
    let mut c = Coordinator::new(config, 1, Millis(0)).unwrap();
    let held = grant(c.request_lease(Millis(0), &ask(1, 100, 10)).unwrap());
    let claim = |agent, unblocks| LeaseRequest {
        role: Role::Planner,
        unblocks,
        ..ask(agent, 1000, 10)
    };
    let (honest, _) = queued(c.request_lease(Millis(0), &claim(2, 32)).unwrap());
    let (greedy, _) = queued(
        c.request_lease(Millis(1), &claim(3, 1_000_000_000))
            .unwrap(),
    );
    c.settle(Millis(2), held, &Usage::default()).unwrap();
    let granted: Vec<LeaseId> = drive(&mut c, Millis(2))
        .into_iter()
        .filter_map(|(_, e)| match e {
            Event::Granted { lease, .. } => Some(lease),
            _ => None,
        })
        .collect();
    assert_eq!(
        granted,
        vec![honest],
        "the earlier of two equal weights goes first"
    );
    assert_ne!(granted.first(), Some(&greedy));
}

#[test]
fn a_renewed_lease_outlives_its_ttl_and_keeps_its_slot() {
    // One slot, a 3 s TTL: a call that renews every 2 s holds the slot for 10 s, and the
    // second caller waits until it settles (the 40 s streams of issue 25 ran together).
    let json = r#"{"pools":[{"name":"p","requests_per_minute":1000,"max_concurrent":1}],
        "lease_ttl_ms":3000}"#;
    let mut c = Coordinator::new(Config::from_json(json).unwrap(), 7, Millis(0)).unwrap();
    let a = grant(c.request_lease(Millis(0), &ask(1, 10, 10)).unwrap());
    let (b, _) = queued(c.request_lease(Millis(1), &ask(2, 10, 10)).unwrap());
    for t in (2_000..=10_000).step_by(2_000) {
        // Nothing expires; the ticket's promise, which the slot held longer each time
        // outlives, is replaced (by the new expiry) as it comes.
        let events = drive(&mut c, Millis(t));
        assert!(
            events
                .iter()
                .all(|(_, e)| matches!(e, Event::Revised { lease, .. } if *lease == b)),
            "nothing expires by {t}: {events:?}"
        );
        assert_eq!(c.renew(Millis(t), a), Ok(Millis(t + 3_000)));
        c.check().unwrap();
    }
    assert_eq!(c.metrics(Millis(10_000)).pools[0].in_flight, 1);
    // The host wakes when the ticket's promise comes (the slot's expiry before the last
    // renewal), to replace it, before the slot's own new expiry.
    assert_eq!(c.poll_timeout(), Some(Millis(11_000)));
    // Renewing again at the same instant moves nothing, and never earlier.
    assert_eq!(c.renew(Millis(10_000), a), Ok(Millis(13_000)));
    assert_eq!(c.renew(Millis(9_000), a), Ok(Millis(13_000)));
    c.settle(Millis(11_000), a, &used(10, 10)).unwrap();
    // Granted by its promise: the settle frees the slot at the instant the promise comes.
    let granted: Vec<LeaseId> = core::iter::from_fn(|| c.poll_event())
        .filter_map(|e| match e {
            Event::Granted { lease, .. } => Some(lease),
            _ => None,
        })
        .collect();
    assert_eq!(granted, vec![b]);
    assert_eq!(c.metrics(Millis(11_000)).pools[0].counters.expired, 0);
}

/// Driven to `at`: lease `a` expires and ticket `b` is granted in its place (revisions of
/// promises aside), and nothing else happens.
fn expired_then_granted(c: &mut Coordinator, at: Millis, a: LeaseId, b: LeaseId) {
    let ev: Vec<(Millis, Event)> = drive(c, at)
        .into_iter()
        .filter(|(_, e)| !matches!(e, Event::Revised { .. }))
        .collect();
    assert!(
        matches!(ev.as_slice(), [(_, Event::Expired { lease, .. }), (_, Event::Granted { lease: g, .. })] if *lease == a && *g == b),
        "{ev:?}"
    );
}

#[test]
fn renewals_end_at_the_lease_s_life_and_the_slot_is_freed_then() {
    // One slot, a 3 s TTL, a life of 7 s (issue 43, N3: a caller renewing without end held
    // every slot while another waited). Renewals move the expiry up to the grant + 7 s and
    // no further; the lease is reaped then and the queued caller granted.
    let json = r#"{"pools":[{"name":"p","requests_per_minute":1000,"max_concurrent":1}],
        "lease_ttl_ms":3000,"max_lease_life_ms":7000}"#;
    let mut c = Coordinator::new(Config::from_json(json).unwrap(), 7, Millis(0)).unwrap();
    let a = grant(c.request_lease(Millis(0), &ask(1, 10, 10)).unwrap());
    let (b, _) = queued(c.request_lease(Millis(1), &ask(2, 10, 10)).unwrap());
    assert_eq!(c.renew(Millis(2_000), a), Ok(Millis(5_000)));
    assert_eq!(c.renew(Millis(4_500), a), Ok(Millis(7_000)), "capped");
    for t in [5_000, 6_000, 6_999] {
        let _ = drive(&mut c, Millis(t));
        assert_eq!(c.renew(Millis(t), a), Ok(Millis(7_000)), "at {t}");
        c.check().unwrap();
    }
    expired_then_granted(&mut c, Millis(7_000), a, b);
    assert_eq!(c.renew(Millis(7_000), a), Err(LeaseError::UnknownLease));
    // The granted ticket's life counts from its own grant.
    assert_eq!(c.renew(Millis(9_000), b), Ok(Millis(12_000)));
    c.check().unwrap();
}

#[test]
fn max_lease_life_ms_is_validated_and_older_snapshots_take_the_default() {
    for (bad, why) in [
        ("0", "between 1 ms and 30 days"),
        ("2592000001", "between 1 ms and 30 days"),
        ("119999", "at least lease_ttl_ms"),
    ] {
        let json = format!(r#"{{"pools":[{{"name":"p"}}],"max_lease_life_ms":{bad}}}"#);
        let e = Config::from_json(&json).unwrap_err().to_string();
        assert!(
            e.contains("max_lease_life_ms") && e.contains(why),
            "{bad}: {e}"
        );
    }
    // Unset: an hour, or the TTL where that is longer (a configuration written before the
    // field, with a TTL of a day, still starts).
    assert_eq!(coord("").config().lease_life_ms(), 3_600_000);
    assert_eq!(
        coord(r#","lease_ttl_ms":86400000"#)
            .config()
            .lease_life_ms(),
        86_400_000
    );
    assert_eq!(
        coord(r#","max_lease_life_ms":600000"#)
            .config()
            .lease_life_ms(),
        600_000
    );
    let c = coord(r#","max_lease_life_ms":600000"#);
    let mut v: serde_json::Value = serde_json::from_str(&c.snapshot_json()).unwrap();
    v["state"]["config"]
        .as_object_mut()
        .unwrap()
        .remove("max_lease_life_ms")
        .unwrap();
    let back = Coordinator::restore_json(&v.to_string()).unwrap();
    assert_eq!(back.config().lease_life_ms(), 3_600_000);
}

#[test]
fn an_unrenewed_lease_is_reaped_and_renewing_it_then_is_an_error() {
    let json = r#"{"pools":[{"name":"p","requests_per_minute":1000,"max_concurrent":1}],
        "lease_ttl_ms":3000}"#;
    let mut c = Coordinator::new(Config::from_json(json).unwrap(), 7, Millis(0)).unwrap();
    let a = grant(c.request_lease(Millis(0), &ask(1, 10, 10)).unwrap());
    let (b, _) = queued(c.request_lease(Millis(1), &ask(2, 10, 10)).unwrap());
    // A queued ticket holds nothing to renew.
    let before = c.snapshot_json();
    assert_eq!(c.renew(Millis(2), b), Err(LeaseError::NotGranted));
    assert_eq!(
        c.renew(Millis(2), LeaseId(u64::MAX)),
        Err(LeaseError::UnknownLease)
    );
    // At its expiry it is gone, and saying so moves nothing.
    assert_eq!(c.renew(Millis(3_000), a), Err(LeaseError::UnknownLease));
    assert_eq!(
        c.snapshot_json(),
        before,
        "errors leave the state unchanged"
    );
    expired_then_granted(&mut c, Millis(3_000), a, b);
    assert_eq!(c.renew(Millis(3_001), a), Err(LeaseError::UnknownLease));
    // A settled lease cannot be renewed either.
    assert_eq!(c.renew(Millis(4_000), b), Ok(Millis(7_000)));
    c.settle(Millis(4_000), b, &used(10, 10)).unwrap();
    assert_eq!(c.renew(Millis(4_000), b), Err(LeaseError::UnknownLease));
    c.check().unwrap();
}

#[test]
fn renewing_keeps_the_expiry_queue_in_order() {
    // Two leases; the first one renewed past the second: the second is reaped first, the
    // first at its new expiry, and a snapshot of the state restores.
    let mut c = coord(r#","lease_ttl_ms":1000"#);
    let a = grant(c.request_lease(Millis(0), &ask(1, 10, 10)).unwrap());
    let b = grant(c.request_lease(Millis(100), &ask(2, 10, 10)).unwrap());
    assert_eq!(c.renew(Millis(500), a), Ok(Millis(1_500)));
    assert_eq!(c.poll_timeout(), Some(Millis(1_100)));
    let mut c = Coordinator::restore_json(&c.snapshot_json()).unwrap();
    let ev = drive(&mut c, Millis(2_000));
    let reaped: Vec<_> = ev
        .iter()
        .filter_map(|(t, e)| match e {
            Event::Expired { lease, .. } => Some((*t, *lease)),
            _ => None,
        })
        .collect();
    assert_eq!(reaped, [(Millis(1_100), b), (Millis(1_500), a)]);
}

#[test]
fn a_warm_cache_bump_is_given_while_the_ticket_waits() {
    // One concurrency slot, held by agent 9 well past agent 1's bump window.
    let json = r#"{"pools":[{"name":"p","input_tokens_per_minute":100000,
        "output_tokens_per_minute":20000,"requests_per_minute":1000,"max_concurrent":1}],
        "lease_ttl_ms":400000}"#;
    let mut c = Coordinator::new(Config::from_json(json).unwrap(), 7, Millis(0)).unwrap();
    let warm = |input| LeaseRequest {
        cached_prefix_tokens: 2000,
        ..ask(1, input, 100)
    };
    let first = grant(c.request_lease(Millis(0), &warm(100)).unwrap());
    let read = Usage {
        input_tokens: 100,
        cache_read_input_tokens: 2000,
        output_tokens: 100,
        ..Usage::default()
    };
    c.settle(Millis(10), first, &read).unwrap(); // warm until 300,010
    let slot = grant(c.request_lease(Millis(20), &ask(9, 100, 100)).unwrap());
    // Agent 2 asks first for less; agent 1 then asks with 200 s of cache left: no bump at
    // the ask, so it is behind agent 2.
    queued(
        c.request_lease(Millis(100_000), &ask(2, 1000, 100))
            .unwrap(),
    );
    let (one, _) = queued(c.request_lease(Millis(100_001), &warm(1200)).unwrap());
    // The pending bump survives a snapshot, and the core wakes when the cache comes within
    // the 60 s window (240,010).
    let mut c = Coordinator::restore_json(&c.snapshot_json()).unwrap();
    assert!(c.poll_timeout() <= Some(Millis(240_010)));
    // (Agent 1's ask, a new agent in the pool, moved the tickets' bounds: their promises were
    // replaced at once; nothing else happens by the bump.)
    let events = drive(&mut c, Millis(240_010));
    assert!(
        events
            .iter()
            .all(|(at, e)| *at == Millis(100_001) && matches!(e, Event::Revised { .. })),
        "{events:?}"
    );
    assert_eq!(c.check(), Ok(()));
    c.settle(Millis(250_000), slot, &used(100, 100)).unwrap();
    let granted: Vec<LeaseId> = core::iter::from_fn(|| c.poll_event())
        .filter_map(|e| match e {
            Event::Granted { lease, .. } => Some(lease),
            _ => None,
        })
        .collect();
    assert_eq!(
        granted,
        vec![one],
        "agent 1, bumped while it waited, goes first"
    );
}

#[test]
fn a_share_of_the_key_holds_its_part_of_every_limit_and_report() {
    // One of four processes splitting the key (a remote driver's fallback): every limit
    // counts a quarter here, and so does what the provider reports for the whole key.
    let json = r#"{"pools":[{"name":"p","input_tokens_per_minute":100000,
        "output_tokens_per_minute":20000,"requests_per_minute":1001,"max_concurrent":8}],
        "share":4}"#;
    let config = Config::from_json(json).unwrap();
    assert_eq!(
        (config.part(1001), config.part(1), config.part(0)),
        (251, 1, 0)
    );
    let mut c = Coordinator::new(config, 1, Millis(0)).unwrap();
    let limits = |c: &Coordinator, at: u64| {
        let m = c.metrics(Millis(at));
        let p = &m.pools[0];
        (
            p.axes.iter().map(|a| a.limit).collect::<Vec<_>>(),
            p.max_concurrent,
        )
    };
    let (axes, concurrent) = limits(&c, 0);
    assert_eq!(axes, [Some(25_000), Some(5_000), None, Some(251)]);
    assert_eq!(concurrent, Some(2));
    // A call of 30,000 input tokens is more than a quarter allows: never as asked here.
    assert!(matches!(
        c.request_lease(Millis(0), &ask(1, 30_000, 10)).unwrap(),
        Decision::NeverFits { .. }
    ));
    // The key's headers: limit 200,000 (50,000 here), 100,000 remaining (25,000 here: the
    // level is the 85 % margin's share of it, 21,250).
    let report = parse_headers(
        [
            ("anthropic-ratelimit-input-tokens-limit", "200000"),
            ("anthropic-ratelimit-input-tokens-remaining", "100000"),
        ],
        None,
    );
    c.handle_response(Millis(1), PoolId(0), None, 200, &report)
        .unwrap();
    let (axes, _) = limits(&c, 1);
    assert_eq!(axes[0], Some(50_000));
    let available = c.metrics(Millis(1)).pools[0].axes[0].available;
    assert_eq!(available, 21_250);
    // A share is from 1 to 4096.
    let bad = Config::from_json(r#"{"pools":[{"name":"p","requests_per_minute":1}],"share":0}"#);
    assert!(
        matches!(bad, Err(ConfigError::Invalid { ref field, .. }) if field.name == "share"),
        "{bad:?}"
    );
    // The whole key (share 1) is not written out.
    let whole = Config::from_json(r#"{"pools":[{"name":"p","requests_per_minute":1}]}"#).unwrap();
    let written = serde_json::to_value(&whole).unwrap();
    assert!(written.get("share").is_none(), "{written}");
}

#[test]
fn revisions_wait_once_per_ticket_however_many_agents_join() {
    // 400 agents join one after another while the line grows: each join may move every
    // promise behind it, but a ticket has at most one `Revised` event waiting, carrying
    // the promise in force when it is polled.
    let mut c = coord("");
    grant(c.request_lease(Millis(0), &ask(1, 85_000, 10)).unwrap());
    for a in 2..=400 {
        // All at one instant: nothing refills, nothing is granted.
        let d = c.request_lease(Millis(1), &ask(a, 100, 10)).unwrap();
        assert!(matches!(d, Decision::Queued { .. }), "{d:?}");
    }
    assert!(
        c.pending_events() <= 399,
        "{} events waiting for 399 tickets",
        c.pending_events()
    );
    let mut promised = std::collections::BTreeMap::new();
    while let Some(e) = c.poll_event() {
        if let Event::Revised { lease, eta, .. } = e {
            assert!(
                promised.insert(lease, eta).is_none(),
                "{lease} revised twice in the queue"
            );
            assert!(
                c.expected_grant(lease).is_some_and(|x| x <= eta),
                "{lease}: expected {:?}, promised {eta}",
                c.expected_grant(lease)
            );
        }
    }
    assert!(!promised.is_empty(), "joining agents moved the promises");
}
