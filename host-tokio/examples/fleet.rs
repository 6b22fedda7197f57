//! A fleet of Rust agents on one key, each on its own HTTP client: through tokenwarden
//! (the reqwest-middleware middleware or the tower layer) or direct, retrying its 429s
//! after `retry-after` as the official SDKs do. Against the mock provider:
//!
//! ```text
//! node testing/mock-cli.mjs --rpm 30 --port 8931 &
//! cargo run -p tokenwarden-tokio --example fleet -- --base-url http://127.0.0.1:8931 --rpm 30 --via reqwest
//! cargo run -p tokenwarden-tokio --example fleet -- --base-url http://127.0.0.1:8931 --rpm 30 --via reqwest --direct
//! ```
//!
//! It prints what the agents saw, then one JSON line (`{"via":…,"direct":…,"calls":…,
//! "ok":…,"provider_429s":…,"wall_ms":…}`). Options: `--agents N` (8), `--calls N` per
//! agent (5), `--rpm N` / `--itpm N` / `--otpm N` (the key's limits, as the core's config;
//! at least one), `--max-tokens N` (300), `--via reqwest|tower`, `--direct`, `--trace` (the
//! core's view every half second on stderr: each axis's available level, the line, the
//! calls in flight, the margin).

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokenwarden_tokio::layer::TokenwardenLayer;
use tokenwarden_tokio::middleware::TokenwardenMiddleware;
use tokenwarden_tokio::{Agent, Tokenwarden};
use tower_layer::Layer;
use tower_service::Service;

#[derive(Clone, Debug)]
struct Options {
    base_url: String,
    agents: u32,
    calls: u32,
    rpm: Option<u64>,
    itpm: Option<u64>,
    otpm: Option<u64>,
    max_tokens: u64,
    via: String,
    direct: bool,
    trace: bool,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        base_url: String::new(),
        agents: 8,
        calls: 5,
        rpm: None,
        itpm: None,
        otpm: None,
        max_tokens: 300,
        via: "reqwest".into(),
        direct: false,
        trace: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--direct" || flag == "--trace" {
            o.direct |= flag == "--direct";
            o.trace |= flag == "--trace";
            continue;
        }
        let value = args.next().ok_or(format!("{flag}: a value is missing"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag}: not a whole number: {value}"))
        };
        match flag.as_str() {
            "--base-url" => o.base_url = value.trim_end_matches('/').into(),
            "--agents" => o.agents = u32::try_from(number()?).map_err(|e| e.to_string())?,
            "--calls" => o.calls = u32::try_from(number()?).map_err(|e| e.to_string())?,
            "--rpm" => o.rpm = Some(number()?),
            "--itpm" => o.itpm = Some(number()?),
            "--otpm" => o.otpm = Some(number()?),
            "--max-tokens" => o.max_tokens = number()?,
            "--via" if value == "reqwest" || value == "tower" => o.via = value,
            "--via" => return Err(format!("--via: reqwest or tower, not {value}")),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if o.base_url.is_empty() {
        return Err("--base-url is required (the mock provider's URL)".into());
    }
    if o.rpm.is_none() && o.itpm.is_none() && o.otpm.is_none() {
        return Err("give the key's limits: --rpm, --itpm and/or --otpm".into());
    }
    Ok(o)
}

/// The core config of the key: one pool with the limits given.
fn config(o: &Options) -> String {
    let mut pool = serde_json::json!({ "name": "default" });
    for (k, v) in [
        ("requests_per_minute", o.rpm),
        ("input_tokens_per_minute", o.itpm),
        ("output_tokens_per_minute", o.otpm),
    ] {
        if let Some(v) = v {
            pool[k] = v.into();
        }
    }
    serde_json::json!({ "pools": [pool] }).to_string()
}

fn body(o: &Options, agent: u32, call: u32) -> String {
    serde_json::json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": o.max_tokens,
        "messages": [{ "role": "user", "content": format!(
            "Agent {agent}, step {call}: summarize the build log below in one sentence.\n{}",
            "error[E0308]: mismatched types — expected `u64`, found `u32` in src/pool.rs:118. ".repeat(8)
        ) }],
    })
    .to_string()
}

/// What one call ended as: its status, and the 429s seen on the way.
struct Ended {
    status: u16,
    limited: u32,
}

/// An SDK's own rule, for a direct agent: a 429 is retried after its `retry-after`.
fn retry_after(headers: &http::HeaderMap) -> Duration {
    let s = headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(s.clamp(0.0, 120.0))
}

async fn via_reqwest(
    o: &Options,
    tw: Option<Tokenwarden>,
    agent: u32,
) -> Result<Vec<Ended>, String> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?;
    let mut builder = reqwest_middleware::ClientBuilder::new(http);
    if let Some(tw) = tw {
        builder = builder.with(TokenwardenMiddleware::new(
            tw,
            Agent::named(&format!("agent-{agent}")),
        ));
    }
    let client = builder.build();
    let mut out = Vec::new();
    for call in 0..o.calls {
        let mut limited = 0;
        loop {
            let res = client
                .post(format!("{}/v1/messages", o.base_url))
                .header("x-api-key", "dummy")
                .header("anthropic-version", "2023-06-01")
                .header("content-type", "application/json")
                .body(body(o, agent, call))
                .send()
                .await
                .map_err(|e| format!("agent {agent}: {e:#}"))?;
            let status = res.status().as_u16();
            let wait = retry_after(res.headers());
            let ours = res.headers().contains_key("x-tokenwarden-refusal");
            res.bytes()
                .await
                .map_err(|e| format!("agent {agent}: {e}"))?;
            if status == 429 {
                limited += u32::from(!ours);
                tokio::time::sleep(wait).await;
                continue;
            }
            out.push(Ended { status, limited });
            break;
        }
    }
    Ok(out)
}

