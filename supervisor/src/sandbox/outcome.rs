//! How a run ended, and the one function that turns that into its [`ToolResult`].
//!
//! The supervisor gathers what it knows — what the conversation with the worker produced,
//! the cgroup's counters read after the worker was reaped, the limits the call ran under —
//! and [`result_of`] decides, without side effects, what the record says. The cgroup
//! counters are the supervisor's own evidence and outrank what the worker reports: a limit
//! that was hit is the cause worth naming, in the order out of memory, seccomp, processes,
//! then the signal or exit code itself.

use airlock_protocol::{
    AppliedIsolation, ExitStatus, Rlimits, SetupFailure, ToolExit, WorkerMessage,
};

use crate::cgroup::CgroupStats;
use crate::channel::ChannelError;
use crate::denials::{SyscallDenials, denials_of};
use crate::egress::EgressSummary;
use crate::result::{
    AppliedLimits, Coverage, Denial, DenialReporting, ErrorKind, Isolation, LandlockLevel,
    ToolError, ToolResult,
};

/// What the conversation with a worker produced.
#[derive(Debug)]
pub(super) enum Conversation {
    /// The worker ran the call and reported (`Exited` or `RunFailed`).
    Finished {
        applied: AppliedIsolation,
        report: Box<WorkerMessage>,
    },
    /// The worker could not confine itself.
    SetupFailed { failure: SetupFailure },
    /// The channel broke or the worker broke the protocol.
    Broken(ChannelError),
    /// The deadline passed; `applied` once the worker had confined itself, `partial` when
    /// it stopped the tool on being told and reported what the tool wrote until then.
    TimedOut {
        applied: Option<AppliedIsolation>,
        partial: Option<Box<ToolExit>>,
    },
    /// The caller cancelled or the supervisor closed (`applied`, `partial`: as above).
    Cancelled {
        applied: Option<AppliedIsolation>,
        partial: Option<Box<ToolExit>>,
    },
}

/// How a run ended.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Refused before a worker was made (no cgroup, no spawn).
    Refused(ToolError),
    /// A worker was made, whatever it then did.
    Worker {
        conversation: Conversation,
        /// The version of the worker's cgroup (`v1`, `v2`), when it had one.
        cgroup: Option<String>,
        /// Its counters, read after the worker was reaped (final by then).
        stats: Option<CgroupStats>,
        /// What its egress proxy did, for a profile with one.
        network: Option<EgressSummary>,
        /// The syscalls its seccomp filter refused, when the supervisor answered them.
        seccomp: Option<SyscallDenials>,
        /// Landlock's refusals read from the audit, when every one of them is known.
        landlock: Option<Vec<Denial>>,
    },
}

/// What the record says about the call, whatever its outcome.
#[derive(Debug, Clone)]
pub(super) struct RunFacts<'a> {
    pub call_id: &'a str,
    pub tool: &'a str,
    pub limits: AppliedLimits,
    /// The profile's rlimits, which name the limit behind a tool's SIGKILL or SIGXFSZ.
    pub rlimits: Rlimits,
    /// The digest of the profile's seccomp filter, reported when the worker installed it.
    pub seccomp_digest: &'a str,
    pub duration_ms: u64,
}

