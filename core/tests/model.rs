//! Model-based property tests: random sequences of every input the coordinator takes,
//! checked step by step against a small reference model of lease lifecycles.
//!
//! The inputs: `request_lease` (agents 0..8, pools 0..2 and a missing one, sizes from 0
//! through the pool's capacity ± 2 to beyond 2^53 and `u64::MAX`, random role, unblocks,
//! failure signature and cached prefix), `settle` and `cancel` of issued ids (live or
//! ended) and of forged ones, with usage up to far above the reservation and beyond 2^53,
//! `handle_response` (200, 429, 500; headers built from real names with numbers, dates,
//! durations, IETF fields and garbage; with and without a lease), `handle_timeout`, the
//! host clock stepping forward (a little, a lot, to `u64::MAX`) and backward, a
//! `snapshot_json` → `restore_json` round trip, and `metrics`.
//!
//! After every step:
//!
//! * `Coordinator::check()` is `Ok`; `metrics()` agrees with the model on live leases,
//!   leases in flight and queue depth, and no gating axis has more available than its
//!   capacity; nothing panics (proptest catches panics);
//! * a call that returned `Err` left the state untouched (`snapshot_json()` before and
//!   after are equal, and no event was emitted);
//! * every lease ends exactly once: no id is handed out twice, granted twice, ended twice
//!   or granted after it ended; a grant never takes a pool's last concurrency slot twice;
//!   settling or cancelling an ended id is `Err(UnknownLease)`, and so is settling or
//!   cancelling a granted lease only once its expiry has come;
//! * `handle_timeout(now)` twice at the same instant: the second call emits nothing and
//!   changes nothing;
//! * a `snapshot_json` → `restore_json` round trip gives an equal coordinator;
//! * every input taken through the host protocol instead (`Coordinator::handle` of the same
//!   `Input`, from the state before) gives the same answer, the same events and the same
//!   state: the properties hold for the protocol every host speaks, not only for the typed
//!   calls.
//!
//! A second property checks the admission envelope (see [`check_envelope`]).
//!
//! Failures are not persisted (no `proptest-regressions` files); the generator seed is
//! random per run, and proptest prints the shrunk failing input.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tokenwarden_core::{
    AgentId, Axis, Coordinator, Decision, Event, Input, LeaseError, LeaseId, LeaseRequest,
    MAX_TOKENS, Millis, Output, PoolId, RejectReason, Role, Settlement, TaskId, Usage,
    parse_headers,
};

// ---------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------

/// A token figure, resolved against the scale of the pool it is sent to.
#[derive(Clone, Copy, Debug)]
enum Size {
    Zero,
    Small(u64),
    /// Thousandths of the pool's capacity.
    Frac(u32),
    /// The pool's capacity plus or minus a little.
    Near(u64, bool),
    /// Above the pool's real limit.
    Above(u64),
    Max53,
    Over53,
    U64Max,
}

impl Size {
    fn resolve(self, scale: u64) -> u64 {
        match self {
            Size::Zero => 0,
            Size::Small(n) => n,
            Size::Frac(p) => scale * u64::from(p) / 1000,
            Size::Near(d, false) => scale.saturating_sub(d),
            Size::Near(d, true) => scale + d,
            Size::Above(d) => scale * 2 + d,
            Size::Max53 => MAX_TOKENS,
            Size::Over53 => MAX_TOKENS + 1,
            Size::U64Max => u64::MAX,
        }
    }
}

/// A usage figure, relative to what the lease asked for.
#[derive(Clone, Copy, Debug)]
enum Amount {
    Zero,
    /// Thousandths of the asked figure (up to 3x: overruns too).
    Of(u32),
    Raw(u64),
    /// Far above any reservation.
    Far,
    Max53,
    Over53,
}

