//! Calls waiting for a concurrency slot: they are decided again when they get one (a tool
//! suspended, a session put in plan mode or a policy reloaded while they waited binds
//! them), and the slots and the queue are shared fairly between connections.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use airlock_tests::daemon::Daemon;
use airlock_tests::{sandbox_available, wait_until};
use serde_json::{Value, json};

/// A JSON-lines connection; answers may come out of order.
struct Conn {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Conn {
    fn open(daemon: &Daemon) -> Self {
        let stream = UnixStream::connect(&daemon.socket).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Self { stream, reader }
    }

    fn send(&mut self, request: &Value) {
        self.stream
            .write_all(format!("{request}\n").as_bytes())
            .unwrap();
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    fn ask(&mut self, request: &Value) -> Value {
        self.send(request);
        self.read()
    }

    fn stat(&mut self, name: &str) -> u64 {
        let stats = self.ask(&json!({"id": 0, "op": "stats"}));
        stats["result"][name].as_u64().unwrap()
    }
}

/// Starts a daemon with one slot, holds it with a sleeping call and queues an `echo`
/// behind it (request ids 1 and 2), lets `change` act while the echo waits, then frees the
/// slot and answers the queued call's result.
fn queued_echo_after(change: impl FnOnce(&Daemon, &mut Conn)) -> Value {
    let daemon = Daemon::start(&["--max-concurrent", "1"]);
    let mut admin = Conn::open(&daemon);
    let mut calls = Conn::open(&daemon);
    calls.send(&json!({"id": 1, "op": "call", "tool": "sleep",
        "arguments": {"seconds": "300"}}));
    wait_until("the sleeping call holds the slot", || {
        admin.stat("in_flight") == 1
    });
    calls.send(&json!({"id": 2, "op": "call", "tool": "echo",
        "arguments": {"text": "ran"}}));
    wait_until("the echo waits for the slot", || admin.stat("queued") == 1);
    change(&daemon, &mut admin);
    calls.send(&json!({"id": 3, "op": "cancel", "target": 1}));
    loop {
        let answer = calls.read();
        if answer["id"] == 2 {
            return answer["result"].clone();
        }
    }
}

#[test]
fn a_queued_call_of_a_tool_suspended_while_it_waits_is_refused_unrun() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = queued_echo_after(|_, admin| {
        let set = admin.ask(&json!({"id": 5, "op": "set_state", "tool": "echo",
            "state": "suspended"}));
        assert_eq!(set["result"]["state"], "suspended", "{set}");
    });
    assert_eq!(result["error"]["kind"], "tool_unavailable", "{result}");
    assert_eq!(result["error"]["state"], "suspended", "{result}");
    assert_ne!(result["stdout"], "ran\n", "{result}");
}

#[test]
fn a_queued_call_of_a_tool_a_reload_removed_is_refused_unrun() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = queued_echo_after(|daemon, admin| {
        let without_echo =
            airlock_tests::daemon::DAEMON_POLICY.replace("[tools.echo]", "[tools.echoed]");
        std::fs::write(&daemon.policy, without_echo).unwrap();
        daemon.signal(libc::SIGHUP);
        wait_until("the reloaded policy's tools are listed", || {
            let tools = admin.ask(&json!({"id": 6, "op": "tools"}));
            tools["result"]["tools"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["name"] == "echoed")
        });
    });
    assert_eq!(result["error"]["kind"], "unknown_tool", "{result}");
    assert_ne!(result["stdout"], "ran\n", "{result}");
}

#[test]
fn a_freed_slot_goes_to_a_client_that_waited_less_often_not_to_the_longest_queue() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = Daemon::start(&["--max-concurrent", "1"]);
    let mut admin = Conn::open(&daemon);
    let mut greedy = Conn::open(&daemon);
    greedy.send(&json!({"id": "g1", "op": "call", "tool": "sleep",
        "arguments": {"seconds": "1"}}));
    wait_until("the greedy client's first call holds the slot", || {
        admin.stat("in_flight") == 1
    });
    for id in ["g2", "g3"] {
        greedy.send(&json!({"id": id, "op": "call", "tool": "sleep",
            "arguments": {"seconds": "300"}}));
    }
    wait_until("the greedy client's calls wait", || {
        admin.stat("queued") == 2
    });
    let mut polite = Conn::open(&daemon);
    let answer = polite.ask(&json!({"id": "p", "op": "call", "tool": "echo",
        "arguments": {"text": "my turn"}}));
    assert_eq!(answer["result"]["ok"], true, "{answer}");
    // First come would have run both of the greedy client's 300 s calls first.
    greedy.stream.set_nonblocking(true).unwrap();
    let mut seen = String::new();
    let _ = std::io::Read::read_to_string(&mut greedy.reader, &mut seen);
    assert!(
        !seen.contains("\"g2\"") && !seen.contains("\"g3\""),
        "{seen}"
    );
    // And then the greedy client's next call has the slot.
    wait_until("the greedy client's next call runs", || {
        admin.stat("in_flight") == 1 && admin.stat("queued") == 1
    });
}
