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

/** What a proxied request sends and what names its call (the gateway crate's rule). */
export interface ProxiedCall {
  /** The API it speaks, whose error format answers it. */
  provider: 'anthropic' | 'openai'
  /** The provider's path, `/v1/…`, as it came. */
  path: string
  /** The query string to send (`?…` or ''): a parameter holding a secret is left out. */
  query: string
  /** The headers to send: the provider's and the client's own, none holding a secret. */
  headers: [string, string][]
  /**
   * Who the call is: by its client's session headers (Claude Code's, Codex's; under a named
   * agent a subagent is its child, `alice/<id>`), else the agent named (the credential's, the
   * path's or `x-tokenwarden-agent`), else `proxy`.
   */
  name: string
  /** Its family's root when it is a subagent (a family shares one place in the fair order). */
  family: string | null
  /** The role named, `auto` when none is. */
  role: 'planner' | 'reviewer' | 'worker' | 'auto'
  /** The task named (an id or a name, as given). */
  task: string | null
  /** The downstream tasks it unblocks. */
  unblocks: number | null
  /** `x-tokenwarden-failure-signature`. */
  failureSignature: number | null
}

/** Why a proxied request is refused: what the host answers. */
export interface ProxyRefusal {
  status: 400 | 403 | 404
  error: 'invalid_argument' | 'forbidden' | 'not_found'
  message: string
  /** The header at fault, if one is. */
  field?: string
}

/**
 * The proxy's first step (the gateway crate's rule, which every host of the proxy runs):
 * from a proxied request — `rest` the URL path after `…/proxy`, `search` its query string,
 * `headers` its header pairs (names in lower case) — what is sent to the provider and what
 * names the call, or why it is refused. `secrets` are the fleet's (never forwarded, in any
 * letter case or percent-encoded, nor any credential or lease handle); `credential` the
 * agent of the caller's agent credential, who may name only itself.
 */
export function proxiedCall(
  rest: string,
  search: string,
  headers: Iterable<[string, string]>,
  secrets: ReadonlyArray<string | undefined>,
  credential: string | null = null,
): { call: ProxiedCall } | { refused: ProxyRefusal } {
  const given = secrets.filter((s): s is string => typeof s === 'string' && s.length > 0)
  const pairs = [...headers]
  // One string crosses into the engine: a header's name and value hold no line feed (the
  // Fetch API's `Headers` refuse one; pairs given by hand are checked).
  for (const [name, value] of pairs) {
    if (name.includes('\n') || value.includes('\n')) throw new TypeError(`a header's name and value hold no line feed: ${JSON.stringify(name)}`)
  }
  const read = JSON.parse(providerRules().proxiedCall(rest, search, pairs.flat().join('\n'), given, credential))
  if ('call' in read) read.call.headers = read.call.headers.map((i: number) => pairs[i])
  return read
}

/** The provider a proxied request speaks, for answering its errors; null when its path cannot be read. */
export function proxiedProvider(rest: string, anthropicVersion: boolean): 'anthropic' | 'openai' | null {
  return providerRules().proxiedProvider(rest, anthropicVersion) as 'anthropic' | 'openai' | null
}
