//! `airlock mcp` driven the way a careless or hostile MCP client would: garbage, oversized
//! and out-of-order lines, calls before `initialize`, bad params, reused ids, cancels,
//! approvals with and without elicitation, a reload, and the end of its input mid-call.
//! Every line on its stdout must be a JSON-RPC 2.0 message.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};

use airlock_tests::daemon::DAEMON_POLICY;
use airlock_tests::{HANG_GUARD, Scratch, airlock_bin, host_processes_with, sandbox_available};
use serde_json::{Value, json};

/// A tool with an object output schema: `cat` hands its input back as its output.
const STRUCTURED_TOOL: &str = r#"
[tools.pair]
description = "hand two texts back as JSON"
command = ["/bin/cat"]
stdin = "$input"
side_effect = "read"
concurrency_safe = true
output = { type = "object", properties = { a = { type = "string" }, b = { type = "string" } } }
input = { type = "object", properties = { a = { type = "string" }, b = { type = "string" } } }

[tools.later]
description = "not offered yet"
command = ["/bin/echo", "{text}"]
side_effect = "read"
state = "deferred"
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }
"#;

fn policy() -> String {
    format!("{DAEMON_POLICY}{STRUCTURED_TOOL}")
}

/// An `airlock mcp` of this build, its stdout read line by line by a thread.
struct Mcp {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Messages read while waiting for another one.
    held: VecDeque<Value>,
    policy: PathBuf,
    _scratch: Scratch,
}

impl Mcp {
    fn start(policy_text: &str, extra: &[&str]) -> Self {
        let scratch = Scratch::trusted("mcp");
        let policy = scratch.write("policy.toml", policy_text);
        let mut child = Command::new(airlock_bin())
            .args(["mcp", "--policy"])
            .arg(&policy)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (send, lines) = channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            stdin: child.stdin.take(),
            child,
            lines,
            held: VecDeque::new(),
            policy,
            _scratch: scratch,
        }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    fn send(&mut self, message: Value) {
        self.send_raw(format!("{message}\n").as_bytes());
    }

    /// The next message on stdout, which must be JSON-RPC 2.0.
    fn read(&mut self) -> Value {
        let line = self
            .lines
            .recv_timeout(HANG_GUARD)
            .expect("hung waiting for a message from airlock mcp");
        let message: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout carried a line that is not JSON ({e}): {line}"));
        assert_eq!(message["jsonrpc"], "2.0", "not JSON-RPC 2.0: {line}");
        message
    }

    /// The first message (held or new) for which `wanted` holds; others are held.
    fn next_where(&mut self, wanted: impl Fn(&Value) -> bool) -> Value {
        if let Some(at) = self.held.iter().position(&wanted) {
            return self.held.remove(at).unwrap();
        }
        loop {
            let message = self.read();
            if wanted(&message) {
                return message;
            }
            self.held.push_back(message);
        }
    }

    /// The answer to request `id`.
    fn answer(&mut self, id: &Value) -> Value {
        let id = id.clone();
        self.next_where(move |m| m["id"] == id && m.get("method").is_none())
    }

    fn request(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.answer(&id)
    }

    fn initialize(&mut self, capabilities: Value) -> Value {
        let answer = self.request(
            json!("init"),
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": capabilities,
                   "clientInfo": {"name": "suite", "version": "0"}}),
        );
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        answer
    }

    fn call(&mut self, id: Value, tool: &str, arguments: Value) -> Value {
        let answer = self.request(
            id,
            "tools/call",
            json!({"name": tool, "arguments": arguments}),
        );
        answer["result"].clone()
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn error_code(answer: &Value) -> i64 {
    answer["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error answer: {answer}"))
}

