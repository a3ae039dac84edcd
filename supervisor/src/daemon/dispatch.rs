//! One request: the ops, and calls' admission (unique ids, input budget, queue,
//! concurrency slots) and cancellation.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use airlock_policy::validate::ToolState;
use serde_json::{Value, json};

use super::Shared;
use super::budget::Held;
use super::connection::{Conn, InFlight, Reply};
use super::fair::{Place, PushedOut};
use super::wire::{CallRequest, ExecuteRequest, Op, RequestError, error_body};
use crate::call::ToolCall;
use crate::cancel::CancelSignal;
use crate::gate::{CallOptions, Gate};
use crate::result::{ErrorKind, ToolError, ToolResult};

/// Longest message an `invalid_request` answer carries: what is wrong with a request often
/// quotes it (an unknown op or field), and a request can be megabytes.
const MAX_MESSAGE_BYTES: usize = 1024;

fn invalid_request(message: impl std::fmt::Display) -> Value {
    let message = airlock_policy::text::clipped(&message.to_string(), MAX_MESSAGE_BYTES);
    error_body("invalid_request", format!("bad request: {message}"))
}

/// Runs one request; calls run in their own task so responses may come out of order.
pub(super) async fn dispatch(conn: &Conn, id: Value, op: Result<Op, RequestError>, reply: Reply) {
    let (shared, answers, in_flight) = (&conn.shared, &conn.answers, &conn.in_flight);
    shared.stats.requests.fetch_add(1, Ordering::Relaxed);
    let op = match op {
        Ok(op) => op,
        Err(reason) => {
            answers.send(reply(invalid_request(reason)), None).await;
            return;
        }
    };
    let key = id.to_string();
    if matches!(op, Op::Execute(_) | Op::Reject(_) | Op::SetState(_)) && !conn.peer.may_approve {
        let body = error_body(
            "forbidden",
            "only the daemon's approvers (--approver-uid, --approver-gid) may execute, reject or set_state",
        );
        answers.send(reply(body), None).await;
        return;
    }
    // Tightening a session is anyone's; lifting its plan mode is an approver's, as is
    // lifting a tool's state.
    if matches!(
        op,
        Op::SessionSet(super::wire::SessionSetRequest {
            plan_mode: false,
            ..
        })
    ) && !conn.peer.may_approve
    {
        let body = error_body(
            "forbidden",
            "only the daemon's approvers (--approver-uid, --approver-gid) may lift a session's plan mode",
        );
        answers.send(reply(body), None).await;
        return;
    }
    match op {
        Op::Call(request) => {
            let (call, opts) = match call_of(&request) {
                Ok(call) => call,
                Err(message) => {
                    answers.send(reply(invalid_request(message)), None).await;
                    return;
                }
            };
            if request.dry_run {
                let body = match shared.gate.dry_run(&call, &opts) {
                    Ok(dry) => json!({"result": {"dry_run": dry}}),
                    Err(result) => json!({"result": result}),
                };
                answers.send(reply(body), None).await;
                return;
            }
            // Decided before a slot is taken: a call the gate refuses (bad input, unknown
            // tool, a rule) is answered at once and never waits for, or holds, a slot.
            let admitted = match shared.gate.admit(&call, &opts) {
                Ok(admitted) => admitted,
                Err(result) => {
                    counted(shared, &result);
                    answers.send(reply(json!({"result": result})), None).await;
                    return;
                }
            };
            let arguments_bytes = admitted.arguments_heap_bytes();
            if arguments_bytes > shared.input.total() {
                // No retry could ever make room: say so instead of `overloaded`.
                let error = ToolError::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "the arguments take about {arguments_bytes} bytes once parsed, more than the daemon holds for all requests ({} bytes, --max-input-bytes)",
                        shared.input.total()
                    ),
                );
                let result = shared.gate.refuse(&call, &opts, error);
                counted(shared, &result);
                answers.send(reply(json!({"result": result})), None).await;
                return;
            }
            let started = Admission {
                key,
                arguments_bytes,
                call: ToolCall {
                    arguments: String::new(),
                    ..call
                },
                session: opts.session.clone(),
            };
            spawn_call(
                conn,
                started,
                reply,
                move |gate, opts_with_cancel| {
                    Box::pin(async move { gate.run_admitted(admitted, &opts_with_cancel).await })
                },
                opts,
            )
            .await;
        }
        Op::Execute(ExecuteRequest {
            approval_id,
            session,
        }) => {
            let started = Admission {
                key,
                call: ToolCall {
                    call_id: String::new(),
                    tool: String::new(),
                    arguments: String::new(),
                },
                arguments_bytes: 0,
                session: session.clone(),
            };
            let opts = CallOptions {
                session,
                ..Default::default()
            };
            spawn_call(
                conn,
                started,
                reply,
                move |gate, opts_with_cancel| {
                    Box::pin(async move { gate.execute(&approval_id, &opts_with_cancel).await })
                },
                opts,
            )
            .await;
        }
        Op::Propose(request) => {
            if request.dry_run || request.timeout_ms.is_some() {
                let message = "propose takes neither dry_run nor timeout_ms";
                answers.send(reply(invalid_request(message)), None).await;
                return;
            }
            let body = match call_of(&request) {
                Err(message) => invalid_request(message),
                Ok((call, opts)) => match shared.gate.propose(&call, &opts) {
                    Ok(approval) => json!({"result": {"approval": approval}}),
                    Err(result) => json!({"result": result}),
                },
            };
            answers.send(reply(body), None).await;
        }
        Op::Cancel(request) => {
            let found = in_flight
                .lock()
                .await
                .get(&request.target.to_string())
                .cloned();
            if let Some(signal) = &found {
                signal.cancel();
            }
            let body = json!({"result": {"cancelled": found.is_some()}});
            answers.send(reply(body), None).await;
        }
        Op::Reject(request) => {
            let existed = shared.gate.reject(&request.approval_id);
            answers
                .send(reply(json!({"result": {"existed": existed}})), None)
                .await;
        }
        Op::SetState(request) => {
            let body = set_state(shared, request).await;
            answers.send(reply(body), None).await;
        }
        Op::Tools(request) => {
            let tools = match request.session {
                Some(session) => shared.gate.tools_in(&session),
                None => shared.gate.tools(),
            };
            let body = json!({"result": {"tools": tools}});
            answers.send(reply(body), None).await;
        }
        Op::Health => {
            let ready = super::readiness(shared);
            let body = json!({"result": {
                "ok": true,
                "version": env!("CARGO_PKG_VERSION"),
                "protocol_version": super::DAEMON_PROTOCOL_VERSION,
                "policy_version": shared.gate.policy().version,
                "ready": ready.is_ok(),
                "not_ready": ready.err(),
            }});
            answers.send(reply(body), None).await;
        }
        Op::Stats => {
            answers.send(reply(stats(shared)), None).await;
        }
        op @ (Op::SessionOpen(_)
        | Op::PutFile(_)
        | Op::GetFile(_)
        | Op::Changes(_)
        | Op::SessionClose(_)
        | Op::SessionSet(_)) => {
            let body = super::sessions::answer(&shared.gate, &shared.session_ops, op).await;
            answers.send(reply(body), None).await;
        }
    }
}

