//! Imports run one way inside each crate: no module reaches, through `crate::…` or `super::…`
//! paths, a module that reaches it back (`docs/ARCHITECTURE.md`). Read from the sources, so a new
//! cycle fails here; a cycle accepted for a while must be listed by name in `KNOWN`, and taken
//! off the list when it is untied.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Cycles still there, as sorted module lists per crate folder: none.
const KNOWN: &[(&str, &[&str])] = &[];

const CRATES: &[&str] = &[
    "src",
    "nemotron-formats/src",
    "nemotron-loader/src",
    "nemotron-kernels/src",
    "nemotron-model/src",
    "nemotron-server/src",
];

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// `a/b.rs` → `a::b`, `a/mod.rs` → `a`, `lib.rs` → `` (the crate root).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

fn ident_len(s: &str) -> usize {
    s.find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len())
}

/// The paths named after `head` (`crate::` or `super::`) in `code`: `a::b::c`, and each item of
/// a braced group `{a::b, c}` (one level).
fn paths_after(code: &str, head: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = vec![];
    let mut from = 0;
    while let Some(i) = code[from..].find(head) {
        let at = from + i;
        from = at + head.len();
        // A whole token: not the tail of a longer identifier.
        if at > 0 {
            let prev = code[..at].chars().next_back().unwrap();
            if prev.is_alphanumeric() || prev == '_' {
                continue;
            }
        }
        // `super::super::x`: count the supers.
        let mut rest = &code[from..];
        let mut ups = 1;
        while head == "super::" && rest.starts_with("super::") {
            ups += 1;
            rest = &rest[7..];
            // The next search starts past the supers counted here.
            from += 7;
        }
        let mut groups = vec![];
        if let Some(inner) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        groups.push(&inner[start..j]);
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        groups.push(&inner[start..j]);
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            groups.push(rest);
        }
        for g in groups {
            let mut p = vec![];
            let mut s = g.trim_start();
            loop {
                let n = ident_len(s);
                if n == 0 {
                    break;
                }
                p.push(s[..n].to_string());
                match s[n..].strip_prefix("::") {
                    Some(r) => s = r,
                    None => break,
                }
            }
            if !p.is_empty() {
                out.push((ups, p));
            }
        }
    }
    out
}

/// Module → the modules of the same crate it names.
fn graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = vec![];
    rs_files(root, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(root, f), f.clone()))
        .collect();
    let mut g = BTreeMap::new();
    for (m, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap();
        // Code only: comments (docs included) name modules without importing them.
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let mut deps = BTreeSet::new();
        let mut named = paths_after(&code, "crate::")
            .into_iter()
            .map(|(_, p)| p)
            .collect::<Vec<_>>();
        for (ups, p) in paths_after(&code, "super::") {
            // `super` of module `a::b` (`a/b.rs`) is `a`; of module `a` (`a.rs` or `a/mod.rs`)
            // the crate root.
            let mut base = m.clone();
            for _ in 0..ups {
                base.pop();
            }
            base.extend(p);
            named.push(base);
        }
        for p in named {
            // The longest prefix that is a module of the crate, other than this one and the root.
            for n in (1..=p.len()).rev() {
                let cand = &p[..n];
                if modules.contains_key(cand) && cand != m.as_slice() {
                    deps.insert(cand.join("::"));
                    break;
                }
            }
        }
        g.insert(m.join("::"), deps);
    }
    g
}

/// The strongly connected components of more than one module (Tarjan), each sorted.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: BTreeSet<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = vec![];
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.insert(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: vec![],
        on: BTreeSet::new(),
        out: BTreeSet::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn imports_run_one_way_except_the_listed_cycles() {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut report = vec![];
    for c in CRATES {
        let g = graph(&ws.join(c));
        assert!(!g.is_empty(), "{c}: no modules read");
        let found = cycles(&g);
        let known: BTreeSet<Vec<String>> = KNOWN
            .iter()
            .filter(|(k, _)| k == c)
            .map(|(_, m)| m.iter().map(|s| s.to_string()).collect())
            .collect();
        if found != known {
            report.push(format!("{c}: cycles {found:?}, listed {known:?}"));
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}

/// The reader finds a cycle written into a crate (two modules naming each other, one through a
/// braced `use crate::{…}`, one through `super::`).
#[test]
fn imports_reader_sees_a_planted_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod c;\n").unwrap();
    std::fs::write(src.join("a/mod.rs"), "pub mod b;\n").unwrap();
    std::fs::write(
        src.join("a/b.rs"),
        "use crate::{c::f, x};\n// crate::a::b\n",
    )
    .unwrap();
    std::fs::write(src.join("c.rs"), "use crate::a::b::g;\n").unwrap();
    let g = graph(src);
    assert_eq!(
        cycles(&g),
        BTreeSet::from([vec!["a::b".to_string(), "c".to_string()]])
    );
    // Through `super::` instead.
    std::fs::write(src.join("c.rs"), "fn h() { super::a::b::g(); }\n").unwrap();
    std::fs::write(src.join("a/b.rs"), "pub fn g() { super::super::c::h(); }\n").unwrap();
    let g = graph(src);
    assert!(g["a::b"].contains("c"), "{g:?}");
    // The inner `super::` of `super::super::c` is no path of its own (it would name `a`).
    assert!(!g["a::b"].contains("a"), "{g:?}");
    // Only comments name each other: no cycle.
    std::fs::write(src.join("a/b.rs"), "//! [`crate::c`]\n").unwrap();
    assert!(cycles(&graph(src)).is_empty());
}
