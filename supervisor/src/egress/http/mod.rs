//! The first request of an HTTP proxy connection: `CONNECT host:port` or an absolute-form
//! `http://` request, read with a bound on every line and on the whole head.
//!
//! An absolute-form request is rewritten for the upstream in origin-form, with the hop-by-hop
//! and `Proxy-*` headers dropped and `Connection: close` added. The body and anything after
//! it are passed through unchanged: the tunnel's destination is fixed by this first request
//! (as a CONNECT tunnel's is), so later bytes can only reach the address and port the policy
//! already allowed.

use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

use tokio::io::{AsyncRead, AsyncReadExt};

use airlock_policy::egress::{Host, HostError, PortZero, parse_port};

/// Most bytes in a request head (request line, headers and the blank line).
pub const MAX_HEAD: usize = 16 * 1024;
/// Most bytes in one line of the head, without its line ending.
pub const MAX_LINE: usize = 8 * 1024;
/// Most header lines.
pub const MAX_HEADERS: usize = 100;
/// Longest method name.
const MAX_METHOD: usize = 32;

/// The answer to a CONNECT once the upstream connection is open.
pub const CONNECT_ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// Hop-by-hop headers never forwarded (RFC 9110 section 7.6.1), plus the non-standard
/// `Proxy-Connection`. `Transfer-Encoding` is kept: the body passes through as it came.
const HOP_BY_HOP: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "upgrade",
];

/// What the first request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyRequest {
    /// `CONNECT host:port`: a tunnel.
    Connect {
        /// The target host.
        host: Host,
        /// The target port.
        port: u16,
    },
    /// An absolute-form `http://` request of any other method.
    Forward {
        /// The method.
        method: String,
        /// The target host.
        host: Host,
        /// The target port (80 when the URL has none).
        port: u16,
        /// The head to send upstream: origin-form, filtered headers, `Connection: close`.
        head: Vec<u8>,
    },
}

impl ProxyRequest {
    /// The target host.
    pub fn host(&self) -> &Host {
        match self {
            ProxyRequest::Connect { host, .. } | ProxyRequest::Forward { host, .. } => host,
        }
    }

    /// The target port.
    pub fn port(&self) -> u16 {
        match self {
            ProxyRequest::Connect { port, .. } | ProxyRequest::Forward { port, .. } => *port,
        }
    }
}

/// What is wrong with an authority (`host[:port]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    /// Nothing there.
    #[error("empty authority")]
    Empty,
    /// The host is wrong.
    #[error("{0}")]
    Host(HostError),
    /// An IPv6 address not in brackets, or text after the closing bracket.
    #[error("an IPv6 address must be in brackets, as in [::1]:443")]
    Brackets,
    /// The port is not a number from 1 to 65535.
    #[error("bad port")]
    BadPort,
    /// Port 0.
    #[error("port 0 is not a destination")]
    PortZero,
    /// CONNECT without a port.
    #[error("CONNECT needs host:port")]
    MissingPort,
    /// `user@host`.
    #[error("user information in the authority is refused")]
    UserInfo,
}

