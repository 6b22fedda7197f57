//! Build script: napi-rs link arguments for a Node.js addon.
fn main() {
    napi_build::setup();
}
