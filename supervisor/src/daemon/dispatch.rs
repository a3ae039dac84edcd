//! One request: the ops, and calls' admission (queue, concurrency slots) and cancellation.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use airlock_policy::validate::ToolState;
use serde_json::{Value, json};
use tokio::sync::{Mutex, mpsc};

use super::Shared;
use super::wire::{CallRequest, Op, error_body};
use crate::call::ToolCall;
use crate::cancel::CancelSignal;
use crate::gate::{CallOptions, Gate};
use crate::result::{ErrorKind, ToolError, ToolResult};

/// Runs one request; calls run in their own task so responses may come out of order.
pub(super) async fn dispatch(
    shared: &Arc<Shared>,
    id: Value,
    op: Result<Op, String>,
    out: mpsc::Sender<Vec<u8>>,
    reply: Box<dyn Fn(Value) -> Vec<u8> + Send + Sync>,
    in_flight: &Arc<Mutex<HashMap<String, CancelSignal>>>,
) {
    shared.stats.requests.fetch_add(1, Ordering::Relaxed);
    let op = match op {
        Ok(op) => op,
        Err(reason) => {
            let _ = out
                .send(reply(error_body(
                    "invalid_request",
                    format!("bad request: {reason}"),
                )))
                .await;
            return;
        }
    };
    let key = id.to_string();
    match op {
        Op::Call(request) => {
            let call = to_call(&request, &id);
            let opts = CallOptions {
                session: request.session.clone(),
                plan_mode: request.plan_mode,
                cancel: None,
            };
            spawn_call(
                shared,
                key,
                out,
                reply,
                in_flight,
                move |gate, opts_with_cancel| {
                    Box::pin(async move { gate.call(&call, &opts_with_cancel).await })
                },
                opts,
            )
            .await;
        }
        Op::Execute {
            approval_id,
            session,
        } => {
            let opts = CallOptions {
                session,
                ..Default::default()
            };
            spawn_call(
                shared,
                key,
                out,
                reply,
                in_flight,
                move |gate, opts_with_cancel| {
                    Box::pin(async move { gate.execute(&approval_id, &opts_with_cancel).await })
                },
                opts,
            )
            .await;
        }
        Op::Propose(request) => {
            let call = to_call(&request, &id);
            let opts = CallOptions {
                session: request.session.clone(),
                plan_mode: request.plan_mode,
                cancel: None,
            };
            let body = match shared.gate.propose(&call, &opts) {
                Ok(approval) => json!({"result": {"approval": approval}}),
                Err(result) => json!({"result": result}),
            };
            let _ = out.send(reply(body)).await;
        }
        Op::Cancel { target } => {
            let found = in_flight.lock().await.get(&target.to_string()).cloned();
            if let Some(signal) = &found {
                signal.cancel();
            }
            let _ = out
                .send(reply(json!({"result": {"cancelled": found.is_some()}})))
                .await;
        }
        Op::Reject { approval_id } => {
            let existed = shared.gate.reject(&approval_id);
            let _ = out
                .send(reply(json!({"result": {"existed": existed}})))
                .await;
        }
        Op::SetState { tool, state } => {
            let body = match ToolState::from_name(&state) {
                None => error_body(
                    "invalid_request",
                    format!("state must be active, deferred or suspended, not {state:?}"),
                ),
                Some(state) if shared.gate.set_state(&tool, state) => {
                    json!({"result": {"tool": tool, "state": state}})
                }
                Some(_) => error_body("unknown_tool", format!("no tool named {tool:?}")),
            };
            let _ = out.send(reply(body)).await;
        }
        Op::Tools => {
            let _ = out
                .send(reply(json!({"result": {"tools": shared.gate.tools()}})))
                .await;
        }
        Op::Health => {
            let _ = out.send(reply(json!({"result": {"ok": true, "version": env!("CARGO_PKG_VERSION"), "policy_version": shared.gate.policy().version}}))).await;
        }
        Op::Stats => {
            let s = &shared.stats;
            let body = json!({"result": {
                "connections": s.connections.load(Ordering::Relaxed),
                "refused_peers": s.refused_peers.load(Ordering::Relaxed),
                "requests": s.requests.load(Ordering::Relaxed),
                "calls": s.calls.load(Ordering::Relaxed),
                "in_flight": s.in_flight.load(Ordering::Relaxed),
                "queued": s.queued.load(Ordering::Relaxed),
                "overloaded": s.overloaded.load(Ordering::Relaxed),
                "pending_approvals": shared.gate.pending_approvals(),
                "pool": shared.gate.supervisor().pool_stats(),
                "warm_pools": shared.gate.supervisor().warm_pools(),
                "max_concurrent": shared.config.max_concurrent,
                "max_queued": shared.config.max_queued,
            }});
            let _ = out.send(reply(body)).await;
        }
    }
}

