// JSON with exact integers: integers beyond Number.MAX_SAFE_INTEGER parse as bigint (the
// trace files hold instants near u64::MAX; see tests/traces/SCHEMA.md, "Numbers"), and
// `stringify` writes bigints as plain integers. Runs in Node, browsers and Workers.

/** Parses JSON text; integers above 2^53 - 1 become bigints. */
export function parse(text) {
  let i = 0
  const ws = () => {
    while (i < text.length && ' \t\n\r'.includes(text[i])) i++
  }
  const fail = (what) => {
    throw new SyntaxError(`bad JSON at ${i}: ${what}`)
  }
  const value = () => {
    ws()
    const c = text[i]
    if (c === '{') {
      i++
      const out = {}
      ws()
      if (text[i] === '}') return i++, out
      for (;;) {
        ws()
        if (text[i] !== '"') fail('expected a key')
        const k = string()
        ws()
        if (text[i++] !== ':') fail('expected :')
        out[k] = value()
        ws()
        if (text[i] === ',') i++
        else if (text[i] === '}') return i++, out
        else fail('expected , or }')
      }
    }
    if (c === '[') {
      i++
      const out = []
      ws()
      if (text[i] === ']') return i++, out
      for (;;) {
        out.push(value())
        ws()
        if (text[i] === ',') i++
        else if (text[i] === ']') return i++, out
        else fail('expected , or ]')
      }
    }
    if (c === '"') return string()
    if (text.startsWith('true', i)) return (i += 4), true
    if (text.startsWith('false', i)) return (i += 5), false
    if (text.startsWith('null', i)) return (i += 4), null
    const m = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i, i + 64))
    if (m === null) fail('unexpected character')
    i += m[0].length
    if (m[2] === undefined && m[3] === undefined) {
      const n = Number(m[0])
      return Number.isSafeInteger(n) ? n : BigInt(m[0])
    }
    return Number(m[0])
  }
  const string = () => {
    const start = i
    i++
    let escaped = false
    while (i < text.length) {
      const ch = text[i]
      if (ch === '\\') escaped = true, i += 2
      else if (ch === '"') break
      else i++
    }
    const raw = text.slice(start, ++i)
    return escaped ? JSON.parse(raw) : raw.slice(1, -1)
  }
  const v = value()
  ws()
  if (i !== text.length) fail('trailing text')
  return v
}

/** JSON text with bigints written as integers. */
export function stringify(value, indent) {
  const marks = []
  const text = JSON.stringify(
    value,
    (_k, v) => {
      if (typeof v !== 'bigint') return v
      marks.push(v.toString())
      return `\u0000${marks.length - 1}\u0000`
    },
    indent,
  )
  return text.replace(/"\\u0000(\d+)\\u0000"/g, (_m, n) => marks[Number(n)])
}

/** Deep equality where a bigint equals a number of the same integer value. */
export function equal(a, b) {
  if ((typeof a === 'bigint' || typeof a === 'number') && (typeof b === 'bigint' || typeof b === 'number')) {
    if (typeof a === 'number' && !Number.isInteger(a)) return a === b
    if (typeof b === 'number' && !Number.isInteger(b)) return a === b
    return BigInt(a) === BigInt(b)
  }
  if (Array.isArray(a)) return Array.isArray(b) && a.length === b.length && a.every((x, k) => equal(x, b[k]))
  if (a !== null && typeof a === 'object') {
    if (b === null || typeof b !== 'object' || Array.isArray(b)) return false
    const ka = Object.keys(a)
    const kb = Object.keys(b)
    return ka.length === kb.length && ka.every((k) => Object.hasOwn(b, k) && equal(a[k], b[k]))
  }
  return a === b
}
