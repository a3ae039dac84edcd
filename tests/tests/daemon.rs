//! The daemon driven by real clients: a Python gateway (standard library only) and the Rust
//! bincode client — concurrency, out-of-order answers, cancel, disconnects, malformed
//! requests, reloads, refused peers, overload and a clean SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use airlock_tests::{Scratch, airlock_bin, host_processes_with, sandbox_available};

const POLICY: &str = r#"version = 1
[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = { "/tmp" = "16MiB" }
limits = { timeout = "60s" }

[tools.echo]
description = "echo a text"
command = ["/bin/echo", "{text}"]
side_effect = "read"
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }

[tools.sleep]
description = "sleep a while"
command = ["/bin/sleep", "{seconds}"]
side_effect = "read"
input = { type = "object", properties = { seconds = { type = "string", pattern = "^[0-9.]+$" } }, required = ["seconds"] }

[tools.guarded]
description = "needs a human"
command = ["/bin/echo", "{text}"]
side_effect = "write"
approval = "human"
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }
"#;

struct Daemon {
    child: Child,
    socket: PathBuf,
    policy: PathBuf,
    _scratch: Scratch,
}

impl Daemon {
    fn start(extra: &[&str]) -> Self {
        let scratch = Scratch::new("daemon");
        let policy = scratch.write("policy.toml", POLICY);
        let socket = scratch.0.join("airlock.sock");
        let child = Command::new(airlock_bin())
            .args(["serve", "--policy"])
            .arg(&policy)
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "daemon did not create its socket"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child,
            socket,
            policy,
            _scratch: scratch,
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn python(socket: &Path, scenario: &str, extra: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/daemon_client.py");
    let out = Command::new("/usr/bin/python3")
        .arg(script)
        .arg(socket)
        .arg(scenario)
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "python {scenario}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn a_python_gateway_calls_concurrently_cancels_and_survives_bad_requests() {
    if !sandbox_available() {
        return;
    }
    let daemon = Daemon::start(&[]);
    assert_eq!(python(&daemon.socket, "basic", &[]).trim(), "ok");
    let mode = std::fs::metadata(&daemon.socket).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);
}

#[test]
fn a_client_that_disconnects_mid_call_leaves_no_worker() {
    if !sandbox_available() {
        return;
    }
    let daemon = Daemon::start(&[]);
    let marker = format!("6{}.25", std::process::id());
    python(&daemon.socket, "disconnect", &[&marker]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !host_processes_with(&format!("sleep {marker}")).is_empty() {
        assert!(Instant::now() < deadline, "the call outlived its client");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sighup_reloads_a_valid_policy_and_keeps_the_old_one_when_invalid() {
    if !sandbox_available() {
        return;
    }
    let daemon = Daemon::start(&[]);
    assert_eq!(
        python(&daemon.socket, "tools", &[]).trim(),
        "echo guarded sleep"
    );
    let extended = format!(
        "{POLICY}\n[tools.extra]\ndescription = \"new\"\ncommand = [\"/bin/true\"]\ninput = {{ type = \"object\" }}\n"
    );
    std::fs::write(&daemon.policy, extended).unwrap();
    daemon.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        python(&daemon.socket, "tools", &[]).trim(),
        "echo extra guarded sleep"
    );
    std::fs::write(&daemon.policy, "version = 1\n[tools.broken]\n").unwrap();
    daemon.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        python(&daemon.socket, "tools", &[]).trim(),
        "echo extra guarded sleep"
    );
}

/// One JSON-lines request to the daemon on `socket`, and its answer.
fn ask(socket: &Path, request: serde_json::Value) -> serde_json::Value {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

/// The daemon's children that are idle pooled workers (argv[0] `airlock-worker`).
fn pooled_workers(daemon: &Daemon) -> Vec<u32> {
    let mut found = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{}/task", daemon.child.id())).unwrap();
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in children.split_whitespace().filter_map(|p| p.parse().ok()) {
            if std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"airlock-worker\0"))
            {
                found.push(pid);
            }
        }
    }
    found
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sighup_with_a_changed_profile_kills_its_idle_workers_and_warms_the_new_one() {
    if !sandbox_available() {
        return;
    }
    let daemon = Daemon::start(&["--pool", "1"]);
    let stats = || {
        ask(
            &daemon.socket,
            serde_json::json!({"id": "s", "op": "stats"}),
        )["result"]
            .clone()
    };
    wait_until("the pool is warm", || stats()["pool"]["idle"] == 1);
    let old_workers = pooled_workers(&daemon);
    assert_eq!(old_workers.len(), 1, "{old_workers:?}");

    // The same tools on a changed profile: a worker made for the old one can never serve
    // them (pools are by content), so it must not idle on for nothing.
    std::fs::write(&daemon.policy, POLICY.replace("16MiB", "32MiB")).unwrap();
    daemon.signal(libc::SIGHUP);
    wait_until("the old profile's idle worker is gone", || {
        !std::path::Path::new(&format!("/proc/{}", old_workers[0])).exists()
    });
    wait_until("the new profile's pool is warm", || {
        let workers = pooled_workers(&daemon);
        workers.len() == 1 && stats()["pool"]["idle"] == 1
    });
    let answer = ask(
        &daemon.socket,
        serde_json::json!({"id": "c", "op": "call", "tool": "echo", "arguments": {"text": "hi"}}),
    );
    assert_eq!(answer["result"]["stdout"], "hi\n", "{answer}");
    let after = stats();
    assert_eq!(after["warm_pools"], 1, "{after}");
    assert_eq!(
        (
            after["pool"]["hits"].as_u64(),
            after["pool"]["misses"].as_u64()
        ),
        (Some(1), Some(0)),
        "the call after the reload was not served by the new pool: {after}"
    );
}

#[test]
fn serve_refuses_a_pool_maximum_below_its_minimum_or_beyond_the_limit() {
    let cases: [(&[&str], &str); 3] = [
        (
            &["--pool", "4", "--pool-max", "2"],
            "maximum (2) is below its minimum (4)",
        ),
        (
            &["--pool", "1", "--pool-max", "5000"],
            "at most 1024 idle workers",
        ),
        (&["--pool", "5000"], "at most 1024 idle workers"),
    ];
    for (flags, expected) in cases {
        let out = Command::new(airlock_bin())
            .args([
                "serve",
                "--policy",
                "/nonexistent.toml",
                "--socket",
                "/nonexistent.sock",
            ])
            .args(flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{stderr}");
        assert!(
            stderr.contains("--pool/--pool-max") && stderr.contains(expected),
            "{stderr}"
        );
    }
}

#[test]
fn a_peer_with_a_foreign_uid_is_refused() {
    if !sandbox_available() {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: needs root to connect as another uid");
        return;
    }
    let daemon = Daemon::start(&[]);
    // Let the other uid reach the socket at all, so the peer check is what refuses it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&daemon.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::set_permissions(
        daemon.socket.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/daemon_client.py");
    let out = Command::new("/usr/bin/python3")
        .arg(script)
        .arg(&daemon.socket)
        .arg("refused")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

use std::os::unix::process::CommandExt;

#[test]
fn beyond_the_queue_calls_are_overloaded() {
    if !sandbox_available() {
        return;
    }
    let daemon = Daemon::start(&["--max-concurrent", "1", "--max-queued", "0"]);
    assert_eq!(python(&daemon.socket, "overload", &[]).trim(), "ok");
}

#[test]
fn calls_read_in_one_burst_are_admitted_in_order() {
    if !sandbox_available() {
        return;
    }
    // Two requests in one write: the first takes the only slot, the second is refused
    // (before, both were admitted and raced for the slot in their own tasks).
    let daemon = Daemon::start(&["--max-concurrent", "1", "--max-queued", "0"]);
    assert_eq!(
        python(&daemon.socket, "overload_together", &[]).trim(),
        "ok"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_calls_over_bincode_frames() {
    if !sandbox_available() {
        return;
    }
    let daemon = Daemon::start(&[]);
    let mut client = airlock::daemon::DaemonClient::connect(&daemon.socket)
        .await
        .unwrap();
    let result = client
        .call("echo", r#"{"text": "from rust"}"#)
        .await
        .unwrap();
    assert_eq!(result.0["stdout"], "from rust\n", "{:?}", result.0);
    let health = client.request(&airlock::daemon::Op::Health).await.unwrap();
    assert_eq!(health["result"]["ok"], true);
}

#[test]
fn sigterm_removes_the_socket_and_leaves_no_worker_or_cgroup() {
    if !sandbox_available() {
        return;
    }
    let mut daemon = Daemon::start(&["--grace", "200ms"]);
    let marker = format!("7{}.25", std::process::id());
    let socket = daemon.socket.clone();
    let client = std::thread::spawn(move || {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/daemon_client.py");
        // The call is still running when SIGTERM arrives; the client may see EOF.
        let _ = Command::new("/usr/bin/python3")
            .arg(script)
            .arg(&socket)
            .arg("disconnect")
            .arg(&marker)
            .output();
    });
    std::thread::sleep(Duration::from_millis(300));
    daemon.signal(libc::SIGTERM);
    let status = daemon.child.wait().unwrap();
    assert!(status.success(), "{status}");
    client.join().unwrap();
    assert!(!daemon.socket.exists());
    let pid = daemon.child.id();
    for root in ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"] {
        if let Ok(entries) = std::fs::read_dir(root) {
            for entry in entries.flatten() {
                assert!(
                    !entry
                        .file_name()
                        .to_string_lossy()
                        .starts_with(&format!("airlock-{pid}-"))
                );
            }
        }
    }
}
