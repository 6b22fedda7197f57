//! The report: a markdown table per scenario, the goals checked against the figures, and
//! SVG charts (per-minute usage against each limit; 429s over the agents' turns).

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use tokenwarden_core::Role;

use super::{RunResult, Scenario, Strategy};

/// One goal, checked.
#[derive(Clone, Debug)]
pub struct Goal {
    /// What was asked.
    pub what: String,
    /// What was measured.
    pub measured: String,
    /// Whether it holds.
    pub met: bool,
}

fn find(results: &[RunResult], s: Strategy) -> Option<&RunResult> {
    results.iter().find(|r| r.strategy == s)
}

/// "429s of calls (rate)".
fn rate_limited(r: &RunResult) -> String {
    format!(
        "{} of {} ({})",
        r.rate_limited,
        r.sent,
        pct(r.rate_limited_ratio())
    )
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// The goals of a scenario, evaluated on its results.
pub fn goals(sc: &Scenario, results: &[RunResult]) -> Vec<Goal> {
    let mut g = Vec::new();
    let mut push = |what: &str, measured: String, met: bool| {
        g.push(Goal {
            what: what.to_string(),
            measured,
            met,
        })
    };
    let e = find(results, Strategy::Coordinator);
    match sc.name {
        "seed003" | "seed003-tight" | "outsider" => {
            let (Some(e), Some(a), Some(b)) = (
                e,
                find(results, Strategy::Backoff),
                find(results, Strategy::SdkDefaults),
            ) else {
                return g;
            };
            if sc.name == "outsider" {
                let floor = e.margin_floor;
                let min = e.min_margin.unwrap_or(floor);
                push(
                    "margin never below its floor",
                    format!(
                        "lowest margin {:.1}% (floor {:.1}%)",
                        f64::from(min) / 10.0,
                        f64::from(floor) / 10.0
                    ),
                    min >= floor,
                );
                let d = find(results, Strategy::CoordinatorEqual);
                let m = d.and_then(|d| d.min_margin).unwrap_or(floor);
                push(
                    "(d) margin never below its floor",
                    format!("lowest margin {:.1}%", f64::from(m) / 10.0),
                    m >= floor,
                );
                return g;
            }
            push(
                "coordinator 429s <= 0.1% of requests",
                rate_limited(e),
                e.rate_limited_ratio() <= 0.001,
            );
            let tpt = |r: &RunResult| r.tokens_per_task().unwrap_or(f64::INFINITY);
            let best_ab = tpt(a).min(tpt(b));
            push(
                "tokens per finished task >= 30% below (a) and (b)",
                format!(
                    "{:.0} vs (a) {:.0}, (b) {:.0}: {:.0}% below the better",
                    tpt(e),
                    tpt(a),
                    tpt(b),
                    (1.0 - tpt(e) / best_ab) * 100.0
                ),
                tpt(e) <= 0.7 * best_ab,
            );
            let p95 = |r: &RunResult| r.task_time_s(950).unwrap_or(f64::INFINITY);
            let best = p95(a).min(p95(b));
            push(
                "p95 task time >= 2x better than (a) and (b)",
                format!(
                    "{:.0} s vs (a) {:.0} s, (b) {:.0} s: {:.1}x",
                    p95(e),
                    p95(a),
                    p95(b),
                    best / p95(e)
                ),
                p95(e) * 2.0 <= best,
            );
            let lowest = results
                .iter()
                .map(RunResult::critical_path_wait)
                .min()
                .unwrap_or(0);
            push(
                "critical-path wait lowest with (e)",
                format!(
                    "(e) {:.0} agent-s; others {}",
                    e.critical_path_wait() as f64 / 1000.0,
                    results
                        .iter()
                        .filter(|r| r.strategy != Strategy::Coordinator)
                        .map(|r| format!("{:.0}", r.critical_path_wait() as f64 / 1000.0))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                e.critical_path_wait() <= lowest,
            );
        }
        "saturate" => {
            let Some(e) = e else { return g };
            let (axis, share) = e.binding_share(2);
            push(
                ">= 97% of the binding limit (after minute 2)",
                format!("{} at {}", axis, pct(share)),
                share >= 0.97,
            );
            push(
                "<= 0.1% 429s",
                rate_limited(e),
                e.rate_limited_ratio() <= 0.001,
            );
        }
        "overreserve" => {
            let Some(e) = e else { return g };
            let (_, o, _) = e.shares(2);
            push(
                ">= 90% of output tokens/min (after minute 2)",
                pct(o),
                o >= 0.9,
            );
        }
        "noisy" => {
            let Some(e) = e else { return g };
            push(
                "<= 1% 429s",
                rate_limited(e),
                e.rate_limited_ratio() <= 0.01,
            );
        }
        "headers-only" => {
            let Some(e) = e else { return g };
            let second = e
                .minutes
                .get(1)
                .map_or(0.0, |m| m.input as f64 / e.limits.input_tpm as f64);
            let margin = e
                .minutes
                .get(1)
                .and_then(|m| m.margin)
                .map_or(1.0, |m| f64::from(m) / 1000.0);
            push(
                ">= 90% of the input limit within two windows (minute 2)",
                format!(
                    "{} of the real limit; {} of what the margin ({}) allows",
                    pct(second),
                    pct(second / margin),
                    pct(margin)
                ),
                second >= 0.9,
            );
        }
        "mixed" => {
            let Some(e) = e else { return g };
            let calls = call_waits(sc, e);
            let over = calls.iter().filter(|c| c.waited_ms > c.bound_ms).count();
            let worst = calls
                .iter()
                .map(|c| c.waited_ms as f64 / c.bound_ms.max(1) as f64)
                .fold(0.0, f64::max);
            push(
                "no call waits past its bound (e)",
                format!(
                    "{over} of {} calls over; longest wait {:.0}% of its bound",
                    calls.len(),
                    worst * 100.0
                ),
                over == 0,
            );
            // Small calls run a lead ahead of their agent's share (weights.small_lead_permille):
            // against the same seed without it, their tail must fall well below and big
            // calls' rise by at most a third (a trade the default is chosen for).
            let (big, small) = p95_wait_per_token(sc, e);
            let without = Scenario {
                small_lead_permille: 0,
                ..sc.clone()
            };
            let (big0, small0) = p95_wait_per_token(
                &without,
                &super::run(&without, Strategy::Coordinator, e.seed),
            );
            push(
                "small calls not taxed, big ones not starved (e): p95 wait per token against the order without the small-call lead, small <= 0.6x, big <= 1.35x",
                format!(
                    "small {small:.2} vs {small0:.2} ms per token ({:.2}x); big {big:.2} vs {big0:.2} ({:.2}x)",
                    small / small0.max(f64::MIN_POSITIVE),
                    big / big0.max(f64::MIN_POSITIVE)
                ),
                small <= 0.6 * small0 && big <= 1.35 * big0,
            );
            let jains = role_jain(sc, e);
            let lowest = jains.iter().map(|(_, j)| *j).fold(1.0, f64::min);
            push(
                "Jain within each role >= 0.95 (e), over tokens served",
                jains
                    .iter()
                    .map(|(role, j)| format!("{role} {j:.3}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                lowest >= 0.95,
            );
            push("0 429s (e)", rate_limited(e), e.rate_limited == 0);
        }
        "estimator" => {
            let Some(e) = e else { return g };
            push(
                "<= 1% 429s (e), leasing by the product's estimates",
                rate_limited(e),
                e.rate_limited_ratio() <= 0.01,
            );
            let mut err: Vec<f64> = e.estimates.iter().map(|x| x.input_error()).collect();
            let (p50, p95) = (percentile(&mut err, 500), percentile(&mut err, 950));
            push(
                "median input-estimate error the core measured <= 10% (e)",
                format!(
                    "median {}, p95 {} over {} settled calls",
                    pct(p50),
                    pct(p95),
                    err.len()
                ),
                !err.is_empty() && p50 <= 0.10,
            );
        }
        "fairness" => {
            let Some(e) = e else { return g };
            push(
                "Jain fairness >= 0.95 (e)",
                format!("{:.3}", e.jain()),
                e.jain() >= 0.95,
            );
        }
        "weights" => {
            let Some(e) = e else { return g };
            let total: u64 = e.tenant_tokens.iter().sum();
            let shares: Vec<f64> = e
                .tenant_tokens
                .iter()
                .map(|&t| t as f64 / total.max(1) as f64)
                .collect();
            let want = [1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0];
            let ok = shares.iter().zip(want).all(|(s, w)| (s - w).abs() <= 0.05);
            push(
                "shares within +-5 points of 1/7, 2/7, 4/7",
                shares
                    .iter()
                    .map(|s| pct(*s))
                    .collect::<Vec<_>>()
                    .join(" / "),
                ok,
            );
        }
        _ => {}
    }
    g
}

/// One admitted call with the wait bound the core documents for it.
struct CallWait {
    role: Role,
    big: bool,
    /// Input + `max_tokens`.
    size: u64,
    waited_ms: u64,
    bound_ms: u64,
}

/// The weight the coordinator gives an agent under the run's strategy, thousandths.
fn weight_of(sc: &Scenario, strategy: Strategy, agent: usize) -> u64 {
    let (planner, reviewer, worker) = sc.weights;
    let role = if strategy == Strategy::Coordinator {
        sc.agents[agent].role
    } else {
        Role::Worker
    };
    u64::from(match role {
        Role::Planner => planner,
        Role::Reviewer => reviewer,
        // No scenario's agent leaves its role to the core (`auto` weighs as a worker
        // without a family at work).
        Role::Worker | Role::Auto => worker,
    })
}

/// Every admitted call with its bound (`Coordinator::request_lease`'s doc):
/// `(S + Σᵢ (S·wᵢ/w + sᵢ)) / R`, S its reservation (+1), w its weight, the sum over every
/// other agent (weight wᵢ, largest call sᵢ of the run), R the input limit × the margin
/// ceiling per ms.
/// The p95 wait per token of a run's big calls and of its small ones, ms.
pub fn p95_wait_per_token(sc: &Scenario, r: &RunResult) -> (f64, f64) {
    let calls = call_waits(sc, r);
    let per_token = |big: bool| {
        let mut v: Vec<f64> = calls
            .iter()
            .filter(|c| c.big == big)
            .map(|c| c.waited_ms as f64 / c.size as f64)
            .collect();
        percentile(&mut v, 950)
    };
    (per_token(true), per_token(false))
}

fn call_waits(sc: &Scenario, r: &RunResult) -> Vec<CallWait> {
    let n = sc.agents.len();
    let mut largest = vec![0u64; n];
    for c in &r.calls {
        largest[c.agent] = largest[c.agent].max(c.input + c.max_tokens);
    }
    let rate_per_s = sc.limits.input_tpm * u64::from(sc.margin_ceiling) / 1000 / 60;
    r.calls
        .iter()
        .map(|c| {
            let size = c.input + c.max_tokens + 1;
            let w = weight_of(sc, r.strategy, c.agent).max(1);
            let others: u64 = (0..n)
                .filter(|j| *j != c.agent)
                .map(|j| size * weight_of(sc, r.strategy, j) / w + largest[j])
                .sum();
            CallWait {
                role: sc.agents[c.agent].role,
                big: c.input >= 10_000,
                size,
                waited_ms: c.waited_ms,
                bound_ms: (size + others) * 1000 / rate_per_s.max(1),
            }
        })
        .collect()
}

/// A percentile (thousandths) of `v`, sorted in place; 0 when empty.
fn percentile(v: &mut [f64], permille: usize) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() * permille).div_ceil(1000)).clamp(1, v.len()) - 1]
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Planner => "planner",
        Role::Reviewer => "reviewer",
        Role::Worker => "worker",
        Role::Auto => "auto",
    }
}

