// The quota's state in Durable Object storage as many small values: every array longer
// than CHUNK elements (the core snapshot's lease and agent tables, its expiry queue, the
// object's own lease records) is stored in chunks of about CHUNK elements, each under a key
// named by its content, the rest under one head key. At the configured maxima (4,096
// leases, 1,024 agents) no stored value comes near Cloudflare's 128 KiB per value, and a
// change rewrites only the pieces whose text changed (a settle: the head and the chunk of
// each table it touched).
//
// Numbers are kept exactly: the core's snapshot holds integers above 2^53 (virtual times
// are u128), which JSON.parse would round; they are carried as raw JSON text
// (`JSON.rawJSON`, with the parse reviver's source text), so the snapshot that comes back
// is the one that went in, digit for digit.

/** Elements per stored chunk of a long array. */
export const CHUNK = 64
/** The head's key; chunks are `state<path>#<content hash>`. */
export const PREFIX = 'state'

/** `JSON.rawJSON` and `JSON.isRawJSON` (ES2025 JSON.parse source text access), which TypeScript's libraries do not declare yet. */
const RAW = /** @type {{ rawJSON(text: string): object, isRawJSON?(value: unknown): boolean }} */ (/** @type {unknown} */ (JSON))

const exact = (_key, value, context) => (typeof value === 'number' && !Number.isSafeInteger(value) && Number.isInteger(value) ? RAW.rawJSON(context.source) : value)

/** Parses JSON keeping every integer exact. */
export function parseExact(text) {
  return JSON.parse(text, exact)
}

/** FNV-1a over a string, 32 bits, with a seed: two of them name a chunk. */
function fnv(text, seed) {
  let h = seed
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i)
    h = Math.imul(h, 0x01000193) >>> 0
  }
  return h
}

/**
 * `value` as pieces: a Map from storage key to JSON text. A long array is cut into chunks
 * where an element's hash says so (content-defined: about CHUNK elements a chunk, at most
 * 2 × CHUNK), each stored under a key named by its content, and the head lists the keys in
 * order. Inserting, changing or removing one element changes one chunk's key and text;
 * the other chunks keep theirs, so nothing else is rewritten.
 */
export function pieces(value) {
  const out = new Map()
  const walk = (v, path) => {
    if (Array.isArray(v)) {
      if (v.length <= CHUNK) return v.map((x, i) => walk(x, `${path}.${i}`))
      const keys = []
      let part = []
      const flush = () => {
        const text = `[${part.join(',')}]`
        let key = `${PREFIX}${path}#${fnv(text, 0x811c9dc5).toString(36)}${fnv(text, 0x01000193).toString(36)}`
        // Two different chunks with one name (a hash collision) get distinct keys.
        for (let n = 1; out.has(key) && out.get(key) !== text; n++) key = `${key.replace(/~\d+$/, '')}~${n}`
        out.set(key, text)
        keys.push(key)
        part = []
      }
      v.forEach((x, i) => {
        const text = JSON.stringify(walk(x, `${path}#${i}`))
        part.push(text)
        if ((fnv(text, 0x9e3779b9) % CHUNK === 0 && part.length >= CHUNK / 8) || part.length >= 2 * CHUNK) flush()
      })
      if (part.length > 0) flush()
      return { $chunks: keys, $length: v.length }
    }
    if (v !== null && typeof v === 'object' && !RAW.isRawJSON?.(v)) {
      const o = {}
      for (const [k, x] of Object.entries(v)) o[k] = walk(x, `${path}.${k}`)
      return o
    }
    return v
  }
  out.set(PREFIX, JSON.stringify(walk(value, '')))
  return out
}

/** The value back from its pieces (`get(key)` returns the stored text); throws if one is missing. */
export function assemble(get) {
  const read = (key) => {
    const text = get(key)
    if (typeof text !== 'string') throw new Error(`stored state is incomplete: ${key} is missing`)
    return parseExact(text)
  }
  const revive = (v, path) => {
    if (Array.isArray(v)) return v.map((x, i) => revive(x, `${path}.${i}`))
    if (v !== null && typeof v === 'object' && !RAW.isRawJSON?.(v)) {
      if (Array.isArray(v.$chunks)) {
        const out = []
        for (const key of v.$chunks) for (const x of read(key)) out.push(revive(x, `${path}#${out.length}`))
        if (out.length !== v.$length) throw new Error(`stored state is inconsistent at ${path || 'the head'}`)
        return out
      }
      const o = {}
      for (const [k, x] of Object.entries(v)) o[k] = revive(x, `${path}.${k}`)
      return o
    }
    return v
  }
  return revive(read(PREFIX), '')
}

/** Cloudflare's limit on keys per `put` / `delete` call. */
const BATCH = 128

/**
 * Writes `value` over what `written` (key → text, as last written; updated in place) says
 * is stored: puts only the pieces whose text changed and deletes the ones no longer used.
 * All the calls are made before any is awaited, so they commit together.
 */
