//! The daemon against careless and hostile clients: clients that never read, read slowly,
//! flood it with connections or with unfinished lines, reuse ids, send fields it does not
//! know. Its memory stays under a stated ceiling, a polite client beside them is answered,
//! and every refusal is typed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use airlock_tests::daemon::{DAEMON_POLICY, Daemon};
use airlock_tests::{Scratch, airlock_bin, host_processes_with, sandbox_available, wait_until};
use serde_json::{Value, json};

/// What the hostile mix may add to the daemon's resident memory at its peak, with the
/// daemon's default budgets (16 MiB of input, 16 MiB of output, 128 connections).
const CEILING_ABOVE_IDLE_KIB: u64 = 64 * 1024;

/// The daemon tests' policy and a tool whose answer is two megabytes (its output and the
/// record's copy of it as JSON).
fn policy() -> String {
    format!(
        r#"{DAEMON_POLICY}
[tools.big]
description = "a megabyte of text"
command = ["/bin/sh", "-c", "yes 0123456789abcdef | head -c 1000000"]
side_effect = "read"
concurrency_safe = true
input = {{ type = "object" }}
"#
    )
    .replace(
        r#"limits = { timeout = "300s" }"#,
        r#"limits = { timeout = "300s", output = "1MiB" }"#,
    )
}

pub(super) fn start(extra: &[&str]) -> Daemon {
    Daemon::start_with(&policy(), extra)
}

pub(super) fn connect(daemon: &Daemon) -> Client {
    Client::connect(&daemon.socket)
}

pub(super) fn stats(daemon: &Daemon) -> Value {
    connect(daemon).ask(json!({"id": "s", "op": "stats"}))["result"].clone()
}

/// A JSON-lines client.
pub(super) struct Client {
    pub(super) stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Client {
    fn connect(socket: &Path) -> Self {
        Self::from_stream(UnixStream::connect(socket).unwrap())
    }

    pub(super) fn from_stream(stream: UnixStream) -> Self {
        let reader = BufReader::new(stream.try_clone().unwrap());
        Self { stream, reader }
    }

    pub(super) fn send(&mut self, request: &Value) {
        self.stream
            .write_all(format!("{request}\n").as_bytes())
            .unwrap();
    }

    /// The next answer; `None` once the daemon closed the connection (perhaps in the middle
    /// of an answer it then never finished).
    pub(super) fn next(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(_) if line.ends_with('\n') => Some(serde_json::from_str(&line).unwrap()),
            _ => None,
        }
    }

    pub(super) fn ask(&mut self, request: Value) -> Value {
        self.send(&request);
        self.next().unwrap()
    }

    /// As a well-behaved gateway does: an `overloaded` answer is asked again after the
    /// wait it names.
    fn ask_retrying(&mut self, request: Value) -> Value {
        loop {
            let answer = self.ask(request.clone());
            match answer["result"]["error"]["retry_after_ms"].as_u64() {
                Some(ms) if answer["result"]["error"]["kind"] == "overloaded" => {
                    std::thread::sleep(Duration::from_millis(ms));
                }
                _ => return answer,
            }
        }
    }
}

pub(super) fn call(id: impl Into<Value>, tool: &str, arguments: Value) -> Value {
    json!({"id": id.into(), "op": "call", "tool": tool, "arguments": arguments})
}

