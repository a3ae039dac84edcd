//! Egress through the per-call proxy, seen from inside with real clients (curl, python)
//! against upstream servers on this host: what the allowlist lets through by every way of
//! asking, what it refuses by name and by address, and what a tool cannot do around it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;

use airlock_tests::{HANG_GUARD, Scratch, exec_json, sandbox_available, stdout_of, test_policy};

/// The proxy's port inside every egress sandbox.
const PROXY: u16 = airlock_policy::compile::EGRESS_PORT;

/// Skips (or fails under `AIRLOCK_MUST_WORK=1`) without the sandbox, curl or python.
fn clients_available() -> bool {
    if !sandbox_available() {
        return false;
    }
    let missing: Vec<&str> = ["/usr/bin/curl", "/usr/bin/python3"]
        .into_iter()
        .filter(|p| !Path::new(p).exists())
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var("AIRLOCK_MUST_WORK").as_deref() != Ok("1"),
        "{missing:?} missing and AIRLOCK_MUST_WORK=1"
    );
    eprintln!("SKIP: {missing:?} missing");
    false
}

/// An HTTP server on this host that answers every request with the request line it saw
/// and records each one.
struct Upstream {
    address: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Upstream {
    fn start(bind: &str) -> Option<Self> {
        let listener = TcpListener::bind(bind).ok()?;
        let address = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let record = Arc::clone(&record);
                thread::spawn(move || answer(stream, &record));
            }
        });
        Some(Self { address, seen })
    }

    fn port(&self) -> u16 {
        self.address.port()
    }

    fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

fn answer(stream: TcpStream, seen: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut host = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("host:") {
            host = value.trim().to_string();
        }
    }
    let request_line = request_line.trim_end().to_string();
    seen.lock()
        .unwrap()
        .push(format!("{request_line} host={host}"));
    let body = format!("upstream saw {request_line}\n");
    let mut stream = stream;
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// The text of a policy whose network is `network` (a TOML value), with a deadline that is
/// only a hang guard.
fn policy_text(network: &str) -> String {
    let limits = format!("timeout = {}", airlock_tests::hang_guard_toml());
    test_policy(&[], &limits, "none").replace("network = \"none\"", &format!("network = {network}"))
}

/// [`policy_text`] written to a file.
fn egress_policy(scratch: &Scratch, network: &str) -> std::path::PathBuf {
    scratch.write("p.toml", &policy_text(network))
}

