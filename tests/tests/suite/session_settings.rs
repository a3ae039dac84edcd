//! Per-session settings over the daemon: `set_state` naming a session and `session_open`
//! with `plan_mode` hold for that session's calls (and its `tools` listing) only, win over
//! the daemon-wide state, never reach another session, and go when the session closes. Every check is a gate
//! decision (a dry run or a refusal), so none needs a working sandbox.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use airlock_tests::daemon::Daemon;
use serde_json::{Value, json};

const POLICY: &str = r#"version = 1
[sessions]
max_sessions = 4
max_size = "1MiB"

[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]

[profiles.workspace]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
workspace = "/workspace"
workspace_size = "64KiB"
cwd = "/workspace"

[tools.echo]
description = "say a text"
command = ["/bin/echo", "{text}"]
side_effect = "read"
concurrency_safe = true
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }

[tools.sh]
description = "run a script in the workspace"
profile = "workspace"
command = ["/bin/sh", "-c", "{script}"]
side_effect = "write"
concurrency_safe = true
input = { type = "object", properties = { script = { type = "string" } }, required = ["script"] }
"#;

/// A JSON-lines client asking one question at a time.
struct Client {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Client {
    fn connect(daemon: &Daemon) -> Self {
        let stream = UnixStream::connect(&daemon.socket).unwrap();
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

    fn open(&mut self, plan_mode: bool) -> String {
        let answer = self.ask(json!({"id": 1, "op": "session_open", "plan_mode": plan_mode}));
        answer["result"]["session"]
            .as_str()
            .unwrap_or_else(|| panic!("no session in {answer}"))
            .to_string()
    }

    fn set_state(&mut self, tool: &str, state: &str, session: Option<&str>) -> Value {
        let mut request = json!({"id": 2, "op": "set_state", "tool": tool, "state": state});
        if let Some(session) = session {
            request["session"] = json!(session);
        }
        self.ask(request)
    }

    /// `tool`'s state in the `tools` listing, daemon-wide or as `session` sees it.
    fn listed(&mut self, tool: &str, session: Option<&str>) -> String {
        let mut request = json!({"id": 4, "op": "tools"});
        if let Some(session) = session {
            request["session"] = json!(session);
        }
        let answer = self.ask(request);
        let tools = answer["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"));
        let found = tools.iter().find(|t| t["name"] == tool).unwrap();
        found["state"].as_str().unwrap().to_string()
    }

    /// A dry run of `tool`: `allow`/`deny` and the rule, or the refusal's error kind.
    fn decide(&mut self, tool: &str, session: Option<&str>, plan_mode: bool) -> String {
        let arguments = match tool {
            "sh" => json!({"script": "true"}),
            _ => json!({"text": "hi"}),
        };
        let mut request = json!({"id": 3, "op": "call", "tool": tool, "arguments": arguments,
            "dry_run": true, "plan_mode": plan_mode});
        if let Some(session) = session {
            request["session"] = json!(session);
        }
        let answer = self.ask(request);
        let result = &answer["result"];
        if let Some(dry) = result.get("dry_run") {
            return format!("{}:{}", dry["decision"].as_str().unwrap(), dry["rule"]);
        }
        let error = &result["error"];
        match error["state"].as_str() {
            Some(state) => format!("{}:{state}", error["kind"].as_str().unwrap()),
            None => error["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{answer}"))
                .to_string(),
        }
    }
}

fn error_kind(answer: &Value) -> &str {
    answer["error"]["kind"]
        .as_str()
        .unwrap_or_else(|| panic!("not a refusal: {answer}"))
}

