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
/** `requestLeaseIo`'s argument slots from 1 (slot 0 is `now`), in slot order; `cachedPrefixConfirmed` is 1 or 0. */
export const LEASE_REQUEST_FIELDS = ['agent', 'pool', 'inputTokens', 'cachedPrefixTokens', 'maxTokens', 'role', 'unblocks', 'failureSignature', 'task', 'cachedPrefixConfirmed'] as const
/** `callLeaseIo`'s call state (`failed`, `refusals`, `lastRetryAfterMs`, -1 none) from this slot, after the request. */
export const CALL_STATE_SLOT = 11
/** `settleIo`'s argument slots 2 to 5 (0 is `now`, 1 the lease), in slot order. */
export const USAGE_FIELDS = ['inputTokens', 'cacheCreationInputTokens', 'cacheReadInputTokens', 'outputTokens'] as const
/** Role codes: the index in this list. */
export const ROLES = ['worker', 'reviewer', 'planner'] as const
/** A rejected decision's reason code: the index in this list. */
export const REJECT_REASONS = ['exceeds_capacity', 'wait_too_long', 'queue_full', 'too_many_leases', 'too_many_agents'] as const
/** Axis codes: the index in this list. */
export const AXES = ['input_tokens', 'output_tokens', 'tokens', 'requests'] as const
/** `pollEventIo`'s return codes: the index in this list (-1: no event). */
export const EVENTS = ['granted', 'expired', 'margin_changed', 'paused', 'estimate_alert', 'margin_at_floor'] as const
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
/** The header report's first slot (recognised, malformed, retry after, reset at, should retry, exceeded, then 4 per axis). */
export const REPORT_SLOT = 20
/** After a register-file call that returned: the events waiting for `pollEvent`. */
export const EVENTS_SLOT = 48
/** After a register-file call that returned: `pollTimeout()`, -1 none, -2 above 2^53 - 1. */
export const TIMEOUT_SLOT = 49
/** Every stable code an engine's errors carry. */
export const ENGINE_ERROR_CODES = ['unknown_pool', 'unknown_lease', 'not_granted', 'too_large', 'invalid_argument', 'config_parse', 'invalid_config', 'snapshot_version', 'snapshot_parse', 'snapshot_config', 'snapshot_corrupt', 'unknown_task', 'too_many_tasks', 'internal', 'corrupt'] as const
