//! Parsing proxy requests, well-formed and hostile.

use super::*;

fn parse(text: &str) -> Result<ProxyRequest, HttpError> {
    let mut scanner = HeadScanner::default();
    let end = scanner.feed(text.as_bytes())?.expect("complete head");
    assert_eq!(end, text.len());
    parse_request(text.as_bytes())
}

fn name(host: &str) -> Host {
    Host::parse(host).unwrap()
}

fn forwarded_head(text: &str) -> String {
    match parse(text).unwrap() {
        ProxyRequest::Forward { head, .. } => String::from_utf8(head).unwrap(),
        other => panic!("not forwarded: {other:?}"),
    }
}

#[test]
fn connect_targets_parse() {
    assert_eq!(
        parse("CONNECT Example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n").unwrap(),
        ProxyRequest::Connect {
            host: name("example.com"),
            port: 443
        }
    );
    assert_eq!(
        parse("CONNECT [::1]:8443 HTTP/1.1\r\n\r\n").unwrap(),
        ProxyRequest::Connect {
            host: name("::1"),
            port: 8443
        }
    );
    assert_eq!(
        parse("CONNECT 10.0.0.1:22 HTTP/1.0\n\n").unwrap(),
        ProxyRequest::Connect {
            host: name("10.0.0.1"),
            port: 22
        }
    );
    let bad: &[(&str, HttpError)] = &[
        (
            "CONNECT example.com HTTP/1.1\r\n\r\n",
            HttpError::Authority(AuthorityError::MissingPort),
        ),
        (
            "CONNECT example.com:0 HTTP/1.1\r\n\r\n",
            HttpError::Authority(AuthorityError::PortZero),
        ),
        (
            "CONNECT example.com:99999 HTTP/1.1\r\n\r\n",
            HttpError::Authority(AuthorityError::BadPort),
        ),
        (
            "CONNECT ::1:443 HTTP/1.1\r\n\r\n",
            HttpError::Authority(AuthorityError::Brackets),
        ),
        (
            "CONNECT [::1]x:443 HTTP/1.1\r\n\r\n",
            HttpError::Authority(AuthorityError::Brackets),
        ),
        (
            "CONNECT user@example.com:443 HTTP/1.1\r\n\r\n",
            HttpError::Authority(AuthorityError::UserInfo),
        ),
        (
            "CONNECT 127.1:443 HTTP/1.1\r\n\r\n",
            HttpError::Authority(AuthorityError::Host(HostError::NumericName { at: 4 })),
        ),
        (
            "CONNECT a.com:443 HTTP/1.1\r\nHost: b.com:443\r\n\r\n",
            HttpError::HostMismatch,
        ),
        (
            "CONNECT a.com:443 HTTP/1.1\r\nHost: a.com:80\r\n\r\n",
            HttpError::HostMismatch,
        ),
        ("CONNECT a.com:443 HTTP/2\r\n\r\n", HttpError::BadVersion),
    ];
    for (text, want) in bad {
        assert_eq!(parse(text).unwrap_err(), *want, "{text}");
    }
}

#[test]
fn absolute_form_is_rewritten_to_origin_form() {
    let head = forwarded_head(
        "GET http://Example.com/a/b?q=1 HTTP/1.1\r\n\
         Host: example.com\r\n\
         User-Agent: t\r\n\
         Proxy-Authorization: Basic eA==\r\n\
         Proxy-Connection: keep-alive\r\n\
         Connection: keep-alive, X-Secret\r\n\
         X-Secret: 1\r\n\
         Keep-Alive: 5\r\n\
         TE: trailers\r\n\
         Upgrade: websocket\r\n\
         Accept:   */*  \r\n\r\n",
    );
    assert_eq!(
        head,
        "GET /a/b?q=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent: t\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    let cases = [
        (
            "GET http://example.com HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: example.com\r\n",
        ),
        (
            "GET http://example.com?x HTTP/1.1\r\n\r\n",
            "GET /?x HTTP/1.1\r\nHost: example.com\r\n",
        ),
        (
            "DELETE HTTP://a.com:8080/x HTTP/1.0\r\n\r\n",
            "DELETE /x HTTP/1.0\r\nHost: a.com:8080\r\n",
        ),
        (
            "GET http://[::1]/ HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: [::1]\r\n",
        ),
        (
            "GET http://[::1]:81/ HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: [::1]:81\r\n",
        ),
        (
            "POST http://a.com/ HTTP/1.1\r\nContent-Length: 3\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: 3\r\n",
        ),
        (
            "POST http://a.com/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a.com\r\nTransfer-Encoding: gzip, chunked\r\n",
        ),
    ];
    for (text, start) in cases {
        let head = forwarded_head(text);
        assert!(head.starts_with(start), "{text}: {head}");
        assert!(head.ends_with("Connection: close\r\n\r\n"), "{text}");
    }
    let ProxyRequest::Forward {
        method, host, port, ..
    } = parse("PUT http://a.com:81/ HTTP/1.1\r\n\r\n").unwrap()
    else {
        panic!("not forwarded");
    };
    assert_eq!((method.as_str(), host, port), ("PUT", name("a.com"), 81));
}

