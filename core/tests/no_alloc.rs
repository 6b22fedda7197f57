//! The steady-state grant + settle path performs no heap allocation.
//!
//! A counting global allocator wraps the system one. The counter is thread-local, so
//! other tests running in parallel threads of this binary cannot disturb the count.

// Implementing `GlobalAlloc` needs `unsafe`; the wrapper only forwards to `System`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use tokenwarden_core::{
    AgentId, Call, Config, Coordinator, Decision, HeaderReport, LeaseRequest, LeaseStep, Millis,
    PoolId, ResponseStep, Role, Usage,
};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the slot may be gone while the thread is being torn down.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `GlobalAlloc::alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller upholds `GlobalAlloc::dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations (including reallocations) made by this thread so far.
fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

const AGENTS: u64 = 6;

/// Agent `i`'s request: mixed roles, some with a cached prefix, one repeating a failure.
fn request(i: u64) -> LeaseRequest {
    let agent = i % AGENTS;
    LeaseRequest {
        agent: AgentId(agent),
        input_tokens: 1_000 + 250 * agent,
        cached_prefix_tokens: if agent % 2 == 0 { 4_096 } else { 0 },
        max_tokens: 2_000,
        role: match agent % 3 {
            0 => Role::Planner,
            1 => Role::Reviewer,
            _ => Role::Worker,
        },
        unblocks: u32::try_from(agent).unwrap(),
        failure_signature: (agent == 5).then_some(0xdead_beef),
        ..Default::default()
    }
}

/// One grant + settle at `now`; returns how many events it produced (drained).
fn grant_settle(c: &mut Coordinator, now: u64, i: u64) -> usize {
    let req = request(i);
    let lease = match c.request_lease(Millis(now), &req).unwrap() {
        Decision::Grant { lease, .. } => lease,
        other => panic!("expected a grant at {now}, got {other:?}"),
    };
    let usage = Usage {
        // Agent 3 misses its estimates for sixteen calls, then hits them for sixteen, so
        // the median of its errors keeps raising (and clearing) estimate alerts: the event
        // queue is exercised too.
        input_tokens: if req.agent == AgentId(3) && (i / AGENTS) % 32 < 16 {
            req.input_tokens * 3
        } else {
            req.input_tokens
        },
        cache_read_input_tokens: req.cached_prefix_tokens,
        output_tokens: 100 + i % 900,
        ..Default::default()
    };
    c.settle(Millis(now), lease, &usage).unwrap();
    let mut events = 0;
    while c.poll_event().is_some() {
        events += 1;
    }
    events
}

/// Steady-state grant + settle allocates nothing once every buffer has reached its size.
#[test]
fn steady_state_grant_settle_does_not_allocate() {
    // A small lease table, so the expiry queue (compacted at 2 × max_leases + 16 entries)
    // reaches its final capacity quickly; a short TTL, so stale expiry entries are also
    // popped by time; a few metrics minutes, so the minute ring wraps during the run.
    let config = Config::from_json(
        r#"{"pools":[{"name":"p","input_tokens_per_minute":100000000,
            "output_tokens_per_minute":100000000,"requests_per_minute":1000000,
            "max_concurrent":8}],
            "max_leases":4,"lease_ttl_ms":500,"metrics_minutes":3,
            "prompt_cache_ttl_ms":2000}"#,
    )
    .unwrap();
    let mut c = Coordinator::new(config, 7, Millis(0)).unwrap();

    // Warm-up: every agent seen, every buffer grown (expiry queue compacted many times).
    let mut now = 0;
    let mut i = 0;
    for _ in 0..2_000 {
        now += 1;
        i += 1;
        grant_settle(&mut c, now, i);
    }

    // Measured: long enough to cross several minute boundaries (the ring wraps) and many
    // cache expiries, time advancing 37 ms per call.
    let before = allocations();
    let mut events = 0;
    for _ in 0..20_000 {
        now += 37;
        i += 1;
        events += grant_settle(&mut c, now, i);
    }
    let allocated = allocations() - before;

    assert!(events > 0, "the run should raise some estimate alerts");
    assert_eq!(
        allocated, 0,
        "steady-state grant + settle allocated {allocated} times in 20000 iterations"
    );
    c.check().unwrap();
}

/// The call lifecycle's steps on the same steady state allocate nothing either: a call
/// asks, is sent, meets a 429 every fourth time (retried after the core's wait) and is
/// delivered and settled otherwise.
#[test]
fn steady_state_call_steps_do_not_allocate() {
    let config = Config::from_json(
        r#"{"pools":[{"name":"p","input_tokens_per_minute":100000000,
            "output_tokens_per_minute":100000000,"requests_per_minute":1000000,
            "max_concurrent":8}],
            "max_leases":4,"lease_ttl_ms":500,"metrics_minutes":3,
            "prompt_cache_ttl_ms":2000,"feedback":{"max_pause_ms":1}}"#,
    )
    .unwrap();
    let mut c = Coordinator::new(config, 7, Millis(0)).unwrap();
    let ok = HeaderReport::default();
    let limited = tokenwarden_core::parse_headers([("retry-after-ms", "1")], None);
    let step = |c: &mut Coordinator, now: &mut u64, i: u64| {
        let req = request(i);
        let mut call = Call::new();
        loop {
            *now += 3;
            let lease = match c.call_lease(Millis(*now), &mut call, &req).unwrap() {
                LeaseStep::Send { lease, .. } => lease,
                other => panic!("expected send at {now}, got {other:?}"),
            };
            let (status, report) = if i % 4 == 0 && call.failed == 0 {
                (429, &limited)
            } else {
                (200, &ok)
            };
            let answer = c
                .call_response(
                    Millis(*now),
                    &mut call,
                    PoolId(0),
                    Some(lease),
                    status,
                    report,
                )
                .unwrap();
            match answer.step {
                ResponseStep::Deliver => {
                    let usage = Usage {
                        input_tokens: req.input_tokens,
                        output_tokens: 100 + i % 900,
                        ..Default::default()
                    };
                    c.settle(Millis(*now), lease, &usage).unwrap();
                    break;
                }
                ResponseStep::Wait(wait) => *now = (*now).max(wait.until.0),
                ResponseStep::GiveUp(g) => panic!("gave up: {g:?}"),
            }
        }
        while c.poll_event().is_some() {}
    };
    let (mut now, mut i) = (0, 0);
    for _ in 0..2_000 {
        i += 1;
        step(&mut c, &mut now, i);
    }
    let before = allocations();
    for _ in 0..20_000 {
        i += 1;
        step(&mut c, &mut now, i);
    }
    let allocated = allocations() - before;
    assert_eq!(
        allocated, 0,
        "steady-state call steps allocated {allocated} times in 20000 calls"
    );
    c.check().unwrap();
}
