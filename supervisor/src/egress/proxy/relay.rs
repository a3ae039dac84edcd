//! Relaying an allowed connection's bytes both ways, counted and bounded, and answering
//! refusals.

use super::*;

/// Sends `first_up` upstream, then splices until both sides close, an error, the byte
/// limit, or (outside, in `connection`) the stop signal.
pub(super) async fn tunnel(
    shared: &Shared,
    mut client: TcpStream,
    mut upstream: TcpStream,
    conn: &mut Conn,
    first_up: &[u8],
) {
    let _ = client.set_nodelay(true);
    if !first_up.is_empty() {
        let granted = shared.budget.take(first_up.len());
        let allowed = first_up.get(..granted).unwrap_or_default();
        if let Err(error) = upstream.write_all(allowed).await {
            return conn.ended(TunnelEnd::UpstreamError, Some(error.to_string()));
        }
        conn.up
            .fetch_add(u64::try_from(granted).unwrap_or(u64::MAX), Ordering::AcqRel);
        if granted < first_up.len() {
            return conn.ended(TunnelEnd::ByteLimit, None);
        }
    }
    let (end, error) = splice(
        &mut client,
        &mut upstream,
        &conn.up,
        &conn.down,
        &shared.budget,
    )
    .await;
    conn.ended(end, error.map(|e| e.to_string()));
}

/// How one direction of a tunnel ended.
enum Pumped {
    Eof,
    ByteLimit,
}

/// A failure of one direction, on its reading or its writing side.
enum PumpError {
    Read(io::Error),
    Write(io::Error),
}

/// Copies `from` to `to`, counting into `counter` and charging `budget`; on end of input
/// half-closes `to`, so the other side sees the end too.
async fn pump<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut from: R,
    mut to: W,
    counter: &AtomicU64,
    budget: &Budget,
) -> Result<Pumped, PumpError> {
    let mut buf = vec![0u8; PUMP_BUFFER];
    loop {
        let n = from.read(&mut buf).await.map_err(PumpError::Read)?;
        if n == 0 {
            to.shutdown().await.map_err(PumpError::Write)?;
            return Ok(Pumped::Eof);
        }
        let granted = budget.take(n);
        let allowed = buf.get(..granted).unwrap_or_default();
        to.write_all(allowed).await.map_err(PumpError::Write)?;
        counter.fetch_add(u64::try_from(granted).unwrap_or(u64::MAX), Ordering::AcqRel);
        if granted < n {
            return Ok(Pumped::ByteLimit);
        }
    }
}

/// Relays both ways until both directions end, or one fails or hits the byte limit.
async fn splice(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    up: &AtomicU64,
    down: &AtomicU64,
    budget: &Budget,
) -> (TunnelEnd, Option<io::Error>) {
    let (client_read, client_write) = client.split();
    let (upstream_read, upstream_write) = upstream.split();
    let up_pump = pump(client_read, upstream_write, up, budget);
    let down_pump = pump(upstream_read, client_write, down, budget);
    tokio::pin!(up_pump, down_pump);
    let (mut up_open, mut down_open) = (true, true);
    while up_open || down_open {
        tokio::select! {
            result = &mut up_pump, if up_open => {
                up_open = false;
                match result {
                    Ok(Pumped::Eof) => {}
                    Ok(Pumped::ByteLimit) => return (TunnelEnd::ByteLimit, None),
                    Err(PumpError::Read(error)) => return (TunnelEnd::ClientError, Some(error)),
                    Err(PumpError::Write(error)) => return (TunnelEnd::UpstreamError, Some(error)),
                }
            }
            result = &mut down_pump, if down_open => {
                down_open = false;
                match result {
                    Ok(Pumped::Eof) => {}
                    Ok(Pumped::ByteLimit) => return (TunnelEnd::ByteLimit, None),
                    Err(PumpError::Read(error)) => return (TunnelEnd::UpstreamError, Some(error)),
                    Err(PumpError::Write(error)) => return (TunnelEnd::ClientError, Some(error)),
                }
            }
        }
    }
    (TunnelEnd::Closed, None)
}

/// Answers an HTTP client with the proxy's own response, then closes gently.
pub(super) async fn reject(client: &mut TcpStream, status: u16, denied: Option<&str>, body: &str) {
    // A client that is gone has nobody to tell.
    if client
        .write_all(&http::proxy_response(status, denied, body))
        .await
        .is_ok()
    {
        linger(client).await;
    }
}

/// Half-closes, then reads and discards what the client still sends, up to a bound, until it
/// closes. Closing a socket with unread input makes the kernel send a reset, which can
/// destroy the answer just written before the client has read it.
pub(super) async fn linger<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let mut buf = vec![0u8; 4096];
    let mut left = LINGER_BYTES;
    while left > 0 {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}
