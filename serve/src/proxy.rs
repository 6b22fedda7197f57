//! Proxy mode: a provider call sent through the quota's coordinator. What is sent and what
//! names the call is the gateway crate's rule (`proxy::proxied_call`); the call itself —
//! lease, wait, send, renew while the answer streams, settle from its usage, a 429 answered
//! by the core — is the tokio host's tower layer over a hyper client. The agent's API key
//! headers pass through untouched and are never stored or logged.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, Uri, header};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokenwarden_gateway::proxy::{self as proxy_rules, Incoming as Asked, proxied_call};
use tokenwarden_provider::errors::Stop;
use tokenwarden_provider::estimate::Provider;
use tokenwarden_provider::identity::task_id_for;
use tokenwarden_tokio::layer::TokenwardenLayer;
use tokenwarden_tokio::{Agent, Error as HostError, MeteredBody};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tower_layer::Layer;
use tower_service::Service;

use crate::app::read_body;
use crate::quota::{Live, Quota};
use crate::reply::{BoxError, Failure, Reply, json as json_reply, refusal};
use crate::store::Store;

/// How long a streamed call may go without an answer before its head is sent.
const KEEPALIVE_AFTER: Duration = Duration::from_millis(proxy_rules::KEEPALIVE_AFTER_MS);
/// Between two keep-alive comments on a waiting stream.
const KEEPALIVE_EVERY: Duration = Duration::from_millis(proxy_rules::KEEPALIVE_EVERY_MS);
/// How long a proxied call's grant may gather with others before its write.
const SEND_FLUSH: Duration = Duration::from_millis(50);
/// Headers of one hop, never handed on.
const HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authenticate",
];

/// The HTTP client every proxied call goes out on (HTTPS with the web's roots, or HTTP).
#[derive(Clone)]
pub(crate) struct Upstream {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Upstream {
    /// This thread's client: each serving thread keeps its own connections to the
    /// providers, so a call's answer comes back on the thread that sent it.
    pub(crate) fn here() -> Upstream {
        thread_local! {
            static HERE: Upstream = Upstream::new();
        }
        HERE.with(Upstream::clone)
    }

    /// Sends `req` on this thread's connections (another instance's, for a forwarded call).
    pub(crate) async fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, hyper_util::client::legacy::Error> {
        self.client.request(req).await
    }

    fn new() -> Upstream {
        // Small writes go out at once (a request head, then its body).
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Upstream {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(https),
        }
    }
}

/// The provider could not be reached (a connection that failed, not an answer).
#[derive(Debug)]
struct Unreachable(String);

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the provider could not be reached: {}", self.0)
    }
}

impl std::error::Error for Unreachable {}

/// The client as the tower layer's inner service: marks the call sent (its lease written
/// soon, so a restart still charges it) and names a failure to connect.
#[derive(Clone)]
struct Send {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    sent: Arc<AtomicBool>,
    store: Arc<Store>,
}

impl Service<Request<Full<Bytes>>> for Send {
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future =
        Pin<Box<dyn Future<Output = Result<Response<Incoming>, BoxError>> + std::marker::Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Full<Bytes>>) -> Self::Future {
        self.sent.store(true, Ordering::Relaxed);
        self.store.changed(SEND_FLUSH);
        let fut = self.client.request(req);
        Box::pin(async move {
            fut.await.map_err(|e| {
                let mut why = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    why = format!("{why}: {s}");
                    src = s.source();
                }
                Box::new(Unreachable(why)) as BoxError
            })
        })
    }
}

