//! The daemon: the gate served over a Unix socket to gateways in any language.
//!
//! JSON lines (one request object per line, `{"id": ..., "op": ..., ...}`, answered by one
//! line echoing the `id` with `result` or `error`) or, for Rust clients, bincode frames of
//! [`FrameRequest`]/[`FrameResponse`] (detected from the first byte). Many requests may be in
//! flight on one connection and responses come back as they finish. Peers are checked with
//! SO_PEERCRED; a disconnecting client has its in-flight calls cancelled (workers killed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use airlock_policy::validate::ToolState;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Mutex, Semaphore, mpsc};

use crate::call::ToolCall;
use crate::cancel::CancelSignal;
use crate::gate::{CallOptions, Gate};
use crate::result::{ErrorKind, ToolError, ToolResult};

/// Largest request line or frame, bytes.
pub const MAX_REQUEST_BYTES: usize = 2 << 20;

/// Why the daemon could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Binding the socket failed.
    #[error("cannot listen on {path}")]
    Bind {
        /// Socket path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Setting the socket's mode failed.
    #[error("cannot put a mode-0600 socket at {path}")]
    Mode {
        /// Socket path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Daemon settings.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Socket path (created with mode 0600; an existing socket file is replaced).
    pub socket: PathBuf,
    /// Peer uids allowed besides our own.
    pub allow_uids: Vec<u32>,
    /// Peer gids allowed.
    pub allow_gids: Vec<u32>,
    /// Calls running at once.
    pub max_concurrent: usize,
    /// Calls waiting for a slot before new ones get `overloaded`.
    pub max_queued: usize,
    /// How long in-flight calls may finish after SIGTERM.
    pub grace: Duration,
}

impl DaemonConfig {
    /// Defaults for a socket path.
    pub fn new(socket: PathBuf) -> Self {
        Self {
            socket,
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            max_concurrent: 8,
            max_queued: 64,
            grace: Duration::from_secs(10),
        }
    }
}

/// Counters for `stats`.
#[derive(Debug, Default)]
struct Stats {
    connections: AtomicU64,
    refused_peers: AtomicU64,
    requests: AtomicU64,
    calls: AtomicU64,
    in_flight: AtomicUsize,
    queued: AtomicUsize,
    overloaded: AtomicU64,
}

/// A request, as both wire formats carry it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// List active tools with their input schemas.
    Tools,
    /// Call a tool.
    Call(CallRequest),
    /// Cancel an in-flight request of this connection.
    Cancel {
        /// The id of the request to cancel.
        target: Value,
    },
    /// Phase one of an approval.
    Propose(CallRequest),
    /// Phase two of an approval.
    Execute {
        /// The approval.
        approval_id: String,
        /// Session.
        #[serde(default)]
        session: Option<String>,
    },
    /// Delete a pending approval.
    Reject {
        /// The approval.
        approval_id: String,
    },
    /// Change a tool's availability.
    SetState {
        /// Tool.
        tool: String,
        /// `active`, `deferred` or `suspended`.
        state: String,
    },
    /// Liveness.
    Health,
    /// Counters.
    Stats,
}

/// The fields of `call` and `propose`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallRequest {
    /// Tool name.
    pub tool: String,
    /// Arguments as a JSON value (JSON clients).
    #[serde(default)]
    pub arguments: Option<Value>,
    /// Arguments as JSON text (bincode clients, or JSON clients that prefer text).
    #[serde(default)]
    pub arguments_json: Option<String>,
    /// Call id (default: the request id).
    #[serde(default)]
    pub call_id: Option<String>,
    /// Session id.
    #[serde(default)]
    pub session: Option<String>,
    /// Plan mode.
    #[serde(default)]
    pub plan_mode: bool,
}

/// A bincode-framed request: the op travels as JSON text (bincode cannot carry a dynamic
/// JSON value), so both formats share one parser.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FrameRequest {
    /// Request id, echoed.
    pub id: u64,
    /// The [`Op`] as JSON text.
    pub op_json: String,
}

/// A bincode-framed response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FrameResponse {
    /// The request id.
    pub id: u64,
    /// `{"result": ...}` or `{"error": {...}}` as JSON text.
    pub body_json: String,
}

fn error_body(kind: &str, message: impl Into<String>) -> Value {
    json!({"error": {"kind": kind, "message": message.into()}})
}

/// Shared state of a running daemon.
#[derive(Debug)]
struct Shared {
    gate: Arc<Gate>,
    config: DaemonConfig,
    slots: Arc<Semaphore>,
    stats: Stats,
    shutdown: CancelSignal,
    calls: CancelSignal,
}

