//! Network namespaces recycled between `network = "none"` workers, one worker at a time:
//! what a call can find there of the calls before it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use airlock_tests::{Scratch, sandbox_available, wait_until_async};

/// Network namespaces are recycled between `network = "none"` workers, one worker at a
/// time: a call finds nothing of the calls before it there — no socket they left, not
/// even sockets still in flight in a queue when their process died, and every abstract
/// name free. As root the namespace is seen to be reused; elsewhere each worker makes its
/// own and the same holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycled_network_namespace_shows_nothing_of_the_calls_before() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    use std::sync::Arc;

    use airlock::{CallOptions, Gate, Supervisor, SupervisorOptions, ToolCall};

    let scratch = Scratch::new("net-recycled");
    let probe = scratch.stage("airlock-probe");
    let tool = |name: &str, attack: &str| {
        format!(
            "[tools.{name}]\ndescription = \"probe\"\ncommand = [{:?}, {attack:?}, \"{{name}}\"]\nside_effect = \"read\"\ninput = {{ type = \"object\", properties = {{ name = {{ type = \"string\" }} }}, required = [\"name\"] }}\n",
            probe.display().to_string()
        )
    };
    let text = format!(
        "version = 1\n[profiles.default]\nread = [\"/usr\", {:?}]\nread_optional = [\"/bin\", \"/lib\", \"/lib64\", \"/etc/ld.so.cache\"]\nnetwork = \"none\"\nlimits = {{ timeout = {} }}\n\n{}\n{}",
        probe.parent().unwrap().display().to_string(),
        airlock_tests::hang_guard_toml(),
        tool("bind", "abstract-bind"),
        tool("plant", "abstract-inflight"),
    );
    let policy = airlock_policy::load_policy_str(&text, "recycled.toml")
        .unwrap()
        .policy;
    let supervisor = Arc::new(
        Supervisor::start(SupervisorOptions {
            worker_program: Some((airlock_tests::airlock_bin(), Vec::new())),
            ..Default::default()
        })
        .unwrap(),
    );
    let gate = Gate::new(Arc::clone(&supervisor), policy);
    let name = format!("airlock-recycled-{}", std::process::id());
    // Each call's worker is reaped and its namespace shelved before the next one starts.
    let call = |tool: &'static str| {
        let (gate, supervisor, name) = (&gate, &supervisor, name.clone());
        async move {
            let call = ToolCall {
                call_id: tool.into(),
                tool: tool.into(),
                arguments: serde_json::json!({ "name": name }).to_string(),
            };
            let result = gate.call(&call, &CallOptions::default()).await;
            wait_until_async("the call's worker is cleaned up", || {
                supervisor.calls_in_flight() == 0
            })
            .await;
            assert!(result.ok, "{result:?}");
            result.stdout.trim().to_string()
        }
    };
    let first = call("bind").await;
    let (found, first_netns) = first.rsplit_once(' ').unwrap();
    assert_eq!(found, "sockets=0 bind=ok", "{first}");
    let planted = call("plant").await;
    let (outcome, planted_netns) = planted.rsplit_once(' ').unwrap();
    assert_eq!(outcome, "inflight=ok", "{planted}");
    for _ in 0..3 {
        let next = call("bind").await;
        let (found, _) = next.rsplit_once(' ').unwrap();
        assert_eq!(found, "sockets=0 bind=ok", "{next}");
    }
    let counts = supervisor.network_namespace_counts();
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(planted_netns, first_netns, "{counts:?}");
        assert!(counts.reused >= 1, "{counts:?}");
    } else {
        assert_ne!(planted_netns, first_netns, "{counts:?}");
    }
    let host_netns = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_ne!(first_netns, host_netns.display().to_string());
    supervisor.close().await;
}

/// A one-shot supervisor (`airlock exec`, `run`) makes its worker's network namespace as it
/// starts, while its caller still loads the policy: the call then takes that one from the
/// shelf instead of making one, and finds it as empty as a fresh one. Unprivileged, none
/// is made ahead and the worker gets its own from clone, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_supervisor_makes_its_workers_namespace_ahead() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    use airlock::{CallOptions, Gate, Supervisor, SupervisorOptions, ToolCall};

    let scratch = Scratch::new("net-ahead");
    let probe = scratch.stage("airlock-probe");
    let text = format!(
        "version = 1\n[profiles.default]\nread = [\"/usr\", {:?}]\nread_optional = [\"/bin\", \"/lib\", \"/lib64\", \"/etc/ld.so.cache\"]\nnetwork = \"none\"\nlimits = {{ timeout = {} }}\n\n[tools.bind]\ndescription = \"probe\"\ncommand = [{:?}, \"abstract-bind\", \"{{name}}\"]\nside_effect = \"read\"\ninput = {{ type = \"object\", properties = {{ name = {{ type = \"string\" }} }}, required = [\"name\"] }}\n",
        probe.parent().unwrap().display().to_string(),
        airlock_tests::hang_guard_toml(),
        probe.display().to_string(),
    );
    let policy = airlock_policy::load_policy_str(&text, "ahead.toml")
        .unwrap()
        .policy;
    let supervisor = std::sync::Arc::new(
        Supervisor::start(SupervisorOptions {
            worker_program: Some((airlock_tests::airlock_bin(), Vec::new())),
            one_shot: true,
            ..Default::default()
        })
        .unwrap(),
    );
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        wait_until_async("a namespace is made ahead", || {
            supervisor.network_namespace_counts().made == 1
        })
        .await;
    }
    let gate = Gate::new(std::sync::Arc::clone(&supervisor), policy);
    let call = ToolCall {
        call_id: "ahead".into(),
        tool: "bind".into(),
        arguments: serde_json::json!({ "name": format!("airlock-ahead-{}", std::process::id()) })
            .to_string(),
    };
    let result = gate.call(&call, &CallOptions::default()).await;
    assert!(result.ok, "{result:?}");
    let stdout = result.stdout.trim().to_string();
    let (found, netns) = stdout.rsplit_once(' ').unwrap();
    assert_eq!(found, "sockets=0 bind=ok", "{stdout}");
    let host_netns = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_ne!(netns, host_netns.display().to_string());
    let counts = supervisor.network_namespace_counts();
    if root {
        assert_eq!((counts.made, counts.reused), (1, 1), "{counts:?}");
    } else {
        assert_eq!(counts.made, 0, "{counts:?}");
    }
    supervisor.close().await;
}
