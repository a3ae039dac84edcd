//! An MCP server over stdio (`airlock mcp`): the gate's active tools offered to any MCP
//! client, every call through the same gate and sandbox as the daemon's.
//!
//! JSON-RPC 2.0, one message a line, on any byte stream pair (stdin and stdout in the
//! binary). `tools/list` publishes the active tools with exactly the schemas the gate
//! enforces; `tools/call` runs the gate and maps its result record (text content,
//! `structuredContent` for an object output schema, `isError` with the error's kind and
//! message); `notifications/cancelled` kills the call's worker through its
//! [`CancelSignal`]; a call needing approval is proposed and then asked of the user with
//! `elicitation/create` when the client can, or answered `approval_required` naming the
//! approval; a policy reload that changes the active tools sends
//! `notifications/tools/list_changed`.
//!
//! Written by hand on tokio and serde_json rather than with an MCP SDK: the server side of
//! MCP used here is a handful of methods, the workspace already has everything it needs,
//! and owning the reader lets every bound be the daemon's kind of bound — a line longer
//! than [`McpConfig::max_line_bytes`] is refused once and skipped rather than buffered, and
//! admitted calls are capped by [`McpConfig::max_concurrent`] and
//! [`McpConfig::max_queued`] — with no dependency tree of its own to audit.

mod calls;
pub mod jsonrpc;
pub mod tools;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinSet;

use crate::audit::sanitize;
use crate::cancel::CancelSignal;
use crate::gate::Gate;
use jsonrpc::{INVALID_PARAMS, INVALID_REQUEST, Incoming, METHOD_NOT_FOUND};

/// The MCP protocol versions this server speaks, newest first. A client asking for one of
/// them gets it; any other gets the newest.
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-06-18", "2025-03-26", "2024-11-05"];

/// Bytes read from the client at a time.
const CHUNK_BYTES: usize = 16 * 1024;

/// Messages waiting for the writer: a client that stops reading stops the server reading
/// its requests once these are queued.
const QUEUED_MESSAGES: usize = 64;

/// Settings of an MCP server.
#[derive(Debug, Clone)]
pub struct McpConfig {
    /// The longest message line taken; a longer one is answered -32600 and skipped.
    pub max_line_bytes: usize,
    /// Calls running at once.
    pub max_concurrent: usize,
    /// Calls waiting for a slot before new ones get an `overloaded` result.
    pub max_queued: usize,
    /// Ask for approvals with `elicitation/create` when the client declares the
    /// capability; when false every call needing one is answered `approval_required`.
    pub elicitation: bool,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            max_line_bytes: crate::daemon::MAX_REQUEST_BYTES,
            max_concurrent: 8,
            max_queued: 64,
            elicitation: true,
        }
    }
}

/// Why the server stopped other than by the end of its input.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// Reading the client's messages failed.
    #[error("cannot read the client's messages")]
    Read(#[source] std::io::Error),
    /// The server's task ended without an answer (it panicked or was aborted).
    #[error("the MCP server's task ended abnormally: {0}")]
    Task(String),
}

/// What `initialize` told us of the client.
#[derive(Debug, Clone)]
struct Client {
    /// It declared the `elicitation` capability (and the server may use it).
    elicitation: bool,
}

/// One client's session: the gate, its calls in flight, and the questions it was asked.
#[derive(Debug)]
struct Session {
    gate: Arc<Gate>,
    config: McpConfig,
    out: mpsc::Sender<Vec<u8>>,
    client: OnceLock<Client>,
    /// Calls in flight, by their request id's JSON text.
    in_flight: Mutex<HashMap<String, CancelSignal>>,
    /// Requests sent to the client awaiting its answer, by id's JSON text.
    asked: Mutex<HashMap<String, oneshot::Sender<Result<Value, Value>>>>,
    next_ask: AtomicU64,
    /// Running calls' places.
    slots: Arc<Semaphore>,
    /// Calls admitted (running or waiting for a slot).
    admitted: AtomicUsize,
    /// The gate session of this client's calls (rate limits, one-at-a-time lanes, audit).
    session_id: String,
    /// The tool list as last published or reloaded, to tell whether a reload changed it.
    listed: Mutex<Value>,
}

