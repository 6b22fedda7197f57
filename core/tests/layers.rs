//! The crate's modules import in one direction (see the doc of `coordinator.rs`): no
//! module reaches, through `crate::…` paths, one that reaches back to it. A circle makes
//! every module in it depend on every other; this test names the first one found.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module → the crate modules its code (not comments, not tests) names by `crate::…`.
fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            for inner in std::fs::read_dir(&path).unwrap() {
                files.push(inner.unwrap().path());
            }
        } else {
            files.push(path);
        }
    }
    let module_of = |path: &Path| -> String {
        let rel = path.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        first.trim_end_matches(".rs").to_string()
    };
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
    {
        let m = module_of(file);
        if m == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let deps = out.entry(m.clone()).or_default();
        for line in code.lines() {
            let line = line.split("//").next().unwrap_or("");
            for (i, _) in line.match_indices("crate::") {
                let name: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if name != m && modules.contains(&name) {
                    deps.insert(name);
                }
            }
        }
    }
    out
}

/// A path from `to` back to `from`, if there is one.
fn path_back(
    g: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    to: &str,
    seen: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if to == from {
        return Some(vec![to.to_string()]);
    }
    if !seen.insert(to.to_string()) {
        return None;
    }
    for next in g.get(to).into_iter().flatten() {
        if let Some(mut rest) = path_back(g, from, next, seen) {
            rest.insert(0, to.to_string());
            return Some(rest);
        }
    }
    None
}

#[test]
fn the_modules_import_without_a_circle() {
    let g = edges();
    assert!(g.len() > 15, "the modules were not found: {g:?}");
    assert!(g["coordinator"].contains("pool"), "edges are read: {g:?}");
    for (m, deps) in &g {
        for d in deps {
            if let Some(path) = path_back(&g, m, d, &mut BTreeSet::new()) {
                panic!("an import circle: {m} -> {}", path.join(" -> "));
            }
        }
    }
}