/// Jain's index over the tokens each agent was served, within each role present.
fn role_jain(sc: &Scenario, r: &RunResult) -> Vec<(&'static str, f64)> {
    [Role::Planner, Role::Reviewer, Role::Worker]
        .into_iter()
        .filter_map(|role| {
            let x: Vec<f64> = (0..sc.agents.len())
                .filter(|&i| sc.agents[i].role == role)
                .map(|i| r.agent_tokens[i] as f64)
                .collect();
            if x.is_empty() {
                return None;
            }
            let sum: f64 = x.iter().sum();
            let sq: f64 = x.iter().map(|v| v * v).sum();
            Some((
                role_name(role),
                if sq == 0.0 {
                    1.0
                } else {
                    sum * sum / (x.len() as f64 * sq)
                },
            ))
        })
        .collect()
}

/// Waits per size class and role, against the bound: the `mixed` scenario's table.
pub fn waits_table(sc: &Scenario, r: &RunResult) -> String {
    let calls = call_waits(sc, r);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Waits under {}, from a call's first ask to its admission, against the bound the core documents for it (`Coordinator::request_lease`):\n",
        r.strategy.label()
    );
    let _ = writeln!(
        s,
        "| calls | role | n | p50 wait | p95 wait | max wait | p95 wait per token | longest wait / its bound |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|");
    for big in [false, true] {
        for role in [Role::Planner, Role::Reviewer, Role::Worker] {
            let class: Vec<&CallWait> = calls
                .iter()
                .filter(|c| c.big == big && c.role == role)
                .collect();
            if class.is_empty() {
                continue;
            }
            let mut w: Vec<f64> = class.iter().map(|c| c.waited_ms as f64 / 1000.0).collect();
            let mut per: Vec<f64> = class
                .iter()
                .map(|c| c.waited_ms as f64 / c.size as f64)
                .collect();
            let worst = class
                .iter()
                .map(|c| c.waited_ms as f64 / c.bound_ms.max(1) as f64)
                .fold(0.0, f64::max);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.1} s | {:.1} s | {:.1} s | {:.2} ms | {:.0}% |",
                if big { "big (15-20k)" } else { "small (1-2k)" },
                role_name(role),
                class.len(),
                percentile(&mut w, 500),
                percentile(&mut w, 950),
                percentile(&mut w, 1000),
                percentile(&mut per, 950),
                worst * 100.0
            );
        }
    }
    s
}

