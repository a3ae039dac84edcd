//! `airlock check` and `airlock schema` as a security engineer runs them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

fn airlock() -> Command {
    Command::new(env!("CARGO_BIN_EXE_airlock"))
}

fn presets() -> Vec<String> {
    let mut files = toml_files(concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/presets"));
    files.extend(toml_files(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../policies/examples"
    )));
    files
}

fn toml_files(dir: &str) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .filter(|p| p.ends_with(".toml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{dir}");
    files
}

#[test]
fn check_accepts_every_shipped_preset() {
    let out = airlock().arg("check").args(presets()).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn check_reports_three_mistakes_as_three_located_diagnostics_and_exits_1() {
    let dir = std::env::temp_dir().join(format!("airlock-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.toml");
    std::fs::write(
        &file,
        "version = 1\n[profiles.default]\nread = [\"usr\"]\nlimits = { timeout = \"soon\" }\n\n[tools.t]\ndescription = \"\"\ncommand = [\"/bin/true\"]\nside_effect = \"read\"\ninput = { type = \"object\" }\n",
    )
    .unwrap();
    let out = airlock().arg("check").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    let name = file.display().to_string();
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(": error: ")).collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert!(
        lines[0].starts_with(&format!("{name}:3:9: error: ")),
        "{stderr}"
    );
    assert!(
        lines[1].starts_with(&format!("{name}:4:22: error: limits.timeout")),
        "{stderr}"
    );
    assert!(
        lines[2].starts_with(&format!("{name}:7:15: error: tool t: description")),
        "{stderr}"
    );

    let out = airlock()
        .args(["check", "--json"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json[0]["valid"], false);
    assert_eq!(json[0]["diagnostics"].as_array().unwrap().len(), 3);
    assert_eq!(json[0]["diagnostics"][0]["line"], 3);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn check_reports_typos_beside_other_mistakes_and_exits_1() {
    let dir = std::env::temp_dir().join(format!("airlock-typo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("typos.toml");
    std::fs::write(
        &file,
        "version = 1\n[profiles.default]\nlimits = { memroy = \"1GiB\", pids = 0 }\n\n[tools.t]\ndescription = \"d\"\nbuiltin = \"read_file\"\nside_efect = \"read\"\n",
    )
    .unwrap();
    let out = airlock().arg("check").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    let name = file.display().to_string();
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(": error: ")).collect();
    assert_eq!(
        lines,
        vec![
            format!(
                "{name}:3:12: error: unknown key `memroy` in `profiles.default.limits`; did you mean `memory`?"
            ),
            format!("{name}:3:36: error: limits.pids must be between 1 and 65536"),
            format!(
                "{name}:8:1: error: unknown key `side_efect` in `tools.t`; did you mean `side_effect`?"
            ),
        ],
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn check_prints_warnings_but_exits_0_for_risky_valid_policies() {
    let dir = std::env::temp_dir().join(format!("airlock-warn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("risky.toml");
    std::fs::write(&file, "version = 1\n[profiles.default]\nwrite = [\"/\"]\n").unwrap();
    let out = airlock().arg("check").arg(&file).output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains(":3:10: warning: write path \"/\""),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn check_of_a_missing_file_fails_cleanly() {
    let out = airlock()
        .args(["check", "/nonexistent/policy.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read policy file"));
}

#[test]
fn schema_prints_a_json_schema_of_the_policy_format() {
    let out = airlock().arg("schema").output().unwrap();
    assert!(out.status.success());
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert!(schema["$defs"]["profile"]["properties"]["limits"].is_object());
}