/// A proxied call (see the module doc).
#[expect(
    clippy::too_many_arguments,
    reason = "one request's parts, read once by the caller"
)]
pub(crate) async fn call(
    up: &Upstream,
    q: &Arc<Quota>,
    live: &Live,
    parts: &http::request::Parts,
    body: &mut Incoming,
    path: &str,
    query: &str,
    secrets: &[&str],
    who: Option<&str>,
    max: usize,
) -> Result<Reply, Failure> {
    let Some(upstream) = q.conf.upstream.as_ref() else {
        return Err(refusal(
            404,
            "not_found",
            "this quota has no upstream configured for proxy mode",
        ));
    };
    // The headers as text (one that is not is not handed on), and as they came.
    let given: Vec<(&HeaderName, &HeaderValue)> = parts
        .headers
        .iter()
        .filter(|(_, v)| v.to_str().is_ok())
        .collect();
    let headers: Vec<(&str, &str)> = given
        .iter()
        .map(|(n, v)| (n.as_str(), v.to_str().unwrap_or_default()))
        .collect();
    let read = proxied_call(&Asked {
        rest: &path["/proxy".len()..],
        search: query,
        headers: &headers,
        secrets,
        credential: who,
    })?;
    let provider = Provider::from_name(read.provider).unwrap_or(Provider::Anthropic);
    let text = read_body(
        body,
        headers
            .iter()
            .find(|(n, _)| *n == "content-length")
            .map(|(_, v)| *v),
        max,
    )
    .await?;
    let mut agent = Agent::id(q.agent_id(&read.name)).role(read.role);
    if let Some(root) = &read.family {
        agent = agent.family(tokenwarden_core::AgentId(q.agent_id(root)));
    }
    if let Some(t) = &read.task {
        agent = agent.task(tokenwarden_core::TaskId(task_id_for(t)));
    }
    if let Some(n) = read.unblocks {
        agent = agent.unblocks(n);
    }
    if let Some(s) = read.failure_signature {
        agent = agent.failure_signature(s);
    }
    let base = upstream
        .url
        .split(['?', '#'])
        .next()
        .unwrap_or_default()
        .trim_end_matches('/');
    let uri: Uri = format!("{base}{}{}", read.path, read.query)
        .parse()
        .map_err(|_| {
            refusal(
                400,
                "invalid_argument",
                "the provider's path cannot be sent",
            )
        })?;
    let mut req = Request::builder().method(parts.method.clone()).uri(uri);
    for i in &read.headers {
        let (n, v) = given[*i];
        req = req.header(n, v);
    }
    let stream = wants_stream(&text);
    let req = req.body(Full::new(text)).map_err(|e| {
        refusal(
            400,
            "invalid_argument",
            format!("the call cannot be sent: {e}"),
        )
    })?;
    let sent = Arc::new(AtomicBool::new(false));
    let inner = Send {
        client: up.client.clone(),
        sent: Arc::clone(&sent),
        store: Arc::clone(&q.store),
    };
    let mut service = TokenwardenLayer::new(live.tw.clone(), agent).layer(inner);
    let mut answer = service.call(req);
    if !stream {
        return answered(answer.await, provider);
    }
    // A streamed call with no answer within KEEPALIVE_AFTER (waiting in line, or for a 429
    // to clear) gets its head now and SSE comments until the provider's stream follows: the
    // client sees a live connection, and one that went away is noticed when a write to it
    // fails — the call is then withdrawn, not forwarded for nobody.
    if let Ok(res) = tokio::time::timeout(KEEPALIVE_AFTER, &mut answer).await {
        return answered(res, provider);
    }
    if sent.load(Ordering::Relaxed) {
        return answered(answer.await, provider);
    }
    let (tx, rx) = mpsc::channel(16);
    let task = tokio::spawn(kept_alive(answer, provider, sent, tx));
    let mut res = Response::new(KeptAlive { rx, task }.boxed_unsync());
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-tokenwarden-kept-alive", HeaderValue::from_static("1"));
    Ok(res)
}

type Answer = Result<Response<MeteredBody<Incoming>>, BoxError>;

/// Whether a provider request body asks for a stream (`"stream": true`).
fn wants_stream(text: &[u8]) -> bool {
    // Most calls do not ask: no second parse of a large body for them.
    let asks = text.windows(8).any(|w| w == b"\"stream\"");
    asks && serde_json::from_slice::<Value>(text)
        .is_ok_and(|v| v.get("stream") == Some(&Value::Bool(true)))
}