/// The product estimator's figures in a scenario that runs it: its error against the
/// provider's exact counts, as the core measured it and over the whole prompt.
pub fn estimates_table(r: &RunResult) -> String {
    let mut s = String::new();
    let n = r.estimates.len();
    let _ = writeln!(
        s,
        "Estimates by the product's estimator (`{}`) under {}, against the provider's exact counts, over the {n} settled calls:\n",
        r.estimator.as_deref().unwrap_or("?"),
        r.strategy.label()
    );
    let _ = writeln!(s, "| error | median | p95 | max |\n|---|---:|---:|---:|");
    let mut row = |what: &str, mut v: Vec<f64>| {
        let _ = writeln!(
            s,
            "| {what} | {} | {} | {} |",
            pct(percentile(&mut v, 500)),
            pct(percentile(&mut v, 950)),
            pct(percentile(&mut v, 1000))
        );
    };
    row(
        "input the core measured: \\|reserved − used\\| / used, input tokens/min axis (uncached input + cache writes), from each `settle`",
        r.estimates.iter().map(|x| x.input_error()).collect(),
    );
    row(
        "whole prompt: \\|(inputTokens + cachedPrefixTokens) − every prompt token\\| / every prompt token",
        r.estimates.iter().map(|x| x.prompt_error()).collect(),
    );
    row(
        "the core's per-agent moving average at the end (`metrics().agents[].input_error_permille`), over agents",
        r.agent_input_error_permille
            .iter()
            .map(|&p| f64::from(p) / 1000.0)
            .collect(),
    );
    let under = r
        .estimates
        .iter()
        .filter(|x| x.reserved_input < x.used_input)
        .count();
    let prompt: u64 = r.estimates.iter().map(|x| x.prompt).sum();
    let read: u64 = r.estimates.iter().map(|x| x.cache_read).sum();
    let (input, _, _) = r.shares(1);
    let _ = writeln!(
        s,
        "\n{under} of {n} calls reserved fewer input tokens than they used; cache reads were {} of all prompt tokens; {} of the input limit used (after minute 1); {} 429s.",
        pct(read as f64 / prompt.max(1) as f64),
        pct(input),
        r.rate_limited
    );
    s
}

