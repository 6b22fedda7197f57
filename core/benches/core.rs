//! Criterion benchmarks of the coordinator's hot paths, with `governor` as the baseline
//! for a single rate limit. See BENCHMARKS.md at the workspace root for the figures and
//! what each benchmark does.
//!
//! Run with `cargo bench -p tokenwarden-core --bench core`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_main};
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
mod support;

use support::{ROOMY_POOL, Sizes, coordinator, eight_agents, granted, role};
use tokenwarden_core::{
    AgentId, Call, Config, Coordinator, Decision, Event, HeaderReport, LeaseRequest, LeaseStep,
    Millis, PoolId, ResponseStep, TokenBucket, Usage, Wait, parse_headers,
};

/// One admission check on one rate limit: governor's `check()` against tokenwarden's
/// standalone `TokenBucket::check`, both with a limit of 2^32 − 1 per minute. For
/// information, the coordinator's closest path (`request_lease` + `cancel` on a pool whose
/// only limit is requests per minute).
fn single_bucket(c: &mut Criterion) {
    let mut g = c.benchmark_group("single_bucket");

    // Time moves 1 ms per check, so every check also refills (the bucket never stays
    // full): the worst case for tokenwarden's side.
    g.bench_function("tokenwarden", |b| {
        let mut bucket = TokenBucket::new(u64::from(u32::MAX), 60_000).expect("valid bucket");
        let mut now = 0u64;
        b.iter(|| {
            now += 1;
            black_box(bucket.check(Millis(now), black_box(1))).unwrap();
        });
    });

    g.bench_function("tokenwarden_lease_cancel", |b| {
        let mut coord =
            coordinator(r#"{"pools":[{"name":"p","requests_per_minute":9007199254740991}]}"#);
        let req = LeaseRequest {
            agent: AgentId(1),
            ..Default::default()
        };
        let mut now = 0u64;
        b.iter(|| {
            now += 1;
            let lease = granted(coord.request_lease(Millis(now), black_box(&req)).unwrap());
            coord.cancel(Millis(now), black_box(lease)).unwrap();
        });
    });

    // The fair baseline: a fake clock, like tokenwarden's host-supplied `now`. It moves
    // 64 ms every 64 checks (1 ms per check on average, as on the tokenwarden side) so the
    // clock's compare-and-swap is not charged to every check.
    g.bench_function("governor", |b| {
        let clock = FakeRelativeClock::default();
        let quota = Quota::per_minute(NonZeroU32::MAX);
        let limiter = RateLimiter::direct_with_clock(quota, clock.clone());
        let mut i = 0u32;
        b.iter(|| {
            i = i.wrapping_add(1);
            if i % 64 == 0 {
                clock.advance(Duration::from_millis(64));
            }
            black_box(limiter.check()).unwrap();
        });
    });

    // For information: governor with its default clock (quanta), which reads the clock on
    // every check.
    g.bench_function("governor_default_clock", |b| {
        let limiter = RateLimiter::direct(Quota::per_minute(NonZeroU32::MAX));
        b.iter(|| black_box(limiter.check()).unwrap());
    });
    g.finish();
}

/// Steady state: request_lease (granted) then settle with the real usage, eight agents in
/// turn, time advancing 1 ms per iteration; events drained as the protocol asks.
fn grant_settle(c: &mut Criterion) {
    c.bench_function("grant_settle", |b| {
        let mut coord = coordinator(&format!(
            r#"{{"pools":[{{"name":"p",{ROOMY_POOL},"max_concurrent":1000}}]}}"#
        ));
        let reqs = eight_agents();
        let mut now = 0u64;
        let mut i = 0usize;
        b.iter(|| {
            now += 1;
            i = (i + 1) % reqs.len();
            let req = &reqs[i];
            let lease = granted(coord.request_lease(Millis(now), black_box(req)).unwrap());
            let usage = Usage {
                input_tokens: req.input_tokens,
                output_tokens: 300,
                ..Default::default()
            };
            black_box(coord.settle(Millis(now), lease, black_box(&usage)).unwrap());
            while let Some(e) = coord.poll_event() {
                black_box(e);
            }
        });
    });
}

/// The call lifecycle on the same pool as `grant_settle`: `call_lease` (granted: send),
/// `call_response` (200, no rate-limit headers: deliver), `settle`, drain; and the same
/// with a 429 on every attempt's first send (`call_response` settles it and answers wait;
/// the second ask is sent and delivered): the per-step cost of a call's decisions.
fn call_steps(c: &mut Criterion) {
    let mut g = c.benchmark_group("call");
    for with_429 in [false, true] {
        let name = if with_429 {
            "send_429_retry_deliver"
        } else {
            "send_deliver"
        };
        g.bench_function(name, |b| {
            let mut coord = coordinator(&format!(
                r#"{{"pools":[{{"name":"p",{ROOMY_POOL},"max_concurrent":1000}}],
                    "feedback":{{"max_pause_ms":1}},"backoff":{{"retry_after_jitter_ms":0}}}}"#
            ));
            let reqs = eight_agents();
            let ok = HeaderReport::default();
            let limited = parse_headers([("retry-after-ms", "1")], None);
            let mut now = 0u64;
            let mut i = 0usize;
            b.iter(|| {
                now += 2;
                i = (i + 1) % reqs.len();
                let req = &reqs[i];
                let mut call = Call::new();
                if with_429 {
                    let LeaseStep::Send { lease, .. } = coord
                        .call_lease(Millis(now), &mut call, black_box(req))
                        .unwrap()
                    else {
                        panic!("expected send")
                    };
                    let a = coord
                        .call_response(
                            Millis(now),
                            &mut call,
                            PoolId(0),
                            Some(lease),
                            429,
                            &limited,
                        )
                        .unwrap();
                    let ResponseStep::Wait(Wait { until, .. }) = a.step else {
                        panic!("expected wait")
                    };
                    now = until.0;
                }
                let LeaseStep::Send { lease, .. } = coord
                    .call_lease(Millis(now), &mut call, black_box(req))
                    .unwrap()
                else {
                    panic!("expected send")
                };
                let a = coord
                    .call_response(Millis(now), &mut call, PoolId(0), Some(lease), 200, &ok)
                    .unwrap();
                let _ = black_box(a.step);
                let usage = Usage {
                    input_tokens: req.input_tokens,
                    output_tokens: 300,
                    ..Default::default()
                };
                black_box(coord.settle(Millis(now), lease, black_box(&usage)).unwrap());
                while let Some(e) = coord.poll_event() {
                    black_box(e);
                }
            });
        });
    }
    g.finish();
}

