/**
 * An answer read through an engine's exchange (`engine.exchange`: the core's machine with
 * the provider crate's usage reader), as a host would feed it: how the lease would end.
 * `usage`: what a settle carries (the body ended with its usage in full), with `learn`
 * (whether the estimator may learn from it); `seen`: what an interrupted end carries (the
 * body ended without it, or broke when `end` is false). Chunks are strings or bytes.
 */
export function readAnswer(engine, api, stream, chunks, { end = true } = {}) {
  const x = engine.exchange(api, 0, 0, engine.exchangeTimeouts(Number.POSITIVE_INFINITY, Number.POSITIVE_INFINITY))
  x.answered(0, stream ? 'stream' : 'json', 0)
  const encoder = new TextEncoder()
  for (const c of chunks) x.push(0, typeof c === 'string' ? encoder.encode(c) : c)
  if (end) x.end(0)
  else x.broken()
  const out = { usage: null, learn: null, seen: null, ends: 0 }
  for (const a of x.actions()) {
    if (a.do === 'settle') Object.assign(out, { usage: a.usage, learn: a.learn, ends: out.ends + 1 })
    if (a.do === 'interrupted') Object.assign(out, { seen: a.seen, ends: out.ends + 1 })
  }
  if (out.ends !== 1) throw new Error(`the exchange asked ${out.ends} ends of the lease`)
  return out
}

/** `bytes` cut into pieces of `step` bytes. */
export function pieces(bytes, step) {
  const out = []
  for (let i = 0; i < bytes.length; i += step) out.push(bytes.subarray(i, i + step))
  return out
}
