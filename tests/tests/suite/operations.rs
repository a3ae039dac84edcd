//! Operating the daemon: Prometheus metrics after real calls, `airlock health` as a probe,
//! and the policy reloaded when its file changes (an edit, a ConfigMap-style `..data`
//! symlink swap), an invalid file refused with the old policy kept.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use airlock_tests::daemon::{DAEMON_POLICY, Daemon};
use airlock_tests::{HANG_GUARD, Scratch, airlock_bin, sandbox_available, wait_until};
use serde_json::{Value, json};

/// Sends each request on one connection and returns the answers, in order.
fn requests(socket: &Path, requests: &[Value]) -> Vec<Value> {
    let stream = UnixStream::connect(socket).unwrap();
    stream.set_read_timeout(Some(HANG_GUARD)).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    requests
        .iter()
        .map(|request| {
            writer.write_all(format!("{request}\n").as_bytes()).unwrap();
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            serde_json::from_str(&line).unwrap()
        })
        .collect()
}

fn health(socket: &Path) -> Value {
    let answer = requests(socket, &[json!({"id": 1, "op": "health"})]).remove(0);
    answer["result"].clone()
}

/// A TCP port free a moment ago on loopback, for `--metrics`.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP exchange with the metrics listener: the status line and the body.
fn http(port: u16, request: &str) -> (String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(HANG_GUARD)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of the sample `series` (name and labels exactly as exposed), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.trim().parse().unwrap())
}

