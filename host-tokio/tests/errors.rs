//! Bad input gets an error that names what is wrong, and nothing starts.

use tokenwarden_tokio::core::{Config, Timeouts};
use tokenwarden_tokio::{Builder, Error, Tokenwarden};

#[test]
fn outside_a_runtime_the_clock_task_cannot_start() {
    let err = Tokenwarden::from_config_json(r#"{"pools":[{"name":"p","requests_per_minute":5}]}"#)
        .unwrap_err();
    assert!(matches!(err, Error::NoRuntime), "{err:?}");
    assert!(err.to_string().contains("inside a tokio runtime"), "{err}");
}

#[tokio::test]
async fn a_config_error_names_the_field() {
    let err = Tokenwarden::from_config_json(
        r#"{"pools":[{"name":"p","requests_per_minute":5,"input_tokens_per_minuet":9}]}"#,
    )
    .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(err.to_string().contains("input_tokens_per_minuet"), "{err}");
}

#[tokio::test]
async fn a_timeout_out_of_range_is_named() {
    let config = Config::from_json(r#"{"pools":[{"name":"p","requests_per_minute":5}]}"#).unwrap();
    let err = Builder::new(config)
        .timeouts(Timeouts {
            first_byte_ms: Some(0),
            idle_ms: None,
        })
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeouts {
                field: "first_byte_ms"
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("timeouts.first_byte_ms"), "{err}");
}

#[tokio::test]
async fn an_estimator_option_out_of_range_is_named() {
    let config = Config::from_json(r#"{"pools":[{"name":"p","requests_per_minute":5}]}"#).unwrap();
    let options = tokenwarden_tokio::provider::estimate::Options {
        safety: 0.5,
        ..Default::default()
    };
    let err = Builder::new(config).estimator(options).build().unwrap_err();
    assert!(err.to_string().contains("safety"), "{err}");
}
