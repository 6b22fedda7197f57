// A coordinator's metrics (the core's `Metrics`, camelCase keys, as `engine.metrics(now)`
// returns them) in the Prometheus text exposition format, version 0.0.4, for one quota of
// one fleet. Written once in Rust, for the Worker and `tokenwarden serve` alike: the gateway
// crate's `prometheus::text`, through the wasm build's `gatewayRule` (`op: 'prometheus'`).
//
// Every sample carries `fleet` and `quota` labels; per-pool families add `pool`, per-axis
// ones `axis`, per-agent ones `agent` (the agent's name; at most MAX_AGENT_LABELS of them
// and `other`). Families are written in a fixed order, each as one group (HELP, TYPE, then
// its samples); a family with no sample (say `tokenwarden_limit` before any limit is known)
// is left out. No timestamps: the scraper stamps the samples.

import { gatewayRule } from 'tokenwarden-wasm'

/**
 * The edge's count of refusals and 429s per pool (`GET /metrics`'s `ceilings`): 429s by the
 * limit the provider named, refusals by `reason` or `reason:axis`.
 * @typedef {{ pools?: Array<{ pool: string | number, rateLimited?: Record<string, number>, rejected?: Record<string, number> }> }} Ceilings
 */

/** The `Content-Type` of {@link prometheusText}'s output. */
export const PROMETHEUS_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8'

/** Agents labelled by name in the per-agent families; the rest are summed as `other` (the gateway crate's `prometheus::MAX_AGENT_LABELS`). */
export const MAX_AGENT_LABELS = 20

/**
 * Renders `metrics` as Prometheus text (exposition format 0.0.4).
 *
 * @param {import('tokenwarden-wasm').Metrics & { ceilings?: Ceilings }} metrics the coordinator's
 *   metrics, as `engine.metrics(now)` returns them (numbers; bigints are accepted too), with
 *   the edge's `ceilings` when it adds them
 * @param {{ fleet: string, quota: string }} labels the fleet and quota every sample is
 *   labelled with
 * @returns {string} the exposition, one `\n`-terminated line each
 */
export function prometheusText(metrics, labels) {
  const fleet = JSON.stringify(String(labels?.fleet ?? ''))
  const quota = JSON.stringify(String(labels?.quota ?? ''))
  const input = `{"op":"prometheus","fleet":${fleet},"quota":${quota},"metrics":${ruleJson(metrics) ?? 'null'}}`
  return JSON.parse(gatewayRule(input)).text
}

/**
 * A label value as the text format wants it: backslash, double quote and line feed escaped
 * (as the gateway crate escapes the labels of {@link prometheusText}).
 * @param {string} value
 */
export function escapeLabelValue(value) {
  return String(value).replace(/[\\"\n]/g, (c) => (c === '\n' ? '\\n' : `\\${c}`))
}

/**
 * `value` as JSON for the rule, as `JSON.stringify` writes it but for numbers JSON has no
 * spelling of: a bigint as its digits (exactly, where `Number()` would round past 2^53), NaN
 * and the infinities as the strings `Number()` reads back (`"NaN"`, `"Infinity"`,
 * `"-Infinity"`), which the rule reads as JavaScript does. Undefined where `JSON.stringify`
 * would leave the value out.
 * @param {unknown} value
 * @returns {string | undefined}
 */
function ruleJson(value) {
  switch (typeof value) {
    case 'bigint':
      return value.toString()
    case 'number':
      return Number.isFinite(value) ? JSON.stringify(value) : JSON.stringify(String(value))
    case 'string':
    case 'boolean':
      return JSON.stringify(value)
    case 'object': {
      if (value === null) return 'null'
      if (Array.isArray(value)) return `[${value.map((v) => ruleJson(v) ?? 'null').join(',')}]`
      const fields = []
      for (const [k, v] of Object.entries(value)) {
        const json = ruleJson(v)
        if (json !== undefined) fields.push(`${JSON.stringify(k)}:${json}`)
      }
      return `{${fields.join(',')}}`
    }
    default:
      return undefined
  }
}
