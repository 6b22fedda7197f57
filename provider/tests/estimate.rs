//! The estimator's rules, in the crate: OpenAI's published counts, the byte rule's learning,
//! the prompt cache as Anthropic keeps it, images and PDFs by each provider's rules. (The
//! engine packages run the same code; `tests/js/test/estimator.test.mjs` and the estimate
//! corpus check it through the `fetch` wrapper on both engines.)
use std::sync::Arc;

use serde_json::{Value, json};
use tokenwarden_provider::Usage;
use tokenwarden_provider::bpe::{self, Bpe, Encoding};
use tokenwarden_provider::estimate::{
    CallShape, Estimator, Options, Provider, call_shape, prompt_bytes,
};

fn with_tokenizers() -> Estimator {
    let mut e = Estimator::new(Options::default()).unwrap();
    e.use_tokenizer(Arc::new(
        Bpe::new(Encoding::O200kBase, bpe::O200K_BASE).unwrap(),
    ));
    e.use_tokenizer(Arc::new(
        Bpe::new(Encoding::Cl100kBase, bpe::CL100K_BASE).unwrap(),
    ));
    e
}

fn bytes_only() -> Estimator {
    Estimator::new(Options {
        tokenizer: false,
        ..Options::default()
    })
    .unwrap()
}

fn jargon() -> Value {
    json!([
        { "role": "system", "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English." },
        { "role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth." },
        { "role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue." },
        { "role": "system", "name": "example_user", "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage." },
        { "role": "system", "name": "example_assistant", "content": "Let's talk later when we're less busy about how to do better." },
        { "role": "user", "content": "This late pivot means we don't have time to boil the ocean for the client deliverable." }
    ])
}

#[test]
fn openai_prompts_count_what_the_api_answered_for_the_cookbook_s_examples() {
    let mut e = with_tokenizers();
    let mut input =
        |model: &str, body: Value| e.estimate(0, Provider::Openai, model, &body).1.input_tokens;
    for (model, want) in [
        ("gpt-4o", 124),
        ("gpt-4o-mini", 124),
        ("gpt-4", 129),
        ("gpt-3.5-turbo", 129),
    ] {
        assert_eq!(
            input(model, json!({ "model": model, "messages": jargon() })),
            want,
            "{model}"
        );
    }
    let weather = json!([
        { "role": "system", "content": "You are a helpful assistant that can answer to questions about the weather." },
        { "role": "user", "content": "What's the weather like in San Francisco?" }
    ]);
    let tools = json!([{ "type": "function", "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": { "type": "object", "properties": {
            "location": { "type": "string", "description": "The city and state, e.g. San Francisco, CA" },
            "unit": { "type": "string", "description": "The unit of temperature to return", "enum": ["celsius", "fahrenheit"] }
        }, "required": ["location"] }
    }}]);
    for (model, want) in [("gpt-4o", 101), ("gpt-4", 105)] {
        let body = json!({ "model": model, "messages": weather, "tools": tools });
        assert_eq!(input(model, body), want, "{model} with a tool");
    }
}

#[test]
fn what_the_provider_counted_beyond_the_rule_carries_over_to_the_next_turn() {
    let mut e = with_tokenizers();
    let first = json!({ "model": "gpt-4o", "messages": jargon() });
    let (id, est) = e.estimate(0, Provider::Openai, "gpt-4o", &first);
    assert_eq!(est.input_tokens, 124);
    // The provider counted 10 more than the rule (a framing OpenAI does not publish).
    assert!(e.observe(id, 1, Provider::Openai, "gpt-4o", None, 134, None));
    let mut messages = jargon().as_array().unwrap().clone();
    messages.push(json!({ "role": "assistant", "content": "We are out of time." }));
    let next = json!({ "model": "gpt-4o", "messages": messages });
    let plain = with_tokenizers()
        .estimate(0, Provider::Openai, "gpt-4o", &next)
        .1
        .input_tokens;
    assert_eq!(
        e.estimate(2, Provider::Openai, "gpt-4o", &next)
            .1
            .input_tokens,
        plain + 10
    );
}

fn anthropic(system: &str, user: &str) -> Value {
    json!({
        "model": "claude-sonnet-4-6",
        "max_tokens": 1000,
        "system": [{ "type": "text", "text": system, "cache_control": { "type": "ephemeral" } }],
        "messages": [{ "role": "user", "content": user }]
    })
}

