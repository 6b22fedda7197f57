//! Native `tokenwarden serve` measured beside a bare hyper pass-through proxy, in one run on
//! one machine (issue 43): what serve adds to a model call against what any proxy adds.
//!
//! ```sh
//! cargo build --release -p tokenwarden-serve --examples
//! target/release/examples/proxy_bench run            # [--calls 2000] [--seconds 10]
//!                                                    # [--hostile 30000] [--serve PATH]
//! ```
//!
//! Subcommands:
//!
//! - `mock --port N`: an Anthropic-shaped provider on hyper (the Messages API's JSON with
//!   its usage, or its SSE events for `"stream": true`), small fixed answers, no limits, no
//!   delay.
//! - `bare --upstream URL --port N`: a bare pass-through proxy on hyper (the legacy client's
//!   keep-alive pool): the method, the path with serve's prefix taken off
//!   (`…/anthropic/v1/messages` → `/v1/messages`), the headers and the body forwarded, the
//!   answer streamed back. The floor under any proxy.
//! - `run`: starts `mock`, `bare` (this binary) and `tokenwarden serve` (by default
//!   `target/release/tokenwarden`) on free loopback ports, then measures with an
//!   in-process hyper client (keep-alive): latency one call at a time (direct, through
//!   bare and through serve in turn, so the machine's drift falls on all three), time to
//!   the first byte of a stream, calls per second through 50 connections with 1 and with
//!   1,000 agent names (bare and serve alternating in rounds), the CPU time each proxy's
//!   process spends per call, and serve's memory (RSS) across agents and under 30,000
//!   unauthenticated requests. Prints markdown tables. The children are killed when it
//!   ends, fails or panics.
//!
//! Each call's prompt is new text (a call number in front), so serve's estimator counts it;
//! one row sends a conversation whose earlier turns repeat, which its memo remembers.
//!
//! Port 0 asks for a free port; each server prints the one it got.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::error::Error;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, Uri, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::time::Instant;

/// Any error, sendable between tasks.
type BoxError = Box<dyn Error + Send + Sync>;
/// A result with [`BoxError`].
type Res<T> = Result<T, BoxError>;

/// The fleet secret in the generated config.
const SECRET: &str = "bench-secret-0123456789abcd";
/// Headers of one hop, never forwarded by the bare proxy.
const HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authenticate",
    "host",
];
/// Concurrent connections at saturation and for the hostile requests.
const CONNECTIONS: usize = 50;
/// Alternations of bare and serve at saturation.
const ROUNDS: u32 = 4;
/// Agent names in the many-agents saturation run.
const AGENTS: usize = 1_000;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("proxy_bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let out = rt.block_on(async {
        match argv.first().map(String::as_str) {
            Some("mock") => mock(flag_num(&argv, "--port", 0)?).await,
            Some("bare") => {
                let upstream = flag(&argv, "--upstream").ok_or("bare needs --upstream URL")?;
                bare(&upstream, flag_num(&argv, "--port", 0)?).await
            }
            Some("run") => run(&argv).await,
            _ => Err("usage: proxy_bench mock --port N | bare --upstream URL --port N | run [--calls N] [--seconds S] [--hostile N] [--serve PATH]".into()),
        }
    });
    match out {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("proxy_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The value after `name` in `argv`, if given.
fn flag(argv: &[String], name: &str) -> Option<String> {
    let i = argv.iter().position(|a| a == name)?;
    argv.get(i + 1).cloned()
}

/// The number after `name`, or `default`.
fn flag_num<T: std::str::FromStr>(argv: &[String], name: &str, default: T) -> Res<T> {
    match flag(argv, name) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| format!("{name} must be a number, got {v:?}").into()),
    }
}

// ---------------------------------------------------------------------------------------
// Servers: the mock provider and the bare proxy.

/// Accepts connections on `127.0.0.1:port` forever, each served by `handle` over HTTP/1.1
/// with keep-alive; prints `listening on http://127.0.0.1:<port>` once bound.
async fn listen<F, Fut, B>(port: u16, handle: F) -> Res<()>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service_fn(handle))
                .await;
        });
    }
}