#[test]
fn hostile_clients_cannot_grow_the_daemon_past_its_ceiling_and_a_polite_client_is_answered() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = start(&[
        "--max-concurrent",
        "4",
        "--write-timeout",
        "2s",
        "--read-timeout",
        "2s",
    ]);
    assert_eq!(
        connect(&daemon).ask(json!({"id": 0, "op": "health"}))["result"]["ok"],
        true
    );
    let idle = daemon.status_kib("VmRSS:");

    // Non-readers: twenty answers of two megabytes each (the output and its record), never
    // read; together about what the call queue takes.
    let mut non_readers: Vec<Client> = (0..3)
        .map(|_| {
            let mut client = connect(&daemon);
            for i in 0..20 {
                client.send(&call(i, "big", json!({})));
            }
            client
        })
        .collect();
    // Unfinished lines: almost the largest request each, never ended, on 20 connections
    // (more than the input budget holds).
    let partial = format!(
        r#"{{"id":1,"op":"call","tool":"echo","arguments":{{"text":"{}"#,
        "x".repeat((2 << 20) - 100)
    );
    let mut unfinished: Vec<UnixStream> = (0..20)
        .filter_map(|_| {
            let mut stream = UnixStream::connect(&daemon.socket).ok()?;
            stream.write_all(partial.as_bytes()).ok()?;
            Some(stream)
        })
        .collect();
    // A slow reader: twenty answers, taken four kilobytes at a time.
    let slow = {
        let mut client = connect(&daemon);
        for i in 0..20 {
            client.send(&call(i, "big", json!({})));
        }
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            let mut answers = 0;
            while answers < 20 {
                match client.stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => answers += chunk[..n].iter().filter(|b| **b == b'\n').count(),
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            answers
        })
    };
    // Beside all that, a polite client's calls are answered (connected before the flood
    // below takes every other place).
    let mut polite = connect(&daemon);
    assert_eq!(
        polite.ask(json!({"id": "h", "op": "health"}))["result"]["ok"],
        true
    );
    // A flood of connections beyond --max-connections' default.
    let flood: Vec<UnixStream> = (0..200)
        .filter_map(|_| UnixStream::connect(&daemon.socket).ok())
        .collect();
    for i in 0..5 {
        let answer = polite.ask_retrying(call(i, "echo", json!({"text": format!("polite {i}")})));
        assert_eq!(answer["id"], i, "{answer}");
        assert_eq!(answer["result"]["ok"], true, "{answer}");
        assert_eq!(answer["result"]["stdout"], format!("polite {i}\n"));
    }

    drop(flood);
    // The non-readers are closed for not reading, and the stats say so.
    wait_until("the daemon closes the clients that do not read", || {
        stats(&daemon)["closed_unread"].as_u64().unwrap() >= 3
    });
    let counted = stats(&daemon);
    assert!(counted["input_refused"].as_u64().unwrap() >= 1, "{counted}");
    assert!(counted["overloaded"].as_u64().unwrap() >= 1, "{counted}");
    for client in &mut non_readers {
        // Whatever was written before the close, then the end.
        while client.next().is_some() {}
    }
    // Not asserted: under emulation a reading thread can stall past the write timeout, and
    // then it is rightly closed as a client that does not read.
    eprintln!("the slow reader got {} of 20 answers", slow.join().unwrap());

    let peak = daemon.status_kib("VmHWM:");
    assert!(
        peak < idle + CEILING_ABOVE_IDLE_KIB,
        "the daemon's peak RSS {peak} KiB is more than {CEILING_ABOVE_IDLE_KIB} KiB above idle {idle} KiB"
    );
    eprintln!("daemon RSS: idle {idle} KiB, peak under the hostile mix {peak} KiB");

    // Everything hostile gone: the budgets are whole again.
    drop(non_readers);
    unfinished.clear();
    drop(polite);
    // Only the connection asking remains, holding its read buffer.
    wait_until("the daemon gives back its budgets", || {
        let now = stats(&daemon);
        now["connections_open"] == 1
            && now["input_bytes"].as_u64().unwrap() < 64 << 10
            && now["output_bytes"] == 0
            && now["in_flight"] == 0
    });
}

#[test]
fn a_duplicate_in_flight_id_is_refused_and_a_disconnect_cancels_every_call() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = start(&[]);
    let marker = airlock_tests::sleep_marker();
    let mut client = connect(&daemon);
    client.send(&call("a", "sleep", json!({"seconds": marker})));
    let refused = client.ask(call("a", "sleep", json!({"seconds": marker})));
    assert_eq!(refused["id"], "a");
    assert_eq!(refused["error"]["kind"], "invalid_request", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains(r#""a""#),
        "{refused}"
    );
    client.send(&call("b", "sleep", json!({"seconds": marker})));
    wait_until("both calls run", || {
        host_processes_with(&format!("sleep {marker}")).len() == 2
    });
    drop(client);
    wait_until("every call of the gone client is killed", || {
        host_processes_with(&format!("sleep {marker}")).is_empty()
    });
    // The id is free again once its call ended.
    let mut again = connect(&daemon);
    let answer = again.ask(call("a", "echo", json!({"text": "again"})));
    assert_eq!(answer["result"]["ok"], true, "{answer}");
}