/// The markdown table of one scenario.
pub fn table(sc: &Scenario, results: &[RunResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| strategy | calls sent | 429s | 429 rate | broken turns | binding limit used | tokens / finished task (against the limits) | tasks (+ running) | p50 task | p95 task | critical-path wait | Jain | grants from queue |"
    );
    let _ = writeln!(
        s,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in results {
        let (axis, share) = r.binding_share(1);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} of {} | {} | {} (+{}) | {} | {} | {:.0} agent-s | {:.3} | {} |",
            r.strategy.label(),
            r.sent,
            r.rate_limited,
            pct(r.rate_limited_ratio()),
            r.broken_turns,
            pct(share),
            axis,
            tokens_cell(r.tokens_per_task(), r.limited_tokens_per_task()),
            r.tasks_finished,
            r.tasks_unfinished,
            r.task_time_s(500)
                .map_or("-".into(), |t| format!("{t:.0} s")),
            r.task_time_s(950)
                .map_or("-".into(), |t| format!("{t:.0} s")),
            r.critical_path_wait() as f64 / 1000.0,
            r.jain(),
            if r.strategy.uses_coordinator() {
                r.granted_from_queue.to_string()
            } else {
                "-".into()
            },
        );
    }
    // The coordinator strategies' four numbers above are the product's; the simulator's
    // own bookkeeping of the same runs, for comparison.
    let coordinated: Vec<&RunResult> = results.iter().filter(|r| r.product.is_some()).collect();
    if !coordinated.is_empty() && matches!(sc.name, "seed003" | "seed003-tight") {
        let _ = writeln!(
            s,
            "\nThe 429 rate, tokens per finished task, task times and critical-path wait of (d) and (e) are the product's `metrics().tasks` at the end of the run. The simulator's own bookkeeping of the same runs:\n\n| strategy | 429 rate | tokens / finished task (against the limits) | p50 task | p95 task | critical-path wait |\n|---|---:|---:|---:|---:|---:|"
        );
        for r in coordinated {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {:.0} agent-s |",
                r.strategy.label(),
                pct(r.own_rate_limited_ratio()),
                tokens_cell(r.own_tokens_per_task(), r.own_limited_tokens_per_task()),
                r.own_task_time_s(500)
                    .map_or("-".into(), |t| format!("{t:.0} s")),
                r.own_task_time_s(950)
                    .map_or("-".into(), |t| format!("{t:.0} s")),
                r.critical_path_wait_ms as f64 / 1000.0,
            );
        }
    }
    s
}

/// Tokens per finished task with the part counted against the limits beside it: `-` with
/// no task finished.
fn tokens_cell(total: Option<f64>, limited: Option<f64>) -> String {
    match (total, limited) {
        (Some(t), Some(l)) => format!("{t:.0} ({l:.0})"),
        (Some(t), None) => format!("{t:.0}"),
        _ => "-".into(),
    }
}

