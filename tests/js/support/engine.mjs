// The engine the shared driver suites run on: the native addon by default, or the wasm
// build with TOKENWARDEN_ENGINE=wasm (the test script runs both).
import { createTokenwarden as createNative, nativeEngines } from 'tokenwarden'

const which = process.env.TOKENWARDEN_ENGINE ?? 'native'
let engines = nativeEngines
let create = createNative
if (which === 'wasm') {
  const wasm = await import('tokenwarden-wasm')
  engines = wasm.wasmEngines
  create = wasm.createTokenwarden
} else if (which !== 'native') {
  throw new Error(`TOKENWARDEN_ENGINE must be native or wasm, got ${which}`)
}

/** The engine factory under test. */
export { engines }
/** `createTokenwarden` on the engine under test. */
export const createTokenwarden = (options) => create({ ...options, engine: options.engine ?? engines })
/** Which engine this is. */
export const engineName = which
