//! The code's shape, checked: no module folder of a crate has an import circle among its files
//! (a file that imports a sibling which imports it back, directly or around a longer loop, or
//! the folder's `mod.rs` and a child each using the other).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The source folders of the workspace's crates.
const ROOTS: [&str; 5] = [
    "compiler/src",
    "dialect/src",
    "runtime/src",
    "runtime/tensor/src",
    "runtime/exe/src",
];

/// The files of one module folder by module name (`mod.rs`/`lib.rs` as `self`), and the
/// modules each uses.
fn graph(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("source folder") {
        let path = entry.expect("entry").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let text = if path.is_dir() {
            std::fs::read_to_string(path.join("mod.rs")).unwrap_or_default()
        } else if path.extension().is_some_and(|e| e == "rs") {
            std::fs::read_to_string(&path).expect("source")
        } else {
            continue;
        };
        let name = match stem {
            "mod" | "lib" | "main" => "self",
            s => s,
        };
        files.insert(name.to_string(), text);
    }
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    let mut edges = BTreeMap::new();
    for (name, text) in &files {
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut uses = BTreeSet::new();
        if name == "self" {
            // The folder's root using a child's items: `child::Item`.
            for m in modules.iter().filter(|m| *m != "self") {
                let mentioned = code.match_indices(&format!("{m}::")).any(|(i, _)| {
                    !code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':')
                });
                if mentioned {
                    uses.insert(m.clone());
                }
            }
        } else {
            // A child using a sibling (`super::sibling`) or the root's items (`super::Item`).
            for (i, _) in code.match_indices("super::") {
                let rest = &code[i + "super::".len()..];
                let names: Vec<&str> = match rest.strip_prefix('{') {
                    Some(list) => list.split('}').next().unwrap_or("").split(',').collect(),
                    None => vec![rest],
                };
                for n in names {
                    let n: String = n
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if n.is_empty() || n == "self" {
                        continue;
                    }
                    uses.insert(if modules.contains(&n) {
                        n
                    } else {
                        "self".into()
                    });
                }
            }
        }
        uses.remove(name);
        edges.insert(name.clone(), uses);
    }
    edges
}

/// A cycle of `edges`, if there is one.
fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == n) {
            let mut c = path[at..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

fn folders() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    let mut todo: Vec<PathBuf> = ROOTS.iter().map(|r| root.join(r)).collect();
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).expect("source folder") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                todo.push(path);
            }
        }
        out.push(dir);
    }
    out
}

#[test]
fn no_module_folder_has_an_import_circle() {
    let mut found = Vec::new();
    for dir in folders() {
        if let Some(c) = cycle(&graph(&dir)) {
            found.push(format!("{}: {}", dir.display(), c.join(" → ")));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn the_circle_finder_finds_circles() {
    let edges = |pairs: &[(&str, &str)]| {
        let mut e: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            e.entry(a.to_string()).or_default().insert(b.to_string());
            e.entry(b.to_string()).or_default();
        }
        e
    };
    assert!(cycle(&edges(&[("a", "b"), ("b", "c")])).is_none());
    let c = cycle(&edges(&[("a", "b"), ("b", "c"), ("c", "a")])).expect("a circle");
    assert_eq!(c.first(), c.last());
}