/// Serves `gate` on `config.socket` until `stop` is triggered, then drains in-flight calls
/// for up to `config.grace`, cancels the rest and removes the socket.
pub async fn serve(
    gate: Arc<Gate>,
    config: DaemonConfig,
    stop: CancelSignal,
) -> Result<(), DaemonError> {
    let path = config.socket.clone();
    let display = path.display().to_string();
    // Bind under a temporary name, set 0600, then rename into place: the socket never
    // exists at its public path with a wider mode, not even for an instant.
    let staging = path.with_file_name(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map_or("airlock.sock".into(), |n| n.to_string_lossy().into_owned()),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&staging);
    let listener = UnixListener::bind(&staging).map_err(|source| DaemonError::Bind {
        path: display.clone(),
        source,
    })?;
    {
        use std::os::unix::fs::PermissionsExt;
        let placed = std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&staging, &path));
        if let Err(source) = placed {
            let _ = std::fs::remove_file(&staging);
            return Err(DaemonError::Mode {
                path: display.clone(),
                source,
            });
        }
    }
    let shared = Arc::new(Shared {
        slots: Arc::new(Semaphore::new(config.max_concurrent.max(1))),
        gate,
        config,
        stats: Stats::default(),
        shutdown: stop.clone(),
        calls: CancelSignal::new(),
    });
    tracing::info!(socket = %path.display(), "airlock daemon listening");
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let shared = Arc::clone(&shared);
                    tokio::spawn(async move { serve_connection(shared, stream).await });
                }
                Err(e) => tracing::warn!(error = %e, "accept failed"),
            },
        }
    }
    drop(listener);
    let _ = std::fs::remove_file(&path);
    // Let in-flight calls finish within the grace period, then cancel what remains.
    let deadline = tokio::time::Instant::now() + shared.config.grace;
    while shared.stats.in_flight.load(Ordering::SeqCst) + shared.stats.queued.load(Ordering::SeqCst)
        > 0
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shared.calls.cancel();
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while shared.stats.in_flight.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tracing::info!("airlock daemon stopped");
    Ok(())
}

fn peer_allowed(config: &DaemonConfig, uid: u32, gid: u32) -> bool {
    uid == nix::unistd::geteuid().as_raw()
        || config.allow_uids.contains(&uid)
        || config.allow_gids.contains(&gid)
}

async fn serve_connection(shared: Arc<Shared>, stream: UnixStream) {
    shared.stats.connections.fetch_add(1, Ordering::Relaxed);
    let (mut reader, mut writer) = stream.into_split();
    let cred = reader.as_ref().peer_cred();
    let allowed = cred
        .as_ref()
        .is_ok_and(|c| peer_allowed(&shared.config, c.uid(), c.gid()));
    if !allowed {
        shared.stats.refused_peers.fetch_add(1, Ordering::Relaxed);
        let who = cred
            .map(|c| format!("uid {} gid {}", c.uid(), c.gid()))
            .unwrap_or_else(|e| format!("unknown peer ({e})"));
        tracing::warn!(peer = %who, "refused a daemon client");
        let line = format!(
            "{}\n",
            json!({"id": null, "error": {"kind": "forbidden", "message": format!("peer {who} is not allowed")}})
        );
        let _ = writer.write_all(line.as_bytes()).await;
        return;
    }
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(256);
    let write_task = tokio::spawn(async move {
        while let Some(bytes) = out_rx.recv().await {
            if writer.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    // In-flight requests of this connection, by id, for cancel and disconnect.
    let in_flight: Arc<Mutex<HashMap<String, CancelSignal>>> = Arc::new(Mutex::new(HashMap::new()));

    let mut first = [0u8; 1];
    let framed = match reader.read(&mut first).await {
        Ok(1) => !(first[0] == b'{' || first[0].is_ascii_whitespace()),
        _ => {
            write_task.abort();
            return;
        }
    };
    let mut buffer: Vec<u8> = first.to_vec();
    if framed {
        serve_frames(&shared, &mut reader, buffer, &out_tx, &in_flight).await;
    } else {
        let mut chunk = [0u8; 64 * 1024];
        let mut oversized = false;
        loop {
            while let Some(pos) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=pos).collect();
                if oversized {
                    oversized = false;
                    continue;
                }
                handle_json_line(&shared, &line, &out_tx, &in_flight).await;
            }
            if buffer.len() > MAX_REQUEST_BYTES {
                // Answer once, then discard the rest of this line.
                let _ = out_tx.send(format!("{}\n", json!({"id": null, "error": {"kind": "invalid_request", "message": format!("request larger than {MAX_REQUEST_BYTES} bytes")}})).into_bytes()).await;
                buffer.clear();
                oversized = true;
            }
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
    }
    // The client is gone: cancel everything it still had running.
    for (_, signal) in in_flight.lock().await.drain() {
        signal.cancel();
    }
    drop(out_tx);
    let _ = write_task.await;
}

async fn serve_frames(
    shared: &Arc<Shared>,
    reader: &mut tokio::net::unix::OwnedReadHalf,
    mut pending: Vec<u8>,
    out: &mpsc::Sender<Vec<u8>>,
    in_flight: &Arc<Mutex<HashMap<String, CancelSignal>>>,
) {
    let mut decoder = airlock_protocol::FrameDecoder::with_max_frame_bytes(MAX_REQUEST_BYTES);
    let mut chunk = [0u8; 64 * 1024];
    loop {
        let mut input: &[u8] = &pending;
        let mut requests = Vec::new();
        let mut broken = false;
        while !input.is_empty() {
            match decoder.decode_message::<FrameRequest>(&mut input) {
                Ok(Some(request)) => requests.push(request),
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "malformed frame from a daemon client");
                    broken = true;
                    break;
                }
            }
        }
        pending.clear();
        for request in requests {
            let id = Value::from(request.id);
            let op = serde_json::from_str::<Op>(&request.op_json);
            let out = out.clone();
            let reply: Box<dyn Fn(Value) -> Vec<u8> + Send + Sync> =
                Box::new(move |body: Value| {
                    let response = FrameResponse {
                        id: request.id,
                        body_json: body.to_string(),
                    };
                    airlock_protocol::frame::encode_frame(&response).unwrap_or_default()
                });
            dispatch(
                shared,
                id,
                op.map_err(|e| e.to_string()),
                out,
                reply,
                in_flight,
            )
            .await;
        }
        if broken {
            return;
        }
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
        }
    }
}

