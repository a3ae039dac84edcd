//! The escape battery (`airlock_battery::CASES`) as an integration test: every attack runs
//! as the test-built `airlock-probe` inside a real sandbox started by `airlock exec`, and
//! must end exactly as the table says. Prints the table.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;

use airlock_battery::{Fixture, Runner};
use airlock_tests::{Scratch, airlock_bin, sandbox_available};

/// One `airlock exec --json --policy P --profile X -- argv` per call.
struct ExecRunner {
    policy: PathBuf,
}

impl Runner for ExecRunner {
    fn run(&mut self, profile: &str, argv: Vec<String>) -> Result<serde_json::Value, String> {
        // A secret in the supervisor's environment: the "supervisor environment" case
        // fails if it (or any other variable outside the profile's env) reaches the tool.
        let out = Command::new(airlock_bin())
            .env("AIRLOCK_BATTERY_SECRET", "hunter2")
            .args(["exec", "--json", "--profile", profile, "--policy"])
            .arg(&self.policy)
            .arg("--")
            .args(&argv)
            .output()
            .map_err(|e| e.to_string())?;
        serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "no result record ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

#[test]
fn every_attack_in_the_battery_ends_the_documented_way() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("escape");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let fixture = Fixture::new(&scratch.0, root.then_some(65534)).unwrap();
    let probe = fixture
        .stage_probe(&airlock_tests::fixture_bin("airlock-probe"))
        .unwrap();
    let policy = scratch.write("battery.toml", &fixture.policy_toml(&probe));
    let exe_before = std::fs::read(airlock_bin()).unwrap();

    let reports = airlock_battery::run(
        &mut ExecRunner { policy },
        &[probe.display().to_string()],
        &fixture,
    );

    eprintln!("\nescape battery\n{}", airlock_battery::table(&reports));
    let failed: Vec<_> = reports.iter().filter(|r| !r.ok).collect();
    assert!(failed.is_empty(), "{failed:#?}");
    assert_eq!(
        std::fs::read(airlock_bin()).unwrap(),
        exe_before,
        "the airlock binary changed"
    );
}

#[test]
fn airlock_selftest_passes_and_reports_every_case_as_json() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let out = Command::new(airlock_bin())
        .args(["selftest", "--json"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "selftest printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let cases = doc["cases"].as_array().unwrap();
    assert_eq!(cases.len(), airlock_battery::CASES.len());
    for case in cases {
        for key in ["name", "expected", "observed", "ok"] {
            assert!(case.get(key).is_some(), "{key} missing in {case}");
        }
    }
    let failed: Vec<_> = cases.iter().filter(|c| c["ok"] != true).collect();
    assert!(failed.is_empty(), "{failed:#?}");
    assert_eq!(doc["ok"], true);
    assert!(out.status.success(), "exit status {}", out.status);
}

#[test]
fn an_outcome_outside_the_accepted_list_fails_the_case() {
    let _guard = airlock_tests::shared();
    // The judge, not the sandbox: an outcome outside the accepted list is a failure.
    let result = serde_json::json!({"stdout": "ok\n", "error": null});
    let observed = airlock_battery::observe(&result);
    let case = airlock_battery::CASES
        .iter()
        .find(|c| c.attack == "unshare-user")
        .unwrap();
    assert!(!case.expected.contains(&observed.as_str()));
    let killed =
        serde_json::json!({"signal": libc::SIGSYS, "error": {"kind": "seccomp_violation"}});
    assert_eq!(airlock_battery::observe(&killed), "SIGSYS");
}
