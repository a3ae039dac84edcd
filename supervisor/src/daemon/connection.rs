//! One client connection: the peer check, reading requests in either wire format within
//! the input budget, and writing the answers back, as they finish, within the output
//! budget and the write timeout.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc};

use super::budget::Held;
use super::dispatch::dispatch;
use super::fair::{ConnId, Slot, connection_id};
use super::wire::{FrameRequest, FrameResponse, MAX_REQUEST_BYTES, RequestError};
use super::{DaemonConfig, Shared};
use crate::cancel::CancelSignal;

/// Bytes read from a client at a time.
const CHUNK_BYTES: usize = 16 * 1024;

/// Bytes each connection reads without the input budget: a request that fits (a health
/// check, a cancel, most calls) is read however full others keep the budget.
const ALLOWANCE: usize = CHUNK_BYTES;

/// Answers queued per connection beyond the output budget's bytes: a client that does not
/// read fills this, and then its connection is not read either.
const QUEUED_ANSWERS: usize = 16;

/// The requests in flight on one connection, by their id's JSON text.
pub(super) type InFlight = Arc<Mutex<HashMap<String, CancelSignal>>>;

/// How an answer is framed for its client (a JSON line or a bincode frame, with its id).
pub(super) type Reply = Box<dyn Fn(Value) -> Vec<u8> + Send + Sync>;

/// An answer on its way out, with what it keeps taken: its bytes of the output budget until
/// it is written and, for a call, the call's concurrency slot until its writing starts.
#[derive(Debug)]
struct Outgoing {
    bytes: Vec<u8>,
    /// When it must be written whole: `--write-timeout` after it took its budget.
    deadline: tokio::time::Instant,
    _budget: Option<OwnedSemaphorePermit>,
    _slot: Option<Slot>,
}

/// Where one connection's answers go.
#[derive(Debug, Clone)]
pub(super) struct Answers {
    queue: mpsc::Sender<Outgoing>,
    budget: Arc<Semaphore>,
    budget_permits: usize,
    write_timeout: Duration,
}

impl Answers {
    /// Queues `bytes`, waiting for their share of the output budget and a place in this
    /// connection's queue; `slot` is given back as their writing starts. Dropped when the
    /// connection is gone.
    pub(super) async fn send(&self, bytes: Vec<u8>, slot: Option<Slot>) {
        // An answer larger than the whole budget waits for all of it.
        let wanted = u32::try_from(bytes.len().clamp(1, self.budget_permits)).unwrap_or(u32::MAX);
        let budget = tokio::select! {
            permit = Arc::clone(&self.budget).acquire_many_owned(wanted) => permit.ok(),
            () = self.queue.closed() => return,
        };
        // The deadline runs from here, queueing included: whatever the client reads, no
        // answer holds its share of the budget, which other clients' answers wait for,
        // longer than the timeout.
        let deadline = tokio::time::Instant::now() + self.write_timeout;
        let _ = self
            .queue
            .send(Outgoing {
                bytes,
                deadline,
                _budget: budget,
                _slot: slot,
            })
            .await;
    }
}

/// One client connection, as its requests see it.
pub(super) struct Conn {
    /// Which connection it is, for sharing slots fairly.
    pub(super) id: ConnId,
    pub(super) shared: Arc<Shared>,
    /// Where its answers go.
    pub(super) answers: Answers,
    /// Its requests in flight.
    pub(super) in_flight: InFlight,
    pub(super) peer: Peer,
}

/// What the client at the other end may do.
#[derive(Debug, Clone, Copy)]
pub(super) struct Peer {
    /// May `execute` and `reject` approvals and `set_state` tools.
    pub(super) may_approve: bool,
}

fn peer_allowed(config: &DaemonConfig, uid: u32, gid: u32) -> bool {
    uid == nix::unistd::geteuid().as_raw()
        || config.allow_uids.contains(&uid)
        || config.allow_gids.contains(&gid)
        || config.approver_uids.contains(&uid)
        || config.approver_gids.contains(&gid)
}

/// Without an approver role configured every allowed peer approves; with one, only its
/// members do.
fn peer_approves(config: &DaemonConfig, uid: u32, gid: u32) -> bool {
    (config.approver_uids.is_empty() && config.approver_gids.is_empty())
        || config.approver_uids.contains(&uid)
        || config.approver_gids.contains(&gid)
}

/// One line of JSON refusing a client or a request: `id` is null where the request it
/// answers has none that can be read.
fn refusal_line(id: &Value, kind: &str, message: &str, retry_after_ms: Option<u64>) -> Vec<u8> {
    let mut error = json!({"kind": kind, "message": message});
    if let Some(ms) = retry_after_ms {
        error["retry_after_ms"] = json!(ms);
    }
    format!("{}\n", json!({"id": id, "error": error})).into_bytes()
}

