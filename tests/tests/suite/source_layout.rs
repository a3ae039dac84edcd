//! Checks on the shape of the source tree: no source file grows past what a reader can hold
//! at once, and no two modules of a crate depend on each other.
//!
//! Both read the sources as plain text. The import check relies on the tree being
//! rustfmt-formatted (CI runs `cargo fmt --check`): an inline `mod name {` block ends at the
//! first line holding only `}` at the indentation it was opened at.
// Test helpers outside `#[test]` fns are not covered by clippy.toml's allow-*-in-tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Most lines a source file may have.
const MAX_LINES: usize = 900;

/// Source directories whose files are held to [`MAX_LINES`].
const SIZE_CHECKED_DIRS: &[&str] = &[
    "supervisor/src",
    "worker/src",
    "policies/src",
    "cli/src",
    "protocol/src",
];

/// Crates (by directory) whose top-level modules must not import each other.
const CRATES: &[&str] = &[
    "protocol",
    "policies",
    "worker",
    "supervisor",
    "battery",
    "cli",
    "tests",
];

fn repo_root() -> PathBuf {
    // This crate lives in tests/, one level below the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent directory")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, in a stable order.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files
}

/// `path` relative to `base`, with `/` separators, for messages.
fn relative(base: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(base).unwrap();
    rel.iter()
        .map(|part| part.to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

#[test]
fn no_source_file_is_longer_than_the_line_limit() {
    let _guard = airlock_tests::shared();
    let root = repo_root();
    let mut problems = Vec::new();
    for dir in SIZE_CHECKED_DIRS {
        for path in rust_files(&root.join(dir)) {
            let lines = fs::read_to_string(&path).unwrap().lines().count();
            if lines > MAX_LINES {
                let name = relative(&root, &path);
                problems.push(format!(
                    "{name} has {lines} lines, over the limit of {MAX_LINES}: split it by concern"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The crate's top-level modules: `src/a.rs` and `src/a/` are both module `a`. `src/bin/`
/// holds separate crates.
fn top_level_modules(src: &Path) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    for entry in fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let is_module_file =
            path.extension().is_some_and(|ext| ext == "rs") && name != "lib" && name != "main";
        if is_module_file || (path.is_dir() && name != "bin") {
            modules.insert(name);
        }
    }
    modules
}

/// The module path a file defines, relative to the crate root: `a.rs` and `a/mod.rs` are
/// `["a"]`, `a/x.rs` is `["a", "x"]`, `lib.rs` and `main.rs` are `[]`.
fn module_path(file_in_src: &str) -> Vec<String> {
    let mut parts: Vec<String> = file_in_src.split('/').map(str::to_string).collect();
    let file = parts.pop().unwrap();
    let stem = file.trim_end_matches(".rs");
    let is_root = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !is_root {
        parts.push(stem.to_string());
    }
    parts
}

/// A file's code without comments (doc links to other modules are not dependencies), and
/// for each line how many inline `mod name {` blocks enclose it.
fn code_and_inline_depths(text: &str) -> (Vec<String>, Vec<usize>) {
    let mut code = Vec::new();
    let mut depths = Vec::new();
    // Indentation of each open inline module.
    let mut open: Vec<usize> = Vec::new();
    for line in text.lines() {
        let line = line.find("//").map_or(line, |at| &line[..at]).trim_end();
        let indent = line.len() - line.trim_start().len();
        if open.last() == Some(&indent) && line.trim_start() == "}" {
            open.pop();
        }
        code.push(line.to_string());
        depths.push(open.len());
        let opener = line.trim_start();
        let opener = opener.strip_prefix("pub ").unwrap_or(opener);
        let opener = opener
            .strip_prefix("pub(crate) ")
            .or_else(|| opener.strip_prefix("pub(super) "))
            .unwrap_or(opener);
        if opener.starts_with("mod ") && opener.ends_with('{') {
            open.push(indent);
        }
    }
    (code, depths)
}

/// The identifier `text` starts with (empty when it starts with something else).
fn identifier(text: &str) -> &str {
    let end = text
        .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The first path segments named right after a prefix that resolves to the crate root:
/// `rules` in `crate::rules::decide`, `a` and `b` in `crate::{a::X, b}`.
fn names_at_crate_root(after: &str) -> Vec<&str> {
    let Some(group) = after.strip_prefix('{') else {
        return vec![identifier(after)];
    };
    let mut names = Vec::new();
    let mut depth = 0;
    let mut entry_start = 0;
    for (at, ch) in group.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' if depth == 0 => {
                names.push(identifier(group[entry_start..at].trim_start()));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                names.push(identifier(group[entry_start..at].trim_start()));
                entry_start = at + 1;
            }
            _ => {}
        }
    }
    names
}

/// Where one top-level module of crate `krate` names another: `(from, to)` → the first
/// `file:line` seen.
fn module_references(root: &Path, krate: &str) -> BTreeMap<(String, String), String> {
    let src = root.join(krate).join("src");
    let modules = top_level_modules(&src);
    let mut references = BTreeMap::new();
    for path in rust_files(&src) {
        let file_in_src = relative(&src, &path);
        let file_module = module_path(&file_in_src);
        let Some(from) = file_module.first() else {
            // The crate root may use any of its modules.
            continue;
        };
        if from == "bin" {
            continue;
        }
        let (code, depths) = code_and_inline_depths(&fs::read_to_string(&path).unwrap());
        // Whole-text search, so `use crate::{...}` groups spanning lines are read whole.
        let text = code.join("\n");
        let line_of = |at: usize| text[..at].matches('\n').count();
        let is_path_start = |at: usize| {
            !text[..at].ends_with(|ch: char| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':')
        };
        let mut add = |at: usize, after: &str| {
            for to in names_at_crate_root(after) {
                if to != from && modules.contains(to) {
                    let line = line_of(at) + 1;
                    references
                        .entry((from.clone(), to.to_string()))
                        .or_insert_with(|| format!("{}:{line}", relative(root, &path)));
                }
            }
        };
        for (at, _) in text.match_indices("crate::") {
            if is_path_start(at) {
                add(at, &text[at + "crate::".len()..]);
            }
        }
        for (at, _) in text.match_indices("super::") {
            if !is_path_start(at) {
                continue;
            }
            let mut after = &text[at..];
            let mut levels = 0;
            while let Some(rest) = after.strip_prefix("super::") {
                after = rest;
                levels += 1;
            }
            // Only a `super::` chain that climbs to the crate root leaves this module; a
            // child naming its parent's items stays inside it.
            let depth = file_module.len() + depths[line_of(at)];
            if levels == depth {
                add(at, after);
            }
        }
    }
    references
}

#[test]
fn no_two_top_level_modules_of_a_crate_import_each_other() {
    let _guard = airlock_tests::shared();
    let root = repo_root();
    let mut problems = Vec::new();
    let mut references_seen = 0;
    for krate in CRATES {
        let references = module_references(&root, krate);
        references_seen += references.len();
        for ((from, to), at) in &references {
            if from < to
                && let Some(back) = references.get(&(to.clone(), from.clone()))
            {
                problems.push(format!(
                    "{krate}: modules `{from}` and `{to}` import each other \
                     ({from} -> {to} at {at}; {to} -> {from} at {back}): move what both \
                     need into a module of its own, or turn one direction around"
                ));
            }
        }
    }
    // A scanner that finds nothing would pass vacuously.
    assert!(
        references_seen > 0,
        "no module references found at all: the scan is broken"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
