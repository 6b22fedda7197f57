//! One send's machine (`Exchange`): renewal cadence, timeouts, delivery and the lease's
//! end, as the module doc states them.
use proptest::prelude::*;
use tokenwarden_core::{Action, Answer, Exchange, HOLD_BYTES, Millis, Timeout, Timeouts, Usage};

const T: Timeouts = Timeouts {
    first_byte_ms: Some(600_000),
    idle_ms: Some(300_000),
};

#[test]
fn the_default_timeouts_and_their_range() {
    assert_eq!(Timeouts::default(), T);
    assert_eq!(T.check(), Ok(()));
    let zero = Timeouts {
        idle_ms: Some(0),
        ..T
    };
    assert_eq!(zero.check(), Err("idle_ms"));
    let long = Timeouts {
        first_byte_ms: Some(tokenwarden_core::MAX_DURATION_MS + 1),
        ..T
    };
    assert_eq!(long.check(), Err("first_byte_ms"));
    assert_eq!(Timeouts::NONE.check(), Ok(()));
}

fn actions(x: &mut Exchange) -> Vec<Action> {
    core::iter::from_fn(|| x.poll_action()).collect()
}

fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        ..Usage::default()
    }
}

#[test]
fn the_wait_for_the_head_renews_on_a_quarter_tick_once_a_third_has_passed() {
    let mut x = Exchange::sent(Millis(1_000), 120_000, T);
    assert_eq!(x.poll_timeout(), Some(Millis(31_000)));
    x.handle_timeout(Millis(31_000));
    assert_eq!(actions(&mut x), []);
    assert_eq!(x.poll_timeout(), Some(Millis(61_000)));
    x.handle_timeout(Millis(61_000));
    assert_eq!(actions(&mut x), [Action::Renew]);
    // A renewal on its way: the next tick asks none.
    x.handle_timeout(Millis(91_000));
    x.handle_timeout(Millis(121_000));
    assert_eq!(actions(&mut x), []);
    // Answered: 120 s from the answer; the next renewal a third of that later.
    x.renewed(Millis(122_000), 120_000);
    x.handle_timeout(Millis(151_000));
    assert_eq!(actions(&mut x), []);
    x.handle_timeout(Millis(181_000));
    assert_eq!(actions(&mut x), [Action::Renew]);
}

#[test]
fn a_renewal_that_leaves_the_expiry_where_it_was_ends_the_renewals() {
    // A stream under a lease whose life ends at 50 s (`max_lease_life_ms`): the first
    // renewal gives 20 s more, the second only what is left of its life, the third none.
    let mut x = Exchange::sent(Millis(0), 30_000, T);
    x.answered(Millis(0), Answer::Stream, 30_000);
    assert_eq!(actions(&mut x), [Action::Deliver]);
    x.piece(Millis(10_000), 10);
    assert_eq!(actions(&mut x), [Action::Renew]);
    x.renewed(Millis(10_000), 30_000); // expires at 40 s
    x.piece(Millis(20_000), 10);
    assert_eq!(actions(&mut x), [Action::Renew]);
    x.renewed(Millis(20_000), 30_000); // expires at 50 s: its life's end
    x.piece(Millis(30_000), 10);
    assert_eq!(actions(&mut x), [Action::Renew]);
    x.renewed(Millis(30_000), 20_000); // still 50 s
    for at in [40_000, 45_000, 49_000] {
        x.piece(Millis(at), 10);
        assert_eq!(
            actions(&mut x),
            [],
            "no renewal at {at} ms: the expiry cannot move"
        );
    }
    x.end(Millis(49_500), Some(usage(10, 20)));
    assert_eq!(
        actions(&mut x),
        [Action::Settle {
            usage: usage(10, 20),
            learn: true
        }]
    );
}

#[test]
fn a_lease_that_is_gone_stops_renewal_and_another_refusal_is_tried_again() {
    let mut x = Exchange::sent(Millis(0), 30_000, T);
    x.answered(Millis(0), Answer::Stream, 30_000);
    assert_eq!(actions(&mut x), [Action::Deliver]);
    x.piece(Millis(10_000), 10);
    assert_eq!(actions(&mut x), [Action::Renew]);
    x.renew_refused(false);
    x.piece(Millis(15_000), 10);
    assert_eq!(
        actions(&mut x),
        [],
        "a third of the span after the last try"
    );
    x.piece(Millis(20_000), 10);
    assert_eq!(actions(&mut x), [Action::Renew]);
    x.renew_refused(true);
    x.piece(Millis(90_000), 10);
    assert_eq!(actions(&mut x), []);
}