impl Amount {
    fn resolve(self, asked: u64) -> u64 {
        match self {
            Amount::Zero => 0,
            Amount::Of(p) => u64::try_from(u128::from(asked) * u128::from(p) / 1000)
                .unwrap_or(MAX_TOKENS)
                .min(MAX_TOKENS),
            Amount::Raw(n) => n,
            Amount::Far => asked
                .saturating_mul(8)
                .saturating_add(1 << 40)
                .min(MAX_TOKENS),
            Amount::Max53 => MAX_TOKENS,
            Amount::Over53 => MAX_TOKENS + 1,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct UsageGen {
    input: Amount,
    creation: Amount,
    read: Amount,
    output: Amount,
}

/// Which lease a settle, cancel or response names.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// One of the ids handed out so far (index modulo their number).
    Issued(usize),
    /// Any id, likely never issued (or issued later).
    Forged(u64),
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Fwd(u64),
    Mid(u64),
    Long(u64),
    /// To `u64::MAX − n`.
    Huge(u64),
    Back(u64),
    /// Halve the host clock.
    BackFar,
}

#[derive(Clone, Debug)]
enum Op {
    Request {
        agent: u64,
        pool: u32,
        input: Size,
        cached: Size,
        max_tokens: Size,
        role: Role,
        unblocks: u32,
        failure: Option<u64>,
    },
    Settle {
        target: Target,
        usage: UsageGen,
    },
    Cancel {
        target: Target,
    },
    Renew {
        target: Target,
    },
    Response {
        pool: u32,
        target: Option<Target>,
        status: u16,
        headers: Vec<(&'static str, String)>,
        unix_now: Option<u64>,
    },
    Timeout,
    Step(Step),
    RoundTrip,
    Metrics,
}

/// Real header names: every family the parser knows, in several spellings.
const RATE_HEADERS: &[&str] = &[
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-limit",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-limit",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
    "Anthropic-RateLimit-Input-Tokens-Remaining",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "x-rate-limit-remaining-tokens",
    "x_ratelimit_limit_input_tokens",
    "x-ratelimit-limit-concurrent-requests",
    "x-ratelimit-remaining-parallel-requests",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "ratelimit",
    "ratelimit-policy",
];

/// Headers that never carry a limit or a remaining count.
const OTHER_HEADERS: &[&str] = &[
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
    "rate_limit_type",
    "x-rate-limit-type",
    "reset_at",
    "x-reset-at",
    "date",
    "content-type",
    "x-request-id",
];

fn header_value() -> BoxedStrategy<String> {
    prop_oneof![
        3 => (0u64..200_000).prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        4 => prop::sample::select(vec![
            "0", "1", "-1", "", " ", "abc", "1.5", "0.5", "6m0s", "1.5s", "20ms", "25h",
            "2026-11-29T10:00:00Z", "1970-01-01T00:00:00Z", "Sun, 06 Nov 1994 08:49:37 GMT",
            "limit=100, remaining=50, reset=5", "\"default\";q=100;w=60",
            "\"default\";r=0;t=30", "100;w=60", "input_tokens", "output_tokens", "tokens",
            "requests", "concurrent", "true", "false", "18446744073709551616",
            "9007199254740993", "-5", "NaN", "\u{b5}s", "1e9",
        ])
        .prop_map(str::to_string),
        1 => "[ -~]{0,16}",
    ]
    .boxed()
}

fn headers(rate: bool) -> BoxedStrategy<Vec<(&'static str, String)>> {
    let names: Vec<&'static str> = if rate {
        RATE_HEADERS.iter().chain(OTHER_HEADERS).copied().collect()
    } else {
        OTHER_HEADERS.to_vec()
    };
    prop::collection::vec((prop::sample::select(names), header_value()), 0..5).boxed()
}

fn size(wild: bool) -> BoxedStrategy<Size> {
    if wild {
        prop_oneof![
            3 => Just(Size::Zero),
            6 => (1u64..2_000).prop_map(Size::Small),
            6 => (0u32..=1000).prop_map(Size::Frac),
            3 => (0u64..3, any::<bool>()).prop_map(|(d, up)| Size::Near(d, up)),
            1 => (0u64..1_000).prop_map(Size::Above),
            1 => Just(Size::Max53),
            1 => Just(Size::Over53),
            1 => Just(Size::U64Max),
        ]
        .boxed()
    } else {
        prop_oneof![
            2 => Just(Size::Zero),
            6 => (0u32..=1000).prop_map(Size::Frac),
            2 => (0u64..3, any::<bool>()).prop_map(|(d, up)| Size::Near(d, up)),
            1 => (0u64..1_000).prop_map(Size::Above),
        ]
        .boxed()
    }
}

fn amount(wild: bool) -> BoxedStrategy<Amount> {
    let tame = prop_oneof![
        if wild { 2 } else { 5 } => Just(Amount::Zero),
        8 => (0u32..=3000).prop_map(Amount::Of),
        2 => (0u64..5_000).prop_map(Amount::Raw),
        1 => Just(Amount::Far),
    ];
    if wild {
        prop_oneof![
            20 => tame,
            1 => Just(Amount::Max53),
            1 => Just(Amount::Over53),
        ]
        .boxed()
    } else {
        tame.boxed()
    }
}

fn usage(wild: bool) -> BoxedStrategy<UsageGen> {
    (amount(wild), amount(wild), amount(wild), amount(wild))
        .prop_map(|(input, creation, read, output)| UsageGen {
            input,
            creation,
            read,
            output,
        })
        .boxed()
}

fn target() -> BoxedStrategy<Target> {
    prop_oneof![
        8 => any::<usize>().prop_map(Target::Issued),
        // Ids shaped like real ones: (generation << 32) | slot.
        1 => (0u64..4, 0u64..4).prop_map(|(g, s)| Target::Forged((g << 32) | s)),
        1 => any::<u64>().prop_map(Target::Forged),
    ]
    .boxed()
}

fn role() -> BoxedStrategy<Role> {
    prop_oneof![
        Just(Role::Planner),
        Just(Role::Reviewer),
        Just(Role::Worker)
    ]
    .boxed()
}

fn step(wild: bool) -> BoxedStrategy<Step> {
    if wild {
        prop_oneof![
            6 => (0u64..100).prop_map(Step::Fwd),
            6 => (0u64..10_000).prop_map(Step::Mid),
            3 => (0u64..10_000_000).prop_map(Step::Long),
            1 => (0u64..1_000).prop_map(Step::Huge),
            2 => (0u64..10_000).prop_map(Step::Back),
            1 => Just(Step::BackFar),
        ]
        .boxed()
    } else {
        prop_oneof![
            6 => (0u64..100).prop_map(Step::Fwd),
            6 => (0u64..10_000).prop_map(Step::Mid),
            2 => (0u64..1_000_000).prop_map(Step::Long),
            1 => (0u64..1_000).prop_map(Step::Huge),
            2 => (0u64..10_000).prop_map(Step::Back),
        ]
        .boxed()
    }
}

/// Every operation, every error path (`wild`), or the envelope's subset (`!wild`: one
/// pool, no 429, no limit or remaining headers).
fn op(wild: bool) -> BoxedStrategy<Op> {
    let pools = if wild { 0u32..3 } else { 0u32..1 };
    let request = (
        0u64..8,
        pools.clone(),
        size(wild),
        prop_oneof![4 => Just(Size::Zero), 1 => size(wild)],
        size(wild),
        role(),
        prop_oneof![4 => 0u32..4, 1 => any::<u32>()],
        prop::option::of(0u64..3),
    )
        .prop_map(
            |(agent, pool, input, cached, max_tokens, role, unblocks, failure)| Op::Request {
                agent,
                pool,
                input,
                cached,
                max_tokens,
                role,
                unblocks,
                failure,
            },
        );
    let statuses = if wild {
        prop::sample::select(vec![200u16, 429, 500])
    } else {
        prop::sample::select(vec![200u16, 500])
    };
    let response = (
        pools,
        prop::option::of(target()),
        statuses,
        headers(wild),
        prop::option::of(prop_oneof![
            Just(1_764_410_400_000u64),
            any::<u64>(),
            Just(0u64)
        ]),
    )
        .prop_map(|(pool, target, status, headers, unix_now)| Op::Response {
            pool,
            target,
            status,
            headers,
            unix_now,
        });
    let settle = (target(), usage(wild)).prop_map(|(target, usage)| Op::Settle { target, usage });
    if wild {
        prop_oneof![
            10 => request,
            5 => settle,
            2 => target().prop_map(|target| Op::Cancel { target }),
            2 => target().prop_map(|target| Op::Renew { target }),
            3 => response,
            3 => Just(Op::Timeout),
            6 => step(true).prop_map(Op::Step),
            1 => Just(Op::RoundTrip),
            1 => Just(Op::Metrics),
        ]
        .boxed()
    } else {
        // Bursts of requests and settles that refund a lot, between time steps.
        prop_oneof![
            12 => request,
            8 => settle,
            2 => target().prop_map(|target| Op::Cancel { target }),
            2 => target().prop_map(|target| Op::Renew { target }),
            1 => response,
            2 => Just(Op::Timeout),
            5 => step(false).prop_map(Op::Step),
            1 => Just(Op::RoundTrip),
        ]
        .boxed()
    }
}

// ---------------------------------------------------------------------------------------
// Configurations
// ---------------------------------------------------------------------------------------

/// A configuration for the general property, and the token scale of each pool.
#[derive(Clone, Debug)]
struct Setup {
    json: String,
    scale: [u64; 2],
}

fn general_setup() -> BoxedStrategy<Setup> {
    (
        prop::sample::select(vec![1_000u64, 60_000]),
        prop::sample::select(vec![50u64, 1_000, 120_000]),
        prop::sample::select(vec![0u64, 10_000, 60_000]),
        prop::sample::select(vec![2u32, 1024]),
        prop::sample::select(vec![3u32, 4096]),
        prop::sample::select(vec![3u32, 1024]),
        prop::sample::select(vec![0u64, 5_000, 300_000]),
        any::<bool>(),
        0u8..3,
        prop::option::of(1u64..5),
        any::<bool>(),
    )
        .prop_map(
            |(window, ttl, wait, depth, leases, agents, cache, slow, second, conc, moving)| {
                let conc = conc.map_or("null".to_string(), |c| c.to_string());
                let (pool1, scale1) = match second {
                    0 => (
                        r#"{"name":"b","counting":"openai","tokens_per_minute":50000,"requests_per_minute":60}"#,
                        42_500,
                    ),
                    1 => (r#"{"name":"b"}"#, 100_000),
                    _ => (
                        r#"{"name":"b","input_tokens_per_minute":7,"output_tokens_per_minute":3,"requests_per_minute":2,"max_concurrent":1}"#,
                        5,
                    ),
                };
                let margin = if moving {
                    r#","margin":{"start_permille":700,"floor_permille":600,"ceiling_permille":900,"increase_permille":50,"decrease_permille":100,"clean_interval_ms":1000}"#
                } else {
                    ""
                };
                let slow = if slow {
                    r#","slow_start":{"start_permille":300,"ramp_ms":5000}"#
                } else {
                    ""
                };
                let json = format!(
                    r#"{{"pools":[{{"name":"a","input_tokens_per_minute":100000,"output_tokens_per_minute":20000,"requests_per_minute":600,"max_concurrent":{conc}}},{pool1}],
                    "window_ms":{window},"lease_ttl_ms":{ttl},"max_queue_wait_ms":{wait},"max_queue_depth":{depth},
                    "max_leases":{leases},"max_agents":{agents},"prompt_cache_ttl_ms":{cache}{margin}{slow},
                    "max_tasks":3,"task_idle_ms":{ttl},
                    "estimate_alert":{{"threshold_permille":200,"consecutive":2}},"metrics_minutes":3}}"#
                );
                Setup {
                    json,
                    scale: [85_000, scale1],
                }
            },
        )
        .boxed()
}

/// The envelope's setup: one pool, input tokens and concurrency only, margin fixed.
#[derive(Clone, Debug)]
struct EnvelopeSetup {
    limit: u64,
    window_ms: u64,
    json: String,
}

fn envelope_setup() -> BoxedStrategy<EnvelopeSetup> {
    (
        prop::sample::select(vec![7u64, 1_000, 100_000]),
        prop::sample::select(vec![1_000u64, 60_000]),
        prop::sample::select(vec![1u64, 4, 100]),
        prop::sample::select(vec![1_000u64, 120_000]),
        prop::sample::select(vec![0u64, 5_000, 300_000]),
    )
        .prop_map(|(limit, window_ms, conc, ttl, cache)| EnvelopeSetup {
            limit,
            window_ms,
            json: format!(
                r#"{{"pools":[{{"name":"a","input_tokens_per_minute":{limit},"max_concurrent":{conc}}}],
                "window_ms":{window_ms},"lease_ttl_ms":{ttl},"prompt_cache_ttl_ms":{cache},
                "margin":{{"start_permille":850,"ceiling_permille":850,"floor_permille":600}}}}"#
            ),
        })
        .boxed()
}

