//! Calls of workspace tools through a library gate: one naming no open session is refused
//! and audited as refused before it starts, and takes no rate-limit token.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use airlock::audit::EventKind;
use airlock_tests::{Scratch, sandbox_available};
use serde_json::json;

const POLICY: &str = r#"version = 1
[sessions]
max_sessions = 2
max_size = "1MiB"

[profiles.workspace]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
# airlock_tests::HANG_GUARD
limits = { timeout = "300s" }
workspace = "/workspace"
workspace_size = "64KiB"
cwd = "/workspace"

[tools.sh]
description = "run a script in the workspace"
profile = "workspace"
command = ["/bin/sh", "-c", "{script}"]
side_effect = "write"
concurrency_safe = true
rate_limit = "1/1h"
input = { type = "object", properties = { script = { type = "string" } }, required = ["script"] }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_naming_no_open_session_is_audited_as_refused_and_takes_no_token() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("session-calls");
    let policy = airlock_policy::load_policy_str(POLICY, "p.toml")
        .unwrap()
        .policy;
    let bounds = policy.sessions.clone();
    let supervisor = Arc::new(airlock_tests::supervisor());
    let sessions = Arc::new(
        airlock::Sessions::new(
            &scratch.0.join("sessions"),
            supervisor.sandbox_ids(),
            Arc::new(airlock::gate::SystemClock),
        )
        .unwrap(),
    );
    let gate =
        airlock::Gate::new(Arc::clone(&supervisor), policy).with_sessions(Arc::clone(&sessions));
    let mut events = gate.subscribe();
    let call = |id: &str| airlock::ToolCall {
        call_id: id.into(),
        tool: "sh".into(),
        arguments: json!({"script": "echo ran"}).to_string(),
    };
    let in_session = |session: &str| airlock::CallOptions {
        session: Some(session.into()),
        ..Default::default()
    };

    let refused = gate
        .call(&call("unknown"), &in_session("no-such-session"))
        .await;
    assert_eq!(
        refused.error.as_ref().map(|e| e.kind),
        Some(airlock::ErrorKind::SessionUnknown),
        "{refused:?}"
    );
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push((event.event, event.outcome));
    }
    assert_eq!(
        seen,
        vec![(EventKind::Refused, Some("session_unknown".to_string()))],
        "one refusal, and no call that started and never ended"
    );

    // The refused call took no token of the tool's one per hour.
    let opened = sessions.open(&bounds, None, None, 1 << 20).unwrap();
    let ran = gate
        .call(&call("known"), &in_session(&opened.session))
        .await;
    assert!(ran.ok, "{ran:?}");
    sessions.close(&opened.session).unwrap();
    supervisor.close().await;
}