#[test]
fn a_sessions_tool_state_holds_for_its_calls_only_and_goes_with_it() {
    let _guard = airlock_tests::shared();
    let daemon = Daemon::start_with(POLICY, &[]);
    let mut client = Client::connect(&daemon);
    let (one, two) = (client.open(false), client.open(false));
    let allowed = client.decide("echo", None, false);
    assert!(allowed.starts_with("allow:"), "{allowed}");

    let set = client.set_state("echo", "suspended", Some(&one));
    assert_eq!(
        set["result"],
        json!({"tool": "echo", "state": "suspended"}),
        "{set}"
    );
    assert_eq!(
        client.decide("echo", Some(&one), false),
        "tool_unavailable:suspended"
    );
    assert_eq!(client.decide("echo", Some(&two), false), allowed);
    assert_eq!(client.decide("echo", None, false), allowed);
    assert_eq!(client.decide("echo", Some("agent-label"), false), allowed);
    // The listing is the daemon-wide state, or with a session the one its calls see.
    assert_eq!(client.listed("echo", None), "active");
    assert_eq!(client.listed("echo", Some(&one)), "suspended");
    assert_eq!(client.listed("echo", Some(&two)), "active");
    assert_eq!(client.listed("echo", Some("agent-label")), "active");

    // The daemon-wide state reaches every session without its own; a session's wins.
    assert!(client.set_state("echo", "deferred", None)["result"].is_object());
    assert_eq!(
        client.decide("echo", Some(&two), false),
        "tool_unavailable:deferred"
    );
    assert_eq!(
        client.decide("echo", Some(&one), false),
        "tool_unavailable:suspended"
    );
    client.set_state("echo", "active", Some(&one));
    assert_eq!(client.decide("echo", Some(&one), false), allowed);
    assert_eq!(
        client.decide("echo", None, false),
        "tool_unavailable:deferred"
    );
    assert_eq!(client.listed("echo", Some(&one)), "active");
    assert_eq!(client.listed("echo", Some(&two)), "deferred");
    client.set_state("echo", "active", None);

    // Closing the session drops its settings, and a call still naming it is refused rather
    // than run with the daemon-wide ones (which would lift what the session had set).
    client.set_state("echo", "suspended", Some(&two));
    client.ask(json!({"id": 5, "op": "session_close", "session": two}));
    assert_eq!(client.decide("echo", Some(&two), false), "session_unknown");
    let gone = client.set_state("echo", "suspended", Some(&two));
    assert_eq!(error_kind(&gone), "session_unknown", "{gone}");
    // An id that never was a session is a label, as before.
    assert_eq!(client.decide("echo", Some("agent-label"), false), allowed);
    // A session opened afterwards starts with none.
    let three = client.open(false);
    assert_eq!(client.decide("echo", Some(&three), false), allowed);
}

#[test]
fn a_session_opened_in_plan_mode_runs_read_only_tools_only() {
    let _guard = airlock_tests::shared();
    let daemon = Daemon::start_with(POLICY, &[]);
    let mut client = Client::connect(&daemon);
    let (planning, free) = (client.open(true), client.open(false));
    // A call cannot lift its session's plan mode.
    assert_eq!(
        client.decide("sh", Some(&planning), false),
        "deny:\"plan_mode\""
    );
    assert!(
        client
            .decide("echo", Some(&planning), false)
            .starts_with("allow:")
    );
    assert!(
        client
            .decide("sh", Some(&free), false)
            .starts_with("allow:")
    );
    assert_eq!(client.decide("sh", Some(&free), true), "deny:\"plan_mode\"");
    // A real call is refused before it runs, with the rule that refused it.
    let refused = client.ask(json!({"id": 6, "op": "call", "tool": "sh",
        "arguments": {"script": "touch x"}, "session": planning}));
    assert_eq!(refused["result"]["error"]["kind"], "denied", "{refused}");
    assert_eq!(refused["result"]["error"]["rule"], "plan_mode", "{refused}");
    let changes = client.ask(json!({"id": 7, "op": "changes", "session": planning}));
    assert_eq!(changes["result"]["changes"], json!([]), "{changes}");
    // Closed, the planning session's calls do not quietly leave plan mode: they are refused.
    client.ask(json!({"id": 8, "op": "session_close", "session": planning}));
    let after = client.ask(json!({"id": 9, "op": "call", "tool": "sh",
        "arguments": {"script": "touch x"}, "session": planning}));
    assert_eq!(
        after["result"]["error"]["kind"], "session_unknown",
        "{after}"
    );
    assert_eq!(
        client.decide("echo", Some(&planning), false),
        "session_unknown"
    );
}

#[test]
fn bad_session_settings_are_typed_refusals() {
    let _guard = airlock_tests::shared();
    let daemon = Daemon::start_with(POLICY, &[]);
    let mut client = Client::connect(&daemon);
    let session = client.open(false);
    let forged = "0".repeat(32);
    assert_eq!(
        error_kind(&client.set_state("echo", "suspended", Some(&forged))),
        "session_unknown"
    );
    assert_eq!(
        error_kind(&client.set_state("nope", "suspended", Some(&session))),
        "unknown_tool"
    );
    assert_eq!(
        error_kind(&client.set_state("echo", "asleep", Some(&session))),
        "invalid_request"
    );
    assert_eq!(
        error_kind(&client.set_state("echo", "suspended", Some("two\nlines"))),
        "invalid_request"
    );
    assert_eq!(
        error_kind(&client.set_state("echo", "suspended", Some(""))),
        "invalid_request"
    );
    let bad = client.ask(json!({"id": 8, "op": "session_open", "plan_mode": "yes"}));
    assert_eq!(error_kind(&bad), "invalid_request", "{bad}");
    let bad = client.ask(json!({"id": 9, "op": "tools", "session": "two\nlines"}));
    assert_eq!(error_kind(&bad), "invalid_request", "{bad}");
    let bad = client.ask(json!({"id": 10, "op": "tools", "plan_mode": true}));
    assert_eq!(error_kind(&bad), "invalid_request", "{bad}");
    // None of it changed anything.
    assert!(
        client
            .decide("echo", Some(&session), false)
            .starts_with("allow:")
    );
}

