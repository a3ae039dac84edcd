//! `airlock run --socket`: one tool call through a running `airlock serve` instead of a
//! supervisor of this process. The daemon's gate and pooled workers do the work, so a shell
//! script pays for a client's start and a pooled call rather than for a supervisor's start,
//! a policy's load and a cold worker. The daemon's policy, limits and audit apply; the
//! record printed and the exit codes are those of a one-shot `airlock run`.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;

use airlock::daemon::{CallRequest, Op};
use serde_json::Value;

/// The most bytes of the answer read: more than any record the daemon sends (two streams
/// of at most 64 MiB each, escaped as JSON text), so only a broken peer reaches it.
const MAX_ANSWER_BYTES: u64 = 1 << 30;

/// The request's id: the connection carries this one request.
const REQUEST_ID: u64 = 1;

/// Why the call got no result record from the daemon.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RemoteError {
    /// Connecting to the socket failed.
    #[error("cannot connect to {socket}: {error}")]
    Connect {
        socket: String,
        error: std::io::Error,
    },
    /// Sending the request or reading the answer failed.
    #[error("no answer from {socket}: {error}")]
    Exchange {
        socket: String,
        error: std::io::Error,
    },
    /// The daemon closed the connection without answering.
    #[error("{socket} closed the connection without answering")]
    NoAnswer { socket: String },
    /// The daemon answered an error instead of a result (`invalid_request`, `forbidden`,
    /// `session_unknown`, ...).
    #[error("the daemon refused the request ({kind}): {message}")]
    Refused { kind: String, message: String },
    /// The answer is not what the protocol says a call answers.
    #[error("the daemon's answer is not a call's answer: {0}")]
    Answer(String),
    /// The request could not be encoded.
    #[error("cannot encode the request: {0}")]
    Encode(String),
}

/// What the daemon answered a `call`.
#[derive(Debug, PartialEq)]
pub(crate) enum Answer {
    /// A result record; `ok` is its verdict.
    Record { record: Value, ok: bool },
    /// A dry run's plan (a refusal answers a record instead).
    Plan(Value),
}

/// The call `airlock run --socket` sends.
pub(crate) struct RemoteCall {
    pub tool: String,
    pub arguments_json: String,
    pub call_id: Option<String>,
    pub session: Option<String>,
    pub plan_mode: bool,
    pub dry_run: bool,
}

/// Sends `call` to the daemon on `socket`, prints what it answers as `airlock run` does and
/// returns its exit code: 0 the call succeeded (or a dry run was planned), 1 it did not.
pub(crate) fn run_remote(socket: &Path, call: RemoteCall) -> anyhow::Result<ExitCode> {
    let line = request_line(call)?;
    let answer = exchange(socket, &line)?;
    let (value, code) = match verdict(&answer)? {
        Answer::Record { record, ok } => (record, if ok { 0 } else { 1 }),
        Answer::Plan(plan) => (plan, 0),
    };
    crate::write_stdout(&format!("{}\n", serde_json::to_string_pretty(&value)?))?;
    Ok(ExitCode::from(code))
}

/// The request as one JSON line. The arguments travel as text: the daemon parses them under
/// its own limits, exactly as a one-shot gate would.
fn request_line(call: RemoteCall) -> Result<String, RemoteError> {
    let op = Op::Call(CallRequest {
        tool: call.tool,
        arguments: None,
        arguments_json: Some(call.arguments_json),
        call_id: call.call_id,
        session: call.session,
        plan_mode: call.plan_mode,
        timeout_ms: None,
        dry_run: call.dry_run,
    });
    let text = serde_json::to_string(&op).map_err(|e| RemoteError::Encode(e.to_string()))?;
    // `id` first, so that even a request the daemon cannot read whole is answered by it.
    let Some(fields) = text.strip_prefix('{') else {
        return Err(RemoteError::Answer(
            "a request that is not an object".into(),
        ));
    };
    let mut line = format!("{{\"id\":{REQUEST_ID},{fields}");
    line.push('\n');
    Ok(line)
}