/// A lock whose holder panicked still guards consistent data here (maps of signals).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Session {
    async fn send(&self, bytes: Vec<u8>) {
        // Fails only when the writer is gone, and then so is the client.
        let _ = self.out.send(bytes).await;
    }

    async fn error(&self, id: &Value, code: i64, message: &str) {
        self.send(jsonrpc::error_line(id, code, message)).await;
    }

    fn tool_list(&self) -> Value {
        tools::tool_list(&self.gate.tools())
    }

    /// After a policy reload: tells an initialized client when its tool list changed.
    async fn tools_reloaded(&self) {
        let now = self.tool_list();
        let changed = {
            let mut listed = lock(&self.listed);
            let changed = *listed != now;
            *listed = now;
            changed
        };
        if changed && self.client.get().is_some() {
            tracing::info!("the active tools changed; telling the MCP client");
            self.send(jsonrpc::notification_line(
                "notifications/tools/list_changed",
                None,
            ))
            .await;
        }
    }

    fn cancel_all(&self) {
        for (_, signal) in lock(&self.in_flight).drain() {
            signal.cancel();
        }
        // Dropping the senders wakes every call waiting for an answer from the client.
        lock(&self.asked).clear();
    }
}

/// Serves `gate` to the MCP client at the other end of `input` and `output` until `input`
/// ends, `output` fails or `stop` is triggered; then cancels the calls still in flight
/// (their workers are killed) and returns once they are gone. Every change of `reloads`
/// (a policy reload) is checked for a changed tool list.
pub async fn serve<R, W>(
    gate: Arc<Gate>,
    config: McpConfig,
    mut input: R,
    output: W,
    mut reloads: watch::Receiver<u64>,
    stop: CancelSignal,
) -> Result<(), McpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, mut queue) = mpsc::channel::<Vec<u8>>(QUEUED_MESSAGES);
    let gone = CancelSignal::new();
    let writer = {
        let gone = gone.clone();
        let mut output = output;
        tokio::spawn(async move {
            while let Some(bytes) = queue.recv().await {
                if output.write_all(&bytes).await.is_err() || output.flush().await.is_err() {
                    break;
                }
            }
            gone.cancel();
        })
    };
    let session_id = format!(
        "mcp-{}",
        crate::approvals::random_id().unwrap_or_else(|| std::process::id().to_string())
    );
    let session = Arc::new(Session {
        slots: Arc::new(Semaphore::new(config.max_concurrent.max(1))),
        listed: Mutex::new(tools::tool_list(&gate.tools())),
        gate,
        config,
        out,
        client: OnceLock::new(),
        in_flight: Mutex::new(HashMap::new()),
        asked: Mutex::new(HashMap::new()),
        next_ask: AtomicU64::new(1),
        admitted: AtomicUsize::new(0),
        session_id,
    });
    let watcher = {
        let session = Arc::clone(&session);
        tokio::spawn(async move {
            while reloads.changed().await.is_ok() {
                session.tools_reloaded().await;
            }
        })
    };
    let mut tasks = JoinSet::new();
    let outcome = tokio::select! {
        read = read_messages(&session, &mut input, &mut tasks) => read,
        () = stop.cancelled() => Ok(()),
        () = gone.cancelled() => Ok(()),
    };
    session.cancel_all();
    while tasks.join_next().await.is_some() {}
    watcher.abort();
    let _ = watcher.await;
    // The last sender goes with the session: the writer writes what is queued and ends.
    drop(session);
    let _ = writer.await;
    outcome
}

