//! A daemon under a tight open-file limit: what one call, or a reloaded policy, can take
//! from the descriptors every other call needs. Calls may wait for descriptors; none may
//! fail for want of one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};

use airlock_tests::daemon::{DAEMON_POLICY, Daemon, ask};
use airlock_tests::{sandbox_available, wait_until};

const PROXY: u16 = airlock_policy::compile::EGRESS_PORT;

/// A server on this host's loopback that accepts every connection and holds it until the
/// other side closes; the count of those accepted so far.
fn holding_upstream() -> (u16, Arc<Mutex<usize>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(Mutex::new(0));
    let counted = Arc::clone(&accepted);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            *counted.lock().unwrap() += 1;
            std::thread::spawn(move || {
                let mut buffer = [0u8; 256];
                while matches!(stream.read(&mut buffer), Ok(n) if n > 0) {}
            });
        }
    });
    (port, accepted)
}

/// The daemon tests' policy plus `hog`: a tool whose profile may reach `port` on the
/// host's loopback and which opens as many tunnels through the proxy as it holds at once
/// (64), holds them a second, and fails unless every one was established.
fn hog_policy(port: u16) -> String {
    let script = format!(
        "import socket, sys, time\n\
         held = []\n\
         for i in range(64):\n\
         \x20   s = socket.create_connection(('127.0.0.1', {PROXY}))\n\
         \x20   s.sendall(b'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\n\\r\\n')\n\
         \x20   head = s.recv(1024)\n\
         \x20   if not head.startswith(b'HTTP/1.1 200'):\n\
         \x20       sys.stdout.write('tunnel %d: %r' % (i, head[:80]))\n\
         \x20       sys.exit(3)\n\
         \x20   held.append(s)\n\
         time.sleep(1)\n\
         sys.stdout.write('held %d' % len(held))\n"
    );
    let script = serde_json::to_string(&script).unwrap();
    format!(
        "{DAEMON_POLICY}\n\
         [profiles.out]\n\
         read = [\"/usr\"]\n\
         read_optional = [\"/bin\", \"/lib\", \"/lib64\", \"/etc/ld.so.cache\", \"/etc/alternatives\"]\n\
         tmpfs = {{ \"/tmp\" = \"16MiB\" }}\n\
         network = {{ allow = [\"127.0.0.1:{port}\"], allow_addresses = [\"127.0.0.1/32\"] }}\n\
         limits = {{ timeout = {guard}, open_files = 256 }}\n\n\
         [tools.hog]\n\
         description = \"holds the most tunnels a call may\"\n\
         command = [\"/usr/bin/python3\", \"-c\", {script}]\n\
         side_effect = \"read\"\n\
         concurrency_safe = true\n\
         profile = \"out\"\n\
         input = {{ type = \"object\" }}\n",
        guard = airlock_tests::hang_guard_toml(),
    )
}

/// Starts every request on its own connection and returns the answers in order.
fn all_at_once(socket: &Path, requests: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    let clients: Vec<_> = requests
        .into_iter()
        .map(|request| {
            let socket = socket.to_path_buf();
            std::thread::spawn(move || ask(&socket, request))
        })
        .collect();
    clients.into_iter().map(|c| c.join().unwrap()).collect()
}

fn failures(answers: &[serde_json::Value]) -> Vec<String> {
    answers
        .iter()
        .filter(|a| a["result"]["ok"] != true)
        .map(|a| {
            format!(
                "{} {}",
                a["result"]["error"]["kind"], a["result"]["error"]["message"]
            )
        })
        .collect()
}

