import { ENGINE_ERROR_CODES } from './abi.js'
import type { GiveUpReason, RejectReason, U64 } from './types.js'

/** The codes engines throw with (the list is generated from the Rust side, in `abi.ts`). */
export type EngineErrorCode = (typeof ENGINE_ERROR_CODES)[number]

/**
 * Stable error codes. Engines throw `Error`/`RangeError`/`TypeError` objects with an
 * {@link EngineErrorCode} in `code` (and `field` naming the offending field where there is
 * one); the driver adds its own four.
 */
/** `engine_unavailable`: the engine asked for cannot load on this platform (no prebuilt binary). */
/** `limiter_unreachable`: a remote driver's limiter has never answered, so it leases nothing locally (its share is not known). */
export type ErrorCode = EngineErrorCode | 'rejected' | 'aborted' | 'closed' | 'rate_limited' | 'engine_unavailable' | 'checkpoint_corrupt' | 'upstream_timeout' | 'limiter_unreachable'

/** An error from tokenwarden, with a stable machine-readable `code`. */
export class TokenwardenError extends Error {
  readonly code: ErrorCode
  /** The offending field, where there is one (`inputTokens`, `pools[0].requests_per_minute`). */
  readonly field?: string
  constructor(code: ErrorCode, message: string, options?: { field?: string; cause?: unknown }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause })
    this.name = 'TokenwardenError'
    this.code = code
    if (options?.field !== undefined) this.field = options.field
  }
}

/**
 * `acquire()` was refused: the pool cannot serve the request now (`retryable`, and
 * `retryAt` says when a new request has a fair chance), or ever as asked (more tokens than
 * the pool allows in a window), or the call gave up (`gaveUp`).
 */
export class LeaseRejectedError extends TokenwardenError {
  /**
   * Whether asking again can be served: `true` for a refusal for now (ask again at
   * `retryAt`); `false` for a request that can never be served as asked, or a call the core
   * gave up (`gaveUp`).
   */
  readonly retryable: boolean
  /** When a retryable refusal may ask again, on the driver's clock (ms); `null` when not `retryable`. */
  readonly retryAt: U64 | null
  /** How long from now that is, ms; `null` when not `retryable`. */
  readonly retryAfterMs: number | null
  readonly reason: RejectReason
  /** Set when a call gave up (the core's call lifecycle): after too many refusals, or never fits. */
  readonly gaveUp: GiveUpReason | null
  constructor(reason: RejectReason, retryAt: U64 | null, now: number, gaveUp: GiveUpReason | null = null) {
    const retryAfterMs = retryAt === null ? null : Math.max(0, Number(retryAt) - now)
    const why = reason.kind === 'exceeds_capacity' ? `the request needs more ${reason.axis} than the pool allows in a window` : reason.kind.replace(/_/g, ' ')
    super(
      'rejected',
      gaveUp === 'refusals'
        ? `lease rejected: ${why}; the call gave up after the configured number of refusals (call.max_refusals)`
        : retryAfterMs === null
          ? `lease rejected: ${why}; it can never be served as asked`
          : `lease rejected: ${why}; retry in ${(retryAfterMs / 1000).toFixed(1)} s`,
    )
    this.name = 'LeaseRejectedError'
    this.retryable = retryAt !== null && gaveUp === null
    this.retryAt = retryAt
    this.retryAfterMs = retryAfterMs
    this.reason = reason
    this.gaveUp = gaveUp
  }
}

/** The wait was cancelled through an `AbortSignal`; the queued ticket was withdrawn. */
export class AbortedError extends TokenwardenError {
  constructor(reason?: unknown) {
    super('aborted', 'acquire aborted while queued; the ticket was withdrawn', { cause: reason })
    this.name = 'AbortError'
  }
}

/** A `TypeError` with code `invalid_argument`, as engines throw for mistyped input. */
export function invalidArgument(message: string, field?: string): TypeError & { code: 'invalid_argument'; field?: string } {
  const err = new TypeError(message) as TypeError & { code: 'invalid_argument'; field?: string }
  err.code = 'invalid_argument'
  if (field !== undefined) err.field = field
  return err
}

const KNOWN: ReadonlySet<string> = new Set(ENGINE_ERROR_CODES)

/**
 * Engines' errors keep their class and stable code; anything else an engine's binding
 * layer threw (napi-rs's own argument checks say `InvalidArg`, V8 says nothing) becomes a
 * `TypeError` with code `invalid_argument`, so every engine reports bad input the same way.
 */
export function normalizeEngineError(e: unknown, what: string): unknown {
  const code = e instanceof Error ? (e as Error & { code?: unknown }).code : undefined
  if (typeof code === 'string' && (KNOWN.has(code) || code === 'closed')) return e
  const message = e instanceof Error ? e.message : String(e)
  const err = new TypeError(`invalid argument to ${what}: ${message}`, { cause: e }) as TypeError & {
    code: string
  }
  err.code = 'invalid_argument'
  return err
}
