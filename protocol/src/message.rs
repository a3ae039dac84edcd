//! The messages of the supervisor↔worker conversation, in the order they are exchanged.
//!
//! Handshake: the worker speaks first with [`WorkerMessage::Hello`]; the supervisor answers
//! [`SupervisorMessage::Hello`] with the same version, then sends `Setup`. The worker
//! confines itself (it may send `Log` records meanwhile) and reports `Ready` (or
//! `SetupFailed`, after which it exits), then waits for `Run`. For each run it may send `Log`
//! records, then exactly one `Exited` or `RunFailed`. While a run is going on the supervisor
//! may send `Stop` (its deadline passed, or the call was cancelled): the worker ends the tool
//! and everything it started and reports `Exited` with what the tool wrote until then.
//! `Shutdown` ends the conversation and may be sent at any point. Anything else is a
//! protocol violation.
//!
//! Each side checks this order as it reads: the supervisor (`airlock`'s `sandbox`) ends a
//! worker that breaks it, the worker (`airlock-worker`'s `serve`) exits. [`crate::frame`]
//! carries each message in one length-prefixed frame.

use serde::{Deserialize, Serialize};

use crate::spec::SandboxSpec;

/// Version of this protocol; both sides must agree exactly.
pub const PROTOCOL_VERSION: u32 = 10;

/// Messages sent by the (trusted) supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SupervisorMessage {
    /// Answer to the worker's hello.
    Hello {
        /// Must equal [`PROTOCOL_VERSION`].
        version: u32,
    },
    /// The sandbox to build; the worker confines itself and answers `Ready` or `SetupFailed`.
    Setup(Box<SandboxSpec>),
    /// Run one tool call inside the confined worker.
    Run(RunRequest),
    /// End the conversation; the worker exits.
    Shutdown,
    /// End the run going on now: kill the tool and everything it started, then report
    /// `Exited` (with `stopped` set) holding the output read so far.
    Stop,
}

impl SupervisorMessage {
    /// The variant's name, for logs and protocol-violation reports (never any payload).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hello { .. } => "Hello",
            Self::Setup(_) => "Setup",
            Self::Run(_) => "Run",
            Self::Shutdown => "Shutdown",
            Self::Stop => "Stop",
        }
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRequest {
    /// Supervisor-chosen id of the call, echoed in reports.
    pub call_id: String,
    /// Name of the tool (for logs).
    pub tool: String,
    /// Absolute path of the executable and its arguments, already substituted.
    pub argv: Vec<String>,
    /// Bytes written to the tool's stdin, then stdin is closed.
    pub stdin: Vec<u8>,
    /// The validated arguments, as JSON text (never a dynamic value on the wire).
    pub arguments_json: String,
    /// At most this many bytes of each of stdout and stderr are kept.
    pub output_limit_bytes: u64,
    /// Whether the tool's stdio is captured or is the worker's own (`airlock exec`).
    pub stdio: StdioMode,
    /// A built-in tool to run (by name) instead of `argv`; its input is `arguments_json`.
    pub builtin: Option<String>,
}

/// Where a tool's stdin, stdout and stderr go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StdioMode {
    /// Pipes: stdin from the request, stdout and stderr captured (bounded) into `Exited`.
    Capture,
    /// The worker's own descriptors 0-2, which the supervisor set to the caller's stdio.
    Inherit,
}

/// Messages sent by the (untrusted once confined) worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerMessage {
    /// First message of every worker.
    Hello {
        /// The worker's [`PROTOCOL_VERSION`].
        version: u32,
    },
    /// Confinement finished; this is what was applied.
    Ready(AppliedIsolation),
    /// Confinement failed at `step`; the worker exits after sending this.
    SetupFailed(SetupFailure),
    /// A log record from the worker.
    Log(LogRecord),
    /// The tool ran and exited.
    Exited(ToolExit),
    /// The tool could not be started (exec failed, fork failed, ...).
    RunFailed {
        /// What failed.
        message: String,
        /// The errno, when there is one.
        errno: Option<i32>,
    },
}

impl WorkerMessage {
    /// The variant's name, for logs and protocol-violation reports (never any payload).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hello { .. } => "Hello",
            Self::Ready(_) => "Ready",
            Self::SetupFailed(_) => "SetupFailed",
            Self::Log(_) => "Log",
            Self::Exited(_) => "Exited",
            Self::RunFailed { .. } => "RunFailed",
        }
    }
}

/// Isolation the worker reports having applied (the supervisor cross-checks what it can).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedIsolation {
    /// Namespaces entered, by short name (`user`, `mnt`, `pid`, ...).
    pub namespaces: Vec<String>,
    /// Landlock ABI used, 0 when Landlock was not applied.
    pub landlock_abi: u32,
    /// Whether every requested Landlock right was enforced.
    pub landlock_fully_enforced: bool,
    /// Whether the seccomp filter was installed.
    pub seccomp_installed: bool,
    /// Whether it was installed with a listener, passed with `Ready` (before any other
    /// descriptor): the supervisor then answers, and records, every refusal.
    pub seccomp_listener: bool,
    /// Whether the Landlock domain logs its refusals (and the tool's) to the audit.
    pub landlock_logged: bool,
}

/// Why confinement failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetupFailure {
    /// Name of the confinement step that failed (`mount`, `landlock`, ...).
    pub step: String,
    /// Human-readable detail (no tool input in it).
    pub message: String,
    /// The errno, when there is one.
    pub errno: Option<i32>,
    /// True when a required kernel feature is missing (reported as `sandbox_unavailable`).
    pub feature_missing: bool,
}

/// Severity of a worker log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogLevel {
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something degraded.
    Warn,
    /// Something failed.
    Error,
}

/// One log record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    /// Severity.
    pub level: LogLevel,
    /// Text.
    pub message: String,
}

/// How a tool process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitStatus {
    /// Normal exit with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

/// The report of one finished tool run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolExit {
    /// How the tool ended.
    pub status: ExitStatus,
    /// Captured stdout, at most `output_limit_bytes`.
    pub stdout: Vec<u8>,
    /// Captured stderr, at most `output_limit_bytes`.
    pub stderr: Vec<u8>,
    /// Stdout was longer than the limit.
    pub stdout_truncated: bool,
    /// Stderr was longer than the limit.
    pub stderr_truncated: bool,
    /// User CPU time of the tool and its reaped descendants, microseconds.
    pub user_cpu_us: u64,
    /// System CPU time, microseconds.
    pub system_cpu_us: u64,
    /// CPU time of the worker itself, user and system, until it reported, microseconds:
    /// the share of its cgroup's count that is not the tool's.
    pub worker_cpu_us: u64,
    /// Whether the tool had used up its CPU-time limit when it ended, by the kernel's own
    /// count (the tick-sampled time that RLIMIT_CPU is checked against, which can run far
    /// ahead of the precise time above when other tasks share the CPU); `None` when that
    /// count could not be read.
    pub cpu_limit_reached: Option<bool>,
    /// The worker ended the tool because the supervisor said `Stop`.
    pub stopped: bool,
}