/// Why a request head was refused. Every one is answered `400 Bad Request`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// A line longer than [`MAX_LINE`].
    #[error("a line of the request head is longer than {MAX_LINE} bytes")]
    LineTooLong,
    /// A head longer than [`MAX_HEAD`].
    #[error("the request head is longer than {MAX_HEAD} bytes")]
    HeadTooLarge,
    /// More than [`MAX_HEADERS`] header lines.
    #[error("more than {MAX_HEADERS} header lines")]
    TooManyHeaders,
    /// The connection ended inside the head.
    #[error("the connection ended inside the request head")]
    Truncated,
    /// Not `METHOD SP target SP version`.
    #[error("malformed request line")]
    BadRequestLine,
    /// The method is not a token (or is too long).
    #[error("malformed method")]
    BadMethod,
    /// Not `HTTP/1.1` or `HTTP/1.0`.
    #[error("unsupported HTTP version")]
    BadVersion,
    /// An origin-form (`/path`) or asterisk-form target: this is a proxy.
    #[error("a proxy request needs an absolute URL (http://host/path) or CONNECT host:port")]
    OriginForm,
    /// `https://` in absolute form.
    #[error("https:// goes through CONNECT, not an absolute-form request")]
    HttpsNeedsConnect,
    /// A scheme other than `http`.
    #[error("only http:// URLs are forwarded")]
    UnsupportedScheme,
    /// The target is not a URL we accept (no `://`, a fragment, bad characters).
    #[error("malformed request target")]
    BadTarget,
    /// The target's authority is wrong.
    #[error("bad target authority: {0}")]
    Authority(AuthorityError),
    /// A malformed header line (no colon, a bad name, space before the colon, control
    /// characters in the value).
    #[error("malformed header line")]
    BadHeader,
    /// A header line starting with whitespace (obsolete line folding).
    #[error("folded header lines are refused")]
    ObsFold,
    /// More than one `Host` header.
    #[error("more than one Host header")]
    DuplicateHost,
    /// A `Host` header that is not a valid authority.
    #[error("bad Host header: {0}")]
    BadHostHeader(AuthorityError),
    /// A `Host` header naming a different host or port than the target: the upstream could
    /// route by one while the policy checked the other.
    #[error("the Host header does not match the request target")]
    HostMismatch,
    /// A `Content-Length` that is not one decimal number, or more than one.
    #[error("malformed or repeated Content-Length")]
    BadContentLength,
    /// Both `Content-Length` and `Transfer-Encoding`: request smuggling territory.
    #[error("both Content-Length and Transfer-Encoding")]
    LengthConflict,
    /// A `Transfer-Encoding` whose last coding is not `chunked`.
    #[error("Transfer-Encoding must end in chunked")]
    BadTransferEncoding,
    /// `Connection` naming a header that frames or routes the request.
    #[error("Connection may not name Host, Content-Length or Transfer-Encoding")]
    ConnectionNamesFraming,
}

impl HttpError {
    /// The status it is answered with.
    pub fn status(&self) -> u16 {
        400
    }
}

