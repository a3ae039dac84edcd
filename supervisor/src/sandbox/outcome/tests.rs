//! The verdicts [`result_of`] gives, one behaviour per test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;

fn facts() -> RunFacts<'static> {
    RunFacts {
        call_id: "c1",
        tool: "t",
        limits: AppliedLimits {
            memory_bytes: 1 << 20,
            pids: 8,
            timeout_ms: 500,
            output_bytes: 4096,
        },
        rlimits: Rlimits {
            open_files: 64,
            file_size_bytes: 1 << 20,
            cpu_seconds: Some(2),
        },
        seccomp_digest: "d1g3st",
        duration_ms: 7,
    }
}

fn applied() -> AppliedIsolation {
    AppliedIsolation {
        namespaces: vec!["user".into(), "pid".into()],
        landlock_abi: 6,
        landlock_fully_enforced: true,
        seccomp_installed: true,
        seccomp_listener: true,
        landlock_logged: false,
    }
}

/// A report of a tool that ended with `status` after `cpu_us`, having reached its CPU
/// limit by the kernel's count if `counted` says so, and wrote nothing.
fn tool_exit(status: ExitStatus, cpu_us: u64, counted: Option<bool>) -> ToolExit {
    ToolExit {
        status,
        stdout: Vec::new(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        user_cpu_us: cpu_us,
        system_cpu_us: 0,
        worker_cpu_us: 0,
        cpu_limit_reached: counted,
        stopped: false,
    }
}

fn exit(status: ExitStatus) -> Conversation {
    Conversation::Finished {
        applied: applied(),
        report: Box::new(WorkerMessage::Exited(ToolExit {
            stdout: b"out".to_vec(),
            stderr: b"err".to_vec(),
            stderr_truncated: true,
            user_cpu_us: 1500,
            system_cpu_us: 600,
            worker_cpu_us: 0,
            ..tool_exit(status, 0, Some(false))
        })),
    }
}

#[derive(Clone, Copy)]
enum Hit {
    Nothing,
    Memory,
    Pids,
    Both,
}

fn stats(hit: Hit) -> CgroupStats {
    let (oom_kills, pids_limit_hits) = match hit {
        Hit::Nothing => (0, 0),
        Hit::Memory => (1, 0),
        Hit::Pids => (0, 3),
        Hit::Both => (2, 3),
    };
    CgroupStats {
        oom_kills,
        peak_memory_bytes: Some(4096),
        pids_limit_hits,
        memory_limit_hits: oom_kills,
        cpu_usage_us: None,
    }
}

fn on_worker(conversation: Conversation, hit: Hit) -> ToolResult {
    result_of(
        &facts(),
        Outcome::Worker {
            conversation,
            cgroup: Some("v2".into()),
            stats: Some(stats(hit)),
            network: None,
            seccomp: None,
            landlock: None,
        },
    )
}

fn kind(result: &ToolResult) -> Option<ErrorKind> {
    result.error.as_ref().map(|e| e.kind)
}

#[test]
fn an_exit_is_judged_memory_first_then_processes_then_the_code() {
    use ErrorKind::*;
    let table = [
        (ExitStatus::Code(0), Hit::Nothing, None),
        (ExitStatus::Code(0), Hit::Pids, None),
        (ExitStatus::Code(0), Hit::Memory, Some(OutOfMemory)),
        (ExitStatus::Code(1), Hit::Nothing, Some(ToolFailed)),
        (ExitStatus::Code(1), Hit::Pids, Some(PidsLimit)),
        (ExitStatus::Code(137), Hit::Memory, Some(OutOfMemory)),
        (ExitStatus::Code(1), Hit::Both, Some(OutOfMemory)),
    ];
    for (status, hit, expected) in table {
        let result = on_worker(exit(status), hit);
        assert_eq!(kind(&result), expected, "{status:?}");
        assert_eq!(result.ok, expected.is_none(), "{status:?}");
        assert_eq!(result.exit_code, Some(status_code(&status)));
        assert_eq!(result.signal, None);
    }
}

fn status_code(status: &ExitStatus) -> i32 {
    match status {
        ExitStatus::Code(code) => *code,
        ExitStatus::Signal(_) => panic!("not a code"),
    }
}

#[test]
fn a_signal_is_judged_memory_then_seccomp_then_processes_then_the_signal() {
    use ErrorKind::*;
    let (sigsys, sigkill) = (libc::SIGSYS, libc::SIGKILL);
    let table = [
        (sigkill, Hit::Nothing, ToolFailed),
        (sigkill, Hit::Memory, OutOfMemory),
        (sigkill, Hit::Pids, PidsLimit),
        (sigkill, Hit::Both, OutOfMemory),
        (sigsys, Hit::Nothing, SeccompViolation),
        (sigsys, Hit::Pids, SeccompViolation),
        (sigsys, Hit::Memory, OutOfMemory),
        (sigsys, Hit::Both, OutOfMemory),
    ];
    for (signal, hit, expected) in table {
        let result = on_worker(exit(ExitStatus::Signal(signal)), hit);
        assert_eq!(kind(&result), Some(expected), "signal {signal}");
        assert_eq!(result.signal, Some(signal));
        assert_eq!(result.exit_code, None);
        assert!(!result.ok);
    }
    let seccomp = on_worker(exit(ExitStatus::Signal(sigsys)), Hit::Nothing);
    assert!(seccomp.error.unwrap().syscall.is_some());
    let signalled = on_worker(exit(ExitStatus::Signal(sigkill)), Hit::Nothing);
    assert_eq!(
        signalled.error.unwrap().message,
        format!("the tool was killed by signal {sigkill}")
    );
}

#[test]
fn a_deadline_names_the_limit_hit_on_the_way_before_the_timeout() {
    use ErrorKind::*;
    for (hit, expected) in [
        (Hit::Nothing, Timeout),
        (Hit::Pids, PidsLimit),
        (Hit::Memory, OutOfMemory),
        (Hit::Both, OutOfMemory),
    ] {
        let result = on_worker(
            Conversation::TimedOut {
                applied: Some(applied()),
                partial: None,
            },
            hit,
        );
        let error = result.error.unwrap();
        assert_eq!(error.kind, expected);
        assert_eq!(
            error.timeout_ms,
            Some(500),
            "every deadline says its length"
        );
        assert!(!result.ok);
    }
    let timeout = on_worker(
        Conversation::TimedOut {
            applied: None,
            partial: None,
        },
        Hit::Nothing,
    );
    assert_eq!(
        timeout.error.unwrap().message,
        "deadline of 500 ms passed; every process was killed"
    );
}

#[test]
fn rlimit_kills_name_their_limit_and_other_signals_stay_tool_failures() {
    use ErrorKind::{CpuTimeLimit as Cpu, FileSizeLimit, OutOfMemory, ToolFailed};
    use libc::{SIGKILL as KILL, SIGTERM, SIGXCPU, SIGXFSZ};
    let killed = |signal: i32, cpu_us: u64, counted: Option<bool>| Conversation::Finished {
        applied: applied(),
        report: Box::new(WorkerMessage::Exited(tool_exit(
            ExitStatus::Signal(signal),
            cpu_us,
            counted,
        ))),
    };
    // The facts' CPU limit is 2 s; `counted`: the worker read the kernel's own count.
    let cases = [
        (SIGXFSZ, 0, None, Hit::Nothing, FileSizeLimit),
        (KILL, 2_000_000, None, Hit::Nothing, Cpu),
        (KILL, 1_850_000, None, Hit::Nothing, Cpu),
        (SIGXCPU, 2_010_000, None, Hit::Nothing, Cpu),
        // Killed at the kernel's count of 2 s with far less precise time: other tasks
        // shared the CPU between its ticks.
        (KILL, 1_100_000, Some(true), Hit::Nothing, Cpu),
        // A tool that kills itself, early or late, or the OOM killer, is not the limit.
        (KILL, 10_000, None, Hit::Nothing, ToolFailed),
        (KILL, 1_950_000, Some(false), Hit::Nothing, ToolFailed),
        (KILL, 2_000_000, Some(true), Hit::Memory, OutOfMemory),
        (SIGTERM, 2_000_000, Some(true), Hit::Nothing, ToolFailed),
    ];
    for (signal, cpu_us, counted, hit, expected) in cases {
        let result = on_worker(killed(signal, cpu_us, counted), hit);
        let case = format!("signal {signal}, {cpu_us} µs, counted {counted:?}");
        assert_eq!(kind(&result), Some(expected), "{case}");
        assert_eq!(result.signal, Some(signal));
    }
    let message = on_worker(killed(SIGXFSZ, 0, None), Hit::Nothing)
        .error
        .unwrap()
        .message;
    assert!(message.contains("1048576 bytes"), "{message}");
}

#[test]
fn a_stopped_tool_keeps_what_it_wrote_but_no_exit_status() {
    let partial = || {
        Some(Box::new(ToolExit {
            stdout: b"half".to_vec(),
            stderr: b"way".to_vec(),
            stdout_truncated: true,
            system_cpu_us: 1000,
            worker_cpu_us: 0,
            stopped: true,
            ..tool_exit(ExitStatus::Signal(libc::SIGKILL), 2000, None)
        }))
    };
    for (conversation, expected) in [
        (
            Conversation::TimedOut {
                applied: Some(applied()),
                partial: partial(),
            },
            ErrorKind::Timeout,
        ),
        (
            Conversation::Cancelled {
                applied: Some(applied()),
                partial: partial(),
            },
            ErrorKind::Cancelled,
        ),
    ] {
        let result = on_worker(conversation, Hit::Nothing);
        assert_eq!(kind(&result), Some(expected));
        assert_eq!(
            (result.stdout.as_str(), result.stderr.as_str()),
            ("half", "way")
        );
        assert!(result.stdout_truncated && !result.stderr_truncated);
        assert_eq!(result.usage.cpu_ms, 3);
        assert_eq!((result.exit_code, result.signal), (None, None));
    }
}

#[test]
fn a_closed_channel_is_out_of_memory_only_when_the_kernel_says_so() {
    let oom = on_worker(Conversation::Broken(ChannelError::Closed), Hit::Memory);
    assert_eq!(kind(&oom), Some(ErrorKind::OutOfMemory));
    let broken = on_worker(Conversation::Broken(ChannelError::Closed), Hit::Nothing);
    assert_eq!(kind(&broken), Some(ErrorKind::ProtocolViolation));
    let violation = on_worker(
        Conversation::Broken(ChannelError::Violation("junk".into())),
        Hit::Memory,
    );
    assert_eq!(kind(&violation), Some(ErrorKind::ProtocolViolation));
    assert!(violation.error.unwrap().message.contains("junk"));
}

#[test]
fn a_supervisor_out_of_descriptors_is_unavailable_not_the_workers_violation() {
    let broken = |errno| Conversation::Broken(std::io::Error::from_raw_os_error(errno).into());
    let short = on_worker(broken(libc::EMFILE), Hit::Nothing);
    assert_eq!(kind(&short), Some(ErrorKind::SandboxUnavailable));
    assert!(short.error.unwrap().message.contains("out of descriptors"));
    let reset = on_worker(broken(libc::ECONNRESET), Hit::Nothing);
    assert_eq!(kind(&reset), Some(ErrorKind::ProtocolViolation));
}

#[test]
fn set_up_failures_cancellations_and_run_failures_keep_their_kind() {
    let setup = on_worker(
        Conversation::SetupFailed {
            failure: SetupFailure {
                step: "landlock".into(),
                message: "not supported".into(),
                errno: None,
                feature_missing: true,
            },
        },
        Hit::Memory,
    );
    let error = setup.error.unwrap();
    assert_eq!(error.kind, ErrorKind::SandboxUnavailable);
    assert_eq!(error.step.as_deref(), Some("landlock"));
    assert_eq!(
        error.message,
        "sandbox set-up failed at landlock: not supported"
    );
    let cancelled = on_worker(
        Conversation::Cancelled {
            applied: None,
            partial: None,
        },
        Hit::Pids,
    );
    assert_eq!(kind(&cancelled), Some(ErrorKind::Cancelled));
    let run_failed = on_worker(
        Conversation::Finished {
            applied: applied(),
            report: Box::new(WorkerMessage::RunFailed {
                message: "no such program".into(),
                errno: Some(libc::ENOENT),
            }),
        },
        Hit::Nothing,
    );
    assert_eq!(kind(&run_failed), Some(ErrorKind::ToolFailed));
}

#[test]
fn a_finished_call_reports_its_output_usage_and_the_isolation_applied() {
    let result = on_worker(exit(ExitStatus::Code(0)), Hit::Nothing);
    assert!(result.ok);
    assert_eq!((result.call_id.as_str(), result.tool.as_str()), ("c1", "t"));
    assert_eq!(
        (result.stdout.as_str(), result.stderr.as_str()),
        ("out", "err")
    );
    assert!(result.stderr_truncated && !result.stdout_truncated);
    assert_eq!(result.usage.cpu_ms, 2);
    assert_eq!(result.usage.peak_memory_bytes, Some(4096));
    assert_eq!((result.attempts, result.duration_ms), (1, 7));
    let isolation = result.isolation.unwrap();
    assert_eq!(isolation.namespaces, ["user", "pid"]);
    assert_eq!(isolation.landlock, LandlockLevel::Full);
    assert_eq!(isolation.seccomp.as_deref(), Some("d1g3st"));
    assert_eq!(isolation.cgroup.as_deref(), Some("v2"));
    assert_eq!(isolation.limits, facts().limits);
}

#[test]
fn cpu_counts_what_the_cgroup_saw_beyond_the_worker_when_the_worker_saw_less() {
    let mut exit = tool_exit(ExitStatus::Code(0), 3000, None);
    exit.worker_cpu_us = 1500;
    // Children no one waited for: only the cgroup counted them.
    assert_eq!(tool_cpu_us(&exit, Some(900_000)), 898_500);
    // The worker's own count wins where the cgroup's adds nothing (v1: no count).
    assert_eq!(tool_cpu_us(&exit, Some(4000)), 3000);
    assert_eq!(tool_cpu_us(&exit, Some(100)), 3000);
    assert_eq!(tool_cpu_us(&exit, None), 3000);
}

#[test]
fn isolation_says_only_what_was_applied() {
    // Timed out before the worker confined itself: nothing claimed.
    let early = on_worker(
        Conversation::TimedOut {
            applied: None,
            partial: None,
        },
        Hit::Nothing,
    );
    let isolation = early.isolation.unwrap();
    assert!(isolation.namespaces.is_empty());
    assert_eq!(isolation.landlock, LandlockLevel::None);
    assert_eq!(isolation.seccomp, None);
    let partial = AppliedIsolation {
        landlock_fully_enforced: false,
        seccomp_installed: false,
        seccomp_listener: false,
        landlock_logged: false,
        ..applied()
    };
    let late = on_worker(
        Conversation::Cancelled {
            applied: Some(partial),
            partial: None,
        },
        Hit::Nothing,
    );
    let isolation = late.isolation.unwrap();
    assert_eq!(isolation.landlock, LandlockLevel::Partial);
    assert_eq!(isolation.seccomp, None);
}

#[test]
fn a_call_refused_before_a_worker_claims_no_isolation() {
    let refused = result_of(
        &facts(),
        Outcome::Refused(ToolError::new(ErrorKind::SandboxUnavailable, "no cgroup")),
    );
    assert!(!refused.ok);
    assert_eq!(refused.isolation, None);
    assert_eq!(refused.attempts, 1);
    assert_eq!(refused.error.unwrap().message, "no cgroup");
}

#[test]
fn denial_reporting_says_which_layers_the_evidence_covers() {
    use crate::result::Coverage::{Reported, Unavailable};
    let with = |seccomp: Option<SyscallDenials>, network: Option<EgressSummary>| {
        result_of(
            &facts(),
            Outcome::Worker {
                conversation: exit(ExitStatus::Code(0)),
                cgroup: Some("v2".into()),
                stats: Some(stats(Hit::Nothing)),
                network,
                seccomp,
                landlock: None,
            },
        )
        .isolation
        .unwrap()
        .denial_reporting
    };
    // No listener answered: seccomp cannot be reported; limits always can.
    let none = with(None, None);
    assert_eq!(
        (
            none.seccomp,
            none.landlock,
            none.mounts,
            none.network,
            none.limits
        ),
        (Unavailable, Unavailable, Unavailable, Unavailable, Reported)
    );
    let answered = with(Some(SyscallDenials::default()), None);
    assert_eq!((answered.seccomp, answered.mounts), (Reported, Unavailable));
    let proxied = with(None, Some(EgressSummary::default()));
    assert_eq!(proxied.network, Reported);
    let diagnosed = with(
        Some({
            let mut diagnosed = SyscallDenials::default();
            diagnosed.diagnosed = true;
            diagnosed
        }),
        None,
    );
    assert_eq!(
        (
            diagnosed.seccomp,
            diagnosed.mounts,
            diagnosed.network,
            diagnosed.landlock
        ),
        (Reported, Reported, Reported, Unavailable)
    );
}

#[test]
fn the_limit_that_ended_a_call_is_in_its_denials() {
    let spun = on_worker(
        Conversation::Finished {
            applied: applied(),
            report: Box::new(WorkerMessage::Exited(tool_exit(
                ExitStatus::Signal(libc::SIGXCPU),
                2_000_000,
                Some(true),
            ))),
        },
        Hit::Nothing,
    );
    let objects: Vec<&str> = spun.denials.iter().map(|d| d.object.as_str()).collect();
    assert_eq!(kind(&spun), Some(ErrorKind::CpuTimeLimit), "{spun:?}");
    assert_eq!(objects, ["cpu_time"]);
}