/// Per-minute usage against each limit (as % of the real limit), with 429 counts as bars.
pub fn usage_svg(r: &RunResult) -> String {
    let (w, h, left, top, bottom) = (720.0, 320.0, 50.0, 30.0, 60.0);
    let n = r.minutes.len().max(1) as f64;
    let plot_h = h - top - bottom;
    let plot_w = w - left - 20.0;
    // At least 150 %, and high enough for the busiest minute (the first can pass 100 %: the
    // buckets start full), in steps of 50 %.
    let highest = r
        .minutes
        .iter()
        .flat_map(|m| {
            [
                m.input as f64 / r.limits.input_tpm.max(1) as f64,
                m.output as f64 / r.limits.output_tpm.max(1) as f64,
                m.requests as f64 / r.limits.rpm.max(1) as f64,
            ]
        })
        .fold(1.5, f64::max);
    let max_pct = (highest * 2.0).ceil() / 2.0;
    let x = |i: f64| left + i / n * plot_w;
    let y = |p: f64| top + plot_h - (p.min(max_pct) / max_pct) * plot_h;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{left}" y="18" font-size="13">{} / {}: usage per minute, % of each real limit</text>"#,
        r.scenario,
        r.strategy.label()
    );
    let max_rl = r
        .minutes
        .iter()
        .map(|m| m.rate_limited)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    for (i, m) in r.minutes.iter().enumerate() {
        if m.rate_limited > 0 {
            let bh = m.rate_limited as f64 / max_rl * plot_h * 0.5;
            let _ = write!(
                s,
                r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#e33" opacity="0.35"/>"##,
                x(i as f64),
                top + plot_h - bh,
                plot_w / n,
                bh
            );
        }
    }
    // Minutes along the x axis: a label every `step` minutes, at most a dozen.
    let minutes = r.minutes.len();
    let step = [1, 2, 5, 10, 15, 20, 30, 60]
        .into_iter()
        .find(|s| minutes / s <= 12)
        .unwrap_or(120);
    for i in (0..=minutes).step_by(step) {
        let _ = write!(
            s,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1:.1}" y2="{2:.1}" stroke="#999"/><text x="{0:.1}" y="{3:.1}" text-anchor="middle">{i}</text>"##,
            x(i as f64),
            top + plot_h,
            top + plot_h + 4.0,
            top + plot_h + 16.0,
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="end">minute</text>"#,
        left + plot_w,
        top + plot_h + 30.0
    );
    let grid: Vec<f64> = (0..=(max_pct * 2.0) as usize)
        .map(|k| k as f64 / 2.0)
        .collect();
    for p in grid {
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#ccc"/><text x="4" y="{:.1}">{:.0}%</text>"##,
            left + plot_w,
            y(p),
            y(p),
            y(p) + 4.0,
            p * 100.0
        );
    }
    type Series<'a> = (&'a str, &'a str, Box<dyn Fn(&super::Minute) -> f64 + 'a>);
    let series: [Series; 3] = [
        (
            "input tokens",
            "#1f77b4",
            Box::new(|m| m.input as f64 / r.limits.input_tpm as f64),
        ),
        (
            "output tokens",
            "#2ca02c",
            Box::new(|m| m.output as f64 / r.limits.output_tpm as f64),
        ),
        (
            "requests",
            "#9467bd",
            Box::new(|m| m.requests as f64 / r.limits.rpm as f64),
        ),
    ];
    for (k, (name, color, f)) in series.iter().enumerate() {
        let pts: Vec<String> = r
            .minutes
            .iter()
            .enumerate()
            .map(|(i, m)| format!("{:.1},{:.1}", x(i as f64 + 0.5), y(f(m))))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{}"/>"#,
            pts.join(" ")
        );
        let lx = left + 10.0 + k as f64 * 130.0;
        let _ = write!(
            s,
            r#"<rect x="{lx}" y="{}" width="10" height="10" fill="{color}"/><text x="{}" y="{}">{name}</text>"#,
            h - 18.0,
            lx + 14.0,
            h - 9.0
        );
    }
    if r.minutes.iter().any(|m| m.margin.is_some()) {
        let pts: Vec<String> = r
            .minutes
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                m.margin
                    .map(|mg| format!("{:.1},{:.1}", x(i as f64 + 0.5), y(f64::from(mg) / 1000.0)))
            })
            .collect();
        let _ = write!(
            s,
            r##"<polyline fill="none" stroke="#ff7f0e" stroke-dasharray="4 3" stroke-width="1.5" points="{}"/>"##,
            pts.join(" ")
        );
        let lx = left + 10.0 + 3.0 * 130.0;
        let _ = write!(
            s,
            r##"<rect x="{lx}" y="{}" width="10" height="10" fill="#ff7f0e"/><text x="{}" y="{}">margin</text>"##,
            h - 18.0,
            lx + 14.0,
            h - 9.0
        );
    }
    let lx = left + 10.0 + 4.0 * 130.0;
    let _ = write!(
        s,
        r##"<rect x="{lx}" y="{}" width="10" height="10" fill="#e33" opacity="0.35"/><text x="{}" y="{}">429s</text>"##,
        h - 18.0,
        lx + 14.0,
        h - 9.0
    );
    s.push_str("</svg>\n");
    s
}

