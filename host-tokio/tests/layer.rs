//! The tower layer against a provider that enforces its limits (a tower service on the
//! same paused tokio clock, so every run is the same): a fleet that 429s on its own does
//! not through the layer; answers are settled from their usage, JSON and streams; a call
//! that can never fit, a timeout, a caller that leaves, and what passes through.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use tokenwarden_tokio::core::{Config, Timeouts};
use tokenwarden_tokio::layer::TokenwardenLayer;
use tokenwarden_tokio::{Agent, Builder, Tokenwarden};
use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_service::Service;

/// What the fake provider saw.
#[derive(Default)]
struct Seen {
    calls: u32,
    ok: u32,
    limited: u32,
    other: u32,
    /// Calls in flight at once, at most.
    max_in_flight: u32,
    in_flight: u32,
}

/// A provider with a requests-per-minute bucket (full at the start, refilled continuously,
/// as Anthropic's), answering each call after `delay` with `usage` in JSON or as a stream.
#[derive(Clone)]
struct Provider {
    rpm: f64,
    state: Arc<Mutex<(f64, Instant)>>,
    seen: Arc<Mutex<Seen>>,
    delay: Duration,
    output_tokens: u64,
}

impl Provider {
    fn new(rpm: u32, delay_ms: u64) -> Provider {
        Provider {
            rpm: f64::from(rpm),
            state: Arc::new(Mutex::new((f64::from(rpm), Instant::now()))),
            seen: Arc::new(Mutex::new(Seen::default())),
            delay: Duration::from_millis(delay_ms),
            output_tokens: 40,
        }
    }

    /// Takes a request from the bucket, or says how long until one is there.
    fn admit(&self) -> Result<(), Duration> {
        let mut s = self.state.lock().unwrap();
        let now = Instant::now();
        let refill = now.duration_since(s.1).as_secs_f64() * self.rpm / 60.0;
        s.0 = (s.0 + refill).min(self.rpm);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - s.0) * 60.0 / self.rpm))
        }
    }
}

/// A body that yields its pieces at their times.
struct Timed {
    pieces: VecDeque<(Duration, Bytes)>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Timed {
    fn new(pieces: Vec<(u64, String)>) -> Timed {
        Timed {
            pieces: pieces
                .into_iter()
                .map(|(ms, s)| (Duration::from_millis(ms), Bytes::from(s)))
                .collect(),
            sleep: None,
        }
    }
}

impl Body for Timed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some((after, _)) = self.pieces.front() else {
            return Poll::Ready(None);
        };
        let after = *after;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(after)));
        if sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.sleep = None;
        let (_, piece) = self.pieces.pop_front().unwrap();
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }
}

fn message(input: u64, output: u64) -> String {
    format!(
        r#"{{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{{"type":"text","text":"hi"}}],"stop_reason":"end_turn","usage":{{"input_tokens":{input},"output_tokens":{output}}}}}"#
    )
}

fn stream(input: u64, output: u64) -> Vec<(u64, String)> {
    vec![
        (
            100,
            format!(
                "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"usage\":{{\"input_tokens\":{input},\"output_tokens\":1}}}}}}\n\n"
            ),
        ),
        (
            500,
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n".into(),
        ),
        (
            500,
            format!(
                "event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"output_tokens\":{output}}}}}\n\nevent: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
            ),
        ),
    ]
}

impl Service<Request<Full<Bytes>>> for Provider {
    type Response = Response<Timed>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Timed>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Full<Bytes>>) -> Self::Future {
        let p = self.clone();
        Box::pin(async move {
            let model_call = req.uri().path().ends_with("/messages");
            let body = req.into_body().collect().await.unwrap().to_bytes();
            {
                let mut s = p.seen.lock().unwrap();
                s.calls += 1;
                if !model_call {
                    s.other += 1;
                    return Ok(Response::new(Timed::new(vec![(0, "{}".into())])));
                }
            }
            if let Err(wait) = p.admit() {
                p.seen.lock().unwrap().limited += 1;
                let mut res = Response::new(Timed::new(vec![(
                    0,
                    r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#
                        .into(),
                )]));
                *res.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                res.headers_mut().insert(
                    "retry-after",
                    wait.as_secs_f64()
                        .ceil()
                        .max(1.0)
                        .to_string()
                        .parse()
                        .unwrap(),
                );
                return Ok(res);
            }
            {
                let mut s = p.seen.lock().unwrap();
                s.ok += 1;
                s.in_flight += 1;
                s.max_in_flight = s.max_in_flight.max(s.in_flight);
            }
            tokio::time::sleep(p.delay).await;
            p.seen.lock().unwrap().in_flight -= 1;
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let input = 1 + body.to_string().len() as u64 / 4;
            let streamed = body["stream"] == true;
            let mut res = if streamed {
                Response::new(Timed::new(stream(input, p.output_tokens)))
            } else {
                Response::new(Timed::new(vec![(0, message(input, p.output_tokens))]))
            };
            let ct = if streamed {
                "text/event-stream"
            } else {
                "application/json"
            };
            res.headers_mut()
                .insert("content-type", ct.parse().unwrap());
            Ok(res)
        })
    }
}

