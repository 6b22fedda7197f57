//! The call lifecycle: each step the core hands a host, one test per rule.

use tokenwarden_core::*;

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

fn headers(pairs: &[(&str, &str)]) -> HeaderReport {
    parse_headers(pairs.iter().copied(), None)
}

fn sent(step: LeaseStep) -> LeaseId {
    match step {
        LeaseStep::Send { lease, .. } => lease,
        other => panic!("expected send, got {other:?}"),
    }
}

#[test]
fn a_grant_is_sent_and_a_success_delivered() {
    let mut c = coord("");
    let mut call = Call::new();
    let lease = sent(
        c.call_lease(Millis(0), &mut call, &ask(1, 1000, 100))
            .unwrap(),
    );
    let step = c
        .call_response(
            Millis(10),
            &mut call,
            PoolId(0),
            Some(lease),
            200,
            &headers(&[]),
        )
        .unwrap()
        .step;
    assert_eq!(step, ResponseStep::Deliver);
    // A success is the host's to settle, with the usage it read.
    assert!(c.settle(Millis(20), lease, &Usage::default()).is_ok());
}

#[test]
fn a_client_error_is_delivered_and_settled_as_nothing_used() {
    let mut c = coord("");
    let mut call = Call::new();
    let lease = sent(
        c.call_lease(Millis(0), &mut call, &ask(1, 1000, 100))
            .unwrap(),
    );
    let step = c
        .call_response(
            Millis(10),
            &mut call,
            PoolId(0),
            Some(lease),
            400,
            &headers(&[]),
        )
        .unwrap()
        .step;
    assert_eq!(step, ResponseStep::Deliver);
    assert_eq!(
        c.settle(Millis(20), lease, &Usage::default()),
        Err(LeaseError::UnknownLease)
    );
    assert_eq!(c.metrics(Millis(20)).live_leases, 0);
}

#[test]
fn a_429_waits_for_retry_after_and_the_next_ask_is_sent() {
    let mut c = coord("");
    let mut call = Call::new();
    let lease = sent(
        c.call_lease(Millis(0), &mut call, &ask(1, 1000, 100))
            .unwrap(),
    );
    let step = c
        .call_response(
            Millis(10),
            &mut call,
            PoolId(0),
            Some(lease),
            429,
            &headers(&[("retry-after", "2")]),
        )
        .unwrap()
        .step;
    let ResponseStep::Wait(Wait {
        until,
        reason: WaitReason::RateLimited,
        ticket: None,
        attempt: 1,
        checkpoint: false,
        ..
    }) = step
    else {
        panic!("expected a rate-limited wait, got {step:?}")
    };
    assert!((2010..=3010).contains(&until.0), "{until:?}");
    assert_eq!(call.last_retry_after_ms, Some(2000));
    // The lease was given back; asking again at `until` is served (the pause is over).
    assert_eq!(c.metrics(until).live_leases, 0);
    sent(c.call_lease(until, &mut call, &ask(1, 1000, 100)).unwrap());
}

#[test]
fn a_refused_call_leaves_its_prompt_cache_cold() {
    // Found by the simulation driving the reference host loop: a 429 settled by the core
    // counted as a call that warmed the agent's prompt cache, so the next call did not
    // reserve its cached prefix, which the provider charges as input while the cache is
    // cold. A refused call never reached the model: nothing was cached.
    let mut c = coord("");
    let cached = LeaseRequest {
        cached_prefix_tokens: 20_000,
        ..ask(1, 1_000, 100)
    };
    let mut call = Call::new();
    let lease = sent(c.call_lease(Millis(0), &mut call, &cached).unwrap());
    let r = c
        .call_response(
            Millis(10),
            &mut call,
            PoolId(0),
            Some(lease),
            429,
            &headers(&[]),
        )
        .unwrap();
    assert_eq!(
        r.settled.map(|s| s.reserved.get(Axis::InputTokens)),
        Some(21_000),
        "a cold cache: the prefix is reserved as input"
    );
    // A completed call at `at` (settled from its usage a second later): its input reserved.
    let completed = |c: &mut Coordinator, at: u64| {
        let lease = sent(c.call_lease(Millis(at), &mut Call::new(), &cached).unwrap());
        let s = c
            .settle(Millis(at + 1_000), lease, &Usage::default())
            .unwrap();
        s.reserved.get(Axis::InputTokens)
    };
    // The next call of the same agent reserves the prefix again: the cache is still cold.
    assert_eq!(completed(&mut c, 5_000), 21_000, "still cold after a 429");
    // A completed call warms it: the next leaves the prefix out.
    assert_eq!(
        completed(&mut c, 7_000),
        1_000,
        "warm after a completed call"
    );
}

