//! However a model call's path is spelled — escapes, case, parameters, empty and dot
//! segments — a path a router reads as it is a model call of the same API.
use proptest::prelude::*;
use tokenwarden_provider::{Api, model_call};

/// One way to spell a segment that a router reads as that segment.
fn respell(segment: &str, how: &[u8]) -> String {
    let mut out = String::new();
    for (i, c) in segment.chars().enumerate() {
        match how.get(i).copied().unwrap_or(0) % 4 {
            0 => out.push(c),
            1 => out.push(c.to_ascii_uppercase()),
            2 => out.push_str(&format!("%{:02X}", c as u32)),
            _ => out.push_str(&format!("%25{:02x}", c as u32)),
        }
    }
    out
}

proptest! {
    #[test]
    fn a_respelled_model_call_is_still_one(
        which in 0usize..3,
        prefix in proptest::collection::vec("[a-z0-9]{1,6}", 0..3),
        hows in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 12), 3),
        noise in proptest::collection::vec(0u8..5, 4),
        query in "[a-z=&]{0,10}",
    ) {
        let (api, tail): (Api, &[&str]) = match which {
            0 => (Api::AnthropicMessages, &["messages"]),
            1 => (Api::OpenaiChat, &["chat", "completions"]),
            _ => (Api::OpenaiResponses, &["responses"]),
        };
        let mut path = String::new();
        for p in &prefix {
            path.push('/');
            path.push_str(p);
        }
        path.push_str("/v1");
        for (i, seg) in tail.iter().enumerate() {
            // Noise a router skips before the segment: an empty one, a `.`, a detour.
            match noise[i] {
                1 => path.push('/'),
                2 => path.push_str("/."),
                3 => path.push_str("/detour/.."),
                _ => {}
            }
            path.push('/');
            path.push_str(&respell(seg, &hows[i]));
            if noise[i + 1] == 4 {
                path.push_str(";p=1");
            }
        }
        if noise[3] % 2 == 1 {
            path.push('/');
        }
        if !query.is_empty() {
            path.push('?');
            path.push_str(&query);
        }
        prop_assert_eq!(model_call("POST", &path), Some(api), "{}", path);
    }
}