fn call(stream: bool, max_tokens: u64) -> Request<Full<Bytes>> {
    let body = format!(
        r#"{{"model":"claude-test","max_tokens":{max_tokens},"stream":{stream},"messages":[{{"role":"user","content":"Say hi to the fleet, briefly please."}}]}}"#
    );
    Request::post("http://provider.test/v1/messages")
        .header("x-api-key", "k")
        .body(Full::from(body))
        .unwrap()
}

fn tw(rpm: u32) -> Tokenwarden {
    let json = format!(
        r#"{{"pools":[{{"name":"default","requests_per_minute":{rpm},"input_tokens_per_minute":100000,"output_tokens_per_minute":100000}}]}}"#
    );
    Builder::new(Config::from_json(&json).unwrap())
        .seed(7)
        .build()
        .unwrap()
}

/// A host on the configuration `json`.
fn configured(json: &str) -> Tokenwarden {
    Builder::new(Config::from_json(json).unwrap())
        .build()
        .unwrap()
}

async fn drain<B: Body>(res: Response<B>) -> (u16, Bytes)
where
    B::Error: std::fmt::Debug,
{
    let status = res.status().as_u16();
    (status, res.into_body().collect().await.unwrap().to_bytes())
}

/// Eight agents of five calls each against 10 requests a minute: on their own, each retries
/// its 429s after `retry-after` (as an SDK does); through the layer, the core's queue.
#[tokio::test(start_paused = true)]
async fn a_fleet_that_429s_alone_does_not_through_the_layer() {
    async fn fleet(provider: &Provider, tw: Option<&Tokenwarden>) -> u32 {
        let mut agents = Vec::new();
        for a in 0..8 {
            let p = provider.clone();
            let tw = tw.cloned();
            agents.push(tokio::spawn(async move {
                let mut done = 0;
                for _ in 0..5 {
                    if let Some(tw) = &tw {
                        let mut svc =
                            TokenwardenLayer::new(tw.clone(), Agent::named(&format!("agent-{a}")))
                                .layer(p.clone());
                        let (status, _) = drain(svc.call(call(false, 200)).await.unwrap()).await;
                        assert_eq!(status, 200);
                    } else {
                        let mut svc = p.clone();
                        loop {
                            let res = svc.call(call(false, 200)).await.unwrap();
                            let retry = res.headers().get("retry-after").cloned();
                            let (status, _) = drain(res).await;
                            if status == 200 {
                                break;
                            }
                            let s: u64 = retry.unwrap().to_str().unwrap().parse().unwrap();
                            tokio::time::sleep(Duration::from_secs(s)).await;
                        }
                    }
                    done += 1;
                }
                done
            }));
        }
        let mut done = 0;
        for a in agents {
            done += a.await.unwrap();
        }
        done
    }

    let alone = Provider::new(10, 2_000);
    assert_eq!(fleet(&alone, None).await, 40);
    let alone_429 = alone.seen.lock().unwrap().limited;
    assert!(
        alone_429 > 20,
        "on their own the agents got {alone_429} 429s"
    );

    let governed = Provider::new(10, 2_000);
    let tw = tw(10);
    assert_eq!(fleet(&governed, Some(&tw)).await, 40);
    let seen = governed.seen.lock().unwrap();
    assert_eq!(seen.limited, 0, "through the layer: {} 429s", seen.limited);
    assert_eq!(seen.ok, 40);
    let m = tw.inspect(|c, now| c.metrics(now));
    assert_eq!(m.live_leases, 0);
    assert_eq!(m.pools[0].counters.settled, 40);
    assert!(m.pools[0].counters.queued > 0, "the calls waited in line");
}

