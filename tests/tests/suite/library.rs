//! The Rust library as a gateway uses it: the worker entry hook in a gateway binary, the
//! `Sandbox` trait over both backends, the explicitly unsafe local backend, and `close`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use airlock::{Acknowledgement, CallOptions, CancelSignal, Gate, Sandbox, ToolCall, UnsafeLocal};
use airlock_policy::load_policy_str;
use airlock_tests::{HANG_GUARD, host_processes_with, sandbox_available, wait_until_async};

const POLICY: &str = r#"version = 1
[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache"]
tmpfs = { "/tmp" = "16MiB" }
# airlock_tests::HANG_GUARD: calls end by their own event (a cancel, close), however slow
# the machine.
limits = { timeout = "300s" }

[tools.echo]
description = "echo a text"
command = ["/bin/echo", "{text}"]
side_effect = "read"
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }

[tools.sleep]
description = "sleep"
command = ["/bin/sleep", "{seconds}"]
side_effect = "read"
input = { type = "object", properties = { seconds = { type = "string" } }, required = ["seconds"] }
"#;

#[test]
fn a_gateway_binary_with_the_entry_hook_runs_its_own_workers() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let out = std::process::Command::new(airlock_tests::fixture_bin("airlock-gateway-example"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["stdout"], "hello from gateway\n");
    assert_eq!(result["isolation"]["backend"], "airlock");
    assert_eq!(
        result["isolation"]["namespaces"].as_array().unwrap().len(),
        7
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_backends_plug_in_behind_the_sandbox_trait_and_say_which_they_are() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let policy = || load_policy_str(POLICY, "lib.toml").unwrap().policy;
    let supervisor = Arc::new(airlock_tests::supervisor());
    let backends: Vec<Box<dyn Sandbox>> = vec![
        Box::new(Gate::new(supervisor, policy())),
        Box::new(UnsafeLocal::new(
            policy(),
            Acknowledgement::ToolsRunOnTheHostWithoutIsolation,
        )),
    ];
    let call = ToolCall {
        call_id: "b".into(),
        tool: "echo".into(),
        arguments: r#"{"text": "hi"}"#.into(),
    };
    for backend in &backends {
        assert_eq!(backend.tools().len(), 2);
        let result = backend.call(&call, &CallOptions::default()).await;
        assert!(result.ok, "{}: {result:?}", backend.backend());
        assert_eq!(result.stdout, "hi\n");
        let isolation = result.isolation.as_ref().unwrap();
        assert_eq!(isolation.backend, backend.backend());
        if backend.backend() == "unsafe_local" {
            assert!(isolation.namespaces.is_empty());
            assert!(isolation.seccomp.is_none());
        } else {
            assert!(!isolation.namespaces.is_empty());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_cancels_running_calls_and_leaves_nothing_behind() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let supervisor = Arc::new(airlock_tests::supervisor());
    let gate = Arc::new(Gate::new(
        Arc::clone(&supervisor),
        load_policy_str(POLICY, "lib.toml").unwrap().policy,
    ));
    let marker = airlock_tests::sleep_marker();
    let running = {
        let gate = Arc::clone(&gate);
        let marker = marker.clone();
        tokio::spawn(async move {
            let call = ToolCall {
                call_id: "long".into(),
                tool: "sleep".into(),
                arguments: serde_json::json!({"seconds": marker}).to_string(),
            };
            gate.call(
                &call,
                &CallOptions {
                    cancel: Some(CancelSignal::new()),
                    ..Default::default()
                },
            )
            .await
        })
    };
    wait_until_async("the tool runs", || {
        !host_processes_with(&format!("sleep {marker}")).is_empty()
    })
    .await;
    supervisor.close().await;
    let result = running.await.unwrap();
    assert_eq!(
        result.error.as_ref().map(|e| e.kind),
        Some(airlock::ErrorKind::Cancelled),
        "{result:?}"
    );
    assert!(host_processes_with(&format!("sleep {marker}")).is_empty());
    let after = gate
        .call(
            &ToolCall {
                call_id: "late".into(),
                tool: "echo".into(),
                arguments: r#"{"text": "x"}"#.into(),
            },
            &CallOptions::default(),
        )
        .await;
    assert_eq!(
        after.error.as_ref().map(|e| e.kind),
        Some(airlock::ErrorKind::Cancelled)
    );
}

/// The embedding process's own orphans are not adopted: a subreaper that never reaps them
/// would keep each one as a zombie for as long as the gateway runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_supervisor_does_not_adopt_the_gateways_orphans() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let supervisor = airlock_tests::supervisor();
    // The gateway runs a helper that leaves a grandchild behind and exits. The grandchild
    // must not hold the stdout pipe, or `output` would wait for it to end. It sleeps until
    // killed below, however long this takes on a slow machine.
    let script = format!(
        "/bin/sleep {} </dev/null >/dev/null 2>&1 & echo $!",
        HANG_GUARD.as_secs()
    );
    let out = std::process::Command::new("/bin/sh")
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(out.status.success());
    let orphan: u32 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let parent_of = |pid: u32| -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse().ok())
    };
    // Re-parenting happens as its parent exits, which `output` waited for.
    let parent = parent_of(orphan).expect("the orphan sleeps until killed");
    // SAFETY: a plain syscall; the pid is the sleep started above, alive a moment ago.
    unsafe { libc::kill(orphan as i32, libc::SIGKILL) };
    assert_ne!(
        parent,
        std::process::id(),
        "the supervisor's process adopted an orphan of the gateway"
    );
    supervisor.close().await;
}