/// Says `overloaded` to a connection beyond `max_connections` and closes it, without
/// waiting on a client that does not read.
pub(super) fn turn_away(shared: &Shared, stream: UnixStream) {
    let line = refusal_line(
        &Value::Null,
        "overloaded",
        &format!(
            "{} connections are open, the most this daemon serves",
            shared.config.max_connections
        ),
        Some(1000),
    );
    // A fresh socket's buffer takes one short line; if not, closing says enough.
    let _ = stream.try_write(&line);
}

/// Writes `bytes`, failing when the client has not taken all of them by `deadline`.
async fn write_by<W: AsyncWrite + Unpin>(
    writer: &mut W,
    bytes: &[u8],
    deadline: tokio::time::Instant,
) -> std::io::Result<()> {
    match tokio::time::timeout_at(deadline, writer.write_all(bytes)).await {
        Ok(written) => written,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

/// Serves one client; `place` is its place among `max_connections`, given back when the
/// connection ends (a refused peer's at once).
pub(super) async fn serve_connection(
    shared: Arc<Shared>,
    stream: UnixStream,
    place: OwnedSemaphorePermit,
) {
    shared.stats.connections.fetch_add(1, Ordering::Relaxed);
    let (mut reader, mut writer) = stream.into_split();
    let cred = reader.as_ref().peer_cred();
    let allowed = cred
        .as_ref()
        .is_ok_and(|c| peer_allowed(&shared.config, c.uid(), c.gid()));
    let peer = Peer {
        may_approve: cred
            .as_ref()
            .is_ok_and(|c| peer_approves(&shared.config, c.uid(), c.gid())),
    };
    if !allowed {
        shared.stats.refused_peers.fetch_add(1, Ordering::Relaxed);
        let who = cred
            .map(|c| format!("uid {} gid {}", c.uid(), c.gid()))
            .unwrap_or_else(|e| format!("unknown peer ({e})"));
        tracing::warn!(peer = %who, "refused a daemon client");
        let line = refusal_line(
            &Value::Null,
            "forbidden",
            &format!("peer {who} is not allowed"),
            None,
        );
        drop(place);
        let deadline = tokio::time::Instant::now() + shared.config.write_timeout;
        let _ = write_by(&mut writer, &line, deadline).await;
        if let Ok(_lingering) = Arc::clone(&shared.lingering).try_acquire_owned() {
            linger(reader, writer, shared.config.write_timeout).await;
        }
        return;
    }
    // Set when the client stops taking answers or the writer fails: the reader stops too
    // and the connection's calls are cancelled.
    let gone = CancelSignal::new();
    let (queue, mut queued) = mpsc::channel::<Outgoing>(QUEUED_ANSWERS);
    let answers = Answers {
        queue,
        budget: Arc::clone(&shared.output),
        budget_permits: super::output_budget(&shared.config),
        write_timeout: shared.config.write_timeout,
    };
    let in_flight: InFlight = Arc::new(Mutex::new(HashMap::new()));
    let write_task = {
        let gone = gone.clone();
        let shared = Arc::clone(&shared);
        let in_flight = Arc::clone(&in_flight);
        tokio::spawn(async move {
            while let Some(answer) = queued.recv().await {
                // The slot goes back as its answer starts out, not after: a client that reads
                // the answer and at once sends its next call must find the slot free. Dropped
                // here by name: a field left to `..` stays in `answer` until the loop body
                // ends, after the write, and a busy machine let such a client in between.
                let Outgoing {
                    bytes,
                    deadline,
                    _budget,
                    _slot: slot,
                } = answer;
                drop(slot);
                if let Err(e) = write_by(&mut writer, &bytes, deadline).await {
                    if e.kind() == std::io::ErrorKind::TimedOut {
                        shared.stats.closed_unread.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            "closed a daemon client that did not take an answer within {:?}",
                            shared.config.write_timeout
                        );
                    }
                    break;
                }
            }
            // Cancelled before the queued answers give their slots back, so that this
            // connection's queued calls do not start on them only to be cancelled.
            cancel_all(&in_flight).await;
            gone.cancel();
            // What is still queued is never written: give its budget and slots back now.
            queued.close();
            while queued.try_recv().is_ok() {}
        })
    };
    let held = shared.input.holder();
    let conn = Conn {
        id: connection_id(),
        shared: Arc::clone(&shared),
        answers,
        in_flight: Arc::clone(&in_flight),
        peer,
    };
    tokio::select! {
        () = read_requests(&conn, &mut reader, held) => {}
        () = gone.cancelled() => {}
    }
    // The client is gone or stopped reading: cancel everything it still had running.
    cancel_all(&in_flight).await;
    drop(conn);
    let _ = write_task.await;
    drop(place);
}

/// Ends a refused connection so that the client reads its refusal: the write side is shut
/// (the client reads the answer, then end of file) and what the client sends meanwhile is
/// read and dropped, up to a bound. Closed at once, a socket with unread bytes makes the
/// client's next write fail with EPIPE and its pending request with ECONNRESET, and many
/// clients then report that instead of the refusal.
async fn linger(
    mut reader: tokio::net::unix::OwnedReadHalf,
    mut writer: tokio::net::unix::OwnedWriteHalf,
    bound: Duration,
) {
    const MAX_DRAINED: usize = 64 << 10;
    let _ = writer.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < MAX_DRAINED {
            match reader.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    };
    let _ = tokio::time::timeout(bound, drain).await;
}

async fn cancel_all(in_flight: &InFlight) {
    for (_, signal) in in_flight.lock().await.drain() {
        signal.cancel();
    }
}

async fn read_requests(conn: &Conn, reader: &mut tokio::net::unix::OwnedReadHalf, held: Held) {
    let mut first = [0u8; 1];
    let framed = match reader.read(&mut first).await {
        Ok(1) => !(first[0] == b'{' || first[0].is_ascii_whitespace()),
        _ => return,
    };
    if framed {
        serve_frames(conn, reader, first.to_vec(), held).await;
    } else {
        serve_lines(conn, reader, first.to_vec(), held).await;
    }
}

/// Answers a request that did not arrive whole within `--read-timeout`: `overloaded` if
/// it was waiting for room in the input budget, `invalid_request` if for its client.
async fn unfinished(conn: &Conn, for_room: bool, reply: impl Fn(Value) -> Vec<u8>) {
    let shared = &conn.shared;
    shared.stats.input_refused.fetch_add(1, Ordering::Relaxed);
    let timeout = shared.config.read_timeout;
    let body = if for_room {
        json!({"error": {
            "kind": "overloaded",
            "message": format!(
                "the daemon holds {} bytes of requests from its clients, its most, and this request did not find room within {timeout:?}; it was dropped",
                shared.input.total()
            ),
            "retry_after_ms": 1000,
        }})
    } else {
        json!({"error": {
            "kind": "invalid_request",
            "message": format!("bad request: not received whole within {timeout:?}; it was dropped"),
        }})
    };
    conn.answers.send(reply(body), None).await;
}

async fn serve_lines(
    conn: &Conn,
    reader: &mut tokio::net::unix::OwnedReadHalf,
    mut buffer: Vec<u8>,
    mut held: Held,
) {
    let answers = &conn.answers;
    // The rest of the current line is read and dropped: it was refused already.
    let mut skipping = false;
    // Bytes of `buffer` already known to hold no newline.
    let mut scanned = 0;
    // When the unfinished line in `buffer` must be whole.
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        while let Some(pos) = buffer[scanned..].iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=scanned + pos).collect();
            scanned = 0;
            deadline = None;
            if std::mem::take(&mut skipping) {
                continue;
            }
            handle_json_line(conn, &line).await;
        }
        scanned = buffer.len();
        if skipping {
            buffer.clear();
            scanned = 0;
        } else if buffer.len() > MAX_REQUEST_BYTES {
            let line = refusal_line(
                &super::wire::leading_id(&buffer),
                "invalid_request",
                &format!("request larger than {MAX_REQUEST_BYTES} bytes"),
                None,
            );
            answers.send(line, None).await;
            buffer = Vec::new();
            scanned = 0;
            skipping = true;
        }
        if !buffer.is_empty() && deadline.is_none() {
            deadline = Some(tokio::time::Instant::now() + conn.shared.config.read_timeout);
        }
        // A long line's buffer is not kept once the line is done, nor an empty one while
        // the client is quiet (see `read_when_ready`).
        if buffer.is_empty() {
            buffer = Vec::new();
            deadline = None;
        } else if buffer.capacity() > CHUNK_BYTES && buffer.len() <= CHUNK_BYTES {
            buffer.shrink_to(CHUNK_BYTES);
        }
        match read_when_ready(reader, &mut buffer, &mut held, 0, deadline).await {
            Read::More => {}
            Read::End => return,
            Read::Expired { for_room } => {
                let id = super::wire::leading_id(&buffer);
                unfinished(conn, for_room, move |mut body| {
                    body["id"] = id.clone();
                    format!("{body}\n").into_bytes()
                })
                .await;
                // The rest of the line is dropped as it comes; the connection stays.
                buffer = Vec::new();
                scanned = 0;
                deadline = None;
                skipping = true;
                // Giving bytes back always succeeds.
                let _ = held.resize(0);
            }
        }
    }
}