/// The weighted fair queue at depth N. The pool allows one call in flight and a held lease
/// fills it, so requests queue. Each iteration enqueues one ticket (request_lease returns
/// Queued) and settles the held lease, which grants the queue head (the dequeue); the
/// granted ticket becomes the held lease. The queue stays at N.
fn wfq(c: &mut Criterion) {
    let mut g = c.benchmark_group("wfq/enqueue_dequeue");
    for n in [100u64, 1_000, 10_000] {
        g.bench_function(n.to_string(), |b| {
            let mut coord = coordinator(&format!(
                r#"{{"pools":[{{"name":"p",{ROOMY_POOL},"max_concurrent":1}}],
                    "max_queue_depth":1000000,"max_leases":1000000,"max_agents":4096,
                    "max_queue_wait_ms":2592000000,"lease_ttl_ms":2592000000}}"#
            ));
            let mut sizes = Sizes(0x9E37_79B9_7F4A_7C15);
            let mut k = 0u64;
            let mut next_req = move || {
                k += 1;
                let agent = k % 256;
                LeaseRequest {
                    agent: AgentId(agent),
                    input_tokens: sizes.next(500, 8_000),
                    max_tokens: sizes.next(1_000, 4_000),
                    role: role(agent),
                    ..Default::default()
                }
            };
            let mut now = 1u64;
            let mut held = granted(coord.request_lease(Millis(now), &next_req()).unwrap());
            for _ in 0..n {
                let d = coord.request_lease(Millis(now), &next_req()).unwrap();
                assert!(matches!(d, Decision::Queued { .. }), "{d:?}");
            }
            let usage = Usage {
                input_tokens: 3_000,
                output_tokens: 500,
                ..Default::default()
            };
            b.iter(|| {
                now += 1;
                let req = next_req();
                let d = coord.request_lease(Millis(now), black_box(&req)).unwrap();
                debug_assert!(matches!(d, Decision::Queued { .. }), "{d:?}");
                let _ = black_box(d);
                coord.settle(Millis(now), held, black_box(&usage)).unwrap();
                while let Some(e) = coord.poll_event() {
                    if let Event::Granted { lease, .. } = e {
                        held = lease;
                    }
                }
            });
            assert_eq!(
                coord.metrics(Millis(now)).pools[0].queue_depth,
                u32::try_from(n).unwrap()
            );
        });
    }
    g.finish();
}

