//! A [`reqwest_middleware::Middleware`] that governs every model call its client sends.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tokenwarden_tokio::{Agent, Tokenwarden};
//! use tokenwarden_tokio::middleware::TokenwardenMiddleware;
//!
//! let tw = Tokenwarden::from_config_json(r#"{"pools":[{"name":"default","requests_per_minute":50}]}"#)?;
//! let client = reqwest_middleware::ClientBuilder::new(
//!     // A model call's redirect carries its API key: never follow one.
//!     reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?,
//! )
//! .with(TokenwardenMiddleware::new(tw, Agent::named("worker-1")))
//! .build();
//! # let _ = client; Ok(()) }
//! ```
//!
//! Put it last in the chain (nearest the network) when a retry middleware is also used: a
//! 429 is the core's to answer (it pauses the pool, waits and sends again), so a retry
//! middleware outside it sees only what tokenwarden hands over. The request's body must be
//! in memory (`.body(String | Vec<u8> | Bytes)`, `.json(…)`): a model call with a streamed
//! body is sent unleased, as the provider would refuse a body that is no JSON object.

use async_trait::async_trait;
use http::Extensions;
use reqwest::{Request, Response, ResponseBuilderExt};
use reqwest_middleware::{Middleware, Next, Result};

use crate::body::{MeteredBody, answer_kind};
use crate::call::{Agent, Next as After, Prepared, Stopped, prepare};
use crate::host::Tokenwarden;
use crate::refusal::Refusal;

/// Leases every model call the client sends for one [`Agent`] (see the module doc).
#[derive(Clone, Debug)]
pub struct TokenwardenMiddleware {
    tw: Tokenwarden,
    agent: Agent,
}

impl TokenwardenMiddleware {
    /// `agent`'s calls through `tw`.
    #[must_use]
    pub fn new(tw: Tokenwarden, agent: Agent) -> TokenwardenMiddleware {
        TokenwardenMiddleware { tw, agent }
    }
}

fn refused(r: &Refusal, url: &reqwest::Url) -> Response {
    let (parts, body) = r.to_response().into_parts();
    let mut b = http::Response::builder()
        .status(parts.status)
        .url(url.clone());
    if let Some(h) = b.headers_mut() {
        *h = parts.headers;
    }
    Response::from(
        b.body(reqwest::Body::from(body))
            .unwrap_or_else(|_| http::Response::new(reqwest::Body::from(""))),
    )
}

#[async_trait]
impl Middleware for TokenwardenMiddleware {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        let body = req.body().and_then(reqwest::Body::as_bytes);
        let target = (req.method().as_str(), req.url().path(), req.url().as_str());
        let prepared = prepare(&self.tw, &self.agent, target, body);
        let mut call = match prepared {
            Prepared::Pass | Prepared::Unleased => return next.run(req, extensions).await,
            Prepared::Call(call) => call,
        };
        loop {
            let held = match call.lease().await {
                Ok(held) => held,
                Err(Stopped::Refused(r)) => return Ok(refused(&r, req.url())),
                Err(Stopped::Failed(e)) => return Err(reqwest_middleware::Error::middleware(e)),
            };
            let mut meter = call.meter(&held);
            // The body is in memory (it was read above): the request clones.
            let Some(attempt) = req.try_clone() else {
                return next.run(req, extensions).await;
            };
            let sent = meter.until_head(next.clone().run(attempt, extensions));
            let res = match sent.await {
                Ok(Ok(res)) => res,
                Ok(Err(e)) => {
                    meter.failed();
                    return Err(e);
                }
                Err(timeout) => return Err(reqwest_middleware::Error::middleware(timeout)),
            };
            match call.answered(&mut meter, res.status().as_u16(), res.headers()) {
                After::Retry => {}
                After::Handover => return Ok(res),
                After::Deliver => {
                    let url = res.url().clone();
                    let (parts, body) = http::Response::<reqwest::Body>::from(res).into_parts();
                    let empty = http_body::Body::is_end_stream(&body);
                    let answer = answer_kind(&parts.headers, empty);
                    let mut metered = MeteredBody::metered(body, meter, answer);
                    metered
                        .hold()
                        .await
                        .map_err(|e| reqwest_middleware::Error::middleware(Held(e)))?;
                    let mut b = http::Response::builder()
                        .status(parts.status)
                        .version(parts.version)
                        .url(url);
                    if let Some(h) = b.headers_mut() {
                        *h = parts.headers;
                    }
                    if let Some(x) = b.extensions_mut() {
                        x.extend(parts.extensions);
                    }
                    let res = b
                        .body(reqwest::Body::wrap(metered))
                        .map_err(reqwest_middleware::Error::middleware)?;
                    return Ok(Response::from(res));
                }
            }
        }
    }
}

/// A body that failed before it was handed over.
#[derive(Debug)]
struct Held(crate::body::BoxError);

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the answer's body failed before it was handed over: {}",
            self.0
        )
    }
}

impl std::error::Error for Held {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}