#[test]
fn the_byte_rule_starts_at_three_bytes_a_token_and_learns_the_model_s_ratio() {
    let mut e = bytes_only();
    let body =
        json!({ "model": "m", "messages": [{ "role": "user", "content": "a".repeat(2992) }] });
    let (id, first) = e.estimate(0, Provider::Anthropic, "m", &body);
    // 2,992 bytes of prose and 8 of framing, at 3 bytes a token, 2 % high.
    assert_eq!(first.input_tokens, (3000.0_f64 / 3.0 * 1.02).ceil() as u64);
    // The provider counted 750 (4 bytes a token): the first observation sets the ratio.
    e.observe(id, 1, Provider::Anthropic, "m", None, 750, None);
    assert!((e.ratios(Provider::Anthropic, "m")[0] - 4.0).abs() < 1e-9);
    let other =
        json!({ "model": "m", "messages": [{ "role": "user", "content": "b".repeat(3992) }] });
    assert_eq!(
        e.estimate(2, Provider::Anthropic, "m", &other)
            .1
            .input_tokens,
        (4000.0_f64 / 4.0 * 1.02).ceil() as u64
    );
    // Another model has its own ratio.
    assert!((e.ratios(Provider::Anthropic, "other")[0] - 3.0).abs() < 1e-9);
}

#[test]
fn a_prefix_the_provider_cached_is_a_read_until_it_expires() {
    let mut e = bytes_only();
    let system = "You are a careful coding agent. ".repeat(400);
    let first = anthropic(&system, "Fix the test.");
    let (id, cold) = e.estimate(0, Provider::Anthropic, "claude-sonnet-4-6", &first);
    assert_eq!(cold.cached_prefix_tokens, 0, "nothing cached yet");
    // The provider wrote the system prompt to its cache (3,000 tokens) and counted 10 after it.
    let usage = Usage {
        input_tokens: 10,
        cache_creation_input_tokens: 3000,
        cache_read_input_tokens: 0,
        output_tokens: 5,
    };
    e.observe(
        id,
        1_000,
        Provider::Anthropic,
        "claude-sonnet-4-6",
        None,
        3010,
        Some(&usage),
    );
    assert_eq!(e.cached_prefixes(), 1);
    // Another agent's call with the same system prompt, two minutes later: a read of it.
    let other = anthropic(&system, "Write the docs.");
    let warm = e
        .estimate(121_000, Provider::Anthropic, "claude-sonnet-4-6", &other)
        .1;
    assert_eq!(warm.cached_prefix_tokens, 3000);
    assert!(warm.cached_prefix_confirmed);
    assert!(warm.input_tokens < 50, "only the new message: {warm:?}");
    // Past its 5 minutes (less the 30 s margin for a wait in line): cold again.
    let late = e
        .estimate(
            1_000 + 271_000,
            Provider::Anthropic,
            "claude-sonnet-4-6",
            &other,
        )
        .1;
    assert_eq!(late.cached_prefix_tokens, 0);
    assert!(late.input_tokens > 2900, "{late:?}");
    // A `ttl: "1h"` breakpoint lasts an hour.
    let mut hour = first.clone();
    hour["system"][0]["cache_control"]["ttl"] = json!("1h");
    let (id, _) = e.estimate(400_000, Provider::Anthropic, "claude-sonnet-4-6", &hour);
    e.observe(
        id,
        400_000,
        Provider::Anthropic,
        "claude-sonnet-4-6",
        None,
        3010,
        Some(&usage),
    );
    let hour_later = e
        .estimate(
            400_000 + 50 * 60_000,
            Provider::Anthropic,
            "claude-sonnet-4-6",
            &hour,
        )
        .1;
    assert_eq!(hour_later.cached_prefix_tokens, 3000);
}

#[test]
fn an_observation_of_an_estimate_no_longer_remembered_needs_the_body() {
    let mut e = bytes_only();
    let body = anthropic("system", "hello");
    assert!(!e.observe(999, 0, Provider::Anthropic, "m", None, 100, None));
    assert!(e.observe(999, 0, Provider::Anthropic, "m", Some(&body), 100, None));
    assert!(e.knows_prefix_of(Provider::Anthropic, "m", &body));
}

/// A PNG's first 24 bytes, for its size.
fn png(w: u32, h: u32) -> String {
    let mut d = vec![
        0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, b'I', b'H', b'D', b'R',
    ];
    d.extend_from_slice(&w.to_be_bytes());
    d.extend_from_slice(&h.to_be_bytes());
    d.extend_from_slice(&[8, 6, 0, 0, 0]);
    base64(&d)
}

