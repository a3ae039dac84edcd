//! Caller cancellation: an explicit cancel returns `cancelled`, and dropping the call's
//! future kills the worker; either way the whole tool tree dies.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use airlock::SandboxRun;
use airlock_policy::load_policy_str;
use airlock_tests::{HANG_GUARD, host_processes_with, sandbox_available, wait_until_async};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_running_call_kills_its_worker() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let supervisor = airlock_tests::supervisor();
    let policy = load_policy_str(
        airlock_policy::presets::preset_text("default").unwrap(),
        "default",
    )
    .unwrap();
    let marker = airlock_tests::sleep_marker();
    let run = SandboxRun {
        call_id: "drop".into(),
        tool: "exec".into(),
        profile: Arc::clone(&policy.policy.profiles["default"]),
        argv: vec!["/bin/sleep".into(), marker.clone()],
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout: HANG_GUARD,
        inherit_stdio: None,
        builtin: None,
    };
    let pattern = format!("sleep {marker}");
    // Dropped once its tool runs: the select drops the call's future.
    tokio::select! {
        result = supervisor.run(run, None) => panic!("the call ended by itself: {result:?}"),
        () = wait_until_async("the tool runs", || !host_processes_with(&pattern).is_empty()) => {}
    }
    // The worker got SIGKILL, and PID 1's death takes the tool along.
    wait_until_async("the dropped call's tool is gone", || {
        host_processes_with(&pattern).is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_call_returns_cancelled_and_kills_the_tree() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let supervisor = airlock_tests::supervisor();
    let policy = load_policy_str(
        airlock_policy::presets::preset_text("default").unwrap(),
        "default",
    )
    .unwrap();
    let marker = airlock_tests::sleep_marker();
    let run = SandboxRun {
        call_id: "cancel".into(),
        tool: "exec".into(),
        profile: Arc::clone(&policy.policy.profiles["default"]),
        argv: vec!["/bin/sleep".into(), marker.clone()],
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        // Only the cancel can end it: a broken one shows as `timeout` (at the hang guard).
        timeout: HANG_GUARD,
        inherit_stdio: None,
        builtin: None,
    };
    let pattern = format!("sleep {marker}");
    let signal = airlock::CancelSignal::new();
    let call = supervisor.run(run, Some(&signal));
    tokio::pin!(call);
    tokio::select! {
        result = &mut call => panic!("the call ended before it was cancelled: {result:?}"),
        () = wait_until_async("the tool runs", || !host_processes_with(&pattern).is_empty()) => {}
    }
    signal.cancel();
    let result = call.await;
    assert_eq!(
        result.error.as_ref().map(|e| e.kind),
        Some(airlock::ErrorKind::Cancelled),
        "{result:?}"
    );
    // The answer may come before the killed worker is reaped.
    wait_until_async("the cancelled call's tool is gone", || {
        host_processes_with(&pattern).is_empty()
    })
    .await;
}
