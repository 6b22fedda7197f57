//! Builds the plugin component that `src/lib.rs` embeds as `COMPONENT`.
//!
//! 1. `cargo build --release --target wasm32-unknown-unknown` on `guest/` (its own
//!    workspace), into `<target dir>/tokenwarden-guest` so every profile shares one build;
//! 2. `wit-component` wraps the core module into a component of the `plugin` world
//!    (`wit/v4`), written to `$OUT_DIR/tokenwarden-quota-v4.wasm` and copied next to the
//!    guest build as the distributable artifact.
//!
//! `TOKENWARDEN_GUEST_WASM=/path/to/file.wasm` skips step 1 and uses that core module (or
//! ready-made component) instead, e.g. offline or with a prebuilt artifact.
//!
//! Outside this repository (the crate as published: `guest/` needs the core's sources next
//! to it, which a packaged crate does not have) the component the release packed into
//! `component/tokenwarden-quota-v4.wasm` is used as it is; see RELEASING.md.

use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-unknown-unknown";

fn main() {
    for path in [
        "guest/src",
        "guest/Cargo.toml",
        "guest/Cargo.lock",
        "wit",
        "../core/src",
        "../core/Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-env-changed=TOKENWARDEN_GUEST_WASM");

    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env("OUT_DIR"));
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out: share one guest build per
    // target directory instead of one per profile and hash.
    let guest_target = out_dir
        .ancestors()
        .nth(4)
        .map_or_else(|| out_dir.join("guest"), |t| t.join("tokenwarden-guest"));

    let bundled = manifest_dir.join("component/tokenwarden-quota-v4.wasm");
    let in_workspace = manifest_dir.join("../core/Cargo.toml").exists();
    let module = match std::env::var_os("TOKENWARDEN_GUEST_WASM") {
        Some(path) => read(Path::new(&path)),
        None if !in_workspace => {
            if !bundled.exists() {
                panic!(
                    "no component to embed: {} is missing and the guest's sources (../core) are not here; \
                     set TOKENWARDEN_GUEST_WASM to a built component",
                    bundled.display()
                );
            }
            // Named only here: a path that does not exist would rerun this script on every
            // build.
            println!("cargo:rerun-if-changed={}", bundled.display());
            read(&bundled)
        }
        None => {
            build_guest(&manifest_dir.join("guest/Cargo.toml"), &guest_target);
            read(
                &guest_target
                    .join(TARGET)
                    .join("release")
                    .join("tokenwarden_guest.wasm"),
            )
        }
    };
    let component = if wasmparser_is_component(&module) {
        module
    } else {
        wit_component::ComponentEncoder::default()
            .validate(true)
            .module(&module)
            .and_then(|mut e| e.encode())
            .unwrap_or_else(|e| panic!("wrapping the guest module into a component: {e:#}"))
    };
    let out = out_dir.join("tokenwarden-quota-v4.wasm");
    write(&out, &component);
    if std::fs::create_dir_all(&guest_target).is_ok() {
        // Best effort: the artifact a non-Rust wasmtime host would load.
        let _ = std::fs::write(guest_target.join("tokenwarden-quota-v4.wasm"), &component);
    }
    println!("cargo:rustc-env=TOKENWARDEN_COMPONENT={}", out.display());
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("cargo sets {name} for build scripts"))
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// A component's preamble: `\0asm`, version 0x0d, layer 1.
fn wasmparser_is_component(bytes: &[u8]) -> bool {
    bytes.get(..8) == Some(b"\0asm\x0d\x00\x01\x00")
}

fn build_guest(manifest: &Path, target_dir: &Path) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--target", TARGET, "--manifest-path"])
        .arg(manifest)
        .arg("--target-dir")
        .arg(target_dir);
    // The outer build's settings are for the host target (and clippy's wrapper is for the
    // outer workspace): none of them may leak into the wasm build.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PROFILE_RELEASE_LTO",
        "CARGO_PROFILE_RELEASE_OPT_LEVEL",
        "CARGO_PROFILE_RELEASE_DEBUG",
    ] {
        cmd.env_remove(var);
    }
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("running cargo for the guest: {e}"));
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let hint = if stderr.contains("may not be installed") || stderr.contains("can't find crate")
        {
            "\nhint: rustup target add wasm32-unknown-unknown"
        } else {
            ""
        };
        panic!(
            "building the guest ({}) failed:\n{stderr}{hint}",
            manifest.display()
        );
    }
}
