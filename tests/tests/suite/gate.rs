//! The gate, end to end on real sandboxes: decisions name their rule, plan mode, two-phase
//! approvals (the race, expiry, policy reload), retries, rate limits, dry runs, and secrets
//! that never reach an audit record, an event or a log line.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use airlock::audit::AuditSink;
use airlock::gate::{ApprovalCallback, ApprovalRequest, Clock};
use airlock::{CallOptions, ErrorKind, Gate, ToolCall};
use airlock_policy::load_policy_str;
use airlock_policy::validate::ToolState;
use airlock_tests::sandbox_available;

const POLICY: &str = r#"
version = 1
default_decision = "allow"

[rate_limits]
tool = "1000/1s"

[approvals]
ttl = "1m"

[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = { "/tmp" = "16MiB" }
# airlock_tests::HANG_GUARD: no call here is meant to reach its deadline, however slow the
# machine.
limits = { timeout = "300s" }

[tools.echo]
description = "echo a text"
command = ["/bin/echo", "{text}"]
side_effect = "read"
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"], additionalProperties = false }

[tools.shell]
description = "a shell"
builtin = "bash"

[tools.flaky]
description = "always fails"
command = ["/bin/sh", "-c", "exit 3"]
side_effect = "read"
retries = 2
input = { type = "object" }

[tools.limited]
description = "rate limited"
command = ["/bin/true"]
side_effect = "read"
rate_limit = "2/1h"
input = { type = "object" }

[tools.guarded]
description = "needs a human"
command = ["/bin/echo", "{text}"]
side_effect = "write"
approval = "human"
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }

[[rules]]
name = "no-dangerous-shell"
match = "pattern"
tools = ["shell"]
field = "command"
preset = "dangerous_shell"
decision = "deny"

[[rules]]
name = "shell-is-reviewed"
match = "tool"
tools = ["shell"]
decision = "review"
"#;

/// A clock tests can move.
#[derive(Debug)]
struct FakeClock(Mutex<SystemTime>);

impl Clock for FakeClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap()
    }
}

impl FakeClock {
    fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }
}

/// A Write that appends to a shared buffer.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn gate_with(clock: Option<Arc<FakeClock>>) -> Gate {
    let supervisor = airlock_tests::supervisor();
    let policy = load_policy_str(POLICY, "gate.toml").unwrap().policy;
    let gate = Gate::new(Arc::new(supervisor), policy);
    match clock {
        Some(clock) => gate.with_clock(clock),
        None => gate,
    }
}

fn call(tool: &str, arguments: serde_json::Value) -> ToolCall {
    ToolCall {
        call_id: format!("call-{tool}"),
        tool: tool.into(),
        arguments: arguments.to_string(),
    }
}

