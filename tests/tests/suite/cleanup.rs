//! Nothing is left behind: after 1,000 calls in a row none of the worker processes, cgroup
//! directories or mounts they made remains. It runs alone (`airlock_tests::exclusive`):
//! those are the whole process's to count.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Instant;

use airlock::SandboxRun;
use airlock_policy::load_policy_str;
use airlock_tests::{HANG_GUARD, added_since, our_cgroup_dirs, our_children, sandbox_available};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_calls_leave_no_process_cgroup_or_mount_behind() {
    let _guard = airlock_tests::exclusive();
    if !sandbox_available() {
        return;
    }
    // RUST_LOG=debug shows what the supervisor does with each call.
    crate::logs::install();
    // airlock's own mounts in this namespace; others' come and go (a parallel test, the
    // host's automounter, another test process's daemons, whose scratch directories carry
    // that process's pid) and are none of this test's business.
    let ours = format!("-{}-", std::process::id());
    let our_mounts = || -> Vec<String> {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|line| line.contains("airlock"))
            .filter(|line| !line.contains("airlock-test-") || line.contains(&ours))
            .map(str::to_string)
            .collect()
    };
    let mounts_before = our_mounts();
    // What earlier tests of the suite still have is theirs.
    let children_before = our_children();
    let supervisor = airlock_tests::supervisor();
    let parents = supervisor.cgroups().map(|p| p.dirs()).unwrap_or_default();
    let cgroups_before = our_cgroup_dirs(&parents);
    let policy = load_policy_str(
        airlock_policy::presets::preset_text("default").unwrap(),
        "default",
    )
    .unwrap();
    let profile = Arc::clone(&policy.policy.profiles["default"]);
    let started = Instant::now();
    let calls: u32 = std::env::var("AIRLOCK_CLEANUP_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    for i in 0..calls {
        let run = SandboxRun {
            call_id: format!("c{i}"),
            tool: "exec".into(),
            profile: Arc::clone(&profile),
            argv: vec!["/bin/true".into()],
            stdin: Vec::new(),
            arguments_json: "{}".into(),
            timeout: HANG_GUARD,
            inherit_stdio: None,
            builtin: None,
        };
        let result = supervisor.run(run, None).await;
        assert!(result.ok, "call {i}: {result:?}");
    }
    let elapsed = started.elapsed();
    eprintln!(
        "{calls} calls in {elapsed:?} ({:?} per call)",
        elapsed / calls
    );
    // Finished calls answer before their worker is reaped; close waits for that cleanup.
    supervisor.close().await;
    assert_eq!(
        added_since(&cgroups_before, our_cgroup_dirs(&parents)),
        Vec::<String>::new()
    );
    assert_eq!(
        added_since(&children_before, our_children()),
        Vec::<String>::new()
    );
    assert_eq!(
        added_since(&mounts_before, our_mounts()),
        Vec::<String>::new()
    );
}
