//! The egress proxy server: one per call, serving the one worker whose network namespace
//! holds its listening socket.
//!
//! Each connection is sniffed by its first byte (`0x05` is SOCKS5, anything else HTTP),
//! its target is checked against the host rules, the name is resolved once, every address
//! about to be tried is checked against the policy, and the connection goes to that exact
//! address, so no second lookup can swap in another (DNS rebinding). Bytes are then spliced
//! both ways and counted.
//!
//! Limits, per call: connections open at once, connections in all, and bytes in all. The
//! byte limit counts both directions of every connection together (the request heads sent
//! upstream included, the proxy's own answers not); a tunnel that reaches it is ended, and
//! later connections are refused. The stop signal (the call's end) ends every tunnel at
//! once, and [`serve`] returns the summary when the last connection is gone.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use super::http::{self, ProxyRequest, ReadError};
use super::socks::{self, Reply, SocksError};
use crate::cancel::CancelSignal;
use airlock_policy::egress::{Decision, DenyReason, EgressPolicy, Host};

mod connection;
mod relay;
mod resolve;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bounds;

pub use resolve::SystemResolver;

/// Per-call limits of the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EgressLimits {
    /// Connections open at once; more are refused (403, or SOCKS reply `0x02`).
    pub max_concurrent: u32,
    /// Connections accepted over the whole call, refused ones included; more are refused
    /// and only counted. The event sink gets at most this many events per call.
    pub max_connections: u32,
    /// Bytes relayed over the whole call, both directions of all connections together.
    pub max_bytes: u64,
    /// Bound on resolving a name, and on each connection attempt to one address.
    pub connect_timeout: Duration,
    /// Events kept in the [`EgressSummary`]; later ones are only counted.
    pub max_events: u32,
}

impl Default for EgressLimits {
    fn default() -> Self {
        EgressLimits {
            max_concurrent: 64,
            max_connections: 1024,
            max_bytes: 1 << 30,
            connect_timeout: Duration::from_secs(10),
            max_events: 64,
        }
    }
}

impl EgressLimits {
    /// Descriptors one call's proxy may hold at once: its listener, both ends of every
    /// connection it relays (an attempt in progress included), the connections it is
    /// refusing, and those of the name lookups it may have in flight. A daemon counts this
    /// against its open-file limit for every call that may go out.
    pub fn descriptors_at_most(&self) -> u64 {
        const LISTENER: u64 = 1;
        // A lookup's DNS socket, and a second where A and AAAA go out on sockets of their
        // own (`single-request-reopen`) or the hosts file is being read.
        const PER_LOOKUP: u64 = 2;
        u64::from(self.max_concurrent)
            .saturating_mul(2)
            .saturating_add(u64::from(MAX_REFUSING))
            .saturating_add(LISTENER)
            .saturating_add(u64::from(MAX_LOOKUPS) * PER_LOOKUP)
    }
}

/// Connections being answered with a refusal at once, beyond `max_concurrent`; past this
/// a connection is closed without an answer, so a flood cannot pile up tasks.
const MAX_REFUSING: u32 = 16;
/// How long the proxy stops accepting when it is out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Name lookups in flight at once. A lookup counts until the resolver's work has ended,
/// not until its connection stops waiting: getaddrinfo cannot be called off, and keeps a
/// thread of the daemon's blocking pool and a socket until it returns.
const MAX_LOOKUPS: u32 = 4;
/// Addresses of one name tried at most.
const MAX_ADDRESSES: usize = 16;
/// Buffer of each direction of a tunnel.
const PUMP_BUFFER: usize = 16 * 1024;
/// Bytes read and discarded after a refusal while waiting for the client to close.
const LINGER_BYTES: usize = 64 * 1024;

/// The future a [`Resolve`] returns.
pub type ResolveFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<IpAddr>, ResolveError>> + Send + 'a>>;

/// Resolves a host name to addresses. Injectable so that tests can map names to any address.
///
/// The proxy runs each lookup's future to its end, even after the connection that asked
/// stopped waiting, and counts it against its lookups in flight until then: a future should
/// end when the work it stands for does.
pub trait Resolve: Send + Sync + fmt::Debug {
    /// The addresses of `name` (already validated and lower case), in preference order.
    fn resolve<'a>(&'a self, name: &'a str) -> ResolveFuture<'a>;

    /// Whether `address` is one of the host's own, which the proxy refuses unless an
    /// `allow_addresses` network covers it: the proxy connects from the host, so such an
    /// address reaches the host's services as loopback would. The host's interfaces as
    /// they are now; an address that cannot be checked counts as the host's.
    fn is_this_host(&self, address: IpAddr) -> bool {
        resolve::is_this_host(address)
    }
}

