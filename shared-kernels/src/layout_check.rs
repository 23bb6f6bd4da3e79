//! The workspace's layout, checked: no import circle among the files of any of its crates, and
//! every file past 400 lines says why at its top.
//!
//! A module is a file (`folder/mod.rs` is the folder's front door, `lib.rs` the crate's). A
//! module uses another when its code (comments and its `mod tests` left out) names a path into
//! it: `crate::a::b`, `super::b`, `self::b` or a child module by name, in `use` trees or inline.
//! A path through a front door's `pub use` is followed to the module that defines the item, so
//! re-exports are no edges of their own. A file may extend its own front door (`impl Engine` in
//! `engine/graphs.rs` naming `super::Engine`, or a family's shared helper in its `mod.rs`): that
//! is the folder's one concern split over files, not a circle. Every other use points down.
//!
//! Also: the patched cubecl crates under `shared-kernels/patches/` differ from the published
//! ones only in the files their README lists.

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

/// A crate's library modules under `src` (binaries, `main.rs` and `bin/`, are crates of their
/// own): module path (`crate::ops::matmul`) -> its code, without comments and tests.
fn crate_modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (path, text) in rust_sources(src) {
        let rel = path.strip_prefix(src).expect("under src").with_extension("");
        let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        if parts.first().is_some_and(|p| p == "bin") || parts == ["main"] {
            continue;
        }
        if parts.last().is_some_and(|p| p == "mod") || parts == ["lib"] {
            parts.pop();
        }
        out.insert(std::iter::once("crate".to_string()).chain(parts).collect::<Vec<_>>().join("::"), code_of(&text));
    }
    out
}

/// `text` without its `mod tests` and its `//` comments (doc comments included).
fn code_of(text: &str) -> String {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    code.lines().map(|l| l.find("//").map_or(l, |i| &l[..i])).collect::<Vec<_>>().join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The `use` statements of `code` (their trees, up to the `;`), and the code without them.
fn use_statements(code: &str) -> (Vec<(bool, String)>, String) {
    let (mut trees, mut rest, mut at) = (Vec::new(), String::new(), 0);
    while let Some(found) = code[at..].find("use ") {
        let start = at + found;
        let word_start = code[..start].chars().next_back().is_none_or(|c| !is_ident(c));
        let Some(end) = code[start..].find(';').map(|e| start + e).filter(|_| word_start) else {
            rest.push_str(&code[at..start + 4]);
            at = start + 4;
            continue;
        };
        let head = code[..start].rsplit('\n').next().unwrap_or("").trim();
        let public = head == "pub" || (head.starts_with("pub(") && head.ends_with(')'));
        trees.push((public, code[start + 4..end].trim().to_string()));
        rest.push_str(&code[at..start]);
        at = end + 1;
    }
    rest.push_str(&code[at..]);
    (trees, rest)
}

/// A `use` tree's paths: `a::{b, c::{d as e}}` -> (`b`, `a::b`), (`e`, `a::c::d`) as (name, path).
fn expand_use(tree: &str) -> Vec<(String, String)> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let Some(open) = tree.find('{') else {
        let (path, alias) = match tree.split_once(" as ") {
            Some((p, a)) => (p.trim().to_string(), a.trim().to_string()),
            None => (tree.trim().to_string(), tree.trim().rsplit("::").next().unwrap_or("").to_string()),
        };
        return vec![(alias, path)];
    };
    let (prefix, body) = (&tree[..open], &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())]);
    let (mut items, mut depth, mut current) = (Vec::new(), 0, String::new());
    for c in body.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            items.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    items.push(current);
    items
        .iter()
        .map(|i| i.trim())
        .filter(|i| !i.is_empty())
        .flat_map(|i| expand_use(i).into_iter().map(|(alias, path)| (if path == "self" { prefix.trim_end_matches("::").rsplit("::").next().unwrap_or("").to_string() } else { alias }, if path == "self" { prefix.trim_end_matches("::").to_string() } else { format!("{prefix}{path}") })))
        .collect()
}

