//! Errors in each provider's format, as its official SDKs parse them.
use serde_json::json;
use tokenwarden_provider::errors::{error_body, error_event, error_type};
use tokenwarden_provider::estimate::Provider;

#[test]
fn each_provider_s_error_format() {
    let fields =
        json!({ "error": "rejected", "message": "the pool is paused", "retryAfterMs": 2000 });
    assert_eq!(
        error_body(
            Provider::Anthropic,
            429,
            None,
            "tokenwarden: the pool is paused",
            &fields
        ),
        json!({ "type": "error", "error": { "type": "rate_limit_error", "message": "tokenwarden: the pool is paused" }, "tokenwarden": fields })
    );
    assert_eq!(
        error_body(
            Provider::Openai,
            429,
            None,
            "tokenwarden: the pool is paused",
            &fields
        ),
        json!({ "error": { "message": "tokenwarden: the pool is paused", "type": "rate_limit_error", "code": "rejected" }, "tokenwarden": fields })
    );
    // A type named by the caller (an upstream's own) wins over the status's.
    let body = error_body(
        Provider::Anthropic,
        500,
        Some("overloaded_error"),
        "busy",
        &json!({ "error": "x" }),
    );
    assert_eq!(body["error"]["type"], "overloaded_error");
}

#[test]
fn statuses_map_to_the_providers_types() {
    for (status, ty) in [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (426, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "api_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ] {
        assert_eq!(error_type(status), ty, "{status}");
    }
}

#[test]
fn an_error_inside_a_stream_is_an_event_of_the_provider_s_stream() {
    let fields = json!({ "error": "upstream_unreachable" });
    let a = error_event(Provider::Anthropic, 502, None, "gone", &fields);
    assert!(
        a.starts_with("event: error\ndata: {") && a.ends_with("}\n\n"),
        "{a}"
    );
    let o = error_event(Provider::Openai, 502, None, "gone", &fields);
    assert!(
        o.starts_with("data: {\"error\"") && o.ends_with("}\n\n"),
        "{o}"
    );
    let data: serde_json::Value =
        serde_json::from_str(o.trim_start_matches("data: ").trim_end()).unwrap();
    assert_eq!(data["error"]["code"], "upstream_unreachable");
}
