//! The conformance replay through a [`PluginCoordinator`]: an [`Engine`] adapter for
//! `tokenwarden_conformance::run_with`, so the component runs the very procedure the native
//! reference runner does and must produce the same records.

#![allow(dead_code, unreachable_pub)]

use std::sync::OnceLock;

use serde_json::{Value, json};
use tokenwarden_conformance::{Engine, lease_error, to_value};
use tokenwarden_core::{Input, Millis};
use tokenwarden_wasmtime::{COMPONENT, Error, Plugin, PluginCoordinator};

/// One compiled plugin per test binary (compiling is the slow part).
pub fn plugin() -> &'static Plugin {
    static PLUGIN: OnceLock<Plugin> = OnceLock::new();
    PLUGIN.get_or_init(|| {
        let engine = Plugin::default_engine().expect("engine");
        Plugin::new(&engine, COMPONENT).expect("the built component loads")
    })
}

/// A second, separately compiled plugin (its own engine) to hot-reload into.
pub fn other_plugin() -> &'static Plugin {
    static OTHER: OnceLock<Plugin> = OnceLock::new();
    OTHER.get_or_init(|| {
        let engine = Plugin::default_engine().expect("engine");
        Plugin::new(&engine, COMPONENT).expect("the built component loads")
    })
}

/// Every trace file, sorted by name.
pub fn traces() -> Vec<(String, Value)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/traces");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .expect("tests/traces exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("readable trace");
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, serde_json::from_str(&text).expect("trace is JSON"))
        })
        .collect()
}

fn plugin_err(e: Error) -> String {
    format!("plugin failure: {e}")
}

/// A core error as a record; a plugin failure fails the replay.
fn result<T: serde::Serialize>(r: Result<T, Error>) -> Result<Value, String> {
    match r {
        Ok(v) => Ok(to_value(&v)),
        Err(Error::Lease(l)) => Ok(lease_error(l)),
        Err(other) => Err(plugin_err(other)),
    }
}

/// The plugin as a replay engine; with `RELOAD`, it hot-reloads into [`other_plugin`]
/// before every input.
pub struct PluginEngine<const RELOAD: bool>(PluginCoordinator);

impl<const RELOAD: bool> Engine for PluginEngine<RELOAD> {
    fn create(config_json: &str, seed: u64, start: u64) -> Result<Result<Self, Value>, String> {
        match plugin().coordinator(config_json, seed, Millis(start)) {
            Ok(c) => Ok(Ok(PluginEngine(c))),
            Err(Error::Config { code, field, .. }) => {
                let mut result = json!({ "error": code });
                if let Some(field) = field {
                    result["field"] = json!(field);
                }
                Ok(Err(result))
            }
            Err(e) => Err(plugin_err(e)),
        }
    }
    fn handle(&mut self, now: u64, input: &Value) -> Result<Value, String> {
        let input: Input =
            serde_json::from_value(input.clone()).map_err(|e| format!("bad input {input}: {e}"))?;
        result(self.0.handle(Millis(now), &input))
    }
    fn poll_timeout(&mut self) -> Result<Option<u64>, String> {
        Ok(self.0.poll_timeout().map_err(plugin_err)?.map(|t| t.0))
    }
    fn poll_event(&mut self) -> Result<Option<Value>, String> {
        Ok(self
            .0
            .poll_event()
            .map_err(plugin_err)?
            .map(|e| to_value(&e)))
    }
    fn metrics(&mut self, now: u64) -> Result<Value, String> {
        result(self.0.metrics(Millis(now)))
    }
    fn snapshot_restore(&mut self) -> Result<(), String> {
        let json = self.0.snapshot_json().map_err(plugin_err)?;
        self.0 = plugin().restore_json(&json).map_err(plugin_err)?;
        Ok(())
    }
    fn check(&mut self) -> Result<(), String> {
        self.0.check().map_err(plugin_err)
    }
    fn before_input(&mut self) -> Result<(), String> {
        if RELOAD {
            self.0.reload(other_plugin()).map_err(plugin_err)?;
        }
        Ok(())
    }
}

/// Compares records with the trace's `expected`, naming the first difference.
pub fn compare(expected: &[Value], got: &[Value]) -> Result<(), String> {
    for (i, (e, g)) in expected.iter().zip(got).enumerate() {
        if e != g {
            return Err(format!(
                "record {i} differs:\n  expected {e}\n  got      {g}"
            ));
        }
    }
    if expected.len() != got.len() {
        return Err(format!(
            "expected {} records, got {}",
            expected.len(),
            got.len()
        ));
    }
    Ok(())
}
