//! The kernel families' layout, checked: no import circle among the op modules. A module is a
//! file under `ops/` (`folder/mod.rs` is the folder's front door); it uses another when its code
//! (comments and its `mod tests` left out) names a path `crate::ops::...` into it. Front doors
//! use their kernels, kernels use the helpers below them, never the way back. Also: every source
//! file of the workspace past 400 lines says why at its top.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every `.rs` file under `root` (none when `root` does not exist), with its text.
pub(crate) fn rust_sources(root: &Path) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file");
                out.push((path, text));
            }
        }
    }
    out
}

/// Module path (`ops::matmul::tc`) -> its source text.
fn op_modules(ops: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (path, text) in rust_sources(ops) {
        let rel = path.strip_prefix(ops.parent().expect("ops has a parent")).expect("under src").with_extension("");
        let mut name = rel.to_string_lossy().replace('/', "::");
        if let Some(front) = name.strip_suffix("::mod") {
            name = front.to_string();
        }
        out.insert(name, text);
    }
    out
}

/// Each module's uses of the other modules.
fn uses(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph = BTreeMap::new();
    for (name, text) in modules {
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        let mut deps = BTreeSet::new();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::ops::") {
                let path: String = line[i + "crate::".len()..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
                let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
                // the longest prefix that is a module
                if let Some(target) = (1..=parts.len()).rev().map(|k| parts[..k].join("::")).find(|m| modules.contains_key(m)) {
                    if &target != name && target != "ops" {
                        deps.insert(target);
                    }
                }
            }
        }
        graph.insert(name.clone(), deps);
    }
    graph
}

/// One circle, if the graph has any (depth-first search with colours).
fn a_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(v: &str, graph: &BTreeMap<String, BTreeSet<String>>, state: &mut BTreeMap<String, u8>, path: &mut Vec<String>) -> Option<Vec<String>> {
        state.insert(v.to_string(), 1);
        path.push(v.to_string());
        for w in graph.get(v).into_iter().flatten() {
            match state.get(w.as_str()).copied().unwrap_or(0) {
                1 => {
                    let start = path.iter().position(|p| p == w).expect("on the path");
                    let mut circle = path[start..].to_vec();
                    circle.push(w.clone());
                    return Some(circle);
                }
                0 => {
                    if let Some(c) = visit(w, graph, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(v.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for v in graph.keys() {
        if state.get(v.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(v, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn the_op_modules_have_no_import_circle() {
    let ops = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/ops");
    let modules = op_modules(&ops);
    let graph = uses(&modules);
    let edges: usize = graph.values().map(|d| d.len()).sum();
    assert!(modules.len() >= 30 && edges >= 40, "{} modules, {edges} uses: the scan would prove nothing", modules.len());
    assert_eq!(a_circle(&graph), None, "an import circle among the op modules: move what both sides share into a module below them");
}

#[test]
fn the_circle_check_finds_a_circle() {
    let modules: BTreeMap<String, String> = [
        ("ops::a".to_string(), "use crate::ops::b::X;\n".to_string()),
        ("ops::b".to_string(), "// crate::ops::c is only a comment\nfn f() { crate::ops::c::g() }\n".to_string()),
        ("ops::c".to_string(), "use crate::ops::a::{Y, Z};\n#[cfg(test)]\nmod tests { use crate::ops::b::X; }\n".to_string()),
    ]
    .into();
    let graph = uses(&modules);
    assert_eq!(graph["ops::c"], BTreeSet::from(["ops::a".to_string()]));
    assert_eq!(a_circle(&graph).map(|c| c.len()), Some(4));
    let mut broken = modules.clone();
    broken.insert("ops::c".into(), "fn g() {}\n".into());
    assert_eq!(a_circle(&uses(&broken)), None);
}

/// A file is one concern, readable in one sitting: past 400 lines its header must say why
/// ("One file past 400 lines: ..."). Vendored patches of upstream crates are not lockstep's.
#[test]
fn every_source_file_past_400_lines_says_why_at_its_top() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf();
    let (mut seen, mut unexplained) = (0, Vec::new());
    for root in ["shared-kernels/src", "shared-kernels/tests", "sampler/src", "sampler/tests", "trainer/src", "trainer/tests"] {
        for (path, text) in rust_sources(&workspace.join(root)) {
            seen += 1;
            let header: String = text.lines().take_while(|l| l.starts_with("//!") || l.trim().is_empty()).map(|l| l.trim_start_matches("//!").trim()).collect::<Vec<_>>().join(" ");
            if text.lines().count() > 400 && !header.contains("past 400 lines") {
                unexplained.push(format!("{} ({} lines)", path.display(), text.lines().count()));
            }
        }
    }
    assert!(seen >= 100, "only {seen} source files found: the scan would prove nothing");
    assert!(unexplained.is_empty(), "files past 400 lines whose header does not say why (\"One file past 400 lines: ...\"): {unexplained:?}");
}