#[test]
fn unknown_or_repeated_fields_are_refused_by_name_unreadable_requests_by_their_id_and_nothing_runs()
{
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = start(&[]);
    let mut client = connect(&daemon);
    for (request, named) in [
        (
            r#"{"id":1,"op":"call","tool":"echo","arguments":{"text":"x"},"dry_runn":true}"#,
            "dry_runn",
        ),
        (r#"{"id":2,"op":"stats","verbose":true}"#, "verbose"),
        (
            r#"{"id":3,"op":"call","tool":"echo","arguments":{"text":"x"},"dry_run":true,"dry_run":false}"#,
            "dry_run",
        ),
        (
            r#"{"id":4,"op":"call","tool":"echo","timeout_ms":0}"#,
            "timeout_ms",
        ),
        (r#"{"id":5,"op":"launch"}"#, "launch"),
    ] {
        client.stream.write_all(request.as_bytes()).unwrap();
        client.stream.write_all(b"\n").unwrap();
        let answer = client.next().unwrap();
        assert_eq!(
            answer["error"]["kind"], "invalid_request",
            "{request}: {answer}"
        );
        assert!(
            answer["error"]["message"].as_str().unwrap().contains(named),
            "{request}: {answer}"
        );
    }
    // Requests that cannot be read whole still get their id back when it comes first.
    client
        .stream
        .write_all(b"{\"id\": \"broken-1\", \"op\": \"call\", oops}\n")
        .unwrap();
    let answer = client.next().unwrap();
    assert_eq!(answer["id"], "broken-1", "{answer}");
    assert_eq!(answer["error"]["kind"], "invalid_request", "{answer}");
    let padding = "x".repeat(2 * airlock::daemon::MAX_REQUEST_BYTES);
    let huge = format!(
        r#"{{"id": 77, "op": "call", "tool": "echo", "arguments": {{"text": "{padding}"}}}}"#
    );
    client.stream.write_all(huge.as_bytes()).unwrap();
    client.stream.write_all(b"\n").unwrap();
    let answer = client.next().unwrap();
    assert_eq!(answer["id"], 77, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("larger than"), "{answer}");
    // ... and the connection goes on.
    let answer = client.ask(json!({"id": 78, "op": "health"}));
    assert_eq!(answer["id"], 78, "{answer}");
    assert_eq!(stats(&daemon)["calls"], 0, "nothing refused may run");
}

#[test]
fn dry_run_decides_and_describes_without_running_and_timeout_ms_shortens_the_deadline() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = start(&[]);
    let mut client = connect(&daemon);
    let marker = airlock_tests::sleep_marker();
    let mut dry = call(1, "sleep", json!({"seconds": marker}));
    dry["dry_run"] = json!(true);
    let answer = client.ask(dry);
    let described = &answer["result"]["dry_run"];
    assert_eq!(described["decision"], "allow", "{answer}");
    assert_eq!(described["argv"], json!(["/bin/sleep", marker]), "{answer}");
    // The sandbox is described in plain JSON, not in the supervisor's own notation.
    let sandbox = &described["sandbox"];
    assert_eq!(sandbox["network"], "none", "{answer}");
    let requirement = &sandbox["landlock"]["requirement"];
    assert!(
        requirement == "required" || requirement == "best_effort",
        "{answer}"
    );
    let mounts = sandbox["mounts"].as_array().unwrap();
    assert!(
        mounts.iter().any(|m| m["Bind"]["target"] == "/usr"),
        "{answer}"
    );
    assert!(mounts.iter().all(Value::is_object), "{answer}");
    assert!(host_processes_with(&format!("sleep {marker}")).is_empty());
    assert_eq!(stats(&daemon)["calls"], 0);

    // A deadline of the caller's, far shorter than the tool's 300 s.
    let mut short = call(2, "sleep", json!({"seconds": "600"}));
    short["timeout_ms"] = json!(300);
    let answer = client.ask(short);
    assert_eq!(answer["result"]["error"]["kind"], "timeout", "{answer}");
    assert_eq!(answer["result"]["error"]["timeout_ms"], 300, "{answer}");

    // Call ids are fresh unless given, never the request id.
    let a = client.ask(call(3, "echo", json!({"text": "a"})));
    let b = client.ask(call(3, "echo", json!({"text": "b"})));
    let (a, b) = (&a["result"]["call_id"], &b["result"]["call_id"]);
    assert!(a.as_str().unwrap().len() >= 16 && a != b, "{a} {b}");
    let mut named = call(4, "echo", json!({"text": "c"}));
    named["call_id"] = json!("mine-1");
    assert_eq!(client.ask(named)["result"]["call_id"], "mine-1");
}

#[test]
fn an_overloaded_answer_names_the_call_and_says_when_to_retry_and_refusals_need_no_slot() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let audit = Scratch::new("hostile-audit");
    let log = audit.0.join("audit.jsonl");
    let daemon = start(&[
        "--max-concurrent",
        "1",
        "--max-queued",
        "0",
        "--audit",
        log.to_str().unwrap(),
    ]);
    let marker = airlock_tests::sleep_marker();
    let mut busy = connect(&daemon);
    busy.send(&call(1, "sleep", json!({"seconds": marker})));
    wait_until("the first call runs", || {
        !host_processes_with(&format!("sleep {marker}")).is_empty()
    });
    let mut second = call(2, "echo", json!({"text": "x"}));
    second["call_id"] = json!("c-2");
    let answer = connect(&daemon).ask(second);
    let result = &answer["result"];
    assert_eq!(result["error"]["kind"], "overloaded", "{answer}");
    assert_eq!(result["call_id"], "c-2", "{answer}");
    assert_eq!(result["tool"], "echo", "{answer}");
    assert!(
        result["error"]["retry_after_ms"].as_u64().unwrap() > 0,
        "{answer}"
    );

    // Calls the gate refuses need no slot: with the only one still busy, they get their
    // own refusal at once, not `overloaded`. Every refusal is audited, not only the calls
    // that ran.
    let mut other = connect(&daemon);
    let mut invalid = call(3, "echo", json!({"text": 5}));
    invalid["call_id"] = json!("c-3");
    assert_eq!(
        other.ask(invalid)["result"]["error"]["kind"],
        "invalid_input"
    );
    let mut unknown = call(4, "nope", json!({}));
    unknown["call_id"] = json!("c-4");
    assert_eq!(
        other.ask(unknown)["result"]["error"]["kind"],
        "unknown_tool"
    );
    assert_eq!(stats(&daemon)["in_flight"], 1, "the busy call still runs");
    drop(busy);
    let refusals = || -> Vec<(String, String)> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .filter(|event| event["event"] == "tool.refused")
            .map(|event| {
                let id = event["call_id"].as_str().unwrap().to_string();
                (id, event["outcome"].as_str().unwrap().to_string())
            })
            .collect()
    };
    let expected = [
        ("c-2".to_string(), "overloaded".to_string()),
        ("c-3".to_string(), "invalid_input".to_string()),
        ("c-4".to_string(), "unknown_tool".to_string()),
    ];
    wait_until("the refusals reach the audit log", || {
        expected.iter().all(|e| refusals().contains(e))
    });
}

