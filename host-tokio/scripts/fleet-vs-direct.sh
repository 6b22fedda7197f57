#!/usr/bin/env bash
# The Rust fleet example (8 agents × 5 calls on one key) through tokenwarden and direct, on
# reqwest-middleware and on tower, each against a fresh mock provider on loopback with an
# input-token limit the fleet overruns: through tokenwarden no call meets a 429 (counted by
# the agents, by the core and by the mock itself), direct they do. Prints each run's figures.
#   host-tokio/scripts/fleet-vs-direct.sh [path to the built example]
set -euo pipefail
cd "$(dirname "$0")/../.."
fleet=${1:-target/debug/examples/fleet}
limits=(--itpm 6000)
log=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$log"' EXIT
failed=0
for via in reqwest tower; do
  for mode in governed direct; do
    node testing/mock-cli.mjs "${limits[@]}" --verbose >"$log/url" 2>"$log/mock" &
    mock=$!
    for _ in $(seq 100); do [ -s "$log/url" ] && break; sleep 0.1; done
    url=$(head -1 "$log/url")
    args=(--base-url "$url" "${limits[@]}" --via "$via")
    [ "$mode" = direct ] && args+=(--direct)
    if ! "$fleet" "${args[@]}" >"$log/out"; then
      echo "FAILED: $via $mode: the fleet did not finish"; cat "$log/out"; failed=1
    fi
    kill "$mock"; wait "$mock" 2>/dev/null || true
    json=$(tail -1 "$log/out")
    seen=$(node -e 'const r = JSON.parse(process.argv[1]); console.log(r.provider_429s)' "$json")
    sent=$(grep -c '^429 ' "$log/mock" || true)
    echo "  $(head -1 "$log/out"); the mock sent $sent 429s"
    if [ "$mode" = governed ] && { [ "$seen" != 0 ] || [ "$sent" != 0 ]; }; then
      echo "FAILED: $via through tokenwarden met 429s (agents and core: $seen, mock: $sent)"; failed=1
    fi
    if [ "$mode" = direct ] && [ "$sent" = 0 ]; then
      echo "FAILED: $via direct met no 429: the run does not overrun the limit"; failed=1
    fi
  done
done
exit $failed
