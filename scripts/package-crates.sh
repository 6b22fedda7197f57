#!/usr/bin/env bash
# Packages the crates meant for crates.io exactly as `cargo publish` would upload them, and
# builds each packaged crate on its own (cargo's verification), with the unpublished
# workspace dependencies (tokenwarden-core for tokenwarden-wasmtime) served from the
# packages made in the same run:
#
#   ./scripts/package-crates.sh            # -> target/package-verify/package/*.crate
#
# tokenwarden-wasmtime embeds the plugin component; its guest's sources need the
# workspace, so the component is built here first and packed in `component/`.
set -euo pipefail
cd "$(dirname "$0")/.."
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
# The component is what host-wasmtime's build script wrote after the guest's last build.
# Rebuild the guest (a no-op when it is current); only if that changed its module, rebuild
# the crate whose build script wraps it (`cargo test --workspace`, run before this in the
# test command, already did, with the features the verification below cannot share).
guest="$target/tokenwarden-guest"
(unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS CARGO_TARGET_DIR
 cargo build --quiet --release --target wasm32-unknown-unknown \
   --manifest-path host-wasmtime/guest/Cargo.toml --target-dir "$guest")
if [ ! "$guest/tokenwarden-quota-v4.wasm" -nt "$guest/wasm32-unknown-unknown/release/tokenwarden_guest.wasm" ]; then
  cargo build --quiet -p tokenwarden-wasmtime
fi
mkdir -p host-wasmtime/component
cp "$guest/tokenwarden-quota-v4.wasm" host-wasmtime/component/
# Verification resolves each workspace dependency from a temporary local registry. Cargo
# takes registry crates as immutable: it extracts one under CARGO_HOME (keyed by the
# registry's path) only if it is not there yet, and reuses a build of it by name and
# version. So a second run from the same checkout would build against the first run's
# sources, or its compiled core. Our crates are on no other registry: their extracted
# copies go, and the verification builds in a target directory of its own whose
# tokenwarden artifacts go too (the dependencies stay built).
cargo_home=${CARGO_HOME:-$HOME/.cargo}
rm -rf "$cargo_home"/registry/src/*/tokenwarden-* "$cargo_home"/registry/cache/*/tokenwarden-*
verify="$target/package-verify"
rm -rf "$verify"/debug/.fingerprint/tokenwarden-* "$verify"/debug/build/tokenwarden-* "$verify"/debug/deps/*tokenwarden*
# --allow-dirty: the component just built is not tracked by git (it is generated).
cargo package --quiet --allow-dirty --target-dir "$verify" -p tokenwarden-core -p tokenwarden-wasmtime
ls -l "$verify"/package/*.crate | awk '{ print $NF ": " $5 " bytes" }'