#[test]
fn no_lease_span_known_means_no_tick_and_no_renewal() {
    let mut x = Exchange::sent(Millis(0), 0, Timeouts::NONE);
    assert_eq!(x.poll_timeout(), None);
    x.answered(Millis(5), Answer::Stream, 0);
    x.piece(Millis(1_000_000), 1);
    assert_eq!(actions(&mut x), [Action::Deliver]);
}

#[test]
fn no_head_in_time_aborts_and_ends_the_lease_with_nothing_seen() {
    let mut x = Exchange::sent(Millis(0), 0, T);
    assert_eq!(x.poll_timeout(), Some(Millis(600_000)));
    x.handle_timeout(Millis(599_999));
    assert_eq!(actions(&mut x), []);
    x.handle_timeout(Millis(600_000));
    assert_eq!(
        actions(&mut x),
        [
            Action::TimedOut {
                timeout: Timeout::FirstByte,
                ms: 600_000
            },
            Action::Interrupted { seen: false }
        ]
    );
    assert!(x.is_ended());
    assert_eq!(x.poll_timeout(), None);
    // A head that still comes is not the lease's business any more.
    x.answered(Millis(600_001), Answer::Json, 1);
    assert_eq!(actions(&mut x), []);
}

#[test]
fn the_idle_timeout_runs_only_while_the_caller_waits_for_a_piece() {
    let mut x = Exchange::sent(Millis(0), 0, T);
    x.answered(Millis(10), Answer::Stream, 0);
    assert_eq!(actions(&mut x), [Action::Deliver]);
    assert_eq!(x.poll_timeout(), None, "not read yet: no idle timer");
    x.reading(Millis(100));
    assert_eq!(x.poll_timeout(), Some(Millis(300_100)));
    x.piece(Millis(200), 5);
    assert_eq!(x.poll_timeout(), None);
    x.reading(Millis(1_000_000));
    x.handle_timeout(Millis(1_300_000));
    assert_eq!(
        actions(&mut x),
        [
            Action::TimedOut {
                timeout: Timeout::Idle,
                ms: 300_000
            },
            Action::Interrupted { seen: true }
        ]
    );
    x.broken();
    x.end(Millis(1_300_001), Some(usage(1, 1)));
    assert_eq!(actions(&mut x), [], "the end is decided once");
}

#[test]
fn a_json_answer_is_held_until_it_ends_or_passes_the_hold() {
    let mut x = Exchange::sent(Millis(0), 0, T);
    x.answered(Millis(1), Answer::Json, 0);
    x.piece(Millis(2), 1000);
    assert_eq!(actions(&mut x), []);
    x.end(Millis(3), Some(usage(5, 7)));
    assert_eq!(
        actions(&mut x),
        [
            Action::Settle {
                usage: usage(5, 7),
                learn: true
            },
            Action::Deliver
        ]
    );

    let mut big = Exchange::sent(Millis(0), 0, T);
    big.answered(Millis(1), Answer::Json, 0);
    big.piece(Millis(2), HOLD_BYTES - 1);
    assert_eq!(actions(&mut big), []);
    big.piece(Millis(3), 1);
    assert_eq!(actions(&mut big), [Action::Deliver]);
    big.end(Millis(4), None);
    assert_eq!(actions(&mut big), [Action::Interrupted { seen: true }]);
}

#[test]
fn a_clamped_usage_settles_but_is_not_learned_from() {
    let mut x = Exchange::sent(Millis(0), 0, T);
    x.answered(Millis(1), Answer::Stream, 0);
    let absurd = usage((1 << 53) - 1, 3);
    x.end(Millis(2), Some(absurd));
    assert_eq!(
        actions(&mut x),
        [
            Action::Deliver,
            Action::Settle {
                usage: absurd,
                learn: false
            }
        ]
    );
}

#[test]
fn answers_the_core_settled_or_without_a_body() {
    let mut x = Exchange::sent(Millis(0), 60_000, T);
    x.answered(Millis(1), Answer::Settled, 60_000);
    assert_eq!(actions(&mut x), [Action::Deliver]);
    assert!(x.is_ended());
    assert_eq!(x.poll_timeout(), None);

    let mut e = Exchange::sent(Millis(0), 60_000, T);
    e.answered(Millis(1), Answer::Empty, 60_000);
    assert_eq!(
        actions(&mut e),
        [Action::Interrupted { seen: false }, Action::Deliver]
    );
}

