//! The suite's own rules, read from its source as plain text (rustfmt-formatted, as CI
//! checks): every test begins by taking the suite's lock and takes it nowhere else (see
//! main.rs: a test that forgot could run beside one that must run alone, and a helper that
//! took it again inside a test would wait forever behind a waiting exclusive test), and the
//! suite is the package's one test binary, every file of it one of its modules.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::{Path, PathBuf};

/// The package's integration test directory, `tests/tests`.
fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// The suite's source files, sorted.
fn suite_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(tests_dir().join("suite"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .collect();
    files.sort();
    files
}

/// The ways of taking the lock, `airlock_tests::shared` and `airlock_tests::exclusive`:
/// built here, so that this file's text names them only where its own tests take it.
fn lock_functions() -> [String; 2] {
    ["shared", "exclusive"].map(|kind| format!("airlock_tests::{kind}"))
}

/// Whether `line` starts a test: `#[test]`, or `#[tokio::test]` with or without arguments.
fn is_test_attribute(line: &str) -> bool {
    let line = line.trim();
    line == "#[test]" || line.starts_with("#[tokio::test]") || line.starts_with("#[tokio::test(")
}

/// For each test of a file, its name and first statement (the line after the one that
/// opens its body), with the line number of the attribute.
fn tests_and_first_statements(text: &str) -> Vec<(usize, String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        if !is_test_attribute(line) {
            continue;
        }
        // Other attributes may follow (`#[ignore]`); then the signature, which rustfmt ends
        // with the `{` that opens the body.
        let rest = &lines[at + 1..];
        let signature = rest
            .iter()
            .position(|l| {
                let l = l.trim_start();
                l.starts_with("fn ") || l.starts_with("async fn ")
            })
            .unwrap_or_else(|| panic!("line {}: a test attribute without a fn", at + 1));
        let name = rest[signature]
            .trim_start()
            .trim_start_matches("async ")
            .trim_start_matches("fn ")
            .split('(')
            .next()
            .unwrap()
            .to_string();
        let opens = signature
            + rest[signature..]
                .iter()
                .position(|l| l.trim_end().ends_with('{'))
                .unwrap_or_else(|| panic!("line {}: {name} has no body", at + 1));
        let first = rest[opens + 1..]
            .iter()
            .map(|l| l.trim())
            .find(|l| !l.is_empty())
            .unwrap_or_default()
            .to_string();
        found.push((at + 1, name, first));
    }
    found
}

#[test]
fn every_test_takes_the_suite_lock_before_anything_else_and_nowhere_else() {
    let _guard = airlock_tests::shared();
    let takes_lock: Vec<String> = lock_functions()
        .iter()
        .map(|function| format!("let _guard = {function}();"))
        .collect();
    let mut problems = Vec::new();
    let mut tests_seen = 0;
    for path in suite_files() {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = fs::read_to_string(&path).unwrap();
        let tests = tests_and_first_statements(&text);
        tests_seen += tests.len();
        for (line, name, first) in &tests {
            if !takes_lock.contains(first) {
                problems.push(format!(
                    "{file}:{line}: {name} begins with `{first}`, not with one of {takes_lock:?}"
                ));
            }
        }
        // Code only: comments may name them.
        let mentions = text
            .lines()
            .map(|l| l.find("//").map_or(l, |at| &l[..at]))
            .filter(|l| lock_functions().iter().any(|f| l.contains(f.as_str())))
            .count();
        if mentions != tests.len() {
            problems.push(format!(
                "{file}: {} tests but {mentions} lines naming the lock functions: only a \
                 test's first statement may take the lock",
                tests.len()
            ));
        }
    }
    // A scanner that finds nothing would pass vacuously.
    assert!(
        tests_seen > 0,
        "no test found in the suite: the scan is broken"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_suite_is_the_one_test_binary_and_every_file_of_it_a_module() {
    let _guard = airlock_tests::shared();
    let mut problems = Vec::new();
    for entry in fs::read_dir(tests_dir()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name != "suite" {
            problems.push(format!(
                "tests/tests/{name}: a test binary of its own links the whole crate graph \
                 again: make it a module of tests/tests/suite"
            ));
        }
    }
    let main = fs::read_to_string(tests_dir().join("suite/main.rs")).unwrap();
    for path in suite_files() {
        let module = path.file_stem().unwrap().to_string_lossy().into_owned();
        if module != "main" && !main.lines().any(|l| l == format!("mod {module};")) {
            problems.push(format!(
                "tests/tests/suite/{module}.rs is no module of the suite: declare `mod \
                 {module};` in main.rs, or its tests never run"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
