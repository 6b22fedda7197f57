//! The fleet advice reads demand, not what was served (issue 28, item 4): ten agents that
//! each want 40k input tokens a minute on a 100k key are served about 8.5k each (85k at the
//! margin), so advice from served usage says 8 fit at 75 %; from demand (served ÷ the share
//! of time not spent waiting on quota) about 1.9 do.

use tokenwarden_core::*;

#[test]
fn ten_agents_wanting_40k_a_minute_on_a_100k_key_are_advised_about_two() {
    let config = Config::from_json(
        r#"{"pools":[{"name":"p","input_tokens_per_minute":100000,"output_tokens_per_minute":100000,
            "requests_per_minute":10000}],"max_queue_wait_ms":3600000}"#,
    )
    .unwrap();
    let mut c = Coordinator::new(config, 1, Millis(0)).unwrap();
    // Each agent: a 20k-token call taking 1 s, then 29 s of work: 2 calls, 40k, a minute.
    #[derive(Clone, Copy)]
    enum S {
        Idle(u64),
        Queued,
        Calling(LeaseId, u64),
    }
    let mut s = [S::Idle(0); 10];
    let ask = |a: usize| LeaseRequest {
        agent: AgentId(a as u64 + 1),
        input_tokens: 20_000,
        max_tokens: 100,
        ..Default::default()
    };
    let mut owner = std::collections::BTreeMap::new();
    let mut now = 0u64;
    while now < 8 * 60_000 {
        for (a, st) in s.iter_mut().enumerate() {
            match *st {
                S::Idle(at) if at <= now => match c.request_lease(Millis(now), &ask(a)).unwrap() {
                    Decision::Grant { lease, .. } => *st = S::Calling(lease, now + 1_000),
                    Decision::Queued { lease, .. } => {
                        owner.insert(lease, a);
                        *st = S::Queued;
                    }
                    Decision::Reject { retry_at, .. } => *st = S::Idle(retry_at.0),
                    Decision::NeverFits { reason } => panic!("never fits: {reason:?}"),
                },
                S::Calling(lease, until) if until <= now => {
                    let used = Usage {
                        input_tokens: 20_000,
                        output_tokens: 100,
                        ..Default::default()
                    };
                    c.settle(Millis(now), lease, &used).unwrap();
                    *st = S::Idle(now + 29_000);
                }
                _ => {}
            }
        }
        while let Some(e) = c.poll_event() {
            if let Event::Granted { lease, .. } = e {
                s[owner[&lease]] = S::Calling(lease, now + 1_000);
            }
        }
        now += 100;
        c.handle_timeout(Millis(now));
    }
    let m = c.metrics(Millis(now));
    let advice = m.pools[0].fleet.expect("advice after minutes of traffic");
    println!("{advice:?}");
    assert_eq!(advice.axis, Axis::InputTokens);
    assert!(
        (7_000..=10_000).contains(&advice.served_per_agent_per_minute),
        "served about 8.5k each: {advice:?}"
    );
    assert!(
        (30_000..=50_000).contains(&advice.per_agent_per_minute),
        "demand about 40k each: {advice:?}"
    );
    assert!(
        (1..=2).contains(&advice.agents_at_75_percent),
        "about 1.9 fit at 75 %: {advice:?}"
    );
}