#[test]
fn x_should_retry_false_delivers_the_429() {
    let mut c = coord("");
    let mut call = Call::new();
    let lease = sent(
        c.call_lease(Millis(0), &mut call, &ask(1, 1000, 100))
            .unwrap(),
    );
    let r = headers(&[("retry-after", "2"), ("x-should-retry", "false")]);
    let step = c
        .call_response(Millis(10), &mut call, PoolId(0), Some(lease), 429, &r)
        .unwrap()
        .step;
    assert_eq!(step, ResponseStep::Deliver);
}

#[test]
fn a_server_error_is_retried_only_when_the_provider_says_so() {
    let mut c = coord("");
    let mut call = Call::new();
    let lease = sent(
        c.call_lease(Millis(0), &mut call, &ask(1, 1000, 100))
            .unwrap(),
    );
    let step = c
        .call_response(
            Millis(10),
            &mut call,
            PoolId(0),
            Some(lease),
            503,
            &headers(&[]),
        )
        .unwrap()
        .step;
    assert_eq!(step, ResponseStep::Deliver);
    let lease = sent(
        c.call_lease(Millis(20), &mut call, &ask(1, 1000, 100))
            .unwrap(),
    );
    let r = headers(&[("x-should-retry", "true")]);
    let step = c
        .call_response(Millis(30), &mut call, PoolId(0), Some(lease), 529, &r)
        .unwrap()
        .step;
    assert!(
        matches!(
            step,
            ResponseStep::Wait(Wait {
                reason: WaitReason::Overloaded,
                attempt: 1,
                ..
            })
        ),
        "{step:?}"
    );
}

