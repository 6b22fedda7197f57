//! One send with the answer's bytes (`send::Send`): the usage reader inside the core's
//! exchange decides the lease's end from what the body said.
use tokenwarden_core::{Answer, Millis, Timeout, Timeouts};
use tokenwarden_provider::send::{Send, SendAction};
use tokenwarden_provider::{Api, Usage};

const START: &[u8] = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"cache_read_input_tokens\":30,\"output_tokens\":1}}}\n\n";
const TEXT: &[u8] = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"abcdefgh\"}}\n\n";
const DELTA: &[u8] = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":42}}\n\n";

fn actions(s: &mut Send) -> Vec<SendAction> {
    core::iter::from_fn(|| s.poll_action()).collect()
}

fn usage(input: u64, read: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        cache_read_input_tokens: read,
        output_tokens: output,
        ..Usage::default()
    }
}

#[test]
fn a_stream_that_reports_its_usage_settles_with_it() {
    let mut s = Send::sent(Api::AnthropicMessages, Millis(0), 0, Timeouts::default());
    s.answered(Millis(1), Answer::Stream, 0);
    for piece in [START, TEXT, DELTA] {
        s.push(Millis(2), piece);
    }
    s.end(Millis(3));
    assert_eq!(
        actions(&mut s),
        [
            SendAction::Deliver,
            SendAction::Settle {
                usage: usage(12, 30, 42),
                learn: true
            }
        ]
    );
}

#[test]
fn a_stream_cut_short_ends_with_what_it_showed() {
    let mut s = Send::sent(Api::AnthropicMessages, Millis(0), 0, Timeouts::default());
    s.answered(Millis(1), Answer::Stream, 0);
    s.push(Millis(2), START);
    s.push(Millis(3), TEXT);
    s.end(Millis(4));
    // No final report: interrupted, output at least half the 8 characters of text.
    assert_eq!(
        actions(&mut s),
        [
            SendAction::Deliver,
            SendAction::Interrupted {
                seen: Some(usage(12, 30, 4))
            }
        ]
    );
}

#[test]
fn an_idle_stream_times_out_with_what_it_showed_and_a_refused_end_falls_back() {
    let t = Timeouts {
        first_byte_ms: None,
        idle_ms: Some(1_000),
    };
    let mut s = Send::sent(Api::AnthropicMessages, Millis(0), 0, t);
    s.answered(Millis(1), Answer::Stream, 0);
    s.push(Millis(2), START);
    s.reading(Millis(2));
    assert_eq!(s.poll_timeout(), Some(Millis(1_002)));
    s.handle_timeout(Millis(1_002));
    assert_eq!(
        actions(&mut s),
        [
            SendAction::Deliver,
            SendAction::TimedOut {
                timeout: Timeout::Idle,
                ms: 1_000
            },
            SendAction::Interrupted {
                seen: Some(usage(12, 30, 1))
            }
        ]
    );
    s.interrupted_refused(false);
    assert_eq!(actions(&mut s), [SendAction::Interrupted { seen: None }]);
}

#[test]
fn a_json_answer_settles_before_it_is_handed_over() {
    let mut s = Send::sent(Api::OpenaiChat, Millis(0), 0, Timeouts::default());
    s.answered(Millis(1), Answer::Json, 0);
    s.push(
        Millis(2),
        br#"{"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":60}}}"#,
    );
    assert_eq!(actions(&mut s), []);
    s.end(Millis(3));
    assert_eq!(
        actions(&mut s),
        [
            SendAction::Settle {
                usage: usage(40, 60, 5),
                learn: true
            },
            SendAction::Deliver
        ]
    );
}