export function writeChanged(storage, written, value) {
  const next = pieces(value)
  const puts = []
  for (const [k, text] of next) if (written.get(k) !== text) puts.push([k, text])
  const gone = [...written.keys()].filter((k) => !next.has(k))
  const ops = []
  for (let i = 0; i < puts.length; i += BATCH) ops.push(storage.put(Object.fromEntries(puts.slice(i, i + BATCH))))
  for (let i = 0; i < gone.length; i += BATCH) ops.push(storage.delete(gone.slice(i, i + BATCH)))
  written.clear()
  for (const [k, text] of next) written.set(k, text)
  return { done: Promise.all(ops), put: puts.length, deleted: gone.length, bytes: puts.reduce((n, [, t]) => n + t.length, 0) }
}

/**
 * Reads the stored state: `{ value, written }`, or null when nothing is stored. A state in
 * the earlier single-value layout (`{ snapshot, leases }` under one key) is read as well;
 * the next write replaces it.
 */
export async function readState(storage) {
  const all = await storage.list({ prefix: PREFIX })
  if (all.size === 0) return null
  const head = all.get(PREFIX)
  if (head !== null && typeof head === 'object') return { value: head, written: new Map([[PREFIX, '']]) }
  const value = assemble((k) => all.get(k))
  const written = new Map()
  for (const [k, v] of all) if (typeof v === 'string') written.set(k, v)
  return { value, written }
}

/** A snapshot up to this size is stored whole, as text in the head value. */
const INLINE_SNAPSHOT_BYTES = 32 * 1024

/**
 * A quota's writes to storage, coalesced, and its alarm. Every change made before a write
 * starts shares it (and the alarm moves only when the next wake-up changes). `soon(delay)`:
 * `delay` is how long this change may wait for others — 0 for a mutating call, which awaits
 * the write before it replies, so nothing acknowledged is lost if the object is evicted
 * (concurrent calls interleave while they wait and share the write: group commit, a reply
 * in about one write); longer for changes no reply waits for. One write at a time: a write
 * that falls due while another is in flight starts when that one ends, with everything
 * changed by then, so under load writes follow each other back to back, each carrying many.
 */
export class StateWrites {
  /**
   * @param {any} storage the Durable Object's storage
   * @param {() => ({ snapshot: string, leases: unknown, epoch: string | null, wake: number | null } | null)} current
   *   what to write now (the engine's snapshot text, the member table's records, the epoch,
   *   and the next alarm as Unix ms or null for none), or null when there is nothing (reset
   *   in the meantime: the next change writes the new state)
   * @param {Map<string, string>} [written] what storage holds: key → text as last written (readState's)
   */
  constructor(storage, current, written = new Map()) {
    this.storage = storage
    this.current = current
    this.written = written
    /** The next write, while one is due: { promise, resolve, at (Unix ms), timer }. */
    this.pending = null
    /** The write in flight, or null. */
    this.writing = null
    /** The alarm last set (Unix ms), null for none, undefined when not known. */
    this.alarmAt = undefined
  }

  /** A change to write within `delay` ms; resolves once it is written. */
  soon(delay = 0) {
    const at = Date.now() + delay
    if (this.pending === null) {
      let resolve
      const promise = new Promise((r) => {
        resolve = r
      })
      this.pending = { promise, resolve, at: Number.POSITIVE_INFINITY, timer: /** @type {ReturnType<typeof setTimeout> | undefined} */ (undefined) }
    }
    const p = this.pending
    if (at < p.at) {
      p.at = at
      clearTimeout(p.timer)
      p.timer = setTimeout(() => this.#start(p), delay)
    }
    return p.promise
  }

  /** Storage was emptied (a reset): nothing is written, no alarm is set. */
  cleared() {
    this.written = new Map()
    this.alarmAt = undefined
  }

  #start(p) {
    if (this.writing !== null) {
      const later = () => this.#start(p)
      this.writing.then(later, later)
      return
    }
    const done = Promise.resolve(this.#flush(p))
    this.writing = done
    const clear = () => {
      if (this.writing === done) this.writing = null
    }
    done.then(clear, clear)
    p.resolve(done)
  }

  #flush(p) {
    if (this.pending === p) this.pending = null
    const now = this.current()
    if (now === null) return undefined
    // A small snapshot is stored as its text in the head; a large one is taken apart so
    // that its tables are chunked (parsing costs about 15 % of the throughput of small ones).
    const { snapshot, leases, epoch, wake } = now
    const w = writeChanged(this.storage, this.written, { snapshot: snapshot.length <= INLINE_SNAPSHOT_BYTES ? snapshot : parseExact(snapshot), leases, epoch })
    const writes = [w.done]
    const at = wake === null ? null : Math.max(wake, Date.now() + 1)
    if (at !== this.alarmAt) {
      this.alarmAt = at
      writes.push(at === null ? this.storage.deleteAlarm() : this.storage.setAlarm(at))
    }
    return Promise.all(writes)
  }
}