#[test]
fn refused_ends_fall_back_to_the_conservative_one_and_stop() {
    let mut x = Exchange::sent(Millis(0), 0, T);
    x.answered(Millis(1), Answer::Stream, 0);
    x.end(Millis(2), Some(usage(1, 2)));
    let _ = actions(&mut x);
    x.settle_refused(true);
    assert_eq!(actions(&mut x), [], "gone: nothing to charge");
    x.settle_refused(false);
    assert_eq!(actions(&mut x), [Action::Interrupted { seen: true }]);
    x.interrupted_refused(false);
    assert_eq!(actions(&mut x), [Action::Interrupted { seen: false }]);
    x.interrupted_refused(false);
    assert_eq!(actions(&mut x), [], "nothing seen is the last resort");

    let mut y = Exchange::sent(Millis(0), 0, T);
    y.failed();
    assert_eq!(actions(&mut y), [Action::Interrupted { seen: false }]);
    y.interrupted_refused(false);
    assert_eq!(actions(&mut y), []);
}

#[test]
fn a_stream_longer_than_the_lease_is_renewed_through() {
    // A 10-minute stream on a 60 s lease, a piece a second, each renewal answered at once.
    let mut x = Exchange::sent(Millis(0), 60_000, T);
    x.answered(Millis(500), Answer::Stream, 59_500);
    let mut renewals = 0;
    let mut expires = 60_000u64;
    for s in 1..=600u64 {
        let now = Millis(s * 1000);
        assert!(now.as_u64() < expires, "the lease lapsed at {now}");
        x.reading(now);
        x.piece(now, 100);
        while let Some(a) = x.poll_action() {
            if a == Action::Renew {
                renewals += 1;
                expires = now.as_u64() + 60_000;
                x.renewed(now, 60_000);
            }
        }
    }
    // A third of the 59.5 s left at the head: at 21 s, then every 20 s to 581 s.
    assert_eq!(renewals, 29);
}

#[derive(Clone, Debug)]
enum Ev {
    Tick(u64),
    Answered(u8),
    Reading(u64),
    Piece(u64, u64),
    End(bool),
    Broken,
    Failed,
    Renewed(u64),
    RenewRefused(bool),
    SettleRefused(bool),
    InterruptedRefused(bool),
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (0u64..200_000).prop_map(Ev::Tick),
        (0u8..4).prop_map(Ev::Answered),
        (0u64..50_000).prop_map(Ev::Reading),
        (0u64..50_000, 0u64..2_000_000).prop_map(|(d, n)| Ev::Piece(d, n)),
        any::<bool>().prop_map(Ev::End),
        Just(Ev::Broken),
        Just(Ev::Failed),
        (0u64..200_000).prop_map(Ev::Renewed),
        any::<bool>().prop_map(Ev::RenewRefused),
        any::<bool>().prop_map(Ev::SettleRefused),
        any::<bool>().prop_map(Ev::InterruptedRefused),
    ]
}

proptest! {
    /// Whatever happens, in any order: the answer is handed over at most once, the lease's
    /// end is asked once (a settle or an interrupted), and again only as the fallback of a
    /// refusal that was not "gone"; nothing is renewed while a renewal is on its way, and
    /// nothing is timed after the end.
    #[test]
    fn one_end_one_delivery_whatever_the_order(
        left in 0u64..200_000,
        events in proptest::collection::vec(ev(), 0..60),
    ) {
        let mut x = Exchange::sent(Millis(0), left, T);
        let mut now = 0u64;
        let (mut delivered, mut renewing) = (0, false);
        // The ends asked, by rank (a settle 2, interrupted with what was seen 1, without 0),
        // and whether the event before each was a refusal that was not "gone".
        let mut ends: Vec<(u8, bool)> = Vec::new();
        for e in events {
            let mut refused = false;
            match e {
                Ev::Tick(d) => {
                    now += d;
                    x.handle_timeout(Millis(now));
                }
                Ev::Answered(k) => {
                    let a = [Answer::Settled, Answer::Empty, Answer::Json, Answer::Stream][k as usize];
                    x.answered(Millis(now), a, left);
                }
                Ev::Reading(d) => {
                    now += d;
                    x.reading(Millis(now));
                }
                Ev::Piece(d, n) => {
                    now += d;
                    x.piece(Millis(now), n);
                }
                Ev::End(with) => x.end(Millis(now), with.then(|| usage(1, 1))),
                Ev::Broken => x.broken(),
                Ev::Failed => x.failed(),
                Ev::Renewed(l) => {
                    renewing = false;
                    x.renewed(Millis(now), l);
                }
                Ev::RenewRefused(g) => {
                    renewing = false;
                    x.renew_refused(g);
                }
                Ev::SettleRefused(g) => {
                    refused = !g;
                    x.settle_refused(g);
                }
                Ev::InterruptedRefused(g) => {
                    refused = !g;
                    x.interrupted_refused(g);
                }
            }
            while let Some(a) = x.poll_action() {
                match a {
                    Action::Deliver => delivered += 1,
                    Action::Settle { .. } => ends.push((2, refused)),
                    Action::Interrupted { seen } => ends.push((u8::from(seen), refused)),
                    Action::Renew => {
                        prop_assert!(!renewing, "a renewal while one is on its way");
                        renewing = true;
                    }
                    Action::TimedOut { .. } => {}
                }
            }
            if x.is_ended() {
                prop_assert_eq!(x.poll_timeout(), None);
            }
        }
        prop_assert!(delivered <= 1);
        // The first end, then only fallbacks, each more conservative, each after a refusal.
        for (i, w) in ends.windows(2).enumerate() {
            prop_assert!(w[1].0 < w[0].0 && w[1].1, "end {} of {:?}", i + 1, ends);
        }
        prop_assert!(ends.first().is_none_or(|e| !e.1));
    }
}