/// The result record of a run: pure, so every precedence case is tested as a table.
pub(super) fn result_of(facts: &RunFacts<'_>, outcome: Outcome) -> ToolResult {
    let mut result = ToolResult::rejected(
        facts.call_id,
        facts.tool,
        ToolError::new(ErrorKind::SandboxUnavailable, ""),
    );
    result.attempts = 1;
    result.duration_ms = facts.duration_ms;
    let (conversation, cgroup, stats, seccomp, landlock) = match outcome {
        Outcome::Refused(error) => {
            result.error = Some(error);
            return result;
        }
        Outcome::Worker {
            conversation,
            cgroup,
            stats,
            network,
            seccomp,
            landlock,
        } => {
            result.network = network;
            (conversation, cgroup, stats, seccomp, landlock)
        }
    };
    // Reported only where the worker's domain logged its tool's refusals.
    let landlock = landlock.filter(|_| match &conversation {
        Conversation::Finished { applied, .. }
        | Conversation::TimedOut {
            applied: Some(applied),
            ..
        }
        | Conversation::Cancelled {
            applied: Some(applied),
            ..
        } => applied.landlock_logged,
        _ => false,
    });
    let refused_forks = stats.as_ref().map_or(0, |s| s.pids_limit_hits);
    let mut isolation = Isolation {
        limits: facts.limits.clone(),
        cgroup,
        ..Isolation::default()
    };
    let limit_hit = LimitsHit::from(stats.as_ref());
    let cgroup_cpu_us = stats.as_ref().and_then(|s| s.cpu_usage_us);
    result.usage.peak_memory_bytes = stats.and_then(|s| s.peak_memory_bytes);
    result.error = match conversation {
        Conversation::Finished { applied, report } => {
            apply_isolation(&mut isolation, &applied, facts.seccomp_digest);
            match *report {
                WorkerMessage::Exited(exit) => {
                    exited(&mut result, exit, limit_hit, cgroup_cpu_us, facts)
                }
                WorkerMessage::RunFailed { message, .. } => {
                    Some(ToolError::new(ErrorKind::ToolFailed, message))
                }
                other => Some(ToolError::new(
                    ErrorKind::ProtocolViolation,
                    format!("worker killed: expected Exited, got {}", other.name()),
                )),
            }
        }
        Conversation::SetupFailed { failure } => Some(ToolError {
            step: Some(failure.step.clone()),
            ..ToolError::new(
                ErrorKind::SandboxUnavailable,
                format!(
                    "sandbox set-up failed at {}: {}{}",
                    failure.step,
                    failure.message,
                    super::hints::setup_hint(&failure.step, &failure.message)
                ),
            )
        }),
        // The kernel's OOM killer took the worker itself: the channel closing is a symptom.
        Conversation::Broken(ChannelError::Closed) if limit_hit.memory => {
            Some(oom_error(facts.limits.memory_bytes))
        }
        // Not the worker's doing: the supervisor could not take what it sent.
        Conversation::Broken(error @ ChannelError::OutOfDescriptors(_)) => Some(ToolError::new(
            ErrorKind::SandboxUnavailable,
            format!("worker killed: {error}; raise the open-file limit or run fewer calls at once"),
        )),
        Conversation::Broken(error) => Some(ToolError::new(
            ErrorKind::ProtocolViolation,
            format!("worker killed: {error}"),
        )),
        Conversation::TimedOut { applied, partial } => {
            if let Some(applied) = applied {
                apply_isolation(&mut isolation, &applied, facts.seccomp_digest);
            }
            if let Some(exit) = partial {
                keep_partial(&mut result, *exit, cgroup_cpu_us);
            }
            Some(timed_out(limit_hit, &facts.limits))
        }
        Conversation::Cancelled { applied, partial } => {
            if let Some(applied) = applied {
                apply_isolation(&mut isolation, &applied, facts.seccomp_digest);
            }
            if let Some(exit) = partial {
                keep_partial(&mut result, *exit, cgroup_cpu_us);
            }
            Some(ToolError::new(
                ErrorKind::Cancelled,
                "cancelled by the caller; every process was killed",
            ))
        }
    };
    result.denials = denials_of(
        seccomp.as_ref(),
        result.network.as_ref(),
        refused_forks,
        &result,
    );
    let landlock_reported = landlock.is_some();
    result.denials.extend(landlock.unwrap_or_default());
    isolation.denial_reporting = DenialReporting {
        seccomp: coverage(seccomp.is_some()),
        landlock: coverage(landlock_reported),
        mounts: coverage(seccomp.as_ref().is_some_and(|s| s.diagnosed)),
        network: coverage(
            result.network.is_some() || seccomp.as_ref().is_some_and(|s| s.diagnosed),
        ),
        limits: Coverage::Reported,
    };
    result.isolation = Some(isolation);
    result.ok = result.error.is_none();
    result
}

