//! `GET /metrics` over HTTP/1.1 for a Prometheus scraper.
//!
//! A few dozen lines of tokio rather than a web framework: the daemon answers one path with
//! one document, and every byte of request parsing is code a network peer reaches. Here
//! that is one bounded read of the request head and one look at its first line, with no
//! keep-alive, no body, no chunking, no upgrades, no routing tables — nothing a framework
//! would add that this needs. Every bound is fixed: a few scrapes at once (more are closed
//! unanswered), a small request head, and a deadline for reading it and for writing the
//! answer, so a peer that connects and stalls holds one task and one socket for seconds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::Shared;
use crate::cancel::CancelSignal;

/// Scrapes answered at once; a connection beyond them is closed at once.
const MAX_SCRAPES: usize = 4;
/// The most bytes of request head read (a scraper sends a few hundred).
const MAX_HEAD_BYTES: usize = 8 << 10;
/// How long a peer has to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a peer has to take the whole answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the metrics listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address is not loopback and remote scrapes were not allowed.
    #[error(
        "the metrics address {addr} is not loopback: metrics name tools and call rates to anyone who can connect; allow it explicitly (--metrics-allow-remote) to listen there"
    )]
    NotLoopback {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// Binding the TCP listener failed.
    #[error("cannot listen for metrics on {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Where `serve` answers metrics scrapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsListen {
    /// The TCP address (port 0: any free port).
    pub addr: SocketAddr,
    /// Whether a non-loopback address may be used. The metrics have no authentication:
    /// anyone who reaches the port learns the policy's tool names and the traffic.
    pub allow_remote: bool,
}

impl MetricsListen {
    /// Refuses a non-loopback address unless remote scrapes were allowed.
    pub fn check(&self) -> Result<(), MetricsError> {
        if !self.addr.ip().is_loopback() && !self.allow_remote {
            return Err(MetricsError::NotLoopback { addr: self.addr });
        }
        Ok(())
    }
}

/// Binds the metrics listener, refusing a non-loopback address unless allowed.
pub(super) async fn bind(listen: MetricsListen) -> Result<TcpListener, MetricsError> {
    listen.check()?;
    let addr = listen.addr;
    TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })
}

/// Answers scrapes on `listener` until `stop`.
pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>, stop: CancelSignal) {
    let scrapes = Arc::new(Semaphore::new(MAX_SCRAPES));
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // Beyond the bound, dropped unanswered: a flood costs nothing queued.
                    let Ok(place) = Arc::clone(&scrapes).try_acquire_owned() else {
                        continue;
                    };
                    let shared = Arc::clone(&shared);
                    tokio::spawn(async move {
                        answer(stream, &shared).await;
                        drop(place);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics accept failed");
                    // Out of descriptors, say: do not spin on it.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Request {
    Metrics,
    NotFound,
    MethodNotAllowed,
    Bad,
    TooLarge,
}

/// Reads the request head (to its blank line), within the size and time bounds.
async fn read_head(stream: &mut TcpStream) -> Request {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let read = async {
        loop {
            if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
                return Some(());
            }
            if head.len() >= MAX_HEAD_BYTES {
                return None;
            }
            let room = (MAX_HEAD_BYTES - head.len()).min(chunk.len());
            match stream.read(&mut chunk[..room]).await {
                Ok(0) | Err(_) => return Some(()),
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
    };
    match tokio::time::timeout(READ_TIMEOUT, read).await {
        Err(_) => Request::Bad,
        Ok(None) => Request::TooLarge,
        Ok(Some(())) => classify(&head),
    }
}

/// The request line's verdict.
fn classify(head: &[u8]) -> Request {
    let Some(line) = head.split(|&b| b == b'\n').next() else {
        return Request::Bad;
    };
    let Ok(line) = std::str::from_utf8(line) else {
        return Request::Bad;
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Request::Bad;
    };
    if !version.starts_with("HTTP/1.") {
        return Request::Bad;
    }
    // A scraper may add a query string; nothing reads it.
    let path = target.split('?').next().unwrap_or(target);
    match (method, path) {
        ("GET", "/metrics") => Request::Metrics,
        ("GET", _) => Request::NotFound,
        _ => Request::MethodNotAllowed,
    }
}

async fn answer(mut stream: TcpStream, shared: &Shared) {
    let request = read_head(&mut stream).await;
    let (status, content_type, body) = match request {
        Request::Metrics => match shared.metrics.render(shared) {
            Ok(text) => (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                text,
            ),
            Err(_) => (
                "500 Internal Server Error",
                "text/plain",
                "cannot encode metrics\n".into(),
            ),
        },
        Request::NotFound => (
            "404 Not Found",
            "text/plain",
            "only /metrics is served\n".into(),
        ),
        Request::MethodNotAllowed => ("405 Method Not Allowed", "text/plain", "GET only\n".into()),
        Request::Bad => ("400 Bad Request", "text/plain", "bad request\n".into()),
        Request::TooLarge => (
            "431 Request Header Fields Too Large",
            "text/plain",
            "request head too large\n".into(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(WRITE_TIMEOUT, write).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_metrics_is_served() {
        let of = |text: &str| classify(text.as_bytes());
        assert_eq!(
            of("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Request::Metrics
        );
        assert_eq!(of("GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Request::Metrics);
        assert_eq!(of("GET / HTTP/1.1\r\n\r\n"), Request::NotFound);
        assert_eq!(of("GET /metrics/../x HTTP/1.1\r\n\r\n"), Request::NotFound);
        assert_eq!(
            of("POST /metrics HTTP/1.1\r\n\r\n"),
            Request::MethodNotAllowed
        );
        assert_eq!(of("GET /metrics\r\n\r\n"), Request::Bad);
        assert_eq!(of("GET /metrics HTTP/2\r\n\r\n"), Request::Bad);
        assert_eq!(of("GET  /metrics HTTP/1.1\r\n\r\n"), Request::Bad);
        assert_eq!(classify(b"\xff\xfe"), Request::Bad);
        assert_eq!(classify(b""), Request::Bad);
    }
}
