//! `airlock bench` in a short run: its sections complete, and the one-shot section's
//! contender that calls through a daemon of its own gets every call answered and leaves
//! nothing running. A measurement of the host, not of a kernel: the kernel matrix skips it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use airlock_tests::{airlock_bin, sandbox_available};
use serde_json::Value;

#[test]
fn bench_measures_the_daemons_shell_client_in_the_one_shot_rounds_and_stops_its_daemon() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let rounds = 3;
    let out = Command::new(airlock_bin())
        .args([
            "bench",
            "--json",
            "--rounds",
            "2",
            "--throughput-seconds",
            "0.2",
        ])
        .args(["--throughput-slices", "1", "--no-burst", "--oneshot-rounds"])
        .arg(rounds.to_string())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let oneshot = &report["oneshot"];
    assert!(oneshot.get("daemon_not_measured").is_none(), "{oneshot}");
    let contenders = oneshot["contenders"].as_array().unwrap();
    let client = contenders
        .iter()
        .find(|c| {
            c["name"]
                .as_str()
                .unwrap()
                .starts_with("airlock run --socket")
        })
        .unwrap_or_else(|| panic!("no daemon client in {oneshot}"));
    // Every round's call answered ok (a failed run is not a sample), and the daemon's
    // share of the CPU was read.
    assert_eq!(client["samples"], rounds, "{client}");
    assert!(
        client["daemon_cpu_ms_per_run"].as_f64().is_some(),
        "{client}"
    );
    // (bwrap's runs may fail where it cannot make its namespaces; airlock's may not.)
    for contender in contenders {
        if contender["name"].as_str().unwrap().starts_with("airlock") {
            assert_eq!(contender["samples"], rounds, "{contender}");
        }
    }
    // The daemon was stopped with the bench: nothing of its is left running.
    let left = airlock_tests::host_processes_with("shell.sock");
    assert!(left.is_empty(), "left running: {left:?}");
}
