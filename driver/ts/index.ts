/**
 * The engine-agnostic part of tokenwarden: the driver, the `fetch` wrapper, estimators,
 * errors and types. Runs anywhere `fetch` and streams exist (Node, browsers, Workers);
 * bring an {@link Engine} (the addon from `tokenwarden`, or the wasm build).
 */
export { Driver, Lease, headerPairs } from './driver.js'
export { RegisterEngine, configJson } from './register.js'
export type { RegisterBinding } from './register.js'
export type { AcquireOptions, CallAsk, DriverEvents, DriverOptions, HeadersLike, ReportOptions } from './driver.js'
export { Task, Tokenwarden, planFleetWith } from './tokenwarden.js'
export { RemoteLease, RemoteTokenwarden } from './remote.js'
export type { RemoteOptions } from './remote.js'
export type { TaskFailure, TaskOptions, TokenwardenOptions } from './tokenwarden.js'
export { createFetch, agentIdFor, failureSignature, taskIdFor } from './fetch.js'
export type { FetchContext, FetchOptions, HeldCall, LongWait, UpstreamTimeouts } from './fetch.js'
export { BytesPerTokenEstimator, CountTokensEstimator, DefaultEstimator, promptBytes } from './estimator.js'
export { providerRules, useProviderRules } from './rules.js'
export type { EstimatorCore, ProviderRules } from './rules.js'
export type {
  BytesPerTokenOptions,
  CountText,
  DefaultEstimatorOptions,
  Estimate,
  EstimateInput,
  Estimator,
  Observation,
  ObservedUsage,
  OpenAIEncoding,
} from './estimator.js'
export type { CountTokensFailure, CountTokensOptions } from './counttokens.js'
export { callShape, errorTypeFor, providerErrorBody, providerErrorEvent, stopAnswer, stopStatus } from './providers.js'
export { checkFleets, proxiedCall, proxiedProvider } from './gateway.js'
export type { FleetConfig, ProxiedCall, ProxyRefusal, QuotaConfig } from './gateway.js'
export type { CallShape, Provider, Stop } from './providers.js'
export { ManualClock, sleep, systemClock } from './clock.js'
export type { Clock } from './clock.js'
export { AbortedError, LeaseRejectedError, TokenwardenError, invalidArgument, normalizeEngineError } from './errors.js'
export type { ErrorCode } from './errors.js'
export { Emitter } from './emitter.js'
export type * from './types.js'
export { newCall, stepOf } from './types.js'
export { ENGINE_ERROR_CODES, LEASE_REQUEST_FIELDS, USAGE_FIELDS } from './abi.js'
export type { EngineErrorCode } from './errors.js'