async fn via_tower(o: &Options, tw: Option<Tokenwarden>, agent: u32) -> Result<Vec<Ended>, String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut out = Vec::new();
    for call in 0..o.calls {
        let mut limited = 0;
        loop {
            let req = http::Request::post(format!("{}/v1/messages", o.base_url))
                .header("x-api-key", "dummy")
                .header("anthropic-version", "2023-06-01")
                .header("content-type", "application/json")
                .body(Full::from(body(o, agent, call)))
                .map_err(|e| e.to_string())?;
            let (status, wait) = match &tw {
                Some(tw) => {
                    let mut svc =
                        TokenwardenLayer::new(tw.clone(), Agent::named(&format!("agent-{agent}")))
                            .layer(client.clone());
                    let res = svc
                        .call(req)
                        .await
                        .map_err(|e| format!("agent {agent}: {e}"))?;
                    let (status, wait) = (res.status().as_u16(), retry_after(res.headers()));
                    if res.headers().contains_key("x-tokenwarden-refusal") {
                        return Err(format!("agent {agent}: refused by tokenwarden ({status})"));
                    }
                    res.into_body()
                        .collect()
                        .await
                        .map_err(|e| format!("agent {agent}: {e}"))?;
                    (status, wait)
                }
                None => {
                    let res = client
                        .clone()
                        .call(req)
                        .await
                        .map_err(|e| format!("agent {agent}: {e}"))?;
                    let (status, wait) = (res.status().as_u16(), retry_after(res.headers()));
                    res.into_body()
                        .collect()
                        .await
                        .map_err(|e| format!("agent {agent}: {e}"))?;
                    (status, wait)
                }
            };
            if status == 429 {
                limited += 1;
                tokio::time::sleep(wait).await;
                continue;
            }
            out.push(Ended { status, limited });
            break;
        }
    }
    Ok(out)
}

#[tokio::main]
async fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("fleet: {e}");
            return ExitCode::from(2);
        }
    };
    let tw = if o.direct {
        None
    } else {
        match Tokenwarden::from_config_json(&config(&o)) {
            Ok(tw) => Some(tw),
            Err(e) => {
                eprintln!("fleet: {e}");
                return ExitCode::from(2);
            }
        }
    };
    let started = tokio::time::Instant::now();
    if let (Some(tw), true) = (tw.clone(), o.trace) {
        tokio::spawn(async move {
            loop {
                let line = tw.inspect(|c, now| {
                    let m = c.metrics(now);
                    let p = &m.pools[0];
                    let axes: Vec<String> = p
                        .axes
                        .iter()
                        .filter(|a| a.limit.is_some())
                        .map(|a| format!("{:?} {}", a.axis, a.available))
                        .collect();
                    format!(
                        "{:>6} ms  available: {}  queued {}  in flight {}  margin {:.1} %",
                        now.0,
                        axes.join(", "),
                        p.queue_depth,
                        p.in_flight,
                        f64::from(p.margin_permille) / 10.0
                    )
                });
                eprintln!("{line}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }
    let failed = Arc::new(AtomicU32::new(0));
    let mut agents = Vec::new();
    for a in 0..o.agents {
        let (o, tw, failed) = (o.clone(), tw.clone(), Arc::clone(&failed));
        agents.push(tokio::spawn(async move {
            let r = if o.via == "tower" {
                via_tower(&o, tw, a).await
            } else {
                via_reqwest(&o, tw, a).await
            };
            r.unwrap_or_else(|e| {
                eprintln!("fleet: {e}");
                failed.fetch_add(1, Ordering::Relaxed);
                Vec::new()
            })
        }));
    }
    let mut ended = Vec::new();
    for a in agents {
        ended.extend(a.await.unwrap_or_default());
    }
    let wall_ms = started.elapsed().as_millis();
    let ok = ended.iter().filter(|e| e.status == 200).count();
    // The 429s the agents saw, and those the core took in and answered itself (waited out,
    // then sent again): every 429 the provider sent.
    let seen: u64 = ended.iter().map(|e| u64::from(e.limited)).sum();
    let absorbed = tw.as_ref().map_or(0, |tw| {
        tw.inspect(|c, now| c.metrics(now).pools[0].counters.rate_limited)
    });
    let limited = seen + absorbed;
    let mode = if o.direct {
        "direct"
    } else {
        "through tokenwarden"
    };
    println!(
        "{} agents × {} calls on {} {mode}: {ok} answered 200, {limited} 429s from the provider, {:.1} s",
        o.agents,
        o.calls,
        o.via,
        wall_ms as f64 / 1000.0
    );
    if let Some(tw) = &tw {
        let m = tw.inspect(|c, now| c.metrics(now));
        let p = &m.pools[0];
        println!(
            "  core: {} granted at once, {} from the queue, {} settled, {} 429s taken in and sent again, {} live leases left; margin {:.1} %, {} resyncs to the provider's figures",
            p.counters.granted_now,
            p.counters.granted_from_queue,
            p.counters.settled,
            p.counters.rate_limited,
            m.live_leases,
            f64::from(p.margin_permille) / 10.0,
            p.counters.resyncs
        );
    }
    println!(
        "{}",
        serde_json::json!({
            "via": o.via, "direct": o.direct, "calls": o.agents * o.calls, "ok": ok,
            "provider_429s": limited, "wall_ms": wall_ms as u64,
        })
    );
    if failed.load(Ordering::Relaxed) > 0 || ok != (o.agents * o.calls) as usize {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