/// The reference host loop drives the same machine: a call longer than its lease is renewed
/// through and settled, not reaped; a call past the first-byte timeout fails with its lease
/// ended as interrupted.
mod host_loop {
    use tokenwarden_core::{
        AgentId, Config, Coordinator, Event, LeaseId, LeaseRequest, Millis, Settlement, Usage,
    };
    use tokenwarden_host_loop::{CallSpec, Ended, Host, Reply, Sent, World};

    struct Slow {
        duration_ms: u64,
        ended: Vec<Ended>,
        settled: Vec<Settlement>,
        expired: usize,
    }

    impl World for Slow {
        fn send(&mut self, _: u64, _: u64, _: &CallSpec, _: LeaseId) -> Sent {
            Sent::Reply(Reply {
                status: 200,
                headers: Vec::new(),
                duration_ms: self.duration_ms,
                usage: Usage {
                    input_tokens: 100,
                    output_tokens: 10,
                    ..Usage::default()
                },
                settle_after_ms: 0,
            })
        }
        fn settled(&mut self, _: u64, _: u64, _: LeaseId, s: &Settlement) {
            self.settled.push(*s);
        }
        fn event(&mut self, _: u64, e: &Event) {
            if let Event::Expired { .. } = e {
                self.expired += 1;
            }
        }
        fn ended(&mut self, _: u64, _: u64, _: &CallSpec, how: Ended) -> Vec<(u64, CallSpec)> {
            self.ended.push(how);
            Vec::new()
        }
    }

    fn run(duration_ms: u64) -> Slow {
        let config = Config::from_json(
            r#"{"pools":[{"name":"p","input_tokens_per_minute":100000,"max_concurrent":4}],
                "lease_ttl_ms":60000}"#,
        )
        .unwrap();
        let coord = Coordinator::new(config, 1, Millis(0)).unwrap();
        let call = CallSpec {
            request: LeaseRequest {
                agent: AgentId(1),
                input_tokens: 100,
                max_tokens: 50,
                ..Default::default()
            },
            tag: 0,
        };
        let mut world = Slow {
            duration_ms,
            ended: Vec::new(),
            settled: Vec::new(),
            expired: 0,
        };
        let mut host = Host::new(coord, vec![(0, call)]);
        host.run(&mut world, 3_600_000);
        assert!(host.coord.check().is_ok());
        world
    }

    #[test]
    fn a_call_longer_than_its_lease_is_renewed_through_and_settled() {
        let w = run(200_000);
        assert_eq!(w.ended, [Ended::Delivered]);
        assert_eq!(w.expired, 0, "reaped while the provider worked on it");
        assert_eq!(w.settled.len(), 1);
    }

    #[test]
    fn a_call_past_the_first_byte_timeout_fails_and_its_lease_ends_interrupted() {
        let w = run(700_000);
        assert_eq!(w.ended, [Ended::TimedOut]);
        assert_eq!(w.expired, 0, "renewed until the timeout, then ended");
        assert!(w.settled.is_empty(), "no usage to settle with");
    }
}
