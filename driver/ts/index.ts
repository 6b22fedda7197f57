/**
 * The engine-agnostic part of tokenwarden: the driver, the `fetch` wrapper, estimators,
 * errors and types. Runs anywhere `fetch` and streams exist (Node, browsers, Workers);
 * bring an {@link Engine} (the addon from `tokenwarden`, or the wasm build).
 */
export { Driver, Lease, headerPairs } from './driver.js'
export { RegisterEngine, configJson } from './register.js'
export type { RegisterBinding } from './register.js'
export type { AcquireOptions, CallAsk, DriverEvents, DriverOptions, HeadersLike } from './driver.js'
export { Task, Tokenwarden } from './tokenwarden.js'
export { RemoteLease, RemoteTokenwarden } from './remote.js'
export type { RemoteOptions } from './remote.js'
export type { TaskFailure, TaskOptions, TokenwardenOptions } from './tokenwarden.js'
export { createFetch, agentIdFor, failureSignature, taskIdFor, DEFAULT_FIRST_BYTE_MS, DEFAULT_IDLE_MS } from './fetch.js'
export type { FetchContext, FetchOptions, LongWait, UpstreamTimeouts } from './fetch.js'
export { BytesPerTokenEstimator, promptBytes } from './estimator.js'
export type { BytesPerTokenOptions, Estimate, EstimateInput, Estimator, Observation } from './estimator.js'
export { SseUsage, callShape, detectProvider, errorTypeFor, providerErrorBody, usageFromBody } from './providers.js'
export type { CallShape, Provider } from './providers.js'
export { ManualClock, sleep, systemClock } from './clock.js'
export type { Clock } from './clock.js'
export { AbortedError, LeaseRejectedError, TokenwardenError, invalidArgument, normalizeEngineError } from './errors.js'
export type { ErrorCode } from './errors.js'
export { Emitter } from './emitter.js'
export type * from './types.js'
export { newCall } from './types.js'
export { ENGINE_ERROR_CODES, LEASE_REQUEST_FIELDS, USAGE_FIELDS } from './abi.js'
export type { EngineErrorCode } from './errors.js'
