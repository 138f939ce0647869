//! The KV's modules are layers: a folder of `src/` imports only from the folders below it, and no
//! module imports, directly or through others, one that imports it. Read from the source's
//! `crate::`, `super::` and child-module paths (comments and string literals left out).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The folders of `src/`, lowest first.
const LAYERS: &[&str] = &[
    "base", "tls", "disk", "peer", "raft", "state", "node", "http", "etcd", "cli", "bench",
    "nemesis",
];

type Module = Vec<String>;

/// Every `.rs` file under `dir`, by its module path (`a/b.rs` and `a/b/mod.rs` are `a::b`).
fn modules(root: &Path, dir: &Path, out: &mut BTreeMap<Module, PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            modules(root, &path, out);
            continue;
        }
        let rel = path.strip_prefix(root).unwrap().with_extension("");
        let mut m: Module = rel.iter().map(|s| s.to_string_lossy().into()).collect();
        if matches!(m.last().map(String::as_str), Some("mod" | "main")) {
            m.pop();
        }
        out.insert(m, path);
    }
}

/// The source with comments and string and char literals blanked out.
fn code_only(src: &str) -> String {
    let (b, mut out, mut i) = (src.as_bytes(), String::new(), 0);
    while i < b.len() {
        if src[i..].starts_with("//") {
            i += src[i..].find('\n').unwrap_or(src.len() - i);
        } else if src[i..].starts_with("/*") {
            i += src[i..].find("*/").map_or(src.len() - i, |e| e + 2);
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if let Some(n) = char_literal(&src[i..]) {
            i += n;
        } else {
            let c = src[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The length of the char literal `s` starts with (`None` for anything else, a lifetime say).
fn char_literal(s: &str) -> Option<usize> {
    let rest = s.strip_prefix('\'')?;
    let len = match rest.strip_prefix('\\') {
        Some(escaped) => escaped.find('\'')? + 1,
        None => rest.chars().next()?.len_utf8(),
    };
    rest[len..].starts_with('\'').then_some(len + 2)
}

/// The paths a `use` tree names: `a::{b, c::{d, e}}` is `a::b`, `a::c::d` and `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.to_string()];
    };
    let (prefix, inner) = (&tree[..open], &tree[open + 1..tree.rfind('}').unwrap()]);
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    let items = items.into_iter().filter(|i| !i.trim().is_empty());
    items
        .flat_map(|i| expand(i).into_iter().map(|p| format!("{prefix}{p}")))
        .collect()
}

/// Every path in `code`: each `use` tree expanded, and the paths written inline.
fn paths(code: &str) -> Vec<String> {
    let (mut out, mut rest) = (Vec::new(), String::new());
    for (n, piece) in code.split("use ").enumerate() {
        let word_before = rest.ends_with(|c: char| c.is_alphanumeric() || c == '_');
        match piece.split_once(';') {
            Some((tree, after)) if n > 0 && !word_before => {
                let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
                out.extend(expand(&tree));
                rest.push_str(after);
            }
            _ if n > 0 => {
                rest.push_str("use ");
                rest.push_str(piece);
            }
            _ => rest.push_str(piece),
        }
    }
    let inline = rest.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'));
    out.extend(inline.filter(|w| w.contains("::")).map(str::to_string));
    out
}

/// The modules `m`'s code names: the longest known module each path starts with.
fn imports(m: &Module, code: &str, known: &BTreeMap<Module, PathBuf>) -> BTreeSet<Module> {
    let mut out = BTreeSet::new();
    for w in paths(code) {
        let w = w.split(" as ").next().unwrap_or_default().replace(' ', "");
        let segs: Vec<&str> = w.split("::").filter(|s| !s.is_empty()).collect();
        let (mut base, mut rest) = match segs.first() {
            Some(&"crate") => (Vec::new(), &segs[1..]),
            Some(&"super") | Some(&"self") => (m.clone(), &segs[..]),
            Some(s) if known.contains_key(&[&m[..], &[s.to_string()]].concat()) => {
                (m.clone(), &segs[..])
            }
            _ => continue,
        };
        while let Some(&s @ ("super" | "self")) = rest.first() {
            if s == "super" {
                base.pop();
            }
            rest = &rest[1..];
        }
        if rest.first() == Some(&"*") {
            continue; // `use super::*` in a test module: this file
        }
        let target = (0..=rest.len())
            .rev()
            .map(|n| {
                [
                    &base[..],
                    &rest[..n].iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                ]
                .concat()
            })
            .find(|t| known.contains_key(t));
        if let Some(t) = target.filter(|t| t != m) {
            out.insert(t);
        }
    }
    out
}

fn graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut known = BTreeMap::new();
    modules(&root, &root, &mut known);
    known
        .iter()
        .map(|(m, path)| {
            let code = code_only(&std::fs::read_to_string(path).unwrap());
            (m.clone(), imports(m, &code, &known))
        })
        .collect()
}

#[test]
fn each_folder_imports_only_from_the_folders_below_it() {
    let g = graph();
    let rank = |m: &Module| m.first().and_then(|f| LAYERS.iter().position(|l| l == f));
    let mut upward = Vec::new();
    for (from, tos) in &g {
        let Some(r) = rank(from).filter(|_| from.len() > 1) else {
            continue; // main.rs and the folders' mod.rs sit above them
        };
        for to in tos {
            let up = rank(to).is_none_or(|t| t > r);
            if up {
                upward.push(format!("{} -> {}", from.join("::"), to.join("::")));
            }
        }
    }
    let folders: BTreeSet<&String> = g.keys().filter(|m| m.len() > 1).map(|m| &m[0]).collect();
    let unlisted: Vec<_> = folders
        .iter()
        .filter(|f| !LAYERS.contains(&f.as_str()))
        .collect();
    assert!(unlisted.is_empty(), "folders not in LAYERS: {unlisted:?}");
    assert!(
        upward.is_empty(),
        "imports from a higher layer:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_module_imports_one_that_imports_it() {
    let g = graph();
    // Depth-first search; a module met again while still on the path closes a cycle.
    fn visit<'a>(
        m: &'a Module,
        g: &'a BTreeMap<Module, BTreeSet<Module>>,
        path: &mut Vec<&'a Module>,
        done: &mut BTreeSet<&'a Module>,
    ) -> Option<String> {
        if let Some(i) = path.iter().position(|p| *p == m) {
            let cycle: Vec<String> = path[i..].iter().chain([&m]).map(|p| p.join("::")).collect();
            return Some(cycle.join(" -> "));
        }
        if !done.insert(m) {
            return None;
        }
        path.push(m);
        let found = g[m].iter().find_map(|t| visit(t, g, path, done));
        path.pop();
        found
    }
    let mut done = BTreeSet::new();
    for m in g.keys() {
        if let Some(cycle) = visit(m, &g, &mut Vec::new(), &mut done) {
            panic!("an import cycle: {cycle}");
        }
    }
    assert!(g.len() > 50, "only {} modules found", g.len());
}