/// `set_state`: daemon-wide, or for one open session (its lookup sweeps expired sessions,
/// which removes files: on the blocking pool, like the other session ops).
async fn set_state(shared: &Shared, request: super::wire::SetStateRequest) -> Value {
    let (tool, state, session) = (request.tool, request.state, request.session);
    let Some(parsed) = ToolState::from_name(&state) else {
        return error_body(
            "invalid_request",
            format!("state must be active, deferred or suspended, not {state:?}"),
        );
    };
    let known = match session {
        None => Ok(shared.gate.set_state(&tool, parsed)),
        Some(session) => {
            let (gate, tool) = (std::sync::Arc::clone(&shared.gate), tool.clone());
            let set = tokio::task::spawn_blocking(move || {
                gate.set_session_state(&session, &tool, parsed)
            });
            match set.await {
                Ok(known) => known,
                Err(_) => return error_body("sandbox_unavailable", "set_state failed"),
            }
        }
    };
    match known {
        Ok(true) => json!({"result": {"tool": tool, "state": parsed}}),
        Ok(false) => error_body("unknown_tool", format!("no tool named {tool:?}")),
        Err(error) => error_body(error.kind(), error.to_string()),
    }
}

fn stats(shared: &Shared) -> Value {
    let s = &shared.stats;
    let config = &shared.config;
    shared.room.refresh(config, &shared.gate.policy());
    let connections_open = super::connections_open(shared);
    let output_taken =
        super::output_budget(config).saturating_sub(shared.output.available_permits());
    json!({"result": {
        "connections": s.connections.load(Ordering::Relaxed),
        "connections_open": connections_open,
        "max_connections": config.max_connections,
        "refused_peers": s.refused_peers.load(Ordering::Relaxed),
        "requests": s.requests.load(Ordering::Relaxed),
        "calls": s.calls.load(Ordering::Relaxed),
        "in_flight": s.in_flight.load(Ordering::Relaxed),
        "queued": s.queued.load(Ordering::Relaxed),
        "overloaded": s.overloaded.load(Ordering::Relaxed),
        "input_bytes": shared.input.taken(),
        "max_input_bytes": shared.input.total(),
        "input_refused": s.input_refused.load(Ordering::Relaxed),
        "output_bytes": output_taken,
        "max_output_bytes": super::output_budget(config),
        "closed_unread": s.closed_unread.load(Ordering::Relaxed),
        "write_timeout_ms": u64::try_from(config.write_timeout.as_millis()).unwrap_or(u64::MAX),
        "pending_approvals": shared.gate.pending_approvals(),
        "pool": shared.gate.supervisor().pool_stats(),
        "warm_pools": shared.gate.supervisor().warm_pools(),
        "max_concurrent": shared.room.calls_at_once(config),
        "max_queued": config.max_queued,
        "max_open_files": super::descriptors::limit_now(),
        "open_files_needed": shared.room.needed(config),
        "sessions_open": shared.gate.sessions().map_or(0, |s| s.count()),
    }})
}