/// A 429 the provider sends anyway (another client on the key) is the core's to answer:
/// it pauses the pool and sends the call again when the pause ends.
#[tokio::test(start_paused = true)]
async fn a_429_from_outside_is_waited_out_and_sent_again() {
    let provider = Provider::new(2, 10);
    let tw = tw(60);
    let mut svc = TokenwardenLayer::new(tw.clone(), Agent::named("a")).layer(provider.clone());
    let start = Instant::now();
    for _ in 0..3 {
        let (status, body) = drain(svc.call(call(false, 100)).await.unwrap()).await;
        assert_eq!(status, 200, "{body:?}");
    }
    let seen = provider.seen.lock().unwrap();
    assert_eq!((seen.ok, seen.limited), (3, 1));
    // The third call waited the provider's 30 s out.
    assert!(
        start.elapsed() >= Duration::from_secs(29),
        "{:?}",
        start.elapsed()
    );
    let m = tw.inspect(|c, now| c.metrics(now));
    assert_eq!(m.pools[0].counters.rate_limited, 1);
    assert_eq!(m.live_leases, 0);
}

/// A stream is handed over at once, and its lease settled when it ends, from its usage.
#[tokio::test(start_paused = true)]
async fn a_stream_is_settled_from_its_usage_when_it_ends() {
    let provider = Provider::new(100, 10);
    let tw = tw(100);
    let mut events = tw.events();
    let mut svc = TokenwardenLayer::new(tw.clone(), Agent::named("s")).layer(provider);
    let res = svc.call(call(true, 4_000)).await.unwrap();
    assert_eq!(res.status(), 200);
    // Handed over before the body ended: the lease lives until it does.
    assert_eq!(tw.inspect(|c, now| c.metrics(now)).live_leases, 1);
    let (_, body) = drain(res).await;
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.contains("message_stop"), "{text}");
    let m = tw.inspect(|c, now| c.metrics(now));
    assert_eq!(m.live_leases, 0);
    assert_eq!(m.pools[0].counters.settled, 1);
    // The minute of the call, complete.
    tokio::time::sleep(Duration::from_secs(61)).await;
    let m = tw.inspect(|c, now| c.metrics(now));
    let out = m.pools[0]
        .axes
        .iter()
        .find(|a| format!("{:?}", a.axis).contains("Output"))
        .unwrap();
    assert_eq!(out.last_minute, 40, "charged the 40 output tokens reported");
    while let Ok(e) = events.try_recv() {
        assert!(!format!("{e:?}").contains("Expired"), "{e:?}");
    }
}

/// A reader that drops a stream half read ends its lease at once (interrupted), not at
/// its expiry.
#[tokio::test(start_paused = true)]
async fn a_stream_dropped_half_read_ends_its_lease() {
    let provider = Provider::new(100, 10);
    let tw = tw(100);
    let mut svc = TokenwardenLayer::new(tw.clone(), Agent::named("s")).layer(provider);
    let res = svc.call(call(true, 4_000)).await.unwrap();
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some());
    assert_eq!(tw.inspect(|c, now| c.metrics(now)).live_leases, 1);
    drop(body);
    assert_eq!(tw.inspect(|c, now| c.metrics(now)).live_leases, 0);
}

/// A call larger than the pool can ever hold is answered 400 in Anthropic's format,
/// without reaching the provider.
#[tokio::test(start_paused = true)]
async fn a_call_that_never_fits_is_refused_in_the_providers_format() {
    let provider = Provider::new(100, 10);
    let json =
        r#"{"pools":[{"name":"default","requests_per_minute":100,"input_tokens_per_minute":10}]}"#;
    let tw = configured(json);
    let mut svc = TokenwardenLayer::new(tw, Agent::named("big")).layer(provider.clone());
    let res = svc.call(call(false, 128_000)).await.unwrap();
    assert_eq!(res.status(), 400);
    assert_eq!(res.headers()["x-tokenwarden-refusal"], "1");
    assert_eq!(res.headers()["x-should-retry"], "false");
    let (status, body) = drain(res).await;
    assert_eq!(status, 400);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["tokenwarden"]["gaveUp"], "never_fits");
    assert_eq!(provider.seen.lock().unwrap().calls, 0);
}

