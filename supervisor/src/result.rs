//! The one result record returned for every outcome of a call. Its JSON field
//! names are a contract with users and tests.

use airlock_policy::validate::ToolState;
use serde::Serialize;

use crate::egress::EgressSummary;

/// What kind of failure a call ended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Arguments were not JSON, too large or deep, or failed the schema.
    InvalidInput,
    /// No tool of that name.
    UnknownTool,
    /// The tool exists but is deferred or suspended (`state` says which).
    ToolUnavailable,
    /// A rule refused the call.
    Denied,
    /// The call needs a human approval first.
    ApprovalRequired,
    /// The approval is expired, unknown, used, or no longer matches.
    ApprovalInvalid,
    /// The deadline passed; everything was killed.
    Timeout,
    /// The memory limit was hit and the kernel killed a process.
    OutOfMemory,
    /// The process limit was hit.
    PidsLimit,
    /// The tool used up its CPU time (`limits.cpu`, RLIMIT_CPU) and the kernel killed it.
    CpuTimeLimit,
    /// The tool wrote past its file size limit (`limits.file_size`, RLIMIT_FSIZE): SIGXFSZ.
    FileSizeLimit,
    /// The seccomp filter killed the tool.
    SeccompViolation,
    /// The tool exited non-zero or died of a signal.
    ToolFailed,
    /// The output did not match the tool's output schema.
    OutputInvalid,
    /// The worker broke the protocol and was killed.
    ProtocolViolation,
    /// A required isolation layer could not be set up.
    SandboxUnavailable,
    /// The caller cancelled.
    Cancelled,
    /// Too many calls in flight.
    Overloaded,
    /// A rate limit was exceeded.
    RateLimited,
    /// The session's workspace is at its size or inode limit.
    WorkspaceFull,
    /// The call names no open session, and its tool's profile has a workspace.
    SessionUnknown,
    /// As many sessions are open as the policy's `max_sessions`.
    SessionLimit,
}

/// One schema violation (pointer and keyword, never the value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InputViolation {
    /// JSON pointer.
    pub path: String,
    /// The failed keyword.
    pub keyword: String,
    /// Safe message.
    pub message: String,
}

/// A typed error with a safe message and kind-specific fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolError {
    /// The kind.
    pub kind: ErrorKind,
    /// A message without raw arguments.
    pub message: String,
    /// `invalid_input`: where the input was wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub violations: Option<Vec<InputViolation>>,
    /// `seccomp_violation`: the syscall, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscall: Option<String>,
    /// `sandbox_unavailable` / `protocol_violation`: the step that failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// `timeout`: the deadline, milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `denied`: the rule that fired.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// `overloaded`: how long to wait before trying again, milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// `tool_unavailable`: the tool's state (`deferred` or `suspended`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<ToolState>,
    /// A transient failure (e.g. EAGAIN at spawn) that a retry in a fresh worker may fix.
    #[serde(skip)]
    pub transient: bool,
}

impl ToolError {
    /// Whether the attempt may be retried in a fresh worker: a tool failure, or a transient
    /// failure to start one. Never invalid input, a denial, a timeout, a cancellation, a
    /// missing sandbox layer or a limit (memory, processes, seccomp): another worker would
    /// meet the same end.
    pub fn is_retryable(&self) -> bool {
        self.kind == ErrorKind::ToolFailed || self.transient
    }

    /// An error with only a kind and message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            violations: None,
            syscall: None,
            step: None,
            timeout_ms: None,
            rule: None,
            retry_after_ms: None,
            state: None,
            transient: false,
        }
    }
}

/// The layer that refused something during a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DenialLayer {
    /// The seccomp filter refused a syscall.
    Seccomp,
    /// Landlock refused an access.
    Landlock,
    /// A path the tool looked up is not in the sandbox's mount plan.
    Mounts,
    /// The egress proxy refused a destination.
    Network,
    /// A limit refused (a fork, output past the bound) or ended the call.
    Limit,
}

impl DenialLayer {
    /// The layer's name as the record spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Seccomp => "seccomp",
            Self::Landlock => "landlock",
            Self::Mounts => "mounts",
            Self::Network => "network",
            Self::Limit => "limit",
        }
    }
}