#[test]
fn malformed_and_dangerous_requests_are_refused() {
    let bad: &[(&str, HttpError)] = &[
        (
            "GET /path HTTP/1.1\r\nHost: a.com\r\n\r\n",
            HttpError::OriginForm,
        ),
        ("OPTIONS * HTTP/1.1\r\n\r\n", HttpError::OriginForm),
        (
            "GET https://a.com/ HTTP/1.1\r\n\r\n",
            HttpError::HttpsNeedsConnect,
        ),
        (
            "GET ftp://a.com/ HTTP/1.1\r\n\r\n",
            HttpError::UnsupportedScheme,
        ),
        ("GET a.com/ HTTP/1.1\r\n\r\n", HttpError::BadTarget),
        ("GET http://a.com/#x HTTP/1.1\r\n\r\n", HttpError::BadTarget),
        (
            "GET http://u:p@a.com/ HTTP/1.1\r\n\r\n",
            HttpError::Authority(AuthorityError::UserInfo),
        ),
        (
            "GET http:///x HTTP/1.1\r\n\r\n",
            HttpError::Authority(AuthorityError::Empty),
        ),
        (
            "GET http://a.com/ HTTP/1.1\r\nHost: b.com\r\n\r\n",
            HttpError::HostMismatch,
        ),
        (
            "GET http://a.com/ HTTP/1.1\r\nHost: a.com:8080\r\n\r\n",
            HttpError::HostMismatch,
        ),
        (
            "GET http://a.com:8080/ HTTP/1.1\r\nHost: a.com\r\n\r\n",
            HttpError::HostMismatch,
        ),
        (
            "GET http://a.com/ HTTP/1.1\r\nHost: a.com\r\nhost: a.com\r\n\r\n",
            HttpError::DuplicateHost,
        ),
        (
            "GET http://a.com/ HTTP/1.1\r\nHost: a..com\r\n\r\n",
            HttpError::BadHostHeader(AuthorityError::Host(HostError::EmptyLabel { at: 2 })),
        ),
        (
            "GET http://a.com/ HTTP/1.1\r\nX: 1\r\n folded\r\n\r\n",
            HttpError::ObsFold,
        ),
        (
            "GET http://a.com/ HTTP/1.1\r\nX : 1\r\n\r\n",
            HttpError::BadHeader,
        ),
        (
            "GET http://a.com/ HTTP/1.1\r\nno colon\r\n\r\n",
            HttpError::BadHeader,
        ),
        (
            "GET http://a.com/ HTTP/1.1\r\nX: a\rb\r\n\r\n",
            HttpError::BadHeader,
        ),
        (
            "GET http://a.com/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            HttpError::BadContentLength,
        ),
        (
            "GET http://a.com/ HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            HttpError::BadContentLength,
        ),
        (
            "POST http://a.com/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            HttpError::LengthConflict,
        ),
        (
            "POST http://a.com/ HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            HttpError::BadTransferEncoding,
        ),
        (
            "POST http://a.com/ HTTP/1.1\r\nConnection: content-length\r\n\r\n",
            HttpError::ConnectionNamesFraming,
        ),
        (
            "GET  http://a.com/ HTTP/1.1\r\n\r\n",
            HttpError::BadRequestLine,
        ),
        (
            "GET http://a.com/ HTTP/1.1 x\r\n\r\n",
            HttpError::BadRequestLine,
        ),
        (
            "GET http://a.com/\x01 HTTP/1.1\r\n\r\n",
            HttpError::BadRequestLine,
        ),
    ];
    for (text, want) in bad {
        assert_eq!(parse(text).unwrap_err(), *want, "{text:?}");
    }
}