/// A body of frames handed over one at a time, with its exact length when `sized`.
struct Frames {
    chunks: VecDeque<Bytes>,
    sized: bool,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.chunks.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        if self.sized {
            SizeHint::with_exact(self.chunks.iter().map(|c| c.len() as u64).sum())
        } else {
            SizeHint::default()
        }
    }
}

/// Whether `hay` holds `needle`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The mock provider (see the module doc).
async fn mock(port: u16) -> Res<()> {
    listen(port, |req: Request<Incoming>| async move {
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => Bytes::new(),
        };
        // About four bytes a token, as a provider would count the prompt.
        let input = body.len() / 4;
        let stream = contains(&body, b"\"stream\":true");
        let mut res = if stream {
            let event = |name: &str, data: String| Bytes::from(format!("event: {name}\ndata: {data}\n\n"));
            let mut chunks = VecDeque::new();
            chunks.push_back(event("message_start", format!(
                r#"{{"type":"message_start","message":{{"id":"msg_mock","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[],"stop_reason":null,"stop_sequence":null,"usage":{{"input_tokens":{input},"output_tokens":1}}}}}}"#
            )));
            chunks.push_back(event("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.into()));
            for _ in 0..3 {
                chunks.push_back(event("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello "}}"#.into()));
            }
            chunks.push_back(event("content_block_stop", r#"{"type":"content_block_stop","index":0}"#.into()));
            chunks.push_back(event("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":5}}"#.into()));
            chunks.push_back(event("message_stop", r#"{"type":"message_stop"}"#.into()));
            let mut res = Response::new(Frames { chunks, sized: false });
            res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
            res.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            res
        } else {
            let json = format!(
                r#"{{"id":"msg_mock","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{{"type":"text","text":"hello hello hello hello hello"}}],"stop_reason":"end_turn","stop_sequence":null,"usage":{{"input_tokens":{input},"output_tokens":5}}}}"#
            );
            let mut res = Response::new(Frames { chunks: VecDeque::from([Bytes::from(json)]), sized: true });
            res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            res
        };
        res.headers_mut().insert("request-id", HeaderValue::from_static("req_mock"));
        Ok::<_, Infallible>(res)
    })
    .await
}

/// The provider's path in a path through serve: what follows `…/anthropic` (or `…/openai`)
/// before `/v1/`, as serve forwards it; other paths as they are.
fn provider_path(path: &str) -> &str {
    for tail in ["/anthropic/v1/", "/openai/v1/"] {
        if let Some(i) = path.find(tail) {
            return &path[i + tail.len() - "/v1/".len()..];
        }
    }
    path
}

/// The bare proxy's answer body: the upstream's, or a short error.
type BareBody = BoxBody<Bytes, hyper::Error>;

/// The bare proxy (see the module doc).
async fn bare(upstream: &str, port: u16) -> Res<()> {
    let base: Arc<str> = upstream.trim_end_matches('/').into();
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector);
    listen(port, move |req: Request<Incoming>| {
        let client = client.clone();
        let base = Arc::clone(&base);
        async move {
            let (mut parts, body) = req.into_parts();
            let path = provider_path(parts.uri.path());
            let query = parts
                .uri
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default();
            let fail = |status: StatusCode, message: String| {
                let mut res = Response::new(
                    Full::new(Bytes::from(message))
                        .map_err(|never| match never {})
                        .boxed(),
                );
                *res.status_mut() = status;
                Ok::<Response<BareBody>, Infallible>(res)
            };
            let uri: Uri = match format!("{base}{path}{query}").parse() {
                Ok(u) => u,
                Err(e) => return fail(StatusCode::BAD_REQUEST, format!("bad path: {e}")),
            };
            parts.uri = uri;
            for h in HOP {
                parts.headers.remove(h);
            }
            match client.request(Request::from_parts(parts, body)).await {
                Ok(res) => {
                    let (mut head, body) = res.into_parts();
                    for h in HOP {
                        head.headers.remove(h);
                    }
                    Ok(Response::from_parts(head, body.boxed()))
                }
                Err(e) => fail(StatusCode::BAD_GATEWAY, format!("upstream: {e}")),
            }
        }
    })
    .await
}

// ---------------------------------------------------------------------------------------
// The children of `run`.

/// The processes `run` started (and its temporary directory): killed and removed on drop,
/// so an error or a panic leaves nothing running.
struct Children {
    procs: Vec<(String, Child)>,
    dir: PathBuf,
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.procs {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Children {
    /// Starts `program args`, its stdout read until a line holding `marker` followed by
    /// `http://<addr>`; returns that address (the rest of its stdout is drained).
    fn start(
        &mut self,
        name: &str,
        program: &Path,
        args: &[&str],
        marker: &str,
    ) -> Res<SocketAddr> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {name} ({}): {e}", program.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        self.procs.push((name.to_owned(), child));
        let (tx, rx) = std::sync::mpsc::channel();
        let marker = marker.to_owned();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sent {
                    continue;
                }
                if let Some(at) = line.find(&marker) {
                    let rest = &line[at + marker.len()..];
                    let addr = rest
                        .trim_start()
                        .strip_prefix("http://")
                        .and_then(|a| a.split_whitespace().next())
                        .map(str::to_owned);
                    let _ = tx.send(addr);
                    sent = true;
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| format!("{name} printed no address within 30 s (or exited)"))?
            .ok_or_else(|| format!("{name}'s address line could not be read"))?;
        Ok(addr
            .parse()
            .map_err(|e| format!("{name}'s address {addr:?}: {e}"))?)
    }

    /// An error if a child has exited.
    fn alive(&mut self) -> Res<()> {
        for (name, child) in &mut self.procs {
            if let Some(status) = child.try_wait()? {
                return Err(format!("{name} exited ({status})").into());
            }
        }
        Ok(())
    }

    /// The process id of the child `name`.
    fn pid(&self, name: &str) -> u32 {
        self.procs
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, c)| c.id())
    }
}

/// A process's resident set size, KiB (0 if it cannot be read).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// A fresh name part: `n` random alphanumerics from a small PRNG (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let mut seed = [0u8; 8];
        let _ = getrandom::fill(&mut seed);
        Rng(u64::from_le_bytes(seed) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn text(&mut self, n: usize) -> String {
        const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..n)
            .map(|_| char::from(ABC[(self.next() % ABC.len() as u64) as usize]))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// The client.

/// One keep-alive HTTP/1.1 connection of the measuring client.
struct Conn {
    addr: SocketAddr,
    tx: SendRequest<Full<Bytes>>,
}

/// One call's outcome.
struct Done {
    status: u16,
    /// From the request sent to the last body byte.
    total: Duration,
    /// From the request sent to the first body byte.
    first: Duration,
    /// The body's start when the status is not 200.
    error: Option<String>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Res<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { addr, tx })
    }

    /// Sends `req` and reads its answer whole (reconnecting first if the server closed the
    /// connection).
    async fn call(&mut self, mut req: Request<Full<Bytes>>) -> Res<Done> {
        if self.tx.is_closed() || self.tx.ready().await.is_err() {
            *self = Conn::open(self.addr).await?;
        }
        req.headers_mut()
            .insert(header::HOST, HeaderValue::from_str(&self.addr.to_string())?);
        let t0 = Instant::now();
        let res = self.tx.send_request(req).await?;
        let status = res.status().as_u16();
        let mut body = res.into_body();
        let mut first = None;
        let mut error = (status != 200).then(Vec::new);
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            if let Some(d) = frame.data_ref() {
                if first.is_none() && !d.is_empty() {
                    first = Some(t0.elapsed());
                }
                if let Some(e) = error.as_mut().filter(|e| e.len() < 600) {
                    e.extend_from_slice(d);
                }
            }
        }
        let total = t0.elapsed();
        Ok(Done {
            status,
            total,
            first: first.unwrap_or(total),
            error: error.map(|e| String::from_utf8_lossy(&e).into_owned()),
        })
    }
}

/// Where calls go: the mock directly, or through a proxy.
#[derive(Clone, Copy)]
struct Target {
    name: &'static str,
    addr: SocketAddr,
    proxied: bool,
}

impl Target {
    fn path(&self, agent: usize) -> String {
        if self.proxied {
            format!(
                "/v1/fleets/bench/quotas/anthropic/agents/agent-{agent}/worker/anthropic/v1/messages"
            )
        } else {
            "/v1/messages".into()
        }
    }
}

/// What a call sends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Prompt {
    /// About 200 bytes, new text each call.
    Small,
    /// About 50 KB, all of it new text each call.
    LargeNew,
    /// About 50 KB as a conversation: earlier turns the same each call, the last message new.
    LargeTurns,
}

