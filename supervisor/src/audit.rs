//! Events and the audit log: one record per decision and per outcome, carrying ids, tool
//! names, digests and outcomes — never raw arguments or outputs unless the policy opts in,
//! and never a control character or terminal escape sequence.

use std::io::Write;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use airlock_policy::rules::Decision;
use serde::Serialize;

use crate::result::{Denial, ErrorKind, LandlockLevel, ToolResult};

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventKind {
    /// The call passed the gate and is about to run.
    #[serde(rename = "tool.called")]
    Called,
    /// It finished successfully.
    #[serde(rename = "tool.completed")]
    Completed,
    /// An attempt (or the call) failed.
    #[serde(rename = "tool.failed")]
    Failed,
    /// The gate refused it.
    #[serde(rename = "denied")]
    Denied,
    /// It was turned away before it ran: invalid input, an unknown tool, a rate limit, an
    /// overloaded daemon (`outcome` names which).
    #[serde(rename = "tool.refused")]
    Refused,
    /// It waits for a human approval.
    #[serde(rename = "approval.required")]
    ApprovalRequired,
    /// An approval was executed.
    #[serde(rename = "approval.granted")]
    ApprovalGranted,
    /// An approval was rejected.
    #[serde(rename = "approval.rejected")]
    ApprovalRejected,
    /// The egress proxy let a connection through (`network` says where, by which rule,
    /// and how many bytes went each way).
    #[serde(rename = "network.allowed")]
    NetworkAllowed,
    /// The egress proxy refused a connection (`network` says where and why).
    #[serde(rename = "network.denied")]
    NetworkDenied,
}

/// One egress connection, for `network.*` events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetworkRecord {
    /// The host as the tool asked for it.
    pub host: String,
    /// The port as asked.
    pub port: u16,
    /// The address connected to (or refused).
    pub address: Option<String>,
    /// The rule that let it through, or why it was refused.
    pub rule: String,
    /// Bytes sent upstream.
    pub bytes_up: u64,
    /// Bytes received from upstream.
    pub bytes_down: u64,
}

/// Isolation in brief, for audit records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IsolationSummary {
    /// Landlock level.
    pub landlock: LandlockLevel,
    /// Whether a seccomp filter was installed.
    pub seccomp: bool,
    /// cgroup version, if limits applied.
    pub cgroup: Option<String>,
}

/// One event (and one audit line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// What happened.
    pub event: EventKind,
    /// Call id.
    pub call_id: String,
    /// Session, if any.
    pub session: Option<String>,
    /// Tool name.
    pub tool: String,
    /// The gate's decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// The rule that decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// SHA-256 of the canonical validated input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_digest: Option<String>,
    /// Approval id, for approval events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    /// `ok` or the error kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Duration so far, milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Attempts so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Isolation applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation: Option<IsolationSummary>,
    /// Sanitised arguments, only with `audit.include_input = true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// The connection of a `network.*` event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkRecord>,
    /// What was refused during the call (the result's `denials`), on a call's last event.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub denials: Vec<Denial>,
}

impl Event {
    /// A bare event for a call.
    pub fn new(event: EventKind, call_id: &str, session: Option<&str>, tool: &str) -> Self {
        let time_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            time_ms,
            event,
            call_id: sanitize(call_id),
            session: session.map(sanitize),
            tool: sanitize(tool),
            decision: None,
            rule: None,
            input_digest: None,
            approval_id: None,
            outcome: None,
            duration_ms: None,
            attempts: None,
            isolation: None,
            input: None,
            network: None,
            denials: Vec::new(),
        }
    }

    /// The `network.allowed` or `network.denied` event of one egress connection. Host and
    /// reason come from the tool's request: sanitised like every other text from it.
    pub fn network(
        call_id: &str,
        session: Option<&str>,
        tool: &str,
        connection: &crate::egress::EgressEvent,
    ) -> Self {
        let kind = if connection.allowed {
            EventKind::NetworkAllowed
        } else {
            EventKind::NetworkDenied
        };
        let mut event = Self::new(kind, call_id, session, tool);
        event.network = Some(NetworkRecord {
            host: sanitize(&connection.host),
            port: connection.port,
            address: connection.address.map(|a| a.to_string()),
            rule: sanitize(&connection.rule_or_reason),
            bytes_up: connection.bytes_up,
            bytes_down: connection.bytes_down,
        });
        event
    }

    /// Adds the outcome fields of a result.
    pub fn with_result(mut self, result: &ToolResult) -> Self {
        self.outcome = Some(match &result.error {
            None => "ok".to_string(),
            Some(e) => outcome_name(e.kind),
        });
        self.duration_ms = Some(result.duration_ms);
        self.attempts = Some(result.attempts);
        self.isolation = result.isolation.as_ref().map(|isolation| IsolationSummary {
            landlock: isolation.landlock,
            seccomp: isolation.seccomp.is_some(),
            cgroup: isolation.cgroup.clone(),
        });
        // Destinations and reasons come from the tool's requests: sanitised like its other
        // text.
        self.denials = result
            .denials
            .iter()
            .map(|d| Denial {
                object: sanitize(&d.object),
                rule: d.rule.as_deref().map(sanitize),
                ..d.clone()
            })
            .collect();
        self
    }
}

/// The snake_case name of an error kind.
pub fn outcome_name(kind: ErrorKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "error".to_string())
}

/// Removes terminal escape sequences and every control character, so text from tools or
/// callers can neither forge audit lines nor drive an operator's terminal.
pub fn sanitize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI (ESC [ ... final byte) and OSC (ESC ] ... BEL or ESC \) sequences.
            match chars.peek() {
                Some('[') => {
                    chars.next();
                    for n in chars.by_ref() {
                        if ('@'..='~').contains(&n) {
                            break;
                        }
                    }
                }
                Some(']') => {
                    chars.next();
                    while let Some(n) = chars.next() {
                        if n == '\u{7}' || (n == '\u{1b}' && chars.peek() == Some(&'\\')) {
                            break;
                        }
                    }
                }
                _ => {
                    chars.next();
                }
            }
            continue;
        }
        if !c.is_control() {
            out.push(c);
        }
    }
    out
}

/// Writes events as JSON lines (to a file or stderr). Write errors are logged, never fatal.
pub struct AuditSink {
    writer: Mutex<Box<dyn Write + Send>>,
}

impl std::fmt::Debug for AuditSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuditSink")
    }
}

impl AuditSink {
    /// Appends to `path` (created with mode 0600).
    pub fn open_file(path: &std::path::Path) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        Ok(Self::to_writer(Box::new(file)))
    }

    /// Writes to any writer (stderr, a buffer in tests).
    pub fn to_writer(writer: Box<dyn Write + Send>) -> Self {
        Self {
            writer: Mutex::new(writer),
        }
    }

    /// Writes one record.
    pub fn record(&self, event: &Event) {
        let Ok(mut line) = serde_json::to_vec(event) else {
            return;
        };
        line.push(b'\n');
        let Ok(mut writer) = self.writer.lock() else {
            return;
        };
        if let Err(e) = writer.write_all(&line).and_then(|()| writer.flush()) {
            tracing::warn!(error = %e, "cannot write the audit log");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_strips_controls_and_escape_sequences() {
        assert_eq!(
            sanitize("ok\u{1b}[31mred\u{1b}[0m\nnext\r\u{7}"),
            "okrednext"
        );
        assert_eq!(sanitize("a\u{1b}]0;title\u{7}b"), "ab");
        assert_eq!(sanitize("tab\there"), "tabhere");
        assert_eq!(sanitize("plain ünïcode"), "plain ünïcode");
    }
}