#[test]
fn anyone_may_put_a_session_in_plan_mode_but_only_an_approver_may_lift_it() {
    let _guard = airlock_tests::shared();
    // Another uid is the approver: this client (the daemon's own uid) may connect and
    // call, but not lift.
    let daemon = Daemon::start_with(POLICY, &["--approver-uid", "4242"]);
    let mut client = Client::connect(&daemon);
    let (session, other) = (client.open(false), client.open(false));
    assert!(
        client
            .decide("sh", Some(&session), false)
            .starts_with("allow:")
    );
    let set =
        client.ask(json!({"id": 1, "op": "session_set", "session": session, "plan_mode": true}));
    assert_eq!(
        set["result"],
        json!({"session": session, "plan_mode": true}),
        "{set}"
    );
    assert_eq!(
        client.decide("sh", Some(&session), false),
        "deny:\"plan_mode\""
    );
    assert!(
        client
            .decide("echo", Some(&session), false)
            .starts_with("allow:")
    );
    assert!(
        client
            .decide("sh", Some(&other), false)
            .starts_with("allow:")
    );
    // Lifting it is refused to a peer that is not an approver, and changes nothing.
    let lift =
        client.ask(json!({"id": 2, "op": "session_set", "session": session, "plan_mode": false}));
    assert_eq!(error_kind(&lift), "forbidden", "{lift}");
    assert_eq!(
        client.decide("sh", Some(&session), false),
        "deny:\"plan_mode\""
    );
    // Not even for a session not in plan mode: the request itself is an approver's.
    let lift =
        client.ask(json!({"id": 3, "op": "session_set", "session": other, "plan_mode": false}));
    assert_eq!(error_kind(&lift), "forbidden", "{lift}");
    // Closed, the session's calls are refused, not run outside plan mode.
    client.ask(json!({"id": 4, "op": "session_close", "session": session}));
    assert_eq!(
        client.decide("sh", Some(&session), false),
        "session_unknown"
    );
    let gone =
        client.ask(json!({"id": 5, "op": "session_set", "session": session, "plan_mode": true}));
    assert_eq!(error_kind(&gone), "session_unknown", "{gone}");
    drop(daemon);

    // With this uid as the approver, it lifts.
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() }.to_string();
    let daemon = Daemon::start_with(POLICY, &["--approver-uid", &me]);
    let mut client = Client::connect(&daemon);
    let session = client.open(true);
    assert_eq!(
        client.decide("sh", Some(&session), false),
        "deny:\"plan_mode\""
    );
    let lift =
        client.ask(json!({"id": 6, "op": "session_set", "session": session, "plan_mode": false}));
    assert_eq!(
        lift["result"],
        json!({"session": session, "plan_mode": false}),
        "{lift}"
    );
    assert!(
        client
            .decide("sh", Some(&session), false)
            .starts_with("allow:")
    );
    // A call's own plan mode still holds.
    assert_eq!(
        client.decide("sh", Some(&session), true),
        "deny:\"plan_mode\""
    );
}

#[test]
fn bad_session_set_requests_are_refused() {
    let _guard = airlock_tests::shared();
    let daemon = Daemon::start_with(POLICY, &[]);
    let mut client = Client::connect(&daemon);
    let session = client.open(false);
    for bad in [
        json!({"id": 1, "op": "session_set", "session": session}),
        json!({"id": 2, "op": "session_set", "session": session, "plan_mode": "yes"}),
        json!({"id": 3, "op": "session_set", "session": session, "plan_mode": true, "tool": "sh"}),
        json!({"id": 4, "op": "session_set", "session": "", "plan_mode": true}),
        json!({"id": 5, "op": "session_set", "plan_mode": true}),
    ] {
        let answer = client.ask(bad.clone());
        assert_eq!(error_kind(&answer), "invalid_request", "{bad}: {answer}");
    }
    let forged = client
        .ask(json!({"id": 6, "op": "session_set", "session": "0".repeat(32), "plan_mode": true}));
    assert_eq!(error_kind(&forged), "session_unknown", "{forged}");
    assert!(
        client
            .decide("sh", Some(&session), false)
            .starts_with("allow:")
    );
}
