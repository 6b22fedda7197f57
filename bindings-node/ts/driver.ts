/**
 * `tokenwarden/driver`: the engine-agnostic layer (`tokenwarden-driver`) on its own, for
 * code that brings its own engine. The same names are exported from `tokenwarden`.
 */
export * from 'tokenwarden-driver'