fn coverage(reported: bool) -> Coverage {
    if reported {
        Coverage::Reported
    } else {
        Coverage::Unavailable
    }
}

/// Which cgroup limits the call ran into.
#[derive(Debug, Clone, Copy, Default)]
struct LimitsHit {
    memory: bool,
    pids: bool,
}

impl From<Option<&CgroupStats>> for LimitsHit {
    fn from(stats: Option<&CgroupStats>) -> Self {
        Self {
            memory: stats.is_some_and(|s| s.oom_kills > 0),
            pids: stats.is_some_and(|s| s.pids_limit_hits > 0),
        }
    }
}

fn oom_error(memory_bytes: u64) -> ToolError {
    ToolError::new(
        ErrorKind::OutOfMemory,
        format!("the memory limit of {memory_bytes} bytes was reached"),
    )
}

/// The tool was stopped (deadline, cancellation): what it wrote until then is kept, with
/// its truncation flags, and the CPU it used; it has no exit code or signal of its own.
fn keep_partial(result: &mut ToolResult, exit: ToolExit, cgroup_cpu_us: Option<u64>) {
    result.usage.cpu_ms = tool_cpu_us(&exit, cgroup_cpu_us) / 1000;
    result.stdout = String::from_utf8_lossy(&exit.stdout).into_owned();
    result.stderr = String::from_utf8_lossy(&exit.stderr).into_owned();
    result.stdout_truncated = exit.stdout_truncated;
    result.stderr_truncated = exit.stderr_truncated;
}

/// The CPU time the tool used, microseconds: what the worker counted of the processes it
/// waited for or, when more, the cgroup's count less the worker's own. The cgroup's also
/// counts processes reaped without a wait (children of a tool that ignores SIGCHLD), which
/// the worker's misses; the worker's own time includes what it spent before it joined the
/// cgroup, so the difference never exceeds the tool's.
fn tool_cpu_us(exit: &ToolExit, cgroup_cpu_us: Option<u64>) -> u64 {
    let waited = exit.user_cpu_us.saturating_add(exit.system_cpu_us);
    let in_cgroup = cgroup_cpu_us.map_or(0, |c| c.saturating_sub(exit.worker_cpu_us));
    waited.max(in_cgroup)
}

/// The tool ran to its end: its output is kept whatever the verdict.
fn exited(
    result: &mut ToolResult,
    exit: ToolExit,
    hit: LimitsHit,
    cgroup_cpu_us: Option<u64>,
    facts: &RunFacts<'_>,
) -> Option<ToolError> {
    let status = exit.status;
    let cpu_us = exit.user_cpu_us.saturating_add(exit.system_cpu_us);
    let counted = exit.cpu_limit_reached;
    keep_partial(result, exit, cgroup_cpu_us);
    let pids = facts.limits.pids;
    match status {
        ExitStatus::Code(code) => {
            result.exit_code = Some(code);
            if hit.memory {
                Some(oom_error(facts.limits.memory_bytes))
            } else if code == 0 {
                None
            } else if hit.pids {
                Some(ToolError::new(
                    ErrorKind::PidsLimit,
                    format!(
                        "the process limit of {pids} was reached; the tool exited with code {code}"
                    ),
                ))
            } else {
                Some(ToolError::new(
                    ErrorKind::ToolFailed,
                    format!("the tool exited with code {code}"),
                ))
            }
        }
        ExitStatus::Signal(signal) => {
            result.signal = Some(signal);
            Some(if hit.memory {
                oom_error(facts.limits.memory_bytes)
            } else if signal == libc::SIGSYS {
                ToolError {
                    syscall: Some("a syscall from a non-native architecture or the x32 ABI".into()),
                    ..ToolError::new(
                        ErrorKind::SeccompViolation,
                        "the seccomp filter killed the tool (SIGSYS)",
                    )
                }
            } else if hit.pids {
                ToolError::new(
                    ErrorKind::PidsLimit,
                    format!("the process limit of {pids} was reached"),
                )
            } else if signal == libc::SIGXFSZ {
                ToolError::new(
                    ErrorKind::FileSizeLimit,
                    format!(
                        "the file size limit of {} bytes was reached (SIGXFSZ)",
                        facts.rlimits.file_size_bytes
                    ),
                )
            } else if let Some(seconds) = cpu_limit_reached(signal, cpu_us, counted, facts.rlimits)
            {
                ToolError::new(
                    ErrorKind::CpuTimeLimit,
                    format!("the CPU time limit of {seconds} s was used up"),
                )
            } else {
                ToolError::new(
                    ErrorKind::ToolFailed,
                    format!("the tool was killed by signal {signal}"),
                )
            })
        }
    }
}