/// Prose to fill a prompt with.
const PROSE: &str = "The agent opened src/lib.rs, read the function that parses the config, and found that the error path drops the file name; it proposes a patch and a test. ";

/// A Messages API request body: `model`, `max_tokens`, the messages, `stream` if asked.
fn request_body(prompt: Prompt, call: usize, stream: bool) -> Bytes {
    let fill = |n: usize| PROSE.repeat(n / PROSE.len() + 1)[..n].to_owned();
    let user = |text: String| serde_json::json!({ "role": "user", "content": text });
    let messages = match prompt {
        Prompt::Small => vec![user(format!("call {call}: {}", fill(90)))],
        Prompt::LargeNew => vec![user(format!("call {call}: {}", fill(50_000)))],
        Prompt::LargeTurns => vec![
            user(format!("turn 1: {}", fill(16_500))),
            serde_json::json!({ "role": "assistant", "content": format!("turn 2: {}", fill(16_500)) }),
            user(format!("turn 3: {}", fill(16_500))),
            serde_json::json!({ "role": "assistant", "content": "Done." }),
            user(format!("call {call}: {}", fill(90))),
        ],
    };
    let mut body = serde_json::json!({
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "messages": messages,
    });
    if stream {
        body["stream"] = serde_json::Value::Bool(true);
    }
    Bytes::from(body.to_string())
}