/// What [`read_when_ready`] got.
enum Read {
    /// Bytes were appended (or none yet, on a spurious wake-up).
    More,
    /// End of stream or a read error.
    End,
    /// The unfinished request's deadline passed, waiting for room in the input budget
    /// (`for_room`) or for the client.
    Expired { for_room: bool },
}

/// `work`, or `None` once `deadline` has passed.
async fn within<F: std::future::Future>(
    deadline: Option<tokio::time::Instant>,
    work: F,
) -> Option<F::Output> {
    match deadline {
        None => Some(work.await),
        Some(deadline) => tokio::time::timeout_at(deadline, work).await.ok(),
    }
}

/// Waits until the client sends something and only then makes room in `buffer` and reads
/// into it, holding `buffer`'s capacity plus `other_bytes`, less the connection's
/// [`ALLOWANCE`], against the input budget; when the budget has no room it waits for some.
/// So a quiet connection (a client waiting for its calls' answers) holds no read buffer:
/// with a 16 KiB buffer each, ~1,000 waiting connections spent the default 16 MiB budget
/// and the next calls were refused, far below `--max-concurrent`. `deadline` bounds every
/// wait while a request is unfinished: what a client has half sent is held at most
/// `--read-timeout`, so room is always given back.
async fn read_when_ready(
    reader: &mut tokio::net::unix::OwnedReadHalf,
    buffer: &mut Vec<u8>,
    held: &mut Held,
    other_bytes: usize,
    deadline: Option<tokio::time::Instant>,
) -> Read {
    let counted = |capacity: usize| (capacity + other_bytes).saturating_sub(ALLOWANCE);
    if within(deadline, held.resize_when_room(counted(buffer.capacity())))
        .await
        .is_none()
    {
        return Read::Expired { for_room: true };
    }
    match within(deadline, reader.readable()).await {
        None => return Read::Expired { for_room: false },
        Some(Err(_)) => return Read::End,
        Some(Ok(())) => {}
    }
    buffer.reserve(CHUNK_BYTES);
    if within(deadline, held.resize_when_room(counted(buffer.capacity())))
        .await
        .is_none()
    {
        return Read::Expired { for_room: true };
    }
    match reader.try_read_buf(buffer) {
        Ok(0) => Read::End,
        Ok(_) => Read::More,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Read::More,
        Err(_) => Read::End,
    }
}

