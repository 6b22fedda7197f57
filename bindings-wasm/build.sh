#!/usr/bin/env bash
# Builds the wasm package: the crate for wasm32-unknown-unknown (profile wasm-release), then
# wasm-bindgen for the web, nodejs and bundler targets into pkg/. Needs wasm-bindgen-cli at
# exactly the wasm-bindgen version in Cargo.lock (scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")"
root=..
want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3; exit }' "$root/Cargo.lock")
have=$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }' || true)
if [ "$have" != "$want" ]; then
  echo "wasm-bindgen-cli $want is needed (found '${have:-none}'): cargo install wasm-bindgen-cli --version $want" >&2
  exit 1
fi
cargo build --quiet -p tokenwarden-wasm --target wasm32-unknown-unknown --profile wasm-release
wasm="$root/target/wasm32-unknown-unknown/wasm-release/tokenwarden_wasm.wasm"
rm -rf pkg
for target in web nodejs bundler; do
  wasm-bindgen "$wasm" --out-dir "pkg/$target" --target "$target" --weak-refs --remove-name-section --remove-producers-section
done
# The tokenizer's ranks, loaded by the host when first needed (not in the .wasm).
rm -rf data && mkdir data && cp "$root"/provider/data/*.bpe data/
# The nodejs build is CommonJS inside this ESM package.
printf '{ "type": "commonjs" }\n' > pkg/nodejs/package.json
size=$(wc -c < pkg/web/tokenwarden_wasm_bg.wasm)
gz=$(gzip -9c pkg/web/tokenwarden_wasm_bg.wasm | wc -c)
echo "tokenwarden_wasm_bg.wasm: $size bytes, $gz gzipped"
