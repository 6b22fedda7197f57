// The edge limiter's Worker entry: the router and the Durable Object class live in
// bindings-wasm/edge/src; this file is what wrangler (or esbuild for the local run) bundles.
export { default, QuotaObject } from '../../../bindings-wasm/edge/src/worker.js'
