//! The proxy over loopback, against upstream servers started here.

use std::collections::HashMap;

use super::*;
use crate::egress::http::MAX_LINE;

#[derive(Debug, Default)]
struct FakeResolver {
    names: HashMap<String, Vec<IpAddr>>,
    asked: Mutex<Vec<String>>,
}

impl Resolve for FakeResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> ResolveFuture<'a> {
        self.asked.lock().unwrap().push(name.to_string());
        let result = self.names.get(name).cloned().ok_or(ResolveError::NotFound);
        Box::pin(async move { result })
    }
}

struct Proxy {
    address: SocketAddr,
    events: mpsc::UnboundedReceiver<EgressEvent>,
    stop: CancelSignal,
    server: tokio::task::JoinHandle<EgressSummary>,
    resolver: Arc<FakeResolver>,
}

impl Proxy {
    async fn event(&mut self) -> EgressEvent {
        self.events.recv().await.expect("the proxy is running")
    }

    async fn finish(self) -> EgressSummary {
        self.stop.cancel();
        self.server.await.unwrap()
    }

    fn asked(&self) -> Vec<String> {
        self.resolver.asked.lock().unwrap().clone()
    }
}

async fn start(
    hosts: &[String],
    addresses: &[&str],
    names: &[(&str, &[&str])],
    limits: EgressLimits,
) -> Proxy {
    let policy = Arc::new(EgressPolicy::parse(hosts, addresses).unwrap());
    let resolver = Arc::new(FakeResolver {
        names: names
            .iter()
            .map(|(name, ips)| {
                (
                    name.to_string(),
                    ips.iter().map(|ip| ip.parse().unwrap()).collect(),
                )
            })
            .collect(),
        asked: Mutex::default(),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (sender, events) = mpsc::unbounded_channel();
    let stop = CancelSignal::new();
    let server = tokio::spawn(serve(
        listener,
        policy,
        limits,
        Arc::clone(&resolver) as Arc<dyn Resolve>,
        Arc::new(sender),
        stop.clone(),
    ));
    Proxy {
        address,
        events,
        stop,
        server,
        resolver,
    }
}

/// An upstream that echoes every connection until its client closes.
pub(super) async fn echo_server(bind: &str) -> SocketAddr {
    let listener = TcpListener::bind(bind).await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    address
}

/// Reads a response head byte by byte, leaving tunnel data unread.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let byte = stream.read_u8().await.expect("a response head");
        head.push(byte);
    }
    String::from_utf8(head).unwrap()
}

/// Opens a CONNECT tunnel; returns the stream and the response head.
pub(super) async fn connect_via(proxy: SocketAddr, target: &str) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = read_head(&mut stream).await;
    (stream, head)
}

/// Sends `request`, returns everything the proxy answers until it closes.
async fn exchange(proxy: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    answer
}

async fn http_exchange(proxy: SocketAddr, request: &str) -> String {
    String::from_utf8(exchange(proxy, request.as_bytes()).await).unwrap()
}

pub(super) async fn ping(stream: &mut TcpStream) {
    stream.write_all(b"ping").await.unwrap();
    let mut answer = [0u8; 4];
    stream.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"ping");
}

pub(super) fn loopback_only() -> Vec<&'static str> {
    vec!["127.0.0.1/32"]
}

#[tokio::test]
async fn connect_tunnels_to_an_allowed_upstream() {
    let upstream = echo_server("127.0.0.1:0").await;
    let rule = format!("127.0.0.1:{}", upstream.port());
    let mut proxy = start(
        std::slice::from_ref(&rule),
        &loopback_only(),
        &[],
        EgressLimits::default(),
    )
    .await;
    let (mut stream, head) = connect_via(proxy.address, &upstream.to_string()).await;
    assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
    ping(&mut stream).await;
    drop(stream);
    let event = proxy.event().await;
    assert_eq!(
        event,
        EgressEvent {
            kind: EgressKind::Connect,
            host: "127.0.0.1".into(),
            port: upstream.port(),
            address: Some(upstream),
            allowed: true,
            rule_or_reason: format!("{rule} via 127.0.0.1/32"),
            bytes_up: 4,
            bytes_down: 4,
            end: Some(TunnelEnd::Closed),
            error: None,
        }
    );
    assert!(proxy.asked().is_empty(), "a literal is never resolved");
    let summary = proxy.finish().await;
    assert_eq!(
        (summary.connections, summary.refused, summary.failed),
        (1, 0, 0)
    );
    assert_eq!((summary.bytes_up, summary.bytes_down), (4, 4));
    assert_eq!(summary.events, vec![event]);
}

