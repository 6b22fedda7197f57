//! `tokenwarden-conformance [--bless] [DIR]`: replay every trace in DIR (default
//! `tests/traces`) through the native core and compare with the expected records.
//! `--bless` rewrites the expected records after the hand-written checks pass.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut bless = false;
    let mut dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../traces"));
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--bless" => bless = true,
            "-h" | "--help" => {
                println!("usage: tokenwarden-conformance [--bless] [DIR]");
                return ExitCode::SUCCESS;
            }
            other => dir = PathBuf::from(other),
        }
    }
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect(),
        Err(e) => {
            eprintln!("cannot read {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    };
    paths.sort();
    let (mut passed, mut failed) = (0, 0);
    for path in &paths {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let result = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                serde_json::from_str::<serde_json::Value>(&text).map_err(|e| e.to_string())
            })
            .and_then(|mut trace| {
                if bless {
                    tokenwarden_conformance::bless(&mut trace)?;
                    let text = serde_json::to_string_pretty(&trace).map_err(|e| e.to_string())?;
                    std::fs::write(path, text + "\n").map_err(|e| e.to_string())
                } else {
                    tokenwarden_conformance::verify(&trace)
                }
            });
        match result {
            Ok(()) => {
                passed += 1;
                println!("ok   {name}");
            }
            Err(e) => {
                failed += 1;
                println!("FAIL {name}: {e}");
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed == 0 && passed > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