#[test]
fn the_scanner_refuses_over_long_input_before_it_ends() {
    // A request line that never ends is refused once it passes the line bound.
    let mut line = b"GET http://a.com/".to_vec();
    line.resize(MAX_LINE + 2, b'a');
    assert_eq!(
        HeadScanner::default().feed(&line),
        Err(HttpError::LineTooLong)
    );
    let mut scanner = HeadScanner::default();
    assert_eq!(scanner.feed(&line[..MAX_LINE]), Ok(None));
    assert_eq!(scanner.feed(&line), Err(HttpError::LineTooLong));
    // A complete over-long header line.
    let mut text = b"GET http://a.com/ HTTP/1.1\r\nX: ".to_vec();
    text.resize(text.len() + MAX_LINE, b'a');
    text.extend_from_slice(b"\r\n");
    assert_eq!(
        HeadScanner::default().feed(&text),
        Err(HttpError::LineTooLong)
    );
    // Many short lines exceed the head bound.
    let mut text = b"GET http://a.com/ HTTP/1.1\r\n".to_vec();
    while text.len() < MAX_HEAD {
        text.extend_from_slice(format!("X: {}\r\n", "a".repeat(1000)).as_bytes());
    }
    assert_eq!(
        HeadScanner::default().feed(&text),
        Err(HttpError::HeadTooLarge)
    );
    // Too many header lines.
    let mut text = b"GET http://a.com/ HTTP/1.1\r\n".to_vec();
    for _ in 0..=MAX_HEADERS {
        text.extend_from_slice(b"X: 1\r\n");
    }
    assert_eq!(
        HeadScanner::default().feed(&text),
        Err(HttpError::TooManyHeaders)
    );
    // Not HTTP at all: refused at the first byte.
    assert_eq!(
        HeadScanner::default().feed(&[0x16, 3, 1]),
        Err(HttpError::BadMethod)
    );
    assert_eq!(
        HeadScanner::default().feed(&[4, 1, 0, 80]),
        Err(HttpError::BadMethod)
    );
    assert_eq!(
        HeadScanner::default().feed(b" GET"),
        Err(HttpError::BadMethod)
    );
    assert_eq!(
        HeadScanner::default().feed(b"\r\n"),
        Err(HttpError::BadMethod)
    );
    assert_eq!(
        HeadScanner::default().feed(&[b'A'; MAX_METHOD + 1]),
        Err(HttpError::BadMethod)
    );
}

#[test]
fn the_scanner_finds_the_end_across_reads() {
    let text = b"GET http://a.com/ HTTP/1.1\r\nHost: a.com\r\n\r\nBODY";
    let mut scanner = HeadScanner::default();
    let mut end = None;
    for n in 1..=text.len() {
        end = scanner.feed(&text[..n]).unwrap();
        if end.is_some() {
            break;
        }
    }
    assert_eq!(end, Some(text.len() - 4));
}

#[tokio::test]
async fn read_request_returns_the_bytes_after_the_head() {
    use tokio::io::AsyncWriteExt;
    let (mut client, mut server) = tokio::io::duplex(64 * 1024);
    client
        .write_all(b"CONNECT a.com:443 HTTP/1.1\r\n\r\n\x16\x03\x01")
        .await
        .unwrap();
    let (request, rest) = read_request(&mut server).await.unwrap();
    assert_eq!(
        request,
        ProxyRequest::Connect {
            host: name("a.com"),
            port: 443
        }
    );
    assert_eq!(rest, b"\x16\x03\x01");
    drop(client);
    let (client, mut server) = tokio::io::duplex(64);
    drop(client);
    assert!(matches!(
        read_request(&mut server).await,
        Err(ReadError::Closed)
    ));
    let (mut client, mut server) = tokio::io::duplex(64);
    client.write_all(b"GET http://a.com/").await.unwrap();
    drop(client);
    assert!(matches!(
        read_request(&mut server).await,
        Err(ReadError::Http(HttpError::Truncated))
    ));
}

#[test]
fn proxy_responses_are_well_formed() {
    let response =
        String::from_utf8(proxy_response(403, Some("host-not-allowed"), "no\r\nway")).unwrap();
    assert_eq!(
        response,
        "HTTP/1.1 403 Forbidden\r\nX-Airlock-Denied: host-not-allowed\r\n\
         Content-Type: text/plain; charset=utf-8\r\nContent-Length: 8\r\nConnection: close\r\n\r\nno  way\n"
    );
}
