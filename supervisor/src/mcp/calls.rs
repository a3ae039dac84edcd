//! `tools/call`: admission (a unique request id, the bound on admitted calls, a running
//! slot), the gate's call under the request's cancel signal, and approvals — proposed,
//! then asked of the user with `elicitation/create` or answered `approval_required`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::jsonrpc::{
    INVALID_PARAMS, INVALID_REQUEST, notification_line, request_line, result_line,
};
use super::{Session, lock, tools};
use crate::call::ToolCall;
use crate::cancel::CancelSignal;
use crate::gate::{Approval, CallOptions};
use crate::result::{ErrorKind, ToolError, ToolResult};

/// A call id no other call of this process has: random where the OS can say, else counted
/// (call ids key results and audit records; they need to be unique, not secret).
fn fresh_call_id() -> String {
    static COUNTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    crate::approvals::random_id().unwrap_or_else(|| {
        let n = COUNTED.fetch_add(1, Ordering::Relaxed);
        format!("call-{}-{n}", std::process::id())
    })
}

/// The tool name and argument text of a `tools/call`, or the -32602 message.
fn call_params(params: Option<Value>) -> Result<(String, String), &'static str> {
    let Some(Value::Object(params)) = params else {
        return Err("tools/call takes an object of params");
    };
    let Some(Value::String(name)) = params.get("name") else {
        return Err("tools/call needs a \"name\" string");
    };
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => "{}".to_string(),
        Some(arguments @ Value::Object(_)) => arguments.to_string(),
        Some(_) => return Err("\"arguments\" must be an object"),
    };
    Ok((name.clone(), arguments))
}

/// What admission decided of a call.
enum Admission {
    /// In the in-flight table, counted; it runs once a slot is free.
    Admitted,
    /// Its request id is already in flight.
    IdInUse,
    /// As many calls as the server takes are running or queued.
    Full,
}

/// Admits a `tools/call` and runs it in its own task (answers may come out of order).
pub(super) async fn start(
    session: &Arc<Session>,
    id: Value,
    params: Option<Value>,
    tasks: &mut JoinSet<()>,
) {
    let (tool, arguments) = match call_params(params) {
        Ok(call) => call,
        Err(message) => return session.error(&id, INVALID_PARAMS, message).await,
    };
    let call = ToolCall {
        call_id: fresh_call_id(),
        tool,
        arguments,
    };
    let opts = CallOptions {
        session: Some(session.session_id.clone()),
        ..CallOptions::default()
    };
    let key = id.to_string();
    let signal = CancelSignal::new();
    let most = session.config.max_concurrent.max(1) + session.config.max_queued;
    // Decided under the lock, answered after it: no lock is held across an await.
    let admitted = {
        let mut table = lock(&session.in_flight);
        if table.contains_key(&key) {
            Admission::IdInUse
        } else if session.admitted.load(Ordering::SeqCst) >= most {
            Admission::Full
        } else {
            session.admitted.fetch_add(1, Ordering::SeqCst);
            table.insert(key.clone(), signal.clone());
            Admission::Admitted
        }
    };
    match admitted {
        Admission::Admitted => {}
        Admission::IdInUse => {
            let message =
                format!("request id {key} is already in flight; give every request its own id");
            return session.error(&id, INVALID_REQUEST, &message).await;
        }
        Admission::Full => {
            let error = ToolError {
                retry_after_ms: Some(1000),
                ..ToolError::new(
                    ErrorKind::Overloaded,
                    format!(
                        "{most} calls are running or queued, the most this server takes; try again later"
                    ),
                )
            };
            let result = session.gate.refuse(&call, &opts, error);
            let answer = tools::call_result(&result, false);
            return session.send(result_line(&id, answer)).await;
        }
    }
    let session = Arc::clone(session);
    tasks.spawn(async move {
        let answer = run(&session, call, opts, &signal).await;
        lock(&session.in_flight).remove(&key);
        session.admitted.fetch_sub(1, Ordering::SeqCst);
        // A cancelled request is not answered (MCP's cancellation).
        if let Some(answer) = answer.filter(|_| !signal.is_cancelled()) {
            session.send(result_line(&id, answer)).await;
        }
    });
}

