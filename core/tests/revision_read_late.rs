//! A host that reads its events late still learns the promise in force: a ticket revised
//! more than once, then granted (or withdrawn) before the host polls, has its one waiting
//! [`Event::Revised`] carry its last promise, the same a host that polls after every input
//! sees last, and the grant is not after it.

use std::collections::BTreeMap;

use tokenwarden_core::{
    AgentId, Config, Coordinator, Decision, Event, LeaseId, LeaseRequest, Millis, PoolId, Usage,
    parse_headers,
};

const CONFIG: &str = r#"{ "pools": [{ "name": "sonnet", "input_tokens_per_minute": 40000,
    "output_tokens_per_minute": 8000, "requests_per_minute": 50, "max_concurrent": 20 }] }"#;

/// Each lease's last revised promise and its grant, read after every input (`eager`) or
/// only at the end of the run.
#[derive(Debug, Default, PartialEq, Eq)]
struct Seen {
    promised: BTreeMap<LeaseId, Millis>,
    granted: BTreeMap<LeaseId, Millis>,
}

fn drain(c: &mut Coordinator, now: Millis, seen: &mut Seen) {
    while let Some(e) = c.poll_event() {
        match e {
            Event::Revised { lease, eta, .. } => {
                assert!(
                    !seen.granted.contains_key(&lease),
                    "a revision after the grant"
                );
                seen.promised.insert(lease, eta);
            }
            Event::Granted { lease, .. } => {
                seen.granted.insert(lease, now);
            }
            _ => {}
        }
    }
}

/// Six agents ask; the provider's headers say less is left than counted (the promises
/// move); the running calls settle; `cancel_second` withdraws the second ticket at 30 s.
fn run(eager: bool, cancel_second: bool) -> Seen {
    let mut c = Coordinator::new(Config::from_json(CONFIG).unwrap(), 42, Millis(0)).unwrap();
    let mut seen = Seen::default();
    let (mut running, mut queued) = (Vec::new(), Vec::new());
    for agent in 1..=6 {
        let ask = LeaseRequest {
            agent: AgentId(agent),
            pool: PoolId(0),
            input_tokens: 15_000,
            max_tokens: 800,
            ..Default::default()
        };
        match c.request_lease(Millis(0), &ask).unwrap() {
            Decision::Grant { lease, .. } => running.push(lease),
            Decision::Queued { lease, eta } => {
                seen.promised.insert(lease, eta);
                queued.push(lease);
            }
            _ => {}
        }
        if eager {
            drain(&mut c, Millis(0), &mut seen);
        }
    }
    assert_eq!((running.len(), queued.len()), (2, 2), "two run, two wait");
    let report = parse_headers(
        [
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "9000"),
        ],
        None,
    );
    c.handle_response(Millis(0), PoolId(0), Some(running[0]), 200, &report)
        .unwrap();
    if eager {
        drain(&mut c, Millis(0), &mut seen);
    }
    for (i, lease) in running.into_iter().enumerate() {
        let usage = Usage {
            input_tokens: 14_000,
            output_tokens: 400,
            ..Default::default()
        };
        let now = Millis(3_000 * (i as u64 + 1));
        c.settle(now, lease, &usage).unwrap();
        if eager {
            drain(&mut c, now, &mut seen);
        }
    }
    if cancel_second {
        c.cancel(Millis(30_000), queued[1]).unwrap();
        if eager {
            drain(&mut c, Millis(30_000), &mut seen);
        }
    }
    while let Some(t) = c.poll_timeout() {
        if t > Millis(300_000) {
            break;
        }
        c.handle_timeout(t);
        drain(&mut c, t, &mut seen);
    }
    seen
}

#[test]
fn a_revision_read_after_the_grant_carries_the_last_promise() {
    for cancel_second in [false, true] {
        let eager = run(true, cancel_second);
        let late = run(false, cancel_second);
        assert_eq!(late, eager, "the same last promises and grants");
        assert!(!eager.granted.is_empty());
        for (lease, at) in &eager.granted {
            assert!(
                *at <= eager.promised[lease],
                "{lease} granted at {at}, after its promise {}",
                eager.promised[lease]
            );
        }
    }
}