/// Counts a result record answered for a `call` or `execute` (metrics).
fn counted(shared: &Shared, result: &ToolResult) {
    shared.metrics.record_result(&shared.gate.policy(), result);
}

/// The gate's call and options for a `call` or `propose` request.
fn call_of(request: &CallRequest) -> Result<(ToolCall, CallOptions), String> {
    let arguments = match (&request.arguments_json, &request.arguments) {
        (Some(_), Some(_)) => return Err("give arguments or arguments_json, not both".into()),
        (Some(text), None) => text.clone(),
        (None, Some(raw)) => raw.get().to_string(),
        (None, None) => "{}".to_string(),
    };
    let timeout = match request.timeout_ms {
        Some(0) => return Err("timeout_ms must be at least 1".into()),
        other => other.map(Duration::from_millis),
    };
    // Unique by default: request ids repeat across connections, and the audit log and
    // results are keyed by call id.
    let call_id = request.call_id.clone().unwrap_or_else(fresh_call_id);
    let call = ToolCall {
        call_id,
        tool: request.tool.clone(),
        arguments,
    };
    let opts = CallOptions {
        session: request.session.clone(),
        plan_mode: request.plan_mode,
        cancel: None,
        timeout,
    };
    Ok((call, opts))
}

/// A call id no other call of this daemon has: random where the OS can say, else counted
/// (call ids need to be unique, not secret).
fn fresh_call_id() -> String {
    static COUNTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    crate::approvals::random_id().unwrap_or_else(|| {
        let n = COUNTED.fetch_add(1, Ordering::Relaxed);
        format!("call-{}-{n}", std::process::id())
    })
}

type CallFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ToolResult> + Send + 'a>>;

/// What admission needs to know of a call before it runs.
struct Admission {
    /// The request id's JSON text, unique among this connection's requests in flight.
    key: String,
    /// The call's id and tool, for refusals (its arguments travel with the call itself).
    call: ToolCall,
    /// Held against the input budget while the call is queued or running.
    arguments_bytes: usize,
    session: Option<String>,
}

/// How long an `overloaded` client should wait: a guess that grows with the queue, so
/// retries spread out instead of arriving together.
fn retry_after_ms(waiting: usize, max_concurrent: usize) -> u64 {
    let rounds = (waiting / max_concurrent.max(1)).saturating_add(1);
    u64::try_from(rounds.saturating_mul(100))
        .unwrap_or(u64::MAX)
        .min(5_000)
}

