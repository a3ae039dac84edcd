//! Shared test support: proptest strategies for every wire type and hand-written sample messages.
//!
//! Each integration-test crate uses a subset, hence the `dead_code` allowance.
#![allow(dead_code)]

use airlock_protocol::{
    AppliedIsolation, BpfInstruction, ExitStatus, LandlockSpec, LogLevel, LogRecord, MountOp,
    NetworkMode, PROTOCOL_VERSION, Requirement, Rlimits, RootSource, RunRequest, SandboxSpec,
    SeccompSpec, SetupFailure, StdioMode, SupervisorMessage, ToolExit, WorkerMessage,
};
use proptest::collection::vec;
use proptest::prelude::*;

/// Short strings of any Unicode (multi-byte characters included).
fn text() -> impl Strategy<Value = String> {
    ".{0,8}"
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..16)
}

fn texts() -> impl Strategy<Value = Vec<String>> {
    vec(text(), 0..4)
}

fn requirement() -> impl Strategy<Value = Requirement> {
    prop_oneof![Just(Requirement::Required), Just(Requirement::BestEffort)]
}

fn network_mode() -> impl Strategy<Value = NetworkMode> {
    prop_oneof![
        Just(NetworkMode::None),
        Just(NetworkMode::Loopback),
        Just(NetworkMode::Host)
    ]
}

fn mount_op() -> impl Strategy<Value = MountOp> {
    prop_oneof![
        (text(), any::<u64>(), any::<u32>()).prop_map(|(target, size_bytes, mode)| {
            MountOp::Tmpfs {
                target,
                size_bytes,
                mode,
            }
        }),
        (text(), text(), any::<bool>(), any::<bool>()).prop_map(
            |(source, target, writable, optional)| MountOp::Bind {
                source,
                target,
                writable,
                optional,
            }
        ),
        (text(), vec(text(), 0..3)).prop_map(|(target, hide)| MountOp::Proc { target, hide }),
        text().prop_map(|target| MountOp::Dev { target }),
        (text(), text()).prop_map(|(link_target, path)| MountOp::Symlink { link_target, path }),
        (text(), any::<u32>()).prop_map(|(path, mode)| MountOp::Dir { path, mode }),
    ]
}

prop_compose! {
    fn rlimits()(
        open_files in any::<u64>(),
        file_size_bytes in any::<u64>(),
        cpu_seconds in any::<Option<u64>>(),
    ) -> Rlimits {
        Rlimits { open_files, file_size_bytes, cpu_seconds }
    }
}

prop_compose! {
    fn landlock_spec()(
        requirement in requirement(),
        read in texts(),
        write in texts(),
        tcp_bind in vec(any::<u16>(), 0..4),
        tcp_connect in vec(any::<u16>(), 0..4),
        restrict_tcp in any::<bool>(),
        log_denials in any::<bool>(),
    ) -> LandlockSpec {
        LandlockSpec { requirement, read, write, tcp_bind, tcp_connect, restrict_tcp, log_denials }
    }
}

prop_compose! {
    fn bpf_instruction()(code in any::<u16>(), jt in any::<u8>(), jf in any::<u8>(), k in any::<u32>())
        -> BpfInstruction {
        BpfInstruction { code, jt, jf, k }
    }
}

prop_compose! {
    fn seccomp_spec()(
        requirement in requirement(),
        program in vec(bpf_instruction(), 0..6),
        digest in text(),
    ) -> SeccompSpec {
        SeccompSpec { requirement, program, digest }
    }
}

prop_compose! {
    pub fn sandbox_spec()(
        profile in text(),
        hostname in text(),
        mounts in vec(mount_op(), 0..4),
        templated in any::<bool>(),
        network in network_mode(),
        rlimits in rlimits(),
        landlock in landlock_spec(),
        seccomp in seccomp_spec(),
        env in vec((text(), text()), 0..3),
        cwd in text(),
        egress_port in proptest::option::of(any::<u16>()),
    ) -> SandboxSpec {
        let root = if templated { RootSource::Template } else { RootSource::Build };
        SandboxSpec { profile, hostname, mounts, root, network, rlimits, landlock, seccomp, env, cwd, egress_port }
    }
}

