//! A [`tower_layer::Layer`] that governs every model call through an `http` client service
//! (hyper-util's client, a tonic-style stack, any `Service<http::Request<B>>`).
//!
//! The inner service is cloned for each call (the usual tower pattern) and called once per
//! send, so it must be `Clone`; its request body `B` is rebuilt for each send from the bytes
//! read (`B: From<Bytes>`), and its answer's body comes back as a [`MeteredBody`]. The
//! service is always ready: readiness is asked of the inner service before each send.
//!
//! ```no_run
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tokenwarden_tokio::{Agent, Tokenwarden};
//! use tokenwarden_tokio::layer::TokenwardenLayer;
//! use tower_layer::Layer;
//! use tower_service::Service;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let tw = Tokenwarden::from_config_json(r#"{"pools":[{"name":"default","requests_per_minute":50}]}"#)?;
//! let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
//! let mut governed = TokenwardenLayer::new(tw, Agent::named("worker-1")).layer(client);
//! let call = http::Request::post("http://127.0.0.1:8080/v1/messages")
//!     .header("x-api-key", "…")
//!     .body(Full::from(r#"{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"Hi"}]}"#))?;
//! let answer = governed.call(call).await?;
//! println!("{}", answer.status());
//! # Ok(()) }
//! ```

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::{BoxError, MeteredBody, answer_kind};
use crate::call::{Agent, Next as After, Prepared, Stopped, prepare};
use crate::host::Tokenwarden;

/// Makes a [`TokenwardenService`] of a service: one [`Agent`]'s calls through a
/// [`Tokenwarden`].
#[derive(Clone, Debug)]
pub struct TokenwardenLayer {
    tw: Tokenwarden,
    agent: Agent,
}

impl TokenwardenLayer {
    /// `agent`'s calls through `tw`.
    #[must_use]
    pub fn new(tw: Tokenwarden, agent: Agent) -> TokenwardenLayer {
        TokenwardenLayer { tw, agent }
    }
}

impl<S> Layer<S> for TokenwardenLayer {
    type Service = TokenwardenService<S>;

    fn layer(&self, inner: S) -> TokenwardenService<S> {
        TokenwardenService {
            inner,
            tw: self.tw.clone(),
            agent: self.agent.clone(),
        }
    }
}

/// A service whose model calls are leased (see the module doc).
#[derive(Clone, Debug)]
pub struct TokenwardenService<S> {
    inner: S,
    tw: Tokenwarden,
    agent: Agent,
}

/// The future of a [`TokenwardenService`] call.
pub type ResponseFuture<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<S, B, RB> Service<Request<B>> for TokenwardenService<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<MeteredBody<RB>>;
    type Error = BoxError;
    type Future = ResponseFuture<Self::Response>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let tw = self.tw.clone();
        let agent = self.agent.clone();
        Box::pin(govern(inner, tw, agent, req))
    }
}

async fn send<S, B, RB>(inner: &mut S, req: Request<B>) -> Result<Response<RB>, BoxError>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
{
    std::future::poll_fn(|cx| inner.poll_ready(cx))
        .await
        .map_err(Into::into)?;
    inner.call(req).await.map_err(Into::into)
}

async fn govern<S, B, RB>(
    mut inner: S,
    tw: Tokenwarden,
    agent: Agent,
    req: Request<B>,
) -> Result<Response<MeteredBody<RB>>, BoxError>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: Body + From<Bytes>,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let bytes = collect(body).await?;
    let (path, url) = (parts.uri.path().to_owned(), parts.uri.to_string());
    let target = (parts.method.as_str(), path.as_str(), url.as_str());
    let prepared = prepare(&tw, &agent, target, Some(&bytes));
    let mut call = match prepared {
        Prepared::Pass | Prepared::Unleased => {
            let res = send(&mut inner, Request::from_parts(parts, B::from(bytes))).await?;
            return Ok(res.map(MeteredBody::pass));
        }
        Prepared::Call(call) => call,
    };
    loop {
        let held = match call.lease().await {
            Ok(held) => held,
            Err(Stopped::Refused(r)) => return Ok(r.to_response().map(MeteredBody::full)),
            Err(Stopped::Failed(e)) => return Err(Box::new(e)),
        };
        let mut meter = call.meter(&held);
        let attempt = Request::from_parts(parts.clone(), B::from(bytes.clone()));
        let res = match meter.until_head(send(&mut inner, attempt)).await {
            Ok(Ok(res)) => res,
            Ok(Err(e)) => {
                meter.failed();
                return Err(e);
            }
            Err(timeout) => return Err(Box::new(timeout)),
        };
        match call.answered(&mut meter, res.status().as_u16(), res.headers()) {
            After::Retry => {}
            After::Handover => return Ok(res.map(MeteredBody::pass)),
            After::Deliver => {
                let (head, body) = res.into_parts();
                let answer = answer_kind(&head.headers, body.is_end_stream());
                let mut metered = MeteredBody::metered(body, meter, answer);
                metered.hold().await?;
                return Ok(Response::from_parts(head, metered));
            }
        }
    }
}

/// The whole of a request body.
async fn collect<B>(body: B) -> Result<Bytes, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut out = BytesMut::new();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        if let Ok(mut data) = frame.map_err(Into::into)?.into_data() {
            while bytes::Buf::has_remaining(&data) {
                let chunk = bytes::Buf::chunk(&data);
                out.extend_from_slice(chunk);
                let n = chunk.len();
                bytes::Buf::advance(&mut data, n);
            }
        }
    }
    Ok(out.freeze())
}
