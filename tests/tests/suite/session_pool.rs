//! Sessions' pooled workers: a call in a session takes a worker pre-confined with that
//! session's workspace, and such a worker never serves another session or a sessionless
//! call; a session that closes or expires has its kept worker killed, never reused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use airlock::gate::Clock;
use airlock_tests::daemon::Daemon;
use airlock_tests::{Scratch, sandbox_available, wait_until};
use serde_json::{Value, json};

/// `sh` runs a script in the session's workspace; `plain` is the same sandbox without one.
const POLICY: &str = r#"version = 1
[sessions]
max_sessions = 4

[profiles.work]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = { "/tmp" = "16MiB" }
# airlock_tests::HANG_GUARD
limits = { timeout = "300s" }
workspace = "/workspace"
workspace_size = "1MiB"
cwd = "/workspace"

[profiles.plain]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = { "/tmp" = "16MiB" }
limits = { timeout = "300s" }

[tools.sh]
description = "run a script in the workspace"
profile = "work"
command = ["/bin/sh", "-c", "{script}"]
side_effect = "write"
concurrency_safe = true
input = { type = "object", properties = { script = { type = "string" } }, required = ["script"] }

[tools.plain]
description = "run a script without a workspace"
profile = "plain"
command = ["/bin/sh", "-c", "{script}"]
side_effect = "read"
concurrency_safe = true
input = { type = "object", properties = { script = { type = "string" } }, required = ["script"] }
"#;

struct Client {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Client {
    fn connect(socket: &Path) -> Self {
        let stream = UnixStream::connect(socket).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Self { stream, reader }
    }

    fn ask(&mut self, request: Value) -> Value {
        self.stream
            .write_all(format!("{request}\n").as_bytes())
            .unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    fn open(&mut self) -> String {
        let answer = self.ask(json!({"id": 1, "op": "session_open"}));
        answer["result"]["session"]
            .as_str()
            .unwrap_or_else(|| panic!("{answer}"))
            .to_string()
    }

    fn sh(&mut self, session: &str, script: &str) -> Value {
        let answer = self.ask(
            json!({"id": 2, "op": "call", "tool": "sh", "session": session,
            "arguments": {"script": script}}),
        );
        answer["result"].clone()
    }

    fn pool(&mut self) -> Value {
        self.ask(json!({"id": 3, "op": "stats"}))["result"]["pool"].clone()
    }

    fn hits(&mut self) -> u64 {
        self.pool()["hits"].as_u64().unwrap()
    }

    fn idle(&mut self) -> u64 {
        self.pool()["idle"].as_u64().unwrap()
    }
}

fn stdout(result: &Value) -> &str {
    result["stdout"].as_str().unwrap_or("")
}

/// The daemon's children that are workers (argv[0] `airlock-worker`).
fn workers_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children.split_whitespace() {
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            if cmdline.starts_with(b"airlock-worker\0") {
                out.push(child.parse().unwrap());
            }
        }
    }
    out
}

/// A process that is gone or a zombie (killed, not yet reaped).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn a_session_call_reuses_a_pooled_worker_of_its_own_session() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = Daemon::start_with(POLICY, &["--pool", "1"]);
    let mut client = Client::connect(&daemon.socket);
    wait_until("the plain profile's pool is warm", || client.idle() >= 1);
    let s = client.open();
    let first = client.sh(&s, "echo one > note");
    assert_eq!(first["ok"], true, "{first}");
    // The session's first call ran cold; after it, a worker of its own is made.
    wait_until("the session's worker is ready", || client.idle() >= 2);
    let before = client.hits();
    let second = client.sh(&s, "cat note; ls -A /workspace");
    assert_eq!(stdout(&second), "one\nnote\n", "{second}");
    assert_eq!(client.hits(), before + 1, "the call took the pooled worker");
    // And it is replaced for the next call.
    wait_until("the session's worker is replaced", || client.idle() >= 2);
    let third = client.sh(&s, "echo two >> note; cat note");
    assert_eq!(stdout(&third), "one\ntwo\n", "{third}");
    assert_eq!(client.hits(), before + 2);
}