/// A call whose tool holds every tunnel its proxy allows holds well over a hundred
/// descriptors in the daemon. Under a limit that leaves room for a dozen ordinary calls,
/// such calls and ordinary ones sent together all succeed: the daemon counts what each
/// call may hold and runs no more at once than its descriptors allow.
#[test]
fn calls_that_tunnel_out_wait_for_descriptors_instead_of_failing_others() {
    let _guard = airlock_tests::exclusive();
    if !sandbox_available() {
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        assert!(
            std::env::var_os("AIRLOCK_MUST_WORK").is_none(),
            "python3 is needed"
        );
        return;
    }
    let (port, accepted) = holding_upstream();
    let flags = [
        "--pool",
        "0",
        "--max-concurrent",
        "64",
        "--max-connections",
        "64",
    ];
    let daemon = Daemon::start_with_policy_and_open_files(&hog_policy(port), &flags, 512, 512);
    let mut requests: Vec<_> = (1..=4)
        .map(|i| serde_json::json!({"id": i, "op": "call", "tool": "hog", "arguments": {}}))
        .collect();
    requests.extend((5..=20).map(|i| {
        serde_json::json!({"id": i, "op": "call", "tool": "sleep",
            "arguments": {"seconds": "0.3"}})
    }));
    let answers = all_at_once(&daemon.socket, requests);
    let failed = failures(&answers);
    assert!(failed.is_empty(), "{} failed: {failed:#?}", failed.len());
    for answer in &answers[..4] {
        assert_eq!(answer["result"]["stdout"], "held 64", "{answer}");
    }
    assert_eq!(*accepted.lock().unwrap(), 4 * 64);
}

/// A reload that pools many more profiles makes the daemon keep many more idle workers,
/// each holding descriptors: the calls sent after it all succeed under a limit that had
/// room for a dozen calls beside the first policy's pool.
#[test]
fn a_reload_that_pools_more_profiles_leaves_calls_their_descriptors() {
    let _guard = airlock_tests::exclusive();
    if !sandbox_available() {
        return;
    }
    let flags = [
        "--pool",
        "4",
        "--max-concurrent",
        "64",
        "--max-connections",
        "64",
    ];
    let daemon = Daemon::start_with_policy_and_open_files(DAEMON_POLICY, &flags, 1024, 1024);
    let stats =
        || ask(&daemon.socket, serde_json::json!({"id": 0, "op": "stats"}))["result"].clone();
    wait_until("the pool is warm", || {
        let pool = &stats()["pool"];
        pool["idle"].as_u64() >= pool["idle_target"].as_u64()
    });
    // Twelve more profiles, each with a tool: each gets a pool of its own.
    let mut policy = DAEMON_POLICY.to_string();
    for i in 0..12 {
        policy.push_str(&format!(
            "\n[profiles.p{i}]\nread = [\"/usr\"]\n\
             read_optional = [\"/bin\", \"/lib\", \"/lib64\", \"/etc/ld.so.cache\"]\n\
             env = {{ N = \"{i}\" }}\n\
             limits = {{ timeout = \"300s\" }}\n\n\
             [tools.t{i}]\ndescription = \"sleeps\"\ncommand = [\"/bin/sleep\", \"{{seconds}}\"]\n\
             side_effect = \"read\"\nconcurrency_safe = true\nprofile = \"p{i}\"\n\
             input = {{ type = \"object\", properties = {{ seconds = {{ type = \"string\", pattern = \"^[0-9.]+$\" }} }}, required = [\"seconds\"] }}\n"
        ));
    }
    std::fs::write(&daemon.policy, &policy).unwrap();
    daemon.signal(libc::SIGHUP);
    wait_until("every new profile's pool is warm", || {
        let stats = stats();
        stats["warm_pools"] == 13
            && stats["pool"]["idle"].as_u64() >= stats["pool"]["idle_target"].as_u64()
    });
    let requests = (1..=48)
        .map(|i| {
            serde_json::json!({"id": i, "op": "call", "tool": format!("t{}", i % 12),
                "arguments": {"seconds": "0.3"}})
        })
        .collect();
    let answers = all_at_once(&daemon.socket, requests);
    let failed = failures(&answers);
    assert!(failed.is_empty(), "{} failed: {failed:#?}", failed.len());
}
