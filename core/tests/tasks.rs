//! Tasks: weights from the task, failure decay, per-task figures and the metrics built
//! from them; and the margin-at-floor alert.

use tokenwarden_core::*;

fn coord(pool: &str, extra: &str) -> Coordinator {
    let json = format!(r#"{{"pools":[{{"name":"p",{pool}}}]{extra}}}"#);
    Coordinator::new(Config::from_json(&json).unwrap(), 7, Millis(0)).unwrap()
}

fn ask(agent: u64, input: u64, task: Option<u64>) -> LeaseRequest {
    LeaseRequest {
        agent: AgentId(agent),
        input_tokens: input,
        max_tokens: 100,
        task: task.map(TaskId),
        ..Default::default()
    }
}

fn granted(d: Decision) -> LeaseId {
    match d {
        Decision::Grant { lease, .. } => lease,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn queued(d: Decision) -> LeaseId {
    match d {
        Decision::Queued { lease, .. } => lease,
        other => panic!("expected a queued ticket, got {other:?}"),
    }
}

fn used(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        ..Default::default()
    }
}

/// The grant order of two queued tickets, one per task, once capacity frees.
fn order_after(c: &mut Coordinator, a: LeaseId, b: LeaseId, until: u64) -> Vec<LeaseId> {
    let mut order = Vec::new();
    let mut t = c.now().0;
    while order.len() < 2 && t <= until {
        t += 100;
        c.handle_timeout(Millis(t));
        while let Some(e) = c.poll_event() {
            if let Event::Granted { lease, .. } = e {
                if lease == a || lease == b {
                    order.push(lease);
                    c.settle(Millis(t), lease, &used(1000, 100)).unwrap();
                }
            }
        }
    }
    order
}

#[test]
fn a_task_charges_tokens_and_reports_them_when_it_ends() {
    let mut c = coord(
        r#""input_tokens_per_minute":100000,"output_tokens_per_minute":20000"#,
        "",
    );
    c.open_task(
        Millis(0),
        &TaskSpec {
            task: TaskId(9),
            role: Role::Worker,
            unblocks: 2,
        },
    )
    .unwrap();
    let l = granted(c.request_lease(Millis(10), &ask(1, 1000, Some(9))).unwrap());
    c.settle(Millis(500), l, &used(900, 50)).unwrap();
    let l = granted(
        c.request_lease(Millis(600), &ask(1, 1000, Some(9)))
            .unwrap(),
    );
    c.settle(Millis(900), l, &used(800, 40)).unwrap();
    let s = c
        .end_task(Millis(1000), TaskId(9), TaskOutcome::Merged)
        .unwrap();
    assert_eq!(s.tokens, 900 + 50 + 800 + 40);
    assert_eq!(s.calls, 2);
    assert_eq!(s.wall_ms, 1000);
    assert_eq!(s.quota_wait_ms, 0);
    // Ended: gone from the table, in the totals.
    assert_eq!(
        c.end_task(Millis(1001), TaskId(9), TaskOutcome::Merged),
        Err(LeaseError::UnknownTask)
    );
    let m = c.metrics(Millis(1001)).tasks;
    assert_eq!(m.open, 0);
    assert_eq!(m.since_start.merged, 1);
    assert_eq!(m.since_start.tokens_per_merged_task, Some(1790));
    assert_eq!(m.since_start.calls, 2);
    assert_eq!(m.since_start.rate_limited_permille, Some(0));
    let p50 = m.since_start.task_time_p50_ms.unwrap();
    assert!((1000..=1127).contains(&p50), "p50 {p50}");
    c.check().unwrap();
}

#[test]
fn a_task_is_charged_every_token_the_provider_counted_with_the_limited_part_beside_it() {
    let mut c = coord(
        r#""input_tokens_per_minute":100000,"output_tokens_per_minute":20000"#,
        "",
    );
    let l = granted(c.request_lease(Millis(0), &ask(1, 1000, Some(3))).unwrap());
    let usage = Usage {
        input_tokens: 200,
        cache_creation_input_tokens: 300,
        cache_read_input_tokens: 40_000,
        output_tokens: 100,
    };
    c.settle(Millis(100), l, &usage).unwrap();
    let s = c
        .end_task(Millis(200), TaskId(3), TaskOutcome::Merged)
        .unwrap();
    // Cache reads are tokens the provider counted (and billed) though they do not count
    // against its input limit: they are in the total, not in the limited part.
    assert_eq!((s.tokens, s.rate_limited_tokens), (40_600, 600));
    let m = c.metrics(Millis(200)).tasks.since_start;
    assert_eq!(m.tokens_per_merged_task, Some(40_600));
    assert_eq!(m.rate_limited_tokens_per_merged_task, Some(600));
}

#[test]
fn a_lease_that_settles_after_its_task_ended_is_not_lost() {
    // The simulator's `noisy` agents end a task when the answer is in and settle 50 ms
    // later: the settle used to be charged to no task, and tokens per merged task read 0.
    let mut c = coord(
        r#""input_tokens_per_minute":100000,"output_tokens_per_minute":20000"#,
        "",
    );
    let l = granted(c.request_lease(Millis(0), &ask(1, 1000, Some(4))).unwrap());
    let s = c
        .end_task(Millis(900), TaskId(4), TaskOutcome::Merged)
        .unwrap();
    assert_eq!(s.tokens, 0, "nothing settled yet when it ended");
    c.settle(Millis(950), l, &used(900, 50)).unwrap();
    let m = c.metrics(Millis(950)).tasks;
    assert_eq!(m.since_start.tokens, 950);
    assert_eq!(m.since_start.tokens_per_merged_task, Some(950));
    // A new task under the same id does not inherit the old one's lease, and the lease
    // table and the task table still agree.
    let again = granted(
        c.request_lease(Millis(1_000), &ask(1, 1000, Some(4)))
            .unwrap(),
    );
    c.check().unwrap();
    c.settle(Millis(1_100), again, &used(10, 10)).unwrap();
    c.check().unwrap();
}

#[test]
fn critical_path_wait_is_the_time_its_calls_were_out_times_what_it_unblocks() {
    // Seed 003: "the time blocked agents spent waiting on an upstream agent's model call".
    // A task unblocking 2 asks at 1 s, waits in line, is sent when granted, and settles 4 s
    // after the grant: the two agents waiting on it were held up from the ask to the
    // settle, the call's own latency included, not only for its queue wait.
    let mut c = coord(r#""input_tokens_per_minute":60000"#, "");
    c.open_task(
        Millis(0),
        &TaskSpec {
            task: TaskId(1),
            role: Role::Worker,
            unblocks: 2,
        },
    )
    .unwrap();
    let first = granted(c.request_lease(Millis(0), &ask(9, 50_000, None)).unwrap());
    let t = queued(
        c.request_lease(Millis(1_000), &ask(1, 20_000, Some(1)))
            .unwrap(),
    );
    c.settle(Millis(1_000), first, &used(50_000, 10)).unwrap();
    let mut at = 1_000;
    let granted_at = loop {
        at += 100;
        c.handle_timeout(Millis(at));
        if let Some(Event::Granted { lease, .. }) = c.poll_event() {
            assert_eq!(lease, t);
            break at;
        }
        assert!(at < 120_000, "never granted");
    };
    c.settle(Millis(granted_at + 4_000), t, &used(20_000, 10))
        .unwrap();
    // Nothing outstanding between the settle and the end: that time is not counted.
    let s = c
        .end_task(Millis(granted_at + 9_000), TaskId(1), TaskOutcome::Merged)
        .unwrap();
    assert_eq!(s.quota_wait_ms, granted_at - 1_000);
    assert_eq!(s.critical_path_wait_ms, (granted_at + 4_000 - 1_000) * 2);
    // A refusal's wait until the next ask is outstanding too, counted once with a call
    // alive at the same time.
    let mut c = coord(
        r#""input_tokens_per_minute":60000"#,
        r#","max_queue_wait_ms":1000"#,
    );
    c.open_task(
        Millis(0),
        &TaskSpec {
            task: TaskId(2),
            role: Role::Worker,
            unblocks: 3,
        },
    )
    .unwrap();
    let a = granted(
        c.request_lease(Millis(0), &ask(1, 50_000, Some(2)))
            .unwrap(),
    );
    assert!(matches!(
        c.request_lease(Millis(500), &ask(2, 50_000, Some(2)))
            .unwrap(),
        Decision::Reject { .. }
    ));
    c.settle(Millis(2_000), a, &used(50_000, 10)).unwrap();
    // The refused call asks again at 3 s (back at its place: queued whatever its wait) and
    // the task ends at 5 s with it still in line: outstanding from 0 to 5 s.
    assert!(matches!(
        c.request_lease(Millis(3_000), &ask(2, 50_000, Some(2)))
            .unwrap(),
        Decision::Queued { .. }
    ));
    let s = c
        .end_task(Millis(5_000), TaskId(2), TaskOutcome::Failed)
        .unwrap();
    assert_eq!(s.critical_path_wait_ms, 5_000 * 3);
    c.check().unwrap();
}

#[test]
fn a_request_for_an_unknown_task_opens_it_with_the_request_s_role() {
    let mut c = coord(r#""input_tokens_per_minute":100000"#, "");
    let mut req = ask(1, 1000, Some(5));
    req.role = Role::Planner;
    req.unblocks = 4;
    let l = granted(c.request_lease(Millis(0), &req).unwrap());
    c.settle(Millis(10), l, &used(100, 10)).unwrap();
    assert_eq!(c.metrics(Millis(10)).tasks.open, 1);
    let s = c
        .end_task(Millis(20), TaskId(5), TaskOutcome::Abandoned)
        .unwrap();
    assert_eq!((s.tokens, s.outcome), (110, TaskOutcome::Abandoned));
    let m = c.metrics(Millis(20)).tasks.since_start;
    // Tokens per merged task counts abandoned work, but there is no merged task yet.
    assert_eq!(
        (m.abandoned, m.tokens, m.tokens_per_merged_task),
        (1, 110, None)
    );
}

#[test]
fn queue_wait_is_charged_to_the_task_and_weighted_by_what_it_unblocks() {
    // Room for one 10,100-token call per 6 s: the second call waits about that long.
    let mut c = coord(r#""input_tokens_per_minute":100000"#, "");
    c.open_task(
        Millis(0),
        &TaskSpec {
            task: TaskId(1),
            role: Role::Worker,
            unblocks: 3,
        },
    )
    .unwrap();
    let first = granted(c.request_lease(Millis(0), &ask(1, 80_000, None)).unwrap());
    let t = queued(
        c.request_lease(Millis(0), &ask(2, 30_000, Some(1)))
            .unwrap(),
    );
    c.settle(Millis(100), first, &used(80_000, 100)).unwrap();
    let mut at = 100;
    let waited = loop {
        at += 100;
        c.handle_timeout(Millis(at));
        if let Some(Event::Granted {
            lease, waited_ms, ..
        }) = c.poll_event()
        {
            assert_eq!(lease, t);
            break waited_ms;
        }
        assert!(at < 120_000, "never granted");
    };
    assert!(waited > 10_000, "waited {waited} ms");
    c.settle(Millis(at), t, &used(30_000, 10)).unwrap();
    let s = c
        .end_task(Millis(at), TaskId(1), TaskOutcome::Merged)
        .unwrap();
    assert_eq!(s.quota_wait_ms, waited);
    assert_eq!(s.critical_path_wait_ms, waited * 3);
    let m = c.metrics(Millis(at)).tasks.since_start;
    assert_eq!(m.critical_path_wait_ms, waited * 3);
}

#[test]
fn a_refusal_starts_the_task_s_wait_and_the_next_ask_ends_it() {
    let mut c = coord(
        r#""input_tokens_per_minute":100000"#,
        r#","max_queue_wait_ms":1000"#,
    );
    granted(c.request_lease(Millis(0), &ask(1, 80_000, None)).unwrap());
    let d = c
        .request_lease(Millis(0), &ask(2, 50_000, Some(4)))
        .unwrap();
    let Decision::Reject { retry_at, .. } = d else {
        panic!("expected a refusal, got {d:?}");
    };
    // Back at retry_at: kept place, queued or granted; the refused span is quota wait.
    let _ = c.request_lease(retry_at, &ask(2, 50_000, Some(4))).unwrap();
    let s = c
        .end_task(retry_at, TaskId(4), TaskOutcome::Failed)
        .unwrap();
    assert_eq!(s.quota_wait_ms, retry_at.0);
    assert_eq!(c.metrics(retry_at).tasks.since_start.failed, 1);
}

#[test]
fn repeated_identical_failures_halve_the_task_s_weight() {
    // Two tasks queue behind a big grant; the one that failed the same way twice (weight
    // halved) is served after the other although it asked first.
    let run = |fail_twice: bool| {
        let mut c = coord(r#""input_tokens_per_minute":20000"#, "");
        for task in [1, 2] {
            c.open_task(
                Millis(0),
                &TaskSpec {
                    task: TaskId(task),
                    role: Role::Worker,
                    unblocks: 0,
                },
            )
            .unwrap();
        }
        c.task_failed(Millis(0), TaskId(1), 77).unwrap();
        let repeats = c
            .task_failed(Millis(0), TaskId(1), if fail_twice { 77 } else { 78 })
            .unwrap();
        assert_eq!(repeats, u32::from(fail_twice));
        let big = granted(c.request_lease(Millis(0), &ask(9, 16_000, None)).unwrap());
        let a = queued(c.request_lease(Millis(1), &ask(1, 4000, Some(1))).unwrap());
        let b = queued(c.request_lease(Millis(2), &ask(2, 4000, Some(2))).unwrap());
        c.settle(Millis(10), big, &used(16_000, 100)).unwrap();
        // The two tickets' own agents' next asks come after: only a and b compete.
        let order = order_after(&mut c, a, b, 120_000);
        (order, a, b)
    };
    let (order, a, b) = run(false);
    assert_eq!(
        order,
        vec![a, b],
        "different failures: first come, first served"
    );
    let (order, a, b) = run(true);
    assert_eq!(
        order,
        vec![b, a],
        "the same failure twice: half the weight, served later"
    );
}

#[test]
fn the_task_table_is_bounded_and_an_overflowing_request_runs_untracked() {
    let mut c = coord(r#""input_tokens_per_minute":100000"#, r#","max_tasks":2"#);
    for task in [1, 2] {
        c.open_task(
            Millis(0),
            &TaskSpec {
                task: TaskId(task),
                ..Default::default()
            },
        )
        .unwrap();
    }
    let third = TaskSpec {
        task: TaskId(3),
        ..Default::default()
    };
    let before = c.snapshot_json();
    assert_eq!(
        c.open_task(Millis(0), &third),
        Err(LeaseError::TooManyTasks)
    );
    assert_eq!(c.snapshot_json(), before, "a refused open changes nothing");
    assert_eq!(
        c.task_failed(Millis(0), TaskId(3), 1),
        Err(LeaseError::UnknownTask)
    );
    // Updating an open task is not opening one.
    c.open_task(
        Millis(0),
        &TaskSpec {
            task: TaskId(2),
            role: Role::Planner,
            unblocks: 1,
        },
    )
    .unwrap();
    let l = granted(c.request_lease(Millis(0), &ask(1, 100, Some(3))).unwrap());
    c.settle(Millis(1), l, &used(100, 1)).unwrap();
    let m = c.metrics(Millis(1)).tasks;
    assert_eq!((m.open, m.untracked), (2, 1));
    // A snapshot keeps the tasks.
    let r = Coordinator::restore_json(&c.snapshot_json()).unwrap();
    assert_eq!(r.metrics(Millis(1)).tasks, m);
}

#[test]
fn the_last_minute_s_figures_count_the_tasks_that_ended_in_it() {
    let mut c = coord(r#""input_tokens_per_minute":100000"#, "");
    for (task, at) in [(1u64, 10_000u64), (2, 70_000), (3, 80_000)] {
        let l = granted(
            c.request_lease(Millis(at - 5000), &ask(task, 100, Some(task)))
                .unwrap(),
        );
        c.settle(Millis(at - 4000), l, &used(100, 0)).unwrap();
        c.end_task(Millis(at), TaskId(task), TaskOutcome::Merged)
            .unwrap();
    }
    let m = c.metrics(Millis(125_000)).tasks;
    assert_eq!(m.minute, 1);
    assert_eq!(m.last_minute.merged, 2);
    assert_eq!(m.last_minute.task_time_mean_ms, Some(5000));
    assert_eq!(m.since_start.merged, 3);
}

#[test]
fn a_margin_at_its_floor_for_the_configured_time_raises_one_alert() {
    let mut c = coord(
        r#""input_tokens_per_minute":100000"#,
        r#","margin":{"floor_alert_ms":120000,"clean_interval_ms":600000}"#,
    );
    // 429s against granted leases cut the margin from 850 to its floor of 600.
    let mut t = 0;
    for _ in 0..6 {
        let l = granted(c.request_lease(Millis(t), &ask(1, 1000, None)).unwrap());
        c.handle_response(
            Millis(t),
            PoolId(0),
            Some(l),
            429,
            &parse_headers([("retry-after", "1")], None),
        )
        .unwrap();
        c.settle(Millis(t), l, &Usage::default()).unwrap();
        t += 2000;
    }
    let m = c.metrics(Millis(t));
    assert!(
        m.pools[0].margin_permille <= 650,
        "{}",
        m.pools[0].margin_permille
    );
    let due = c.poll_timeout().unwrap();
    let mut alerts = Vec::new();
    for at in (t..t + 300_000).step_by(1000) {
        c.handle_timeout(Millis(at));
        while let Some(e) = c.poll_event() {
            if let Event::MarginAtFloor { since, .. } = e {
                alerts.push((at, since));
            }
        }
    }
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    let (at, since) = alerts[0];
    assert!(
        at >= since.0 + 120_000 && at < since.0 + 121_000,
        "{at} vs {since:?}"
    );
    assert!(due.0 <= since.0 + 120_000);
}

#[test]
fn no_alert_when_the_margin_recovers_or_the_alert_is_off() {
    // Off; and on (5 min, the default) while the margin climbs back one point per clean
    // minute: it stays within 5 points of the floor for 5 minutes, but it is recovering.
    for extra in [r#","margin":{"floor_alert_ms":0}"#, ""] {
        no_alert(extra);
    }
}

fn no_alert(extra: &str) {
    let mut c = coord(r#""input_tokens_per_minute":100000"#, extra);
    for t in [0u64, 2000, 4000, 6000, 8000, 10_000] {
        let l = granted(c.request_lease(Millis(t), &ask(1, 1000, None)).unwrap());
        c.handle_response(Millis(t), PoolId(0), Some(l), 429, &HeaderReport::default())
            .unwrap();
        c.settle(Millis(t), l, &Usage::default()).unwrap();
    }
    for at in (10_000..2_000_000).step_by(5000) {
        c.handle_timeout(Millis(at));
        while let Some(e) = c.poll_event() {
            assert!(!matches!(e, Event::MarginAtFloor { .. }), "{e:?}");
        }
    }
}

fn spec(task: u64) -> TaskSpec {
    TaskSpec {
        task: TaskId(task),
        ..Default::default()
    }
}

#[test]
fn requests_naming_unknown_tasks_leave_the_operator_a_quarter_of_the_table() {
    // Issue 25: 4,200 proxied calls naming `/task/junk-N` filled all 4,096 slots and the
    // operator's own open_task was refused. Callers now fill at most three quarters.
    let mut c = coord(r#""requests_per_minute":1000"#, r#","max_tasks":8"#);
    for n in 0..10 {
        let l = granted(
            c.request_lease(Millis(n), &ask(n, 1, Some(100 + n)))
                .unwrap(),
        );
        c.settle(Millis(n), l, &used(1, 1)).unwrap();
    }
    let m = c.metrics(Millis(10)).tasks;
    assert_eq!(
        (m.open, m.untracked),
        (6, 4),
        "six opened by requests, four untracked"
    );
    // The operator still opens two (8 in all), and only then is refused.
    c.open_task(Millis(10), &spec(1)).unwrap();
    c.open_task(Millis(10), &spec(2)).unwrap();
    assert_eq!(
        c.open_task(Millis(10), &spec(3)),
        Err(LeaseError::TooManyTasks)
    );
    // A request naming an open task is still charged to it.
    let l = granted(c.request_lease(Millis(11), &ask(1, 1, Some(1))).unwrap());
    c.settle(Millis(11), l, &used(1, 1)).unwrap();
    assert_eq!(c.metrics(Millis(11)).tasks.untracked, 4);
    c.check().unwrap();
}

#[test]
fn idle_tasks_are_ended_as_abandoned_when_room_is_needed() {
    let mut c = coord(
        r#""requests_per_minute":1000"#,
        r#","max_tasks":4,"task_idle_ms":1000"#,
    );
    for t in 1..=4 {
        c.open_task(Millis(0), &spec(t)).unwrap();
    }
    // Activity: a failure of task 1, a lease asked for task 4.
    c.task_failed(Millis(500), TaskId(1), 9).unwrap();
    let l = granted(c.request_lease(Millis(600), &ask(1, 1, Some(4))).unwrap());
    c.settle(Millis(600), l, &used(1, 1)).unwrap();
    // Nobody idle for 1 s yet: refused, and nothing changes.
    let before = c.snapshot_json();
    assert_eq!(
        c.open_task(Millis(999), &spec(5)),
        Err(LeaseError::TooManyTasks)
    );
    assert_eq!(c.snapshot_json(), before);
    // At 1 s tasks 2 and 3 have been idle since 0: the lower id goes first.
    c.open_task(Millis(1_000), &spec(5)).unwrap();
    assert_eq!(
        c.task_failed(Millis(1_000), TaskId(2), 1),
        Err(LeaseError::UnknownTask)
    );
    let m = c.metrics(Millis(1_000)).tasks;
    assert_eq!((m.open, m.since_start.abandoned), (4, 1));
    // Then task 3 (idle since 0) before task 1 (active at 500) and 4 (600).
    c.open_task(Millis(1_400), &spec(6)).unwrap();
    assert_eq!(
        c.task_failed(Millis(1_400), TaskId(3), 1),
        Err(LeaseError::UnknownTask)
    );
    assert_eq!(c.task_failed(Millis(1_400), TaskId(1), 9), Ok(1));
    // Task 4 was last active at 600: idle enough at 1600 for a request naming a new task
    // (the implicit share, 3 of 4, is full), which then is tracked.
    let l = granted(c.request_lease(Millis(1_600), &ask(2, 1, Some(7))).unwrap());
    c.settle(Millis(1_600), l, &used(1, 1)).unwrap();
    assert_eq!(
        c.end_task(Millis(1_600), TaskId(4), TaskOutcome::Merged),
        Err(LeaseError::UnknownTask)
    );
    let s = c
        .end_task(Millis(1_700), TaskId(7), TaskOutcome::Merged)
        .unwrap();
    assert_eq!((s.calls, s.tokens), (1, 2));
    let m = c.metrics(Millis(1_700)).tasks;
    assert_eq!((m.open, m.untracked, m.since_start.abandoned), (3, 0, 3));
    c.check().unwrap();
}

#[test]
fn task_idle_ms_is_validated_and_older_snapshots_restore() {
    for bad in ["0", "2592000001"] {
        let json = format!(r#"{{"pools":[{{"name":"p"}}],"task_idle_ms":{bad}}}"#);
        let e = Config::from_json(&json).unwrap_err();
        assert!(e.to_string().contains("task_idle_ms"), "{e}");
    }
    let mut c = coord(r#""requests_per_minute":1000"#, r#","max_tasks":1"#);
    assert_eq!(c.config().task_idle_ms, 3_600_000);
    c.open_task(Millis(5), &spec(1)).unwrap();
    // A snapshot written before the field existed: no task_idle_ms, no last_active.
    let mut v: serde_json::Value = serde_json::from_str(&c.snapshot_json()).unwrap();
    let state = &mut v["state"];
    state["config"]
        .as_object_mut()
        .unwrap()
        .remove("task_idle_ms");
    for t in state["tasks"]["open"].as_array_mut().unwrap() {
        t.as_object_mut().unwrap().remove("last_active").unwrap();
    }
    let mut back = Coordinator::restore_json(&v.to_string()).unwrap();
    assert_eq!(back.config().task_idle_ms, 3_600_000);
    // Idle counted from its opening (5), not from time zero.
    assert_eq!(
        back.open_task(Millis(3_600_004), &spec(2)),
        Err(LeaseError::TooManyTasks)
    );
    back.open_task(Millis(3_600_005), &spec(2)).unwrap();
    assert_eq!(
        back.metrics(Millis(3_600_005)).tasks.since_start.abandoned,
        1
    );
}

#[test]
fn a_member_opens_new_tasks_only_below_three_quarters_the_operator_the_rest() {
    let mut c = coord(r#""input_tokens_per_minute":100000"#, r#","max_tasks":8"#);
    let open = |c: &mut Coordinator, task: u64, member: bool, role: &str| {
        let input: Input = serde_json::from_str(&format!(
            r#"{{"op":"open_task","task":{{"task":{task},"role":"{role}"}}{}}}"#,
            if member { r#","member":1"# } else { "" }
        ))
        .unwrap();
        c.handle(Millis(1), &input)
    };
    for t in 0..6 {
        assert_eq!(
            open(&mut c, t, true, "worker"),
            Ok(Output::TaskOpened),
            "task {t}"
        );
    }
    // Six open, three quarters of eight: a member's new task is refused, nothing changes.
    let before = c.metrics(Millis(1)).tasks.open;
    assert_eq!(
        open(&mut c, 6, true, "worker"),
        Err(LeaseError::TooManyTasks)
    );
    assert_eq!(c.metrics(Millis(1)).tasks.open, before);
    // A member still updates a task that is open; the operator opens the last quarter.
    assert_eq!(open(&mut c, 0, true, "planner"), Ok(Output::TaskOpened));
    assert_eq!(open(&mut c, 6, false, "worker"), Ok(Output::TaskOpened));
    assert_eq!(open(&mut c, 7, false, "worker"), Ok(Output::TaskOpened));
    assert_eq!(
        open(&mut c, 8, false, "worker"),
        Err(LeaseError::TooManyTasks)
    );
    // In JSON the member is left out for the operator.
    let input = Input::OpenTask {
        task: TaskSpec {
            task: TaskId(3),
            ..TaskSpec::default()
        },
        member: None,
    };
    let json = serde_json::to_string(&input).unwrap();
    assert!(!json.contains("member"), "{json}");
}

#[test]
fn a_member_acts_only_on_its_own_agents_tasks() {
    // Issue 43, N2: the task's owner is kept with the task in the core's bounded table, so
    // no member acts for another, whatever fills a table.
    let mut c = coord(r#""input_tokens_per_minute":1000000"#, r#","max_tasks":8"#);
    let input = |text: &str| serde_json::from_str::<Input>(text).unwrap();
    // Agent 1 opens task 10 with its credential; agent 2's lease names task 20 first.
    assert_eq!(
        c.handle(
            Millis(1),
            &input(r#"{"op":"open_task","task":{"task":10},"member":1}"#)
        ),
        Ok(Output::TaskOpened)
    );
    let lease = |c: &mut Coordinator, agent: u64, task: u64| {
        let text = format!(
            r#"{{"op":"request_lease","request":{{"agent":{agent},"pool":0,"input_tokens":10,"max_tokens":10,"task":{task}}}}}"#
        );
        c.handle(Millis(2), &input(&text)).unwrap()
    };
    assert!(matches!(lease(&mut c, 2, 20), Output::Granted { .. }));
    // Any caller may lease for any task (the calls are charged to it) ...
    assert!(matches!(lease(&mut c, 2, 10), Output::Granted { .. }));
    // ... but only its agent (or the operator) changes, fails or ends it.
    let before = c.snapshot_json();
    for (text, what) in [
        (
            r#"{"op":"open_task","task":{"task":10,"role":"planner"},"member":2}"#,
            "update",
        ),
        (
            r#"{"op":"task_failed","task":10,"signature":7,"member":2}"#,
            "fail",
        ),
        (
            r#"{"op":"end_task","task":10,"outcome":"merged","member":2}"#,
            "end",
        ),
        (
            r#"{"op":"task_failed","task":20,"signature":7,"member":1}"#,
            "fail the other's",
        ),
    ] {
        assert_eq!(
            c.handle(Millis(3), &input(text)),
            Err(LeaseError::Forbidden),
            "{what}"
        );
    }
    assert_eq!(c.snapshot_json(), before, "a refusal changes nothing");
    assert_eq!(LeaseError::Forbidden.code(), "forbidden");
    // Its own agent may; a task the request of agent 2 opened is agent 2's.
    assert!(
        c.handle(
            Millis(4),
            &input(r#"{"op":"task_failed","task":10,"signature":7,"member":1}"#)
        )
        .is_ok()
    );
    assert!(
        c.handle(
            Millis(4),
            &input(r#"{"op":"end_task","task":20,"outcome":"merged","member":2}"#)
        )
        .is_ok()
    );
    // The operator acts on any; a task the operator opened is no member's.
    assert!(
        c.handle(
            Millis(5),
            &input(r#"{"op":"open_task","task":{"task":30}}"#)
        )
        .is_ok()
    );
    assert_eq!(
        c.handle(
            Millis(5),
            &input(r#"{"op":"end_task","task":30,"outcome":"failed","member":1}"#)
        ),
        Err(LeaseError::Forbidden)
    );
    assert!(
        c.handle(
            Millis(6),
            &input(r#"{"op":"end_task","task":10,"outcome":"merged"}"#)
        )
        .is_ok()
    );
    // A member cannot take a task over by filling the table: a full table refuses or runs
    // requests untracked, and evicts only a task idle for task_idle_ms (ended as abandoned,
    // so its id names a new task, no longer the old owner's work).
    assert!(
        c.handle(
            Millis(7),
            &input(r#"{"op":"open_task","task":{"task":40},"member":1}"#)
        )
        .is_ok()
    );
    for junk in 1_000..1_100 {
        let _ = lease(&mut c, 2, junk);
    }
    assert_eq!(
        c.handle(
            Millis(8),
            &input(r#"{"op":"end_task","task":40,"outcome":"merged","member":2}"#)
        ),
        Err(LeaseError::Forbidden),
        "task 40 is still agent 1's"
    );
    // Ownership survives a snapshot.
    let mut back = Coordinator::restore_json(&c.snapshot_json()).unwrap();
    assert_eq!(
        back.handle(
            Millis(9),
            &input(r#"{"op":"task_failed","task":40,"signature":1,"member":2}"#)
        ),
        Err(LeaseError::Forbidden)
    );
}