/// Expiring N leases in one handle_timeout. Each measured coordinator has already reaped
/// one round of N leases (so its buffers are at their working size) and holds N fresh
/// leases that all expire at the measured instant. Throughput is per lease.
fn reap(c: &mut Criterion) {
    let mut g = c.benchmark_group("reap");
    for n in [100u64, 1_000] {
        let config = Config::from_json(&format!(
            r#"{{"pools":[{{"name":"p",{ROOMY_POOL}}}],"lease_ttl_ms":1000,"max_leases":100000}}"#
        ))
        .unwrap();
        let ttl = config.lease_ttl_ms;
        let setup = || {
            let mut coord = Coordinator::new(config.clone(), 42, Millis(0)).unwrap();
            let round = |coord: &mut Coordinator, at: u64| {
                for i in 0..n {
                    let req = LeaseRequest {
                        agent: AgentId(i % 16),
                        input_tokens: 1_000,
                        max_tokens: 500,
                        ..Default::default()
                    };
                    let _ = granted(coord.request_lease(Millis(at), &req).unwrap());
                }
            };
            round(&mut coord, 1);
            coord.handle_timeout(Millis(1 + ttl));
            while coord.poll_event().is_some() {}
            let t = 2 + ttl;
            round(&mut coord, t);
            (coord, Millis(t + ttl))
        };
        g.throughput(Throughput::Elements(n));
        g.bench_function(n.to_string(), |b| {
            b.iter_batched(
                setup,
                |(mut coord, at)| {
                    coord.handle_timeout(black_box(at));
                    coord
                },
                BatchSize::SmallInput,
            );
        });
    }
    g.finish();
}

/// A 200 response from Anthropic: every rate-limit header it sends plus the usual others.
const ANTHROPIC_HEADERS: &[(&str, &str)] = &[
    ("date", "Sun, 01 Jun 2025 12:00:00 GMT"),
    ("content-type", "application/json"),
    ("transfer-encoding", "chunked"),
    ("connection", "keep-alive"),
    ("anthropic-ratelimit-requests-limit", "4000"),
    ("anthropic-ratelimit-requests-remaining", "3999"),
    ("anthropic-ratelimit-requests-reset", "2025-06-01T12:00:00Z"),
    ("anthropic-ratelimit-input-tokens-limit", "400000"),
    ("anthropic-ratelimit-input-tokens-remaining", "398000"),
    (
        "anthropic-ratelimit-input-tokens-reset",
        "2025-06-01T12:00:01Z",
    ),
    ("anthropic-ratelimit-output-tokens-limit", "80000"),
    ("anthropic-ratelimit-output-tokens-remaining", "79000"),
    (
        "anthropic-ratelimit-output-tokens-reset",
        "2025-06-01T12:00:01Z",
    ),
    ("anthropic-ratelimit-tokens-limit", "480000"),
    ("anthropic-ratelimit-tokens-remaining", "477000"),
    ("anthropic-ratelimit-tokens-reset", "2025-06-01T12:00:01Z"),
    ("request-id", "req_011CPpCzW4pB2x8G5bYkG9qH"),
    (
        "strict-transport-security",
        "max-age=31536000; includeSubDomains; preload",
    ),
    (
        "anthropic-organization-id",
        "5d2f9a4e-2b1c-4f3e-9a7d-8c6b5e4d3c2b",
    ),
    ("via", "1.1 google"),
    ("cf-cache-status", "DYNAMIC"),
    ("x-robots-tag", "none"),
    ("server", "cloudflare"),
    ("cf-ray", "948a1c2b3d4e5f60-SJC"),
];

