//! Nothing is left behind: after 1,000 calls in a row none of the worker processes, cgroup
//! directories or mounts they made remains. It runs alone (`airlock_tests::exclusive`):
//! those are the whole process's to count.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// What `airlock exec` and `airlock run` do: one supervisor for one call, on a
/// current-thread runtime, removing the worker's cgroup on that thread rather than on a
/// blocking thread. After `close`, nothing of either way a call ends is left: one that
/// finished, and one stopped at its deadline.
#[test]
fn a_one_shot_supervisor_leaves_nothing_behind_once_closed() {
    let _guard = airlock_tests::exclusive();
    if !sandbox_available() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let children_before = our_children();
    let policy = load_policy_str(
        airlock_policy::presets::preset_text("default").unwrap(),
        "default",
    )
    .unwrap();
    let profile = Arc::clone(&policy.policy.profiles["default"]);
    let run = |call_id: &str, argv: &[&str], timeout| SandboxRun {
        call_id: call_id.into(),
        tool: "exec".into(),
        profile: Arc::clone(&profile),
        argv: argv.iter().map(|a| a.to_string()).collect(),
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout,
        inherit_stdio: None,
        builtin: None,
    };
    for (call, finishes) in [
        (run("done", &["/bin/true"], HANG_GUARD), true),
        (
            run(
                "stopped",
                &["/bin/sleep", "1000"],
                Duration::from_millis(200),
            ),
            false,
        ),
    ] {
        let _entered = runtime.enter();
        let supervisor = airlock::Supervisor::start(airlock::SupervisorOptions {
            worker_program: Some((airlock_tests::airlock_bin(), Vec::new())),
            one_shot: true,
            ..Default::default()
        })
        .unwrap();
        let parents = supervisor.cgroups().map(|p| p.dirs()).unwrap_or_default();
        let cgroups_before = our_cgroup_dirs(&parents);
        let result = runtime.block_on(async {
            let result = supervisor.run(call, None).await;
            supervisor.close().await;
            result
        });
        assert_eq!(result.ok, finishes, "{result:?}");
        assert_eq!(
            added_since(&cgroups_before, our_cgroup_dirs(&parents)),
            Vec::<String>::new(),
            "{result:?}"
        );
        assert_eq!(
            added_since(&children_before, our_children()),
            Vec::<String>::new()
        );
    }
}
