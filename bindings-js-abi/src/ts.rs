//! The TypeScript mirror of this crate's tables: `driver/ts/abi.ts`, which the shared
//! driver's register-file engine and error handling import instead of keeping copies.

use crate::ERROR_CODES;
use crate::io;

/// A list of strings as a `readonly` TypeScript tuple.
fn tuple(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("'{s}'")).collect();
    format!("[{}] as const", quoted.join(", "))
}

/// A core enum value's serde tag (`"input_tokens"`, `"worker"`).
fn tag<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// `export const SLOT_<LAYOUT>_<NAME> = <slot>` for every named slot, one per line.
fn slot_constants() -> String {
    let mut out = String::new();
    for (layout, slots) in io::SLOT_TABLE {
        for (name, slot) in *slots {
            let layout = layout.to_uppercase();
            out.push_str(&format!("export const SLOT_{layout}_{name} = {slot}\n"));
        }
    }
    out
}

/// The text of `driver/ts/abi.ts`.
#[must_use]
pub fn typescript() -> String {
    let axes: Vec<String> = io::AXES.iter().map(tag).collect();
    let roles = io::ROLE_NAMES;
    let axes: Vec<&str> = axes.iter().map(String::as_str).collect();
    format!(
        "\
// Generated from the Rust crate tokenwarden-js-abi (bindings-js-abi/src/lib.rs): do not edit.
// `cargo test -p tokenwarden-js-abi` fails when this file is out of date; run it with
// UPDATE_ABI=1 to rewrite it.

/** Slots in a register file (a `Float64Array`). */
export const IO_SLOTS = {slots}
/** `requestLeaseIo`'s return codes; `WIDE`: the result needs `bigint`s, take it with `takeWide()`. */
export const DECISION_GRANT = {grant}
export const DECISION_QUEUED = {queued}
export const DECISION_REJECT = {reject}
export const DECISION_NEVER = {never}
export const WIDE = {wide}
/** `requestLeaseIo`'s request, from `SLOT_ARG_REQUEST` in this order; `cachedPrefixConfirmed` is 1 or 0. */
export const LEASE_REQUEST_FIELDS = {request}
/** `settleIo`'s usage, from `SLOT_ARG_USAGE` in this order. */
export const USAGE_FIELDS = {usage}
/** Role codes: the index in this list. */
export const ROLES = {roles}
/** A rejected decision's reason code: the index in this list. */
export const REJECT_REASONS = {reasons}
/** Axis codes: the index in this list. */
export const AXES = {axes}
/** `pollEventIo`'s return codes: the index in this list (-1: no event). */
export const EVENTS = {events}
/** A margin change's reason code (its event's slot 3): the index in this list. */
export const MARGIN_REASONS = {margin_reasons}
/** `callLeaseIo`'s and `callResponseIo`'s return codes (or `WIDE`: take the result with `takeWide()`). */
export const STEP_SEND = {step_send}
export const STEP_WAIT = {step_wait}
export const STEP_DELIVER = {step_deliver}
export const STEP_GIVE_UP = {step_give_up}
/** A wait's reason code: the index in this list. */
export const WAIT_REASONS = {wait_reasons}
/** A give-up's reason code: the index in this list. */
export const GIVE_UP_REASONS = {give_up_reasons}
/** The header report's axes in slot order; `exceeded`'s code is the index here. */
export const RATE_AXES = {rate_axes}
/** An exchange's event codes (`Exchange.event`): the index in this list. */
export const EXCHANGE_EVENTS = {exchange_events}
/**
 * The register file's named slots, `SLOT_<LAYOUT>_<NAME>`, from the crate's one table
 * (`io::SLOT_TABLE`; what each layout holds is documented there). After a register-file
 * call that returned, `SLOT_AFTER_EVENTS` holds the events waiting for `pollEvent` and
 * `SLOT_AFTER_TIMEOUT` what `pollTimeout()` answers (-1 none, -2 above 2^53 - 1).
 */
{named_slots}/** Every stable code an engine's errors carry. */
export const ENGINE_ERROR_CODES = {errors}
",
        slots = io::IO_SLOTS,
        grant = io::DECISION_GRANT,
        queued = io::DECISION_QUEUED,
        reject = io::DECISION_REJECT,
        never = io::DECISION_NEVER,
        wide = io::WIDE,
        request = tuple(&io::LEASE_REQUEST_FIELDS),
        usage = tuple(&io::USAGE_FIELDS),
        roles = tuple(&roles),
        reasons = tuple(&io::REJECT_REASONS),
        axes = tuple(&axes),
        events = tuple(&io::EVENTS),
        margin_reasons = tuple(&io::MARGIN_REASONS),
        errors = tuple(&ERROR_CODES),
        step_send = io::STEP_SEND,
        step_wait = io::STEP_WAIT,
        step_deliver = io::STEP_DELIVER,
        step_give_up = io::STEP_GIVE_UP,
        wait_reasons = tuple(&io::WAIT_REASONS),
        give_up_reasons = tuple(&io::GIVE_UP_REASONS),
        rate_axes = tuple(&io::RATE_AXES),
        exchange_events = tuple(&crate::exchange::EVENTS),
        named_slots = slot_constants(),
    )
}