fn to_call(request: &CallRequest, id: &Value) -> ToolCall {
    let arguments = match (&request.arguments_json, &request.arguments) {
        (Some(text), _) => text.clone(),
        (None, Some(value)) => value.to_string(),
        (None, None) => "{}".to_string(),
    };
    let call_id = request.call_id.clone().unwrap_or_else(|| match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    ToolCall {
        call_id,
        tool: request.tool.clone(),
        arguments,
    }
}

type CallFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ToolResult> + Send + 'a>>;

/// Admission (bounded queue, concurrency slots), then the call in its own task, cancellable
/// by `cancel`, by the client leaving, or by shutdown.
async fn spawn_call<F>(
    shared: &Arc<Shared>,
    key: String,
    out: mpsc::Sender<Vec<u8>>,
    reply: Box<dyn Fn(Value) -> Vec<u8> + Send + Sync>,
    in_flight: &Arc<Mutex<HashMap<String, CancelSignal>>>,
    run: F,
    opts: CallOptions,
) where
    F: for<'a> FnOnce(&'a Gate, CallOptions) -> CallFuture<'a> + Send + 'static,
{
    if shared.shutdown.is_cancelled() {
        let _ = out
            .send(reply(error_body(
                "overloaded",
                "the daemon is shutting down",
            )))
            .await;
        return;
    }
    // A free slot is taken here, in request order, not later in the call's task: two
    // requests read in one burst (a busy daemon) both saw the slot free, both were
    // admitted, and their tasks raced for it — the second could run while the first
    // waited, beyond --max-queued 0 (seen once in the VM matrix under emulation). Tokio's
    // semaphore hands released permits to waiters first, so this never jumps the queue.
    let slot = Arc::clone(&shared.slots).try_acquire_owned().ok();
    let waiting = if slot.is_none() {
        shared.stats.queued.fetch_add(1, Ordering::SeqCst)
    } else {
        0
    };
    if slot.is_none() && waiting >= shared.config.max_queued {
        shared.stats.queued.fetch_sub(1, Ordering::SeqCst);
        shared.stats.overloaded.fetch_add(1, Ordering::Relaxed);
        let result = ToolResult::rejected(
            "",
            "",
            ToolError::new(
                ErrorKind::Overloaded,
                format!(
                    "{} calls running and {waiting} queued; try again later",
                    shared.config.max_concurrent
                ),
            ),
        );
        let _ = out.send(reply(json!({"result": result}))).await;
        return;
    }
    let signal = CancelSignal::new();
    in_flight.lock().await.insert(key.clone(), signal.clone());
    let shared = Arc::clone(shared);
    let in_flight = Arc::clone(in_flight);
    tokio::spawn(async move {
        let permit = match slot {
            Some(slot) => Some(slot),
            None => {
                let permit = tokio::select! {
                    permit = Arc::clone(&shared.slots).acquire_owned() => permit.ok(),
                    () = signal.cancelled() => None,
                };
                shared.stats.queued.fetch_sub(1, Ordering::SeqCst);
                permit
            }
        };
        let body = match permit {
            None => {
                json!({"result": ToolResult::rejected("", "", ToolError::new(ErrorKind::Cancelled, "cancelled while queued"))})
            }
            Some(_permit) => {
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
                let result = run(&shared.gate, opts).await;
                relay.abort();
                shared.stats.in_flight.fetch_sub(1, Ordering::SeqCst);
                json!({"result": result})
            }
        };
        in_flight.lock().await.remove(&key);
        let _ = out.send(reply(body)).await;
    });
}
