//! The daemon: the gate served over a Unix socket to gateways in any language.
//!
//! JSON lines (one request object per line, `{"id": ..., "op": ..., ...}`, answered by one
//! line echoing the `id` with `result` or `error`) or, for Rust clients, bincode frames of
//! [`FrameRequest`]/[`FrameResponse`] (detected from the first byte). Many requests may be in
//! flight on one connection and responses come back as they finish. Peers are checked with
//! SO_PEERCRED; a disconnecting client has its in-flight calls cancelled (workers killed).
//!
//! Everything a client can make the daemon hold is bounded, summed over all clients: the
//! connections open, the bytes of unfinished request lines and of admitted calls' arguments
//! (the input budget), and the bytes of answers not yet written (the output budget). A
//! finished call keeps its concurrency slot until its answer starts out to the client (its
//! connection writes one answer at a time), so a client that does not read stops getting
//! calls run, and a connection that has not taken an answer whole `write_timeout` after
//! it was ready is closed and its calls cancelled; a request not received whole within
//! `read_timeout` is dropped.

mod budget;

mod client;
mod connection;
mod descriptors;
mod dispatch;
mod fair;
mod framed;
mod metrics;
mod metrics_http;
mod sessions;
mod trim;
mod wire;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::Semaphore;

use crate::cancel::CancelSignal;
use crate::gate::Gate;

pub use client::{DaemonClient, ToolResultJson};
pub use descriptors::{open_files_needed_by, raise_open_file_limit};
pub use metrics_http::{MetricsError, MetricsListen};
pub use wire::{
    CallRequest, CancelRequest, ExecuteRequest, FrameRequest, FrameResponse, GetFileRequest,
    MAX_ID_BYTES, MAX_REQUEST_BYTES, Op, PutFileRequest, RejectRequest, RequestError,
    SessionOpenRequest, SessionRequest, SetStateRequest, SizeField, parse_line, parse_op,
};

/// The JSON Schema of the daemon's JSON lines: every request a client may send and every
/// answer the daemon sends (`airlock schema --daemon`; docs/daemon.md explains it).
pub const PROTOCOL_SCHEMA: &str = include_str!("protocol.schema.json");

/// The version of the daemon's wire contract, which `health` reports. It changes when an
/// op, a field or an answer changes in a way a client written for the old one would
/// misread; clients compare it and refuse a daemon speaking another.
pub const DAEMON_PROTOCOL_VERSION: u32 = 1;

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
    /// Setting the socket's mode or group failed.
    #[error("cannot put a socket of mode {mode:04o} at {path}")]
    Mode {
        /// The mode asked for.
        mode: u32,
        /// Socket path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The metrics listener could not start.
    #[error("cannot serve metrics")]
    Metrics(#[from] MetricsError),
}

/// Daemon settings.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Socket path (an existing socket file is replaced).
    pub socket: PathBuf,
    /// The socket's mode (default 0600: only the daemon's uid can connect at all; the peer
    /// check comes after). Never wider than 0660: others are refused by the kernel first.
    pub socket_mode: u32,
    /// The socket's group, so an `--allow-gid` group can reach it with mode 0660.
    pub socket_group: Option<u32>,
    /// Peer uids allowed besides our own.
    pub allow_uids: Vec<u32>,
    /// Peer gids allowed.
    pub allow_gids: Vec<u32>,
    /// When any is given, only peers with these uids or gids may `execute` and `reject`
    /// approvals and `set_state` tools (they may connect, too).
    pub approver_uids: Vec<u32>,
    /// See `approver_uids`.
    pub approver_gids: Vec<u32>,
    /// Calls running at once.
    pub max_concurrent: usize,
    /// The size of each pool the daemon keeps for its policy's profiles (none without
    /// `--pool`): the idle workers hold descriptors, counted against the open-file limit.
    pub pool: Option<crate::pool::PoolSize>,
    /// Calls waiting for a slot before new ones get `overloaded`.
    pub max_queued: usize,
    /// How long in-flight calls may finish after SIGTERM.
    pub grace: Duration,
    /// Client connections open at once; more are answered `overloaded` and closed.
    pub max_connections: usize,
    /// Bytes of unfinished request lines and of admitted calls' arguments, over all
    /// connections.
    pub max_input_bytes: usize,
    /// Bytes of answers waiting to be written, over all connections.
    pub max_output_bytes: usize,
    /// A connection whose client has not taken an answer whole this long after the answer
    /// took its share of the output budget is closed and its calls cancelled.
    pub write_timeout: Duration,
    /// A request must arrive whole within this long of its first byte; one that does not
    /// is answered and dropped, so that nothing half sent holds the input budget longer.
    pub read_timeout: Duration,
    /// Where to answer Prometheus scrapes (`GET /metrics`), if anywhere.
    pub metrics: Option<MetricsListen>,
}

