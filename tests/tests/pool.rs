//! Pooled workers: pre-confined and waiting, each used for exactly one call, and no weaker
//! than cold ones — the same isolation seen from inside.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::{SandboxRun, Supervisor, SupervisorOptions};
use airlock_policy::load_policy_str;
use airlock_tests::{airlock_bin, sandbox_available};

fn run(profile: &Arc<airlock_policy::CompiledProfile>, script: &str) -> SandboxRun {
    SandboxRun {
        call_id: "p".into(),
        tool: "exec".into(),
        profile: Arc::clone(profile),
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout: Duration::from_secs(10),
        inherit_stdio: None,
        builtin: None,
    }
}

const INSIDE: &str = "cat /proc/self/uid_map; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; cat /proc/sys/kernel/hostname; cut -d' ' -f5 /proc/self/mountinfo | sort; ls /proc/self/fd; echo x > /usr/x 2>/dev/null || echo ro; echo $$";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_workers_are_single_use_and_as_confined_as_cold_ones() {
    if !sandbox_available() {
        return;
    }
    let policy = load_policy_str(
        airlock_policy::presets::preset_text("default").unwrap(),
        "default",
    )
    .unwrap()
    .policy;
    let profile = Arc::clone(&policy.profiles["default"]);
    let cold = Supervisor::start(SupervisorOptions {
        worker_program: Some((airlock_bin(), Vec::new())),
        ..Default::default()
    })
    .unwrap();
    let cold_result = cold.run(run(&profile, INSIDE), None).await;
    assert!(cold_result.ok, "{cold_result:?}");

    let pooled = Arc::new(
        Supervisor::start(SupervisorOptions {
            worker_program: Some((airlock_bin(), Vec::new())),
            ..Default::default()
        })
        .unwrap(),
    );
    pooled.keep_warm(Arc::clone(&profile), 2);
    let deadline = Instant::now() + Duration::from_secs(20);
    while pooled.pool_stats().idle < 2 {
        assert!(Instant::now() < deadline, "the pool never filled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = pooled.run(run(&profile, INSIDE), None).await;
    let second = pooled.run(run(&profile, INSIDE), None).await;
    assert!(first.ok && second.ok, "{first:?} {second:?}");
    assert_eq!(pooled.pool_stats().hits, 2);
    // Same view from inside as a cold worker, PID aside (the last line).
    let strip_pid = |s: &str| s.lines().rev().skip(1).collect::<Vec<_>>().join("\n");
    assert_eq!(strip_pid(&first.stdout), strip_pid(&cold_result.stdout));
    assert_eq!(first.isolation, cold_result.isolation);
    // Fresh sandbox each time: a file written by one call is gone for the next.
    let _ = pooled
        .run(run(&profile, "echo left > /tmp/marker"), None)
        .await;
    let next = pooled
        .run(
            run(&profile, "cat /tmp/marker 2>/dev/null || echo fresh"),
            None,
        )
        .await;
    assert_eq!(next.stdout, "fresh\n");
    // The pool refills off the critical path.
    let deadline = Instant::now() + Duration::from_secs(20);
    while pooled.pool_stats().idle < 2 {
        assert!(Instant::now() < deadline, "the pool never refilled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pooled.close().await;
    assert_eq!(pooled.pool_stats().idle, 0);
}