fn scrape(port: u16) -> String {
    let (status, body) = http(port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    body
}

#[test]
fn metrics_count_calls_by_tool_and_outcome_after_a_few_calls() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let daemon = Daemon::start(&["--metrics", &addr]);
    let before = scrape(port);
    assert_eq!(
        sample(&before, r#"airlock_calls_total{tool="echo",outcome="ok"}"#),
        None
    );
    let hostile_tool = "no\"such}tool";
    let answers = requests(
        &daemon.socket,
        &[
            json!({"id": 1, "op": "call", "tool": "echo", "arguments": {"text": "one"}}),
            json!({"id": 2, "op": "call", "tool": "echo", "arguments": {"text": "two"}}),
            json!({"id": 3, "op": "call", "tool": "echo", "arguments": {}}),
            json!({"id": 4, "op": "call", "tool": hostile_tool, "arguments": {}}),
        ],
    );
    assert_eq!(answers[0]["result"]["ok"], true, "{answers:?}");
    assert_eq!(answers[1]["result"]["ok"], true, "{answers:?}");
    assert_eq!(answers[2]["result"]["error"]["kind"], "invalid_input");
    assert_eq!(answers[3]["result"]["error"]["kind"], "unknown_tool");

    let after = scrape(port);
    let value =
        |series: &str| sample(&after, series).unwrap_or_else(|| panic!("no {series} in\n{after}"));
    assert_eq!(
        value(r#"airlock_calls_total{tool="echo",outcome="ok"}"#),
        2.0
    );
    assert_eq!(
        value(r#"airlock_calls_total{tool="echo",outcome="invalid_input"}"#),
        1.0
    );
    // A tool name a client makes up is never a label value.
    assert_eq!(
        value(r#"airlock_calls_total{tool="(unknown)",outcome="unknown_tool"}"#),
        1.0
    );
    assert!(!after.contains("such"), "{after}");
    assert_eq!(value(r#"airlock_run_seconds_count{tool="echo"}"#), 2.0);
    assert_eq!(value("airlock_queue_seconds_count"), 2.0);
    // Both echo calls went through the pool's accounting, hit or miss.
    let pooled = value("airlock_pool_hits_total") + value("airlock_pool_misses_total");
    assert!(pooled >= 2.0, "{after}");
    // Each ran on a worker, pooled or made for it, and its wait for that worker was timed.
    let spawned = sample(&after, r#"airlock_spawn_seconds_count{pool="hit"}"#).unwrap_or(0.0)
        + sample(&after, r#"airlock_spawn_seconds_count{pool="miss"}"#).unwrap_or(0.0);
    assert_eq!(spawned, 2.0, "{after}");
    assert!(value("airlock_connections_total") >= 1.0);
    assert!(value("airlock_daemon_resident_bytes") > 0.0);
    assert!(
        after.contains("airlock_workers_alive{state=\"idle\"}"),
        "{after}"
    );
    assert!(after.contains("airlock_pool_idle_target "), "{after}");

    // Only GET /metrics is answered; an oversized request head is refused, not buffered.
    assert_eq!(
        http(port, "GET / HTTP/1.1\r\n\r\n").0,
        "HTTP/1.1 404 Not Found"
    );
    assert_eq!(
        http(port, "POST /metrics HTTP/1.1\r\n\r\n").0,
        "HTTP/1.1 405 Method Not Allowed"
    );
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(64 << 10)
    );
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(HANG_GUARD)).unwrap();
    // The daemon may close before taking it all: only its answer matters.
    let _ = stream.write_all(huge.as_bytes());
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer}"
    );
    // The daemon still serves.
    assert_eq!(health(&daemon.socket)["ok"], true);
}

/// Runs `airlock serve` expecting it to refuse to start; its output.
fn serve_refused(extra: &[&str]) -> Output {
    let scratch = Scratch::trusted("ops-refused");
    let policy = scratch.write("policy.toml", DAEMON_POLICY);
    let socket = scratch.0.join("airlock.sock");
    let out = Command::new(airlock_bin())
        .args(["serve", "--policy"])
        .arg(&policy)
        .arg("--socket")
        .arg(&socket)
        .args(extra)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!socket.exists());
    out
}

#[test]
fn metrics_on_a_non_loopback_address_need_the_explicit_flag() {
    let _guard = airlock_tests::shared();
    let out = serve_refused(&["--metrics", "0.0.0.0:0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--metrics-allow-remote"), "{stderr}");
    let out = serve_refused(&["--metrics", "localhost:9464"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--metrics"), "{stderr}");
}

/// `airlock health`, given the hang guard to wait for an answer: a daemon busy warming its
/// pools on a slow machine answers late, not never.
fn airlock_health(socket: &Path, extra: &[&str]) -> Output {
    let timeout = format!("{}s", airlock_tests::HANG_GUARD.as_secs());
    Command::new(airlock_bin())
        .args(["health", "--timeout", &timeout, "--socket"])
        .arg(socket)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn health_exits_0_once_ready_and_1_with_a_reason_when_nothing_answers() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = Daemon::start(&[]);
    // Live as soon as it answers, whatever its pools.
    let live = airlock_health(&daemon.socket, &["--live"]);
    assert!(live.status.success(), "{live:?}");
    // Ready once its pools have been warm: an event of the daemon's, waited for.
    wait_until("airlock health says ready", || {
        let out = airlock_health(&daemon.socket, &[]);
        match out.status.code() {
            Some(0) => true,
            Some(1) => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(stderr.contains("not ready: pools warming"), "{stderr}");
                false
            }
            other => panic!("airlock health exited {other:?}: {out:?}"),
        }
    });
    let answer = health(&daemon.socket);
    assert_eq!(answer["ready"], true);
    assert_eq!(answer["not_ready"], Value::Null);

    let missing = daemon.socket.with_file_name("missing.sock");
    for extra in [&[][..], &["--live"][..]] {
        let out = airlock_health(&missing, extra);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("cannot connect"), "{stderr}");
    }
}

/// [`DAEMON_POLICY`] with `echo`'s description changed to `description`.
fn policy_describing_echo(description: &str) -> String {
    let policy = DAEMON_POLICY.replace(
        "description = \"echo a text\"",
        &format!("description = \"{description}\""),
    );
    assert_ne!(policy, DAEMON_POLICY);
    policy
}

fn version_of(text: &str) -> String {
    airlock_policy::compile::sha256_hex(text.as_bytes())
}

/// Waits until the daemon serves the policy `text` (its `health` names its digest).
fn wait_for_policy(daemon: &Daemon, text: &str) {
    let wanted = version_of(text);
    wait_until("the daemon serves the changed policy", || {
        health(&daemon.socket)["policy_version"] == wanted.as_str()
    });
    let tools = requests(&daemon.socket, &[json!({"id": 1, "op": "tools"})]).remove(0);
    let echo = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "echo")
        .cloned()
        .unwrap();
    assert!(text.contains(echo["description"].as_str().unwrap()));
}

/// Writes `text` over the policy file and waits until the daemon refuses it, keeping `kept`.
fn refused_in_place(daemon: &Daemon, write: impl FnOnce(), kept: &str) {
    let refusals = daemon.logged("policy reload refused");
    write();
    wait_until("the daemon refuses the invalid policy", || {
        daemon.logged("policy reload refused") > refusals
    });
    assert_eq!(
        health(&daemon.socket)["policy_version"],
        version_of(kept).as_str()
    );
}

#[test]
fn the_policy_reloads_when_its_file_changes_and_an_invalid_one_is_refused() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = Daemon::start(&["--pool", "0"]);
    assert_eq!(
        health(&daemon.socket)["policy_version"],
        version_of(DAEMON_POLICY).as_str()
    );
    // Written in place, as an editor that truncates and writes does.
    let changed = policy_describing_echo("echo, edited in place");
    std::fs::write(&daemon.policy, &changed).unwrap();
    wait_for_policy(&daemon, &changed);
    // Renamed over it, as most editors save.
    let renamed = policy_describing_echo("echo, renamed over");
    let staged = daemon.policy.with_file_name("policy.toml.new");
    std::fs::write(&staged, &renamed).unwrap();
    std::fs::rename(&staged, &daemon.policy).unwrap();
    wait_for_policy(&daemon, &renamed);
    refused_in_place(
        &daemon,
        || std::fs::write(&daemon.policy, "version = 1\n[tools.broken]\n").unwrap(),
        &renamed,
    );
    // The old policy still serves calls.
    let answer = requests(
        &daemon.socket,
        &[json!({"id": 1, "op": "call", "tool": "echo", "arguments": {"text": "still"}})],
    );
    assert_eq!(answer[0]["result"]["ok"], true, "{answer:?}");
    // And a valid file after the invalid one is taken again.
    std::fs::write(&daemon.policy, &changed).unwrap();
    wait_for_policy(&daemon, &changed);
}

/// A Kubernetes ConfigMap volume: `dir/policy.toml -> ..data/policy.toml`, `..data ->
/// ..<version>`; an update writes a new version directory and renames a new `..data`
/// symlink over the old one.
struct ConfigMap {
    dir: PathBuf,
    versions: u32,
}

impl ConfigMap {
    fn new(dir: &Path, text: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let mut map = Self {
            dir: dir.to_path_buf(),
            versions: 0,
        };
        map.publish(text);
        std::os::unix::fs::symlink("..data/policy.toml", dir.join("policy.toml")).unwrap();
        map
    }

    fn publish(&mut self, text: &str) {
        self.versions += 1;
        let version = format!("..2026_01_01_00_00_0{}", self.versions);
        std::fs::create_dir(self.dir.join(&version)).unwrap();
        std::fs::write(self.dir.join(&version).join("policy.toml"), text).unwrap();
        let staged = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &staged).unwrap();
        std::fs::rename(&staged, self.dir.join("..data")).unwrap();
    }
}