/// Why a name did not resolve.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// No addresses.
    #[error("the name has no addresses")]
    NotFound,
    /// The lookup failed.
    #[error("lookup failed: {0}")]
    Lookup(#[source] io::Error),
}

/// Where the [`EgressEvent`] of each of a call's first [`EgressLimits::max_connections`]
/// connections goes as it ends.
pub trait EventSink: Send + Sync + fmt::Debug {
    /// Takes one event. Called from the proxy's tasks; must not block.
    fn record(&self, event: &EgressEvent);
}

impl EventSink for mpsc::UnboundedSender<EgressEvent> {
    fn record(&self, event: &EgressEvent) {
        // A dropped receiver only means nobody listens; the summary still has the event.
        let _ = self.send(event.clone());
    }
}

/// Drops every event (the summary still has them).
#[derive(Debug, Clone, Copy, Default)]
pub struct DiscardEvents;

impl EventSink for DiscardEvents {
    fn record(&self, _event: &EgressEvent) {}
}

/// How a connection asked for its destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressKind {
    /// No request was understood.
    #[default]
    Unknown,
    /// HTTP `CONNECT`.
    Connect,
    /// An absolute-form `http://` request.
    Forward,
    /// SOCKS5 `CONNECT`.
    Socks5,
}

/// How an allowed connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TunnelEnd {
    /// Both sides closed.
    Closed,
    /// Reading from or writing to the client failed.
    ClientError,
    /// Reading from or writing to the upstream failed.
    UpstreamError,
    /// The call's byte limit was reached.
    ByteLimit,
    /// The call ended.
    Stopped,
    /// The name did not resolve, or no allowed address accepted the connection.
    Unreachable,
}

/// One connection, as recorded when it ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EgressEvent {
    /// How it asked.
    pub kind: EgressKind,
    /// The host as requested (empty if no request was understood).
    pub host: String,
    /// The port as requested (0 if none).
    pub port: u16,
    /// The address connected to, or the last one tried or refused.
    pub address: Option<SocketAddr>,
    /// Whether the policy allowed it.
    pub allowed: bool,
    /// The rule that allowed it, or `code: reason` for a refusal.
    pub rule_or_reason: String,
    /// Bytes sent to the upstream.
    pub bytes_up: u64,
    /// Bytes sent to the client from the upstream.
    pub bytes_down: u64,
    /// How it ended, for an allowed connection.
    pub end: Option<TunnelEnd>,
    /// The I/O or lookup error behind `end`, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What the proxy did over one call, for the call's result record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EgressSummary {
    /// Connections accepted.
    pub connections: u32,
    /// Connections refused (by the policy, a limit, or as malformed).
    pub refused: u32,
    /// Allowed connections whose upstream could not be reached.
    pub failed: u32,
    /// Bytes sent upstream in all.
    pub bytes_up: u64,
    /// Bytes sent to the client in all.
    pub bytes_down: u64,
    /// The first [`EgressLimits::max_events`] events of the connections within
    /// [`EgressLimits::max_connections`].
    pub events: Vec<EgressEvent>,
    /// Connections not listed: past `max_events`, or past `max_connections` (those are
    /// refused, and not handed to the event sink either).
    pub events_omitted: u32,
}

/// Why the proxy refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The policy refused it.
    Policy(DenyReason),
    /// `max_concurrent` connections were open.
    TooManyConcurrent,
    /// `max_connections` were accepted already.
    TooManyConnections,
    /// The byte limit is used up.
    ByteLimit,
}

impl Refusal {
    /// A short stable code, for the `X-Airlock-Denied` header and records.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Policy(reason) => reason.code(),
            Refusal::TooManyConcurrent => "too-many-concurrent",
            Refusal::TooManyConnections => "too-many-connections",
            Refusal::ByteLimit => "byte-limit",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Policy(reason) => write!(f, "{reason}"),
            Refusal::TooManyConcurrent => f.write_str("too many connections are open at once"),
            Refusal::TooManyConnections => {
                f.write_str("this call has made as many connections as it may")
            }
            Refusal::ByteLimit => f.write_str("this call has relayed as many bytes as it may"),
        }
    }
}

/// Why an allowed connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The name did not resolve.
    #[error("resolving the name failed: {0}")]
    Resolve(#[source] ResolveError),
    /// Resolving took longer than the connect timeout.
    #[error("resolving the name timed out")]
    ResolveTimedOut,
    /// No lookup could start within the connect timeout: as many as the proxy runs at once
    /// were in flight (earlier ones given up on count until they end).
    #[error("no name lookup could start: {MAX_LOOKUPS} lookups were still running")]
    LookupsBusy,
    /// Connecting failed.
    #[error("connecting to {address} failed: {error}")]
    Connect {
        /// The address.
        address: SocketAddr,
        /// The error.
        #[source]
        error: io::Error,
    },
    /// Connecting took longer than the connect timeout.
    #[error("connecting to {address} timed out")]
    ConnectTimedOut {
        /// The address.
        address: SocketAddr,
    },
}

