//! `airlock doctor` on this machine: every check has a status and, when something is
//! missing, what it breaks and how to fix it; the default profile really runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

fn airlock() -> Command {
    Command::new(env!("CARGO_BIN_EXE_airlock"))
}

/// Whether skips must be failures (`.ci/run` sets it).
fn must_work() -> bool {
    std::env::var("AIRLOCK_MUST_WORK").is_ok_and(|v| v == "1")
}

/// Skips loudly (fails under AIRLOCK_MUST_WORK=1) when no sandbox starts on this machine.
/// A tiny copy of `airlock_tests::sandbox_available`, which cli tests cannot depend on.
fn sandbox_available() -> bool {
    static STATE: OnceLock<Result<(), String>> = OnceLock::new();
    let state = STATE.get_or_init(|| {
        let out = airlock()
            .args(["exec", "--json", "--", "/bin/true"])
            .output()
            .map_err(|e| format!("cannot run airlock: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`airlock exec -- /bin/true` failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    });
    match state {
        Ok(()) => true,
        Err(reason) if must_work() => {
            panic!("sandbox unavailable and AIRLOCK_MUST_WORK=1: {reason}")
        }
        Err(reason) => {
            eprintln!("SKIP: sandbox unavailable on this machine: {reason}");
            false
        }
    }
}

fn doctor_json() -> (Output, Value) {
    let out = airlock().args(["doctor", "--json"]).output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, report)
}

fn check<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no check {id} in {report:#}"))
}

#[test]
fn doctor_json_is_one_document_with_every_check_and_a_fix_for_each_problem() {
    let (out, report) = doctor_json();
    for id in [
        "kernel",
        "privileges",
        "worker.image",
        "userns.max",
        "userns.unprivileged_clone",
        "userns.apparmor",
        "userns.probe",
        "landlock.abi",
        "landlock.lsm",
        "seccomp.actions",
        "seccomp.filter",
        "cgroup.version",
        "cgroup.controllers",
        "cgroup.create",
        "sandbox.default",
    ] {
        check(&report, id);
    }
    for c in report["checks"].as_array().unwrap() {
        let status = c["status"].as_str().unwrap();
        assert!(["ok", "warn", "fail"].contains(&status), "{c:#}");
        assert!(!c["title"].as_str().unwrap().is_empty(), "{c:#}");
        assert!(!c["detail"].as_str().unwrap().is_empty(), "{c:#}");
        if status != "ok" {
            assert!(c["breaks"].as_str().is_some_and(|s| !s.is_empty()), "{c:#}");
            assert!(c["fix"].as_str().is_some_and(|s| !s.is_empty()), "{c:#}");
        }
    }
    // The exit status is the default profile's verdict, nothing else.
    let ok = report["ok"].as_bool().unwrap();
    assert_eq!(ok, check(&report, "sandbox.default")["status"] == "ok");
    assert_eq!(out.status.success(), ok, "{report:#}");
    assert_eq!(out.status.code(), Some(if ok { 0 } else { 1 }));
}

#[test]
fn doctor_reports_landlock_cgroups_and_a_working_default_profile_on_this_machine() {
    if !sandbox_available() {
        return;
    }
    let (out, report) = doctor_json();
    assert!(out.status.success(), "{report:#}");
    assert_eq!(report["ok"], true);

    // CI's build must embed the dedicated worker (cli/build.rs); the default profile above
    // ran on it.
    let image = check(&report, "worker.image");
    if must_work() {
        assert_eq!(image["facts"]["embedded"], true, "{image:#}");
    }

    let landlock = check(&report, "landlock.abi");
    assert_eq!(landlock["status"], "ok", "{landlock:#}");
    assert!(
        landlock["facts"]["abi"].as_i64().unwrap() >= 1,
        "{landlock:#}"
    );

    let cgroup = check(&report, "cgroup.version");
    assert_eq!(cgroup["status"], "ok", "{cgroup:#}");
    let version = cgroup["facts"]["version"].as_str().unwrap();
    assert!(version == "v1" || version == "v2", "{cgroup:#}");
    assert_eq!(check(&report, "cgroup.create")["status"], "ok");
    assert_eq!(check(&report, "userns.probe")["status"], "ok");
    assert_eq!(check(&report, "seccomp.filter")["status"], "ok");

    let sandbox = check(&report, "sandbox.default");
    assert_eq!(sandbox["status"], "ok", "{sandbox:#}");
    let isolation = &sandbox["facts"]["isolation"];
    assert!(
        isolation["landlock_abi"].as_u64().unwrap() >= 1,
        "{sandbox:#}"
    );
    assert!(isolation["seccomp"].is_string(), "{sandbox:#}");
    assert_eq!(isolation["cgroup"], version, "{sandbox:#}");
    assert_eq!(isolation["namespaces"].as_array().unwrap().len(), 7);
}

#[test]
fn doctor_prints_one_line_per_check_with_hints_indented_beneath() {
    let (_, report) = doctor_json();
    let out = airlock().arg("doctor").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let check_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ok ") || l.starts_with("warn ") || l.starts_with("FAIL "))
        .collect();
    assert_eq!(
        check_lines.len(),
        report["checks"].as_array().unwrap().len(),
        "{text}"
    );
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.starts_with("FAIL ") || line.starts_with("warn ") {
            assert!(lines[i + 1].starts_with("        breaks: "), "{text}");
            assert!(lines[i + 2].starts_with("        fix:    "), "{text}");
        }
    }
    assert!(
        text.contains("Landlock ABI") && text.contains("default profile sandbox"),
        "{text}"
    );
    if sandbox_available() {
        assert!(out.status.success(), "{text}");
        // A warning (a glibc worker, say) adds a note after the verdict, not another one.
        let verdict = text.trim_end().lines().last().unwrap();
        assert!(
            verdict
                .starts_with("airlock works here: the default profile ran a command in a sandbox"),
            "{text}"
        );
    }
}