/// The allowlist of tests that reach an upstream on this host's loopback at `port`.
fn loopback_allowlist(port: u16) -> String {
    format!(r#"{{ allow = ["127.0.0.1:{port}"], allow_addresses = ["127.0.0.1/32"] }}"#)
}

fn sh(policy: &Path, script: &str) -> serde_json::Value {
    exec_json(Some(policy), &[], &["/bin/sh", "-c", script])
}

fn events(result: &serde_json::Value) -> Vec<serde_json::Value> {
    result["network"]["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn allowed_destinations_are_reached_by_forwarding_connect_and_socks5_from_curl_and_python() {
    let _guard = airlock_tests::shared();
    if !clients_available() {
        return;
    }
    let upstream = Upstream::start("127.0.0.1:0").unwrap();
    let port = upstream.port();
    let scratch = Scratch::new("egress-allowed");
    let policy = egress_policy(&scratch, &loopback_allowlist(port));
    let url = format!("http://127.0.0.1:{port}");
    let script = format!(
        "curl -sS {url}/forward && curl -sS -p {url}/tunnel && \
         curl -sS --proxy \"$ALL_PROXY\" {url}/socks && \
         python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' {url}/python"
    );
    let result = sh(&policy, &script);
    assert_eq!(result["ok"], true, "{result}");
    let out = stdout_of(&result);
    for path in ["/forward", "/tunnel", "/socks", "/python"] {
        assert!(
            out.contains(&format!("upstream saw GET {path} HTTP/1.1")),
            "{path} missing from {out:?}\n{result}"
        );
    }
    // Forwarded requests reach the upstream in origin form, never as an absolute URL.
    assert!(
        upstream.requests().iter().all(|r| r.starts_with("GET /")),
        "{:?}",
        upstream.requests()
    );
    let network = &result["network"];
    assert_eq!(network["connections"], 4, "{result}");
    assert_eq!(network["refused"], 0, "{result}");
    let mut kinds: Vec<String> = events(&result)
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        ["connect", "forward", "forward", "socks5"],
        "{result}"
    );
    for event in events(&result) {
        assert_eq!(event["allowed"], true, "{event}");
        assert_eq!(event["address"], format!("127.0.0.1:{port}"), "{event}");
        assert!(event["bytes_down"].as_u64().unwrap() > 0, "{event}");
    }
}

#[test]
fn a_host_off_the_list_gets_a_403_that_says_why_and_is_never_contacted() {
    let _guard = airlock_tests::shared();
    if !clients_available() {
        return;
    }
    let upstream = Upstream::start("127.0.0.1:0").unwrap();
    let port = upstream.port();
    let scratch = Scratch::new("egress-not-listed");
    let policy = egress_policy(
        &scratch,
        r#"{ allow = ["pypi.org"], allow_addresses = ["127.0.0.1/32"] }"#,
    );
    let result = sh(
        &policy,
        &format!(
            "curl -sS -i http://127.0.0.1:{port}/; \
             curl -sS --proxy \"$ALL_PROXY\" http://127.0.0.1:{port}/ || echo socks-refused $?"
        ),
    );
    let out = stdout_of(&result);
    assert!(
        out.starts_with("HTTP/1.1 403 Forbidden"),
        "{out:?}\n{result}"
    );
    assert!(
        out.contains("X-Airlock-Denied: host-not-allowed"),
        "{out:?}"
    );
    // curl's exit code 97: the SOCKS5 server refused the connection.
    assert!(out.contains("socks-refused 97"), "{out:?}\n{result}");
    assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());
    assert_eq!(result["network"]["refused"], 2, "{result}");
    // Both refusals on one line of the record's `denials`: same destination, same reason.
    let network: Vec<&serde_json::Value> = result["denials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["layer"] == "network")
        .collect();
    assert_eq!(network.len(), 1, "{result}");
    assert_eq!(
        network[0]["object"],
        format!("127.0.0.1:{port}"),
        "{result}"
    );
    assert_eq!(network[0]["count"], 2, "{result}");
    assert!(
        network[0]["rule"]
            .as_str()
            .unwrap()
            .starts_with("host-not-allowed"),
        "{result}"
    );
    assert_eq!(
        result["isolation"]["denial_reporting"]["network"], "reported",
        "{result}"
    );
    for event in events(&result) {
        assert_eq!(event["allowed"], false, "{event}");
        assert!(
            event["rule_or_reason"]
                .as_str()
                .unwrap()
                .starts_with("host-not-allowed"),
            "{event}"
        );
    }
}

#[test]
fn an_allowed_name_that_resolves_to_a_loopback_address_is_refused_after_resolution() {
    let _guard = airlock_tests::shared();
    if !clients_available() {
        return;
    }
    let upstream = Upstream::start("127.0.0.1:0").unwrap();
    let port = upstream.port();
    let scratch = Scratch::new("egress-by-address");
    // The name is on the list; no allow_addresses entry covers where it leads.
    let policy = egress_policy(&scratch, &format!(r#"{{ allow = ["localhost:{port}"] }}"#));
    let result = sh(
        &policy,
        &format!("curl -sS -i http://localhost:{port}/; curl -sS -i -p http://localhost:{port}/"),
    );
    let out = stdout_of(&result);
    assert_eq!(
        out.matches("X-Airlock-Denied: address-not-allowed").count(),
        2,
        "{out:?}\n{result}"
    );
    assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());
    for event in events(&result) {
        assert_eq!(event["allowed"], false, "{event}");
        let reason = event["rule_or_reason"].as_str().unwrap();
        assert!(reason.contains("loopback"), "{event}");
    }
}

#[test]
fn a_host_header_that_disagrees_with_the_target_and_an_over_long_request_are_refused() {
    let _guard = airlock_tests::shared();
    if !clients_available() {
        return;
    }
    let upstream = Upstream::start("127.0.0.1:0").unwrap();
    let port = upstream.port();
    let scratch = Scratch::new("egress-malformed");
    let policy = egress_policy(&scratch, &loopback_allowlist(port));
    let long = "a".repeat(20_000);
    let result = sh(
        &policy,
        &format!(
            "curl -sS -o /dev/null -w '%{{http_code}}\\n' -H 'Host: metadata.internal' http://127.0.0.1:{port}/; \
             curl -sS -o /dev/null -w '%{{http_code}}\\n' http://127.0.0.1:{port}/{long}"
        ),
    );
    assert_eq!(stdout_of(&result), "400\n400\n", "{result}");
    assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());
}

#[test]
fn the_hosts_services_udp_and_raw_sockets_stay_out_of_reach_around_the_proxy() {
    let _guard = airlock_tests::shared();
    if !clients_available() {
        return;
    }
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let (tcp_port, udp_port) = (
        tcp.local_addr().unwrap().port(),
        udp.local_addr().unwrap().port(),
    );
    let scratch = Scratch::new("egress-bypass");
    let policy = egress_policy(&scratch, &loopback_allowlist(tcp_port));
    let script = r#"
import socket, sys
tcp, udp = int(sys.argv[1]), int(sys.argv[2])
try:
    socket.create_connection(("127.0.0.1", tcp), timeout=5).close()
    print("tcp connected")
except OSError as e:
    print("tcp errno", e.errno)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.sendto(b"escape", ("127.0.0.1", udp))
    print("udp sent")
except OSError as e:
    print("udp errno", e.errno)
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    print("raw opened")
except OSError as e:
    print("raw errno", e.errno)
"#;
    let result = exec_json(
        Some(&policy),
        &[],
        &[
            "/usr/bin/python3",
            "-c",
            script,
            &tcp_port.to_string(),
            &udp_port.to_string(),
        ],
    );
    // The sandbox's loopback is its own: the host's listener is not there (ECONNREFUSED), a
    // datagram lands in the sandbox's namespace, and raw sockets are refused (EPERM).
    assert_eq!(
        stdout_of(&result),
        "tcp errno 111\nudp sent\nraw errno 1\n",
        "{result}"
    );
    let mut buffer = [0u8; 64];
    assert!(
        udp.recv_from(&mut buffer).is_err(),
        "a datagram from inside reached the host"
    );
    // Nothing went through the proxy either.
    assert_eq!(result["network"]["connections"], 0, "{result}");
}

#[test]
fn ipv6_literals_are_matched_in_their_bracketed_form() {
    let _guard = airlock_tests::shared();
    if !clients_available() {
        return;
    }
    let Some(upstream) = Upstream::start("[::1]:0") else {
        eprintln!("SKIP: no IPv6 loopback on this host");
        return;
    };
    let port = upstream.port();
    let scratch = Scratch::new("egress-ipv6");
    let policy = egress_policy(
        &scratch,
        &format!(r#"{{ allow = ["[::1]:{port}"], allow_addresses = ["::1/128"] }}"#),
    );
    let result = sh(
        &policy,
        &format!(
            "curl -sS -g http://[::1]:{port}/six && curl -sS -g -p http://[::1]:{port}/tunnel"
        ),
    );
    let out = stdout_of(&result);
    assert!(out.contains("upstream saw GET /six"), "{out:?}\n{result}");
    assert!(
        out.contains("upstream saw GET /tunnel"),
        "{out:?}\n{result}"
    );
    assert_eq!(result["network"]["connections"], 2, "{result}");
    assert_eq!(result["network"]["refused"], 0, "{result}");
}

/// A server that accepts one connection, says so, then reads until the other side closes
/// and says that too.
fn held_upstream() -> (u16, mpsc::Receiver<&'static str>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tell, told) = mpsc::channel();
    thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        let _ = tell.send("accepted");
        let mut buffer = [0u8; 1024];
        while matches!(stream.read(&mut buffer), Ok(n) if n > 0) {}
        let _ = tell.send("closed");
    });
    (port, told)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_ends_with_its_call_and_every_connection_reaches_the_audit_log() {
    let _guard = airlock_tests::shared();
    use airlock::audit::AuditSink;
    use airlock::{CallOptions, CancelSignal, Gate, ToolCall};

    if !clients_available() {
        return;
    }
    let (port, told) = held_upstream();
    let profile = policy_text(&loopback_allowlist(port));
    // The tool opens a tunnel and keeps it open; a second request is refused by name.
    let text = format!(
        r#"{profile}
[tools.hold]
description = "Opens a tunnel and holds it"
command = ["/usr/bin/python3", "-c", "import socket, os, time\nos.system('curl -s -o /dev/null http://not-listed.example/')\ns = socket.create_connection(('127.0.0.1', {PROXY}))\ns.sendall(b'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\n\\r\\n')\ns.recv(1024)\ntime.sleep(600)"]
side_effect = "read"
input = {{ type = "object" }}
"#
    );
    let policy = airlock_policy::load_policy_str(&text, "egress.toml")
        .unwrap()
        .policy;
    let audit = AuditBuffer::default();
    let supervisor = Arc::new(airlock_tests::supervisor());
    let gate = Arc::new(
        Gate::new(Arc::clone(&supervisor), policy)
            .with_audit(AuditSink::to_writer(Box::new(audit.clone()))),
    );
    let cancel = CancelSignal::new();
    let options = CallOptions {
        cancel: Some(cancel.clone()),
        ..CallOptions::default()
    };
    let call = ToolCall {
        call_id: "hold-1".into(),
        tool: "hold".into(),
        arguments: "{}".into(),
    };
    let running = {
        let gate = Arc::clone(&gate);
        tokio::spawn(async move { gate.call(&call, &options).await })
    };
    // The tunnel is open: now the call ends, and the tunnel must end with it.
    let accepted = tokio::task::spawn_blocking(move || {
        let first = told.recv_timeout(HANG_GUARD);
        (first, told)
    })
    .await
    .unwrap();
    let (first, told) = accepted;
    assert_eq!(first, Ok("accepted"));
    cancel.cancel();
    let result = running.await.unwrap();
    assert_eq!(
        result.error.as_ref().map(|e| e.kind),
        Some(airlock::ErrorKind::Cancelled),
        "{result:?}"
    );
    let closed = tokio::task::spawn_blocking(move || told.recv_timeout(HANG_GUARD))
        .await
        .unwrap();
    assert_eq!(closed, Ok("closed"), "the tunnel outlived its call");
    let network = result.network.as_ref().expect("a network section");
    assert_eq!(
        (network.connections, network.refused),
        (2, 1),
        "{network:?}"
    );
    let lines = audit.text();
    let allowed = lines
        .lines()
        .find(|l| l.contains("\"network.allowed\""))
        .unwrap_or_else(|| panic!("no network.allowed in {lines}"));
    assert!(allowed.contains(&format!("\"port\":{port}")), "{allowed}");
    assert!(allowed.contains("\"call_id\":\"hold-1\""), "{allowed}");
    let denied = lines
        .lines()
        .find(|l| l.contains("\"network.denied\""))
        .unwrap_or_else(|| panic!("no network.denied in {lines}"));
    assert!(denied.contains("not-listed.example"), "{denied}");
    assert!(denied.contains("host-not-allowed"), "{denied}");
    supervisor.close().await;
}

/// An audit writer the test reads back.
#[derive(Clone, Default)]
struct AuditBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for AuditBuffer {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl AuditBuffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_workers_serve_egress_calls_each_through_its_own_listener() {
    let _guard = airlock_tests::shared();
    use airlock::SandboxRun;

    if !clients_available() {
        return;
    }
    let upstream = Upstream::start("127.0.0.1:0").unwrap();
    let port = upstream.port();
    let text = policy_text(&loopback_allowlist(port));
    let policy = airlock_policy::load_policy_str(&text, "pooled.toml")
        .unwrap()
        .policy;
    let profile = Arc::clone(&policy.profiles["default"]);
    let supervisor = Arc::new(airlock_tests::supervisor());
    supervisor.keep_warm(Arc::clone(&profile), 2);
    airlock_tests::wait_until_async("two workers are pooled", || {
        supervisor.pool_stats().idle >= 2
    })
    .await;
    for call in ["first", "second"] {
        let run = SandboxRun {
            call_id: call.into(),
            tool: "exec".into(),
            profile: Arc::clone(&profile),
            argv: vec![
                "/usr/bin/curl".into(),
                "-sS".into(),
                format!("http://127.0.0.1:{port}/{call}"),
            ],
            stdin: Vec::new(),
            arguments_json: "{}".into(),
            timeout: HANG_GUARD,
            inherit_stdio: None,
            builtin: None,
        };
        let result = supervisor.run(run, None).await;
        assert!(result.ok, "{result:?}");
        assert_eq!(
            result.stdout,
            format!("upstream saw GET /{call} HTTP/1.1\n")
        );
        let network = result.network.as_ref().unwrap();
        assert_eq!(
            (network.connections, network.refused),
            (1, 0),
            "{network:?}"
        );
    }
    assert!(
        supervisor.pool_stats().hits >= 2,
        "{:?}",
        supervisor.pool_stats()
    );
    supervisor.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_passing_the_wrong_descriptors_is_killed_as_a_protocol_violation() {
    let _guard = airlock_tests::shared();
    use airlock::SandboxRun;

    if !sandbox_available() {
        return;
    }
    let egress_text = policy_text(r#"{ allow = ["pypi.org"] }"#);
    let egress = airlock_policy::load_policy_str(&egress_text, "egress.toml")
        .unwrap()
        .policy;
    let plain = airlock_policy::load_policy_str(&policy_text("\"none\""), "plain.toml")
        .unwrap()
        .policy;
    let cases = [
        (&plain, "pass-pipe", "a descriptor nobody asked for"),
        (&plain, "pass-many", "more descriptors"),
        (&egress, "ready", "no egress listener"),
        (
            &egress,
            "pass-pipe",
            "not a TCP socket listening on 127.0.0.1",
        ),
    ];
    for (policy, mode, expected) in cases {
        let supervisor = airlock_tests::supervisor_with_hostile_worker(mode);
        let run = SandboxRun {
            call_id: mode.into(),
            tool: "exec".into(),
            profile: Arc::clone(&policy.profiles["default"]),
            argv: vec!["/bin/true".into()],
            stdin: Vec::new(),
            arguments_json: "{}".into(),
            timeout: HANG_GUARD,
            inherit_stdio: None,
            builtin: None,
        };
        let result = supervisor.run(run, None).await;
        let error = result.error.as_ref().expect("refused");
        assert_eq!(
            error.kind,
            airlock::ErrorKind::ProtocolViolation,
            "{mode}: {result:?}"
        );
        assert!(
            error.message.contains(expected),
            "{mode}: {}",
            error.message
        );
        supervisor.close().await;
    }
}

/// A supervisor that runs out of descriptors while a tool floods its proxy with
/// connections pauses accepting and accepts again once they close: the tool's next request
/// through the proxy is answered, never left queued for the rest of the call.
#[test]
fn a_proxy_out_of_descriptors_accepts_again_once_connections_close() {
    let _guard = airlock_tests::shared();
    if !clients_available() {
        return;
    }
    let upstream = Upstream::start("127.0.0.1:0").unwrap();
    let port = upstream.port();
    let scratch = Scratch::new("egress-emfile");
    let gate = scratch.0.join("go");
    let fifo = std::ffi::CString::new(gate.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path this test owns.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let text = test_policy(
        &[scratch.0.as_path()],
        &format!("timeout = {}", airlock_tests::hang_guard_toml()),
        "none",
    )
    .replace(
        "network = \"none\"",
        &format!("network = {}", loopback_allowlist(port)),
    );
    let policy = scratch.write("p.toml", &text);
    // The tool opens idle connections to the proxy until it has as many as the proxy holds
    // at once and more, waits for the test to see the proxy run out, closes them, and asks
    // through the proxy again.
    let script = format!(
        "import socket, subprocess, sys\n\
         held = [socket.create_connection(('127.0.0.1', {PROXY})) for _ in range(120)]\n\
         open({gate:?}).read()\n\
         for s in held: s.close()\n\
         sys.stdout.write(subprocess.run(['curl', '-sS', 'http://127.0.0.1:{port}/again'], \
         capture_output=True, text=True).stdout)\n"
    );
    // Room for the call (a one-shot call needs about fifty) and a few dozen of the proxy's
    // connections, fewer than it holds at once (64, and 16 being refused); the hard limit
    // leaves the worker its profile's.
    let mut command = std::process::Command::new(airlock_tests::airlock_bin());
    command
        .args(["exec", "--json", "--policy"])
        .arg(&policy)
        .args(["--", "/usr/bin/python3", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    airlock_tests::with_open_file_limit(&mut command, 100, 4096);
    let mut child = command.spawn().unwrap();
    // The supervisor's log says when the proxy found no descriptor for a connection: EMFILE,
    // whose text differs between glibc and musl builds while its number does not.
    let mut log = String::new();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            break;
        }
        log.push_str(&line);
        if line.contains("egress proxy") && line.contains("os error 24") {
            break;
        }
    }
    assert!(log.contains("os error 24"), "{log}");
    std::fs::write(&gate, "go").unwrap();
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let result: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{log}{rest}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(result["ok"], true, "{result}\n{log}{rest}");
    assert!(
        stdout_of(&result).contains("upstream saw GET /again HTTP/1.1"),
        "{result}\n{log}{rest}"
    );
    assert_eq!(
        upstream.requests(),
        ["GET /again HTTP/1.1 host=127.0.0.1:".to_string() + &port.to_string()]
    );
}