fn text_of(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Waits until the sleep of `marker` runs on the host.
fn wait_for_sleep(marker: &str) {
    let pattern = format!("sleep {marker}");
    airlock_tests::wait_until("the call's tool runs", || {
        !host_processes_with(&pattern).is_empty()
    });
}

fn wait_for_no_sleep(marker: &str) {
    let pattern = format!("sleep {marker}");
    airlock_tests::wait_until("the call's tool is killed", || {
        host_processes_with(&pattern).is_empty()
    });
}

#[test]
fn garbage_and_malformed_messages_get_json_rpc_errors_and_every_line_an_answer() {
    let _guard = airlock_tests::shared();
    let mut mcp = Mcp::start(&policy(), &[]);
    mcp.send_raw(b"this is not json\n");
    let answer = mcp.read();
    assert_eq!((error_code(&answer), &answer["id"]), (-32700, &Value::Null));
    mcp.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}\n");
    assert_eq!(error_code(&mcp.read()), -32700);
    mcp.send_raw(b"[{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}]\n");
    assert_eq!(error_code(&mcp.read()), -32600);
    mcp.send(json!({"jsonrpc": "1.0", "id": 3, "method": "ping"}));
    let answer = mcp.read();
    assert_eq!((error_code(&answer), &answer["id"]), (-32600, &json!(3)));
    mcp.send(json!({"jsonrpc": "2.0", "id": null, "method": "ping"}));
    assert_eq!(error_code(&mcp.read()), -32600);
    // Tools before initialize: refused, not run.
    let answer = mcp.request(json!(4), "tools/list", json!({}));
    assert_eq!(error_code(&answer), -32600);
    let answer = mcp.request(json!(5), "ping", json!({}));
    assert_eq!(answer["result"], json!({}));
    let init = mcp.initialize(json!({}));
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(init["result"]["capabilities"]["tools"]["listChanged"], true);
    let again = mcp.request(
        json!(6),
        "initialize",
        json!({"protocolVersion": "2025-06-18"}),
    );
    assert_eq!(error_code(&again), -32600);
    assert_eq!(
        error_code(&mcp.request(json!(7), "resources/list", json!({}))),
        -32601
    );
    for (id, params) in [
        (8, json!({})),
        (9, json!({"name": 3})),
        (10, json!({"name": "echo", "arguments": "{\"text\":\"x\"}"})),
        (11, json!({"name": "echo", "arguments": [1]})),
    ] {
        let answer = mcp.request(json!(id), "tools/call", params);
        assert_eq!(error_code(&answer), -32602, "{answer}");
    }
    // An unknown notification is never answered: the next message is the ping's answer.
    mcp.send(json!({"jsonrpc": "2.0", "method": "notifications/whatever"}));
    mcp.send(json!({"jsonrpc": "2.0", "id": "last", "method": "ping"}));
    assert_eq!(mcp.read()["id"], "last");
}

#[test]
fn an_oversized_line_is_refused_once_and_the_next_line_is_served() {
    let _guard = airlock_tests::shared();
    let mut mcp = Mcp::start(&policy(), &[]);
    let mut huge = vec![b'x'; 5 << 20];
    huge.push(b'\n');
    // Written from a thread: the server answers while this is still being written.
    let mut stdin = mcp.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        stdin.write_all(&huge).unwrap();
        stdin
    });
    let answer = mcp.read();
    assert_eq!((error_code(&answer), &answer["id"]), (-32600, &Value::Null));
    mcp.stdin = Some(writer.join().unwrap());
    let answer = mcp.request(json!(1), "ping", json!({}));
    assert_eq!(answer["result"], json!({}));
}

#[test]
fn the_server_negotiates_a_version_it_speaks() {
    let _guard = airlock_tests::shared();
    let mut mcp = Mcp::start(&policy(), &[]);
    let old = mcp.request(
        json!(1),
        "initialize",
        json!({"protocolVersion": "2025-03-26", "capabilities": {}}),
    );
    assert_eq!(old["result"]["protocolVersion"], "2025-03-26");
    let mut other = Mcp::start(&policy(), &[]);
    let unknown = other.request(
        json!(1),
        "initialize",
        json!({"protocolVersion": "1999-01-01", "capabilities": {}}),
    );
    assert_eq!(unknown["result"]["protocolVersion"], "2025-06-18");
}

#[test]
fn tools_list_publishes_the_active_tools_with_the_schemas_the_gate_enforces() {
    let _guard = airlock_tests::shared();
    let text = policy();
    let compiled = airlock_policy::load_policy_str(&text, "policy.toml")
        .unwrap()
        .policy;
    let mut mcp = Mcp::start(&text, &[]);
    mcp.initialize(json!({}));
    let list = mcp.request(json!(1), "tools/list", json!({}));
    let tools = list["result"]["tools"].as_array().unwrap().clone();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["echo", "guarded", "pair", "sleep"],
        "the deferred tool is not offered"
    );
    for tool in &tools {
        let enforced = &compiled.tools[tool["name"].as_str().unwrap()].tool;
        assert_eq!(tool["inputSchema"], enforced.input_schema);
        match &enforced.output_schema {
            Some(schema) => assert_eq!(&tool["outputSchema"], schema),
            None => assert!(tool.get("outputSchema").is_none()),
        }
    }
}

