//! `airlock health`: a probe of a running daemon for a service manager or Kubernetes.
//! Exit 0 when it answers `health` and is ready (or only answers, with `--live`); exit 1
//! otherwise, with one line on stderr saying why.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use airlock::daemon::DAEMON_PROTOCOL_VERSION;

/// The most bytes of the answer read: a `health` answer is a few hundred.
const MAX_ANSWER_BYTES: u64 = 64 << 10;

/// Why the probe failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HealthError {
    /// Connecting to the socket failed.
    #[error("cannot connect to {socket}: {source}")]
    Connect {
        socket: String,
        source: std::io::Error,
    },
    /// Sending the request or reading the answer failed (a timeout too).
    #[error("no answer from {socket}: {source}")]
    Exchange {
        socket: String,
        source: std::io::Error,
    },
    /// The answer was not a `health` answer.
    #[error("the daemon's answer is not a health answer: {0}")]
    Answer(String),
    /// The daemon answers but is not ready.
    #[error("not ready: {0}")]
    NotReady(String),
}

/// Probes the daemon on `socket` within `timeout`; `live`: answering is enough.
pub(crate) fn run_health(socket: &Path, live: bool, timeout: Duration) -> ExitCode {
    match probe(socket, live, timeout) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock health: {e}");
            ExitCode::FAILURE
        }
    }
}

fn probe(socket: &Path, live: bool, timeout: Duration) -> Result<(), HealthError> {
    let name = || socket.display().to_string();
    let mut stream = UnixStream::connect(socket).map_err(|source| HealthError::Connect {
        socket: name(),
        source,
    })?;
    let exchange = |source| HealthError::Exchange {
        socket: name(),
        source,
    };
    // Zero would mean no timeout at all.
    let timeout = timeout.max(Duration::from_millis(1));
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(exchange)?;
    stream
        .write_all(b"{\"id\": \"probe\", \"op\": \"health\"}\n")
        .map_err(exchange)?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_ANSWER_BYTES))
        .read_line(&mut line)
        .map_err(exchange)?;
    verdict(&line, live)
}

/// The probe's verdict on the daemon's answer line.
fn verdict(line: &str, live: bool) -> Result<(), HealthError> {
    let answer: serde_json::Value = serde_json::from_str(line.trim())
        .map_err(|e| HealthError::Answer(format!("not JSON ({e})")))?;
    if let Some(error) = answer.get("error") {
        let message = error.get("message").and_then(|m| m.as_str()).unwrap_or("");
        return Err(HealthError::Answer(format!("refused: {message}")));
    }
    let result = answer
        .get("result")
        .ok_or_else(|| HealthError::Answer("no result".into()))?;
    if result.get("ok") != Some(&serde_json::Value::Bool(true)) {
        return Err(HealthError::Answer("ok is not true".into()));
    }
    let version = result.get("protocol_version").and_then(|v| v.as_u64());
    if version != Some(u64::from(DAEMON_PROTOCOL_VERSION)) {
        return Err(HealthError::Answer(format!(
            "protocol_version {version:?}, this airlock speaks {DAEMON_PROTOCOL_VERSION}"
        )));
    }
    if live {
        return Ok(());
    }
    match result.get("ready") {
        Some(serde_json::Value::Bool(true)) => Ok(()),
        Some(serde_json::Value::Bool(false)) => {
            let why = result.get("not_ready").and_then(|r| r.as_str());
            Err(HealthError::NotReady(
                why.unwrap_or("no reason given").into(),
            ))
        }
        // A daemon older than readiness: it cannot say, so it is not called ready.
        _ => Err(HealthError::NotReady(
            "the daemon does not report readiness (an older airlock)".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_ready_answer_of_this_protocol_passes() {
        let ready = r#"{"id":"probe","result":{"ok":true,"protocol_version":1,"ready":true,"not_ready":null}}"#;
        let warming = r#"{"id":"probe","result":{"ok":true,"protocol_version":1,"ready":false,"not_ready":"pools warming"}}"#;
        let old = r#"{"id":"probe","result":{"ok":true,"protocol_version":1}}"#;
        let other = r#"{"id":"probe","result":{"ok":true,"protocol_version":2,"ready":true}}"#;
        let refused = r#"{"id":null,"error":{"kind":"forbidden","message":"no"}}"#;
        assert!(verdict(ready, false).is_ok());
        assert!(verdict(warming, true).is_ok());
        assert!(
            matches!(verdict(warming, false), Err(HealthError::NotReady(m)) if m == "pools warming")
        );
        assert!(verdict(old, false).is_err());
        assert!(verdict(old, true).is_ok());
        assert!(verdict(other, true).is_err());
        assert!(verdict(refused, true).is_err());
        assert!(verdict("", true).is_err());
        assert!(verdict("{", true).is_err());
    }
}