/// Reads lines within the bound and handles each in order.
async fn read_messages<R: AsyncRead + Unpin>(
    session: &Arc<Session>,
    input: &mut R,
    tasks: &mut JoinSet<()>,
) -> Result<(), McpError> {
    let max = session.config.max_line_bytes;
    let mut buffer: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; CHUNK_BYTES];
    // Bytes of `buffer` known to hold no newline.
    let mut scanned = 0;
    // The rest of an oversized line, up to its newline, is skipped.
    let mut skipping = false;
    loop {
        while let Some(pos) = buffer[scanned..].iter().position(|b| *b == b'\n') {
            let end = scanned + pos;
            scanned = 0;
            if std::mem::take(&mut skipping) {
                buffer.drain(..=end);
                continue;
            }
            let line: Vec<u8> = buffer.drain(..=end).collect();
            handle_line(session, &line[..end], tasks).await;
            while tasks.try_join_next().is_some() {}
        }
        scanned = buffer.len();
        if buffer.len() > max {
            if !skipping {
                let message = format!("message longer than {max} bytes");
                session.error(&Value::Null, INVALID_REQUEST, &message).await;
            }
            skipping = true;
            buffer = Vec::new();
            scanned = 0;
        }
        let n = input.read(&mut chunk).await.map_err(McpError::Read)?;
        if n == 0 {
            // A last message without its newline is still a message.
            if !skipping && !buffer.is_empty() {
                let line = std::mem::take(&mut buffer);
                handle_line(session, &line, tasks).await;
            }
            return Ok(());
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

async fn handle_line(session: &Arc<Session>, line: &[u8], tasks: &mut JoinSet<()>) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    match jsonrpc::parse_message(line) {
        Err((id, e)) => session.error(&id, e.code(), &e.to_string()).await,
        Ok(Incoming::Request { id, method, params }) => {
            handle_request(session, id, &method, params, tasks).await;
        }
        Ok(Incoming::Notification { method, params }) => {
            handle_notification(session, &method, params)
        }
        Ok(Incoming::Response { id, outcome }) => {
            let waiting = lock(&session.asked).remove(&id.to_string());
            match waiting {
                Some(answer) => {
                    let _ = answer.send(outcome);
                }
                None => {
                    tracing::warn!(id = %sanitize(&id.to_string()), "an answer to no question of ours")
                }
            }
        }
    }
}

async fn handle_request(
    session: &Arc<Session>,
    id: Value,
    method: &str,
    params: Option<Value>,
    tasks: &mut JoinSet<()>,
) {
    match method {
        "initialize" => initialize(session, &id, params).await,
        "ping" => session.send(jsonrpc::result_line(&id, json!({}))).await,
        "tools/list" | "tools/call" if session.client.get().is_none() => {
            let message = "the session is not initialized: send initialize first";
            session.error(&id, INVALID_REQUEST, message).await;
        }
        "tools/list" => {
            let list = session.tool_list();
            *lock(&session.listed) = list.clone();
            session.send(jsonrpc::result_line(&id, list)).await;
        }
        "tools/call" => calls::start(session, id, params, tasks).await,
        other => {
            let message = format!("no method {:?} here", sanitize(other));
            session.error(&id, METHOD_NOT_FOUND, &message).await;
        }
    }
}

async fn initialize(session: &Session, id: &Value, params: Option<Value>) {
    let Some(Value::Object(params)) = params else {
        let message = "initialize takes an object of params";
        return session.error(id, INVALID_PARAMS, message).await;
    };
    let Some(asked) = params.get("protocolVersion").and_then(Value::as_str) else {
        let message = "initialize needs a \"protocolVersion\" string";
        return session.error(id, INVALID_PARAMS, message).await;
    };
    let version = PROTOCOL_VERSIONS
        .iter()
        .find(|v| **v == asked)
        .unwrap_or(&PROTOCOL_VERSIONS[0]);
    let elicitation = params
        .get("capabilities")
        .and_then(|c| c.get("elicitation"))
        .is_some_and(Value::is_object);
    let client = Client {
        elicitation: elicitation && session.config.elicitation,
    };
    if session.client.set(client).is_err() {
        let message = "the session is already initialized";
        return session.error(id, INVALID_REQUEST, message).await;
    }
    let result = json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": true}},
        "serverInfo": {"name": "airlock", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "Every tool call runs in a fresh airlock sandbox under the policy's gate; \
            failures come back as error results naming their kind.",
    });
    session.send(jsonrpc::result_line(id, result)).await;
}

fn handle_notification(session: &Session, method: &str, params: Option<Value>) {
    match method {
        "notifications/cancelled" => {
            let Some(target) = params.as_ref().and_then(|p| p.get("requestId")) else {
                tracing::warn!("notifications/cancelled without a requestId");
                return;
            };
            // The signal kills the call's worker; the call is then not answered.
            if let Some(signal) = lock(&session.in_flight).get(&target.to_string()) {
                signal.cancel();
            }
        }
        "notifications/initialized" => {}
        other => tracing::debug!(method = %sanitize(other), "ignored a notification"),
    }
}