#[tokio::test]
async fn absolute_form_requests_are_forwarded_in_origin_form() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (head_sender, head_received) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(stream.read_u8().await.unwrap());
        }
        let mut body = [0u8; 3];
        stream.read_exact(&mut body).await.unwrap();
        let _ = head_sender.send((String::from_utf8(head).unwrap(), body));
        stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
            .await
            .unwrap();
    });
    let mut proxy = start(
        &[format!("web.test:{port}")],
        &loopback_only(),
        &[("web.test", &["127.0.0.1"])],
        EgressLimits::default(),
    )
    .await;
    let request = format!(
        "POST http://Web.Test:{port}/p?q=1 HTTP/1.1\r\nHost: web.test:{port}\r\n\
         Proxy-Authorization: Basic eDp5\r\nProxy-Connection: keep-alive\r\n\
         Content-Length: 3\r\nAccept: */*\r\n\r\nabc"
    );
    let answer = http_exchange(proxy.address, &request).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\nhello"), "{answer}");
    let (head, body) = head_received.await.unwrap();
    assert_eq!(
        head,
        format!(
            "POST /p?q=1 HTTP/1.1\r\nHost: web.test:{port}\r\nContent-Length: 3\r\n\
             Accept: */*\r\nConnection: close\r\n\r\n"
        )
    );
    assert_eq!(&body, b"abc");
    let event = proxy.event().await;
    assert_eq!(event.kind, EgressKind::Forward);
    assert_eq!((event.host.as_str(), event.allowed), ("web.test", true));
    assert_eq!(event.bytes_up, u64::try_from(head.len()).unwrap() + 3);
    assert_eq!(proxy.asked(), vec!["web.test".to_string()], "resolved once");
}

#[tokio::test]
async fn hosts_and_ports_not_on_the_list_are_refused_unresolved() {
    let mut proxy = start(
        &["allowed.test".into()],
        &loopback_only(),
        &[
            ("evil.test", &["127.0.0.1"]),
            ("allowed.test", &["127.0.0.1"]),
        ],
        EgressLimits::default(),
    )
    .await;
    for (request, code) in [
        ("CONNECT evil.test:443 HTTP/1.1\r\n\r\n", "host-not-allowed"),
        ("GET http://evil.test/ HTTP/1.1\r\n\r\n", "host-not-allowed"),
        (
            "CONNECT allowed.test:22 HTTP/1.1\r\n\r\n",
            "port-not-allowed",
        ),
    ] {
        let answer = http_exchange(proxy.address, request).await;
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
        assert!(
            answer.contains(&format!("\r\nX-Airlock-Denied: {code}\r\n")),
            "{answer}"
        );
        let event = proxy.event().await;
        assert!(!event.allowed);
        assert!(
            event.rule_or_reason.starts_with(code),
            "{}",
            event.rule_or_reason
        );
        assert_eq!(event.address, None);
    }
    assert!(
        proxy.asked().is_empty(),
        "names not on the list are never looked up"
    );
    let summary = proxy.finish().await;
    assert_eq!((summary.connections, summary.refused), (3, 3));
}