/// Admission (a unique id, the input budget, a bounded queue, concurrency slots), then the
/// call in its own task, cancellable by `cancel`, by the client leaving, or by shutdown.
/// The call's slot is given back when its answer starts out to the client, not when it
/// finishes.
async fn spawn_call<F>(conn: &Conn, admission: Admission, reply: Reply, run: F, opts: CallOptions)
where
    F: for<'a> FnOnce(&'a Gate, CallOptions) -> CallFuture<'a> + Send + 'static,
{
    let (shared, answers, in_flight) = (&conn.shared, &conn.answers, &conn.in_flight);
    let refused_opts = CallOptions {
        session: admission.session.clone(),
        ..CallOptions::default()
    };
    let overloaded = |message: String, retry: Option<u64>| {
        let error = ToolError {
            retry_after_ms: retry,
            ..ToolError::new(ErrorKind::Overloaded, message)
        };
        let result = shared.gate.refuse(&admission.call, &refused_opts, error);
        counted(shared, &result);
        json!({"result": result})
    };
    if shared.shutdown.is_cancelled() {
        let body = overloaded("the daemon is shutting down".into(), None);
        answers.send(reply(body), None).await;
        return;
    }
    let signal = CancelSignal::new();
    {
        let mut table = in_flight.lock().await;
        if table.contains_key(&admission.key) {
            drop(table);
            let message = format!(
                "request id {} is already in flight on this connection; give every request its own id",
                admission.key
            );
            answers.send(reply(invalid_request(message)), None).await;
            return;
        }
        table.insert(admission.key.clone(), signal.clone());
    }
    let Some(arguments) = shared.input.try_hold(admission.arguments_bytes) else {
        forget(in_flight, &admission.key).await;
        shared.stats.overloaded.fetch_add(1, Ordering::Relaxed);
        shared.stats.input_refused.fetch_add(1, Ordering::Relaxed);
        let message = format!(
            "the daemon holds {} bytes of requests, its most; try again later",
            shared.input.total()
        );
        answers
            .send(reply(overloaded(message, Some(1000))), None)
            .await;
        return;
    };
    // A free slot or a place in the queue is taken here, in request order, not later in
    // the call's task: two requests read in one burst (a busy daemon) both saw the slot
    // free, both were admitted, and their tasks raced for it — the second could run while
    // the first waited, beyond --max-queued 0 (seen once in the VM matrix under emulation).
    let queued_at = std::time::Instant::now();
    let (slot, waiting) = match shared.slots.enter(conn.id) {
        Place::Now(slot) => (Some(slot), None),
        Place::Queued(waiting) => {
            shared.stats.queued.fetch_add(1, Ordering::SeqCst);
            (None, Some(waiting))
        }
        Place::Full { queued } => {
            shared.stats.overloaded.fetch_add(1, Ordering::Relaxed);
            forget(in_flight, &admission.key).await;
            let message = format!(
                "{} calls running and {queued} queued; try again later",
                shared.config.max_concurrent
            );
            let retry = retry_after_ms(queued, shared.room.calls_at_once(&shared.config));
            answers
                .send(reply(overloaded(message, Some(retry))), None)
                .await;
            return;
        }
    };
    let shared = Arc::clone(shared);
    let in_flight = Arc::clone(in_flight);
    let answers = answers.clone();
    tokio::spawn(async move {
        let permit = match (slot, waiting) {
            (Some(slot), _) => Ok(slot),
            (None, Some(waiting)) => {
                let permit = tokio::select! {
                    granted = waiting.slot() => granted.map_err(|PushedOut| Refused::PushedOut),
                    () = signal.cancelled() => Err(Refused::Cancelled),
                };
                shared.stats.queued.fetch_sub(1, Ordering::SeqCst);
                permit
            }
            (None, None) => Err(Refused::Cancelled),
        };
        let (body, slot) = match permit {
            Err(Refused::Cancelled) => {
                let result = cancelled_while_queued(&admission.call);
                counted(&shared, &result);
                (json!({"result": result}), None)
            }
            Err(Refused::PushedOut) => {
                shared.stats.overloaded.fetch_add(1, Ordering::Relaxed);
                let queued = shared.slots.queued();
                let error = ToolError {
                    retry_after_ms: Some(retry_after_ms(
                        queued,
                        shared.room.calls_at_once(&shared.config),
                    )),
                    ..ToolError::new(
                        ErrorKind::Overloaded,
                        "its place in the queue went to a client with fewer calls waiting; try again later",
                    )
                };
                let result = shared.gate.refuse(&admission.call, &refused_opts, error);
                counted(&shared, &result);
                (json!({"result": result}), None)
            }
            Ok(permit) => {
                // Then the descriptors the call may hold: under a tight open-file limit it
                // waits for them, holding its slot, rather than fail for want of one.
                let policy = shared.gate.policy();
                shared.room.refresh(&shared.config, &policy);
                let cost = shared.room.cost(&policy, &admission.call.tool);
                drop(policy);
                let share = tokio::select! {
                    share = shared.room.take(cost) => share.ok(),
                    () = signal.cancelled() => None,
                };
                shared.metrics.observe_queue(queued_at.elapsed());
                let result = match share {
                    Some(share) => {
                        let result = run_admitted(&shared, &signal, arguments, run, opts).await;
                        drop(share);
                        result
                    }
                    None => cancelled_while_queued(&admission.call),
                };
                counted(&shared, &result);
                (json!({"result": result}), Some(permit))
            }
        };
        forget(&in_flight, &admission.key).await;
        answers.send(reply(body), slot).await;
    });
}

