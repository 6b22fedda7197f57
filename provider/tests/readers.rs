//! The usage readers take an answer in any pieces: however a body is split, what it
//! reported and what it showed are the same as read whole; and no input, however broken,
//! makes them panic.
use proptest::prelude::*;
use tokenwarden_provider::{Format, UsageReader};

/// Events of every kind the readers look at, some malformed, as SSE text.
fn event() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(r#"event: message_start
data: {"type":"message_start","message":{"usage":{"input_tokens":12,"cache_read_input_tokens":3}}}"#.to_string()),
        "[a-zé😀 ]{0,12}".prop_map(|t| format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"delta\":{{\"text\":{}}}}}",
            serde_json_string(&t)
        )),
        (0u64..500).prop_map(|n| format!(
            "event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"output_tokens\":{n}}}}}"
        )),
        Just("event: error\ndata: {\"type\":\"error\"}".to_string()),
        "[a-z ]{0,8}".prop_map(|t| format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{t}\"}}}}]}}")),
        (0u64..99, 0u64..99).prop_map(|(p, c)| format!(
            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{p},\"completion_tokens\":{c}}}}}"
        )),
        Just("data: {\"type\":\"response.output_text.delta\",\"delta\":\"ab\"}".to_string()),
        Just("data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":2}}}".to_string()),
        Just("data: [DONE]".to_string()),
        Just(": a comment".to_string()),
        "[ -~]{0,20}",
    ]
}

fn serde_json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn read(
    format: Format,
    stream: bool,
    bytes: &[u8],
    cuts: &[usize],
) -> (
    Option<tokenwarden_provider::Usage>,
    Option<tokenwarden_provider::Usage>,
) {
    let mut r = UsageReader::new(format, stream);
    let mut at = 0;
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    for c in cuts {
        r.push(&bytes[at..c]);
        at = c;
    }
    r.push(&bytes[at..]);
    r.end();
    (r.usage(), r.seen())
}

proptest! {
    #[test]
    fn a_stream_read_in_pieces_is_read_as_whole(
        events in proptest::collection::vec(event(), 0..12),
        crlf in any::<bool>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
        anthropic in any::<bool>(),
    ) {
        let end = if crlf { "\r\n" } else { "\n" };
        let text: String = events.iter().map(|e| format!("{}{end}{end}", e.replace('\n', end))).collect();
        let format = if anthropic { Format::Anthropic } else { Format::Openai };
        let whole = read(format, true, text.as_bytes(), &[]);
        prop_assert_eq!(read(format, true, text.as_bytes(), &cuts), whole);
    }

    #[test]
    fn a_body_read_in_pieces_is_read_as_whole(
        input in 0u64..1000, output in 0u64..1000, pad in "[a-z]{0,40}",
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let text = format!(r#"{{"content":"{pad}","usage":{{"input_tokens":{input},"output_tokens":{output}}}}}"#);
        let whole = read(Format::Anthropic, false, text.as_bytes(), &[]);
        prop_assert_eq!(whole.0.map(|u| (u.input_tokens, u.output_tokens)), Some((input, output)));
        prop_assert_eq!(read(Format::Anthropic, false, text.as_bytes(), &cuts), whole);
    }

    #[test]
    fn no_input_makes_a_reader_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
        cuts in proptest::collection::vec(any::<usize>(), 0..4),
        anthropic in any::<bool>(), stream in any::<bool>(),
    ) {
        let format = if anthropic { Format::Anthropic } else { Format::Openai };
        let _ = read(format, stream, &bytes, &cuts);
        let _ = tokenwarden_provider::model_call("POST", &String::from_utf8_lossy(&bytes));
    }
}