impl UpstreamError {
    /// The SOCKS reply reporting it.
    pub fn socks_reply(&self) -> Reply {
        match self {
            UpstreamError::Connect { error, .. } => match error.kind() {
                io::ErrorKind::ConnectionRefused => Reply::ConnectionRefused,
                io::ErrorKind::NetworkUnreachable => Reply::NetworkUnreachable,
                io::ErrorKind::HostUnreachable | io::ErrorKind::TimedOut => Reply::HostUnreachable,
                _ => Reply::GeneralFailure,
            },
            UpstreamError::Resolve(_)
            | UpstreamError::ResolveTimedOut
            | UpstreamError::LookupsBusy
            | UpstreamError::ConnectTimedOut { .. } => Reply::HostUnreachable,
        }
    }
}

/// The call's byte allowance, shared by every tunnel.
#[derive(Debug)]
struct Budget {
    limit: u64,
    used: AtomicU64,
}

impl Budget {
    /// Takes up to `want` bytes; returns how many were granted.
    fn take(&self, want: usize) -> usize {
        let want64 = u64::try_from(want).unwrap_or(u64::MAX);
        let granted = |used: u64| want64.min(self.limit.saturating_sub(used));
        match self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                let grant = granted(used);
                (grant > 0).then_some(used.saturating_add(grant))
            }) {
            Ok(used) => usize::try_from(granted(used)).unwrap_or(want),
            Err(_) => 0,
        }
    }

    fn exhausted(&self) -> bool {
        self.used.load(Ordering::Acquire) >= self.limit
    }
}

/// State shared by the accept loop and every connection.
#[derive(Debug)]
struct Shared {
    policy: Arc<EgressPolicy>,
    limits: EgressLimits,
    resolver: Arc<dyn Resolve>,
    /// Permits for [`MAX_LOOKUPS`] lookups at once.
    lookups: Arc<Semaphore>,
    events: Arc<dyn EventSink>,
    stop: CancelSignal,
    active: AtomicU32,
    refusing: AtomicU32,
    accepted: AtomicU32,
    budget: Budget,
    summary: Mutex<EgressSummary>,
}

impl Shared {
    /// Records a finished connection in the summary and, if it is `audited`, hands its
    /// event to the sink. Only the first `max_connections` connections are: a flood past
    /// the limit is only counted, so the sink takes at most that many events per call and
    /// needs neither to drop one nor to grow without bound.
    fn finish(&self, conn: Conn, audited: bool) {
        let event = conn.into_event();
        {
            let mut summary = self.summary.lock().unwrap_or_else(PoisonError::into_inner);
            summary.connections = summary.connections.saturating_add(1);
            if !event.allowed {
                summary.refused = summary.refused.saturating_add(1);
            } else if event.end == Some(TunnelEnd::Unreachable) {
                summary.failed = summary.failed.saturating_add(1);
            }
            summary.bytes_up = summary.bytes_up.saturating_add(event.bytes_up);
            summary.bytes_down = summary.bytes_down.saturating_add(event.bytes_down);
            if audited
                && summary.events.len() < usize::try_from(self.limits.max_events).unwrap_or(0)
            {
                summary.events.push(event.clone());
            } else {
                summary.events_omitted = summary.events_omitted.saturating_add(1);
            }
        }
        if audited {
            self.events.record(&event);
        }
    }
}

/// A held connection slot, given back on drop.
struct Slot {
    shared: Arc<Shared>,
    refusing: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let counter = if self.refusing {
            &self.shared.refusing
        } else {
            &self.shared.active
        };
        counter.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One connection's record as it goes.
#[derive(Debug, Default)]
struct Conn {
    kind: EgressKind,
    host: String,
    port: u16,
    address: Option<SocketAddr>,
    allowed: bool,
    rule_or_reason: String,
    up: AtomicU64,
    down: AtomicU64,
    end: Option<TunnelEnd>,
    error: Option<String>,
}

impl Conn {
    fn refuse(&mut self, reason: impl fmt::Display) {
        self.allowed = false;
        self.rule_or_reason = reason.to_string();
    }

    fn refused_by(&mut self, refusal: &Refusal) {
        self.refuse(format_args!("{}: {refusal}", refusal.code()));
    }

    fn ended(&mut self, end: TunnelEnd, error: Option<String>) {
        self.end = Some(end);
        self.error = error;
    }