#[test]
fn two_sessions_calling_at_once_on_pooled_workers_see_only_their_own_files() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // No pool for the plain profile until a plain call misses: every idle worker counted
    // while the sessions run is one of theirs.
    let daemon = Daemon::start_with(POLICY, &["--pool", "0", "--pool-max", "4"]);
    let mut client = Client::connect(&daemon.socket);
    let sessions: Vec<String> = (0..2).map(|_| client.open()).collect();
    for (i, s) in sessions.iter().enumerate() {
        let wrote = client.sh(s, &format!("echo secret-{i} > mine-{i}"));
        assert_eq!(wrote["ok"], true, "{wrote}");
    }
    let before = client.hits();
    const ROUNDS: u64 = 6;
    let threads: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (socket, s) = (daemon.socket.clone(), s.clone());
            std::thread::spawn(move || {
                let mut client = Client::connect(&socket);
                let mut seen = Vec::new();
                for _ in 0..ROUNDS {
                    // Both sessions' workers ready: this session's call takes its own, and
                    // the two sessions' calls overlap.
                    wait_until("the sessions' workers are ready", || client.idle() == 2);
                    let listed = client.sh(&s, &format!("ls -A /workspace; cat mine-{i}"));
                    seen.push(stdout(&listed).to_string());
                }
                seen
            })
        })
        .collect();
    for (i, thread) in threads.into_iter().enumerate() {
        for listed in thread.join().unwrap() {
            assert_eq!(listed, format!("mine-{i}\nsecret-{i}\n"), "session {i}");
        }
    }
    assert_eq!(
        client.hits() - before,
        2 * ROUNDS,
        "every session call took its session's pooled worker"
    );
    // A sessionless call with both sessions' workers idle takes neither: it runs cold and
    // has no workspace.
    wait_until("the sessions' workers are ready", || client.idle() == 2);
    let before = client.hits();
    let bare = client.ask(json!({"id": 9, "op": "call", "tool": "plain",
        "arguments": {"script": "ls -A /workspace 2>/dev/null; echo ran"}}));
    assert_eq!(stdout(&bare["result"]), "ran\n", "{bare}");
    assert_eq!(client.hits(), before);
}

#[test]
fn a_worker_kept_for_a_closed_session_is_killed_and_never_reused() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // No pool for the plain profile: every worker the daemon holds is a session's.
    let daemon = Daemon::start_with(POLICY, &["--pool", "0", "--pool-max", "4"]);
    let pid = daemon.child.id();
    let mut client = Client::connect(&daemon.socket);
    let a = client.open();
    assert_eq!(client.sh(&a, "echo a > only-a")["ok"], true);
    wait_until("session a's worker is ready", || client.idle() == 1);
    let kept = workers_of(pid);
    assert_eq!(kept.len(), 1, "{kept:?}");
    let closed = client.ask(json!({"id": 4, "op": "session_close", "session": a}));
    assert_eq!(closed["result"]["closed"], true, "{closed}");
    // Out of the pool as the close answers, and killed.
    assert_eq!(client.idle(), 0);
    wait_until("the closed session's worker is dead", || dead(kept[0]));
    let b = client.open();
    let before = client.hits();
    let in_b = client.sh(&b, "ls -A /workspace");
    assert_eq!(stdout(&in_b), "", "{in_b}");
    assert_eq!(
        client.hits(),
        before,
        "b's first call is cold, on no worker of a's"
    );
}

#[test]
fn sessions_keep_no_more_workers_than_the_pool_bound() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = Daemon::start_with(POLICY, &["--pool", "0", "--pool-max", "2"]);
    let pid = daemon.child.id();
    let mut client = Client::connect(&daemon.socket);
    let sessions: Vec<String> = (0..4).map(|_| client.open()).collect();
    for s in &sessions {
        assert_eq!(client.sh(s, "true")["ok"], true);
    }
    wait_until("two sessions' workers are ready", || client.idle() == 2);
    // Every call has answered and its worker is reaped or being reaped: only kept ones
    // stay alive.
    wait_until("only the kept workers are alive", || {
        workers_of(pid).into_iter().filter(|p| !dead(*p)).count() == 2
    });
    // The others still run, cold.
    let before = client.hits();
    let ran = client.sh(&sessions[3], "echo cold");
    assert_eq!(stdout(&ran), "cold\n", "{ran}");
    assert_eq!(client.hits(), before);
    // A closed session's place goes to the next session that calls.
    client.ask(json!({"id": 5, "op": "session_close", "session": sessions[0]}));
    assert_eq!(client.sh(&sessions[3], "true")["ok"], true);
    wait_until("the freed place is taken", || client.idle() == 2);
}