/// The paths `code` names inline: `a::b::c` not preceded by an identifier or `::`.
fn inline_paths(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < chars.len() {
        let starts = (chars[i].is_ascii_lowercase() || chars[i] == '_') && (i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut path = String::new();
        loop {
            let word_start = j;
            while j < chars.len() && is_ident(chars[j]) {
                j += 1;
            }
            path.extend(&chars[word_start..j]);
            if j + 2 < chars.len() && chars[j] == ':' && chars[j + 1] == ':' && (is_ident(chars[j + 2])) {
                path.push_str("::");
                j += 2;
            } else {
                break;
            }
        }
        if path.contains("::") {
            out.push(path);
        }
        i = j.max(i + 1);
    }
    out
}

/// Whether `code` defines `item` itself (not through a `use`).
fn defines(code: &str, item: &str) -> bool {
    ["struct", "enum", "fn", "trait", "type", "const", "static", "mod", "union", "macro_rules!"].iter().any(|kw| {
        let pattern = format!("{kw} {item}");
        code.match_indices(&pattern).any(|(at, _)| {
            let before = code[..at].chars().next_back().is_none_or(|c| !is_ident(c));
            let after = code[at + pattern.len()..].chars().next().is_none_or(|c| !is_ident(c));
            before && after
        })
    })
}

struct Crate {
    code: BTreeMap<String, String>,
    /// Each module's `pub use` names: (name, path as written).
    exports: BTreeMap<String, Vec<(String, String)>>,
}

impl Crate {
    fn new(code: BTreeMap<String, String>) -> Self {
        let exports = code.iter().map(|(name, text)| (name.clone(), use_statements(text).0.into_iter().filter(|(public, _)| *public).flat_map(|(_, tree)| expand_use(&tree)).collect())).collect();
        Crate { code, exports }
    }

    /// The module `path` (as written in `from`) leads into, and the item it names there.
    fn resolve(&self, from: &str, path: &str) -> Option<(String, Option<String>)> {
        let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
        let here: Vec<&str> = from.split("::").collect();
        let (mut base, mut rest): (Vec<&str>, &[&str]) = match parts.first()? {
            &"crate" => (vec!["crate"], &parts[1..]),
            &"super" | &"self" => (here.clone(), &parts[..]),
            first if self.code.contains_key(&format!("{from}::{first}")) => (here.clone(), &parts[..]),
            _ => return None,
        };
        while let Some(head) = rest.first().filter(|p| **p == "super" || **p == "self") {
            if *head == "super" {
                base.pop();
            }
            rest = &rest[1..];
        }
        let full: Vec<&str> = base.into_iter().chain(rest.iter().copied()).collect();
        (1..=full.len()).rev().find_map(|k| {
            let module = full[..k].join("::");
            self.code.contains_key(&module).then(|| (module, full.get(k).map(|s| s.to_string())))
        })
    }

    /// The module that defines what `path` names, re-exports followed.
    fn follow(&self, from: &str, path: &str, depth: usize) -> Option<String> {
        let (module, item) = self.resolve(from, path)?;
        let Some(item) = item.filter(|_| depth < 8) else { return Some(module) };
        if defines(&self.code[&module], &item) {
            return Some(module);
        }
        for (name, target) in self.exports.get(&module).into_iter().flatten() {
            if name == &item || name == "*" {
                if let Some(found) = self.follow(&module, target, depth + 1).filter(|f| f != &module) {
                    if name == &item || defines(&self.code[&found], &item) {
                        return Some(found);
                    }
                }
            }
        }
        Some(module)
    }

    /// Each module's uses of the others, a file's uses of its own front doors left out.
    fn uses(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph = BTreeMap::new();
        for (name, code) in &self.code {
            let (trees, rest) = use_statements(code);
            let paths = trees.iter().flat_map(|(_, t)| expand_use(t).into_iter().map(|(_, p)| p)).chain(inline_paths(&rest));
            let mut deps = BTreeSet::new();
            for path in paths {
                if let Some(target) = self.follow(name, &path, 0) {
                    if target != "crate" && &target != name && !name.starts_with(&format!("{target}::")) {
                        deps.insert(target);
                    }
                }
            }
            graph.insert(name.clone(), deps);
        }
        graph
    }
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

fn workspace() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

#[test]
fn no_crate_of_the_workspace_has_an_import_circle() {
    for (krate, least_modules, least_edges) in [("shared-kernels", 90, 400), ("sampler", 10, 15), ("trainer", 55, 150)] {
        let modules = crate_modules(&workspace().join(krate).join("src"));
        let graph = Crate::new(modules).uses();
        let edges: usize = graph.values().map(BTreeSet::len).sum();
        assert!(graph.len() >= least_modules && edges >= least_edges, "{krate}: {} modules, {edges} uses: the scan would prove nothing", graph.len());
        assert_eq!(a_circle(&graph), None, "{krate}: an import circle: move what both sides share into a module below them");
    }
}

#[test]
fn the_circle_check_follows_every_kind_of_path_and_finds_a_planted_circle() {
    let crate_of = |files: &[(&str, &str)]| Crate::new(files.iter().map(|(n, t)| (n.to_string(), code_of(t))).collect());
    let files = [
        ("crate", "pub mod a;\npub mod b;\n"),
        // a front door re-exporting its child, and a child extending it
        ("crate::a", "mod inner;\npub use inner::{Thing, other::Other as Renamed};\npub struct Door;\nfn f() { inner::g() }\n"),
        ("crate::a::inner", "pub mod other;\nuse super::Door;\npub struct Thing;\npub fn g() {}\n"),
        ("crate::a::inner::other", "pub struct Other;\n"),
        // a use through the re-export lands on the module that defines the item
        ("crate::b", "// crate::c::x is only a comment\nuse crate::a::{Renamed, Thing};\nfn h() { let _ = crate::c::make(); }\n#[cfg(test)]\nmod tests { use crate::d::Y; }\n"),
        ("crate::c", "pub fn make() {}\n"),
        ("crate::d", "pub struct Y;\n"),
    ];
    let graph = crate_of(&files).uses();
    assert_eq!(graph["crate::b"], BTreeSet::from(["crate::a::inner".to_string(), "crate::a::inner::other".to_string(), "crate::c".to_string()]));
    // (a front door's `pub use` of a grandchild's item is a use of the grandchild)
    assert_eq!(graph["crate::a"], BTreeSet::from(["crate::a::inner".to_string(), "crate::a::inner::other".to_string()]));
    assert!(graph["crate::a::inner"].is_empty(), "extending the front door is no use: {:?}", graph["crate::a::inner"]);
    assert_eq!(a_circle(&graph), None);
    // planted: c uses b through a `super::` path inside a use group
    let mut planted = files.to_vec();
    planted[5] = ("crate::c", "use super::{b::h as k, d};\npub fn make() {}\n");
    let graph = crate_of(&planted).uses();
    assert_eq!(a_circle(&graph).map(|c| c.len()), Some(3), "{graph:?}");
    // and siblings under one front door that use each other are a circle too
    let siblings = [("crate", "mod x;\nmod y;\n"), ("crate::x", "pub fn f() { super::y::g() }\n"), ("crate::y", "use crate::x::f;\npub fn g() {}\n")];
    assert!(a_circle(&crate_of(&siblings).uses()).is_some());
}

/// A file is one concern, readable in one sitting: past 400 lines its header must say why
/// ("One file past 400 lines: ..."). Vendored patches of upstream crates are not lockstep's.
#[test]
fn every_source_file_past_400_lines_says_why_at_its_top() {
    let (mut seen, mut unexplained) = (0, Vec::new());
    for root in ["shared-kernels/src", "shared-kernels/tests", "sampler/src", "sampler/tests", "trainer/src", "trainer/tests"] {
        for (path, text) in rust_sources(&workspace().join(root)) {
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

/// The files `shared-kernels/patches/README.md` lists as changed or new, and the published files
/// it says are left out.
const PATCHED: [&str; 5] = ["cubecl-std/src/fast_math.rs", "cubecl-cuda/Cargo.toml", "cubecl-cuda/src/lib.rs", "cubecl-cuda/src/compute/context.rs", "cubecl-cuda/src/includes_first.rs"];
const LEFT_OUT: [&str; 2] = ["cubecl-cuda/tests/", "cubecl-cuda/cubecl.toml"];

#[test]
fn patched_crates_differ_from_the_published_ones_only_where_this_readme_says() {
    use sha2::Digest;
    let patches = workspace().join("shared-kernels/patches");
    let readme = std::fs::read_to_string(patches.join("README.md")).expect("patches/README.md");
    for path in PATCHED {
        assert!(readme.contains(path.split_once('/').expect("crate/file").1), "patches/README.md does not list {path}");
    }
    let manifest = std::fs::read_to_string(patches.join("published.sha256")).expect("patches/published.sha256");
    let published: BTreeMap<&str, &str> = manifest.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).map(|l| {
        let (hash, path) = l.split_once("  ").expect("hash  path");
        (path, hash)
    }).collect();
    assert!(published.len() > 50, "{} published files: the manifest would prove nothing", published.len());
    let sha = |p: &Path| format!("{:x}", sha2::Sha256::digest(std::fs::read(p).expect("a patched crate's file")));
    for (path, hash) in &published {
        let file = patches.join(path);
        if LEFT_OUT.iter().any(|l| path.starts_with(l)) {
            assert!(!file.exists(), "{path} is listed as left out but is there");
        } else if PATCHED.contains(path) {
            assert_ne!(&sha(&file), hash, "{path} is listed as patched but equals the published file");
        } else {
            assert_eq!(&sha(&file), hash, "{path} differs from the published crate's but patches/README.md does not list it");
        }
    }
    for krate in ["cubecl-cuda", "cubecl-std"] {
        let mut files = Vec::new();
        let mut stack = vec![patches.join(krate)];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("a patched crate's folder") {
                let path = entry.expect("a folder entry").path();
                if path.is_dir() { stack.push(path) } else { files.push(path) }
            }
        }
        for file in files {
            let rel = file.strip_prefix(&patches).expect("under patches").to_string_lossy().into_owned();
            assert!(published.contains_key(rel.as_str()) || PATCHED.contains(&rel.as_str()), "{rel} is neither the published crate's nor listed in patches/README.md");
        }
    }
}
