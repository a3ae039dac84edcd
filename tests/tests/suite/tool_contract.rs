//! What the gate promises about a tool's metadata, on real sandboxes: the schema a model is
//! shown is the schema enforced, a tool that is not concurrency-safe runs one call at a time
//! per session, destructive tools wait for a human, and no argv value becomes an option.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use airlock::audit::EventKind;
use airlock::{CallOptions, CancelSignal, ErrorKind, Gate, ToolCall};
use airlock_policy::load_policy_str;
use airlock_policy::validate::{Approval, ToolState};
use airlock_tests::{host_processes_with, sandbox_available, wait_until_async};
use serde_json::json;

const POLICY: &str = r#"
version = 1
strict_objects = true

[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = { "/tmp" = "16MiB" }
# airlock_tests::HANG_GUARD: calls end by their own event (a cancel), however slow the
# machine.
limits = { timeout = "300s" }

[tools.echo]
description = "echo a text"
command = ["/bin/echo", "{text}"]
side_effect = "read"
concurrency_safe = true
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }

[tools.pair]
description = "hand two texts back as JSON"
command = ["/bin/cat"]
stdin = "$input"
side_effect = "read"
concurrency_safe = true
retries = 1
output = { type = "object", properties = { a = { type = "string" }, b = { type = "string" } } }
[tools.pair.input]
type = "object"
required = ["a", "b"]
allOf = [
  { properties = { a = { type = "string" } } },
  { properties = { b = { type = "string" } } },
]

[tools.hold]
description = "sleep until cancelled, one call at a time per session"
command = ["/bin/sleep", "{seconds}"]
side_effect = "read"
input = { type = "object", properties = { seconds = { type = "string", pattern = "^[0-9.]+$" } }, required = ["seconds"] }

[tools.touch]
description = "a command that declares no side effect"
command = ["/bin/true"]
input = { type = "object", properties = {} }
"#;

fn gate() -> Gate {
    let policy = load_policy_str(POLICY, "contract.toml").unwrap().policy;
    Gate::new(Arc::new(airlock_tests::supervisor()), policy)
}

fn call(id: &str, tool: &str, arguments: serde_json::Value) -> ToolCall {
    ToolCall {
        call_id: id.into(),
        tool: tool.into(),
        arguments: arguments.to_string(),
    }
}