fn stdio_mode() -> impl Strategy<Value = StdioMode> {
    prop_oneof![Just(StdioMode::Capture), Just(StdioMode::Inherit)]
}

prop_compose! {
    fn run_request()(
        call_id in text(),
        tool in text(),
        argv in texts(),
        stdin in bytes(),
        arguments_json in text(),
        output_limit_bytes in any::<u64>(),
        stdio in stdio_mode(),
        builtin in proptest::option::of(text()),
    ) -> RunRequest {
        RunRequest { call_id, tool, argv, stdin, arguments_json, output_limit_bytes, stdio, builtin }
    }
}

/// Every `SupervisorMessage` variant, with arbitrary (small) contents.
pub fn supervisor_message() -> impl Strategy<Value = SupervisorMessage> {
    prop_oneof![
        any::<u32>().prop_map(|version| SupervisorMessage::Hello { version }),
        sandbox_spec().prop_map(|spec| SupervisorMessage::Setup(Box::new(spec))),
        run_request().prop_map(SupervisorMessage::Run),
        Just(SupervisorMessage::Shutdown),
        Just(SupervisorMessage::Stop),
    ]
}

prop_compose! {
    fn applied_isolation()(
        namespaces in texts(),
        landlock_abi in any::<u32>(),
        landlock_fully_enforced in any::<bool>(),
        seccomp_installed in any::<bool>(),
        seccomp_listener in any::<bool>(),
        landlock_logged in any::<bool>(),
    ) -> AppliedIsolation {
        AppliedIsolation { namespaces, landlock_abi, landlock_fully_enforced, seccomp_installed, seccomp_listener, landlock_logged }
    }
}

prop_compose! {
    fn setup_failure()(
        step in text(),
        message in text(),
        errno in any::<Option<i32>>(),
        feature_missing in any::<bool>(),
    ) -> SetupFailure {
        SetupFailure { step, message, errno, feature_missing }
    }
}

fn log_level() -> impl Strategy<Value = LogLevel> {
    prop_oneof![
        Just(LogLevel::Debug),
        Just(LogLevel::Info),
        Just(LogLevel::Warn),
        Just(LogLevel::Error)
    ]
}

fn exit_status() -> impl Strategy<Value = ExitStatus> {
    prop_oneof![
        any::<i32>().prop_map(ExitStatus::Code),
        any::<i32>().prop_map(ExitStatus::Signal)
    ]
}

prop_compose! {
    fn tool_exit()(
        status in exit_status(),
        stdout in bytes(),
        stderr in bytes(),
        stdout_truncated in any::<bool>(),
        stderr_truncated in any::<bool>(),
        user_cpu_us in any::<u64>(),
        system_cpu_us in any::<u64>(),
        worker_cpu_us in any::<u64>(),
        cpu_limit_reached in proptest::option::of(any::<bool>()),
        stopped in any::<bool>(),
    ) -> ToolExit {
        ToolExit {
            status, stdout, stderr, stdout_truncated, stderr_truncated, user_cpu_us, system_cpu_us,
            worker_cpu_us, cpu_limit_reached, stopped,
        }
    }
}

/// Every `WorkerMessage` variant, with arbitrary (small) contents.
pub fn worker_message() -> impl Strategy<Value = WorkerMessage> {
    prop_oneof![
        any::<u32>().prop_map(|version| WorkerMessage::Hello { version }),
        applied_isolation().prop_map(WorkerMessage::Ready),
        setup_failure().prop_map(WorkerMessage::SetupFailed),
        (log_level(), text())
            .prop_map(|(level, message)| WorkerMessage::Log(LogRecord { level, message })),
        tool_exit().prop_map(WorkerMessage::Exited),
        (text(), any::<Option<i32>>())
            .prop_map(|(message, errno)| WorkerMessage::RunFailed { message, errno }),
    ]
}

