// Generated from the Rust crate tokenwarden-js-abi (bindings-js-abi/src/lib.rs): do not edit.
// `cargo test -p tokenwarden-js-abi` fails when this file is out of date; run it with
// UPDATE_ABI=1 to rewrite it.

/** Slots in a register file (a `Float64Array`). */
export const IO_SLOTS = 50
/** `requestLeaseIo`'s return codes; `WIDE`: the result needs `bigint`s, take it with `takeWide()`. */
export const DECISION_GRANT = 0
export const DECISION_QUEUED = 1
export const DECISION_REJECT = 2
export const DECISION_NEVER = 3
export const WIDE = 9
/** `requestLeaseIo`'s request, from `SLOT_ARG_REQUEST` in this order; `cachedPrefixConfirmed` is 1 or 0. */
export const LEASE_REQUEST_FIELDS = ['agent', 'pool', 'inputTokens', 'cachedPrefixTokens', 'maxTokens', 'role', 'unblocks', 'failureSignature', 'task', 'cachedPrefixConfirmed', 'family'] as const
/** `settleIo`'s usage, from `SLOT_ARG_USAGE` in this order. */
export const USAGE_FIELDS = ['inputTokens', 'cacheCreationInputTokens', 'cacheReadInputTokens', 'outputTokens'] as const
/** Role codes: the index in this list. */
export const ROLES = ['worker', 'reviewer', 'planner', 'auto'] as const
/** A rejected decision's reason code: the index in this list. */
export const REJECT_REASONS = ['exceeds_capacity', 'wait_too_long', 'queue_full', 'too_many_leases', 'too_many_agents'] as const
/** Axis codes: the index in this list. */
export const AXES = ['input_tokens', 'output_tokens', 'tokens', 'requests'] as const
/** `pollEventIo`'s return codes: the index in this list (-1: no event). */
export const EVENTS = ['granted', 'expired', 'margin_changed', 'paused', 'estimate_alert', 'margin_at_floor', 'revised'] as const
/** A margin change's reason code (its event's slot 3): the index in this list. */
export const MARGIN_REASONS = ['rate_limited', 'recovered', 'confirmed', 'headers_disagreed'] as const
/** `callLeaseIo`'s and `callResponseIo`'s return codes (or `WIDE`: take the result with `takeWide()`). */
export const STEP_SEND = 0
export const STEP_WAIT = 1
export const STEP_DELIVER = 2
export const STEP_GIVE_UP = 3
/** A wait's reason code: the index in this list. */
export const WAIT_REASONS = ['queued', 'refused', 'rate_limited', 'overloaded'] as const
/** A give-up's reason code: the index in this list. */
export const GIVE_UP_REASONS = ['never_fits', 'refusals', 'attempts'] as const
/** The header report's axes in slot order; `exceeded`'s code is the index here. */
export const RATE_AXES = ['requests', 'tokens', 'input_tokens', 'output_tokens', 'concurrent'] as const
/** An exchange's event codes (`Exchange.event`): the index in this list. */
export const EXCHANGE_EVENTS = ['settled', 'empty', 'json', 'stream', 'reading', 'end', 'broken', 'failed', 'timeout', 'renewed', 'renew_refused', 'settle_refused', 'interrupted_refused'] as const
/**
 * The register file's named slots, `SLOT_<LAYOUT>_<NAME>`, from the crate's one table
 * (`io::SLOT_TABLE`; what each layout holds is documented there). After a register-file
 * call that returned, `SLOT_AFTER_EVENTS` holds the events waiting for `pollEvent` and
 * `SLOT_AFTER_TIMEOUT` what `pollTimeout()` answers (-1 none, -2 above 2^53 - 1).
 */
export const SLOT_ARG_NOW = 0
export const SLOT_ARG_LEASE = 1
export const SLOT_ARG_USAGE = 2
export const SLOT_ARG_REQUEST = 1
export const SLOT_ARG_CALL = 12
export const SLOT_RESPONSE_NOW = 0
export const SLOT_RESPONSE_POOL = 1
export const SLOT_RESPONSE_LEASE = 2
export const SLOT_RESPONSE_STATUS = 3
export const SLOT_RESPONSE_UNIX_NOW_MS = 4
export const SLOT_RESPONSE_CALL = 5
export const SLOT_DECISION_LEASE = 0
export const SLOT_DECISION_INSTANT = 1
export const SLOT_DECISION_REASON = 2
export const SLOT_DECISION_AXIS = 3
export const SLOT_SETTLEMENT_RESERVED = 0
export const SLOT_SETTLEMENT_USED = 4
export const SLOT_CALL_FAILED = 0
export const SLOT_CALL_REFUSALS = 1
export const SLOT_CALL_LAST_RETRY_AFTER_MS = 2
export const SLOT_CALL_LEASE = 3
export const SLOT_CALL_INSTANT = 4
export const SLOT_CALL_REASON = 5
export const SLOT_CALL_REFUSAL = 6
export const SLOT_CALL_REFUSAL_AXIS = 7
export const SLOT_CALL_ATTEMPTS = 8
export const SLOT_CALL_CHECKPOINT = 9
export const SLOT_CALL_GIVE_UP_RETRY_AFTER_MS = 10
export const SLOT_CALL_SETTLED = 11
export const SLOT_CALL_RESERVED = 12
export const SLOT_CALL_USED = 16
export const SLOT_CALL_EXPECTED = 20
export const SLOT_REPORT_RECOGNISED = 21
export const SLOT_REPORT_MALFORMED = 22
export const SLOT_REPORT_RETRY_AFTER_MS = 23
export const SLOT_REPORT_RESET_AT_MS = 24
export const SLOT_REPORT_SHOULD_RETRY = 25
export const SLOT_REPORT_EXCEEDED = 26
export const SLOT_REPORT_AXES = 27
export const SLOT_RATE_AXIS_LIMIT = 0
export const SLOT_RATE_AXIS_REMAINING = 1
export const SLOT_RATE_AXIS_RESET_AFTER_MS = 2
export const SLOT_RATE_AXIS_GRANULARITY = 3
export const SLOT_RATE_AXIS_WIDTH = 4
export const SLOT_AFTER_EVENTS = 48
export const SLOT_AFTER_TIMEOUT = 49
/** Every stable code an engine's errors carry. */
export const ENGINE_ERROR_CODES = ['unknown_pool', 'unknown_lease', 'not_granted', 'too_large', 'invalid_argument', 'config_parse', 'invalid_config', 'snapshot_version', 'snapshot_parse', 'snapshot_config', 'snapshot_corrupt', 'unknown_task', 'too_many_tasks', 'forbidden', 'internal', 'corrupt'] as const