/// A validator for one definition of the daemon's published schema.
fn schema_of(definition: &str) -> jsonschema::Validator {
    let root: Value = serde_json::from_str(airlock::daemon::PROTOCOL_SCHEMA).unwrap();
    let schema = json!({
        "$schema": root["$schema"],
        "$defs": root["$defs"],
        "$ref": format!("#/$defs/{definition}"),
    });
    jsonschema::validator_for(&schema).unwrap()
}

fn violations(validator: &jsonschema::Validator, instance: &Value) -> Vec<String> {
    validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

#[test]
fn every_answer_the_daemon_sends_matches_its_published_schema() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = start(&[]);
    let requests = schema_of("request");
    let answers = schema_of("answer");
    let mut client = connect(&daemon);
    let mut checked = std::collections::BTreeSet::new();
    let mut check = |client: &mut Client, request: Value| -> Value {
        let op = request["op"].as_str().unwrap().to_string();
        assert!(
            violations(&requests, &request).is_empty(),
            "the schema refuses a request the daemon takes: {request}: {:?}",
            violations(&requests, &request)
        );
        let answer = client.ask(request.clone());
        for validator in [&answers, &schema_of(&format!("answers/properties/{op}"))] {
            let found = violations(validator, &answer);
            assert!(found.is_empty(), "{request} -> {answer}: {found:?}");
        }
        checked.insert(op);
        answer
    };
    check(&mut client, json!({"id": 1, "op": "tools"}));
    check(&mut client, json!({"id": 2, "op": "health"}));
    let ok = check(&mut client, call(3, "echo", json!({"text": "hi"})));
    assert_eq!(ok["result"]["ok"], true, "{ok}");
    assert_eq!(
        ok["result"]["output"],
        Value::Null,
        "stdout is not carried twice"
    );
    let invalid = check(&mut client, call(4, "echo", json!({"text": 5})));
    assert_eq!(invalid["result"]["error"]["kind"], "invalid_input");
    let unknown = check(&mut client, call(5, "nope", json!({})));
    assert_eq!(unknown["result"]["error"]["kind"], "unknown_tool");
    // A call that never got a worker shows no isolation; one that ran does.
    assert_eq!(unknown["result"]["isolation"], Value::Null, "{unknown}");
    assert_eq!(invalid["result"]["isolation"], Value::Null, "{invalid}");
    assert!(ok["result"]["isolation"]["namespaces"].is_array(), "{ok}");
    let mut dry = call(6, "echo", json!({"text": "hi"}));
    dry["dry_run"] = json!(true);
    check(&mut client, dry);
    let mut short = call(7, "sleep", json!({"seconds": "600"}));
    short["timeout_ms"] = json!(200);
    let timed_out = check(&mut client, short);
    assert_eq!(timed_out["result"]["error"]["kind"], "timeout");
    let needs = check(&mut client, call(8, "guarded", json!({"text": "hi"})));
    assert_eq!(needs["result"]["error"]["kind"], "approval_required");
    let mut propose = call(9, "guarded", json!({"text": "hi"}));
    propose["op"] = json!("propose");
    let proposed = check(&mut client, propose);
    let approval_id = proposed["result"]["approval"]["approval_id"].clone();
    let executed = check(
        &mut client,
        json!({"id": 10, "op": "execute", "approval_id": approval_id}),
    );
    assert_eq!(executed["result"]["ok"], true, "{executed}");
    check(
        &mut client,
        json!({"id": 11, "op": "reject", "approval_id": approval_id}),
    );
    check(
        &mut client,
        json!({"id": 12, "op": "set_state", "tool": "echo", "state": "deferred"}),
    );
    let deferred = check(&mut client, call("12b", "echo", json!({"text": "hi"})));
    assert_eq!(
        deferred["result"]["error"]["kind"], "tool_unavailable",
        "{deferred}"
    );
    assert_eq!(
        deferred["result"]["error"]["state"], "deferred",
        "{deferred}"
    );
    let listed = check(&mut client, json!({"id": "12c", "op": "tools"}));
    let echo = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "echo")
        .unwrap();
    assert_eq!(echo["state"], "deferred", "{listed}");
    check(
        &mut client,
        json!({"id": 13, "op": "set_state", "tool": "echo", "state": "active"}),
    );
    check(&mut client, json!({"id": 14, "op": "cancel", "target": 99}));
    check(&mut client, json!({"id": 15, "op": "stats"}));
    // Refusals are answers too.
    for bad in [
        json!({"id": 16, "op": "call", "tool": "echo", "arguments": {}, "extra": 1}),
        json!({"id": 17, "op": "nope"}),
    ] {
        assert!(
            !violations(&requests, &bad).is_empty(),
            "the schema takes {bad}"
        );
        let answer = client.ask(bad.clone());
        assert_eq!(answer["error"]["kind"], "invalid_request", "{answer}");
        assert!(violations(&answers, &answer).is_empty(), "{answer}");
    }
    let ops = [
        "call",
        "cancel",
        "execute",
        "health",
        "propose",
        "reject",
        "set_state",
        "stats",
        "tools",
    ];
    assert_eq!(checked, ops.iter().map(|s| s.to_string()).collect());
}