fn base64(d: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for c in d.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

#[test]
fn images_cost_what_each_provider_publishes() {
    let mut e = bytes_only();
    let image = |w, h| json!({ "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": png(w, h) } });
    let cost = |e: &mut Estimator, block: Value| {
        let body = json!({ "model": "m", "messages": [{ "role": "user", "content": [block] }] });
        e.estimate(0, Provider::Anthropic, "m", &body)
            .1
            .input_tokens
    };
    let framing = (8.0_f64 / 3.0 * 1.02).ceil() as u64;
    // Anthropic: w × h / 750, scaled to 1568 px on the long edge and 1092² pixels.
    assert_eq!(cost(&mut e, image(1000, 750)), 1000 + framing);
    assert_eq!(
        cost(&mut e, image(4000, 3000)),
        (1092 * 1092_u64).div_ceil(750) + framing
    );
    // OpenAI: low detail 85; else 170 a 512-px tile plus 85, after fitting 2048² and 768 short.
    let openai = |e: &mut Estimator, detail: &str, w, h| {
        let url = format!("data:image/png;base64,{}", png(w, h));
        let body = json!({ "model": "m", "messages": [{ "role": "user", "content": [{ "type": "image_url", "image_url": { "url": url, "detail": detail } }] }] });
        e.estimate(0, Provider::Openai, "m", &body).1.input_tokens
    };
    assert_eq!(openai(&mut e, "low", 4000, 3000), 85 + framing);
    // 1024 × 768: short side already 768 → 2 × 2 tiles.
    assert_eq!(openai(&mut e, "high", 1024, 768), 85 + 170 * 4 + framing);
}

#[test]
fn a_pdf_is_its_pages_as_images_and_its_text() {
    let pdf = "%PDF-1.4\n1 0 obj << /Type /Pages /Kids [2 0 R 3 0 R] /Count 2 >> endobj\n\
               2 0 obj << /Type /Page /Parent 1 0 R >> endobj\n3 0 obj << /Type /Page /Parent 1 0 R >> endobj\n\
               4 0 obj << /Length 44 >> stream\nBT (Hello \\(world\\)) Tj (Second line) Tj ET\nendstream endobj\n%%EOF";
    let body = json!({ "model": "m", "messages": [{ "role": "user", "content": [
        { "type": "document", "source": { "type": "base64", "media_type": "application/pdf", "data": base64(pdf.as_bytes()) } }
    ] }] });
    // Its text ("Hello (world)\nSecond line", 25 bytes) is what the byte count sees.
    assert_eq!(prompt_bytes(Provider::Anthropic, &body), (0, 25 + 8));
    let mut e = bytes_only();
    let est = e.estimate(0, Provider::Anthropic, "m", &body).1;
    // Two pages as images (1,590 each) and 33 bytes of text and framing at 3 a token.
    assert_eq!(
        est.input_tokens,
        2 * 1590 + (33.0_f64 / 3.0 * 1.02).ceil() as u64
    );
}

#[test]
fn the_output_reservation_is_read_as_each_api_names_it() {
    let shape = |p, body: Value| call_shape(p, &body);
    assert_eq!(
        shape(
            Provider::Anthropic,
            json!({ "model": "claude", "max_tokens": 128000, "stream": true })
        ),
        CallShape {
            model: "claude".into(),
            max_tokens: 128_000,
            stream: true
        }
    );
    assert_eq!(
        shape(
            Provider::Openai,
            json!({ "max_output_tokens": 10, "max_completion_tokens": 20, "max_tokens": 30 })
        )
        .max_tokens,
        10
    );
    assert_eq!(
        shape(
            Provider::Openai,
            json!({ "max_output_tokens": null, "max_completion_tokens": 20, "max_tokens": 30 })
        )
        .max_tokens,
        20
    );
    assert_eq!(
        shape(Provider::Openai, json!({ "max_tokens": 30 })).max_tokens,
        30
    );
    assert_eq!(shape(Provider::Openai, json!({})).max_tokens, 4096);
    assert_eq!(
        shape(Provider::Anthropic, json!({ "max_tokens": -1 })).max_tokens,
        4096
    );
    assert!(!shape(Provider::Openai, json!({ "stream": "yes" })).stream);
}

#[test]
fn options_out_of_range_are_refused_by_name() {
    for (o, field) in [
        (
            Options {
                initial_bytes_per_token: 0.0,
                ..Options::default()
            },
            "initialBytesPerToken",
        ),
        (
            Options {
                learning_rate: 1.5,
                ..Options::default()
            },
            "learningRate",
        ),
        (
            Options {
                safety: 0.9,
                ..Options::default()
            },
            "safety",
        ),
        (
            Options {
                cached_prefixes: 0,
                ..Options::default()
            },
            "cachedPrefixes",
        ),
        (
            Options {
                initial_tokens_per_proxy_token: f64::NAN,
                ..Options::default()
            },
            "initialTokensPerProxyToken",
        ),
    ] {
        assert_eq!(Estimator::new(o).unwrap_err().field, field);
    }
}