/// Why a queued call got no slot.
enum Refused {
    Cancelled,
    PushedOut,
}

/// The record of a call cancelled before it ran.
fn cancelled_while_queued(call: &ToolCall) -> ToolResult {
    let error = ToolError::new(ErrorKind::Cancelled, "cancelled while queued");
    ToolResult::rejected(&call.call_id, &call.tool, error)
}

/// The request `key` is no longer in flight on its connection.
async fn forget(in_flight: &InFlight, key: &str) {
    in_flight.lock().await.remove(key);
}

/// Runs an admitted call under its own and the daemon's cancellation.
async fn run_admitted<F>(
    shared: &Shared,
    signal: &CancelSignal,
    arguments: Held,
    run: F,
    opts: CallOptions,
) -> ToolResult
where
    F: for<'a> FnOnce(&'a Gate, CallOptions) -> CallFuture<'a> + Send + 'static,
{
    shared.stats.in_flight.fetch_add(1, Ordering::SeqCst);
    shared.stats.calls.fetch_add(1, Ordering::Relaxed);
    // Shutdown's cancel and this request's cancel both end the call.
    let combined = CancelSignal::new();
    let relay = {
        let combined = combined.clone();
        let signal = signal.clone();
        let all = shared.calls.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = signal.cancelled() => {},
                () = all.cancelled() => {},
            }
            combined.cancel();
        })
    };
    let opts = CallOptions {
        cancel: Some(combined),
        ..opts
    };
    let started = std::time::Instant::now();
    let result = run(&shared.gate, opts).await;
    let policy = shared.gate.policy();
    shared
        .metrics
        .observe_run(&policy, &result.tool, started.elapsed());
    relay.abort();
    drop(arguments);
    shared.stats.in_flight.fetch_sub(1, Ordering::SeqCst);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_of_huge_requests_do_not_repeat_them() {
        let name = "x".repeat(2 << 20);
        let (_, op) = super::super::wire::parse_line(&format!(r#"{{"op":"{name}"}}"#));
        let Err(reason) = op else {
            panic!("an unknown op parsed")
        };
        let body = invalid_request(reason).to_string();
        assert!(body.len() <= 2 * MAX_MESSAGE_BYTES, "{} bytes", body.len());
        assert!(body.contains("unknown op"), "{body}");
    }

    #[test]
    fn retry_hints_grow_with_the_queue_and_stay_bounded() {
        assert_eq!(retry_after_ms(0, 8), 100);
        assert_eq!(retry_after_ms(16, 8), 300);
        assert_eq!(retry_after_ms(usize::MAX, 1), 5_000);
        assert_eq!(retry_after_ms(3, 0), 400);
    }

    #[test]
    fn a_call_request_gets_a_fresh_call_id_and_a_bounded_timeout() {
        let request = CallRequest {
            tool: "t".into(),
            timeout_ms: Some(250),
            ..CallRequest::default()
        };
        let (a, opts) = call_of(&request).unwrap();
        let (b, _) = call_of(&request).unwrap();
        assert_ne!(a.call_id, b.call_id);
        assert_eq!(a.call_id.len(), 32);
        assert_eq!(a.arguments, "{}");
        assert_eq!(opts.timeout, Some(Duration::from_millis(250)));
        let zero = CallRequest {
            timeout_ms: Some(0),
            ..request.clone()
        };
        assert!(call_of(&zero).is_err());
        let both = CallRequest {
            arguments_json: Some("{}".into()),
            arguments: serde_json::value::RawValue::from_string("{}".into()).ok(),
            ..request
        };
        assert!(call_of(&both).is_err());
    }
}