/// The overlay the write-up asks for: each agent's turn starts as ticks on its row, 429s
/// as red lines across all rows, over the first `minutes` minutes.
pub fn overlay_svg(r: &RunResult, agents: &[String], minutes: u64) -> String {
    let rows = agents.len().max(1) as f64;
    let (w, left, top) = (900.0, 90.0, 30.0);
    let row_h = 12.0;
    let h = top + rows * row_h + 40.0;
    let span = (minutes * 60_000) as f64;
    let plot_w = w - left - 20.0;
    let x = |t: u64| left + t as f64 / span * plot_w;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="10">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{left}" y="18" font-size="13">{} / {}: turn starts (ticks) and 429s (red), first {minutes} min</text>"#,
        r.scenario,
        r.strategy.label()
    );
    for &t in r.rate_limit_times.iter().filter(|&&t| (t as f64) < span) {
        let _ = write!(
            s,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{top}" y2="{1:.1}" stroke="#e33" stroke-opacity="0.25"/>"##,
            x(t),
            top + rows * row_h
        );
    }
    for (i, name) in agents.iter().enumerate() {
        let yy = top + i as f64 * row_h;
        let _ = write!(s, r#"<text x="4" y="{:.1}">{name}</text>"#, yy + 9.0);
    }
    for &(t, a) in r.turn_starts.iter().filter(|(t, _)| (*t as f64) < span) {
        let yy = top + a as f64 * row_h;
        let _ = write!(
            s,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1:.1}" y2="{2:.1}" stroke="#222" stroke-width="1.2"/>"##,
            x(t),
            yy + 1.0,
            yy + row_h - 1.0
        );
    }
    for m in (0..=minutes).step_by(5) {
        let xx = x(m * 60_000);
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{m} min</text>"#,
            xx - 8.0,
            top + rows * row_h + 14.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The `seed003` figures the report's introduction quotes, from this run: (e)'s input
/// share, its grants from the queue, and its p95 task time by the product and by the
/// simulator against (b)'s.
fn seed003_figures(runs: &[(Scenario, Vec<RunResult>)]) -> (String, String, String) {
    let seed003 = runs.iter().find(|(sc, _)| sc.name == "seed003");
    let (Some(e), Some(b)) = (
        seed003.and_then(|(_, r)| find(r, Strategy::Coordinator)),
        seed003.and_then(|(_, r)| find(r, Strategy::SdkDefaults)),
    ) else {
        return ("(not run)".into(), "-".into(), "(not run)".into());
    };
    let share = pct(e.binding_share(1).1);
    let queued = e.granted_from_queue.to_string();
    let (product, own, sdk) = (
        e.task_time_s(950).unwrap_or(f64::INFINITY),
        e.own_task_time_s(950).unwrap_or(f64::INFINITY),
        b.task_time_s(950).unwrap_or(f64::INFINITY),
    );
    let p95 = format!(
        "(e)'s p95 is {product:.0} s by the product's buckets, {own:.0} s by the simulator's count: against (b)'s {sdk:.0} s, {:.2}× ({:.2}× by the simulator's count) for the goal of 2×",
        sdk / product,
        sdk / own
    );
    (share, queued, p95)
}

/// Writes the whole report into `dir`.
pub fn write(
    dir: &Path,
    runs: &[(Scenario, Vec<RunResult>)],
    command: &str,
    sweeps: &[String],
) -> io::Result<Vec<Goal>> {
    std::fs::create_dir_all(dir)?;
    let (seed003_share, seed003_queued, seed003_p95) = seed003_figures(runs);
    let mut md = String::new();
    let _ = writeln!(md, "# Fleet simulator report\n");
    let _ = writeln!(
        md,
        "Generated by `{command}` (deterministic: the same command writes the same report).\n"
    );
    let _ = writeln!(
        md,
        "Every scenario runs the same seed under each strategy. *429 rate* is 429s per call sent; *binding limit used* is the busiest of input tokens/min, output tokens/min and requests/min over the run after its first minute, as a share of the provider's real limit; *tokens / finished task* counts every token the provider counted (uncached input, cache writes, cache reads, output) per finished task, failed and abandoned work included, with the part that counts against its limits (uncached input, cache writes, output) in brackets; *critical-path wait* is agent-seconds that blocked agents spent waiting on an upstream agent's model call: the time from the call's first try to its answer (queue waits, retries and the call's own latency), times the agents blocked on it. See `examples/src/sim/` for the model.\n"
    );
    let _ = writeln!(
        md,
        "Reading the tables: (c) matches (a) exactly whenever the shared requests/min counter never fills: these fleets are bound by tokens, not requests (\"requests per minute is the wrong unit\"). (d) and (e) match wherever every agent has the same role and nobody waits on anybody. Unfinished tasks count in the task-time percentiles with their age at the end of the run (\"+ running\"), so a strategy that stalls long tasks is not flattered by finishing only short ones.\n"
    );
    let _ = writeln!(
        md,
        "The columns: *broken turns* are turns an agent's harness gave up on after a call stayed rate-limited past its patience (60 s), or that the coordinator's call lifecycle gave up on: each costs a re-read, re-test and re-plan at 5–20× the failed call's tokens. *Jain* is Jain's fairness index over the tokens each tenant was served (1 = equal shares; 1/n = one tenant got everything); in scenarios with a single tenant per role or one shared tenant it says little. *Grants from queue* are leases the coordinator granted after the request had waited in its queue (the rest were granted at once). A usage line can pass 100 % of a limit in a minute with no 429: the provider's buckets start full, so the first minute can spend a whole bucket plus its refill. On `seed003` the coordinators use {seed003_share} of the input limit over the run because the fleet asks for less than that most of the time: twenty agents spend ~80 s on tools between calls, fewer and fewer remain as their finite backlogs run out (the run ends when the last task does), and the coordinators queue only in the waves of the first minutes ({seed003_queued} grants from the queue); the `weights` scenario sets planner/reviewer/worker weights to 4:2:1 (the defaults are 3:2:1) to check shares of 4/7, 2/7, 1/7.\n\nFor the coordinators, (d) and (e), the core is driven by the reference host loop (`tokenwarden-host-loop`, `core/host-loop/`: the core's simulation and starvation tests run on it too), the loop every shipped host runs, through the core's protocol only; the simulator is its world (agents, provider, clock). The 429 rate, tokens per finished task, task times and critical-path wait in every table and goal are the product's own figures: the simulator opens each agent's task with the core's task API (its role, and as `unblocks` the agents blocked on it), names it on every lease, reports a looping agent's repeated failure, ends it merged (or failed, for a looping agent) and reads `metrics().tasks` at the end. Under (d) the coordinator is told the same tasks with every weight equal (no role weights, no unblock bonus, no failure decay). (a)–(c) have no coordinator in the loop, so theirs are the simulator's bookkeeping; for `seed003` and `seed003-tight` the simulator's bookkeeping of (d) and (e) is shown under the table for comparison. The product's task-time percentiles are bucket upper bounds, within 3.2 %: on `seed003` {seed003_p95}.\n"
    );
    let _ = writeln!(
        md,
        "The `estimator` scenario runs the product's own estimator, not exact counts: its agents send request bodies the simulator generates (Anthropic Messages JSON, every token of which it knows), and each lease is sized by the provider crate's estimator (`tokenwarden_provider::estimate`, the code every engine package runs for the driver's `DefaultEstimator`, with o200k_base as its tokenizer and its clock on the simulator's virtual time), which observes each settled call's usage as the `fetch` wrapper has it do. It runs in the simulator's process: no Node, nothing to build first. Its figures move when the estimator does.\n"
    );
    let mut all_goals = Vec::new();
    let _ = writeln!(
        md,
        "## Goals\n\n| scenario | goal | measured | met |\n|---|---|---|---|"
    );
    for (sc, results) in runs {
        for goal in goals(sc, results) {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                sc.name,
                goal.what,
                goal.measured,
                if goal.met { "yes" } else { "**no**" }
            );
            all_goals.push(goal);
        }
    }
    for sweep in sweeps {
        md.push_str(sweep);
    }
    for (sc, results) in runs {
        let _ = writeln!(
            md,
            "\n## {}\n\n{}\n\nLimits: {} input tokens/min, {} output tokens/min, {} requests/min, {} parallel requests; {} minutes; {} agents.\n",
            sc.name,
            sc.description,
            sc.limits.input_tpm,
            sc.limits.output_tpm,
            sc.limits.rpm,
            sc.limits.concurrent,
            sc.minutes,
            sc.agents.len()
        );
        md.push_str(&table(sc, results));
        md.push('\n');
        for r in results {
            let file = format!("{}-usage-{}.svg", sc.name, r.strategy.id());
            std::fs::write(dir.join(&file), usage_svg(r))?;
            let _ = writeln!(md, "![{} usage]({file})", r.strategy.label());
        }
        for r in results.iter().filter(|r| !r.estimates.is_empty()) {
            md.push('\n');
            md.push_str(&estimates_table(r));
        }
        if sc.name == "mixed" {
            for r in results.iter().filter(|r| r.strategy.uses_coordinator()) {
                md.push('\n');
                md.push_str(&waits_table(sc, r));
            }
        }
        if sc.name == "seed003" {
            let names: Vec<String> = sc.agents.iter().map(|a| a.name.clone()).collect();
            for s in [Strategy::Backoff, Strategy::Coordinator] {
                if let Some(r) = find(results, s) {
                    let file = format!("seed003-overlay-{}.svg", s.id());
                    std::fs::write(dir.join(&file), overlay_svg(r, &names, 20))?;
                    let _ = writeln!(md, "\n![429s over turns, {}]({file})", s.label());
                }
            }
        }
    }
    std::fs::write(dir.join("README.md"), md)?;
    Ok(all_goals)
}

