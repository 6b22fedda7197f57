// The edge limiter's Worker entry: the router and the Durable Object class live in
// the package `tokenwarden-edge` (the repository's edge/ folder); this file is what wrangler
// (or esbuild for the local run) bundles.
export { default, QuotaObject } from 'tokenwarden-edge'
