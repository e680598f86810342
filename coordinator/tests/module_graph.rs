//! The coordinator's modules form no import cycle (an ARCHITECTURE.md
//! invariant): every `crate::<module>` a module's code names (in `use`
//! statements and in paths) is an edge, and the graph of the files in
//! `coordinator/src` has no strongly connected component of two or more
//! modules. Comments, string literals and each file's `#[cfg(test)]` module
//! are not looked at.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module's source with comments and string/char literals blanked out.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(b' ');
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'"') | Some(b'#')) && !ident_byte(out.last().copied()) {
            // Raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"' && b[j + 1..].iter().take(hashes).filter(|&&h| h == b'#').count() == hashes {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.extend_from_slice(b"\"\"");
            i = j;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.extend_from_slice(b"\"\"");
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if b.get(i + 1) == Some(&b'\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != b'\'' {
                    j += 1;
                }
                i = j + 1;
                out.extend_from_slice(b"' '");
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
                out.extend_from_slice(b"' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn ident_byte(c: Option<u8>) -> bool {
    c.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// The code before the file's `#[cfg(test)] mod tests` (test code may use
/// any module: it is not part of the graph).
fn without_tests(code: &str) -> &str {
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(test)]") {
        let at = from + at;
        let rest = code[at + "#[cfg(test)]".len()..].trim_start();
        if rest.starts_with("mod tests") {
            return &code[..at];
        }
        from = at + 1;
    }
    code
}

fn leading_ident(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The modules named after each `crate::` in `code`, with the line each was
/// first named on (`crate::a::b`, `crate::{a::b, c}`).
fn references(code: &str) -> BTreeMap<String, usize> {
    let mut found = BTreeMap::new();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut from = 0;
    while let Some(at) = code[from..].find("crate::") {
        let at = from + at;
        from = at + "crate::".len();
        if ident_byte(code[..at].bytes().last()) {
            continue; // e.g. `my_crate::`
        }
        let rest = code[from..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level entries of the group: `{a::b, c, d::{e, f}}`.
            let mut depth = 0;
            let mut entry_start = true;
            for (k, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => entry_start = true,
                    c if entry_start && !c.is_whitespace() => {
                        entry_start = false;
                        let name = leading_ident(&group[k..]);
                        found.entry(name.to_string()).or_insert_with(|| line_of(at));
                    }
                    _ => {}
                }
            }
        } else {
            let name = leading_ident(rest);
            if !name.is_empty() {
                found.entry(name.to_string()).or_insert_with(|| line_of(at));
            }
        }
    }
    found
}

/// Strongly connected components of two or more nodes (Tarjan).
fn cycles<V>(graph: &BTreeMap<String, BTreeMap<String, V>>) -> Vec<Vec<String>> {
    struct State<'g, V> {
        graph: &'g BTreeMap<String, BTreeMap<String, V>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g, V>(s: &mut State<'g, V>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph[v].keys() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = s.stack.pop().expect("on the stack");
                s.on_stack.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// Module → the crate modules it names, with where each is first named
/// (`file:line`). A module split into a folder (`core/mod.rs`,
/// `core/admission.rs`, ...) is one node: its files may name each other
/// freely, and what any of them names is the module's edge.
fn module_graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // Module name → its files (path relative to src, text).
    let mut sources: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("coordinator/src") {
        let path = entry.expect("dir entry").path();
        let name = path.file_stem().expect("file name").to_string_lossy().into_owned();
        if path.is_dir() {
            if !path.join("mod.rs").exists() {
                continue; // not a module folder (e.g. src/bin)
            }
            let mut files: Vec<_> = std::fs::read_dir(&path)
                .expect("module folder")
                .map(|e| e.expect("dir entry").path())
                // A folder's tests.rs is its `#[cfg(test)] mod tests;`: test code, not part of the graph.
                .filter(|p| p.extension().is_some_and(|e| e == "rs") && !p.ends_with("tests.rs"))
                .collect();
            files.sort();
            for f in files {
                let rel = format!("{name}/{}", f.file_name().expect("file name").to_string_lossy());
                let text = std::fs::read_to_string(&f).expect("read module file");
                sources.entry(name.clone()).or_default().push((rel, text));
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        // lib.rs declares the modules; main.rs is the binary, another crate.
        if name == "lib" || name == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read module");
        sources.entry(name.clone()).or_default().push((format!("{name}.rs"), text));
    }
    assert!(sources.len() >= 10, "coordinator/src holds the modules: {:?}", sources.keys());
    sources
        .iter()
        .map(|(name, files)| {
            let mut edges = BTreeMap::new();
            for (file, text) in files {
                let code = code_only(text);
                for (to, line) in references(without_tests(&code)) {
                    if &to != name && sources.contains_key(&to) {
                        edges.entry(to).or_insert_with(|| format!("{file}:{line}"));
                    }
                }
            }
            (name.clone(), edges)
        })
        .collect()
}

#[test]
fn a_module_split_into_a_folder_is_one_node_with_its_files_edges() {
    let graph = module_graph();
    // core/ and server/ are folders; server names core from several of its files.
    assert!(graph.contains_key("core") && graph.contains_key("server"), "{:?}", graph.keys());
    assert!(graph["server"].contains_key("core"), "server -> core: {:?}", graph["server"]);
    assert!(graph["server"]["core"].starts_with("server/"), "{:?}", graph["server"]["core"]);
}

#[test]
fn the_parser_finds_paths_groups_and_skips_comments_strings_and_tests() {
    let src = r#"
use crate::a::X;
use crate::{b::Y, c, d::{e, f}};
// crate::g in a comment
/* crate::h in a block */
let s = "crate::i in a string";
let c = '"';
fn f<'a>(x: &'a crate::j::T) { other_crate::k::f(); }
#[cfg(test)]
mod tests { use crate::l; }
"#;
    let found: Vec<String> = references(without_tests(&code_only(src))).into_keys().collect();
    assert_eq!(found, ["a", "b", "c", "d", "j"]);
}

#[test]
fn the_coordinators_modules_form_no_import_cycle() {
    let graph = module_graph();
    let found = cycles(&graph);
    let mut report = String::new();
    for scc in &found {
        report.push_str(&format!("cycle among {{{}}}:\n", scc.join(", ")));
        for from in scc {
            for (to, line) in &graph[from] {
                if scc.contains(to) {
                    report.push_str(&format!("  {from} -> {to}  (src/{line})\n"));
                }
            }
        }
    }
    println!("{report}");
    assert!(found.is_empty(), "the coordinator's modules import each other in a cycle:\n{report}");
}
