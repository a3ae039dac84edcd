//! Network modes seen from inside: none (no socket but AF_UNIX), loopback (a private
//! loopback, never the host's), and the host network narrowed to TCP ports by Landlock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::path::Path;

use airlock_tests::{Scratch, exec_json, sandbox_available, stdout_of, test_policy};

const CONNECT: &str = "import socket, sys\nfor port in sys.argv[1:]:\n    try:\n        socket.create_connection(('127.0.0.1', int(port)), timeout=2).close()\n        print(port, 'connected')\n    except OSError as e:\n        print(port, 'errno', e.errno)\n";

fn python_available() -> bool {
    Path::new("/usr/bin/python3").exists()
}

#[test]
fn loopback_mode_has_its_own_loopback_and_cannot_reach_the_hosts() {
    if !sandbox_available() || !python_available() {
        return;
    }
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port().to_string();
    let scratch = Scratch::new("net-loopback");
    let policy = scratch.write("p.toml", &test_policy(&[], "timeout = \"10s\"", "loopback"));
    let result = exec_json(
        Some(&policy),
        &[],
        &["/usr/bin/python3", "-c", CONNECT, &port],
    );
    // ECONNREFUSED (111): the sandbox's loopback is up but empty; the host listener is elsewhere.
    assert_eq!(
        stdout_of(&result),
        format!("{port} errno 111\n"),
        "{result}"
    );
}

#[test]
fn host_network_is_narrowed_to_the_allowed_tcp_ports() {
    if !sandbox_available() || !python_available() {
        return;
    }
    let allowed = TcpListener::bind("127.0.0.1:0").unwrap();
    let denied = TcpListener::bind("127.0.0.1:0").unwrap();
    let (a, d) = (
        allowed.local_addr().unwrap().port(),
        denied.local_addr().unwrap().port(),
    );
    let scratch = Scratch::new("net-host");
    let base = test_policy(&[], "timeout = \"10s\"", "none");
    let policy_text = base.replace(
        "network = \"none\"",
        &format!("network = {{ connect = [\"tcp:{a}\"] }}"),
    );
    let policy = scratch.write("p.toml", &policy_text);
    let result = exec_json(
        Some(&policy),
        &[],
        &[
            "/usr/bin/python3",
            "-c",
            CONNECT,
            &a.to_string(),
            &d.to_string(),
        ],
    );
    if result["error"]["kind"] == "sandbox_unavailable" {
        // Kernels without Landlock ABI 4 (TCP rules) or 6 (abstract-socket scoping) cannot
        // enforce this profile: it must fail closed there, never run unfiltered.
        assert!(
            result["error"]["message"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains("landlock"),
            "{result}"
        );
        return;
    }
    // EACCES (13) from Landlock for the port not on the list.
    assert_eq!(
        stdout_of(&result),
        format!("{a} connected\n{d} errno 13\n"),
        "{result}"
    );
    assert!(
        !result["isolation"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == "net")
    );
}
