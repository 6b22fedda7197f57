//! What the tower layer adds to a model call: the same call to a provider service that
//! answers at once (a JSON message with its usage), alone and through
//! `TokenwardenLayer` (estimate, `call_lease`, `call_response`, the body read by the send's
//! machine, the settle), in the same run on one current-thread runtime. A JSON answer is
//! held until it ended, as the fetch wrapper does, so both drain the same body. The same
//! prompt each time (remembered by the estimator) and a new one each time (parsed and
//! counted with o200k_base).
//!
//! Run with `cargo bench -p tokenwarden-tokio --bench layer`.

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, criterion_main};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tokenwarden_tokio::layer::TokenwardenLayer;
use tokenwarden_tokio::{Agent, Tokenwarden};
use tower_layer::Layer;
use tower_service::Service;

/// Limits far above what the bench sends: every call is granted at once.
const CONFIG: &str = r#"{"pools":[{"name":"default","input_tokens_per_minute":1000000000000,
    "output_tokens_per_minute":100000000000,"requests_per_minute":1000000000}]}"#;

const ANSWER: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Done: the build passes."}],"stop_reason":"end_turn","usage":{"input_tokens":412,"output_tokens":9}}"#;

/// A provider that answers every call at once.
#[derive(Clone)]
struct AtOnce;

impl Service<Request<Full<Bytes>>> for AtOnce {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Full<Bytes>>) -> Self::Future {
        Box::pin(async {
            let mut res = Response::new(Full::from(ANSWER));
            res.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            Ok(res)
        })
    }
}

/// A call of ~1,400 characters of prompt; `turn` makes its text new (0: the same each time,
/// which the estimator remembers, as it does a call asked again).
fn request(turn: u64) -> Request<Full<Bytes>> {
    let body = format!(
        r#"{{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{{"role":"user","content":"Turn {turn}. {}"}}]}}"#,
        "Summarize the failing test and propose a fix. ".repeat(30)
    );
    Request::post("http://provider.test/v1/messages")
        .header("x-api-key", "k")
        .body(Full::from(body))
        .unwrap()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let tw = rt.block_on(async { Tokenwarden::from_config_json(CONFIG).unwrap() });
    let mut direct = AtOnce;
    let mut governed = TokenwardenLayer::new(tw, Agent::named("bench")).layer(AtOnce);
    let mut g = c.benchmark_group("call");
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("direct", |b| {
        b.iter(|| {
            rt.block_on(async {
                let res = direct.call(request(0)).await.unwrap();
                black_box(res.into_body().collect().await.unwrap().to_bytes())
            })
        });
    });
    g.bench_function("through_layer", |b| {
        b.iter(|| {
            rt.block_on(async {
                let res = governed.call(request(0)).await.unwrap();
                assert_eq!(res.status(), 200);
                black_box(res.into_body().collect().await.unwrap().to_bytes())
            })
        });
    });
    // Each call's prompt new: the estimate parses and counts it (o200k_base).
    let mut turn = 0;
    g.bench_function("through_layer_new_prompt", |b| {
        b.iter(|| {
            turn += 1;
            rt.block_on(async {
                let res = governed.call(request(turn)).await.unwrap();
                assert_eq!(res.status(), 200);
                black_box(res.into_body().collect().await.unwrap().to_bytes())
            })
        });
    });
    g.finish();
}

/// Every group, with criterion's command-line options.
fn benches() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
}

criterion_main!(benches);