/// A proxied model call's request.
fn model_call(path: &str, body: Bytes) -> Res<Request<Full<Bytes>>> {
    Ok(Request::post(path)
        .header("x-api-key", "k")
        .header("anthropic-version", "2023-06-01")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))?)
}

/// Statuses other than 200 seen by a target, and the first such answer's body.
#[derive(Default)]
struct Faults {
    by_target: BTreeMap<String, BTreeMap<u16, usize>>,
    first: BTreeMap<String, String>,
}

impl Faults {
    fn note(&mut self, target: &str, done: &Done) {
        if done.status == 200 {
            return;
        }
        *self
            .by_target
            .entry(target.to_owned())
            .or_default()
            .entry(done.status)
            .or_default() += 1;
        if let Some(e) = &done.error {
            self.first
                .entry(target.to_owned())
                .or_insert_with(|| format!("{}: {e}", done.status));
        }
    }
}

/// The `p`th percentile of `xs` (sorted here), ms.
fn pct(xs: &mut [Duration], p: f64) -> f64 {
    xs.sort_unstable();
    if xs.is_empty() {
        return f64::NAN;
    }
    let i = ((xs.len() as f64 * p / 100.0).ceil() as usize).clamp(1, xs.len()) - 1;
    xs[i].as_secs_f64() * 1_000.0
}

/// One call at a time to each target in turn (interleaved, so the machine's drift falls on
/// all alike): `(total, first byte)` durations per target, 200 answers only.
async fn one_at_a_time(
    targets: &[Target],
    prompt: Prompt,
    stream: bool,
    warm: usize,
    calls: usize,
    faults: &mut Faults,
) -> Res<Vec<(Vec<Duration>, Vec<Duration>)>> {
    let mut conns = Vec::new();
    for t in targets {
        conns.push(Conn::open(t.addr).await?);
    }
    let mut out = vec![(Vec::new(), Vec::new()); targets.len()];
    for i in 0..warm + calls {
        for (k, t) in targets.iter().enumerate() {
            let req = model_call(&t.path(0), request_body(prompt, i, stream))?;
            let done = conns[k].call(req).await?;
            faults.note(t.name, &done);
            if i >= warm && done.status == 200 {
                out[k].0.push(done.total);
                out[k].1.push(done.first);
            }
        }
    }
    Ok(out)
}

