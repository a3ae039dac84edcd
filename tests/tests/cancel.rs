//! Caller cancellation: an explicit cancel returns `cancelled`, and dropping the call's
//! future kills the worker; either way the whole tool tree dies.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::SandboxRun;
use airlock_policy::load_policy_str;
use airlock_tests::sandbox_available;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_running_call_kills_its_worker() {
    if !sandbox_available() {
        return;
    }
    let supervisor = airlock_tests::supervisor();
    let policy = load_policy_str(
        airlock_policy::presets::preset_text("default").unwrap(),
        "default",
    )
    .unwrap();
    let marker = format!("3{}.75", std::process::id());
    let run = SandboxRun {
        call_id: "drop".into(),
        tool: "exec".into(),
        profile: Arc::clone(&policy.policy.profiles["default"]),
        argv: vec!["/bin/sleep".into(), marker.clone()],
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout: Duration::from_secs(30),
        inherit_stdio: None,
        builtin: None,
    };
    let call = supervisor.run(run, None);
    let _ = tokio::time::timeout(Duration::from_millis(500), call).await;
    // The future was dropped: the worker got SIGKILL, and PID 1's death takes the tool along.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(airlock_tests::host_processes_with(&format!("sleep {marker}")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_call_returns_cancelled_and_kills_the_tree() {
    if !sandbox_available() {
        return;
    }
    let supervisor = airlock_tests::supervisor();
    let policy = load_policy_str(
        airlock_policy::presets::preset_text("default").unwrap(),
        "default",
    )
    .unwrap();
    let marker = format!("4{}.75", std::process::id());
    let run = SandboxRun {
        call_id: "cancel".into(),
        tool: "exec".into(),
        profile: Arc::clone(&policy.policy.profiles["default"]),
        argv: vec!["/bin/sleep".into(), marker.clone()],
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout: Duration::from_secs(30),
        inherit_stdio: None,
        builtin: None,
    };
    let signal = airlock::CancelSignal::new();
    let trigger = signal.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let started = Instant::now();
    let result = supervisor.run(run, Some(&signal)).await;
    assert_eq!(
        result.error.as_ref().map(|e| e.kind),
        Some(airlock::ErrorKind::Cancelled),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(airlock_tests::host_processes_with(&format!("sleep {marker}")).is_empty());
}