/// A realistic sandbox spec (the shape `airlock-policy` compiles to).
pub fn sample_spec() -> SandboxSpec {
    SandboxSpec {
        profile: "strict".into(),
        hostname: "airlock".into(),
        mounts: vec![
            MountOp::Bind {
                source: "/usr".into(),
                target: "/usr".into(),
                writable: false,
                optional: false,
            },
            MountOp::Symlink {
                link_target: "usr/bin".into(),
                path: "/bin".into(),
            },
            MountOp::Tmpfs {
                target: "/tmp".into(),
                size_bytes: 64 << 20,
                mode: 0o1777,
            },
            MountOp::Proc {
                target: "/proc".into(),
                hide: vec!["cmdline".into(), "sys/kernel/random/boot_id".into()],
            },
            MountOp::Dev {
                target: "/dev".into(),
            },
            MountOp::Dir {
                path: "/work".into(),
                mode: 0o755,
            },
        ],
        root: RootSource::Build,
        network: NetworkMode::None,
        rlimits: Rlimits {
            open_files: 64,
            file_size_bytes: 16 << 20,
            cpu_seconds: Some(10),
        },
        landlock: LandlockSpec {
            requirement: Requirement::Required,
            read: vec!["/usr".into(), "/bin".into()],
            write: vec!["/tmp".into()],
            tcp_bind: vec![],
            tcp_connect: vec![443],
            restrict_tcp: true,
            log_denials: true,
        },
        seccomp: SeccompSpec {
            requirement: Requirement::BestEffort,
            program: vec![
                BpfInstruction {
                    code: 0x20,
                    jt: 0,
                    jf: 0,
                    k: 4,
                },
                BpfInstruction {
                    code: 0x06,
                    jt: 0,
                    jf: 0,
                    k: 0x7fff_0000,
                },
            ],
            digest: "ab".repeat(32),
        },
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("LANG".into(), "C.UTF-8".into()),
        ],
        cwd: "/work".into(),
        egress_port: Some(3128),
    }
}

/// One of each supervisor message, in conversation order.
pub fn sample_supervisor_messages() -> Vec<SupervisorMessage> {
    vec![
        SupervisorMessage::Hello {
            version: PROTOCOL_VERSION,
        },
        SupervisorMessage::Setup(Box::new(sample_spec())),
        SupervisorMessage::Run(RunRequest {
            call_id: "call-1".into(),
            tool: "word_count".into(),
            argv: vec!["/usr/bin/wc".into(), "-w".into()],
            stdin: b"hello sandbox".to_vec(),
            arguments_json: r#"{"text":"hello sandbox"}"#.into(),
            output_limit_bytes: 65536,
            stdio: StdioMode::Capture,
            builtin: None,
        }),
        SupervisorMessage::Shutdown,
        SupervisorMessage::Stop,
    ]
}

/// One of each worker message, in conversation order.
pub fn sample_worker_messages() -> Vec<WorkerMessage> {
    vec![
        WorkerMessage::Hello {
            version: PROTOCOL_VERSION,
        },
        WorkerMessage::Log(LogRecord {
            level: LogLevel::Info,
            message: "landlock abi 7".into(),
        }),
        WorkerMessage::Ready(AppliedIsolation {
            namespaces: vec!["user".into(), "mnt".into(), "pid".into(), "net".into()],
            landlock_abi: 7,
            landlock_fully_enforced: true,
            seccomp_installed: true,
            seccomp_listener: true,
            landlock_logged: true,
        }),
        WorkerMessage::SetupFailed(SetupFailure {
            step: "landlock".into(),
            message: "landlock is not enabled".into(),
            errno: Some(95),
            feature_missing: true,
        }),
        WorkerMessage::Exited(ToolExit {
            status: ExitStatus::Code(0),
            stdout: b"2\n".to_vec(),
            stderr: vec![],
            stdout_truncated: false,
            stderr_truncated: false,
            user_cpu_us: 1200,
            system_cpu_us: 800,
            worker_cpu_us: 0,
            cpu_limit_reached: Some(false),
            stopped: false,
        }),
        WorkerMessage::Exited(ToolExit {
            status: ExitStatus::Signal(31),
            stdout: vec![],
            stderr: b"bad system call".to_vec(),
            stdout_truncated: false,
            stderr_truncated: true,
            user_cpu_us: 5,
            system_cpu_us: 7,
            worker_cpu_us: 0,
            cpu_limit_reached: None,
            stopped: true,
        }),
        WorkerMessage::RunFailed {
            message: "exec failed".into(),
            errno: Some(2),
        },
    ]
}