/// Calls through [`CONNECTIONS`] connections for `warm` then `time`, each connection's calls
/// one after another; agent names cycle through `agents`. Calls per second (200 answers
/// completed within `time`) and their latencies.
async fn saturate(
    t: Target,
    agents: usize,
    warm: Duration,
    time: Duration,
    faults: &Arc<Mutex<Faults>>,
    pid: u32,
) -> Res<Sat> {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now() + warm;
    let end = start + time;
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(start).await;
        let before = cpu_ticks(pid);
        tokio::time::sleep_until(end).await;
        cpu_ticks(pid).saturating_sub(before)
    });
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let next = Arc::clone(&next);
        let faults = Arc::clone(faults);
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(t.addr).await?;
            let mut lat = Vec::new();
            let mut ok = 0usize;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let req = model_call(&t.path(i % agents), request_body(Prompt::Small, i, false))?;
                let sent = Instant::now();
                let done = conn.call(req).await?;
                let now = Instant::now();
                if now >= end {
                    break;
                }
                if done.status != 200 {
                    faults.lock().await.note(t.name, &done);
                }
                if sent >= start && done.status == 200 {
                    ok += 1;
                    lat.push(done.total);
                }
            }
            Ok::<_, BoxError>((ok, lat))
        }));
    }
    let mut ok = 0;
    let mut lat = Vec::new();
    for task in tasks {
        let (n, l) = task.await??;
        ok += n;
        lat.extend(l);
    }
    Ok(Sat {
        calls: ok,
        seconds: time.as_secs_f64(),
        cpu_ticks: cpu.await?,
        latencies: lat,
    })
}

/// A saturation window's outcome.
#[derive(Default)]
struct Sat {
    /// Calls answered 200 within the window.
    calls: usize,
    /// The window.
    seconds: f64,
    /// CPU time of the measured process in the window, clock ticks.
    cpu_ticks: u64,
    /// Each call's latency.
    latencies: Vec<Duration>,
}

impl Sat {
    /// Another window's figures added to these.
    fn add(&mut self, other: Sat) {
        self.calls += other.calls;
        self.seconds += other.seconds;
        self.cpu_ticks += other.cpu_ticks;
        self.latencies.extend(other.latencies);
    }

    fn rate(&self) -> f64 {
        self.calls as f64 / self.seconds
    }

    /// The measured process's CPU time per call, µs.
    fn cpu_per_call_us(&self) -> f64 {
        self.cpu_ticks as f64 * 1e6 / TICKS_PER_SECOND / self.calls.max(1) as f64
    }
}

/// Linux's `USER_HZ` (the unit of `/proc/<pid>/stat`'s CPU times), 100 on every common
/// architecture.
const TICKS_PER_SECOND: f64 = 100.0;

/// A process's CPU time so far (user + system), clock ticks (0 if it cannot be read).
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    // After the command's name: state is field 3, utime field 14, stime field 15.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// Unauthenticated requests through [`CONNECTIONS`] connections: half to the quota's
/// metrics with a wrong 200-character bearer, half to unknown fleets (a new name each) with
/// a 4 kB bearer. The statuses seen.
async fn hostile(addr: SocketAddr, n: usize) -> Res<BTreeMap<u16, usize>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await?;
            let mut rng = Rng::new();
            let mut seen = BTreeMap::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let (path, bearer) = if i.is_multiple_of(2) {
                    (
                        "/v1/fleets/bench/quotas/anthropic/metrics".to_owned(),
                        rng.text(200),
                    )
                } else {
                    (
                        format!("/v1/fleets/{}/quotas/anthropic/metrics", rng.text(12)),
                        rng.text(4_096),
                    )
                };
                let req = Request::get(path)
                    .header(header::AUTHORIZATION, format!("Bearer {bearer}"))
                    .body(Full::new(Bytes::new()))?;
                let done = conn.call(req).await?;
                *seen.entry(done.status).or_insert(0usize) += 1;
            }
            Ok::<_, BoxError>(seen)
        }));
    }
    let mut seen = BTreeMap::new();
    for task in tasks {
        for (status, count) in task.await?? {
            *seen.entry(status).or_insert(0) += count;
        }
    }
    Ok(seen)
}