impl DaemonConfig {
    /// Defaults for a socket path.
    pub fn new(socket: PathBuf) -> Self {
        Self {
            socket,
            socket_mode: 0o600,
            socket_group: None,
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            approver_uids: Vec::new(),
            approver_gids: Vec::new(),
            max_concurrent: 8,
            pool: None,
            max_queued: 64,
            grace: Duration::from_secs(10),
            max_connections: 128,
            max_input_bytes: 16 << 20,
            max_output_bytes: 16 << 20,
            write_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(10),
            metrics: None,
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
    /// Connections closed because their client did not take an answer within `write_timeout`.
    closed_unread: AtomicU64,
    /// Requests dropped because they did not arrive whole within `read_timeout` (waiting
    /// for their client, or for room in the input budget), and calls refused because the
    /// budget had no room for their arguments.
    input_refused: AtomicU64,
}

/// The output budget's size in semaphore permits: at least one whole request's worth, at
/// most what a permit count can say.
fn output_budget(config: &DaemonConfig) -> usize {
    config
        .max_output_bytes
        .clamp(MAX_REQUEST_BYTES, u32::MAX as usize)
}

/// Shared state of a running daemon.
/// Refused connections wound down at once, at most; more are closed at once.
const LINGERING_REFUSALS: usize = 8;

/// How long the accept loop pauses when the daemon is out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct Shared {
    gate: Arc<Gate>,
    config: DaemonConfig,
    slots: Arc<fair::FairSlots>,
    /// Session ops running at once.
    session_ops: Arc<Semaphore>,
    /// Open connections' places.
    connections: Arc<Semaphore>,
    /// Refused peers' connections being wound down (see `connection::linger`): few, so that
    /// peers the daemon refuses cannot hold many sockets open.
    lingering: Arc<Semaphore>,
    input: Arc<budget::ByteBudget>,
    output: Arc<Semaphore>,
    stats: Stats,
    shutdown: CancelSignal,
    calls: CancelSignal,
    metrics: metrics::Metrics,
    /// Latched once the pools first held their target of idle workers: readiness then
    /// stays, so a burst that empties the pools does not take the daemon out of service.
    warmed: AtomicBool,
    /// The descriptors calls may take, shared out by what each may hold.
    room: Arc<descriptors::Room>,
}

/// Client connections open now.
fn connections_open(shared: &Shared) -> usize {
    shared
        .config
        .max_connections
        .max(1)
        .saturating_sub(shared.connections.available_permits())
}

/// Whether the daemon is ready for calls: it serves a policy (it never runs without one),
/// is not stopping, and its pools have been warm. `Err` says why not.
fn readiness(shared: &Shared) -> Result<(), String> {
    if shared.shutdown.is_cancelled() {
        return Err("the daemon is shutting down".into());
    }
    if shared.warmed.load(Ordering::Relaxed) {
        return Ok(());
    }
    let pool = shared.gate.supervisor().pool_stats();
    if pool.idle < pool.idle_target {
        return Err(format!(
            "pools warming: {} of {} idle workers",
            pool.idle, pool.idle_target
        ));
    }
    shared.warmed.store(true, Ordering::Relaxed);
    Ok(())
}

/// Serves `gate` on `config.socket` until `stop` is triggered, then drains in-flight calls
/// for up to `config.grace`, cancels the rest and removes the socket.
pub async fn serve(
    gate: Arc<Gate>,
    config: DaemonConfig,
    stop: CancelSignal,
) -> Result<(), DaemonError> {
    let metrics_listener = match config.metrics {
        Some(listen) => Some(metrics_http::bind(listen).await?),
        None => None,
    };
    // Before the socket appears: a client that finds it finds the limit raised, too.
    let open_files = descriptors::provide();
    let (room, withholding) = descriptors::Room::new(
        &config,
        open_files,
        gate.policy(),
        gate.supervisor().egress_limits(),
    );
    room.warn_if_short(&config, room.refresh(&config, &gate.policy()));
    let withholding = tokio::spawn(withholding);
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
        let mode = config.socket_mode & 0o660;
        let placed = std::os::unix::fs::chown(&staging, None, config.socket_group)
            .and_then(|()| {
                std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(mode))
            })
            .and_then(|()| std::fs::rename(&staging, &path));
        if let Err(source) = placed {
            let _ = std::fs::remove_file(&staging);
            return Err(DaemonError::Mode {
                mode,
                path: display.clone(),
                source,
            });
        }
    }
    let shared = Arc::new(Shared {
        slots: fair::FairSlots::new(config.max_concurrent.max(1), config.max_queued),
        session_ops: Arc::new(Semaphore::new(sessions::SESSION_OPS_AT_ONCE)),
        connections: Arc::new(Semaphore::new(config.max_connections.max(1))),
        lingering: Arc::new(Semaphore::new(LINGERING_REFUSALS)),
        input: budget::ByteBudget::new(config.max_input_bytes.max(MAX_REQUEST_BYTES)),
        output: Arc::new(Semaphore::new(output_budget(&config))),
        gate,
        config,
        stats: Stats::default(),
        shutdown: stop.clone(),
        calls: CancelSignal::new(),
        metrics: metrics::Metrics::new(),
        warmed: AtomicBool::new(false),
        room,
    });
    // A supervisor the embedding program already observes keeps its observer.
    shared
        .gate
        .supervisor()
        .observe_spawns(shared.metrics.spawn_observer());
    tracing::info!(socket = %path.display(), "airlock daemon listening");
    let metrics_task = metrics_listener.map(|listener| {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "metrics listening");
        }
        tokio::spawn(metrics_http::serve(
            listener,
            Arc::clone(&shared),
            stop.clone(),
        ))
    });
    let sweeper = sessions::keep_sweeping(&shared.gate);
    let trimmer = tokio::spawn(trim::give_back_memory_when_idle(Arc::clone(&shared)));
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let shared = Arc::clone(&shared);
                    match Arc::clone(&shared.connections).try_acquire_owned() {
                        Ok(place) => {
                            tokio::spawn(connection::serve_connection(shared, stream, place));
                        }
                        Err(_) => {
                            shared.stats.overloaded.fetch_add(1, Ordering::Relaxed);
                            connection::turn_away(&shared, stream);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    // Out of descriptors, the pending connection stays queued and the next
                    // accept fails at once: wait for calls to end and free some rather
                    // than spin on it.
                    if crate::sys::out_of_descriptors(&e) {
                        tokio::select! {
                            () = stop.cancelled() => break,
                            () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                        }
                    }
                }
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
    if let Some(sweeper) = sweeper {
        sweeper.abort();
    }
    if let Some(task) = metrics_task {
        task.abort();
    }
    trimmer.abort();
    withholding.abort();
    if let Some(sessions) = shared.gate.sessions() {
        sessions.close_all();
    }
    tracing::info!("airlock daemon stopped");
    Ok(())
}