#[test]
fn the_same_calls_give_the_same_estimates() {
    let run = || {
        let mut e = with_tokenizers();
        let mut out = Vec::new();
        for turn in 0..20u64 {
            let body = anthropic(
                &"tools and rules ".repeat(300),
                &"turn text ".repeat(10 * (turn as usize + 1)),
            );
            let (id, est) = e.estimate(
                turn * 10_000,
                Provider::Anthropic,
                "claude-sonnet-4-6",
                &body,
            );
            out.push(est);
            let usage = Usage {
                input_tokens: 30 * turn,
                cache_creation_input_tokens: 1500,
                cache_read_input_tokens: 0,
                output_tokens: 10,
            };
            e.observe(
                id,
                turn * 10_000 + 1,
                Provider::Anthropic,
                "claude-sonnet-4-6",
                None,
                1500 + 30 * turn,
                Some(&usage),
            );
        }
        out
    };
    assert_eq!(run(), run());
}

#[test]
fn a_body_estimated_again_from_its_text_is_estimated_alike() {
    let mut e = with_tokenizers();
    let body = anthropic(&"rules ".repeat(500), "first question");
    let text = serde_json::to_string(&body).unwrap();
    let (_, a) = e
        .estimate_text(0, Provider::Anthropic, "claude-sonnet-4-6", &text)
        .unwrap();
    // The same text again (a call asked again), and the same body parsed: the same figures.
    let (id, b) = e
        .estimate_text(1, Provider::Anthropic, "claude-sonnet-4-6", &text)
        .unwrap();
    assert_eq!(a, b);
    assert_eq!(
        with_tokenizers()
            .estimate(0, Provider::Anthropic, "claude-sonnet-4-6", &body)
            .1,
        a
    );
    // Learning still happens on what the state says: observed, the prompt is known exactly.
    e.observe(
        id,
        2,
        Provider::Anthropic,
        "claude-sonnet-4-6",
        None,
        900,
        None,
    );
    let (_, c) = e
        .estimate_text(3, Provider::Anthropic, "claude-sonnet-4-6", &text)
        .unwrap();
    assert_eq!(c.input_tokens, 900);
    let openai =
        serde_json::to_string(&json!({ "model": "gpt-4o", "messages": jargon() })).unwrap();
    for _ in 0..2 {
        assert_eq!(
            e.estimate_text(4, Provider::Openai, "gpt-4o", &openai)
                .unwrap()
                .1
                .input_tokens,
            124
        );
    }
    assert!(
        e.estimate_text(5, Provider::Openai, "gpt-4o", "[1, 2]")
            .unwrap_err()
            .contains("JSON object")
    );
    assert!(
        e.estimate_text(5, Provider::Openai, "gpt-4o", "{")
            .unwrap_err()
            .contains("not JSON")
    );
}

#[test]
fn under_the_proxy_a_class_barely_seen_follows_the_model_s_correction_but_cjk_keeps_its_own() {
    // A first call that is nearly all code, with a one-line question in prose: the provider
    // counts 1.0 Claude token per proxy token where the estimator assumed 1.2.
    let mut e = with_tokenizers();
    let code = "fn f(x: u32) -> u32 { let y = (x * 2) + [x - 1][0]; y }\n".repeat(200);
    let body = json!({ "model": "m", "messages": [{ "role": "user", "content": [
        { "type": "text", "text": code },
        { "type": "text", "text": "What does this function do, and would you call it twice?" }
    ] }] });
    let (id, est) = e.estimate(0, Provider::Anthropic, "m", &body);
    let proxy_tokens = (est.input_tokens as f64 / 1.02 / 1.2).round() as u64;
    e.observe(id, 1, Provider::Anthropic, "m", None, proxy_tokens, None);
    let r = e.ratios(Provider::Anthropic, "m");
    let (prose, code_r, cjk, doc) = (r[0], r[1], r[2], r[3]);
    // The code class learned ~1.0 (proxy tokens per provider token).
    assert!((code_r - 1.0).abs() < 0.02, "code {code_r}");
    // The question's prose, a sliver of the call, moved with it (it stayed near 1/1.2 =
    // 0.833 when each class moved only by its share), and so does a PDF's text not seen yet.
    assert!(
        (prose - code_r).abs() < 0.02,
        "prose {prose} against code {code_r}"
    );
    assert!(
        (doc - code_r).abs() < 0.02,
        "a document's text {doc} against code {code_r}"
    );
    // CJK, where tokenizers differ most, keeps the initial figure until it is seen.
    assert!((cjk - 1.0 / 1.2).abs() < 1e-9, "cjk {cjk}");

    // Without the proxy (the byte rule), a class not seen keeps the initial figure: bytes
    // per token differ several times between classes.
    let mut b = bytes_only();
    let (id, est) = b.estimate(0, Provider::Anthropic, "m", &body);
    b.observe(
        id,
        1,
        Provider::Anthropic,
        "m",
        None,
        est.input_tokens / 2,
        None,
    );
    let r = b.ratios(Provider::Anthropic, "m");
    assert!(
        (r[3] - 3.0).abs() < 1e-9,
        "byte rule, a document's text {}",
        r[3]
    );
}