#[test]
fn a_call_maps_output_to_text_and_an_output_schema_to_structured_content() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let mut mcp = Mcp::start(&policy(), &[]);
    mcp.initialize(json!({}));
    let echoed = mcp.call(json!(1), "echo", json!({"text": "hello"}));
    assert_eq!(text_of(&echoed), "hello\n", "{echoed}");
    assert!(echoed.get("isError").is_none(), "{echoed}");
    assert_eq!(echoed["_meta"]["airlock/result"]["exit_code"], 0);
    let pair = mcp.call(json!(2), "pair", json!({"a": "x", "b": "y"}));
    assert_eq!(
        pair["structuredContent"],
        json!({"a": "x", "b": "y"}),
        "{pair}"
    );
    let unknown = mcp.call(json!(3), "nope", json!({}));
    assert_eq!(unknown["isError"], true);
    assert!(text_of(&unknown).starts_with("unknown_tool: "), "{unknown}");
    let deferred = mcp.call(json!(4), "later", json!({"text": "x"}));
    assert!(
        text_of(&deferred).starts_with("tool_unavailable: "),
        "{deferred}"
    );
}

#[test]
fn invalid_input_is_an_error_result_naming_the_kind_never_the_arguments() {
    let _guard = airlock_tests::shared();
    let mut mcp = Mcp::start(&policy(), &[]);
    mcp.initialize(json!({}));
    let secret = "hunter2-do-not-echo";
    let answer = mcp.request(
        json!(1),
        "tools/call",
        json!({"name": "sleep", "arguments": {"seconds": secret}}),
    );
    let result = &answer["result"];
    assert_eq!(result["isError"], true, "{answer}");
    assert!(text_of(result).starts_with("invalid_input: "), "{answer}");
    assert_eq!(
        result["_meta"]["airlock/result"]["error"]["violations"][0]["path"],
        "/seconds"
    );
    assert!(!answer.to_string().contains(secret), "{answer}");
}

#[test]
fn notifications_cancelled_kills_the_calls_worker_and_the_call_is_not_answered() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let mut mcp = Mcp::start(&policy(), &[]);
    mcp.initialize(json!({}));
    let marker = airlock_tests::sleep_marker();
    mcp.send(
        json!({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                    "params": {"name": "sleep", "arguments": {"seconds": marker}}}),
    );
    wait_for_sleep(&marker);
    mcp.send(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                    "params": {"requestId": "slow", "reason": "the user changed their mind"}}),
    );
    wait_for_no_sleep(&marker);
    // Still serving, and the cancelled request got no answer before this one.
    let after = mcp.call(json!("after"), "echo", json!({"text": "still here"}));
    assert_eq!(text_of(&after), "still here\n");
    assert!(mcp.held.is_empty(), "unexpected messages: {:?}", mcp.held);
}

#[test]
fn a_request_id_in_flight_cannot_be_reused_and_calls_beyond_the_bound_are_overloaded() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let mut mcp = Mcp::start(&policy(), &["--max-concurrent", "1", "--max-queued", "0"]);
    mcp.initialize(json!({}));
    let marker = airlock_tests::sleep_marker();
    mcp.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": "sleep", "arguments": {"seconds": marker}}}));
    wait_for_sleep(&marker);
    let reused = mcp.request(
        json!(1),
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "x"}}),
    );
    assert_eq!(error_code(&reused), -32600, "{reused}");
    let over = mcp.call(json!(2), "echo", json!({"text": "x"}));
    assert_eq!(over["isError"], true);
    assert!(text_of(&over).starts_with("overloaded: "), "{over}");
    mcp.send(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                    "params": {"requestId": 1}}),
    );
    wait_for_no_sleep(&marker);
}