/// One kind of refusal during a call, counted: which layer refused what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Denial {
    /// The layer.
    pub layer: DenialLayer,
    /// What was refused: a syscall's name (`syscall_<nr>` for a number without one, `other`
    /// for refusals past the list's bound), a destination `host:port`, or a limit's name
    /// (`memory`, `pids`, `cpu_time`, `file_size`, `output`, `deadline`).
    pub object: String,
    /// `seccomp`: the errno the syscall got (`EPERM`, `ENOSYS`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<String>,
    /// `seccomp`: the argument rule that refused it; `network`: the refusal's reason;
    /// `limit`: the stream (`stdout`, `stderr`) for `output`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// How many times.
    pub count: u64,
}

/// Whether a layer's refusals can appear in a call's `denials`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Coverage {
    /// Every refusal of this layer is listed.
    Reported,
    /// This layer's refusals cannot be observed here; an empty list says nothing of them.
    Unavailable,
}

/// Per layer, whether `denials` can show its refusals for this call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DenialReporting {
    /// Reported when the filter was installed with a listener.
    pub seccomp: Coverage,
    /// Not observed by airlock (the kernel reports Landlock denials to the audit log only).
    pub landlock: Coverage,
    /// Not observed: seeing lookups of missing paths would take tracing the tool.
    pub mounts: Coverage,
    /// Reported for a profile with an egress allowlist (its proxy refuses); with no
    /// network at all nothing answers a connection to refuse it.
    pub network: Coverage,
    /// Reported: the cgroup counters and the way the tool ended say which limit.
    pub limits: Coverage,
}

impl Default for DenialReporting {
    fn default() -> Self {
        Self {
            seccomp: Coverage::Unavailable,
            landlock: Coverage::Unavailable,
            mounts: Coverage::Unavailable,
            network: Coverage::Unavailable,
            limits: Coverage::Unavailable,
        }
    }
}

/// Resource usage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// CPU time of the tool and its descendants (user + system), milliseconds.
    pub cpu_ms: u64,
    /// Peak memory of the worker's cgroup, bytes (when the kernel reports it).
    pub peak_memory_bytes: Option<u64>,
}

/// Landlock enforcement level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LandlockLevel {
    /// Every right the kernel can restrict is restricted.
    Full,
    /// Some rights could not be restricted (best effort only).
    Partial,
    /// Not applied.
    None,
}

/// Limits applied to the call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AppliedLimits {
    /// cgroup memory limit.
    pub memory_bytes: u64,
    /// cgroup pids limit.
    pub pids: u64,
    /// Deadline.
    pub timeout_ms: u64,
    /// Output kept per stream.
    pub output_bytes: u64,
}

/// The isolation actually applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Isolation {
    /// `airlock`, or `unsafe_local` for the explicitly chosen unisolated backend.
    pub backend: String,
    /// Namespaces entered.
    pub namespaces: Vec<String>,
    /// Landlock ABI (0 = none).
    pub landlock_abi: u32,
    /// Landlock level.
    pub landlock: LandlockLevel,
    /// seccomp filter digest (hex SHA-256), when installed.
    pub seccomp: Option<String>,
    /// cgroup version (`v1` | `v2`), when limits were applied.
    pub cgroup: Option<String>,
    /// The limits.
    pub limits: AppliedLimits,
    /// Which layers' refusals the call's `denials` can show.
    pub denial_reporting: DenialReporting,
    /// For a call in a session: how its workspace holds the session's base (`overlay`,
    /// `copy`, or `empty` when it has none).
    pub workspace: Option<String>,
}

impl Default for Isolation {
    fn default() -> Self {
        Self {
            backend: "airlock".to_string(),
            namespaces: Vec::new(),
            landlock_abi: 0,
            landlock: LandlockLevel::None,
            seccomp: None,
            cgroup: None,
            limits: AppliedLimits::default(),
            denial_reporting: DenialReporting::default(),
            workspace: None,
        }
    }
}