/// Runs an admitted call once a slot is free; none when it was cancelled first.
async fn run(
    session: &Session,
    call: ToolCall,
    opts: CallOptions,
    signal: &CancelSignal,
) -> Option<Value> {
    let slot = tokio::select! {
        slot = Arc::clone(&session.slots).acquire_owned() => slot.ok(),
        () = signal.cancelled() => None,
    };
    let _slot = slot?;
    let opts = CallOptions {
        cancel: Some(signal.clone()),
        ..opts
    };
    let mut result = session.gate.call(&call, &opts).await;
    if result.error.as_ref().map(|e| e.kind) == Some(ErrorKind::ApprovalRequired) {
        result = approve(session, &call, &opts, signal).await?;
    }
    let structured = session
        .gate
        .policy()
        .tools
        .get(&call.tool)
        .and_then(|t| tools::structured_output(t.tool.output_schema.as_ref()))
        .is_some();
    Some(tools::call_result(&result, structured))
}

/// Proposes a call that needs a human's approval and, when the client can ask its user,
/// asks; runs it only on an `accept`. Without elicitation the answer names the pending
/// approval, for an approver to act on.
async fn approve(
    session: &Session,
    call: &ToolCall,
    opts: &CallOptions,
    signal: &CancelSignal,
) -> Option<ToolResult> {
    let approval = match session.gate.propose(call, opts) {
        Ok(approval) => approval,
        Err(refused) => return Some(refused),
    };
    let rejected = |kind: ErrorKind, message: String| {
        let error = ToolError {
            rule: Some(approval.rule.clone()),
            ..ToolError::new(kind, message)
        };
        ToolResult::rejected(&call.call_id, &call.tool, error)
    };
    if !session.client.get().is_some_and(|c| c.elicitation) {
        let message = format!(
            "this call needs a human approval: approval {} is pending ({})",
            approval.approval_id, approval.reason
        );
        return Some(rejected(ErrorKind::ApprovalRequired, message));
    }
    let answer = ask(session, &approval, signal).await;
    let action = match &answer {
        Asked::Answered(Ok(result)) => result.get("action").and_then(Value::as_str).unwrap_or(""),
        _ => "",
    };
    if action != "accept" {
        session.gate.reject(&approval.approval_id);
        if signal.is_cancelled() {
            return None;
        }
        let why = match &answer {
            Asked::Answered(Ok(_)) if action.is_empty() => {
                "the client's answer had no action".to_string()
            }
            Asked::Answered(Ok(_)) => {
                format!("the user chose {:?}", crate::audit::sanitize(action))
            }
            Asked::Answered(Err(_)) => "the client could not ask its user".to_string(),
            Asked::Unanswered => format!(
                "no answer came within the approval's time to live ({:?})",
                session.gate.policy().gate.approval_ttl
            ),
            Asked::Gone => "the client went away".to_string(),
        };
        let message = format!("approval {} was not given: {why}", approval.approval_id);
        return Some(rejected(ErrorKind::Denied, message));
    }
    Some(session.gate.execute(&approval.approval_id, opts).await)
}

/// What the user is shown: the tool, why it needs approval, and what would run (rendered
/// as JSON, so control characters in arguments cannot dress up the prompt).
fn prompt(approval: &Approval) -> String {
    let runs = match &approval.builtin {
        Some(builtin) => format!("the built-in {builtin} with {}", approval.arguments),
        None => Value::from(approval.argv_preview.clone()).to_string(),
    };
    format!(
        "airlock: allow a call of tool {:?}? {}. It would run: {runs} (profile {}, approval {})",
        approval.tool, approval.reason, approval.profile, approval.approval_id
    )
}