#[test]
fn without_elicitation_a_call_needing_approval_is_answered_approval_required() {
    let _guard = airlock_tests::shared();
    let mut mcp = Mcp::start(&policy(), &[]);
    mcp.initialize(json!({}));
    let result = mcp.call(json!(1), "guarded", json!({"text": "x"}));
    assert_eq!(result["isError"], true);
    let text = text_of(&result);
    assert!(text.starts_with("approval_required: "), "{result}");
    let id = text
        .split("approval ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap();
    assert_eq!(id.len(), 32, "names the approval: {text}");
    assert!(id.chars().all(|c| c.is_ascii_hexdigit()), "{text}");
}

#[test]
fn with_elicitation_an_accepted_approval_runs_and_a_declined_one_does_not() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let mut mcp = Mcp::start(&policy(), &[]);
    mcp.initialize(json!({"elicitation": {}}));
    for (id, action) in [(1, "accept"), (2, "decline"), (3, "cancel")] {
        mcp.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                        "params": {"name": "guarded", "arguments": {"text": "approved"}}}));
        let ask = mcp.next_where(|m| m["method"] == "elicitation/create");
        let message = ask["params"]["message"].as_str().unwrap();
        assert!(message.contains("guarded"), "{ask}");
        mcp.send(json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": action}}));
        let result = mcp.answer(&json!(id))["result"].clone();
        if action == "accept" {
            assert_eq!(text_of(&result), "approved\n", "{result}");
        } else {
            assert_eq!(result["isError"], true, "{result}");
            assert!(text_of(&result).starts_with("denied: "), "{result}");
        }
    }
    // With --no-elicitation the capability is not used.
    let mut refusing = Mcp::start(&policy(), &["--no-elicitation"]);
    refusing.initialize(json!({"elicitation": {}}));
    let result = refusing.call(json!(1), "guarded", json!({"text": "x"}));
    assert!(
        text_of(&result).starts_with("approval_required: "),
        "{result}"
    );
}

#[test]
fn an_elicitation_left_unanswered_rejects_the_approval_when_its_ttl_ends() {
    let _guard = airlock_tests::shared();
    // The approval is refused without running anything: no sandbox needed.
    let mut mcp = Mcp::start(&format!("{}\n[approvals]\nttl = \"1s\"\n", policy()), &[]);
    mcp.initialize(json!({"elicitation": {}}));
    mcp.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": "guarded", "arguments": {"text": "x"}}}));
    let ask = mcp.next_where(|m| m["method"] == "elicitation/create");
    let result = mcp.answer(&json!(1))["result"].clone();
    assert_eq!(result["isError"], true, "{result}");
    let text = text_of(&result);
    assert!(text.starts_with("denied: "), "{result}");
    assert!(text.contains("time to live"), "{result}");
    let withdrawn = mcp.next_where(|m| m["method"] == "notifications/cancelled");
    assert_eq!(withdrawn["params"]["requestId"], ask["id"], "{withdrawn}");
    // A late answer is one to no question: dropped, and the server still serves.
    mcp.send(json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "accept"}}));
    let tools = mcp.request(json!(2), "tools/list", json!({}));
    assert!(tools["result"]["tools"].is_array(), "{tools}");
}

#[test]
fn a_reload_that_changes_the_tools_sends_list_changed() {
    let _guard = airlock_tests::shared();
    let mut mcp = Mcp::start(&policy(), &[]);
    mcp.initialize(json!({}));
    let added = format!(
        "{}\n[tools.shout]\ndescription = \"a new tool\"\ncommand = [\"/bin/echo\", \"{{text}}\"]\nside_effect = \"read\"\ninput = {{ type = \"object\", properties = {{ text = {{ type = \"string\" }} }}, required = [\"text\"] }}\n",
        policy()
    );
    std::fs::write(&mcp.policy, added).unwrap();
    mcp.signal(libc::SIGHUP);
    mcp.next_where(|m| m["method"] == "notifications/tools/list_changed");
    let list = mcp.request(json!(1), "tools/list", json!({}));
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"shout"), "{list}");
}

#[test]
fn the_end_of_input_cancels_calls_in_flight_and_the_server_exits() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let mut mcp = Mcp::start(&policy(), &[]);
    mcp.initialize(json!({}));
    let marker = airlock_tests::sleep_marker();
    mcp.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": "sleep", "arguments": {"seconds": marker}}}));
    wait_for_sleep(&marker);
    drop(mcp.stdin.take());
    let status = mcp.child.wait().unwrap();
    assert!(status.success(), "{status}");
    wait_for_no_sleep(&marker);
}