fn kind(result: &airlock::ToolResult) -> Option<ErrorKind> {
    result.error.as_ref().map(|e| e.kind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_name_the_rule_and_reviews_need_approval() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let gate = gate_with(None);
    let opts = CallOptions::default();
    let denied = gate
        .call(
            &call("shell", serde_json::json!({"command": "rm -rf /"})),
            &opts,
        )
        .await;
    assert_eq!(kind(&denied), Some(ErrorKind::Denied));
    assert_eq!(
        denied.error.unwrap().rule.as_deref(),
        Some("no-dangerous-shell")
    );
    let review = gate
        .call(&call("shell", serde_json::json!({"command": "ls"})), &opts)
        .await;
    assert_eq!(kind(&review), Some(ErrorKind::ApprovalRequired));
    assert_eq!(
        review.error.unwrap().rule.as_deref(),
        Some("shell-is-reviewed")
    );
    let human = gate
        .call(&call("guarded", serde_json::json!({"text": "x"})), &opts)
        .await;
    assert_eq!(kind(&human), Some(ErrorKind::ApprovalRequired));
    let ok = gate
        .call(&call("echo", serde_json::json!({"text": "hello"})), &opts)
        .await;
    assert!(ok.ok, "{ok:?}");
    assert_eq!(ok.stdout, "hello\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_unknown_or_inactive_tools_never_reach_a_sandbox() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let gate = gate_with(None);
    let opts = CallOptions::default();
    for arguments in [
        "not json",
        "{\"text\": 5}",
        &"[".repeat(1000),
        &format!("{{\"text\": \"{}\"}}", "x".repeat(2 << 20)),
    ] {
        let result = gate
            .call(
                &ToolCall {
                    call_id: "c".into(),
                    tool: "echo".into(),
                    arguments: arguments.to_string(),
                },
                &opts,
            )
            .await;
        assert_eq!(
            kind(&result),
            Some(ErrorKind::InvalidInput),
            "{arguments:.40}"
        );
        assert_eq!(result.attempts, 0);
    }
    let unknown = gate.call(&call("nope", serde_json::json!({})), &opts).await;
    assert_eq!(kind(&unknown), Some(ErrorKind::UnknownTool));
    let state_of = |name: &str| {
        gate.tools()
            .into_iter()
            .find(|t| t.name == name)
            .map(|t| t.state)
    };
    for state in [ToolState::Suspended, ToolState::Deferred] {
        assert!(gate.set_state("echo", state));
        let unavailable = gate
            .call(&call("echo", serde_json::json!({"text": "x"})), &opts)
            .await;
        assert_eq!(kind(&unavailable), Some(ErrorKind::ToolUnavailable));
        assert_eq!(unavailable.error.unwrap().state, Some(state));
        assert_eq!(unavailable.attempts, 0);
        assert_eq!(state_of("echo"), Some(state));
    }
    assert!(gate.set_state("echo", ToolState::Active));
    assert_eq!(state_of("echo"), Some(ToolState::Active));
    assert!(!gate.set_state("nope", ToolState::Active));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_mode_refuses_every_tool_that_is_not_read_only() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let gate = gate_with(None);
    let plan = CallOptions {
        plan_mode: true,
        ..Default::default()
    };
    let refused = gate
        .call(&call("guarded", serde_json::json!({"text": "x"})), &plan)
        .await;
    assert_eq!(kind(&refused), Some(ErrorKind::Denied));
    assert_eq!(refused.error.unwrap().rule.as_deref(), Some("plan_mode"));
    let read = gate
        .call(&call("echo", serde_json::json!({"text": "x"})), &plan)
        .await;
    assert!(read.ok, "{read:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_executes_of_one_approval_run_exactly_once() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let gate = Arc::new(gate_with(None));
    let approval = gate
        .propose(
            &call("guarded", serde_json::json!({"text": "once"})),
            &CallOptions::default(),
        )
        .unwrap();
    assert_eq!(approval.approval_id.len(), 32);
    let mut handles = Vec::new();
    for _ in 0..8 {
        let gate = Arc::clone(&gate);
        let id = approval.approval_id.clone();
        handles.push(tokio::spawn(async move {
            gate.execute(&id, &CallOptions::default()).await
        }));
    }
    let mut ran = 0;
    for handle in handles {
        let result = handle.await.unwrap();
        match kind(&result) {
            None => {
                ran += 1;
                assert_eq!(result.stdout, "once\n");
            }
            Some(ErrorKind::ApprovalInvalid) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(ran, 1);
    let json = serde_json::to_value(&approval).unwrap();
    for field in [
        "approval_id",
        "tool",
        "input_digest",
        "argv_preview",
        "arguments",
        "builtin",
        "profile",
        "timeout_ms",
        "reason",
        "policy_version",
        "tool_version",
        "expires_at_ms",
    ] {
        assert!(json.get(field).is_some(), "{field}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_expire_are_single_use_and_die_with_a_policy_reload() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let clock = Arc::new(FakeClock(Mutex::new(SystemTime::now())));
    let gate = gate_with(Some(Arc::clone(&clock)));
    let opts = CallOptions::default();
    let expiring = gate
        .propose(&call("guarded", serde_json::json!({"text": "late"})), &opts)
        .unwrap();
    clock.advance(Duration::from_secs(61));
    let late = gate.execute(&expiring.approval_id, &opts).await;
    assert_eq!(kind(&late), Some(ErrorKind::ApprovalInvalid));
    assert!(late.error.unwrap().message.contains("expired"));
    assert_eq!(gate.pending_approvals(), 0);

    let reloaded = gate
        .propose(&call("guarded", serde_json::json!({"text": "x"})), &opts)
        .unwrap();
    let rejected = gate
        .propose(&call("guarded", serde_json::json!({"text": "y"})), &opts)
        .unwrap();
    assert!(gate.reject(&rejected.approval_id));
    assert!(!gate.reject(&rejected.approval_id));
    // A reload that leaves the tool and its profile as they were keeps the approval.
    gate.reload(
        load_policy_str(&format!("{POLICY}\n# changed\n"), "gate.toml")
            .unwrap()
            .policy,
    );
    let kept = gate.execute(&reloaded.approval_id, &opts).await;
    assert_eq!(kind(&kept), None, "{kept:?}");
    // One that changes what the tool runs does not.
    let changing = gate
        .propose(&call("guarded", serde_json::json!({"text": "z"})), &opts)
        .unwrap();
    let changed = POLICY.replacen(
        r#"description = "needs a human"
command = ["/bin/echo", "{text}"]"#,
        r#"description = "needs a human"
command = ["/bin/echo", "-n", "{text}"]"#,
        1,
    );
    assert_ne!(changed, POLICY);
    gate.reload(load_policy_str(&changed, "gate.toml").unwrap().policy);
    let stale = gate.execute(&changing.approval_id, &opts).await;
    assert_eq!(kind(&stale), Some(ErrorKind::ApprovalInvalid));
    assert!(stale.error.unwrap().message.contains("changed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_approvals_hold_a_bounded_number_of_bytes() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // Each proposal below holds its 20 KiB text several times (parsed, canonical, argv).
    let gate = gate_with(None).with_max_approval_bytes(256 << 10);
    let opts = CallOptions::default();
    let big = || call("guarded", serde_json::json!({"text": "x".repeat(20 << 10)}));
    let mut held = Vec::new();
    let refused = loop {
        match gate.propose(&big(), &opts) {
            Ok(approval) => held.push(approval),
            Err(result) => break result,
        }
        assert!(
            held.len() < 64,
            "the store took far more than its bytes allow"
        );
    };
    assert!(!held.is_empty());
    assert_eq!(kind(&refused), Some(ErrorKind::Overloaded), "{refused:?}");
    assert_eq!(gate.pending_approvals(), held.len());
    // What an execute, a reject or an expiry gives back is room for another.
    assert!(gate.reject(&held[0].approval_id));
    assert!(gate.propose(&big(), &opts).is_ok());
    // One that could never fit is told so, not to retry.
    let huge = call(
        "guarded",
        serde_json::json!({"text": "x".repeat(300 << 10)}),
    );
    let never = gate.propose(&huge, &opts).unwrap_err();
    assert_eq!(kind(&never), Some(ErrorKind::InvalidInput), "{never:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_shows_what_will_run_and_another_session_can_neither_move_nor_burn_it() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let gate = gate_with(None);
    let proposer = CallOptions {
        session: Some("proposer".into()),
        ..Default::default()
    };
    let approval = gate
        .propose(
            &call("guarded", serde_json::json!({"text": "hi"})),
            &proposer,
        )
        .unwrap();
    assert_eq!(approval.arguments, serde_json::json!({"text": "hi"}));
    assert_eq!(approval.argv_preview, ["/bin/echo", "hi"]);
    assert_eq!(approval.builtin, None);
    assert_eq!(approval.session.as_deref(), Some("proposer"));
    assert_eq!(approval.rule, "approval");
    assert!(approval.reason.contains("guarded"), "{}", approval.reason);
    assert_eq!(approval.input_digest.len(), 64);
    // The executor cannot move the call to another session's budget.
    let elsewhere = CallOptions {
        session: Some("other".into()),
        ..Default::default()
    };
    let moved = gate.execute(&approval.approval_id, &elsewhere).await;
    assert_eq!(kind(&moved), Some(ErrorKind::ApprovalInvalid));
    assert!(moved.error.unwrap().message.contains("session"));
    // ... nor burn it: the approval is still there for its own session.
    let proposers = CallOptions {
        session: Some("proposer".into()),
        ..Default::default()
    };
    let ran = gate.execute(&approval.approval_id, &proposers).await;
    assert!(ran.ok, "{ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_digests_are_keyed_per_gate() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let input = serde_json::json!({"text": "a guessable secret"});
    let a = gate_with(None)
        .propose(&call("guarded", input.clone()), &CallOptions::default())
        .unwrap();
    let b = gate_with(None)
        .propose(&call("guarded", input.clone()), &CallOptions::default())
        .unwrap();
    assert_ne!(
        a.input_digest, b.input_digest,
        "two gates must not digest the same input alike"
    );
    let key = airlock::approvals::DigestKey::from_bytes([1; 32]);
    assert_eq!(a.arguments, b.arguments);
    assert_eq!(key.input_digest("guarded", &input).len(), 64);
}

#[derive(Debug)]
struct Approver(bool);

impl ApprovalCallback for Approver {
    fn approve(&self, request: &ApprovalRequest<'_>) -> bool {
        assert_eq!(request.tool, "guarded");
        self.0
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_callback_replaces_the_two_phase_flow() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let yes = gate_with(None).with_approval_callback(Arc::new(Approver(true)));
    let result = yes
        .call(
            &call("guarded", serde_json::json!({"text": "ok"})),
            &CallOptions::default(),
        )
        .await;
    assert!(result.ok, "{result:?}");
    let no = gate_with(None).with_approval_callback(Arc::new(Approver(false)));
    let result = no
        .call(
            &call("guarded", serde_json::json!({"text": "ok"})),
            &CallOptions::default(),
        )
        .await;
    assert_eq!(kind(&result), Some(ErrorKind::Denied));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_tools_are_retried_in_fresh_workers_up_to_the_limit() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let gate = gate_with(None);
    let mut events = gate.subscribe();
    let result = gate
        .call(
            &call("flaky", serde_json::json!({})),
            &CallOptions::default(),
        )
        .await;
    assert_eq!(kind(&result), Some(ErrorKind::ToolFailed));
    assert_eq!(result.attempts, 3);
    assert_eq!(result.exit_code, Some(3));
    let mut failed = 0;
    while let Ok(event) = events.try_recv() {
        if event.event == airlock::audit::EventKind::Failed {
            failed += 1;
        }
    }
    assert_eq!(failed, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_refuse_calls_beyond_the_bucket() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let gate = gate_with(None);
    let opts = CallOptions::default();
    assert!(
        gate.call(&call("limited", serde_json::json!({})), &opts)
            .await
            .ok
    );
    assert!(
        gate.call(&call("limited", serde_json::json!({})), &opts)
            .await
            .ok
    );
    let third = gate
        .call(&call("limited", serde_json::json!({})), &opts)
        .await;
    assert_eq!(kind(&third), Some(ErrorKind::RateLimited));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_decides_and_resolves_but_runs_nothing() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let gate = gate_with(None);
    let mut events = gate.subscribe();
    let plan = gate
        .dry_run(
            &call("echo", serde_json::json!({"text": "a; rm -rf /"})),
            &CallOptions::default(),
        )
        .unwrap();
    assert_eq!(plan.argv, vec!["/bin/echo", "a; rm -rf /"]);
    assert_eq!(plan.rule, "default");
    assert_eq!(plan.profile, "default");
    let denied = gate
        .dry_run(
            &call(
                "shell",
                serde_json::json!({"command": "mkfs.ext4 /dev/sda"}),
            ),
            &CallOptions::default(),
        )
        .unwrap();
    assert_eq!(denied.rule, "no-dangerous-shell");
    assert!(events.try_recv().is_err(), "a dry run emits no event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_in_arguments_reach_no_audit_record_event_or_log_line() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let logs = crate::logs::Capture::start();
    let marker = "SECRET-MARKER-7f3a9c";
    let audit = Buffer::default();
    let gate = gate_with(None).with_audit(AuditSink::to_writer(Box::new(audit.clone())));
    let mut events = gate.subscribe();
    let opts = CallOptions {
        session: Some("s1".into()),
        ..Default::default()
    };
    let calls = [
        call("echo", serde_json::json!({"text": marker})),
        call("echo", serde_json::json!({"text": 5, "extra": marker})),
        call(
            "shell",
            serde_json::json!({"command": format!("rm -rf / {marker}")}),
        ),
        call("guarded", serde_json::json!({"text": marker})),
        call("flaky", serde_json::json!({"x": marker})),
    ];
    for c in &calls {
        let result = gate.call(c, &opts).await;
        if let Some(error) = &result.error {
            assert!(!error.message.contains(marker), "{error:?}");
        }
    }
    let approval = gate
        .propose(&call("guarded", serde_json::json!({"text": marker})), &opts)
        .unwrap();
    let _ = gate.execute(&approval.approval_id, &opts).await;
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(serde_json::to_string(&event).unwrap());
    }
    for line in audit.text().lines() {
        let record: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(
            record["event"].is_string() && record["call_id"].is_string(),
            "{line}"
        );
    }
    assert!(seen.len() >= 8, "{seen:?}");
    assert!(!audit.text().is_empty());
    assert!(!audit.text().contains(marker), "audit: {}", audit.text());
    for event in &seen {
        assert!(!event.contains(marker), "event: {event}");
    }
    assert!(
        logs.text().contains("worker"),
        "the log capture saw nothing"
    );
    assert!(
        !logs.text().contains(marker),
        "a log line carried the secret"
    );
}
