// The wasm coordinator as the shared driver's `RegisterBinding`, with the register file and
// the header text passed through wasm memory instead of wasm-bindgen's per-call copies.
//
// wasm-bindgen would pass a `Float64Array` argument by allocating wasm memory, copying it in
// and back and freeing it, and a string by copying it one character at a time (about 1.5 µs
// for a response's 300 characters of headers). Instead the coordinator keeps its register
// file and a text buffer in wasm memory and hands out views of them (`registers()`,
// `textBuffer()`): a call copies the 50 slots in and out with one `set` each, and the
// headers go in with one `TextEncoder.encodeInto`. A view reads as empty once wasm memory
// has grown (any call of any coordinator of the module may grow it); it is then asked for
// again.

const encoder = new TextEncoder()

/** A wasm `Coordinator` as a `RegisterBinding` (see `tokenwarden-driver`'s `register.ts`). */
export class WasmRegisters {
  #c
  /** The coordinator's register file in wasm memory. */
  #regs
  /** Its header text buffer in wasm memory. */
  #text

  /** @param {any} coordinator a `Coordinator` from the wasm module */
  constructor(coordinator) {
    this.#c = coordinator
    this.#regs = coordinator.registers()
    this.#text = coordinator.textBuffer(1024)
  }

  get pools() {
    return this.#c.pools
  }

  /**
   * Forgets the views, before the coordinator is freed: its memory may then be another
   * coordinator's. Every later call asks the freed coordinator for a view first, which
   * throws before anything is written.
   */
  dispose() {
    this.#regs = new Float64Array(0)
    this.#text = new Uint8Array(0)
  }

  /** The register file's view, asked for again if wasm memory grew since. */
  #view() {
    if (this.#regs.length === 0) this.#regs = this.#c.registers()
    return this.#regs
  }

  /** Copies the caller's registers in. */
  #in(io) {
    this.#view().set(io)
  }

  /** Copies the results back out to the caller's registers (the view may be new). */
  #out(io) {
    io.set(this.#view())
  }

  /** Writes `headers` into the text buffer; returns its length in bytes. */
  #headers(headers) {
    // UTF-8 takes at most 3 bytes per UTF-16 unit.
    const need = headers.length * 3
    if (this.#text.length < need || this.#text.length === 0) this.#text = this.#c.textBuffer(Math.max(need, 1024))
    return encoder.encodeInto(headers, this.#text).written
  }

  requestLeaseIo(io) {
    this.#in(io)
    const code = this.#c.requestLeaseIo()
    this.#out(io)
    return code
  }

  settleIo(io) {
    this.#in(io)
    const code = this.#c.settleIo()
    this.#out(io)
    return code
  }

  cancelIo(io) {
    this.#in(io)
    this.#c.cancelIo()
    this.#out(io)
  }

  handleTimeoutIo(io) {
    this.#in(io)
    this.#c.handleTimeoutIo()
    this.#out(io)
  }

  pollEventIo(io) {
    const code = this.#c.pollEventIo()
    this.#out(io)
    return code
  }

  callLeaseIo(io) {
    this.#in(io)
    const code = this.#c.callLeaseIo()
    this.#out(io)
    return code
  }

  callResponseIo(io, headers) {
    // The text first: growing its buffer may grow wasm memory, which the registers' view
    // then notices.
    const len = this.#headers(headers)
    this.#in(io)
    const code = this.#c.callResponseIo(len)
    this.#out(io)
    return code
  }

  handleResponseIo(io, headers) {
    const len = this.#headers(headers)
    this.#in(io)
    const code = this.#c.handleResponseIo(len)
    this.#out(io)
    return code
  }

  // Everything else is the coordinator's own method.
  poolId(name) {
    return this.#c.poolId(name)
  }
  modelCall(method, target) {
    return this.#c.modelCall(method, target)
  }
  exchange(api, now, leaseLeftMs, firstByteMs, idleMs) {
    return this.#c.exchange(api, now, leaseLeftMs, firstByteMs, idleMs)
  }
  exchangeTimeouts(firstByteMs, idleMs) {
    return Array.from(this.#c.exchangeTimeouts(firstByteMs, idleMs))
  }
  callerIdentity(headers, base) {
    return this.#c.callerIdentity(headers, base)
  }
  takeWide() {
    return this.#c.takeWide()
  }
  handle(now, input) {
    return this.#c.handle(now, input)
  }
  pollTimeout() {
    return this.#c.pollTimeout()
  }
  pollEvent() {
    return this.#c.pollEvent()
  }
  metrics(now) {
    return this.#c.metrics(now)
  }
  snapshot() {
    return this.#c.snapshot()
  }
  check() {
    return this.#c.check()
  }
}