/// Sends `elicitation/create` and waits for the client's answer, at most the policy's
/// approval TTL.
async fn ask(session: &Session, approval: &Approval, signal: &CancelSignal) -> Asked {
    let n = session.next_ask.fetch_add(1, Ordering::Relaxed);
    let id = Value::from(format!("airlock-elicit-{n}"));
    let key = id.to_string();
    let (answer, answered) = oneshot::channel();
    lock(&session.asked).insert(key.clone(), answer);
    let params = json!({
        "message": prompt(approval),
        // Accepting is the approval: nothing else to fill in.
        "requestedSchema": {"type": "object", "properties": Map::new()},
    });
    session
        .send(request_line(&id, "elicitation/create", params))
        .await;
    // The approval expires after the TTL anyway: waiting longer would hold a slot for a
    // yes that could no longer run anything.
    let bound = session.gate.policy().gate.approval_ttl;
    let asked = answer_within(answered, signal, bound).await;
    lock(&session.asked).remove(&key);
    if asked == Asked::Unanswered {
        // MCP lets either side cancel its own request: the client can take its prompt
        // down, and an answer it sends anyway is dropped as one to no question.
        let params =
            json!({"requestId": id, "reason": "unanswered within the approval's time to live"});
        session
            .send(notification_line("notifications/cancelled", Some(params)))
            .await;
    }
    asked
}

/// What became of a question to the client.
#[derive(Debug, PartialEq)]
enum Asked {
    /// The client answered: its result, or its error.
    Answered(Result<Value, Value>),
    /// No answer came within the bound.
    Unanswered,
    /// The call was cancelled, or the session ended, first.
    Gone,
}

/// Waits for the client's answer on `answered`, at most `bound`.
async fn answer_within(
    answered: oneshot::Receiver<Result<Value, Value>>,
    signal: &CancelSignal,
    bound: Duration,
) -> Asked {
    tokio::select! {
        answer = answered => answer.map_or(Asked::Gone, Asked::Answered),
        () = signal.cancelled() => Asked::Gone,
        () = tokio::time::sleep(bound) => Asked::Unanswered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_params_are_checked_before_anything_runs() {
        assert_eq!(
            call_params(Some(json!({"name": "t"}))),
            Ok(("t".into(), "{}".into()))
        );
        assert_eq!(
            call_params(Some(json!({"name": "t", "arguments": {"a": 1}}))),
            Ok(("t".into(), r#"{"a":1}"#.into()))
        );
        assert!(call_params(None).is_err());
        assert!(call_params(Some(json!([1]))).is_err());
        assert!(call_params(Some(json!({"name": 3}))).is_err());
        assert!(call_params(Some(json!({"name": "t", "arguments": [1]}))).is_err());
        assert!(call_params(Some(json!({"name": "t", "arguments": "{}"}))).is_err());
    }

    // Paused time: the runtime jumps to the next timer when every task is idle, so a
    // bound of minutes passes at once, and a bug that waits for ever hangs the test.
    #[tokio::test(start_paused = true)]
    async fn a_question_left_unanswered_ends_at_its_bound() {
        let (_answer, answered) = oneshot::channel();
        let started = tokio::time::Instant::now();
        let bound = Duration::from_secs(15 * 60);
        let asked = answer_within(answered, &CancelSignal::new(), bound).await;
        assert_eq!(asked, Asked::Unanswered);
        assert!(started.elapsed() >= bound);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_or_a_cancel_within_the_bound_is_taken() {
        let (answer, answered) = oneshot::channel();
        let bound = Duration::from_secs(60);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(59)).await;
            let _ = answer.send(Ok(json!({"action": "accept"})));
        });
        let asked = answer_within(answered, &CancelSignal::new(), bound).await;
        assert_eq!(asked, Asked::Answered(Ok(json!({"action": "accept"}))));

        let (_answer, answered) = oneshot::channel();
        let signal = CancelSignal::new();
        signal.cancel();
        assert_eq!(answer_within(answered, &signal, bound).await, Asked::Gone);
    }
}