    /// The call ended while the connection was open.
    fn stopped(&mut self) {
        if self.allowed {
            if self.end.is_none() {
                self.end = Some(TunnelEnd::Stopped);
            }
        } else if self.rule_or_reason.is_empty() {
            self.rule_or_reason = "stopped: the call ended before a request was made".into();
        }
    }

    fn into_event(self) -> EgressEvent {
        EgressEvent {
            kind: self.kind,
            host: self.host,
            port: self.port,
            address: self.address,
            allowed: self.allowed,
            rule_or_reason: self.rule_or_reason,
            bytes_up: self.up.into_inner(),
            bytes_down: self.down.into_inner(),
            end: self.end,
            error: self.error,
        }
    }
}

/// Serves the proxy on `listener` until `stop` is triggered, then ends every tunnel and
/// returns the summary once every connection is gone.
pub async fn serve(
    listener: TcpListener,
    policy: Arc<EgressPolicy>,
    limits: EgressLimits,
    resolver: Arc<dyn Resolve>,
    events: Arc<dyn EventSink>,
    stop: CancelSignal,
) -> EgressSummary {
    let shared = Arc::new(Shared {
        policy,
        limits,
        resolver,
        lookups: Arc::new(Semaphore::new(MAX_LOOKUPS as usize)),
        events,
        stop: stop.clone(),
        active: AtomicU32::new(0),
        refusing: AtomicU32::new(0),
        accepted: AtomicU32::new(0),
        budget: Budget {
            limit: limits.max_bytes,
            used: AtomicU64::new(0),
        },
        summary: Mutex::new(EgressSummary::default()),
    });
    let mut tasks = JoinSet::new();
    let mut accepting = true;
    // Out of descriptors, the pending connection stays queued and the next accept fails at
    // once: wait for tunnels (this call's or others') to close rather than spin or give up.
    let resume = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(resume);
    let mut paused = false;
    // Said once per call: a shortage that lasts would otherwise be said ten times a second.
    let mut short_of_descriptors = false;
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            // Reap finished connections so the set does not grow over a long call.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            () = &mut resume, if paused => paused = false,
            accepted = listener.accept(), if accepting && !paused => match accepted {
                Ok((stream, _)) => admit(&shared, &mut tasks, stream),
                Err(error) if is_transient(&error) => {}
                Err(error) if crate::sys::out_of_descriptors(&error) => {
                    if !short_of_descriptors {
                        tracing::warn!(%error, "egress proxy: out of descriptors; accepting again shortly");
                        short_of_descriptors = true;
                    }
                    resume.as_mut().reset(tokio::time::Instant::now() + ACCEPT_BACKOFF);
                    paused = true;
                }
                Err(error) => {
                    // Retrying a persistent failure would spin; open tunnels carry on.
                    tracing::warn!(%error, "egress proxy: accept failed; taking no more connections");
                    accepting = false;
                }
            },
        }
    }
    drop(listener);
    // Every connection task watches `stop` too, so these finish promptly.
    while tasks.join_next().await.is_some() {}
    shared
        .summary
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Accept errors that concern one connection only.
fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// Takes a slot for a new connection (or a refusal slot) and starts its task.
fn admit(shared: &Arc<Shared>, tasks: &mut JoinSet<()>, stream: TcpStream) {
    let limits = &shared.limits;
    let accepted = shared
        .accepted
        .fetch_add(1, Ordering::AcqRel)
        .saturating_add(1);
    if accepted == u32::MAX {
        // Keep the count from wrapping back under the limit.
        shared.accepted.store(u32::MAX, Ordering::Release);
    }
    // Past the limit every connection is refused, so none of them can carry data out.
    let audited = accepted <= limits.max_connections;
    let refusal = if !audited {
        Some(Refusal::TooManyConnections)
    } else if shared.active.load(Ordering::Acquire) >= limits.max_concurrent {
        Some(Refusal::TooManyConcurrent)
    } else {
        None
    };
    let slot = match refusal {
        None => {
            shared.active.fetch_add(1, Ordering::AcqRel);
            Slot {
                shared: Arc::clone(shared),
                refusing: false,
            }
        }
        Some(refusal) => {
            if shared.refusing.load(Ordering::Acquire) >= MAX_REFUSING {
                drop(stream);
                let mut conn = Conn::default();
                conn.refused_by(&refusal);
                shared.finish(conn, audited);
                return;
            }
            shared.refusing.fetch_add(1, Ordering::AcqRel);
            Slot {
                shared: Arc::clone(shared),
                refusing: true,
            }
        }
    };
    tasks.spawn(connection::connection(
        Arc::clone(shared),
        stream,
        slot,
        refusal,
        audited,
    ));
}