#[derive(Debug)]
struct FakeClock(Mutex<SystemTime>);

impl Clock for FakeClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_has_its_worker_killed_at_the_sweep() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("session-pool-expiry");
    let policy = airlock_policy::load_policy_str(POLICY, "p.toml")
        .unwrap()
        .policy;
    let bounds = policy.sessions.clone();
    let supervisor = Arc::new(airlock_tests::supervisor());
    let clock = Arc::new(FakeClock(Mutex::new(SystemTime::now())));
    let sessions = Arc::new(
        airlock::Sessions::new(
            &scratch.0.join("sessions"),
            supervisor.sandbox_ids(),
            clock.clone(),
        )
        .unwrap()
        .keep_workers(Arc::clone(&supervisor), 4),
    );
    let gate =
        airlock::Gate::new(Arc::clone(&supervisor), policy).with_sessions(Arc::clone(&sessions));
    let opened = sessions.open(&bounds, None, None, 1 << 20).unwrap();
    let call = airlock::ToolCall {
        call_id: "c".into(),
        tool: "sh".into(),
        arguments: json!({"script": "echo x > f"}).to_string(),
    };
    let options = airlock::CallOptions {
        session: Some(opened.session.clone()),
        ..Default::default()
    };
    let ran = gate.call(&call, &options).await;
    assert!(ran.ok, "{ran:?}");
    assert_eq!(sessions.workers_kept(), 1);
    airlock_tests::wait_until_async("the session's worker is ready", || {
        supervisor.pool_stats().idle == 1
    })
    .await;
    *clock.0.lock().unwrap() += bounds.idle_timeout + Duration::from_secs(1);
    assert_eq!(sessions.sweep(&bounds), 1);
    // Out of the pool when the sweep returns (and killed, reaped in the background).
    assert_eq!(supervisor.pool_stats().idle, 0);
    assert_eq!(sessions.workers_kept(), 0);
    let again = gate.call(&call, &options).await;
    assert_eq!(
        again.error.map(|e| e.kind),
        Some(airlock::ErrorKind::SessionUnknown)
    );
    supervisor.close().await;
    assert_eq!(supervisor.calls_in_flight(), 0);
}

#[test]
fn after_a_policy_reload_a_session_keeps_a_worker_of_the_new_policy() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = Daemon::start_with(POLICY, &["--pool", "0", "--pool-max", "4"]);
    let pid = daemon.child.id();
    let mut client = Client::connect(&daemon.socket);
    let s = client.open();
    assert_eq!(client.sh(&s, "echo kept > f")["ok"], true);
    wait_until("the session's worker is ready", || client.idle() == 1);
    let old = workers_of(pid);
    assert_eq!(old.len(), 1, "{old:?}");
    // The same profiles under a reloaded policy: the pools it does not name go, the
    // session's among them.
    std::fs::write(&daemon.policy, format!("{POLICY}\n# reloaded\n")).unwrap();
    daemon.signal(libc::SIGHUP);
    wait_until("the reload ends the session's kept worker", || dead(old[0]));
    assert_eq!(client.idle(), 0);
    // The session and its files stay; its next call runs cold and keeps a new worker.
    let ran = client.sh(&s, "cat f");
    assert_eq!(stdout(&ran), "kept\n", "{ran}");
    wait_until("the session keeps a worker again", || client.idle() == 1);
    let before = client.hits();
    assert_eq!(stdout(&client.sh(&s, "cat f")), "kept\n");
    assert_eq!(client.hits(), before + 1);
}