#[test]
fn with_an_approver_role_only_approvers_execute_reject_or_set_state() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let mut propose = call("p", "guarded", json!({"text": "hi"}));
    propose["op"] = json!("propose");
    // Approvers are some other uid: this client may propose, nothing more.
    let daemon = start(&["--approver-uid", "4242"]);
    let mut client = connect(&daemon);
    let proposed = client.ask(propose.clone());
    let approval_id = proposed["result"]["approval"]["approval_id"].clone();
    assert!(approval_id.is_string(), "{proposed}");
    for request in [
        json!({"id": 1, "op": "execute", "approval_id": approval_id}),
        json!({"id": 2, "op": "reject", "approval_id": approval_id}),
        json!({"id": 3, "op": "set_state", "tool": "echo", "state": "suspended"}),
    ] {
        let answer = client.ask(request.clone());
        assert_eq!(answer["error"]["kind"], "forbidden", "{request}: {answer}");
    }
    // The approval is still pending, untouched by the refused attempts.
    assert_eq!(stats(&daemon)["pending_approvals"], 1);
    drop(daemon);

    // This uid as the approver: the same approval flow runs.
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() }.to_string();
    let daemon = start(&["--approver-uid", &me]);
    let mut client = connect(&daemon);
    let proposed = client.ask(propose);
    let approval_id = proposed["result"]["approval"]["approval_id"].clone();
    let executed = client.ask(json!({"id": 4, "op": "execute", "approval_id": approval_id}));
    assert_eq!(executed["result"]["ok"], true, "{executed}");
}