/// Waits until `t` answers a model call 200 (up to 30 s).
async fn ready(t: Target) -> Res<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(mut conn) = Conn::open(t.addr).await {
            match conn
                .call(model_call(
                    &t.path(0),
                    request_body(Prompt::Small, 0, false),
                )?)
                .await
            {
                Ok(d) if d.status == 200 => return Ok(()),
                Ok(d) => last = format!("{}: {}", d.status, d.error.unwrap_or_default()),
                Err(e) => last = e.to_string(),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "{} did not answer a model call 200 within 30 s (last: {last})",
        t.name
    )
    .into())
}

/// Milliseconds to three decimals.
fn ms(x: f64) -> String {
    format!("{x:.3} ms")
}

/// MiB from KiB, one decimal.
fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// `serve ÷ bare` with the goal's verdict (`≤ limit` when `at_most`, else `≥ limit`); no
/// ratio when bare's figure is not above zero (the difference of two noisy percentiles).
fn verdict(serve: f64, bare: f64, limit: f64, at_most: bool) -> String {
    if bare <= 0.0 {
        return "no ratio (bare adds nothing measurable here)".into();
    }
    let ratio = serve / bare;
    let met = if at_most {
        ratio <= limit
    } else {
        ratio >= limit
    };
    format!(
        "{ratio:.2}× ({} {limit}×: {})",
        if at_most { "≤" } else { "≥" },
        if met { "met" } else { "**not met**" }
    )
}

