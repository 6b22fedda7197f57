#!/usr/bin/env bash
# Packages the crates meant for crates.io exactly as `cargo publish` would upload them, and
# builds each packaged crate on its own (cargo's verification), with the unpublished
# workspace dependencies (tokenwarden-core for tokenwarden-wasmtime) served from the
# packages made in the same run:
#
#   ./scripts/package-crates.sh            # -> target/package/*.crate
#
# tokenwarden-wasmtime embeds the plugin component; its guest's sources need the
# workspace, so the component is built here first and packed in `component/`.
set -euo pipefail
cd "$(dirname "$0")/.."
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
cargo build --quiet -p tokenwarden-wasmtime
mkdir -p host-wasmtime/component
cp "$target/tokenwarden-guest/tokenwarden-quota-v1.wasm" host-wasmtime/component/
# --allow-dirty: the component just built is not tracked by git (it is generated).
cargo package --quiet --allow-dirty -p tokenwarden-core -p tokenwarden-wasmtime
ls -l "$target"/package/*.crate | awk '{ print $NF ": " $5 " bytes" }'