#[test]
fn the_socket_takes_a_group_and_mode_for_allowed_groups_but_never_a_world_mode() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let daemon = start(&["--socket-mode", "0660", "--socket-group", "4243"]);
    let meta = std::fs::metadata(&daemon.socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), 4243);
    drop(daemon);

    let scratch = Scratch::trusted("hostile-mode");
    let policy = scratch.write("policy.toml", &policy());
    for (mode, complaint) in [("0666", "0660"), ("rw", "octal")] {
        let out = Command::new(airlock_bin())
            .args(["serve", "--policy"])
            .arg(&policy)
            .arg("--socket")
            .arg(scratch.0.join("s.sock"))
            .args(["--socket-mode", mode])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{mode}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--socket-mode") && stderr.contains(complaint),
            "{stderr}"
        );
        assert!(!scratch.0.join("s.sock").exists());
    }
}

#[test]
fn a_refused_peer_reads_its_refusal_even_when_it_writes_first() {
    let _guard = airlock_tests::shared();
    // SAFETY: geteuid has no preconditions.
    if !sandbox_available() || unsafe { libc::geteuid() } != 0 {
        // Only root can be a second, unlisted uid.
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let daemon = start(&["--socket-mode", "0660", "--socket-group", "65534"]);
    let dir = daemon.socket.parent().unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    // The client waits for the refusal to arrive, as a client blocked in a first read does,
    // and only then sends a request: a daemon that had closed the socket by then made that
    // write fail with EPIPE, and the refusal was never read.
    let client = r#"
import select, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
select.select([s], [], [])
s.sendall(b'{"id":1,"op":"health"}\n')
data = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
sys.stdout.write(data.decode())
"#;
    let out = Command::new("/usr/bin/python3")
        .args(["-c", client])
        .arg(&daemon.socket)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["error"]["kind"], "forbidden", "{answer}");
    assert!(answer["id"].is_null(), "{answer}");
    assert_eq!(stats(&daemon)["refused_peers"], 1);
}

#[test]
fn arguments_count_against_the_input_budget_at_their_parsed_size() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // 800 KB of text, within the tool's input limit, but some 13 MB once parsed: more than
    // the whole budget, so no retry could help and the answer says why.
    let daemon = start(&["--max-input", "2MiB"]);
    let zeros = vec![0u8; 400_000];
    let answer = connect(&daemon).ask(call(1, "big", json!({ "pad": zeros })));
    let error = &answer["result"]["error"];
    assert_eq!(error["kind"], "invalid_input", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("once parsed"),
        "{error}"
    );
    assert_eq!(stats(&daemon)["calls"], 0);
    // A small call still runs.
    let answer = connect(&daemon).ask(call(2, "echo", json!({"text": "hi"})));
    assert_eq!(answer["result"]["ok"], true, "{answer}");
}

#[test]
fn quiet_connections_hold_none_of_the_input_budget() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // 2 MiB, the least budget there is. When every open connection held a 16 KiB read
    // buffer against it, 128 quiet connections spent it and the next client was refused
    // as overloaded, whatever --max-connections and --max-concurrent allowed.
    let daemon = start(&["--max-input", "2MiB", "--max-connections", "400"]);
    let mut quiet: Vec<Client> = (0..200).map(|_| connect(&daemon)).collect();
    for (id, client) in quiet.iter_mut().enumerate() {
        let answer = client.ask(json!({"id": id, "op": "health"}));
        assert!(answer.get("error").is_none(), "connection {id}: {answer}");
    }
    // Only the asking connection's own buffer, while it reads.
    let held = stats(&daemon)["input_bytes"].as_u64().unwrap();
    assert!(held <= 64 << 10, "{held} bytes held by quiet connections");
    let answer = connect(&daemon).ask(call(1, "echo", json!({"text": "hi"})));
    assert_eq!(answer["result"]["ok"], true, "{answer}");
    drop(quiet);
}