#[test]
fn gives_up_after_max_attempts_with_the_last_retry_after() {
    let mut c = coord(r#","backoff":{"max_attempts":3}"#);
    let mut call = Call::new();
    let mut now = 0;
    let mut steps = Vec::new();
    for i in 0..3 {
        let lease = sent(
            c.call_lease(Millis(now), &mut call, &ask(1, 1000, 100))
                .unwrap(),
        );
        let ra = if i == 0 { "7" } else { "1" };
        let step = c
            .call_response(
                Millis(now),
                &mut call,
                PoolId(0),
                Some(lease),
                429,
                &headers(&[("retry-after", ra)]),
            )
            .unwrap()
            .step;
        if let ResponseStep::Wait(Wait { until, .. }) = step {
            now = until.0;
        }
        steps.push(step);
    }
    assert_eq!(
        steps[2],
        ResponseStep::GiveUp(GiveUp {
            reason: GiveUpReason::Attempts,
            refusal: None,
            attempts: 3,
            last_retry_after_ms: Some(1000),
        })
    );
    assert_eq!(c.metrics(Millis(now)).live_leases, 0);
}

#[test]
fn a_concurrency_429_backs_off_from_one_second_capped_by_retry_after() {
    let mut c = coord("");
    let r = headers(&[("retry-after", "60"), ("rate_limit_type", "concurrent")]);
    assert_eq!(r.exceeded, Some(headers::RateAxis::Concurrent));
    for _ in 0..50 {
        let mut call = Call::new();
        let mut ceiling = 1000;
        for _ in 0..5 {
            let now = c.now();
            let lease = sent(c.call_lease(now, &mut call, &ask(1, 10, 10)).unwrap());
            let step = c
                .call_response(now, &mut call, PoolId(0), Some(lease), 429, &r)
                .unwrap()
                .step;
            let ResponseStep::Wait(Wait { until, .. }) = step else {
                panic!("{step:?}")
            };
            let waited = until.since(now);
            assert!((1..=ceiling).contains(&waited), "{waited} > {ceiling}");
            ceiling = (ceiling * 2).min(30_000);
        }
    }
    // Capped by a short retry-after.
    let short = headers(&[("retry-after", "1"), ("rate_limit_type", "concurrent")]);
    let mut call = Call {
        failed: 4,
        ..Call::new()
    };
    let now = c.now();
    let lease = sent(c.call_lease(now, &mut call, &ask(1, 10, 10)).unwrap());
    let ResponseStep::Wait(Wait { until, .. }) = c
        .call_response(now, &mut call, PoolId(0), Some(lease), 429, &short)
        .unwrap()
        .step
    else {
        panic!("expected a wait")
    };
    assert!(until.since(now) <= 1000);
}

#[test]
fn an_rpm_429_waits_until_the_earlier_of_retry_after_and_reset_at() {
    let mut c = coord(r#","backoff":{"retry_after_jitter_ms":0}"#);
    let mut call = Call::new();
    let lease = sent(c.call_lease(Millis(0), &mut call, &ask(1, 10, 10)).unwrap());
    // reset_at is an instant in Unix seconds: 15 s from the unix clock passed in.
    let r = parse_headers(
        [
            ("retry-after", "60"),
            ("rate_limit_type", "rpm"),
            ("reset_at", "1700000015"),
        ],
        Some(1_700_000_000_000),
    );
    assert_eq!(r.reset_at_ms, Some(15_000), "{r:?}");
    let step = c
        .call_response(Millis(0), &mut call, PoolId(0), Some(lease), 429, &r)
        .unwrap()
        .step;
    assert!(
        matches!(
            step,
            ResponseStep::Wait(Wait {
                until: Millis(15_000),
                ..
            })
        ),
        "{step:?}"
    );
}

#[test]
fn a_refusal_waits_until_retry_at_and_gives_up_after_max_refusals() {
    // A queue of one: the second waiter is refused queue_full with a retry time.
    let mut c = coord(r#","max_queue_depth":1,"call":{"max_refusals":2}"#);
    let mut holder = Call::new();
    let big = ask(1, 80_000, 100);
    sent(c.call_lease(Millis(0), &mut holder, &big).unwrap());
    let step = c
        .call_lease(Millis(0), &mut holder, &ask(2, 80_000, 100))
        .unwrap();
    assert!(
        matches!(
            step,
            LeaseStep::Wait(Wait {
                reason: WaitReason::Queued,
                ticket: Some(_),
                checkpoint: true,
                ..
            })
        ),
        "{step:?}"
    );
    let mut call = Call::new();
    for n in 1..=3 {
        let step = c
            .call_lease(Millis(0), &mut call, &ask(3, 80_000, 100))
            .unwrap();
        if n <= 2 {
            assert!(
                matches!(
                    step,
                    LeaseStep::Wait(Wait {
                        reason: WaitReason::Refused,
                        refusal: Some(RejectReason::QueueFull),
                        ticket: None,
                        ..
                    })
                ),
                "{step:?}"
            );
        } else {
            assert_eq!(
                step,
                LeaseStep::GiveUp(GiveUp {
                    reason: GiveUpReason::Refusals,
                    refusal: Some(RejectReason::QueueFull),
                    attempts: 0,
                    last_retry_after_ms: None
                })
            );
        }
    }
}

#[test]
fn a_request_that_never_fits_gives_up_at_once() {
    let mut c = coord("");
    let mut call = Call::new();
    let step = c
        .call_lease(Millis(0), &mut call, &ask(1, 10_000_000, 100))
        .unwrap();
    assert!(
        matches!(
            step,
            LeaseStep::GiveUp(GiveUp {
                reason: GiveUpReason::NeverFits,
                refusal: Some(RejectReason::ExceedsCapacity { .. }),
                ..
            })
        ),
        "{step:?}"
    );
}

#[test]
fn an_interrupted_call_is_charged_conservatively() {
    let mut c = coord("");
    let mut call = Call::new();
    let req = LeaseRequest {
        cached_prefix_tokens: 500,
        ..ask(1, 1000, 800)
    };
    // Nothing came back: input as reserved, all of max_tokens.
    let lease = sent(c.call_lease(Millis(0), &mut call, &req).unwrap());
    let s = c.call_interrupted(Millis(5), lease, None).unwrap();
    assert_eq!(s.used.get(Axis::InputTokens), 1500);
    assert_eq!(s.used.get(Axis::OutputTokens), 800);
    // A stream broke after 100 output tokens, its input reported: that plus 16.
    let lease = sent(c.call_lease(Millis(5), &mut call, &req).unwrap());
    let seen = Usage {
        input_tokens: 1200,
        output_tokens: 100,
        ..Usage::default()
    };
    let s = c.call_interrupted(Millis(9), lease, Some(&seen)).unwrap();
    assert_eq!(s.used.get(Axis::InputTokens), 1200);
    assert_eq!(s.used.get(Axis::OutputTokens), 116);
    // Ended leases are an error, as for settle.
    assert_eq!(
        c.call_interrupted(Millis(9), lease, None),
        Err(LeaseError::UnknownLease)
    );
}

fn agent_errors(c: &Coordinator, now: u64, agent: u64) -> (u32, u32, bool, u64) {
    let m = c.metrics(Millis(now));
    let a = m
        .agents
        .iter()
        .find(|a| a.agent == AgentId(agent))
        .expect("agent");
    (
        a.input_error_permille,
        a.output_error_permille,
        a.alerting,
        a.settled,
    )
}

#[test]
fn a_429_is_not_an_estimate_miss() {
    // One alerting miss is enough to raise the alert, so a 429 counted as a sample would
    // show at once.
    let mut c = coord(r#","estimate_alert":{"threshold_permille":200,"consecutive":1}"#);
    let mut call = Call::new();
    let lease = sent(
        c.call_lease(Millis(0), &mut call, &ask(1, 1000, 100))
            .unwrap(),
    );
    let r = c
        .call_response(
            Millis(10),
            &mut call,
            PoolId(0),
            Some(lease),
            429,
            &headers(&[("retry-after", "1")]),
        )
        .unwrap();
    assert!(
        r.settled.is_some(),
        "the 429 settles its lease as nothing used"
    );
    let until = match r.step {
        ResponseStep::Wait(Wait { until, .. }) => until,
        other => panic!("expected a wait, got {other:?}"),
    };
    let lease = sent(c.call_lease(until, &mut call, &ask(1, 1000, 100)).unwrap());
    let usage = Usage {
        input_tokens: 1000,
        output_tokens: 100,
        ..Usage::default()
    };
    c.settle(until.plus(10), lease, &usage).unwrap();
    let now = until.plus(20).0;
    // Both leases ended; only the completed call is a sample, and it was exact.
    assert_eq!(agent_errors(&c, now, 1), (0, 0, false, 2));
    while let Some(e) = c.poll_event() {
        assert!(
            !matches!(e, Event::EstimateAlert { .. }),
            "no estimate alert: {e:?}"
        );
    }
}

#[test]
fn an_interrupted_call_is_not_an_estimate_sample() {
    let mut c = coord(r#","estimate_alert":{"threshold_permille":200,"consecutive":1}"#);
    let mut call = Call::new();
    let lease = sent(
        c.call_lease(Millis(0), &mut call, &ask(1, 1000, 100))
            .unwrap(),
    );
    let usage = Usage {
        input_tokens: 1000,
        output_tokens: 50,
        ..Usage::default()
    };
    c.settle(Millis(10), lease, &usage).unwrap();
    let first = agent_errors(&c, 10, 1);
    assert_eq!(first.0, 0);
    // Charged as the whole reservation, or from what a stream showed: neither is what the
    // provider counted, so neither moves the figures.
    let lease = sent(
        c.call_lease(Millis(20), &mut call, &ask(1, 1000, 100))
            .unwrap(),
    );
    c.call_interrupted(Millis(30), lease, None).unwrap();
    let lease = sent(
        c.call_lease(Millis(40), &mut call, &ask(1, 1000, 100))
            .unwrap(),
    );
    let seen = Usage {
        input_tokens: 40,
        output_tokens: 3,
        ..Usage::default()
    };
    c.call_interrupted(Millis(50), lease, Some(&seen)).unwrap();
    assert_eq!(agent_errors(&c, 60, 1), (first.0, first.1, false, 3));
    while let Some(e) = c.poll_event() {
        assert!(
            !matches!(e, Event::EstimateAlert { .. }),
            "no estimate alert: {e:?}"
        );
    }
}

#[test]
fn estimate_error_is_reported_signed_and_absolute_per_axis() {
    let mut c = coord("");
    let mut call = Call::new();
    // Input estimated a third low, output reserved at twice what was produced.
    let lease = sent(
        c.call_lease(Millis(0), &mut call, &ask(1, 1000, 100))
            .unwrap(),
    );
    let usage = Usage {
        input_tokens: 1500,
        output_tokens: 50,
        ..Usage::default()
    };
    c.settle(Millis(10), lease, &usage).unwrap();
    let m = c.metrics(Millis(20));
    let a = &m.agents[0];
    assert_eq!((a.input_error_permille, a.input_bias_permille), (333, -333));
    assert_eq!(
        (a.output_error_permille, a.output_bias_permille),
        (1000, 1000)
    );
}