/// Writes the request and reads the one answer line. No timeout: the daemon ends every call
/// by its deadline, and a client that gives up (Ctrl-C) closes the connection, which
/// cancels the call.
fn exchange(socket: &Path, line: &str) -> Result<String, RemoteError> {
    let name = || socket.display().to_string();
    let mut stream = UnixStream::connect(socket).map_err(|error| RemoteError::Connect {
        socket: name(),
        error,
    })?;
    let failed = |error| RemoteError::Exchange {
        socket: name(),
        error,
    };
    stream.write_all(line.as_bytes()).map_err(failed)?;
    let mut answer = String::new();
    BufReader::new((&stream).take(MAX_ANSWER_BYTES))
        .read_line(&mut answer)
        .map_err(failed)?;
    if answer.is_empty() {
        return Err(RemoteError::NoAnswer { socket: name() });
    }
    if !answer.ends_with('\n') {
        return Err(RemoteError::Answer(
            if answer.len() as u64 >= MAX_ANSWER_BYTES {
                format!("longer than {MAX_ANSWER_BYTES} bytes")
            } else {
                "cut off before its end".into()
            },
        ));
    }
    Ok(answer)
}

/// What the daemon's answer line says: a record, a plan, or why there is neither.
pub(crate) fn verdict(line: &str) -> Result<Answer, RemoteError> {
    let answer: Value = serde_json::from_str(line.trim())
        .map_err(|e| RemoteError::Answer(format!("not JSON ({e})")))?;
    let Value::Object(mut answer) = answer else {
        return Err(RemoteError::Answer("not an object".into()));
    };
    if let Some(error) = answer.get("error") {
        let text = |key: &str| {
            error
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or("(not given)")
                .to_string()
        };
        return Err(RemoteError::Refused {
            kind: text("kind"),
            message: text("message"),
        });
    }
    if answer.get("id") != Some(&Value::from(REQUEST_ID)) {
        return Err(RemoteError::Answer(format!(
            "it answers id {}, the request was {REQUEST_ID}",
            answer.get("id").unwrap_or(&Value::Null)
        )));
    }
    let Some(Value::Object(mut result)) = answer.remove("result") else {
        return Err(RemoteError::Answer("no result object".into()));
    };
    if result.len() == 1
        && let Some(plan) = result.remove("dry_run")
    {
        return Ok(Answer::Plan(plan));
    }
    let Some(&Value::Bool(ok)) = result.get("ok") else {
        return Err(RemoteError::Answer("the result has no boolean ok".into()));
    };
    Ok(Answer::Record {
        record: Value::Object(result),
        ok,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> RemoteCall {
        RemoteCall {
            tool: "wc".into(),
            arguments_json: r#"{"text": "a b"}"#.into(),
            call_id: Some("c-1".into()),
            session: None,
            plan_mode: true,
            dry_run: false,
        }
    }

    #[test]
    fn the_request_is_one_line_with_its_id_first_and_the_arguments_as_text() {
        let line = request_line(call()).unwrap();
        assert!(line.starts_with(r#"{"id":1,"#), "{line}");
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
        let parsed: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed["op"], "call");
        assert_eq!(parsed["tool"], "wc");
        assert_eq!(parsed["arguments_json"], r#"{"text": "a b"}"#);
        assert_eq!(parsed["call_id"], "c-1");
        assert_eq!(parsed["plan_mode"], true);
        assert!(parsed.get("session").is_none() && parsed.get("arguments").is_none());
    }

    #[test]
    fn a_record_answer_keeps_its_verdict() {
        let ok = verdict(r#"{"id":1,"result":{"ok":true,"stdout":"x"}}"#).unwrap();
        assert!(matches!(ok, Answer::Record { ok: true, .. }));
        let failed = verdict(r#"{"id":1,"result":{"ok":false,"error":{"kind":"timeout"}}}"#);
        assert!(matches!(failed.unwrap(), Answer::Record { ok: false, .. }));
    }

    #[test]
    fn a_dry_run_answer_is_its_plan() {
        let plan = verdict(r#"{"id":1,"result":{"dry_run":{"decision":"allow"}}}"#).unwrap();
        assert_eq!(plan, Answer::Plan(serde_json::json!({"decision": "allow"})));
    }

    #[test]
    fn an_error_answer_names_its_kind_and_message() {
        let refused = verdict(
            r#"{"error":{"kind":"forbidden","message":"uid 7 may not connect"},"id":null}"#,
        )
        .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "the daemon refused the request (forbidden): uid 7 may not connect"
        );
    }

    #[test]
    fn answers_that_are_not_a_calls_answer_are_refused() {
        for line in [
            "not json",
            "[1]",
            r#"{"id":2,"result":{"ok":true}}"#,
            r#"{"id":1}"#,
            r#"{"id":1,"result":{"stdout":""}}"#,
            r#"{"id":1,"result":{"ok":"yes"}}"#,
            r#"{"id":1,"result":[]}"#,
        ] {
            assert!(
                matches!(verdict(line), Err(RemoteError::Answer(_))),
                "{line}"
            );
        }
    }
}