/// A 200 response from OpenAI: its six rate-limit headers plus the usual others.
const OPENAI_HEADERS: &[(&str, &str)] = &[
    ("date", "Sun, 01 Jun 2025 12:00:00 GMT"),
    ("content-type", "application/json"),
    ("transfer-encoding", "chunked"),
    ("connection", "keep-alive"),
    ("access-control-expose-headers", "X-Request-ID"),
    ("openai-organization", "user-abc123"),
    ("openai-processing-ms", "734"),
    ("openai-project", "proj_abc123"),
    ("openai-version", "2020-10-01"),
    ("x-envoy-upstream-service-time", "739"),
    ("x-ratelimit-limit-requests", "10000"),
    ("x-ratelimit-limit-tokens", "30000000"),
    ("x-ratelimit-remaining-requests", "9999"),
    ("x-ratelimit-remaining-tokens", "29998450"),
    ("x-ratelimit-reset-requests", "6ms"),
    ("x-ratelimit-reset-tokens", "3ms"),
    ("x-request-id", "req_7f3c2d1e0b9a8f7e6d5c4b3a2f1e0d9c"),
    (
        "strict-transport-security",
        "max-age=31536000; includeSubDomains; preload",
    ),
    ("cf-cache-status", "DYNAMIC"),
    ("x-content-type-options", "nosniff"),
    ("server", "cloudflare"),
    ("cf-ray", "948a1c2b3d4e5f61-SJC"),
    ("alt-svc", "h3=\":443\"; ma=86400"),
];

/// The Unix time of the `date` headers above.
const UNIX_NOW_MS: u64 = 1_748_779_200_000;

/// parse_headers on each provider's full header set, and parse + handle_response.
fn headers(c: &mut Criterion) {
    let mut g = c.benchmark_group("headers");
    for (name, set) in [("anthropic", ANTHROPIC_HEADERS), ("openai", OPENAI_HEADERS)] {
        g.bench_function(name, |b| {
            b.iter(|| parse_headers(black_box(set).iter().copied(), black_box(Some(UNIX_NOW_MS))));
        });
    }
    g.finish();

    c.bench_function("ingest", |b| {
        let mut coord = coordinator(
            r#"{"pools":[{"name":"p","input_tokens_per_minute":400000,
                "output_tokens_per_minute":80000,"requests_per_minute":4000}]}"#,
        );
        let mut now = 0u64;
        b.iter(|| {
            now += 1;
            let report = parse_headers(
                black_box(ANTHROPIC_HEADERS).iter().copied(),
                Some(UNIX_NOW_MS + now),
            );
            coord
                .handle_response(Millis(now), PoolId(0), None, black_box(200), &report)
                .unwrap();
            while let Some(e) = coord.poll_event() {
                black_box(e);
            }
        });
    });
}

/// Every benchmark, with run times kept short enough for a 2-core machine.
fn benches() {
    let mut c = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(700))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    single_bucket(&mut c);
    grant_settle(&mut c);
    call_steps(&mut c);
    wfq(&mut c);
    reap(&mut c);
    headers(&mut c);
}

criterion_main!(benches);
