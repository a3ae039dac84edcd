//! One proxied connection: what it asks for, the decision, and the connection upstream.

use super::relay::{linger, reject, tunnel};
use super::*;

pub(super) async fn connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    slot: Slot,
    refusal: Option<Refusal>,
    audited: bool,
) {
    let mut conn = Conn::default();
    if let Some(refusal) = &refusal {
        // Recorded now, so a client that leaves or is stopped before asking still shows why.
        conn.refused_by(refusal);
    }
    let finished = tokio::select! {
        biased;
        () = shared.stop.cancelled() => false,
        () = handle(&shared, stream, &mut conn, refusal) => true,
    };
    // Dropping `handle` above closed both sockets.
    if !finished {
        conn.stopped();
    }
    // Free the slot before the event goes out, so whoever waits on the event may connect
    // again at once.
    drop(slot);
    shared.finish(conn, audited);
}

async fn handle(shared: &Shared, stream: TcpStream, conn: &mut Conn, refusal: Option<Refusal>) {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(0) => conn.refuse("closed: the client sent nothing"),
        Err(error) => conn.refuse(format_args!("client-error: {error}")),
        Ok(_) if first[0] == socks::VERSION => handle_socks(shared, stream, conn, refusal).await,
        Ok(_) => handle_http(shared, stream, conn, refusal).await,
    }
}

async fn handle_http(
    shared: &Shared,
    mut client: TcpStream,
    conn: &mut Conn,
    refusal: Option<Refusal>,
) {
    let (request, early) = match http::read_request(&mut client).await {
        Ok(read) => read,
        Err(ReadError::Closed) => return conn.refuse("closed: the client sent nothing"),
        Err(ReadError::Io(error)) => return conn.refuse(format_args!("client-error: {error}")),
        Err(ReadError::Http(error)) => {
            conn.refuse(format_args!("bad-request: {error}"));
            reject(&mut client, error.status(), None, &error.to_string()).await;
            return;
        }
    };
    conn.kind = match request {
        ProxyRequest::Connect { .. } => EgressKind::Connect,
        ProxyRequest::Forward { .. } => EgressKind::Forward,
    };
    conn.host = request.host().to_string();
    conn.port = request.port();
    let upstream = match connect(shared, request.host(), request.port(), conn, refusal).await {
        Ok(upstream) => upstream,
        Err(Failure::Refused(refusal)) => {
            conn.refused_by(&refusal);
            let body = format!("airlock: egress refused: {refusal}");
            reject(&mut client, 403, Some(refusal.code()), &body).await;
            return;
        }
        Err(Failure::Unreachable(error)) => {
            conn.ended(TunnelEnd::Unreachable, Some(error.to_string()));
            reject(&mut client, 502, None, &format!("airlock: {error}")).await;
            return;
        }
    };
    let first_up = match request {
        ProxyRequest::Connect { .. } => {
            if let Err(error) = client.write_all(http::CONNECT_ESTABLISHED).await {
                return conn.ended(TunnelEnd::ClientError, Some(error.to_string()));
            }
            early
        }
        ProxyRequest::Forward { mut head, .. } => {
            head.extend_from_slice(&early);
            head
        }
    };
    tunnel(shared, client, upstream, conn, &first_up).await;
}

async fn handle_socks(
    shared: &Shared,
    mut client: TcpStream,
    conn: &mut Conn,
    refusal: Option<Refusal>,
) {
    conn.kind = EgressKind::Socks5;
    let request = match socks::accept(&mut client).await {
        Ok(request) => request,
        Err(SocksError::Closed) => {
            return conn.refuse("closed: the client left during the SOCKS handshake");
        }
        Err(error) => {
            conn.refuse(format_args!("bad-request: {error}"));
            let answered = match error.reply() {
                Some(reply) => socks::send_reply(&mut client, reply).await.is_ok(),
                None => matches!(error, SocksError::NoAcceptableMethod),
            };
            if answered {
                linger(&mut client).await;
            }
            return;
        }
    };
    conn.host = request.host.to_string();
    conn.port = request.port;
    match connect(shared, &request.host, request.port, conn, refusal).await {
        Ok(upstream) => {
            if let Err(error) = socks::send_reply(&mut client, Reply::Succeeded).await {
                return conn.ended(TunnelEnd::ClientError, Some(error.to_string()));
            }
            tunnel(shared, client, upstream, conn, &[]).await;
        }
        Err(Failure::Refused(refusal)) => {
            conn.refused_by(&refusal);
            if socks::send_reply(&mut client, Reply::NotAllowed)
                .await
                .is_ok()
            {
                linger(&mut client).await;
            }
        }
        Err(Failure::Unreachable(error)) => {
            let reply = error.socks_reply();
            conn.ended(TunnelEnd::Unreachable, Some(error.to_string()));
            if socks::send_reply(&mut client, reply).await.is_ok() {
                linger(&mut client).await;
            }
        }
    }
}

