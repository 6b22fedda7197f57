//! The reqwest-middleware middleware against a provider on loopback (a small HTTP/1.1
//! server here, answering from a script): a 429 waited out by the core and the call sent
//! again, a stream read through reqwest and settled from its usage, a refusal in OpenAI's
//! format, and what passes through.

use std::sync::{Arc, Mutex};

use tokenwarden_tokio::middleware::TokenwardenMiddleware;
use tokenwarden_tokio::{Agent, Tokenwarden};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One scripted answer: status, content type, extra headers, body.
#[derive(Clone)]
struct Answer(u16, &'static str, Vec<(&'static str, String)>, String);

/// Serves `answers` in order (the last one again once they run out); returns its base URL
/// and the request lines it saw.
async fn provider(answers: Vec<Answer>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut next = 0usize;
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let answer = answers[next.min(answers.len() - 1)].clone();
            next += 1;
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // The head, then the body by its length.
                let head_end = loop {
                    let n = sock.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let length = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                while buf.len() < head_end + length {
                    let n = sock.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                log.lock()
                    .unwrap()
                    .push(head.lines().next().unwrap_or("").to_owned());
                let Answer(status, ct, headers, body) = answer;
                let mut out = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: {ct}\r\ncontent-length: {}\r\nconnection: close\r\n",
                    body.len()
                );
                for (k, v) in headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str("\r\n");
                out.push_str(&body);
                let _ = sock.write_all(out.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    (url, seen)
}

fn tw() -> Tokenwarden {
    Tokenwarden::from_config_json(
        r#"{"pools":[{"name":"default","requests_per_minute":600,"input_tokens_per_minute":100000,"output_tokens_per_minute":100000}]}"#,
    )
    .unwrap()
}

fn client(tw: &Tokenwarden) -> reqwest_middleware::ClientWithMiddleware {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    reqwest_middleware::ClientBuilder::new(http)
        .with(TokenwardenMiddleware::new(tw.clone(), Agent::named("m")))
        .build()
}

const CALL: &str =
    r#"{"model":"claude-test","max_tokens":200,"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn a_429_is_waited_out_by_the_core_and_the_call_sent_again() {
    let limited = Answer(
        429,
        "application/json",
        vec![("retry-after", "1".into())],
        r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#.into(),
    );
    let ok = Answer(
        200,
        "application/json",
        vec![],
        r#"{"type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":9,"output_tokens":3}}"#.into(),
    );
    let (url, seen) = provider(vec![limited, ok]).await;
    let tw = tw();
    let started = tokio::time::Instant::now();
    let res = client(&tw)
        .post(format!("{url}/v1/messages"))
        .header("x-api-key", "k")
        .body(CALL)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.text().await.unwrap().contains("\"output_tokens\":3"));
    assert!(
        started.elapsed().as_millis() >= 1_000,
        "waited the retry-after out"
    );
    assert_eq!(seen.lock().unwrap().len(), 2);
    let m = tw.inspect(|c, now| c.metrics(now));
    assert_eq!(m.pools[0].counters.rate_limited, 1);
    assert_eq!(
        m.pools[0].counters.settled, 2,
        "the 429 settled by the core, then the call"
    );
    assert_eq!(m.live_leases, 0);
}

#[tokio::test]
async fn a_stream_read_through_reqwest_is_settled_from_its_usage() {
    let events = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":42}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let (url, _) = provider(vec![Answer(
        200,
        "text/event-stream",
        vec![],
        events.into(),
    )])
    .await;
    let tw = tw();
    let res = client(&tw)
        .post(format!("{url}/v1/messages"))
        .body(CALL.replace("\"max_tokens\"", "\"stream\":true,\"max_tokens\""))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.url().as_str(), format!("{url}/v1/messages"));
    assert_eq!(res.text().await.unwrap(), events);
    let m = tw.inspect(|c, now| c.metrics(now));
    assert_eq!(m.live_leases, 0);
    assert_eq!(m.pools[0].counters.settled, 1);
    assert_eq!(m.agents[0].settled, 1);
}

#[tokio::test]
async fn a_call_that_never_fits_is_refused_in_openai_s_format() {
    let (url, seen) = provider(vec![Answer(200, "application/json", vec![], "{}".into())]).await;
    let tw = Tokenwarden::from_config_json(
        r#"{"pools":[{"name":"default","requests_per_minute":600,"tokens_per_minute":50}]}"#,
    )
    .unwrap();
    let res = client(&tw)
        .post(format!("{url}/v1/chat/completions"))
        .body(r#"{"model":"gpt-4o","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    assert_eq!(res.headers()["x-tokenwarden-refusal"], "1");
    let v: serde_json::Value = serde_json::from_str(&res.text().await.unwrap()).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["code"], "rejected");
    assert!(seen.lock().unwrap().is_empty(), "never sent");
}

#[tokio::test]
async fn what_is_not_a_model_call_passes_through() {
    let (url, seen) = provider(vec![Answer(200, "application/json", vec![], "{}".into())]).await;
    let tw = tw();
    let c = client(&tw);
    assert_eq!(
        c.get(format!("{url}/v1/models"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // A model call whose body is no JSON object goes unleased: the provider refuses it.
    assert_eq!(
        c.post(format!("{url}/v1/messages"))
            .body("not json")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(seen.lock().unwrap().len(), 2);
    let m = tw.inspect(|c, now| c.metrics(now));
    assert_eq!(m.pools[0].counters.granted_now, 0);
}
