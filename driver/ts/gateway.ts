/**
 * The gateway's configuration, read by the gateway crate's rule (`tokenwarden-gateway`,
 * through the engine package's rules): the one strict reading that the edge limiter (its
 * `TOKENWARDEN_FLEETS`) and `tokenwarden serve` (its `--config` file) share.
 */
import { providerRules } from './rules.js'

/** One quota of a fleet: one provider API key's core configuration and upstream. */
export interface QuotaConfig {
  /** The core's configuration (as `createTokenwarden({ config })` takes it). */
  config: Record<string, unknown>
  /** The provider's base URL the proxy sends to; absent: the lease API only. */
  upstream?: string
  /** The upstream timeouts (ms). */
  timeouts?: { firstByteMs?: number; idleMs?: number }
}

/** One fleet (a tenant): its secrets, who may use its proxy, its quotas. */
export interface FleetConfig {
  secret: string
  admin_secret?: string
  proxy_open?: boolean | 'credential'
  quotas: Record<string, QuotaConfig>
}

/**
 * Checks a fleets configuration and answers its fleets by name: `text` is the edge
 * limiter's `TOKENWARDEN_FLEETS` (an object of fleets), or with `serveFile`
 * `tokenwarden serve --config`'s file (`{ "fleets": { … } }`). Read strictly: an unknown
 * key (a typo), a secret that is short or only spaces, an upstream that is not https (or
 * http to a loopback host), a timeout out of range or a core configuration the core
 * refuses throws a `TokenwardenError` `invalid_config` whose `field` names the place
 * (`fleets.acme.quotas.main.upstrem`).
 */
export function checkFleets(text: string, options: { serveFile?: boolean } = {}): Record<string, FleetConfig> {
  return JSON.parse(providerRules().checkFleets(text, options.serveFile === true)) as Record<string, FleetConfig>
}