/// The machine's load averages (`/proc/loadavg`'s first three fields).
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The benchmark (see the module doc).
async fn run(argv: &[String]) -> Res<()> {
    let calls: usize = flag_num(argv, "--calls", 2_000)?;
    let seconds: f64 = flag_num(argv, "--seconds", 10.0)?;
    let hostile_n: usize = flag_num(argv, "--hostile", 30_000)?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("no workspace root")?;
    let serve_bin = flag(argv, "--serve")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/release/tokenwarden"));
    if !serve_bin.is_file() {
        return Err(format!(
            "{} not found: cargo build --release -p tokenwarden-serve (or --serve PATH)",
            serve_bin.display()
        )
        .into());
    }
    let me = std::env::current_exe()?;
    let dir = std::env::temp_dir().join(format!(
        "tokenwarden-proxy-bench-{}-{}",
        std::process::id(),
        Rng::new().text(8)
    ));
    std::fs::create_dir_all(&dir)?;
    let mut kids = Children {
        procs: Vec::new(),
        dir: dir.clone(),
    };

    let load_before = load();
    let mock_addr = kids.start("mock", &me, &["mock", "--port", "0"], "listening on")?;
    let upstream = format!("http://{mock_addr}");
    let big = 1_000_000_000u64;
    let config = serde_json::json!({ "fleets": { "bench": {
        "secret": SECRET,
        "proxy_open": true,
        "quotas": { "anthropic": {
            "upstream": upstream,
            "config": {
                "pools": [{ "name": "claude-sonnet-4-6", "input_tokens_per_minute": big, "output_tokens_per_minute": big, "requests_per_minute": big }],
                "max_agents": 2_000,
            },
        } },
    } } });
    let config_file = dir.join("tokenwarden.json");
    std::fs::write(&config_file, config.to_string())?;
    let data = dir.join("data");
    let bare_addr = kids.start(
        "bare",
        &me,
        &["bare", "--upstream", &upstream, "--port", "0"],
        "listening on",
    )?;
    let serve_addr = kids.start(
        "serve",
        &serve_bin,
        &[
            "serve",
            "--config",
            config_file.to_str().ok_or("temp path is not UTF-8")?,
            "--data",
            data.to_str().ok_or("temp path is not UTF-8")?,
            "--port",
            "0",
            "--host",
            "127.0.0.1",
        ],
        "the limiter on",
    )?;
    let direct = Target {
        name: "direct",
        addr: mock_addr,
        proxied: false,
    };
    let bare_t = Target {
        name: "bare",
        addr: bare_addr,
        proxied: true,
    };
    let serve_t = Target {
        name: "serve",
        addr: serve_addr,
        proxied: true,
    };
    for t in [direct, bare_t, serve_t] {
        ready(t).await?;
    }
    let serve_pid = kids.pid("serve");
    let bare_pid = kids.pid("bare");
    let mut memory: Vec<(String, u64, u64)> = Vec::new();
    let mut mem =
        |what: &str| memory.push((what.to_owned(), rss_kib(serve_pid), rss_kib(bare_pid)));
    mem("at start (one call answered)");
    eprintln!(
        "proxy_bench: mock {mock_addr}, bare {bare_addr}, serve {serve_addr} (pid {serve_pid})"
    );

    // 1. One call at a time.
    let targets = [direct, bare_t, serve_t];
    let mut faults = Faults::default();
    let warm = 300.min(calls);
    let mut latency_rows = Vec::new();
    for (label, prompt) in [
        ("~200 B body", Prompt::Small),
        ("~50 KB body, all new text each call", Prompt::LargeNew),
        (
            "~50 KB body, earlier turns repeated, last message new",
            Prompt::LargeTurns,
        ),
    ] {
        eprintln!("proxy_bench: one at a time, {label}");
        let mut r = one_at_a_time(&targets, prompt, false, warm, calls, &mut faults).await?;
        kids.alive()?;
        let size = request_body(prompt, 0, false).len();
        for p in [50.0, 99.0] {
            let d = pct(&mut r[0].0, p);
            let b = pct(&mut r[1].0, p);
            let s = pct(&mut r[2].0, p);
            latency_rows.push((format!("{label} ({size} B), p{p}"), d, b, s));
        }
    }
    {
        eprintln!("proxy_bench: one at a time, first byte of a stream");
        let mut r = one_at_a_time(&targets, Prompt::Small, true, warm, calls, &mut faults).await?;
        kids.alive()?;
        for p in [50.0, 99.0] {
            let d = pct(&mut r[0].1, p);
            let b = pct(&mut r[1].1, p);
            let s = pct(&mut r[2].1, p);
            latency_rows.push((
                format!("first byte of a stream (~200 B body), p{p}"),
                d,
                b,
                s,
            ));
        }
    }
    mem("after the one-at-a-time calls");

    // 2. Saturation.
    let warm_t = Duration::from_millis(500);
    let time = Duration::from_secs_f64(seconds);
    let faults = Arc::new(Mutex::new(faults));
    eprintln!("proxy_bench: saturation, direct");
    let mock_pid = kids.pid("mock");
    let mut direct_sat = saturate(direct, 1, warm_t, time, &faults, mock_pid).await?;
    let mut sat_rows = Vec::new();
    // Rounds of bare then serve, a part of the time each, summed: drift falls on both.
    let part = time / ROUNDS;
    for agents in [1, AGENTS] {
        let (mut b, mut s) = (Sat::default(), Sat::default());
        for round in 0..ROUNDS {
            eprintln!(
                "proxy_bench: saturation, {agents} agent(s), round {}",
                round + 1
            );
            b.add(saturate(bare_t, agents, warm_t, part, &faults, bare_pid).await?);
            s.add(saturate(serve_t, agents, warm_t, part, &faults, serve_pid).await?);
            kids.alive()?;
        }
        sat_rows.push((agents, b, s));
        mem(&format!("after the {agents}-agent saturation runs"));
    }
    // The same 1,000 names once more through serve: growth here is not from new agents.
    eprintln!("proxy_bench: saturation, {AGENTS} agents again (serve only)");
    saturate(serve_t, AGENTS, warm_t, time, &faults, serve_pid).await?;
    kids.alive()?;
    mem(&format!(
        "after {seconds} s more through serve with the same {AGENTS} names"
    ));

    // 3. Hostile requests.
    tokio::time::sleep(Duration::from_secs(1)).await;
    mem("before the unauthenticated requests (idle 1 s)");
    eprintln!("proxy_bench: {hostile_n} unauthenticated requests");
    let statuses = hostile(serve_addr, hostile_n).await?;
    kids.alive()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    mem(&format!(
        "after {hostile_n} unauthenticated requests (idle 1 s)"
    ));
    ready(serve_t).await?;
    let faults = faults.lock().await;

    // The tables.
    println!(
        "\nserve: {}; load average before {load_before}, after {}",
        serve_bin.display(),
        load()
    );
    println!(
        "\nCommand: `{}`",
        std::iter::once(me.display().to_string())
            .chain(argv.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "\nOne call at a time ({calls} calls per target per row after {warm} to warm up, the targets interleaved; added = through the proxy − direct):\n"
    );
    println!(
        "| call | direct | through bare | through serve | bare adds | serve adds | serve adds ÷ bare adds (goal ≤ 1.3×) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    for (label, d, b, s) in &latency_rows {
        println!(
            "| {label} | {} | {} | {} | {} | {} | {} |",
            ms(*d),
            ms(*b),
            ms(*s),
            ms(b - d),
            ms(s - d),
            verdict(s - d, b - d, 1.3, true)
        );
    }
    println!(
        "\nSaturation: {CONNECTIONS} connections, each one call after another, ~200 B bodies, new text each call; {seconds} s per target ({ROUNDS} rounds of bare then serve, {:.1} s each, each after 0.5 s to warm up on new connections); direct to the mock: {:.0} calls/s (p50 {}, the mock's CPU {:.0} µs per call):\n",
        part.as_secs_f64(),
        direct_sat.rate(),
        ms(pct(&mut direct_sat.latencies, 50.0)),
        direct_sat.cpu_per_call_us(),
    );
    println!(
        "| agent names | bare calls/s | serve calls/s | serve ÷ bare (goal ≥ 0.5×) | latency p50 bare / serve | p99 bare / serve | CPU per call of the proxy's process, bare / serve |"
    );
    println!("|---|---:|---:|---|---|---|---|");
    for (agents, b, s) in &mut sat_rows {
        println!(
            "| {agents} | {:.0} | {:.0} | {} | {} / {} | {} / {} | {:.0} µs / {:.0} µs |",
            b.rate(),
            s.rate(),
            verdict(s.rate(), b.rate(), 0.5, false),
            ms(pct(&mut b.latencies, 50.0)),
            ms(pct(&mut s.latencies, 50.0)),
            ms(pct(&mut b.latencies, 99.0)),
            ms(pct(&mut s.latencies, 99.0)),
            b.cpu_per_call_us(),
            s.cpu_per_call_us(),
        );
    }
    println!("\nMemory (VmRSS):\n");
    println!("| when | serve | bare (for scale) |");
    println!("|---|---:|---:|");
    for (what, s, b) in &memory {
        println!("| {what} | {} | {} |", mib(*s), mib(*b));
    }
    let at = |prefix: &str| {
        memory
            .iter()
            .find(|m| m.0.starts_with(prefix))
            .map_or(0, |m| m.1)
    };
    let agents_growth = at("after the 1000-agent") as i64 - at("after the 1-agent") as i64;
    let again = memory
        .iter()
        .find(|m| m.0.contains("the same"))
        .map_or(0, |m| m.1);
    let again_growth = again as i64 - at("after the 1000-agent") as i64;
    let hostile_growth = at(&format!("after {hostile_n}")) as i64 - at("before the unauth") as i64;
    let statuses = statuses
        .iter()
        .map(|(s, n)| format!("{s} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "\nserve's growth from the 1-agent runs to the {AGENTS}-agent runs: {:+.1} MiB, then {:+.1} MiB with the same {AGENTS} names again; across {hostile_n} unauthenticated requests: {:+.1} MiB (goal ≤ +20 MiB: {}), answered {statuses}",
        agents_growth as f64 / 1024.0,
        again_growth as f64 / 1024.0,
        hostile_growth as f64 / 1024.0,
        if hostile_growth <= 20 * 1024 {
            "met"
        } else {
            "**not met**"
        },
    );
    if faults.by_target.is_empty() {
        println!("\nEvery model call was answered 200.");
    } else {
        println!("\nModel calls answered other than 200:");
        for (t, by) in &faults.by_target {
            println!(
                "- {t}: {by:?}; the first: {}",
                faults.first.get(t).map_or("", String::as_str)
            );
        }
    }
    drop(kids);
    Ok(())
}