/// Why [`read_request`] returned no request.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The client closed before sending a byte.
    #[error("the client closed before sending a request")]
    Closed,
    /// Reading failed.
    #[error("reading the request failed: {0}")]
    Io(#[source] std::io::Error),
    /// The head is malformed or over a bound.
    #[error(transparent)]
    Http(#[from] HttpError),
}

/// Finds the end of a request head as bytes arrive, refusing over-long lines and heads as
/// soon as they are seen rather than once they end. Feed it the whole buffer so far each
/// time; it resumes where it stopped, so every byte is looked at once.
#[derive(Debug, Default)]
pub struct HeadScanner {
    scanned: usize,
    line_start: usize,
    lines: usize,
    method_done: bool,
}

impl HeadScanner {
    /// `Ok(Some(end))` once `buf[..end]` is a complete head; `Ok(None)` while more is needed.
    pub fn feed(&mut self, buf: &[u8]) -> Result<Option<usize>, HttpError> {
        let mut previous = self
            .scanned
            .checked_sub(1)
            .and_then(|i| buf.get(i))
            .copied();
        for (i, &b) in buf.iter().enumerate().skip(self.scanned) {
            // Method bytes are checked as they come, so a non-HTTP client (TLS sent
            // straight to the proxy, SOCKS 4) is refused at once rather than waited on.
            if !self.method_done {
                if b == b' ' && i > 0 {
                    self.method_done = true;
                } else if !is_tchar(b) || i >= MAX_METHOD {
                    return Err(HttpError::BadMethod);
                }
            }
            if b == b'\n' {
                let end = if previous == Some(b'\r') { i - 1 } else { i };
                let len = end.saturating_sub(self.line_start);
                if len > MAX_LINE {
                    return Err(HttpError::LineTooLong);
                }
                if len == 0 {
                    self.scanned = i + 1;
                    return Ok(Some(i + 1));
                }
                self.lines += 1;
                if self.lines > MAX_HEADERS + 1 {
                    return Err(HttpError::TooManyHeaders);
                }
                self.line_start = i + 1;
            }
            previous = Some(b);
        }
        self.scanned = buf.len();
        // One byte of slack for a carriage return not yet followed by its line feed.
        if buf.len().saturating_sub(self.line_start) > MAX_LINE + 1 {
            return Err(HttpError::LineTooLong);
        }
        if buf.len() >= MAX_HEAD {
            return Err(HttpError::HeadTooLarge);
        }
        Ok(None)
    }
}

/// Reads the first request head, never more than [`MAX_HEAD`] bytes. Returns the request
/// and the bytes read after its head (the start of a body, or early tunnel data).
pub async fn read_request<S: AsyncRead + Unpin>(
    stream: &mut S,
) -> Result<(ProxyRequest, Vec<u8>), ReadError> {
    let mut buf = vec![0u8; MAX_HEAD];
    let mut filled = 0;
    let mut scanner = HeadScanner::default();
    loop {
        let Some(space) = buf.get_mut(filled..) else {
            return Err(HttpError::HeadTooLarge.into());
        };
        let n = stream.read(space).await.map_err(ReadError::Io)?;
        if n == 0 {
            return Err(if filled == 0 {
                ReadError::Closed
            } else {
                HttpError::Truncated.into()
            });
        }
        filled += n;
        let received = buf.get(..filled).unwrap_or_default();
        if let Some(end) = scanner.feed(received)? {
            let (head, rest) = received.split_at(end.min(received.len()));
            return Ok((parse_request(head)?, rest.to_vec()));
        }
    }
}

/// Parses a complete request head (as delimited by [`HeadScanner`]).
pub fn parse_request(head: &[u8]) -> Result<ProxyRequest, HttpError> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let request_line = lines.next().ok_or(HttpError::BadRequestLine)?;
    if request_line.len() > MAX_LINE
        || !request_line
            .iter()
            .all(|&b| b == b' ' || b.is_ascii_graphic())
    {
        return Err(HttpError::BadRequestLine);
    }
    let request_line = std::str::from_utf8(request_line).map_err(|_| HttpError::BadRequestLine)?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::BadRequestLine);
    };
    if method.is_empty() || target.is_empty() {
        return Err(HttpError::BadRequestLine);
    }
    if method.len() > MAX_METHOD || !method.bytes().all(is_tchar) {
        return Err(HttpError::BadMethod);
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(HttpError::BadVersion);
    }

    let mut headers = Vec::new();
    for line in lines {
        if line.is_empty() {
            break;
        }
        if headers.len() >= MAX_HEADERS {
            return Err(HttpError::TooManyHeaders);
        }
        headers.push(parse_header(line)?);
    }

    let host_header = {
        let mut hosts = headers
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case("host"));
        let first = hosts.next();
        if hosts.next().is_some() {
            return Err(HttpError::DuplicateHost);
        }
        match first {
            Some((_, value)) => {
                let value = std::str::from_utf8(value).map_err(|_| {
                    HttpError::BadHostHeader(AuthorityError::Host(HostError::NonAscii { at: 0 }))
                })?;
                Some(parse_authority(value).map_err(HttpError::BadHostHeader)?)
            }
            None => None,
        }
    };

    if method == "CONNECT" {
        let (host, port) = parse_authority(target).map_err(HttpError::Authority)?;
        let port = port.ok_or(HttpError::Authority(AuthorityError::MissingPort))?;
        // A CONNECT's Host header usually repeats the target; it need not carry the port.
        if let Some((header_host, header_port)) = host_header
            && (header_host != host || header_port.is_some_and(|p| p != port))
        {
            return Err(HttpError::HostMismatch);
        }
        return Ok(ProxyRequest::Connect { host, port });
    }

    let (host, port, path) = parse_absolute(target)?;
    if let Some((header_host, header_port)) = host_header
        && (header_host != host || header_port.unwrap_or(80) != port)
    {
        return Err(HttpError::HostMismatch);
    }
    let head = rewrite(method, &host, port, path, version, &headers)?;
    Ok(ProxyRequest::Forward {
        method: method.to_string(),
        host,
        port,
        head,
    })
}

/// Splits `name: value`, trimming the value's surrounding whitespace.
fn parse_header(line: &[u8]) -> Result<(&str, &[u8]), HttpError> {
    if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
        return Err(HttpError::ObsFold);
    }
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or(HttpError::BadHeader)?;
    let (name, value) = line.split_at(colon);
    // A name is a token: this also refuses whitespace before the colon.
    if name.is_empty() || !name.iter().copied().all(is_tchar) {
        return Err(HttpError::BadHeader);
    }
    let name = std::str::from_utf8(name).map_err(|_| HttpError::BadHeader)?;
    let value = value.get(1..).unwrap_or_default();
    // Control characters other than tab (a bare CR above all) could end the line early for
    // a different parser upstream.
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(HttpError::BadHeader);
    }
    Ok((name, value.trim_ascii()))
}