/// No head within the first-byte timeout: the request is aborted with `upstream_timeout`
/// and the lease ended.
#[tokio::test(start_paused = true)]
async fn no_head_within_the_first_byte_timeout_aborts_the_call() {
    let provider = Provider::new(100, 5_000);
    let json = r#"{"pools":[{"name":"default","requests_per_minute":100}]}"#;
    let tw = Builder::new(Config::from_json(json).unwrap())
        .timeouts(Timeouts {
            first_byte_ms: Some(1_000),
            idle_ms: None,
        })
        .build()
        .unwrap();
    let mut svc = TokenwardenLayer::new(tw.clone(), Agent::named("t")).layer(provider);
    let err = svc.call(call(false, 100)).await.unwrap_err();
    assert!(err.to_string().contains("upstream_timeout"), "{err}");
    assert_eq!(tw.inspect(|c, now| c.metrics(now)).live_leases, 0);
}

/// A caller that stops waiting in line leaves it: the ticket is withdrawn.
#[tokio::test(start_paused = true)]
async fn a_caller_that_leaves_the_line_withdraws_its_ticket() {
    let provider = Provider::new(100, 60_000);
    let json = r#"{"pools":[{"name":"default","requests_per_minute":100,"max_concurrent":1}]}"#;
    let tw = configured(json);
    let first = {
        let mut svc = TokenwardenLayer::new(tw.clone(), Agent::named("a")).layer(provider.clone());
        tokio::spawn(async move { svc.call(call(false, 100)).await.map(|r| r.status()) })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut svc = TokenwardenLayer::new(tw.clone(), Agent::named("b")).layer(provider.clone());
    let second = tokio::time::timeout(Duration::from_secs(5), svc.call(call(false, 100))).await;
    assert!(second.is_err(), "the second call waits for the slot");
    let m = tw.inspect(|c, now| c.metrics(now));
    assert_eq!(m.pools[0].queue_depth, 0, "its ticket was withdrawn");
    assert_eq!(m.pools[0].counters.cancelled, 1);
    assert_eq!(first.await.unwrap().unwrap(), 200);
    assert_eq!(provider.seen.lock().unwrap().calls, 1);
}

/// What is not a model call passes through unleased; so does a model call whose body is
/// no JSON object.
#[tokio::test(start_paused = true)]
async fn what_is_not_a_model_call_passes_through() {
    let provider = Provider::new(1, 10);
    let tw = tw(1);
    let mut svc = TokenwardenLayer::new(tw.clone(), Agent::named("p")).layer(provider.clone());
    for _ in 0..3 {
        let req = Request::get("http://provider.test/v1/models")
            .body(Full::from(""))
            .unwrap();
        assert_eq!(drain(svc.call(req).await.unwrap()).await.0, 200);
    }
    assert_eq!(provider.seen.lock().unwrap().other, 3);
    let m = tw.inspect(|c, now| c.metrics(now));
    assert_eq!(m.pools[0].counters.granted_now, 0);
}

/// Before a long wait the agent's hook is told of it, the held call included; a hook that
/// declines withdraws the call (its ticket cancelled).
#[tokio::test(start_paused = true)]
async fn a_long_wait_is_told_to_the_agent_s_hook_first() {
    use tokenwarden_tokio::core::WaitReason;
    use tokenwarden_tokio::{Error, LongWait};

    let provider = Provider::new(100, 10);
    // Two requests a minute: two calls spend the burst, a third waits half a minute.
    let json = r#"{"pools":[{"name":"default","requests_per_minute":2}],"call":{"checkpoint_after_ms":1000}}"#;
    let tw = configured(json);
    for a in ["a1", "a2"] {
        let mut svc = TokenwardenLayer::new(tw.clone(), Agent::named(a)).layer(provider.clone());
        assert_eq!(
            drain(svc.call(call(false, 100)).await.unwrap()).await.0,
            200
        );
    }

    let declining = Agent::named("c").on_long_wait(|_| Err("saved the turn; exiting".into()));
    let mut svc = TokenwardenLayer::new(tw.clone(), declining).layer(provider.clone());
    let err = svc.call(call(false, 100)).await.unwrap_err();
    let err = err.downcast::<Error>().unwrap();
    assert!(
        matches!(&*err, Error::Withdrawn { message } if message == "saved the turn; exiting"),
        "{err}"
    );
    let m = tw.inspect(|c, now| c.metrics(now));
    assert_eq!(m.pools[0].queue_depth, 0, "c left the line");
    assert_eq!(m.pools[0].counters.cancelled, 1);

    let told: Arc<Mutex<Vec<LongWait>>> = Arc::default();
    let seen = Arc::clone(&told);
    let patient = Agent::named("b").on_long_wait(move |w| {
        seen.lock().unwrap().push(w.clone());
        Ok(())
    });
    let mut svc = TokenwardenLayer::new(tw.clone(), patient).layer(provider.clone());
    let start = Instant::now();
    assert_eq!(
        drain(svc.call(call(false, 100)).await.unwrap()).await.0,
        200
    );
    assert!(
        start.elapsed() >= Duration::from_secs(29),
        "{:?}",
        start.elapsed()
    );
    let told = told.lock().unwrap();
    assert_eq!(told.len(), 1, "{told:?}");
    let w = &told[0];
    assert_eq!(w.reason, WaitReason::Queued);
    assert!(w.wait_ms >= 1_000, "{w:?}");
    assert_eq!(w.agent, Agent::named("b").agent_id());
    assert_eq!(w.call.method, "POST");
    assert_eq!(w.call.url, "http://provider.test/v1/messages");
    assert_eq!(w.call.provider, "anthropic");
    assert_eq!(w.call.model, "claude-test");
    assert!(w.call.body.contains("Say hi to the fleet"));
    assert_eq!(provider.seen.lock().unwrap().calls, 3, "c was never sent");
}

/// A 429 whose wait is long is told to the hook too, before it is waited out.
#[tokio::test(start_paused = true)]
async fn a_long_wait_after_a_429_is_told_to_the_hook() {
    use tokenwarden_tokio::core::WaitReason;

    let provider = Provider::new(1, 10);
    let json = r#"{"pools":[{"name":"default","requests_per_minute":60}],"call":{"checkpoint_after_ms":1000}}"#;
    let tw = configured(json);
    let reasons: Arc<Mutex<Vec<WaitReason>>> = Arc::default();
    let seen = Arc::clone(&reasons);
    let agent = Agent::named("r").on_long_wait(move |w| {
        seen.lock().unwrap().push(w.reason);
        Ok(())
    });
    let mut svc = TokenwardenLayer::new(tw, agent).layer(provider.clone());
    for _ in 0..2 {
        assert_eq!(
            drain(svc.call(call(false, 100)).await.unwrap()).await.0,
            200
        );
    }
    assert_eq!(provider.seen.lock().unwrap().limited, 1);
    assert_eq!(*reasons.lock().unwrap(), vec![WaitReason::RateLimited]);
}

/// A closed coordinator (its quota handed to another): a call waiting in line is answered
/// as a limiter restarting (503, retry), not granted later by it; a new call likewise.
#[tokio::test(start_paused = true)]
async fn a_call_queued_on_a_closed_coordinator_is_answered_restarting() {
    let provider = Provider::new(1000, 10);
    let tw = tw(1);
    let svc = TokenwardenLayer::new(tw.clone(), Agent::named("a")).layer(provider.clone());
    let first = svc.clone().call(call(false, 50)).await.unwrap();
    assert_eq!(drain(first).await.0, 200);
    // One request a minute: the second waits in line.
    let waiting = tokio::spawn({
        let mut svc = svc.clone();
        async move { svc.call(call(false, 50)).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished());
    tw.close();
    assert!(tw.is_closed());
    let res = waiting.await.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["x-should-retry"], "true");
    let (_, body) = drain(res).await;
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["tokenwarden"]["error"], "closed");
    let res = svc.clone().call(call(false, 50)).await.unwrap();
    assert_eq!(res.status(), 503);
    // Sixty seconds on, nothing was granted and sent by the closed one.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(provider.seen.lock().unwrap().calls, 1);
    assert_eq!(
        tw.inspect(|c, _| c.metrics(tokenwarden_tokio::core::Millis(0)).pools[0].in_flight),
        0
    );
}