/// The CPU limit in seconds, when it is what killed the tool: RLIMIT_CPU's soft and hard
/// limits are set alike, so the kernel's verdict is SIGKILL (SIGXCPU, were they apart).
/// Nothing else in the sandbox sends SIGKILL but the out-of-memory killer (checked before
/// this) and the tool itself. `counted`: whether the time the kernel checks the limit
/// against had reached it, as the worker read it. That time is sampled at ticks and, while
/// other tasks share the CPU, runs far ahead of the precise time the result reports (a
/// tool killed at its 1 s had used 0.55 s here), so without it the CPU used only hints:
/// at least 90 % of the limit.
fn cpu_limit_reached(
    signal: i32,
    cpu_us: u64,
    counted: Option<bool>,
    rlimits: Rlimits,
) -> Option<u64> {
    let seconds = rlimits.cpu_seconds?;
    let used_up =
        counted.unwrap_or_else(|| cpu_us.saturating_mul(10) >= seconds.saturating_mul(9_000_000));
    ((signal == libc::SIGKILL || signal == libc::SIGXCPU) && used_up).then_some(seconds)
}

/// The deadline passed. A limit hit on the way is the cause worth reporting: a fork bomb
/// or a process thrashing at its memory limit spins until the deadline.
fn timed_out(hit: LimitsHit, limits: &AppliedLimits) -> ToolError {
    let timeout_ms = Some(limits.timeout_ms);
    if hit.memory {
        return ToolError {
            timeout_ms,
            ..ToolError::new(
                ErrorKind::OutOfMemory,
                format!(
                    "the memory limit of {} bytes was reached and the deadline passed; every process was killed",
                    limits.memory_bytes
                ),
            )
        };
    }
    if hit.pids {
        return ToolError {
            timeout_ms,
            ..ToolError::new(
                ErrorKind::PidsLimit,
                format!(
                    "the process limit of {} was reached and the deadline passed; every process was killed",
                    limits.pids
                ),
            )
        };
    }
    ToolError {
        timeout_ms,
        ..ToolError::new(
            ErrorKind::Timeout,
            format!(
                "deadline of {} ms passed; every process was killed",
                limits.timeout_ms
            ),
        )
    }
}

fn apply_isolation(isolation: &mut Isolation, applied: &AppliedIsolation, seccomp_digest: &str) {
    isolation.namespaces = applied.namespaces.clone();
    isolation.landlock_abi = applied.landlock_abi;
    isolation.landlock = match (applied.landlock_abi, applied.landlock_fully_enforced) {
        (0, _) => LandlockLevel::None,
        (_, true) => LandlockLevel::Full,
        (_, false) => LandlockLevel::Partial,
    };
    isolation.seccomp = applied
        .seccomp_installed
        .then(|| seccomp_digest.to_string());
}

#[cfg(test)]
mod tests;