/// The result of one call, whatever happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolResult {
    /// The call's id.
    pub call_id: String,
    /// The tool (or `exec` for `airlock exec`).
    pub tool: String,
    /// Success.
    pub ok: bool,
    /// A tool with an output schema: its stdout, parsed and checked (`stdout` is then
    /// empty). Otherwise none: the output is `stdout`.
    pub output: Option<serde_json::Value>,
    /// The error when not ok.
    pub error: Option<ToolError>,
    /// Exit code of the tool, when it exited.
    pub exit_code: Option<i32>,
    /// Signal that killed the tool, when one did.
    pub signal: Option<i32>,
    /// Captured stdout (lossy UTF-8), bounded.
    pub stdout: String,
    /// Captured stderr (lossy UTF-8), bounded.
    pub stderr: String,
    /// stdout was cut at the limit.
    pub stdout_truncated: bool,
    /// stderr was cut at the limit.
    pub stderr_truncated: bool,
    /// Wall-clock duration, milliseconds.
    pub duration_ms: u64,
    /// Attempts made.
    pub attempts: u32,
    /// Resource usage.
    pub usage: Usage,
    /// Isolation applied; none for a call that never got a worker (refused, cancelled or
    /// out of time before one was made), rather than numbers pretending otherwise.
    pub isolation: Option<Isolation>,
    /// What the egress proxy let through and refused, for a profile with an allowlist.
    pub network: Option<EgressSummary>,
    /// What was refused during the call, by layer, de-duplicated and counted (bounded);
    /// `isolation.denial_reporting` says which layers can appear.
    pub denials: Vec<Denial>,
}

impl ToolResult {
    /// A failed result that never reached a sandbox.
    pub fn rejected(call_id: &str, tool: &str, error: ToolError) -> Self {
        Self {
            call_id: call_id.to_string(),
            tool: tool.to_string(),
            ok: false,
            output: None,
            error: Some(error),
            exit_code: None,
            signal: None,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 0,
            attempts: 0,
            usage: Usage::default(),
            isolation: None,
            network: None,
            denials: Vec::new(),
        }
    }