/// Medians over several seeds, and how many seeds meet each goal: one seed can be lucky.
pub fn seed_sweep(sc: &Scenario, seeds: std::ops::RangeInclusive<u64>) -> String {
    let runs: Vec<Vec<RunResult>> = seeds
        .clone()
        .map(|seed| {
            sc.strategies
                .iter()
                .map(|&s| super::run(sc, s, seed))
                .collect()
        })
        .collect();
    let n = runs.len();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n### {} across seeds {}–{}\n",
        sc.name,
        seeds.start(),
        seeds.end()
    );
    let _ = writeln!(s, "Medians over {n} seeds.\n");
    let _ = writeln!(
        s,
        "| strategy | 429 rate | tokens / finished task | p95 task | critical-path wait |\n|---|---:|---:|---:|---:|"
    );
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    for (k, strategy) in sc.strategies.iter().enumerate() {
        let col = |f: &dyn Fn(&RunResult) -> f64| median(runs.iter().map(|r| f(&r[k])).collect());
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.0} s | {:.0} agent-s |",
            strategy.label(),
            pct(col(&|r| r.rate_limited_ratio())),
            col(&|r| r.tokens_per_task().unwrap_or(f64::INFINITY)),
            col(&|r| r.task_time_s(950).unwrap_or(f64::INFINITY)),
            col(&|r| r.critical_path_wait() as f64 / 1000.0),
        );
    }
    let mut met: Vec<(String, usize)> = Vec::new();
    for r in &runs {
        for (i, g) in goals(sc, r).into_iter().enumerate() {
            if met.len() <= i {
                met.push((g.what.clone(), 0));
            }
            if g.met {
                met[i].1 += 1;
            }
        }
    }
    let _ = writeln!(s, "\n| goal | seeds meeting it |\n|---|---:|");
    for (what, count) in met {
        let _ = writeln!(s, "| {what} | {count} of {n} |");
    }
    if sc.name == "seed003-tight" {
        s.push_str(&why_dag_weights_do_not_win(sc, &runs));
    }
    s
}