#[tokio::test]
async fn names_resolving_to_non_public_addresses_are_refused() {
    let cases = [
        ("ten.test", "10.0.0.1"),
        ("meta.test", "169.254.169.254"),
        ("lo.test", "127.0.0.1"),
        ("mapped.test", "::ffff:127.0.0.1"),
        ("ula.test", "fd00::1"),
        ("zero.test", "0.0.0.0"),
    ];
    let hosts: Vec<String> = cases.iter().map(|(name, _)| format!("{name}:80")).collect();
    let names: Vec<(&str, &[&str])> = cases
        .iter()
        .map(|(name, ip)| (*name, std::slice::from_ref(ip)))
        .collect();
    let mut proxy = start(&hosts, &[], &names, EgressLimits::default()).await;
    for (name, ip) in cases {
        let answer = http_exchange(
            proxy.address,
            &format!("CONNECT {name}:80 HTTP/1.1\r\n\r\n"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{name}: {answer}");
        let code = if ip == "0.0.0.0" {
            "address-never-allowed"
        } else {
            "address-not-allowed"
        };
        assert!(
            answer.contains(&format!("X-Airlock-Denied: {code}\r\n")),
            "{name}: {answer}"
        );
        let event = proxy.event().await;
        assert!(!event.allowed);
        assert_eq!(
            event.address,
            Some(SocketAddr::new(ip.parse().unwrap(), 80))
        );
    }
}

#[tokio::test]
async fn covered_non_public_addresses_are_reached() {
    let upstream = echo_server("127.0.0.1:0").await;
    let port = upstream.port();
    let mut names: Vec<(&str, &[&str])> = vec![
        ("lo.test", &["127.0.0.1"]),
        ("mix.test", &["10.0.0.1", "127.0.0.1"]),
    ];
    // A v4-mapped address needs an IPv6 socket, which a kernel without IPv6 cannot make.
    let v6 = tokio::net::TcpSocket::new_v6().is_ok();
    if v6 {
        names.push(("mapped.test", &["::ffff:127.0.0.1"]));
    } else {
        eprintln!("SKIP: no IPv6 sockets here; the ::ffff:127.0.0.1 case is not run");
    }
    let hosts: Vec<String> = names
        .iter()
        .map(|(name, _)| format!("{name}:{port}"))
        .collect();
    let mut proxy = start(&hosts, &loopback_only(), &names, EgressLimits::default()).await;
    for (name, _) in &names {
        let (mut stream, head) = connect_via(proxy.address, &format!("{name}:{port}")).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{name}: {head}");
        ping(&mut stream).await;
        drop(stream);
        let event = proxy.event().await;
        assert!(event.allowed, "{name}");
        // The refused 10.0.0.1 of mix.test is skipped, never tried.
        assert_eq!(
            event.address.map(|a| a.ip().to_canonical()),
            Some(upstream.ip()),
            "{name}"
        );
        assert!(
            event.rule_or_reason.ends_with("via 127.0.0.1/32"),
            "{}",
            event.rule_or_reason
        );
    }
    let asked = proxy.asked();
    assert_eq!(
        asked.len(),
        names.len(),
        "each name resolved once: {asked:?}"
    );
}

#[tokio::test]
async fn malformed_requests_are_answered_400() {
    let mut proxy = start(
        &["web.test".into(), "other.test".into()],
        &[],
        &[
            ("web.test", &["93.184.216.34"]),
            ("other.test", &["93.184.216.34"]),
        ],
        EgressLimits::default(),
    )
    .await;
    for request in [
        "GET http://web.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
        "CONNECT web.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n",
        "GET /relative HTTP/1.1\r\nHost: web.test\r\n\r\n",
        "GET https://web.test/ HTTP/1.1\r\n\r\n",
        "\x16\x03\x01\x02\x00\x01\x00",
    ] {
        let answer = http_exchange(proxy.address, request).await;
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{request:?}: {answer}"
        );
        let event = proxy.event().await;
        assert!(!event.allowed && event.rule_or_reason.starts_with("bad-request: "));
    }
    assert!(proxy.asked().is_empty());
}

#[tokio::test]
async fn an_over_long_request_line_is_refused_before_it_ends() {
    let proxy = start(&[], &[], &[], EgressLimits::default()).await;
    let mut stream = TcpStream::connect(proxy.address).await.unwrap();
    let mut line = b"GET http://a.test/".to_vec();
    line.resize(MAX_LINE + 100, b'a');
    // No line end, and the connection stays open: the answer cannot wait for either.
    stream.write_all(&line).await.unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    assert!(body.contains("longer than"), "{body}");
}

#[tokio::test]
async fn ipv6_literals_follow_the_literal_rules() {
    let mut proxy = start(
        &["[::1]:8080".into()],
        &["127.0.0.1/32"],
        &[],
        EgressLimits::default(),
    )
    .await;
    for (request, code, host) in [
        (
            "CONNECT [::1]:8080 HTTP/1.1\r\n\r\n",
            "address-not-allowed",
            "::1",
        ),
        (
            "CONNECT [::1]:80 HTTP/1.1\r\n\r\n",
            "port-not-allowed",
            "::1",
        ),
        (
            "CONNECT [::2]:8080 HTTP/1.1\r\n\r\n",
            "host-not-allowed",
            "::2",
        ),
        (
            "GET http://[::1]:8080/ HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n",
            "address-not-allowed",
            "::1",
        ),
        // A CIDR alone does not admit a literal.
        (
            "CONNECT 127.0.0.1:8080 HTTP/1.1\r\n\r\n",
            "host-not-allowed",
            "127.0.0.1",
        ),
    ] {
        let answer = http_exchange(proxy.address, request).await;
        assert!(
            answer.contains(&format!("X-Airlock-Denied: {code}\r\n")),
            "{request}: {answer}"
        );
        assert_eq!(proxy.event().await.host, host);
    }
    let Ok(listener) = std::net::TcpListener::bind("[::1]:0") else {
        eprintln!("SKIP: no IPv6 loopback here; the [::1] tunnel is not run");
        return;
    };
    drop(listener);
    let upstream = echo_server("[::1]:0").await;
    let mut proxy = start(
        &[format!("[::1]:{}", upstream.port())],
        &["::1/128"],
        &[],
        EgressLimits::default(),
    )
    .await;
    let (mut stream, head) = connect_via(proxy.address, &upstream.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    ping(&mut stream).await;
    drop(stream);
    assert_eq!(proxy.event().await.address, Some(upstream));
}

/// Runs a SOCKS5 greeting and request; returns the stream and the reply.
async fn socks_connect(proxy: SocketAddr, request: &[u8]) -> (TcpStream, Vec<u8>) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(&[5, 1, 0]).await.unwrap();
    let mut method = [0u8; 2];
    stream.read_exact(&mut method).await.unwrap();
    assert_eq!(method, [5, 0]);
    stream.write_all(request).await.unwrap();
    let mut reply = vec![0u8; 10];
    stream.read_exact(&mut reply).await.unwrap();
    (stream, reply)
}

fn socks_domain(name: &str, port: u16) -> Vec<u8> {
    let mut request = vec![5, 1, 0, 3, u8::try_from(name.len()).unwrap()];
    request.extend_from_slice(name.as_bytes());
    request.extend_from_slice(&port.to_be_bytes());
    request
}

#[tokio::test]
async fn socks5_domain_connects_are_allowed_and_refused() {
    let upstream = echo_server("127.0.0.1:0").await;
    let port = upstream.port();
    let mut proxy = start(
        &[format!("echo.test:{port}")],
        &loopback_only(),
        &[("echo.test", &["127.0.0.1"]), ("evil.test", &["127.0.0.1"])],
        EgressLimits::default(),
    )
    .await;
    let (mut stream, reply) = socks_connect(proxy.address, &socks_domain("echo.test", port)).await;
    assert_eq!(
        reply,
        [5, 0, 0, 1, 0, 0, 0, 0, 0, 0],
        "the host's own address and port stay unsaid"
    );
    ping(&mut stream).await;
    drop(stream);
    let event = proxy.event().await;
    assert_eq!(
        (event.kind, event.allowed, event.bytes_up, event.bytes_down),
        (EgressKind::Socks5, true, 4, 4)
    );

    let (_, reply) = socks_connect(proxy.address, &socks_domain("evil.test", port)).await;
    assert_eq!(reply, [5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
    let event = proxy.event().await;
    assert!(!event.allowed && event.rule_or_reason.starts_with("host-not-allowed"));
    assert_eq!(proxy.asked(), vec!["echo.test".to_string()]);
}

#[tokio::test]
async fn socks5_unsupported_commands_and_address_types_get_their_codes() {
    let mut proxy = start(&[], &[], &[], EgressLimits::default()).await;
    let bind = [5, 2, 0, 1, 127, 0, 0, 1, 0, 80];
    let (_, reply) = socks_connect(proxy.address, &bind).await;
    assert_eq!(reply[1], 0x07);
    proxy.event().await;
    let mut stream = TcpStream::connect(proxy.address).await.unwrap();
    stream.write_all(&[5, 1, 0, 5, 1, 0, 9]).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    assert_eq!(answer, [5, 0, 5, 8, 0, 1, 0, 0, 0, 0, 0, 0]);
    // The proxy waits for the client to close before it records the connection.
    drop(stream);
    proxy.event().await;
    let answer = exchange(proxy.address, &[5, 1, 2]).await;
    assert_eq!(answer, [5, 0xff]);
}

#[tokio::test]
async fn upstream_failures_are_502_and_socks_host_unreachable() {
    // A port nothing listens on: bind one, then close it.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let mut proxy = start(
        &[
            format!("closed.test:{}", closed.port()),
            format!("gone.test:{}", closed.port()),
        ],
        &loopback_only(),
        &[("closed.test", &["127.0.0.1"])],
        EgressLimits::default(),
    )
    .await;
    let answer = http_exchange(
        proxy.address,
        &format!("CONNECT closed.test:{} HTTP/1.1\r\n\r\n", closed.port()),
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
    let event = proxy.event().await;
    assert_eq!(
        (event.allowed, event.end),
        (true, Some(TunnelEnd::Unreachable))
    );
    let (_, reply) =
        socks_connect(proxy.address, &socks_domain("closed.test", closed.port())).await;
    assert_eq!(reply[1], 0x05, "connection refused");
    proxy.event().await;
    let (_, reply) = socks_connect(proxy.address, &socks_domain("gone.test", closed.port())).await;
    assert_eq!(reply[1], 0x04, "the name does not resolve");
    proxy.event().await;
    let summary = proxy.finish().await;
    assert_eq!((summary.failed, summary.refused), (3, 0));
}

#[tokio::test]
async fn connections_beyond_the_concurrent_limit_are_refused() {
    let upstream = echo_server("127.0.0.1:0").await;
    let limits = EgressLimits {
        max_concurrent: 2,
        ..EgressLimits::default()
    };
    let mut proxy = start(
        &[format!("127.0.0.1:{}", upstream.port())],
        &loopback_only(),
        &[],
        limits,
    )
    .await;
    let target = upstream.to_string();
    let (mut first, _) = connect_via(proxy.address, &target).await;
    let (mut second, _) = connect_via(proxy.address, &target).await;
    ping(&mut first).await;
    ping(&mut second).await;
    let answer = http_exchange(proxy.address, &format!("CONNECT {target} HTTP/1.1\r\n\r\n")).await;
    assert!(
        answer.contains("X-Airlock-Denied: too-many-concurrent\r\n"),
        "{answer}"
    );
    let event = proxy.event().await;
    assert!(!event.allowed && event.rule_or_reason.starts_with("too-many-concurrent"));
    // A closed tunnel gives its slot back.
    drop(first);
    assert!(proxy.event().await.allowed);
    let (mut third, head) = connect_via(proxy.address, &target).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    ping(&mut third).await;
    ping(&mut second).await;
}

#[tokio::test]
async fn connections_beyond_the_total_limit_are_refused() {
    let upstream = echo_server("127.0.0.1:0").await;
    let limits = EgressLimits {
        max_connections: 2,
        ..EgressLimits::default()
    };
    let mut proxy = start(
        &[format!("127.0.0.1:{}", upstream.port())],
        &loopback_only(),
        &[],
        limits,
    )
    .await;
    let target = upstream.to_string();
    for _ in 0..2 {
        let (mut stream, head) = connect_via(proxy.address, &target).await;
        assert!(head.starts_with("HTTP/1.1 200"));
        ping(&mut stream).await;
        drop(stream);
        proxy.event().await;
    }
    let answer = http_exchange(proxy.address, &format!("CONNECT {target} HTTP/1.1\r\n\r\n")).await;
    assert!(
        answer.contains("X-Airlock-Denied: too-many-connections\r\n"),
        "{answer}"
    );
    let summary = proxy.finish().await;
    assert_eq!((summary.connections, summary.refused), (3, 1));
}

#[tokio::test]
async fn stop_ends_open_tunnels() {
    let upstream = echo_server("127.0.0.1:0").await;
    let proxy = start(
        &[format!("127.0.0.1:{}", upstream.port())],
        &loopback_only(),
        &[],
        EgressLimits::default(),
    )
    .await;
    let (mut first, _) = connect_via(proxy.address, &upstream.to_string()).await;
    let (mut second, _) = connect_via(proxy.address, &upstream.to_string()).await;
    ping(&mut first).await;
    ping(&mut second).await;
    proxy.stop.cancel();
    for stream in [&mut first, &mut second] {
        let mut rest = Vec::new();
        assert_eq!(
            stream.read_to_end(&mut rest).await.unwrap(),
            0,
            "the client sees the end"
        );
    }
    let summary = proxy.server.await.unwrap();
    assert_eq!((summary.connections, summary.refused), (2, 0));
    for event in &summary.events {
        assert_eq!(
            (event.end, event.bytes_up, event.bytes_down),
            (Some(TunnelEnd::Stopped), 4, 4)
        );
    }
}

#[tokio::test]
async fn the_byte_limit_ends_a_tunnel_and_refuses_more() {
    let upstream = echo_server("127.0.0.1:0").await;
    let limits = EgressLimits {
        max_bytes: 10,
        ..EgressLimits::default()
    };
    let mut proxy = start(
        &[format!("127.0.0.1:{}", upstream.port())],
        &loopback_only(),
        &[],
        limits,
    )
    .await;
    let target = upstream.to_string();
    let (mut stream, _) = connect_via(proxy.address, &target).await;
    stream.write_all(&[7u8; 100]).await.unwrap();
    // The tunnel ends: an end of stream, or a reset if the proxy left input unread.
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest).await;
    let event = proxy.event().await;
    assert_eq!(event.end, Some(TunnelEnd::ByteLimit));
    assert_eq!(event.bytes_up + event.bytes_down, 10);
    let answer = http_exchange(proxy.address, &format!("CONNECT {target} HTTP/1.1\r\n\r\n")).await;
    assert!(
        answer.contains("X-Airlock-Denied: byte-limit\r\n"),
        "{answer}"
    );
}

#[tokio::test]
async fn the_summary_keeps_the_first_events_and_serializes() {
    let limits = EgressLimits {
        max_events: 1,
        ..EgressLimits::default()
    };
    let mut proxy = start(&[], &[], &[], limits).await;
    for _ in 0..3 {
        http_exchange(proxy.address, "CONNECT a.test:443 HTTP/1.1\r\n\r\n").await;
        proxy.event().await;
    }
    let summary = proxy.finish().await;
    assert_eq!(
        (
            summary.connections,
            summary.refused,
            summary.events.len(),
            summary.events_omitted
        ),
        (3, 3, 1, 2)
    );
    let json = serde_json::to_value(&summary).unwrap();
    assert_eq!(json["connections"], 3);
    assert_eq!(json["events"][0]["host"], "a.test");
    assert_eq!(json["events"][0]["kind"], "connect");
    assert_eq!(json["events"][0]["address"], serde_json::Value::Null);
    assert!(json["events"][0].get("error").is_none());
}

#[tokio::test]
async fn a_refusal_flood_is_closed_without_an_answer() {
    let limits = EgressLimits {
        max_concurrent: 0,
        ..EgressLimits::default()
    };
    let mut proxy = start(&[], &[], &[], limits).await;
    // These hold every refusal slot: each waits for a request that never comes.
    let mut waiting = Vec::new();
    for _ in 0..MAX_REFUSING {
        waiting.push(TcpStream::connect(proxy.address).await.unwrap());
    }
    let mut extra = TcpStream::connect(proxy.address).await.unwrap();
    let event = proxy.event().await;
    assert_eq!((event.host.as_str(), event.allowed), ("", false));
    assert!(event.rule_or_reason.starts_with("too-many-concurrent"));
    let mut answer = Vec::new();
    let _ = extra.read_to_end(&mut answer).await;
    assert!(answer.is_empty());
    // A waiting one still gets its answer.
    waiting[0]
        .write_all(b"CONNECT a.test:443 HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut waiting[0]).await;
    assert!(
        head.contains("X-Airlock-Denied: too-many-concurrent\r\n"),
        "{head}"
    );
    let summary = proxy.finish().await;
    assert_eq!(
        (summary.connections, summary.refused),
        (MAX_REFUSING + 1, MAX_REFUSING + 1)
    );
}

#[test]
fn the_budget_grants_exactly_up_to_the_limit() {
    let budget = Budget {
        limit: 10,
        used: AtomicU64::new(0),
    };
    assert_eq!(budget.take(4), 4);
    assert_eq!(budget.take(8), 6);
    assert!(budget.exhausted());
    assert_eq!(budget.take(1), 0);
    let unlimited = Budget {
        limit: u64::MAX,
        used: AtomicU64::new(0),
    };
    assert_eq!(unlimited.take(usize::MAX), usize::MAX);
}