fn kind(result: &airlock::ToolResult) -> Option<ErrorKind> {
    result.error.as_ref().map(|e| e.kind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_a_model_is_shown_is_the_schema_enforced_and_all_of_stays_satisfiable() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let gate = gate();
    let opts = CallOptions::default();
    let listing = gate.tools().into_iter().find(|t| t.name == "pair").unwrap();
    let enforced = &gate.policy().tools["pair"];
    assert_eq!(listing.input_schema, enforced.tool.input_schema);
    assert_eq!(listing.input_schema["unevaluatedProperties"], json!(false));
    assert_eq!(listing.output_schema, enforced.tool.output_schema);
    assert_eq!(
        listing.output_schema.as_ref().unwrap()["additionalProperties"],
        json!(false)
    );
    assert_eq!(
        (
            listing.approval,
            listing.retries,
            listing.timeout_ms,
            listing.state
        ),
        (Approval::Auto, 1, 300_000, ToolState::Active)
    );

    // Valid input runs (before, closing each allOf branch refused every input)...
    let ran = gate
        .call(&call("p1", "pair", json!({"a": "x", "b": "y"})), &opts)
        .await;
    assert!(ran.ok, "{ran:?}");
    assert_eq!(ran.output, Some(json!({"a": "x", "b": "y"})));
    // ...and what no branch declares is refused before any sandbox.
    let extra = gate
        .call(
            &call("p2", "pair", json!({"a": "x", "b": "y", "c": "z"})),
            &opts,
        )
        .await;
    assert_eq!(kind(&extra), Some(ErrorKind::InvalidInput), "{extra:?}");
    assert_eq!(extra.attempts, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_argv_value_starting_with_a_dash_is_refused_before_any_sandbox() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let gate = gate();
    let opts = CallOptions::default();
    for text in ["--version", "-n", "-e"] {
        let result = gate
            .call(&call("dash", "echo", json!({"text": text})), &opts)
            .await;
        assert_eq!(kind(&result), Some(ErrorKind::InvalidInput), "{text}");
        assert_eq!(result.attempts, 0, "{text}");
        let message = &result.error.unwrap().message;
        assert!(message.contains("\"text\" starts with `-`"), "{message}");
        assert!(
            !message.contains(text),
            "the value is not echoed: {message}"
        );
    }
    let fine = gate
        .call(&call("ok", "echo", json!({"text": "a --b"})), &opts)
        .await;
    assert!(fine.ok, "{fine:?}");
    assert_eq!(fine.stdout, "a --b\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destructive_tool_waits_for_a_human_by_default() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let gate = gate();
    let listing = gate
        .tools()
        .into_iter()
        .find(|t| t.name == "touch")
        .unwrap();
    assert_eq!(listing.approval, Approval::Human);
    let result = gate
        .call(&call("t", "touch", json!({})), &CallOptions::default())
        .await;
    assert_eq!(
        kind(&result),
        Some(ErrorKind::ApprovalRequired),
        "{result:?}"
    );
    assert_eq!(result.attempts, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_is_not_concurrency_safe_runs_one_call_at_a_time_per_session() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let gate = Arc::new(gate());
    let mut events = gate.subscribe();
    // The sleeps of calls 1, 2 and 3.
    let markers: Vec<String> = (0..3).map(|_| airlock_tests::sleep_marker()).collect();
    let marker = |n: usize| markers[n - 1].clone();
    let start = |id: &'static str, session: &str, n: usize| {
        let gate = Arc::clone(&gate);
        let cancel = CancelSignal::new();
        let opts = CallOptions {
            session: Some(session.to_string()),
            cancel: Some(cancel.clone()),
            ..Default::default()
        };
        let seconds = marker(n);
        let task = tokio::spawn(async move {
            gate.call(&call(id, "hold", json!({"seconds": seconds})), &opts)
                .await
        });
        (task, cancel)
    };
    let running = |n: usize| !host_processes_with(&format!("sleep {}", marker(n))).is_empty();

    let (first, first_cancel) = start("first", "s1", 1);
    wait_until_async("the first call runs", || running(1)).await;
    let (second, second_cancel) = start("second", "s1", 2);
    // Another session is not held up: started after the second, it runs beside the first.
    let (other, other_cancel) = start("other", "s2", 3);
    wait_until_async("the other session's call runs", || running(3)).await;
    assert!(!running(2), "two calls of one session ran at once");

    first_cancel.cancel();
    assert_eq!(kind(&first.await.unwrap()), Some(ErrorKind::Cancelled));
    wait_until_async("the second call runs once the first ended", || running(2)).await;
    second_cancel.cancel();
    other_cancel.cancel();
    assert_eq!(kind(&second.await.unwrap()), Some(ErrorKind::Cancelled));
    assert_eq!(kind(&other.await.unwrap()), Some(ErrorKind::Cancelled));

    // In the event stream the second call starts only after the first has ended.
    let mut order = Vec::new();
    while let Ok(event) = events.try_recv() {
        if matches!(event.event, EventKind::Called | EventKind::Failed) {
            order.push((event.call_id.clone(), event.event));
        }
    }
    let at = |id: &str, kind: EventKind| {
        order
            .iter()
            .position(|(i, k)| i == id && *k == kind)
            .unwrap_or_else(|| panic!("no {kind:?} for {id}: {order:?}"))
    };
    assert!(
        at("first", EventKind::Failed) < at("second", EventKind::Called),
        "{order:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_while_it_waits_for_its_turn_never_runs() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let gate = Arc::new(gate());
    let first_marker = airlock_tests::sleep_marker();
    let opts = |cancel: &CancelSignal| CallOptions {
        cancel: Some(cancel.clone()),
        ..Default::default()
    };
    let first_cancel = CancelSignal::new();
    let first = {
        let (gate, opts, seconds) = (Arc::clone(&gate), opts(&first_cancel), first_marker.clone());
        tokio::spawn(async move {
            gate.call(&call("a", "hold", json!({"seconds": seconds})), &opts)
                .await
        })
    };
    wait_until_async("the first call runs", || {
        !host_processes_with(&format!("sleep {first_marker}")).is_empty()
    })
    .await;
    // No session: calls without one share a lane, so leaving it out is no way around it.
    let waiting_cancel = CancelSignal::new();
    let waiting = {
        let (gate, opts) = (Arc::clone(&gate), opts(&waiting_cancel));
        tokio::spawn(async move {
            gate.call(&call("b", "hold", json!({"seconds": "0"})), &opts)
                .await
        })
    };
    waiting_cancel.cancel();
    let waited = waiting.await.unwrap();
    assert_eq!(kind(&waited), Some(ErrorKind::Cancelled), "{waited:?}");
    assert_eq!(waited.attempts, 0);
    assert!(
        waited
            .error
            .unwrap()
            .message
            .contains("not concurrency_safe"),
        "the answer says why it waited"
    );
    first_cancel.cancel();
    assert_eq!(kind(&first.await.unwrap()), Some(ErrorKind::Cancelled));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unsafe_local_backend_refuses_what_would_wait_for_a_human_or_is_not_active() {
    let _guard = airlock_tests::shared();
    use airlock::{Acknowledgement, Sandbox, UnsafeLocal};
    let text = POLICY.replace(
        "[tools.hold]\n",
        "[tools.later]\ndescription = \"not offered yet\"\ncommand = [\"/bin/true\"]\nside_effect = \"read\"\nstate = \"deferred\"\ninput = { type = \"object\" }\n\n[tools.hold]\n",
    );
    let policy = load_policy_str(&text, "contract.toml").unwrap().policy;
    let local = UnsafeLocal::new(policy, Acknowledgement::ToolsRunOnTheHostWithoutIsolation);
    let opts = CallOptions::default();
    let human = local.call(&call("h", "touch", json!({})), &opts).await;
    assert_eq!(kind(&human), Some(ErrorKind::ApprovalRequired), "{human:?}");
    let later = local.call(&call("l", "later", json!({})), &opts).await;
    assert_eq!(kind(&later), Some(ErrorKind::ToolUnavailable), "{later:?}");
    assert_eq!(later.error.unwrap().state, Some(ToolState::Deferred));
    let listed = local.tools();
    assert_eq!(
        listed.iter().find(|t| t.name == "later").map(|t| t.state),
        Some(ToolState::Deferred)
    );
    let dash = local
        .call(&call("d", "echo", json!({"text": "--help"})), &opts)
        .await;
    assert_eq!(kind(&dash), Some(ErrorKind::InvalidInput), "{dash:?}");
}