/// `seed003-tight`'s goals are mostly missed; the figures that say why.
fn why_dag_weights_do_not_win(sc: &Scenario, runs: &[Vec<RunResult>]) -> String {
    let at = |s: Strategy| sc.strategies.iter().position(|&x| x == s);
    let (Some(a), Some(b), Some(d), Some(e)) = (
        at(Strategy::Backoff),
        at(Strategy::SdkDefaults),
        at(Strategy::CoordinatorEqual),
        at(Strategy::Coordinator),
    ) else {
        return String::new();
    };
    let n = runs.len();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let col =
        |k: usize, f: &dyn Fn(&RunResult) -> f64| median(runs.iter().map(|r| f(&r[k])).collect());
    let e_below_d = runs
        .iter()
        .filter(|r| r[e].critical_path_wait() < r[d].critical_path_wait())
        .count();
    let broken = |k: usize| col(k, &|r| r.broken_turns as f64);
    let busiest = col(e, &|r| {
        r.minutes
            .iter()
            .map(|m| m.input as f64 / r.limits.input_tpm.max(1) as f64)
            .fold(0.0, f64::max)
    });
    let share = col(e, &|r| r.binding_share(1).1);
    let queued = col(e, &|r| r.granted_from_queue as f64);
    let calls = col(e, &|r| r.sent as f64);
    let p95 = |k: usize| col(k, &|r| r.task_time_s(950).unwrap_or(f64::INFINITY));
    format!(
        "\n**Why DAG weights do not win on `seed003-tight`** (medians over the {n} seeds). \
The goal of a queueing coordinator is not reached: over the run (e) uses {share} of the input limit (its busiest minute {busiest}), \
not above 90 %. The fleet cannot use more: its biggest call (a refactor re-planned from scratch) sends 110k fresh tokens, so no key \
below 130k input tokens a minute serves it at the 85 % margin, while the twenty agents, 80 s of tool time between calls and backlogs \
that run out, ask for about a third of that over the run. The coordinator queues only in the waves: {queued:.0} of {calls:.0} grants \
came from the queue. Weights only reorder calls inside those waves, and a planner's or a repair agent's call that comes after a \
granted 80k–110k refactor call waits for the refill whatever its weight (a grant is never taken back). So (e)'s critical-path wait \
is below (d)'s on {e_below_d} of {n} seeds ({ew:.0} vs {dw:.0} agent-s), not on 8. It is not the lowest of all strategies because \
the measure counts time spent waiting on the quota, and (a) and (b) spend theirs re-planning instead: {ba:.0} and {bb:.0} broken \
turns a run (0 for the coordinators), each 5–20× the failed call's tokens, which is where their tokens per finished task go \
({ta:.0} and {tb:.0} against (e)'s {te:.0}: that goal holds on every seed). Task time is mostly tool time: the p95 task is a refactor \
task of 6 turns × 80 s of tools plus its own 80k–110k calls, at most about one a minute on this key, so (e)'s p95 ({pe:.0} s) \
cannot be half of (b)'s ({pb:.0} s); (b) finishes some long tasks sooner because the provider lets it spend the last 15 % that \
the coordinator's margin keeps back, and pays for it in 429s and broken turns.\n",
        share = pct(share),
        busiest = pct(busiest),
        ew = col(e, &|r| r.critical_path_wait() as f64 / 1000.0),
        dw = col(d, &|r| r.critical_path_wait() as f64 / 1000.0),
        ba = broken(a),
        bb = broken(b),
        ta = col(a, &|r| r.tokens_per_task().unwrap_or(f64::INFINITY)),
        tb = col(b, &|r| r.tokens_per_task().unwrap_or(f64::INFINITY)),
        te = col(e, &|r| r.tokens_per_task().unwrap_or(f64::INFINITY)),
        pe = p95(e),
        pb = p95(b),
    )
}