/// Why a call ended without an answer: not reached (502) or timed out (504).
fn failure_of(e: &BoxError) -> Option<(Stop, &'static str, String)> {
    if let Some(u) = e.downcast_ref::<Unreachable>() {
        return Some((Stop::Unreachable, "upstream_unreachable", u.to_string()));
    }
    if let Some(t @ HostError::UpstreamTimeout { .. }) = e.downcast_ref::<HostError>() {
        let m = t.to_string();
        let m = m.strip_prefix("tokenwarden: ").unwrap_or(&m).to_owned();
        return Some((Stop::TimedOut, "upstream_timeout", m));
    }
    None
}

/// The answer to hand the client.
fn answered(res: Answer, provider: Provider) -> Result<Reply, Failure> {
    match res {
        Ok(res) => Ok(handed(res, provider)),
        Err(e) => Err(match failure_of(&e) {
            Some((stop, code, message)) => Failure::Stopped {
                stop,
                body: json!({}),
                code,
                message,
            },
            None => refusal(500, "internal", format!("the call failed: {e}")),
        }),
    }
}

/// The provider's answer as the client gets it: its own status, headers (not those of one
/// hop) and body — except a redirect, which is not handed on: a client following it would
/// send its API key and the fleet's secret to wherever it points (a 502 in the provider's
/// format names where it pointed).
fn handed(res: Response<MeteredBody<Incoming>>, provider: Provider) -> Reply {
    let status = res.status().as_u16();
    if (300..400).contains(&status) && status != 304 {
        let location = res
            .headers()
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok());
        let (status, body) = proxy_rules::redirect_answer(provider.name(), status, location);
        return json_reply(status, &body);
    }
    let (mut head, body) = res.into_parts();
    for h in HOP {
        head.headers.remove(h);
    }
    Response::from_parts(head, body.boxed_unsync())
}

/// A streamed call answered before its outcome is known (see [`call`]): SSE comments while
/// it waits, then the provider's stream — or one SSE `error` event in the provider's format.
async fn kept_alive(
    mut answer: Pin<Box<dyn Future<Output = Answer> + std::marker::Send>>,
    provider: Provider,
    sent: Arc<AtomicBool>,
    tx: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
) {
    let mut ping = tokio::time::interval(KEEPALIVE_EVERY);
    let res = loop {
        tokio::select! {
            res = &mut answer => break res,
            _ = ping.tick() => {
                let comment = proxy_rules::keepalive_comment(sent.load(Ordering::Relaxed));
                if tx.send(Ok(Frame::data(Bytes::from_static(comment.as_bytes())))).await.is_err() {
                    // The client is gone: dropping the call withdraws it.
                    return;
                }
            }
        }
    };
    let name = provider.name();
    let frame = match res {
        Ok(res) => {
            let streams = res
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|t| t.contains("text/event-stream"));
            let status = res.status().as_u16();
            let mut body = res.into_body();
            if (200..300).contains(&status) && streams {
                while let Some(f) = body.frame().await {
                    if tx.send(f).await.is_err() {
                        return;
                    }
                }
                return;
            }
            // An answer that is not a stream (an error, or JSON though a stream was asked):
            // its error in the provider's event format.
            let raw = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            Bytes::from(proxy_rules::answer_as_stream_error(name, status, &raw))
        }
        Err(e) => Bytes::from(match failure_of(&e) {
            Some((stop, code, message)) => {
                proxy_rules::failure_event(name, stop.status(), code, &message)
            }
            None => proxy_rules::failure_event(name, 500, "internal", &e.to_string()),
        }),
    };
    let _ = tx.send(Ok(Frame::data(frame))).await;
}

/// The body of a kept-alive stream: what [`kept_alive`] sends; dropped (the client went
/// away), the call is dropped with it.
struct KeptAlive {
    rx: mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
    task: JoinHandle<()>,
}

impl Drop for KeptAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Body for KeptAlive {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.rx.poll_recv(cx)
    }
}