    /// The isolation record, made (with nothing applied yet) if the call had none.
    pub fn isolation_mut(&mut self) -> &mut Isolation {
        self.isolation.get_or_insert_with(Isolation::default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tool_failures_and_transient_starts_are_retried() {
        let table = [
            (ErrorKind::ToolFailed, true),
            (ErrorKind::InvalidInput, false),
            (ErrorKind::UnknownTool, false),
            (ErrorKind::ToolUnavailable, false),
            (ErrorKind::Denied, false),
            (ErrorKind::ApprovalRequired, false),
            (ErrorKind::ApprovalInvalid, false),
            (ErrorKind::Timeout, false),
            (ErrorKind::Cancelled, false),
            (ErrorKind::SandboxUnavailable, false),
            (ErrorKind::OutOfMemory, false),
            (ErrorKind::SeccompViolation, false),
            (ErrorKind::PidsLimit, false),
            (ErrorKind::CpuTimeLimit, false),
            (ErrorKind::FileSizeLimit, false),
            (ErrorKind::OutputInvalid, false),
            (ErrorKind::ProtocolViolation, false),
            (ErrorKind::Overloaded, false),
            (ErrorKind::RateLimited, false),
            (ErrorKind::WorkspaceFull, false),
            (ErrorKind::SessionUnknown, false),
            (ErrorKind::SessionLimit, false),
        ];
        for (kind, retried) in table {
            assert_eq!(ToolError::new(kind, "").is_retryable(), retried, "{kind:?}");
        }
        let transient = ToolError {
            transient: true,
            ..ToolError::new(ErrorKind::SandboxUnavailable, "EAGAIN at spawn")
        };
        assert!(transient.is_retryable());
    }

    /// Every key of `value`'s objects, as `path.key`, sorted.
    fn keys(value: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        if let serde_json::Value::Array(items) = value {
            for item in items {
                keys(item, &format!("{path}[]"), out);
            }
        }
        if let serde_json::Value::Object(map) = value {
            for (key, child) in map {
                let at = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                keys(child, &at, out);
                out.push(at);
            }
        }
    }

    #[test]
    fn the_result_records_json_field_names_are_a_fixed_contract() {
        let mut result = ToolResult::rejected(
            "c1",
            "t",
            ToolError {
                violations: Some(vec![InputViolation {
                    path: "/a".into(),
                    keyword: "type".into(),
                    message: "m".into(),
                }]),
                syscall: Some("ptrace".into()),
                step: Some("spawn".into()),
                timeout_ms: Some(1),
                rule: Some("r".into()),
                retry_after_ms: Some(2),
                state: Some(ToolState::Deferred),
                transient: true,
                ..ToolError::new(ErrorKind::ToolFailed, "m")
            },
        );
        result.isolation = Some(Isolation::default());
        result.network = Some(crate::egress::EgressSummary {
            events: vec![crate::egress::EgressEvent {
                kind: crate::egress::proxy::EgressKind::Connect,
                host: "example.com".into(),
                port: 443,
                address: Some(([192, 0, 2, 1], 443).into()),
                allowed: true,
                rule_or_reason: "example.com".into(),
                bytes_up: 1,
                bytes_down: 2,
                end: Some(crate::egress::proxy::TunnelEnd::Closed),
                error: Some("reset".into()),
            }],
            ..Default::default()
        });
        result.denials = vec![Denial {
            layer: DenialLayer::Seccomp,
            object: "ptrace".into(),
            errno: Some("EPERM".into()),
            rule: Some("r".into()),
            count: 1,
        }];
        let json = serde_json::to_value(&result).expect("serialises");
        let mut found = Vec::new();
        keys(&json, "", &mut found);
        found.sort();
        found.dedup();
        let expected = [
            "attempts",
            "call_id",
            "denials",
            "denials[].count",
            "denials[].errno",
            "denials[].layer",
            "denials[].object",
            "denials[].rule",
            "duration_ms",
            "error",
            "error.kind",
            "error.message",
            "error.retry_after_ms",
            "error.rule",
            "error.state",
            "error.step",
            "error.syscall",
            "error.timeout_ms",
            "error.violations",
            "error.violations[].keyword",
            "error.violations[].message",
            "error.violations[].path",
            "exit_code",
            "isolation",
            "isolation.backend",
            "isolation.cgroup",
            "isolation.denial_reporting",
            "isolation.denial_reporting.landlock",
            "isolation.denial_reporting.limits",
            "isolation.denial_reporting.mounts",
            "isolation.denial_reporting.network",
            "isolation.denial_reporting.seccomp",
            "isolation.landlock",
            "isolation.landlock_abi",
            "isolation.limits",
            "isolation.limits.memory_bytes",
            "isolation.limits.output_bytes",
            "isolation.limits.pids",
            "isolation.limits.timeout_ms",
            "isolation.namespaces",
            "isolation.seccomp",
            "isolation.workspace",
            "network",
            "network.bytes_down",
            "network.bytes_up",
            "network.connections",
            "network.events",
            "network.events[].address",
            "network.events[].allowed",
            "network.events[].bytes_down",
            "network.events[].bytes_up",
            "network.events[].end",
            "network.events[].error",
            "network.events[].host",
            "network.events[].kind",
            "network.events[].port",
            "network.events[].rule_or_reason",
            "network.events_omitted",
            "network.failed",
            "network.refused",
            "ok",
            "output",
            "signal",
            "stderr",
            "stderr_truncated",
            "stdout",
            "stdout_truncated",
            "tool",
            "usage",
            "usage.cpu_ms",
            "usage.peak_memory_bytes",
        ];
        assert_eq!(
            found, expected,
            "a renamed, added or removed field is a contract change"
        );
        let kinds = [
            (ErrorKind::InvalidInput, "invalid_input"),
            (ErrorKind::UnknownTool, "unknown_tool"),
            (ErrorKind::ToolUnavailable, "tool_unavailable"),
            (ErrorKind::Denied, "denied"),
            (ErrorKind::ApprovalRequired, "approval_required"),
            (ErrorKind::ApprovalInvalid, "approval_invalid"),
            (ErrorKind::Timeout, "timeout"),
            (ErrorKind::OutOfMemory, "out_of_memory"),
            (ErrorKind::PidsLimit, "pids_limit"),
            (ErrorKind::CpuTimeLimit, "cpu_time_limit"),
            (ErrorKind::FileSizeLimit, "file_size_limit"),
            (ErrorKind::SeccompViolation, "seccomp_violation"),
            (ErrorKind::ToolFailed, "tool_failed"),
            (ErrorKind::OutputInvalid, "output_invalid"),
            (ErrorKind::ProtocolViolation, "protocol_violation"),
            (ErrorKind::SandboxUnavailable, "sandbox_unavailable"),
            (ErrorKind::Cancelled, "cancelled"),
            (ErrorKind::Overloaded, "overloaded"),
            (ErrorKind::RateLimited, "rate_limited"),
            (ErrorKind::WorkspaceFull, "workspace_full"),
            (ErrorKind::SessionUnknown, "session_unknown"),
            (ErrorKind::SessionLimit, "session_limit"),
        ];
        for (kind, name) in kinds {
            assert_eq!(serde_json::to_value(kind).expect("serialises"), name);
        }
    }
}