// ---------------------------------------------------------------------------------------
// The reference model
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    Queued,
    Active,
    Ended,
}

#[derive(Clone, Debug)]
struct Lease {
    life: Life,
    req: LeaseRequest,
    /// Input tokens reserved at grant (envelope runs only).
    reserved: Option<u64>,
    /// When a granted lease is reaped.
    expires_at: Millis,
}

/// Input-token bookkeeping for the envelope: grants and refunds, with their instants.
#[derive(Default)]
struct Ledger {
    cache_ttl: u64,
    /// Prompt caches the coordinator believes warm: agent → until.
    warm: BTreeMap<AgentId, Millis>,
    grants: Vec<(u64, u64)>,
    refunds: Vec<(u64, u64)>,
}

struct Harness {
    coord: Coordinator,
    /// The host's clock; may go backwards.
    now: u64,
    scale: [u64; 2],
    pools: u32,
    leases: BTreeMap<LeaseId, Lease>,
    issued: Vec<LeaseId>,
    ledger: Option<Ledger>,
    /// Each pool's concurrency limit as of the current call (headers may change it).
    max_concurrent: Vec<Option<u64>>,
}

fn drain(c: &mut Coordinator) -> Vec<Event> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

/// Events as a prefix comparison sees them: a `Revised` event still waiting when the ticket
/// is revised again carries the later promise (one event per ticket), so its `eta` may be
/// later in the longer run than in the prefix.
fn promises_masked(ev: &[Event]) -> Vec<Event> {
    ev.iter()
        .map(|e| match *e {
            Event::Revised {
                lease, agent, pool, ..
            } => Event::Revised {
                lease,
                agent,
                pool,
                eta: Millis(0),
            },
            other => other,
        })
        .collect()
}

