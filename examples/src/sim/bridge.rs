//! The product's estimator, called from the simulator: `examples/estimator-bridge.mjs`
//! runs the built npm package's `DefaultEstimator` (`tokenwarden`: the driver with the
//! native addon's tokenizer, as it ships) under Node, with its clock on the simulator's
//! virtual time, and answers one JSON line for each one sent (see the script for the
//! protocol). One process per run, spoken to synchronously.
//!
//! Node is `$TOKENWARDEN_NODE`, else `node` on `PATH`; the package is `bindings-node/dist/`
//! of this repository (see [`BUILD_HINT`]).

use std::ffi::OsString;
use std::fmt;
use std::io::{BufRead as _, BufReader, BufWriter, Read as _, Write as _};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use tokenwarden_core::Usage;

/// What to run to get the estimator: printed with every failure to start it.
pub const BUILD_HINT: &str = "build the npm package: npm ci at the repository root, then cd driver && npm run build, then cd bindings-node && npm run build (Node >= 20.19 on PATH, or set TOKENWARDEN_NODE)";

/// Why the estimator could not be run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BridgeError(pub String);

impl fmt::Display for BridgeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BridgeError {}

/// The bridge script.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("estimator-bridge.mjs")
}

/// The built npm package the script imports.
pub fn package_entry() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bindings-node/dist/index.js")
}

/// The Node binary: `$TOKENWARDEN_NODE`, else `node`.
pub fn node() -> OsString {
    std::env::var_os("TOKENWARDEN_NODE").unwrap_or_else(|| "node".into())
}

/// Why the estimator cannot run here (no Node, or the package not built), or `None` when
/// both are present. (Whether it then runs is for [`EstimatorBridge::spawn`] to say.)
pub fn unavailable() -> Option<String> {
    let node = node();
    let runs = Command::new(&node)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !runs {
        return Some(format!(
            "Node ({}) cannot be run; {BUILD_HINT}",
            node.to_string_lossy()
        ));
    }
    let entry = package_entry();
    if !entry.is_file() {
        return Some(format!(
            "the built npm package ({}) is missing; {BUILD_HINT}",
            entry.display()
        ));
    }
    None
}

/// The estimator's figures for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BridgeEstimate {
    /// `inputTokens`.
    pub input_tokens: u64,
    /// `cachedPrefixTokens`.
    pub cached_prefix_tokens: u64,
    /// `cachedPrefixConfirmed`: the estimator saw the provider cache that prefix.
    pub cached_prefix_confirmed: bool,
    /// `max_tokens` as the driver's `callShape` reads it from the body.
    pub max_tokens: u64,
}

/// A running estimator.
pub struct EstimatorBridge {
    child: Child,
    stdin: Option<BufWriter<ChildStdin>>,
    stdout: BufReader<ChildStdout>,
    line: String,
    /// Which estimator answers (the driver's class name).
    pub describe: String,
    /// The Node version running it.
    pub node_version: String,
}

/// The unsigned integer after `"name":` in a flat JSON object.
fn field(line: &str, name: &str) -> Option<u64> {
    let key = format!("\"{name}\":");
    let at = line.find(&key)? + key.len();
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The string after `"name":"` (escapes left as they are).
fn string_field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("\"{name}\":\"");
    let at = line.find(&key)? + key.len();
    let rest = &line[at..];
    let mut end = 0;
    let bytes = rest.as_bytes();
    while end < bytes.len() && bytes[end] != b'"' {
        end += if bytes[end] == b'\\' { 2 } else { 1 };
    }
    Some(&rest[..end.min(rest.len())])
}

