//! Hostile workers: the supervisor execs a worker that breaks the protocol, and must kill it
//! and answer `protocol_violation` (or `timeout` for one that goes silent) — never panic,
//! never hang, never grow without bound — and leave nothing behind.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::SandboxRun;
use airlock_policy::load_policy_str;
use airlock_tests::{HANG_GUARD, sandbox_available};

fn run_for(timeout: Duration) -> SandboxRun {
    let policy = load_policy_str(
        airlock_policy::presets::preset_text("default").unwrap(),
        "default",
    )
    .unwrap();
    SandboxRun {
        call_id: "c1".into(),
        tool: "exec".into(),
        profile: Arc::clone(&policy.policy.profiles["default"]),
        argv: vec!["/bin/true".into()],
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout,
        inherit_stdio: None,
        builtin: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_frames_give_protocol_violation_and_a_killed_worker() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let modes = [
        "huge-prefix",
        "garbage",
        "bad-version",
        "out-of-order",
        "trailing",
        "truncated",
        "length-bomb",
        "log-flood",
        "oversized-report",
        "report-twice",
    ];
    let mut failures = Vec::new();
    for mode in modes {
        let supervisor = airlock_tests::supervisor_with_hostile_worker(mode);
        let started = Instant::now();
        // The worker lingers until the supervisor hangs up, so a violation that went
        // unnoticed would end at the deadline as `timeout`: the kind, not the time taken,
        // tells them apart.
        let result = supervisor.run(run_for(HANG_GUARD), None).await;
        let kind = result.error.as_ref().map(|e| e.kind);
        eprintln!(
            "{mode:<18} → {:?} in {:?}: {}",
            kind,
            started.elapsed(),
            result
                .error
                .as_ref()
                .map(|e| e.message.as_str())
                .unwrap_or("")
        );
        if kind != Some(airlock::ErrorKind::ProtocolViolation) {
            failures.push(format!("{mode}: {result:?}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_worker_is_killed_at_the_deadline() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let supervisor = airlock_tests::supervisor_with_hostile_worker("silent");
    // The worker lingers for as long as it is connected, so only the deadline ends the
    // call; how soon after it the answer comes is the machine's.
    let result = supervisor
        .run(run_for(Duration::from_millis(500)), None)
        .await;
    assert_eq!(
        result.error.as_ref().map(|e| e.kind),
        Some(airlock::ErrorKind::Timeout),
        "{result:?}"
    );
}
