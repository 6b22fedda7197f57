//! `tokenwarden serve`, native: one local limiter for a fleet of CLI agents and programs in
//! any language, which join it by changing their base URL. The HTTP API of the edge
//! limiter (edge/API.md) — the lease API, the proxy, metrics — on hyper and the tokio
//! host, every decision the gateway crate's and the core's. State (leases, tickets, debt,
//! agent names) is kept under `--data`, so a restart keeps it.

mod app;
mod cluster;
mod dashboard;
mod proxy;
mod quota;
mod reply;
mod store;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokenwarden_gateway::config::{Fleets, ProxyOpen};

use crate::app::{App, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROXY_BODY_BYTES, Options, unix_now};
use crate::cluster::{Cluster, Role, Seat};
use crate::quota::Quota;
use crate::store::{Store, write_private};

/// mimalloc: allocation and free are a fifth of serve's CPU on glibc's malloc at
/// saturation (a call allocates its headers, bodies and JSON values many times over).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const HELP: &str = "usage: tokenwarden serve [--config tokenwarden.json] [--port 8787] [--host 127.0.0.1] [--data DIR]
       tokenwarden --version

Runs the limiter on this machine and prints the base URLs agents use:
  ANTHROPIC_BASE_URL=http://127.0.0.1:8787/v1/fleets/<fleet>/quotas/<quota>/agents/<agent>/<role>/anthropic
  OPENAI_BASE_URL=http://127.0.0.1:8787/v1/fleets/<fleet>/quotas/<quota>/agents/<agent>/<role>/openai

  --config FILE  fleets, quotas and upstreams ({ \"fleets\": { ... } }), checked before
                 anything starts (exit 2 naming the field); default: fleet \"local\" with
                 quotas \"anthropic\" and \"openai\" on the providers' APIs, limits learned
                 from their headers
  --port N       default 8787; 0: a free port, printed in the banner (a port in use: exit 1)
  --host ADDR    default 127.0.0.1; a fleet with \"proxy_open\": true is refused on any other
  --data DIR     state (leases, tickets, debt, agent names) and the default fleet's secret,
                 owner-only (0700/0600); default ./.tokenwarden
  --cluster URL  share the key with other instances: one owner per quota, elected in
                 Redis or Valkey at URL (redis://[[user]:password@]host[:port][/db]); the
                 others forward to it. Needs --config (every instance the same file)
  --advertise U  how the other instances reach this one (default http://<host>:<port>)
  --version      print the version and exit

Waits longer than a few seconds are printed here (who waits, on which pool and ceiling,
for how long), with a summary once a minute; TOKENWARDEN_WAIT_LOG=0 turns that off.

Environment: TOKENWARDEN_MAX_BODY_BYTES (API bodies, default 65536),
TOKENWARDEN_MAX_PROXY_BODY_BYTES (proxied bodies, default 33554432),
TOKENWARDEN_THREADS (serving threads, default one per core), TOKENWARDEN_OWNER_TTL_MS
(a cluster's owner lease, default 3000, 300 to 60000).";

/// How the run ends early: exit 2 for bad input (arguments, config), 1 for the machine.
struct Exit(u8, String);

fn bad(message: impl Into<String>) -> Exit {
    Exit(2, message.into())
}

fn machine(message: impl Into<String>) -> Exit {
    Exit(1, message.into())
}

struct Args {
    config: Option<PathBuf>,
    port: u16,
    host: IpAddr,
    data: PathBuf,
    /// `--cluster`: the shared store's URL.
    cluster: Option<String>,
    /// `--advertise`: how the other instances reach this one.
    advertise: Option<String>,
}

enum Command {
    Serve(Args),
    Print(String),
}

fn parse_args(argv: &[String]) -> Result<Command, Exit> {
    let version = || Command::Print(format!("tokenwarden {}", env!("CARGO_PKG_VERSION")));
    let Some(command) = argv.first() else {
        return Ok(Command::Print(HELP.into()));
    };
    match command.as_str() {
        "-h" | "--help" | "help" => return Ok(Command::Print(HELP.into())),
        "--version" => return Ok(version()),
        "serve" => {}
        other => {
            return Err(bad(format!(
                "unknown command {other:?} (try --help: serve)"
            )));
        }
    }
    let mut args = Args {
        config: None,
        port: 8787,
        host: IpAddr::from([127, 0, 0, 1]),
        data: PathBuf::from(".tokenwarden"),
        cluster: None,
        advertise: None,
    };
    let mut rest = argv[1..].iter();
    while let Some(flag) = rest.next() {
        let mut value = || {
            rest.next()
                .cloned()
                .ok_or_else(|| bad(format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Print(HELP.into())),
            "--version" => return Ok(version()),
            "--config" => args.config = Some(PathBuf::from(value()?)),
            "--data" => args.data = PathBuf::from(value()?),
            "--cluster" => args.cluster = Some(value()?),
            "--advertise" => args.advertise = Some(value()?),
            "--host" => {
                let v = value()?;
                args.host = if v == "localhost" {
                    IpAddr::from([127, 0, 0, 1])
                } else {
                    v.parse()
                        .map_err(|_| bad(format!("--host must be an IP address, got {v:?}")))?
                };
            }
            "--port" => {
                let v = value()?;
                args.port = v
                    .parse()
                    .ok()
                    .filter(|_| v.len() <= 5 && v.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| {
                        bad(format!(
                            "--port must be a port number (0 to 65535), got {v:?}"
                        ))
                    })?;
            }
            other => return Err(bad(format!("unknown option {other:?} (try --help)"))),
        }
    }
    Ok(Command::Serve(args))
}

/// A directory only its owner can enter (0700), made if need be.
fn private_dir(dir: &Path) -> Result<(), Exit> {
    let fail = |e: std::io::Error| {
        machine(format!(
            "cannot make {} a private directory (mkdir, chmod 700): {e}",
            dir.display()
        ))
    };
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir).map_err(fail)?;
    #[cfg(unix)]
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .map_err(fail)?;
    Ok(())
}

/// The default fleet `local`, its secret kept in `<data>/secret`: made on the first start
/// (0600); one that other users can read or change is refused, not fixed, since it may
/// already have been seen.
fn default_fleets(data: &Path) -> Result<(String, String), Exit> {
    let file = data.join("secret");
    match std::fs::metadata(&file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 24];
            getrandom::fill(&mut bytes)
                .map_err(|e| machine(format!("no randomness for a secret: {e}")))?;
            let secret = tokenwarden_gateway::mac::b64url(&bytes);
            write_private(&file, format!("{secret}\n").as_bytes()).map_err(|e| {
                machine(format!(
                    "cannot write the fleet secret to {}: {e}",
                    file.display()
                ))
            })?;
        }
        Err(e) => return Err(machine(format!("cannot read {}: {e}", file.display()))),
        Ok(m) if !m.is_file() => {
            return Err(bad(format!(
                "{} must be a file holding the fleet secret",
                file.display()
            )));
        }
        #[cfg(unix)]
        Ok(m) if std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o077 != 0 => {
            let mode = std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777;
            let how = if mode & 0o044 != 0 { "read" } else { "changed" };
            return Err(bad(format!(
                "{f} can be {how} by other users (mode 0{mode:o}), and it holds the fleet secret: chmod 600 {f} (or delete it to have a new secret made)",
                f = file.display()
            )));
        }
        Ok(_) => {}
    }
    let secret = std::fs::read_to_string(&file)
        .map_err(|e| machine(format!("cannot read {}: {e}", file.display())))?;
    let fleets = serde_json::json!({ "fleets": { "local": {
        "secret": secret.trim(),
        "proxy_open": true,
        "quotas": {
            "anthropic": { "upstream": "https://api.anthropic.com", "config": { "pools": [{ "name": "default" }] } },
            "openai": { "upstream": "https://api.openai.com", "config": { "pools": [{ "name": "default", "counting": "openai" }] } },
        },
    } } });
    Ok((
        fleets.to_string(),
        format!("the default fleet (its secret from {})", file.display()),
    ))
}

/// A positive byte count from the environment, else `fallback`.
fn limit_from(name: &str, fallback: usize) -> Result<usize, Exit> {
    match std::env::var(name) {
        Err(_) => Ok(fallback),
        Ok(v) if v.is_empty() => Ok(fallback),
        Ok(v) => v.parse::<usize>().ok().filter(|n| *n >= 1).ok_or_else(|| {
            bad(format!(
                "{name} must be a positive integer (bytes), got {v:?}"
            ))
        }),
    }
}

/// A name as a file name: its characters kept where safe, others as `%XX`.
fn file_name(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn banner(fleets: &Fleets, origin: &str, cluster: Option<&Cluster>) -> String {
    let mut lines = vec![format!("tokenwarden serve: the limiter on {origin}")];
    if let Some(c) = cluster {
        lines.push(format!(
            "cluster: one owner per quota elected in {} (owner lease {} ms); the others reach this instance at {}",
            c.shown,
            c.ttl.as_millis(),
            c.advertise
        ));
    }
    for (fleet, f) in &fleets.fleets {
        for (quota, q) in &f.quotas {
            let base = format!("{origin}/v1/fleets/{fleet}/quotas/{quota}");
            let openai = q
                .upstream
                .as_ref()
                .is_some_and(|u| u.url.to_ascii_lowercase().contains("openai"))
                || q.config_json["pools"][0]["counting"] == "openai";
            let (env, provider) = if openai {
                ("OPENAI_BASE_URL", "openai")
            } else {
                ("ANTHROPIC_BASE_URL", "anthropic")
            };
            let secret = if f.proxy_open == ProxyOpen::Open {
                ""
            } else {
                " (proxied calls need x-tokenwarden-token: the fleet secret)"
            };
            lines.push(String::new());
            lines.push(format!("fleet {fleet}, quota {quota}{secret}"));
            lines.push(format!("  {env}={base}/agents/<agent>/<role>/{provider}"));
            lines.push(format!(
                "  dashboard: {base}/dashboard   metrics: {base}/metrics (Authorization: Bearer <fleet secret>)"
            ));
        }
    }
    lines.push(String::new());
    lines.push(if cluster.is_some() {
        "Ctrl-C stops it; the quotas it owns are saved in the cluster's store and handed on.".into()
    } else {
        "Ctrl-C stops it; leases, tickets and debt are kept on disk for the next start.".into()
    });
    lines.join("\n")
}

async fn serve(args: Args) -> Result<(), Exit> {
    let (text, source) = match &args.config {
        Some(file) => (
            std::fs::read_to_string(file)
                .map_err(|e| bad(format!("cannot read --config {}: {e}", file.display())))?,
            format!("--config {}", file.display()),
        ),
        None => {
            private_dir(&args.data)?;
            default_fleets(&args.data)?
        }
    };
    let fleets = Fleets::from_serve_file(&text).map_err(|e| bad(format!("{source}: {e}")))?;
    if args.config.is_some() {
        upstreams_resolve(&fleets, &source).await?;
    }
    if !args.host.is_loopback() {
        let open: Vec<&str> = fleets
            .fleets
            .iter()
            .filter(|(_, f)| f.proxy_open == ProxyOpen::Open)
            .map(|(n, _)| n.as_str())
            .collect();
        if !open.is_empty() {
            return Err(bad(format!(
                "fleet {} takes proxied calls with no secret (proxy_open): serve it on loopback only, not on {}",
                open.join(", "),
                args.host
            )));
        }
    }
    let options = Options {
        test_clock: std::env::var("TOKENWARDEN_TEST_CLOCK").is_ok_and(|v| v == "1"),
        max_body: limit_from("TOKENWARDEN_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES)?,
        max_proxy_body: limit_from(
            "TOKENWARDEN_MAX_PROXY_BODY_BYTES",
            DEFAULT_MAX_PROXY_BODY_BYTES,
        )?,
    };
    let threads = threads()?;
    if args.cluster.is_some() && args.config.is_none() {
        return Err(bad(
            "--cluster needs --config: every instance of a cluster serves the same fleets with the same secrets (give each the same file)",
        ));
    }
    if args.advertise.is_some() && args.cluster.is_none() {
        return Err(bad("--advertise is for a cluster: give --cluster too"));
    }
    let ttl = owner_ttl()?;
    let elector = match &args.cluster {
        None => None,
        Some(url) => Some(
            tokenwarden_cluster::RedisElector::new(
                url,
                (ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(1)),
            )
            .map_err(|e| bad(format!("--cluster: {e}")))?,
        ),
    };
    let addr = SocketAddr::new(args.host, args.port);
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => machine(format!("port {} on {} is in use (EADDRINUSE); pick another with --port", args.port, args.host)),
        std::io::ErrorKind::PermissionDenied => machine(format!("cannot listen on port {} on {} (EACCES: a port below 1024 needs privileges); pick another with --port", args.port, args.host)),
        std::io::ErrorKind::AddrNotAvailable => machine(format!("cannot listen on {} (EADDRNOTAVAIL: not an address of this machine); pick another with --host", args.host)),
        _ => machine(format!("cannot listen on port {} on {} ({e})", args.port, args.host)),
    })?;
    let local = listener.local_addr().map_err(|e| machine(e.to_string()))?;
    let listener = listener.into_std().map_err(|e| machine(e.to_string()))?;
    // The data directory: the fleets as checked (fleets.json) and each quota's state
    // (storage/), all owner-only.
    private_dir(&args.data)?;
    write_private(
        &args.data.join("fleets.json"),
        fleets.json.to_string().as_bytes(),
    )
    .map_err(|e| {
        machine(format!(
            "cannot write {}: {e}",
            args.data.join("fleets.json").display()
        ))
    })?;
    let state_dir = args.data.join("storage");
    private_dir(&state_dir)?;
    let origin = if local.is_ipv6() {
        format!("http://[{}]:{}", local.ip(), local.port())
    } else {
        format!("http://{local}")
    };
    let cluster = match (elector, &args.cluster) {
        (Some(elector), Some(url)) => {
            let advertise = match &args.advertise {
                Some(a) => {
                    let a = a.trim_end_matches('/').to_owned();
                    if !a.starts_with("http://") || a.len() <= "http://".len() || a.contains('#') {
                        return Err(bad(format!(
                            "--advertise must be this instance's base URL as the others reach it, http://host:port, got {a:?}"
                        )));
                    }
                    a
                }
                None if args.host.is_unspecified() => {
                    return Err(bad(format!(
                        "--host {} listens on every address: give --advertise, the URL the other instances reach this one at",
                        args.host
                    )));
                }
                None => origin.clone(),
            };
            let t = tokenwarden_cluster::resp::Target::parse(url).map_err(bad)?;
            let mut nonce = [0u8; 8];
            let _ = getrandom::fill(&mut nonce);
            Some(Arc::new(Cluster {
                elector: Arc::new(elector),
                shown: format!("redis://{}:{}/{}", t.host, t.port, t.db),
                me: format!("{advertise}#{:016x}", u64::from_le_bytes(nonce)),
                advertise,
                ttl,
            }))
        }
        _ => None,
    };
    let now = unix_now();
    // Waits are printed where the operator looks (this terminal) unless asked not to.
    let wait_log = std::env::var("TOKENWARDEN_WAIT_LOG").map_or(true, |v| v != "0");
    let mut quotas = BTreeMap::new();
    for (fleet, f) in &fleets.fleets {
        for (name, q) in &f.quotas {
            let seat = cluster
                .as_ref()
                .map(|c| Arc::new(Seat::new(Arc::clone(c), fleet, name)));
            let store = match &seat {
                Some(seat) => Store::cluster(Arc::clone(seat)),
                None => Store::new(state_dir.join(format!(
                    "{}.{}.json",
                    file_name(fleet),
                    file_name(name)
                ))),
            };
            let quota =
                Quota::open(fleet, name, q, &f.secret, store, now, wait_log).map_err(machine)?;
            quotas.insert((fleet.clone(), name.clone()), quota);
        }
    }
    for q in quotas.values() {
        let weak = Arc::downgrade(q);
        let store = Arc::clone(&q.store);
        tokio::spawn(async move {
            store.run(|| weak.upgrade().map(|q| q.saved())).await;
        });
    }
    // In a cluster, each quota's first campaign before serving: the instance starts knowing
    // whether it owns the quota or whom to forward to. One that has never reached the
    // store grants nothing: it waits for it (it would not know its share of the quota).
    let mut campaigns = Vec::new();
    if let Some(c) = &cluster {
        let mut said = false;
        for q in quotas.values() {
            let Some(seat) = &q.seat else { continue };
            loop {
                cluster::first(seat, q).await;
                if !matches!(seat.role(), Role::Unknown) {
                    break;
                }
                if !said {
                    eprintln!(
                        "tokenwarden serve: waiting for the cluster's store at {} (Ctrl-C stops)",
                        c.shown
                    );
                    said = true;
                }
                tokio::select! {
                    () = shutdown() => return Ok(()),
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
            campaigns.push(tokio::spawn(cluster::run(
                Arc::clone(seat),
                Arc::downgrade(q),
            )));
        }
    }
    let app = Arc::new(App {
        fleets,
        quotas,
        options,
    });
    println!("{}", banner(&app.fleets, &origin, cluster.as_deref()));
    // One runtime per core, each on its own thread, accepting from the one listening
    // socket: a connection's request, its provider call and its answer stay on the thread
    // that accepted it (a task moved between threads costs a wake-up of another thread,
    // ~40 µs on a small VM, more than the rest of the call). The coordinator is shared.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut workers = Vec::new();
    for n in 1..threads {
        let std_listener = listener
            .try_clone()
            .map_err(|e| machine(format!("cannot share the listening socket: {e}")))?;
        let (app, stop) = (Arc::clone(&app), stop_rx.clone());
        let worker = std::thread::Builder::new()
            .name(format!("tokenwarden-{n}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(std_listener)?;
                    accept(&listener, &app, stop).await;
                    Ok::<(), std::io::Error>(())
                })
            })
            .map_err(|e| machine(format!("cannot start a thread: {e}")))?;
        workers.push(worker);
    }
    let listener =
        tokio::net::TcpListener::from_std(listener).map_err(|e| machine(e.to_string()))?;
    tokio::select! {
        () = shutdown() => {}
        () = accept(&listener, &app, stop_rx) => {}
    }
    let _ = stop_tx.send(true);
    for w in workers {
        if let Ok(Err(e)) = w.join() {
            eprintln!("tokenwarden: a serving thread stopped: {e}");
        }
    }
    // Everything acknowledged is on disk already; what changed since is written now. In a
    // cluster the owner saves it in the store and gives its term up (another instance takes
    // over at once). The campaigns stop first: none takes a term back after it is given up.
    for task in &campaigns {
        task.abort();
    }
    for task in campaigns {
        let _ = task.await;
    }
    for q in app.quotas.values() {
        if let Some(seat) = &q.seat {
            cluster::leave(seat, q).await;
            continue;
        }
        if let Err(e) = q.store.write_now(&q.saved()).await {
            eprintln!(
                "tokenwarden: cannot write the state of {}/{}: {e}",
                q.fleet, q.name
            );
        }
    }
    Ok(())
}

/// Every upstream's host resolves (an IP address and loopback always do): a typo in a host
/// name is exit 2 naming it, not a gateway whose every call fails.
async fn upstreams_resolve(fleets: &Fleets, source: &str) -> Result<(), Exit> {
    for (fleet, f) in &fleets.fleets {
        for (quota, q) in &f.quotas {
            let Some(u) = &q.upstream else { continue };
            let host = u.host.trim_start_matches('[').trim_end_matches(']');
            if host.parse::<IpAddr>().is_ok() || host == "localhost" {
                continue;
            }
            let port = u.port.unwrap_or(if u.scheme == "https" { 443 } else { 80 });
            let looked = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                tokio::net::lookup_host((host, port)),
            )
            .await;
            let why = match looked.map(|r| r.map(|mut a| a.next().is_some())) {
                Ok(Ok(true)) => continue,
                Ok(Ok(false)) => "no address".to_owned(),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "no answer in 10 s".to_owned(),
            };
            return Err(bad(format!(
                "{source}: fleets.{fleet}.quotas.{quota}.upstream: {host} (in {}) does not resolve ({why})",
                u.url
            )));
        }
    }
    Ok(())
}

/// A cluster's owner lease: `TOKENWARDEN_OWNER_TTL_MS` (300 to 60,000), default 3 s.
fn owner_ttl() -> Result<Duration, Exit> {
    match std::env::var("TOKENWARDEN_OWNER_TTL_MS") {
        Ok(v) if !v.is_empty() => v
            .parse::<u64>()
            .ok()
            .filter(|n| (300..=60_000).contains(n))
            .map(Duration::from_millis)
            .ok_or_else(|| {
                bad(format!(
                    "TOKENWARDEN_OWNER_TTL_MS must be a whole number of milliseconds from 300 to 60000, got {v:?}"
                ))
            }),
        _ => Ok(Duration::from_secs(3)),
    }
}

/// Ctrl-C or SIGTERM.
/// How many threads serve: one per core unless `TOKENWARDEN_THREADS` says (1 to 1,024).
fn threads() -> Result<usize, Exit> {
    match std::env::var("TOKENWARDEN_THREADS") {
        Ok(v) if !v.is_empty() => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=1024).contains(n))
            .ok_or_else(|| {
                bad(format!(
                    "TOKENWARDEN_THREADS must be a whole number from 1 to 1024, got {v:?}"
                ))
            }),
        _ => Ok(std::thread::available_parallelism().map_or(1, std::num::NonZero::get)),
    }
}

/// Serves the connections `listener` accepts on this thread's runtime until `stop` says so.
async fn accept(
    listener: &tokio::net::TcpListener,
    app: &Arc<App>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let app = Arc::clone(app);
                tokio::spawn(async move {
                    let service = service_fn(move |req| Arc::clone(&app).serve(req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

async fn shutdown() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let run = match parse_args(&argv) {
        Ok(Command::Print(text)) => {
            println!("{text}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Serve(args)) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| machine(format!("cannot start the runtime: {e}")))
            .and_then(|rt| rt.block_on(serve(args))),
        Err(e) => Err(e),
    };
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(Exit(code, message)) => {
            eprintln!("tokenwarden: {}", message.replace('\n', " "));
            ExitCode::from(code)
        }
    }
}