/// Why [`connect`] gave no upstream.
enum Failure {
    Refused(Refusal),
    Unreachable(UpstreamError),
}

/// Decides, resolves once, and connects to the first allowed address that answers.
async fn connect(
    shared: &Shared,
    host: &Host,
    port: u16,
    conn: &mut Conn,
    refusal: Option<Refusal>,
) -> Result<TcpStream, Failure> {
    if let Some(refusal) = refusal {
        return Err(Failure::Refused(refusal));
    }
    let rule = shared
        .policy
        .check_host(host, port)
        .map_err(|reason| Failure::Refused(Refusal::Policy(reason)))?;
    if shared.budget.exhausted() {
        return Err(Failure::Refused(Refusal::ByteLimit));
    }
    conn.allowed = true;
    conn.rule_or_reason = rule.to_string();
    let timeout = shared.limits.connect_timeout;
    let candidates = match host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(name) => resolve(shared, name, timeout)
            .await
            .map_err(Failure::Unreachable)?,
    };
    let mut denied = None;
    let mut failed = None;
    for ip in candidates.into_iter().take(MAX_ADDRESSES) {
        let address = SocketAddr::new(ip, port);
        // Only a public address needs asking: every other class needs a network already.
        let this_host =
            airlock_policy::egress::classify(ip).is_public() && shared.resolver.is_this_host(ip);
        match shared.policy.check_address(rule, host, ip, this_host) {
            Decision::Denied { reason } => {
                denied.get_or_insert((address, reason));
            }
            Decision::Allowed { rule } => {
                conn.address = Some(address);
                conn.rule_or_reason = rule;
                match tokio::time::timeout(timeout, TcpStream::connect(address)).await {
                    Ok(Ok(stream)) => {
                        // Tunnelled protocols do their own batching; Nagle would only add
                        // delay to their small writes.
                        let _ = stream.set_nodelay(true);
                        return Ok(stream);
                    }
                    Ok(Err(error)) => failed = Some(UpstreamError::Connect { address, error }),
                    Err(_) => failed = Some(UpstreamError::ConnectTimedOut { address }),
                }
            }
        }
    }
    if let Some(error) = failed {
        return Err(Failure::Unreachable(error));
    }
    match denied {
        Some((address, reason)) => {
            conn.address = Some(address);
            Err(Failure::Refused(Refusal::Policy(reason)))
        }
        None => Err(Failure::Unreachable(UpstreamError::Resolve(
            ResolveError::NotFound,
        ))),
    }
}

/// Resolves `name` within `timeout` (waiting for a lookup permit included). The lookup runs
/// in a task of its own that holds the permit until the resolver is done, so a lookup this
/// connection gives up on still counts against the proxy's bound while it runs.
async fn resolve(
    shared: &Shared,
    name: &str,
    timeout: Duration,
) -> Result<Vec<IpAddr>, UpstreamError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let waiting = Arc::clone(&shared.lookups).acquire_owned();
    // The semaphore is never closed: an error can only be the deadline.
    let Ok(Ok(permit)) = tokio::time::timeout_at(deadline, waiting).await else {
        return Err(UpstreamError::LookupsBusy);
    };
    let resolver = Arc::clone(&shared.resolver);
    let name = name.to_string();
    let lookup = tokio::spawn(async move {
        let found = resolver.resolve(&name).await;
        drop(permit);
        found
    });
    match tokio::time::timeout_at(deadline, lookup).await {
        Ok(Ok(found)) => found.map_err(UpstreamError::Resolve),
        Ok(Err(failed)) => Err(UpstreamError::Resolve(ResolveError::Lookup(
            io::Error::other(failed),
        ))),
        Err(_) => Err(UpstreamError::ResolveTimedOut),
    }
}