#[test]
fn a_configmap_style_symlink_swap_reloads_the_policy() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::trusted("ops-configmap");
    let mut map = ConfigMap::new(&scratch.0.join("config"), DAEMON_POLICY);
    let policy = map.dir.join("policy.toml");
    let daemon = Daemon::start_from(scratch, policy, &["--pool", "0"]);
    let swapped = policy_describing_echo("echo, from a new ConfigMap");
    map.publish(&swapped);
    wait_for_policy(&daemon, &swapped);
    refused_in_place(&daemon, || map.publish("not a policy ="), &swapped);
    let again = policy_describing_echo("echo, fixed ConfigMap");
    map.publish(&again);
    wait_for_policy(&daemon, &again);
}

#[test]
fn serve_as_root_refuses_a_policy_in_a_directory_others_may_write_and_starts_from_root_s_own() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: only a daemon run as root refuses the policy; others warn");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let scratch = Scratch::trusted("ops-open-dir");
    let policy = scratch.write("policy.toml", DAEMON_POLICY);
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = scratch.0.join("airlock.sock");
    let mut child = Command::new(airlock_bin())
        .args(["serve", "--policy"])
        .arg(&policy)
        .arg("--socket")
        .arg(&socket)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A daemon that takes the policy creates its socket; one that refuses it exits.
    let mut exited = None;
    wait_until("the daemon exits or serves", || {
        exited = child.try_wait().unwrap();
        exited.is_some() || socket.exists()
    });
    if exited.is_none() {
        child.kill().unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        exited.is_some_and(|status| !status.success()),
        "served a policy others may change: {stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{} is writable by its group and everyone",
            scratch.0.display()
        )),
        "{stderr}"
    );
    assert!(!socket.exists());
    // The same file in a directory only root may write is served.
    std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let daemon = Daemon::start_from(scratch, policy, &["--pool", "0"]);
    assert_eq!(
        health(&daemon.socket)["policy_version"],
        version_of(DAEMON_POLICY).as_str()
    );
}
