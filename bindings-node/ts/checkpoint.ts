/**
 * Resumable turns: write an agent's turn down before a long wait, and pick it up after the
 * process was killed, without a re-plan.
 *
 * Before a queued or refused wait (the wrapped `fetch`'s `onLongWait` hook, which the core
 * triggers) the agent saves its goal, the step it is on, the decisions so far, the call it
 * was about to make and the content hashes (SHA-256, with the platform's WebCrypto) of the
 * files it has read. On restart `resume()` hands all of it back with the files whose
 * content changed since: the agent re-reads only those, and sends the prepared call.
 *
 * ```js
 * const checkpoints = new Checkpoints('.tokenwarden/checkpoints', { root: repo })
 * const saved = await checkpoints.resume('worker-3')        // null on a first start
 * const claude = new Anthropic({
 *   // The wait hands over the call it holds: checkpoint it as the next call.
 *   fetch: tw.fetch({ agent: 'worker-3', onLongWait: (wait) => checkpoints.save('worker-3', { ...turn, nextCall: wait.call.body }) }),
 *   maxRetries: 0,
 * })
 * ```
 *
 * A checkpoint is one JSON file per agent, written atomically (a temporary file renamed
 * over the old one), so a kill mid-write leaves the previous checkpoint intact.
 */
import { mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises'
import { isAbsolute, join, normalize, relative, resolve, sep } from 'node:path'
import { TokenwardenError } from 'tokenwarden-driver'

/** What an agent writes down before a long wait. */
export interface Turn {
  /** What the agent is working towards (its task, in its own words). */
  goal: string
  /** Where it is: a step number or name. */
  step: number | string
  /** What it has decided so far (any JSON). */
  decisions: unknown[]
  /** The call it was about to make, as it would send it: `LongWait.call.body` in `onLongWait`, the SDK's `params` otherwise. */
  nextCall: unknown
  /** The files it has read so far (relative to `root`): their content hashes are kept. */
  files: string[]
}

/** A checkpoint picked up by {@link Checkpoints.resume}. */
export interface Resumed {
  goal: string
  step: number | string
  decisions: unknown[]
  nextCall: unknown
  /** When it was saved (`Date.now()` then). */
  savedAt: number
  /** How long ago, ms. */
  waitedMs: number
  /**
   * Whether the wait outlasted the prompt cache (`promptCacheTtlMs`): the resumed call
   * will not read the cache, and the coordinator charges its cached prefix as input (it
   * treats the agent's cache as cold once its lifetime has passed, and an agent it does
   * not know as cold).
   */
  cacheExpired: boolean
  /** Files whose content changed since the checkpoint: re-read these. */
  changed: string[]
  /** Files unchanged: what the agent knew of them still holds. */
  unchanged: string[]
  /** Files gone since. */
  missing: string[]
}

/** Options for {@link Checkpoints}. */
export interface CheckpointOptions {
  /** The directory `Turn.files` are relative to (default: the current directory). */
  root?: string
  /** The provider's prompt-cache lifetime, ms (default 300,000: five minutes). */
  promptCacheTtlMs?: number
}

interface Stored {
  version: 1
  agent: string
  savedAt: number
  goal: string
  step: number | string
  decisions: unknown[]
  nextCall: unknown
  files: Record<string, string>
}

const MAX_AGENT_NAME = 128

/** One directory of checkpoints, one file per agent. */
export class Checkpoints {
  readonly dir: string
  readonly root: string
  readonly promptCacheTtlMs: number

  constructor(dir: string, options: CheckpointOptions = {}) {
    if (typeof dir !== 'string' || dir.length === 0) throw new TypeError('Checkpoints needs a directory path')
    this.dir = resolve(dir)
    this.root = resolve(options.root ?? '.')
    this.promptCacheTtlMs = options.promptCacheTtlMs ?? 300_000
    if (!Number.isFinite(this.promptCacheTtlMs) || this.promptCacheTtlMs < 0) throw new RangeError('`promptCacheTtlMs` must be a non-negative number of milliseconds')
  }

  /** Writes `turn` down for `agent` (replacing its previous checkpoint); returns the file. */
  async save(agent: string, turn: Turn): Promise<string> {
    const file = this.#file(agent)
    checkTurn(turn)
    const files: Record<string, string> = {}
    for (const path of turn.files) {
      const hash = await this.#hash(path)
      if (hash === null) throw new TokenwardenError('invalid_argument', `cannot checkpoint ${JSON.stringify(path)}: no such file under ${this.root}`, { field: 'files' })
      files[this.#key(path)] = hash
    }
    const stored: Stored = {
      version: 1,
      agent,
      savedAt: Date.now(),
      goal: turn.goal,
      step: turn.step,
      decisions: turn.decisions,
      nextCall: turn.nextCall,
      files,
    }
    let text: string
    try {
      text = JSON.stringify(stored, null, 2)
    } catch (e) {
      throw new TokenwardenError('invalid_argument', `the turn cannot be written as JSON: ${(e as Error).message}`, { cause: e })
    }
    await mkdir(this.dir, { recursive: true })
    const tmp = `${file}.${process.pid}.${Date.now()}.tmp`
    await writeFile(tmp, text)
    await rename(tmp, file)
    return file
  }

  /**
   * The checkpoint of `agent`, with which of its files changed since, or `null` when there
   * is none. A file that is not a checkpoint is an error (`checkpoint_corrupt`), never
   * silently ignored.
   */
  async resume(agent: string): Promise<Resumed | null> {
    const file = this.#file(agent)
    let text: string
    try {
      text = await readFile(file, 'utf8')
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null
      throw e
    }
    let s: Stored
    try {
      s = JSON.parse(text) as Stored
    } catch (e) {
      throw new TokenwardenError('checkpoint_corrupt', `${file} is not a checkpoint (invalid JSON): ${(e as Error).message}`, { cause: e })
    }
    if (s?.version !== 1 || s.agent !== agent || typeof s.savedAt !== 'number' || s.files === null || typeof s.files !== 'object') {
      throw new TokenwardenError('checkpoint_corrupt', `${file} is not a checkpoint of ${JSON.stringify(agent)} (version 1)`)
    }
    const changed: string[] = []
    const unchanged: string[] = []
    const missing: string[] = []
    for (const [path, hash] of Object.entries(s.files)) {
      const now = await this.#hash(path)
      if (now === null) missing.push(path)
      else if (now === hash) unchanged.push(path)
      else changed.push(path)
    }
    const waitedMs = Math.max(0, Date.now() - s.savedAt)
    return {
      goal: s.goal,
      step: s.step,
      decisions: s.decisions,
      nextCall: s.nextCall,
      savedAt: s.savedAt,
      waitedMs,
      cacheExpired: waitedMs >= this.promptCacheTtlMs,
      changed,
      unchanged,
      missing,
    }
  }

  /** Removes `agent`'s checkpoint (its turn is done); nothing if there is none. */
  async clear(agent: string): Promise<void> {
    await rm(this.#file(agent), { force: true })
  }

  #file(agent: string): string {
    if (typeof agent !== 'string' || agent.length === 0 || agent.length > MAX_AGENT_NAME) {
      throw new TypeError(`a checkpoint's agent must be a name of 1 to ${MAX_AGENT_NAME} characters`)
    }
    // Any name maps to one file in the directory, and no name leaves it.
    return join(this.dir, `${encodeURIComponent(agent).replace(/\./g, '%2E')}.json`)
  }

  /** `path` relative to the root, refused if it leaves the root. */
  #key(path: string): string {
    const abs = resolve(this.root, path)
    const rel = relative(this.root, abs)
    if (rel === '' || rel.startsWith(`..${sep}`) || rel === '..' || isAbsolute(rel)) {
      throw new TokenwardenError('invalid_argument', `${JSON.stringify(path)} is not a file under ${this.root}`, { field: 'files' })
    }
    return normalize(rel).split(sep).join('/')
  }

  /** The SHA-256 of a file's content (hex), or `null` if it does not exist. */
  async #hash(path: string): Promise<string | null> {
    let bytes: Uint8Array<ArrayBuffer>
    try {
      bytes = await readFile(resolve(this.root, this.#key(path)))
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null
      throw e
    }
    const digest = new Uint8Array(await globalThis.crypto.subtle.digest('SHA-256', bytes))
    return Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('')
  }
}

function checkTurn(turn: Turn): void {
  if (turn === null || typeof turn !== 'object') throw new TypeError('save() needs a turn: { goal, step, decisions, nextCall, files }')
  if (typeof turn.goal !== 'string') throw new TypeError('`goal` must be a string')
  if (typeof turn.step !== 'number' && typeof turn.step !== 'string') throw new TypeError('`step` must be a number or a string')
  if (!Array.isArray(turn.decisions)) throw new TypeError('`decisions` must be an array')
  if (!Array.isArray(turn.files) || !turn.files.every((f) => typeof f === 'string')) throw new TypeError('`files` must be an array of paths')
}