impl EstimatorBridge {
    /// Starts Node on the bridge script and checks that it answers.
    pub fn spawn() -> Result<EstimatorBridge, BridgeError> {
        if let Some(why) = unavailable() {
            return Err(BridgeError(format!(
                "the estimator scenario runs the product's estimator under Node: {why}"
            )));
        }
        let mut child = Command::new(node())
            .arg(script())
            .arg(package_entry())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                BridgeError(format!(
                    "cannot start {} {}: {e}; {BUILD_HINT}",
                    node().to_string_lossy(),
                    script().display()
                ))
            })?;
        let stdin = child.stdin.take().map(BufWriter::new);
        let Some(stdout) = child.stdout.take().map(BufReader::new) else {
            return Err(BridgeError("no stdout from the estimator bridge".into()));
        };
        let mut b = EstimatorBridge {
            child,
            stdin,
            stdout,
            line: String::new(),
            describe: String::new(),
            node_version: String::new(),
        };
        let answer = b.ask(r#"{"op":"hello"}"#)?;
        b.describe = string_field(&answer, "estimator")
            .unwrap_or("?")
            .to_string();
        b.node_version = string_field(&answer, "node").unwrap_or("?").to_string();
        Ok(b)
    }

    /// Sends one line and reads the answer.
    fn ask(&mut self, msg: &str) -> Result<String, BridgeError> {
        let sent = match self.stdin.as_mut() {
            Some(w) => w
                .write_all(msg.as_bytes())
                .and_then(|()| w.write_all(b"\n"))
                .and_then(|()| w.flush()),
            None => Err(std::io::ErrorKind::BrokenPipe.into()),
        };
        self.line.clear();
        let read = sent.and_then(|()| self.stdout.read_line(&mut self.line));
        match read {
            Ok(n) if n > 0 => {}
            _ => return Err(self.died()),
        }
        if self.line.contains("\"error\":") {
            return Err(BridgeError(format!(
                "the product's estimator failed: {}",
                self.line.trim_end()
            )));
        }
        Ok(std::mem::take(&mut self.line))
    }

    /// The process ended or stopped answering: what it said on stderr.
    fn died(&mut self) -> BridgeError {
        self.stdin = None;
        let _ = self.child.kill();
        let status = self.child.wait().ok();
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        BridgeError(format!(
            "the estimator bridge ({} {}) stopped ({}): {}; {BUILD_HINT}",
            node().to_string_lossy(),
            script().display(),
            status.map_or("unknown status".into(), |s| s.to_string()),
            stderr.trim()
        ))
    }

    /// Estimates call `call` at virtual time `now`: the first time with its body (Anthropic
    /// Messages JSON), later attempts of the same call without (the same body again, as the
    /// `fetch` wrapper estimates it on each ask).
    pub fn estimate(
        &mut self,
        call: u64,
        now: u64,
        body: Option<&str>,
    ) -> Result<BridgeEstimate, BridgeError> {
        let mut msg =
            format!(r#"{{"op":"estimate","call":{call},"now":{now},"provider":"anthropic""#);
        if let Some(body) = body {
            msg.reserve(body.len() + 16);
            msg.push_str(r#","body":"#);
            msg.push_str(body);
        }
        msg.push('}');
        let a = self.ask(&msg)?;
        match (
            field(&a, "input_tokens"),
            field(&a, "cached_prefix_tokens"),
            field(&a, "max_tokens"),
            field(&a, "cached_prefix_confirmed"),
        ) {
            (
                Some(input_tokens),
                Some(cached_prefix_tokens),
                Some(max_tokens),
                Some(confirmed @ (0 | 1)),
            ) => Ok(BridgeEstimate {
                input_tokens,
                cached_prefix_tokens,
                cached_prefix_confirmed: confirmed == 1,
                max_tokens,
            }),
            _ => Err(BridgeError(format!(
                "the estimator bridge answered {}",
                a.trim_end()
            ))),
        }
    }

    /// The provider's usage for call `call` arrived at `now`: the estimator observes it (and
    /// forgets the call).
    pub fn observe(&mut self, call: u64, now: u64, u: &Usage) -> Result<(), BridgeError> {
        let msg = format!(
            r#"{{"op":"observe","call":{call},"now":{now},"usage":{{"input_tokens":{},"cache_creation_input_tokens":{},"cache_read_input_tokens":{},"output_tokens":{}}}}}"#,
            u.input_tokens,
            u.cache_creation_input_tokens,
            u.cache_read_input_tokens,
            u.output_tokens
        );
        self.ask(&msg).map(drop)
    }

    /// Call `call` ended without usage (the turn was given up): the estimator never hears of it.
    pub fn forget(&mut self, call: u64) -> Result<(), BridgeError> {
        self.ask(&format!(r#"{{"op":"forget","call":{call}}}"#))
            .map(drop)
    }
}

impl Drop for EstimatorBridge {
    fn drop(&mut self) {
        // Closing stdin ends the script.
        self.stdin = None;
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_flat_answers() {
        let a = r#"{"input_tokens":120,"cached_prefix_tokens":0,"cached_prefix_confirmed":1,"max_tokens":128000}"#;
        assert_eq!(field(a, "cached_prefix_confirmed"), Some(1));
        assert_eq!(field(a, "input_tokens"), Some(120));
        assert_eq!(field(a, "cached_prefix_tokens"), Some(0));
        assert_eq!(field(a, "max_tokens"), Some(128_000));
        assert_eq!(field(a, "output"), None);
        let h = r#"{"ok":true,"node":"v24.1.0","estimator":"DefaultEstimator"}"#;
        assert_eq!(string_field(h, "node"), Some("v24.1.0"));
    }
}