fn first_too_large(fields: &[(&'static str, u64)]) -> Option<LeaseError> {
    fields
        .iter()
        .find(|(_, v)| *v > MAX_TOKENS)
        .map(|(field, _)| LeaseError::TooLarge { field })
}

impl Harness {
    fn new(json: &str, scale: [u64; 2], ledger: Option<Ledger>) -> Harness {
        let config = tokenwarden_core::Config::from_json(json).expect("test config is valid");
        let pools = u32::try_from(config.pools.len()).expect("few pools");
        let mut h = Harness {
            coord: Coordinator::new(config, 0x5eed, Millis(0)).expect("valid"),
            now: 0,
            scale,
            pools,
            leases: BTreeMap::new(),
            issued: Vec::new(),
            ledger,
            max_concurrent: Vec::new(),
        };
        h.read_max_concurrent();
        h
    }

    fn resolve(&self, t: Target) -> LeaseId {
        match t {
            Target::Issued(i) if !self.issued.is_empty() => self.issued[i % self.issued.len()],
            Target::Issued(i) => LeaseId(i as u64),
            Target::Forged(id) => LeaseId(id),
        }
    }

    fn life(&self, id: LeaseId) -> Option<Life> {
        self.leases.get(&id).map(|l| l.life)
    }

    /// Input tokens the coordinator reserves for `req` if granted now (Anthropic counting:
    /// the cached prefix is charged when the agent's cache is believed cold and the host
    /// did not confirm it cached).
    fn reservation(&self, req: &LeaseRequest) -> Option<u64> {
        let ledger = self.ledger.as_ref()?;
        let now = self.coord.now();
        let cold = ledger.warm.get(&req.agent).is_none_or(|w| now >= *w);
        let charged = cold && !req.cached_prefix_confirmed;
        Some(req.input_tokens + if charged { req.cached_prefix_tokens } else { 0 })
    }

    fn granted(&mut self, id: LeaseId, expires_at: Millis) {
        let now = self.coord.now().0;
        let req = self.leases[&id].req;
        let (active, _) = self.counts(req.pool.0);
        if let Some(Some(max)) = self.max_concurrent.get(req.pool.0 as usize) {
            assert!(
                active < *max,
                "{id} granted with {active} of {max} concurrency slots taken"
            );
        }
        let reserved = self.reservation(&req);
        if let (Some(ledger), Some(r)) = (self.ledger.as_mut(), reserved) {
            ledger.grants.push((now, r));
        }
        let l = self.leases.get_mut(&id).expect("known");
        l.life = Life::Active;
        l.reserved = reserved;
        l.expires_at = expires_at;
    }

    fn ended(&mut self, id: LeaseId, how: &str) {
        let l = self.leases.get_mut(&id).expect("known");
        assert_eq!(l.life, Life::Active, "{id} {how} while {:?}", l.life);
        l.life = Life::Ended;
    }

    /// Reads the concurrency limits (only a response's headers change them).
    fn read_max_concurrent(&mut self) {
        self.max_concurrent = self
            .coord
            .metrics(self.coord.now())
            .pools
            .iter()
            .map(|p| p.max_concurrent)
            .collect();
    }

    fn events(&mut self, events: &[Event]) {
        for e in events {
            match *e {
                Event::Granted {
                    lease,
                    agent,
                    pool,
                    expires_at,
                    ..
                } => {
                    let l = self
                        .leases
                        .get(&lease)
                        .unwrap_or_else(|| panic!("Granted names {lease}, never issued"));
                    assert_eq!(
                        l.life,
                        Life::Queued,
                        "Granted {lease} while {:?}: granted twice or after it ended",
                        l.life
                    );
                    assert_eq!((agent, pool), (l.req.agent, l.req.pool), "Granted {lease}");
                    let ttl = self.coord.config().lease_ttl_ms;
                    assert_eq!(expires_at, self.coord.now().plus(ttl), "Granted {lease}");
                    self.granted(lease, expires_at);
                }
                Event::Expired { lease, agent, pool } => {
                    let l = self
                        .leases
                        .get(&lease)
                        .unwrap_or_else(|| panic!("Expired names {lease}, never issued"));
                    assert_eq!((agent, pool), (l.req.agent, l.req.pool), "Expired {lease}");
                    assert!(
                        l.expires_at <= self.coord.now(),
                        "{lease} reaped at {} before its expiry {} (renewed?)",
                        self.coord.now(),
                        l.expires_at
                    );
                    self.ended(lease, "expired");
                }
                Event::MarginChanged { pool, .. } | Event::Paused { pool, .. } => {
                    assert!(pool.0 < self.pools, "{e:?}");
                }
                Event::EstimateAlert { .. } => {}
                Event::MarginAtFloor { pool, .. } => {
                    assert!(pool.0 < self.pools, "{e:?}");
                }
                // A promise replaced is a queued ticket's, and never before now.
                Event::Revised {
                    lease,
                    agent,
                    pool,
                    eta,
                } => {
                    let l = self
                        .leases
                        .get(&lease)
                        .unwrap_or_else(|| panic!("Revised names {lease}, never issued"));
                    assert_eq!(l.life, Life::Queued, "Revised {lease} while {:?}", l.life);
                    assert_eq!((agent, pool), (l.req.agent, l.req.pool), "Revised {lease}");
                    assert!(
                        eta >= self.coord.now(),
                        "Revised {lease} to {eta:?}, in the past"
                    );
                }
            }
        }
    }

    fn counts(&self, pool: u32) -> (u64, u32) {
        let of = |life| {
            self.leases
                .values()
                .filter(|l| l.req.pool.0 == pool && l.life == life)
                .count()
        };
        (of(Life::Active) as u64, of(Life::Queued) as u32)
    }

    fn invariants(&self) {
        if let Err(e) = self.coord.check() {
            panic!("check(): {e}");
        }
        let m = self.coord.metrics(self.coord.now());
        let live = self
            .leases
            .values()
            .filter(|l| l.life != Life::Ended)
            .count();
        assert_eq!(m.live_leases as usize, live, "live leases");
        for (i, p) in m.pools.iter().enumerate() {
            let (active, queued) = self.counts(i as u32);
            assert_eq!(p.in_flight, active, "pool {i} in flight");
            assert_eq!(p.queue_depth, queued, "pool {i} queue depth");
            // The provider's own figure may raise a level above the capacity (its burst),
            // never above the limit.
            for a in p.axes.iter().filter(|a| a.limit.is_some()) {
                let most = a.capacity.max(a.limit.unwrap_or(0));
                assert!(
                    a.available <= i64::try_from(most).unwrap_or(i64::MAX),
                    "pool {i} {:?}: {} available above the limit {:?}",
                    a.axis,
                    a.available,
                    a.limit
                );
            }
        }
        if let Some(t) = self.coord.poll_timeout() {
            assert!(t >= self.coord.now(), "poll_timeout {t} before now");
        }
    }

    /// Every step is also taken through the host protocol, from the state before it: the
    /// `handle` of the same input gives the same answer, the same events and the same state
    /// as the typed call (so the properties below hold for the protocol the hosts speak).
    fn same_through_protocol(
        &self,
        before: &Coordinator,
        t: Millis,
        input: &Input,
        want: Result<Output, LeaseError>,
        events: &[Event],
    ) {
        let mut p = before.clone();
        let got = p.handle(t, input);
        assert_eq!(got, want, "handle({t}, {input:?})");
        assert_eq!(drain(&mut p), events, "handle({t}, {input:?}): events");
        assert!(
            p == self.coord,
            "handle({t}, {input:?}): a state other than the typed call's"
        );
    }

    /// Asserts an `Err` left everything as it was.
    fn unchanged(&self, before: &Coordinator, what: &str, err: LeaseError) {
        let (b, a) = (before.snapshot_json(), self.coord.snapshot_json());
        if b != a {
            let at = b.bytes().zip(a.bytes()).take_while(|(x, y)| x == y).count();
            let from = at.saturating_sub(120);
            let near = |s: &str| {
                s.get(from..(at + 80).min(s.len()))
                    .unwrap_or("")
                    .to_string()
            };
            panic!(
                "{what} returned Err({err:?}) but changed the state; first difference at \
                 byte {at}:\nbefore: …{}…\nafter:  …{}…",
                near(&b),
                near(&a)
            );
        }
    }

    fn apply(&mut self, op: &Op) {
        let t = Millis(self.now);
        match op {
            Op::Request {
                agent,
                pool,
                input,
                cached,
                max_tokens,
                role,
                unblocks,
                failure,
            } => {
                let scale = self.scale[(*pool as usize).min(1)];
                let req = LeaseRequest {
                    agent: AgentId(*agent),
                    pool: PoolId(*pool),
                    input_tokens: input.resolve(scale),
                    cached_prefix_tokens: cached.resolve(scale / 4),
                    // A third of the calls come from a host that saw the prefix cached.
                    cached_prefix_confirmed: *unblocks % 3 == 2,
                    max_tokens: max_tokens.resolve(scale / 4),
                    role: *role,
                    unblocks: *unblocks,
                    failure_signature: *failure,
                    // Calls with an odd `unblocks` are for one of four tasks (opened by
                    // the first ask), so the task table runs under every other operation;
                    // with `max_tasks` 3, requests open at most two and the others run
                    // untracked until one has been idle for `task_idle_ms`.
                    task: (*unblocks % 2 == 1).then_some(TaskId(*agent % 4)),
                    // A third of the agents are subagents of the one before them: families
                    // split their place while the table evicts and restores them.
                    family: (*agent % 3 == 1).then(|| AgentId(*agent - 1)),
                };
                let before = self.coord.clone();
                let res = self.coord.request_lease(t, &req);
                let ev = drain(&mut self.coord);
                self.same_through_protocol(
                    &before,
                    t,
                    &Input::RequestLease { request: req },
                    res.map(Output::from),
                    &ev,
                );
                let expected_err = if *pool >= self.pools {
                    Some(LeaseError::UnknownPool)
                } else {
                    first_too_large(&[
                        ("input_tokens", req.input_tokens),
                        ("cached_prefix_tokens", req.cached_prefix_tokens),
                        ("max_tokens", req.max_tokens),
                    ])
                };
                match res {
                    Err(e) => {
                        assert!(ev.is_empty(), "request_lease Err({e:?}) emitted {ev:?}");
                        assert_eq!(Some(e), expected_err, "request_lease {req:?}");
                        self.unchanged(&before, "request_lease", e);
                    }
                    Ok(d) => {
                        assert_eq!(expected_err, None, "request_lease {req:?} gave {d:?}");
                        self.events(&ev);
                        let now = self.coord.now();
                        match d {
                            Decision::Grant { lease, expires_at } => {
                                self.fresh(lease, req, Life::Queued);
                                let ttl = self.coord.config().lease_ttl_ms;
                                assert_eq!(expires_at, now.plus(ttl));
                                self.granted(lease, expires_at);
                            }
                            Decision::Queued { lease, eta } => {
                                assert!(eta >= now, "eta {eta} before now {now}");
                                self.fresh(lease, req, Life::Queued);
                            }
                            Decision::Reject { retry_at: r, .. } => {
                                assert!(r >= now, "retry_at {r} before now {now}");
                            }
                            Decision::NeverFits { reason } => {
                                assert!(
                                    matches!(reason, RejectReason::ExceedsCapacity { .. }),
                                    "never fits: {reason:?}"
                                );
                            }
                        }
                    }
                }
            }
            Op::Settle { target, usage } => {
                let id = self.resolve(*target);
                let asked = self.leases.get(&id).map(|l| l.req).unwrap_or_default();
                let u = Usage {
                    input_tokens: usage.input.resolve(asked.input_tokens),
                    cache_creation_input_tokens: usage.creation.resolve(asked.cached_prefix_tokens),
                    cache_read_input_tokens: usage.read.resolve(asked.cached_prefix_tokens),
                    output_tokens: usage.output.resolve(asked.max_tokens),
                };
                let life = self.life(id);
                let before = self.coord.clone();
                // What the settle's own advance to `t` emits, before the lease is settled.
                let mut probe = self.coord.clone();
                probe.handle_timeout(t);
                let advance_events = drain(&mut probe);
                let res = self.coord.settle(t, id, &u);
                let ev = drain(&mut self.coord);
                self.same_through_protocol(
                    &before,
                    t,
                    &Input::Settle {
                        lease: id,
                        usage: u,
                    },
                    res.map(|settlement| Output::Settled { settlement }),
                    &ev,
                );
                let too_large = first_too_large(&[
                    ("input_tokens", u.input_tokens),
                    ("cache_creation_input_tokens", u.cache_creation_input_tokens),
                    ("cache_read_input_tokens", u.cache_read_input_tokens),
                    ("output_tokens", u.output_tokens),
                ]);
                if let Err(e) = res {
                    self.unchanged(&before, "settle", e);
                }
                let split = if ev.is_empty() {
                    0
                } else {
                    assert_eq!(
                        ev.get(..advance_events.len()).map(promises_masked),
                        Some(promises_masked(&advance_events)),
                        "settle's events start with those of advancing to {t}"
                    );
                    advance_events.len()
                };
                self.events(&ev[..split]);
                match (too_large, life, res) {
                    (Some(want), _, got) => assert_eq!(got, Err(want), "settle {u:?}"),
                    (None, Some(Life::Active), Ok(s)) => self.settled(id, &u, &s),
                    (None, Some(Life::Active), got) => {
                        assert_eq!(got.map(|_| ()), Err(LeaseError::UnknownLease), "settle");
                        self.due(id, t, "settle");
                    }
                    (None, Some(Life::Queued), got) => {
                        assert_eq!(got, Err(LeaseError::NotGranted), "settle of a ticket")
                    }
                    (None, _, got) => assert_eq!(
                        got.map(|_| ()),
                        Err(LeaseError::UnknownLease),
                        "settle of {id}, {life:?} in the model"
                    ),
                }
                self.events(&ev[split..]);
            }
            Op::Cancel { target } => {
                let id = self.resolve(*target);
                let life = self.life(id);
                let before = self.coord.clone();
                let mut probe = self.coord.clone();
                probe.handle_timeout(t);
                let advance_events = drain(&mut probe);
                let res = self.coord.cancel(t, id);
                let ev = drain(&mut self.coord);
                self.same_through_protocol(
                    &before,
                    t,
                    &Input::Cancel { lease: id },
                    res.map(|()| Output::Cancelled),
                    &ev,
                );
                if let Err(e) = res {
                    self.unchanged(&before, "cancel", e);
                }
                let split = if ev.is_empty() {
                    0
                } else {
                    assert_eq!(
                        ev.get(..advance_events.len()).map(promises_masked),
                        Some(promises_masked(&advance_events)),
                        "cancel's events start with those of advancing to {t}"
                    );
                    advance_events.len()
                };
                self.events(&ev[..split]);
                // A ticket may have been granted by the cancel's own advance to `t`.
                let life = if res.is_ok() { self.life(id) } else { life };
                match (life, res) {
                    (Some(Life::Queued), Ok(())) => {
                        self.leases.get_mut(&id).expect("known").life = Life::Ended;
                    }
                    (Some(Life::Active), Ok(())) => {
                        let now = self.coord.now().0;
                        let reserved = self.leases[&id].reserved;
                        if let (Some(ledger), Some(r)) = (self.ledger.as_mut(), reserved) {
                            ledger.refunds.push((now, r));
                        }
                        self.ended(id, "cancelled");
                    }
                    (Some(Life::Active), Err(LeaseError::UnknownLease)) => {
                        self.due(id, t, "cancel")
                    }
                    (Some(Life::Queued | Life::Active), Err(e)) => {
                        panic!("cancel of live {id} ({life:?}) failed: {e:?}")
                    }
                    (_, got) => assert_eq!(
                        got,
                        Err(LeaseError::UnknownLease),
                        "cancel of {id}, {life:?} in the model"
                    ),
                }
                self.events(&ev[split..]);
            }
            Op::Renew { target } => {
                let id = self.resolve(*target);
                let life = self.life(id);
                let before = self.coord.clone();
                let res = self.coord.renew(t, id);
                let ev = drain(&mut self.coord);
                self.same_through_protocol(
                    &before,
                    t,
                    &Input::Renew { lease: id },
                    res.map(|expires_at| Output::Renewed { expires_at }),
                    &ev,
                );
                if let Err(e) = res {
                    assert!(ev.is_empty(), "renew Err({e:?}) emitted {ev:?}");
                    self.unchanged(&before, "renew", e);
                }
                // The renew's own advance to `t` may reap or grant other leases.
                self.events(&ev);
                match (life, res) {
                    (Some(Life::Active), Ok(expires_at)) => {
                        let ttl = self.coord.config().lease_ttl_ms;
                        let old = self.leases[&id].expires_at;
                        assert_eq!(
                            expires_at,
                            self.coord.now().plus(ttl).max(old),
                            "renew of {id}"
                        );
                        self.leases.get_mut(&id).expect("known").expires_at = expires_at;
                    }
                    (Some(Life::Active), got) => {
                        assert_eq!(got, Err(LeaseError::UnknownLease), "renew");
                        self.due(id, t, "renew");
                    }
                    (Some(Life::Queued), got) => {
                        assert_eq!(got, Err(LeaseError::NotGranted), "renew of a ticket")
                    }
                    (_, got) => assert_eq!(
                        got,
                        Err(LeaseError::UnknownLease),
                        "renew of {id}, {life:?} in the model"
                    ),
                }
            }
            Op::Response {
                pool,
                target,
                status,
                headers,
                unix_now,
            } => {
                let id = target.map(|t| self.resolve(t));
                let report =
                    parse_headers(headers.iter().map(|(n, v)| (*n, v.as_str())), *unix_now);
                let before = self.coord.clone();
                let res = self
                    .coord
                    .handle_response(t, PoolId(*pool), id, *status, &report);
                let ev = drain(&mut self.coord);
                let input = Input::Response {
                    pool: PoolId(*pool),
                    lease: id,
                    status: *status,
                    headers: headers
                        .iter()
                        .map(|(n, v)| ((*n).to_string(), v.clone()))
                        .collect(),
                    unix_now_ms: *unix_now,
                    reported: false,
                };
                let reported = report;
                self.same_through_protocol(
                    &before,
                    t,
                    &input,
                    res.map(|()| Output::Reported { report: reported }),
                    &ev,
                );
                self.read_max_concurrent();
                let expected = if *pool >= self.pools {
                    Err(LeaseError::UnknownPool)
                } else {
                    match id.and_then(|id| self.leases.get(&id)) {
                        None if id.is_some() => Err(LeaseError::UnknownLease),
                        Some(l) if l.life == Life::Ended || l.req.pool.0 != *pool => {
                            Err(LeaseError::UnknownLease)
                        }
                        _ => Ok(()),
                    }
                };
                // A granted lease whose expiry has come is gone as far as callers can
                // tell, though not yet reaped: either answer is consistent.
                let due = id
                    .and_then(|id| self.leases.get(&id))
                    .is_some_and(|l| l.life == Life::Active && l.expires_at <= t.max(before.now()));
                if !(due && expected.is_ok() && res == Err(LeaseError::UnknownLease)) {
                    assert_eq!(res, expected, "handle_response {pool} {id:?}");
                }
                if let Err(e) = res {
                    assert!(ev.is_empty(), "handle_response Err emitted {ev:?}");
                    self.unchanged(&before, "handle_response", e);
                }
                self.events(&ev);
            }
            Op::Timeout => {
                let before = self.coord.clone();
                self.coord.handle_timeout(t);
                let ev = drain(&mut self.coord);
                self.same_through_protocol(
                    &before,
                    t,
                    &Input::Timeout {},
                    Ok(Output::TimedOut),
                    &ev,
                );
                self.events(&ev);
                let once = self.coord.clone();
                self.coord.handle_timeout(t);
                let again = drain(&mut self.coord);
                assert!(
                    again.is_empty(),
                    "handle_timeout({t}) twice: the second call emitted {again:?}"
                );
                assert!(
                    self.coord == once,
                    "handle_timeout({t}) twice: the second call changed the state"
                );
            }
            Op::Step(s) => {
                self.now = match *s {
                    Step::Fwd(d) | Step::Mid(d) | Step::Long(d) => self.now.saturating_add(d),
                    Step::Huge(d) => u64::MAX - d,
                    Step::Back(d) => self.now.saturating_sub(d),
                    Step::BackFar => self.now / 2,
                };
            }
            Op::RoundTrip => {
                let json = self.coord.snapshot_json();
                let restored = Coordinator::restore_json(&json)
                    .unwrap_or_else(|e| panic!("restore of a fresh snapshot: {e}"));
                assert!(restored == self.coord, "restored coordinator differs");
                assert_eq!(
                    restored.snapshot_json(),
                    json,
                    "snapshot of the restored one"
                );
                self.coord = restored;
            }
            Op::Metrics => {
                let m = self.coord.metrics(t);
                assert_eq!(m.now, t.max(self.coord.now()));
                assert_eq!(m.pools.len(), self.pools as usize);
            }
        }
        self.invariants();
    }

    /// A granted lease may be refused as unknown only once its expiry has come.
    fn due(&self, id: LeaseId, t: Millis, what: &str) {
        let e = self.leases[&id].expires_at;
        assert!(
            e <= t.max(self.coord.now()),
            "{what} of live {id} (expires {e}) at {t}: Err(UnknownLease)"
        );
    }

    /// Records a lease id the coordinator just handed out; it must be new.
    fn fresh(&mut self, id: LeaseId, req: LeaseRequest, life: Life) {
        assert!(
            !self.leases.contains_key(&id),
            "{id} handed out again (model: {:?})",
            self.leases[&id].life
        );
        assert!(id.0 < 1 << 53, "{id} beyond 2^53");
        self.leases.insert(
            id,
            Lease {
                life,
                req,
                reserved: None,
                expires_at: Millis::MAX,
            },
        );
        self.issued.push(id);
    }

    fn settled(&mut self, id: LeaseId, u: &Usage, s: &Settlement) {
        self.ended(id, "settled");
        let now = self.coord.now();
        let l = &self.leases[&id];
        let (reserved, req) = (l.reserved, l.req);
        if let (Some(ledger), Some(r)) = (self.ledger.as_mut(), reserved) {
            let got = s.reserved.get(Axis::InputTokens);
            assert_eq!(
                got, r,
                "settle of {id}: reserved input, coordinator vs model"
            );
            let used = s.used.get(Axis::InputTokens);
            // A figure above the axis's limit is clamped to it (one window at most).
            let limit = self.coord.metrics(now).pools[req.pool.0 as usize].axes[0].limit;
            let reported = u.input_tokens + u.cache_creation_input_tokens;
            assert_eq!(
                used,
                limit.map_or(reported, |l| reported.min(l)),
                "used input"
            );
            if r > used {
                ledger.refunds.push((now.0, r - used));
            }
            if req.cached_prefix_tokens > 0
                || u.cache_read_input_tokens > 0
                || u.cache_creation_input_tokens > 0
            {
                let until = now.plus(ledger.cache_ttl);
                ledger.warm.insert(req.agent, until);
            }
        }
    }

    /// Ends the run: reaping what is due and cancelling what is alive, in turn, leaves no
    /// lease alive (each cancelled exactly once).
    fn finish(&mut self) {
        for _ in 0..4 {
            self.apply(&Op::Timeout);
            let live: Vec<LeaseId> = self
                .leases
                .iter()
                .filter(|(_, l)| l.life != Life::Ended)
                .map(|(id, _)| *id)
                .collect();
            for id in live {
                // An earlier cancel may have granted it meanwhile: go through the model.
                if self.life(id) != Some(Life::Ended) {
                    self.apply(&Op::Cancel {
                        target: Target::Forged(id.0),
                    });
                }
            }
        }
        let left: Vec<(&LeaseId, &Lease)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.life != Life::Ended)
            .collect();
        assert!(
            left.is_empty(),
            "leases alive after reaping and cancelling: {left:?}"
        );
        assert_eq!(self.coord.metrics(self.coord.now()).live_leases, 0);
    }
}

/// The admission envelope, which is how the provider itself meters: a token bucket of
/// depth σ = `cap` and rate ρ = `cap / W`.
///
/// (The provider applies it to actual input on arrival. Crediting refunds of
/// over-reservations later, as below, can admit more than the provider would: see the
/// simulation's provider. This property checks the coordinator's own bookkeeping.)
///
/// With `cap = floor(limit × 850 / 1000)` and `W = window_ms`, for every pair of instants
/// `t1 ≤ t2`:
///
/// ```text
/// W × Σ reserved(grants in [t1, t2])
///     ≤ cap × W + cap × (t2 − t1) + W × Σ refunds in [t1, t2] + W × excess
/// ```
///
/// where `excess` is how far the largest grant in `[t1, t2]` exceeds `cap` (0 when none
/// does): a call within the limit but above what the margin hands out is granted from a full
/// bucket and leaves it in debt by that much, and the next one that large needs a full
/// bucket again, so one such excess is all an interval holds.
///
/// where a grant is a `Decision::Grant` or an `Event::Granted` (at the coordinator's clock
/// when it happened) with the input tokens it reserved, and a refund is a positive
/// `reserved − used` of a settle or the whole reservation of a granted lease that was
/// cancelled. A reaped lease keeps its reservation (no refund); so does one still alive.
///
/// Reservations: `Settlement::reserved` is exact (it is what the bucket took), but a lease
/// that is reaped or still alive is never settled, so every reservation is computed at its
/// grant by mirroring the prompt-cache rule (the cached prefix is charged while the agent's
/// cache is cold: never used, or more than `prompt_cache_ttl_ms` since its last settle that
/// involved the cache), splitting a settle's events at the end of its own advance (a grant
/// made before the settle sees the cache as it was). Every settle checks the computed
/// figure against `Settlement::reserved`.
fn check_envelope(ledger: &Ledger, cap: u64, window: u64) {
    let mut at: BTreeMap<u64, (u128, u128)> = BTreeMap::new();
    let mut largest: BTreeMap<u64, u128> = BTreeMap::new();
    for &(t, n) in &ledger.grants {
        at.entry(t).or_default().0 += u128::from(n);
        let l = largest.entry(t).or_default();
        *l = (*l).max(u128::from(n));
    }
    for &(t, n) in &ledger.refunds {
        at.entry(t).or_default().1 += u128::from(n);
    }
    let v: Vec<(u64, u128, u128, u128)> = at
        .into_iter()
        .map(|(t, (g, r))| (t, g, r, largest.get(&t).copied().unwrap_or(0)))
        .collect();
    let (cap, w) = (u128::from(cap), u128::from(window));
    for i in 0..v.len() {
        let (mut granted, mut refunded, mut biggest) = (0u128, 0u128, 0u128);
        for j in i..v.len() {
            granted += v[j].1;
            refunded += v[j].2;
            biggest = biggest.max(v[j].3);
            let span = u128::from(v[j].0 - v[i].0);
            let lhs = granted * w;
            let excess = biggest.saturating_sub(cap);
            let rhs = cap * w + cap * span + w * refunded + w * excess;
            assert!(
                lhs <= rhs,
                "envelope broken over [{}, {}]: granted {granted}, refunded {refunded}, \
                 cap {cap}, W {w}: {lhs} > {rhs}",
                v[i].0,
                v[j].0
            );
        }
    }
}

fn proptest_config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(proptest_config())]

    /// Every input, every error path: the coordinator stays consistent and every lease
    /// ends exactly once.
    #[test]
    fn random_inputs_keep_every_invariant(
        setup in general_setup(),
        ops in prop::collection::vec(op(true), 1..120),
    ) {
        let mut h = Harness::new(&setup.json, setup.scale, None);
        h.invariants();
        for op in &ops {
            h.apply(op);
        }
        h.finish();
    }

    /// Grants never exceed the token-bucket envelope of the effective capacity.
    #[test]
    fn grants_stay_within_the_token_bucket_envelope(
        setup in envelope_setup(),
        ops in prop::collection::vec(op(false), 1..160),
    ) {
        let ledger = Ledger {
            cache_ttl: tokenwarden_core::Config::from_json(&setup.json)
                .expect("valid")
                .prompt_cache_ttl_ms,
            ..Ledger::default()
        };
        let mut h = Harness::new(&setup.json, [setup.limit * 850 / 1000; 2], Some(ledger));
        for op in &ops {
            h.apply(op);
        }
        let cap = setup.limit * 850 / 1000;
        let ledger = h.ledger.take().expect("envelope run");
        check_envelope(&ledger, cap, setup.window_ms);
    }
}