async fn handle_json_line(
    shared: &Arc<Shared>,
    line: &[u8],
    out: &mpsc::Sender<Vec<u8>>,
    in_flight: &Arc<Mutex<HashMap<String, CancelSignal>>>,
) {
    let text = String::from_utf8_lossy(line);
    if text.trim().is_empty() {
        return;
    }
    let parsed: Result<Value, _> = serde_json::from_str(&text);
    let (id, op) = match parsed {
        Ok(value) => {
            let id = value.get("id").cloned().unwrap_or(Value::Null);
            (
                id,
                serde_json::from_value::<Op>(value).map_err(|e| e.to_string()),
            )
        }
        Err(e) => (
            Value::Null,
            Err(format!(
                "not JSON: line {}, column {}",
                e.line(),
                e.column()
            )),
        ),
    };
    let reply_id = id.clone();
    let reply: Box<dyn Fn(Value) -> Vec<u8> + Send + Sync> = Box::new(move |mut body: Value| {
        if let Value::Object(map) = &mut body {
            map.insert("id".into(), reply_id.clone());
        }
        format!("{body}\n").into_bytes()
    });
    dispatch(shared, id, op, out.clone(), reply, in_flight).await;
}

/// Runs one request; calls run in their own task so responses may come out of order.
async fn dispatch(
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

/// A blocking-free Rust client for the daemon's bincode protocol.
#[derive(Debug)]
pub struct DaemonClient {
    stream: UnixStream,
    next_id: u64,
    decoder: airlock_protocol::FrameDecoder,
    pending: Vec<u8>,
}

impl DaemonClient {
    /// Connects to a daemon socket.
    pub async fn connect(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            stream: UnixStream::connect(path).await?,
            next_id: 1,
            decoder: airlock_protocol::FrameDecoder::with_max_frame_bytes(
                airlock_protocol::MAX_FRAME_BYTES,
            ),
            pending: Vec::new(),
        })
    }

    /// Sends one op and waits for its response body (`{"result": ...}` or `{"error": ...}`).
    pub async fn request(&mut self, op: &Op) -> std::io::Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let op_json = serde_json::to_string(op).map_err(std::io::Error::other)?;
        let frame = airlock_protocol::frame::encode_frame(&FrameRequest { id, op_json })
            .map_err(std::io::Error::other)?;
        self.stream.write_all(&frame).await?;
        loop {
            let mut input: &[u8] = &self.pending;
            let decoded = self.decoder.decode_message::<FrameResponse>(&mut input);
            let consumed = self.pending.len() - input.len();
            self.pending.drain(..consumed);
            match decoded {
                Ok(Some(response)) if response.id == id => {
                    return serde_json::from_str(&response.body_json)
                        .map_err(std::io::Error::other);
                }
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => return Err(std::io::Error::other(e)),
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "daemon closed the connection",
                ));
            }
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }

    /// Calls a tool and returns its result record.
    pub async fn call(
        &mut self,
        tool: &str,
        arguments_json: &str,
    ) -> std::io::Result<ToolResultJson> {
        let body = self
            .request(&Op::Call(CallRequest {
                tool: tool.into(),
                arguments: None,
                arguments_json: Some(arguments_json.into()),
                call_id: None,
                session: None,
                plan_mode: false,
            }))
            .await?;
        Ok(ToolResultJson(body.get("result").cloned().unwrap_or(body)))
    }
}

/// A result record as JSON (the daemon's wire form).
#[derive(Debug, Clone)]
pub struct ToolResultJson(pub Value);
