use super::*;

#[test]
fn camel_recases_keys_only() {
    assert_eq!(camel("input_tokens_per_minute"), "inputTokensPerMinute");
    assert_eq!(camel("p50_ms"), "p50Ms");
    assert_eq!(camel("agent"), "agent");
    let v = serde_json::json!({"binding_axis": "input_tokens", "axes": [{"last_minute": 1}]});
    assert_eq!(
        camel_keys(v),
        serde_json::json!({"bindingAxis": "input_tokens", "axes": [{"lastMinute": 1}]})
    );
}

#[test]
fn numbers_are_exact_integers_only() {
    assert_eq!(u64_from_f64(5.0, "x").ok(), Some(5));
    for bad in [
        -1.0,
        1.5,
        f64::NAN,
        f64::INFINITY,
        18_446_744_073_709_551_616.0,
    ] {
        let e = u64_from_f64(bad, "x").unwrap_err();
        assert_eq!(
            (e.kind, e.code, e.field.as_deref()),
            (ErrorKind::Range, "invalid_argument", Some("x"))
        );
    }
    assert!(
        u64_from_f64(-1.0, "now")
            .unwrap_err()
            .message
            .contains("got -1")
    );
    assert_eq!(u32_from_f64(7.0, "pool").ok(), Some(7));
    assert!(u32_from_f64(4_294_967_296.0, "pool").is_err());
    assert_eq!(
        u64_from_bigint(false, u64::MAX, true, "x").ok(),
        Some(u64::MAX)
    );
    assert!(u64_from_bigint(true, 1, true, "x").is_err());
    assert!(u64_from_bigint(false, 1, false, "x").is_err());
}

#[test]
fn core_errors_keep_their_codes() {
    let e = ArgError::from(core::LeaseError::TooLarge {
        field: "input_tokens",
    });
    assert_eq!(
        (e.kind, e.code, e.field.as_deref()),
        (ErrorKind::Range, "too_large", Some("inputTokens"))
    );
    let e = ArgError::from(core::LeaseError::UnknownLease);
    assert_eq!((e.kind, e.code), (ErrorKind::Error, "unknown_lease"));
}

#[test]
fn a_decision_that_fits_is_written_and_one_that_does_not_is_wide() {
    let mut io = [0.0; io::IO_SLOTS];
    let d = core::Decision::Queued {
        lease: core::LeaseId(7),
        eta: core::Millis(1234),
    };
    assert_eq!(io::io_decision(&mut io, &d), io::DECISION_QUEUED);
    assert_eq!(&io[..2], &[7.0, 1234.0]);
    let d = core::Decision::Grant {
        lease: core::LeaseId(7),
        expires_at: core::Millis(MAX_SAFE + 1),
    };
    assert_eq!(io::io_decision(&mut io, &d), io::WIDE);
    let d = core::Decision::Reject {
        retry_at: None,
        reason: core::RejectReason::QueueFull,
    };
    assert_eq!(io::io_decision(&mut io, &d), io::DECISION_REJECT);
    assert_eq!(&io[..3], &[0.0, -1.0, 2.0]);
}
