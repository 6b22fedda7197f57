//! Small calls' waits and fairness in a saturated fleet (issue 41, item 3): a host loop on
//! the core's oldest stable API (`request_lease`, `settle`, `poll_event`, `poll_timeout`)
//! against a simulated provider, so the same file measures any commit since the dominant-
//! share order (copy it into that commit's `core/examples/`). It is self-contained on
//! purpose: its own provider buckets and generator, not the tests' helpers, which differ
//! between commits. Output binds; every fourth call is big. Prints, per run, small and big
//! calls' waits, the binding axis's use, role shares per 15-minute window and the worst
//! Jain index within each role.
//!
//! ```text
//! cargo run --release -p tokenwarden-core --example small_calls             # seeds 1 and 2
//! cargo run --release -p tokenwarden-core --example small_calls -- --seeds 12  # medians
//! ```
#![allow(missing_docs, clippy::all)]
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use tokenwarden_core::*;

const MINUTE: u64 = 60_000;

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

struct Bucket {
    limit: u64,
    level: i128,
    at: u64,
}
impl Bucket {
    fn new(limit: u64) -> Bucket {
        Bucket {
            limit,
            level: i128::from(limit) * i128::from(MINUTE),
            at: 0,
        }
    }
    fn avail(&mut self, now: u64) -> i128 {
        let full = i128::from(self.limit) * i128::from(MINUTE);
        self.level = (self.level + i128::from(now - self.at) * i128::from(self.limit)).min(full);
        self.at = now;
        self.level.div_euclid(i128::from(MINUTE))
    }
    fn take(&mut self, now: u64, n: u64) {
        self.avail(now);
        self.level -= i128::from(n) * i128::from(MINUTE);
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Ask(usize),
    Done(usize, u64),
}

struct Agent {
    prev_big: bool,
    big: bool,
    input: u64,
    used: u64,
    output: u64,
    asked: u64,
    lease: Option<LeaseId>,
    n: u64,
}

fn role_of(a: usize) -> Role {
    match a % 3 {
        0 => Role::Planner,
        1 => Role::Reviewer,
        _ => Role::Worker,
    }
}

/// One run; returns small calls' p50 and p95 waits (s), big calls' p50 (s), the workers'
/// worst 15-minute Jain index and the binding axis's use at steady state (%).
pub fn run(seed: u64, agents: usize, minutes: u64) -> [f64; 5] {
    let (ilim, olim, rlim, clim) = (120_000u64, 12_000u64, 90u64, 10u64);
    let config = Config::from_json(&format!(r#"{{"pools":[{{"name":"p","input_tokens_per_minute":{ilim},"output_tokens_per_minute":{olim},"requests_per_minute":{rlim},"max_concurrent":{clim}}}],"max_queue_wait_ms":600000}}"#)).unwrap();
    let mut c = Coordinator::new(config, seed, Millis(0)).unwrap();
    let mut rng = Lcg(seed);
    let (mut input, mut output, mut reqs) =
        (Bucket::new(ilim), Bucket::new(olim), Bucket::new(rlim));
    let mut in_flight = 0u64;
    let mut rejected = 0u64;
    let mut q: BinaryHeap<Reverse<(u64, u64, Ev)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut ag: Vec<Agent> = (0..agents)
        .map(|_| Agent {
            prev_big: false,
            big: false,
            input: 0,
            used: 0,
            output: 0,
            asked: 0,
            lease: None,
            n: 0,
        })
        .collect();
    let mut tickets: BTreeMap<LeaseId, usize> = BTreeMap::new();
    let end = minutes * MINUTE;
    // (agent, big, asked, sent, output used)
    let mut sent_log: Vec<(usize, bool, u64, u64, u64)> = Vec::new();
    let mut after_big: Vec<u64> = Vec::new();
    let mut after_small: Vec<u64> = Vec::new();
    let mut out_minutes = vec![0u64; minutes as usize + 30];
    for a in 0..agents {
        seq += 1;
        q.push(Reverse((rng.range(0, 2000), seq, Ev::Ask(a))));
    }
    let mut now = 0u64;
    let send = |a: usize,
                now: u64,
                ag: &mut Vec<Agent>,
                c: &mut Coordinator,
                q: &mut BinaryHeap<Reverse<(u64, u64, Ev)>>,
                seq: &mut u64,
                in_flight: &mut u64,
                input: &mut Bucket,
                output: &mut Bucket,
                reqs: &mut Bucket,
                rejected: &mut u64,
                sent_log: &mut Vec<(usize, bool, u64, u64, u64)>| {
        let x = &ag[a];
        let lease = x.lease.unwrap();
        if input.avail(now) < i128::from(x.used)
            || output.avail(now) < 0
            || reqs.avail(now) < 1
            || *in_flight >= clim
        {
            *rejected += 1;
            let r = parse_headers([("retry-after", "1")], None);
            let _ = c.handle_response(Millis(now), PoolId(0), Some(lease), 429, &r);
            let _ = c.settle(Millis(now), lease, &Usage::default());
            *seq += 1;
            q.push(Reverse((now + 1000, *seq, Ev::Ask(a))));
            return;
        }
        input.take(now, x.used);
        reqs.take(now, 1);
        *in_flight += 1;
        sent_log.push((
            a,
            x.big,
            x.asked,
            now,
            x.output + if x.prev_big { 1 << 40 } else { 0 },
        ));
        *seq += 1;
        q.push(Reverse((now + 500 + x.output * 16, *seq, Ev::Done(a, x.n))));
    };
    loop {
        let wake = c.poll_timeout().map(|w| w.0.max(now));
        let next_ev = q.peek().map(|Reverse((t, _, _))| *t);
        let t = match (wake, next_ev) {
            (Some(w), Some(e)) if w < e => w,
            (Some(w), None) => w,
            (_, Some(e)) => e,
            (None, None) => break,
        };
        if next_ev != Some(t) {
            now = now.max(t);
            if now > end + 30 * MINUTE {
                break;
            }
            c.handle_timeout(Millis(now));
            while let Some(e) = c.poll_event() {
                if let Event::Granted { lease, .. } = e {
                    if let Some(a) = tickets.remove(&lease) {
                        send(
                            a,
                            now,
                            &mut ag,
                            &mut c,
                            &mut q,
                            &mut seq,
                            &mut in_flight,
                            &mut input,
                            &mut output,
                            &mut reqs,
                            &mut rejected,
                            &mut sent_log,
                        );
                    }
                }
            }
            continue;
        }
        let Some(Reverse((t, _, ev))) = q.pop() else {
            break;
        };
        // Wake the core on its own schedule first.
        while let Some(w) = c.poll_timeout().filter(|w| w.0 <= t) {
            now = now.max(w.0);
            c.handle_timeout(Millis(now));
            while let Some(e) = c.poll_event() {
                if let Event::Granted { lease, .. } = e {
                    if let Some(a) = tickets.remove(&lease) {
                        send(
                            a,
                            now,
                            &mut ag,
                            &mut c,
                            &mut q,
                            &mut seq,
                            &mut in_flight,
                            &mut input,
                            &mut output,
                            &mut reqs,
                            &mut rejected,
                            &mut sent_log,
                        );
                    }
                }
            }
        }
        now = now.max(t);
        if now > end + 30 * MINUTE {
            break;
        }
        match ev {
            Ev::Ask(a) => {
                if ag[a].lease.is_none() {
                    if now >= end {
                        continue;
                    }
                    let n = ag[a].n + 1;
                    ag[a].n = n;
                    let big = (n + a as u64) % 4 == 0;
                    let inp = if big {
                        rng.range(10_000, 20_000)
                    } else {
                        rng.range(500, 1_000)
                    };
                    let mt = if big { 2_000 } else { 300 };
                    ag[a].prev_big = ag[a].big;
                    ag[a].big = big;
                    ag[a].input = inp;
                    ag[a].used = inp * rng.range(900, 1100) / 1000;
                    ag[a].output = mt * rng.range(300, 1000) / 1000;
                    ag[a].asked = now;
                }
                let mt = if ag[a].big { 2_000 } else { 300 };
                let req = LeaseRequest {
                    agent: AgentId(a as u64 + 1),
                    input_tokens: ag[a].input,
                    max_tokens: mt,
                    role: role_of(a),
                    ..Default::default()
                };
                match c.request_lease(Millis(now), &req).unwrap() {
                    Decision::Grant { lease, .. } => {
                        ag[a].lease = Some(lease);
                        send(
                            a,
                            now,
                            &mut ag,
                            &mut c,
                            &mut q,
                            &mut seq,
                            &mut in_flight,
                            &mut input,
                            &mut output,
                            &mut reqs,
                            &mut rejected,
                            &mut sent_log,
                        );
                    }
                    Decision::Queued { lease, .. } => {
                        ag[a].lease = Some(lease);
                        tickets.insert(lease, a);
                    }
                    _ => {
                        ag[a].lease = None;
                        seq += 1;
                        q.push(Reverse((now + 1000, seq, Ev::Ask(a))));
                    }
                }
            }
            Ev::Done(a, n) => {
                if ag[a].n != n {
                    continue;
                }
                in_flight -= 1;
                output.take(now, ag[a].output);
                let m = (now / MINUTE) as usize;
                if m < out_minutes.len() {
                    out_minutes[m] += ag[a].output;
                }
                let lease = ag[a].lease.take().unwrap();
                let round = |v: i128| ((v.max(0) + 500) / 1000 * 1000).to_string();
                let (ia, oa, ra) = (input.avail(now), output.avail(now), reqs.avail(now));
                let h = [
                    (
                        "anthropic-ratelimit-input-tokens-limit".to_string(),
                        ilim.to_string(),
                    ),
                    (
                        "anthropic-ratelimit-input-tokens-remaining".to_string(),
                        round(ia),
                    ),
                    (
                        "anthropic-ratelimit-output-tokens-limit".to_string(),
                        olim.to_string(),
                    ),
                    (
                        "anthropic-ratelimit-output-tokens-remaining".to_string(),
                        round(oa),
                    ),
                    (
                        "anthropic-ratelimit-requests-limit".to_string(),
                        rlim.to_string(),
                    ),
                    (
                        "anthropic-ratelimit-requests-remaining".to_string(),
                        ra.max(0).to_string(),
                    ),
                ];
                let r = parse_headers(h.iter().map(|(a, b)| (a.as_str(), b.as_str())), None);
                let _ = c.handle_response(Millis(now), PoolId(0), Some(lease), 200, &r);
                let _ = c.settle(
                    Millis(now),
                    lease,
                    &Usage {
                        input_tokens: ag[a].used,
                        output_tokens: ag[a].output,
                        ..Default::default()
                    },
                );
                seq += 1;
                q.push(Reverse((now + rng.range(500, 2000), seq, Ev::Ask(a))));
            }
        }
        while let Some(e) = c.poll_event() {
            if let Event::Granted { lease, .. } = e {
                if let Some(a) = tickets.remove(&lease) {
                    send(
                        a,
                        now,
                        &mut ag,
                        &mut c,
                        &mut q,
                        &mut seq,
                        &mut in_flight,
                        &mut input,
                        &mut output,
                        &mut reqs,
                        &mut rejected,
                        &mut sent_log,
                    );
                }
            }
        }
    }
    let pct = |v: &mut Vec<u64>, p: usize| {
        v.sort_unstable();
        if v.is_empty() {
            0
        } else {
            v[((v.len() * p).div_ceil(100)).clamp(1, v.len()) - 1]
        }
    };
    let mut small: Vec<u64> = sent_log
        .iter()
        .filter(|r| !r.1 && r.3 < end)
        .map(|r| r.3 - r.2)
        .collect();
    for r in sent_log.iter().filter(|r| !r.1 && r.3 < end) {
        if r.4 >> 40 == 1 {
            after_big.push(r.3 - r.2)
        } else {
            after_small.push(r.3 - r.2)
        }
    }
    for r in sent_log.iter_mut() {
        r.4 &= (1 << 40) - 1;
    }
    let mut big: Vec<u64> = sent_log
        .iter()
        .filter(|r| r.1 && r.3 < end)
        .map(|r| r.3 - r.2)
        .collect();
    let steady: f64 = out_minutes[3..minutes as usize].iter().sum::<u64>() as f64
        / ((minutes - 3) as f64 * olim as f64);
    let mut worst_jain = [1.0f64; 3];
    let mut shares = [[0.0f64; 3]; 0].to_vec();
    let mut w = 3 * MINUTE;
    while w + 15 * MINUTE <= end {
        let mut per = vec![0u64; agents];
        for r in &sent_log {
            if r.3 >= w && r.3 < w + 15 * MINUTE {
                per[r.0] += r.4;
            }
        }
        let total: u64 = per.iter().sum();
        let mut sh = [0.0; 3];
        for k in 0..3 {
            let mine: Vec<f64> = (0..agents)
                .filter(|a| a % 3 == k)
                .map(|a| per[a] as f64)
                .collect();
            let s: f64 = mine.iter().sum();
            let sq: f64 = mine.iter().map(|x| x * x).sum();
            worst_jain[k] = worst_jain[k].min(s * s / (mine.len() as f64 * sq));
            sh[k] = s / total as f64;
        }
        shares.push(sh);
        w += 15 * MINUTE;
    }
    let calls = sent_log.iter().filter(|r| r.3 < end).count();
    let headline = [
        pct(&mut small.clone(), 50) as f64 / 1000.0,
        pct(&mut small.clone(), 95) as f64 / 1000.0,
        pct(&mut big.clone(), 50) as f64 / 1000.0,
        worst_jain[2],
        steady * 100.0,
    ];
    eprintln!(
        "  small after a big call: n {} p50 {:.1} s p95 {:.1} s; after a small call: n {} p50 {:.1} s p95 {:.1} s",
        after_big.len(),
        pct(&mut after_big, 50) as f64 / 1000.0,
        pct(&mut after_big, 95) as f64 / 1000.0,
        after_small.len(),
        pct(&mut after_small, 50) as f64 / 1000.0,
        pct(&mut after_small, 95) as f64 / 1000.0
    );
    eprintln!(
        "seed {seed}, {agents} agents, {minutes} min: {calls} calls, {rejected} 429s, output (binding) {:.1} %; small p50 {:.1} s p95 {:.1} s; big p50 {:.1} s p95 {:.1} s",
        steady * 100.0,
        pct(&mut small, 50) as f64 / 1000.0,
        pct(&mut small, 95) as f64 / 1000.0,
        pct(&mut big, 50) as f64 / 1000.0,
        pct(&mut big, 95) as f64 / 1000.0
    );
    for (i, sh) in shares.iter().enumerate() {
        eprintln!(
            "  window {i}: output shares planner/reviewer/worker {:.1} / {:.1} / {:.1} % (weights 50 / 33.3 / 16.7)",
            sh[0] * 100.0,
            sh[1] * 100.0,
            sh[2] * 100.0
        );
    }
    eprintln!(
        "  Jain within role, worst 15-min window: {:.3} / {:.3} / {:.3}",
        worst_jain[0], worst_jain[1], worst_jain[2]
    );
    headline
}

fn main() {
    // `--seeds N`: N seeds of each fleet (30 agents: seeds 1..=N; 45 agents: 101..=100+N)
    // and the medians over them. One seed's figures move by more than many a change makes.
    let args: Vec<String> = std::env::args().collect();
    let seeds = match args.get(1).map(String::as_str) {
        None => 0,
        Some("--seeds") => args
            .get(2)
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|n| *n > 0)
            .expect("--seeds takes a count of at least 1"),
        Some(other) => panic!("unknown argument {other:?} (usage: small_calls [--seeds N])"),
    };
    if seeds == 0 {
        for (seed, agents) in [(1, 30), (2, 45)] {
            run(seed, agents, 33);
        }
        return;
    }
    for (agents, first) in [(30, 1), (45, 101)] {
        let mut runs: Vec<[f64; 5]> = (first..first + seeds).map(|s| run(s, agents, 33)).collect();
        let median = |k: usize, runs: &mut Vec<[f64; 5]>| {
            runs.sort_by(|a, b| a[k].total_cmp(&b[k]));
            let n = runs.len();
            (runs[(n - 1) / 2][k] + runs[n / 2][k]) / 2.0
        };
        println!(
            "{agents} agents, {seeds} seeds, medians: small calls p50 {:.1} s p95 {:.1} s, big calls p50 {:.1} s, workers' worst 15-min Jain {:.3}, binding axis {:.1} %",
            median(0, &mut runs),
            median(1, &mut runs),
            median(2, &mut runs),
            median(3, &mut runs),
            median(4, &mut runs)
        );
    }
}