async fn serve_frames(
    conn: &Conn,
    reader: &mut tokio::net::unix::OwnedReadHalf,
    mut pending: Vec<u8>,
    mut held: Held,
) {
    let mut decoder = airlock_protocol::FrameDecoder::with_max_frame_bytes(MAX_REQUEST_BYTES);
    // When the partial frame in the decoder must be whole.
    let mut deadline: Option<tokio::time::Instant> = None;
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
        // Everything read is decoded (a partial frame waits in the decoder): the read
        // buffer is not kept while the client is quiet (see `read_when_ready`).
        pending = Vec::new();
        for request in requests {
            let id = Value::from(request.id);
            let op = super::wire::parse_op(&request.op_json);
            let reply: Reply = Box::new(move |body: Value| {
                let response = FrameResponse {
                    id: request.id,
                    body_json: body.to_string(),
                };
                super::framed::answer_frame(&response)
            });
            dispatch(conn, id, op, reply).await;
        }
        if broken {
            return;
        }
        if decoder.is_at_frame_boundary() {
            deadline = None;
        } else if deadline.is_none() {
            deadline = Some(tokio::time::Instant::now() + conn.shared.config.read_timeout);
        }
        let other = decoder.buffer_capacity();
        match read_when_ready(reader, &mut pending, &mut held, other, deadline).await {
            Read::More => {}
            Read::End => return,
            Read::Expired { for_room } => {
                // A frame cannot be skipped without reading it: the connection ends.
                unfinished(conn, for_room, |body| {
                    let response = FrameResponse {
                        id: 0,
                        body_json: body.to_string(),
                    };
                    airlock_protocol::frame::encode_frame(&response).unwrap_or_default()
                })
                .await;
                return;
            }
        }
    }
}

async fn handle_json_line(conn: &Conn, line: &[u8]) {
    let (id, op) = match std::str::from_utf8(line) {
        Ok(text) if text.trim().is_empty() => return,
        Ok(text) => super::wire::parse_line(text),
        Err(e) => (
            Value::Null,
            Err(RequestError::NotJson {
                line: 1,
                column: e.valid_up_to() + 1,
            }),
        ),
    };
    let reply_id = id.clone();
    let reply: Reply = Box::new(move |mut body: Value| {
        if let Value::Object(map) = &mut body {
            map.insert("id".into(), reply_id.clone());
        }
        format!("{body}\n").into_bytes()
    });
    dispatch(conn, id, op, reply).await;
}