/// Parses `host[:port]`; an IPv6 host must be bracketed.
pub fn parse_authority(text: &str) -> Result<(Host, Option<u16>), AuthorityError> {
    if text.is_empty() {
        return Err(AuthorityError::Empty);
    }
    if text.contains('@') {
        return Err(AuthorityError::UserInfo);
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inner, after) = rest.split_once(']').ok_or(AuthorityError::Brackets)?;
        let ip = Ipv6Addr::from_str(inner).map_err(|_| AuthorityError::Host(HostError::BadIpv6))?;
        let port = match after.strip_prefix(':') {
            Some(port) => Some(port),
            None if after.is_empty() => None,
            None => return Err(AuthorityError::Brackets),
        };
        (Host::Ip(IpAddr::V6(ip)), port)
    } else {
        let (host, port) = match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        };
        if port.is_some_and(|p| p.contains(':')) {
            return Err(AuthorityError::Brackets);
        }
        (Host::parse(host).map_err(AuthorityError::Host)?, port)
    };
    let port = match port {
        None => None,
        Some(text) => match parse_port(text) {
            Some(Ok(port)) => Some(port),
            Some(Err(PortZero)) => return Err(AuthorityError::PortZero),
            None => return Err(AuthorityError::BadPort),
        },
    };
    Ok((host, port))
}

/// Splits `http://authority[/path][?query]` into host, port (80 by default) and the
/// origin-form target.
fn parse_absolute(target: &str) -> Result<(Host, u16, String), HttpError> {
    if target.starts_with('/') || target == "*" {
        return Err(HttpError::OriginForm);
    }
    let (scheme, rest) = target.split_once("://").ok_or(HttpError::BadTarget)?;
    if scheme.eq_ignore_ascii_case("https") {
        return Err(HttpError::HttpsNeedsConnect);
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(HttpError::UnsupportedScheme);
    }
    // A fragment is never sent by a client; one here is a malformed or crafted target.
    if rest.contains('#') {
        return Err(HttpError::BadTarget);
    }
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    let (host, port) = parse_authority(authority).map_err(HttpError::Authority)?;
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    Ok((host, port.unwrap_or(80), path))
}

/// The head sent upstream: origin-form request line, our `Host`, the client's end-to-end
/// headers, `Connection: close`.
fn rewrite(
    method: &str,
    host: &Host,
    port: u16,
    path: String,
    version: &str,
    headers: &[(&str, &[u8])],
) -> Result<Vec<u8>, HttpError> {
    let mut named_by_connection: Vec<String> = Vec::new();
    let mut content_lengths = 0;
    let mut transfer_encoding: Option<&[u8]> = None;
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("connection") {
            for token in value.split(|&b| b == b',') {
                let token = String::from_utf8_lossy(token.trim_ascii()).to_ascii_lowercase();
                if matches!(
                    token.as_str(),
                    "host" | "content-length" | "transfer-encoding"
                ) {
                    return Err(HttpError::ConnectionNamesFraming);
                }
                named_by_connection.push(token);
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            content_lengths += 1;
            if content_lengths > 1
                || value.is_empty()
                || value.len() > 19
                || !value.iter().all(u8::is_ascii_digit)
            {
                return Err(HttpError::BadContentLength);
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_encoding = Some(value);
        }
    }
    if let Some(codings) = transfer_encoding {
        if content_lengths > 0 {
            return Err(HttpError::LengthConflict);
        }
        let last = codings.rsplit(|&b| b == b',').next().unwrap_or_default();
        if !last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
            return Err(HttpError::BadTransferEncoding);
        }
    }

    let authority = if port == 80 {
        match host {
            Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
            other => other.to_string(),
        }
    } else {
        host.authority(port)
    };
    let mut head = format!("{method} {path} {version}\r\nHost: {authority}\r\n").into_bytes();
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        let dropped = lower == "host"
            || lower.starts_with("proxy-")
            || HOP_BY_HOP.contains(&lower.as_str())
            || named_by_connection.contains(&lower);
        if !dropped {
            head.extend_from_slice(name.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value);
            head.extend_from_slice(b"\r\n");
        }
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(head)
}

/// Whether `b` may appear in a token (RFC 9110 section 5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A complete response from the proxy itself: a short plain-text body, `Connection: close`,
/// and `X-Airlock-Denied: <code>` when a rule refused the request.
pub fn proxy_response(status: u16, denied: Option<&str>, body: &str) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        502 => "Bad Gateway",
        _ => "Error",
    };
    let mut response = format!("HTTP/1.1 {status} {reason}\r\n");
    if let Some(code) = denied {
        response.push_str("X-Airlock-Denied: ");
        response.push_str(code);
        response.push_str("\r\n");
    }
    // The body comes from our own messages; strip line breaks so it stays one line.
    let body: String = body
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    response.push_str(&format!(
        "Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}\n",
        body.len() + 1
    ));
    response.into_bytes()
}

#[cfg(test)]
mod tests;
