//! The worker's conversation with the supervisor: handshake, confine, run, exit.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use airlock_protocol::{
    ExitStatus, LogLevel, LogRecord, PROTOCOL_VERSION, SandboxSpec, SupervisorMessage, ToolExit,
    WorkerMessage, frame::encode_frame, read_frame, write_frame,
};

use crate::confine::{StepTimings, confine_worker};
use crate::run::run_tool;
use crate::sys::ChildStack;

/// Exit codes of the worker process itself (the tool's status travels in `Exited`).
pub mod exit_code {
    /// Served and shut down cleanly.
    pub const OK: i32 = 0;
    /// The supervisor broke the protocol or went away mid-conversation.
    pub const PROTOCOL: i32 = 70;
    /// Confinement failed (reported as `SetupFailed` first).
    pub const SETUP: i32 = 71;
    /// The socket descriptor argument was unusable.
    pub const USAGE: i32 = 64;
}

fn send(stream: &mut UnixStream, message: &WorkerMessage) -> bool {
    write_frame(stream, message).is_ok()
}

/// Sends a debug log record and then `message` in one write, so the supervisor wakes once
/// for both (a separate log frame cost the warm call a second wake-up round).
fn send_after_log(stream: &mut UnixStream, log: String, message: &WorkerMessage) -> bool {
    use std::io::Write;
    let record = WorkerMessage::Log(LogRecord {
        level: LogLevel::Debug,
        message: log,
    });
    let Ok(mut frames) = encode_frame(&record) else {
        return send(stream, message);
    };
    match encode_frame(message) {
        Ok(frame) => frames.extend_from_slice(&frame),
        Err(_) => return false,
    }
    stream.write_all(&frames).is_ok()
}

/// Sends a debug `log` record and `message` in one write, with `descriptors` attached
/// (`SCM_RIGHTS`) to the first bytes: the supervisor holds them, in this order, by the time
/// it reads `message`.
fn send_with_descriptors(
    stream: &UnixStream,
    log: String,
    message: &WorkerMessage,
    descriptors: &[RawFd],
) -> bool {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    use std::os::fd::AsRawFd;
    let record = WorkerMessage::Log(LogRecord {
        level: LogLevel::Debug,
        message: log,
    });
    let (Ok(mut frames), Ok(frame)) = (encode_frame(&record), encode_frame(message)) else {
        return false;
    };
    frames.extend_from_slice(&frame);
    let control = [ControlMessage::ScmRights(descriptors)];
    let mut sent = 0;
    while sent < frames.len() {
        let iov = [std::io::IoSlice::new(&frames[sent..])];
        // The descriptors ride on the first part only.
        let control: &[ControlMessage] = if sent == 0 && !descriptors.is_empty() {
            &control
        } else {
            &[]
        };
        match sendmsg::<()>(stream.as_raw_fd(), &iov, control, MsgFlags::empty(), None) {
            Ok(0) => return false,
            Ok(n) => sent += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return false,
        }
    }
    true
}

fn receive(stream: &mut UnixStream) -> Option<SupervisorMessage> {
    read_frame(stream).ok().flatten()
}

/// Until the call arrives, runs once the code a call will need: a fresh process's first
/// pass through a built-in or the report's encoder faults in its code and data, which the
/// call would otherwise wait for. Only a pooled worker rehearses: a cold worker's call is
/// already on its way when it is ready (the supervisor sends it with Setup), so the worker
/// first waits briefly for one, and stops between steps as soon as a call is waiting.
/// Reads only, into buffers that are dropped: nothing of it reaches the tool or the
/// supervisor. It also makes the tool's stack (`stack`), its pages faulted in.
fn rehearse_while_idle(stream: &UnixStream, stack: &mut Option<ChildStack>) {
    use std::os::fd::AsRawFd;
    let idle_for = |timeout_ms: i32| {
        let mut fds = [libc::pollfd {
            fd: stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        matches!(crate::sys::poll_descriptors(&mut fds, timeout_ms), Ok(0))
    };
    if !idle_for(2) {
        return;
    }
    let idle = || idle_for(0);
    // The tool's stack, its pages faulted in now rather than during the call.
    *stack = Some(ChildStack::new());
    for (name, arguments) in [
        (
            "read_file",
            r#"{"path": "/proc/self/stat", "max_bytes": 64}"#,
        ),
        ("list_dir", r#"{"path": "/"}"#),
    ] {
        if !idle() {
            return;
        }
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let _ = crate::builtin::plan_builtin_with(name, arguments, &mut out, &mut err);
    }
    if idle() {
        let mut sink = Vec::new();
        let _ = write_frame(
            &mut sink,
            &WorkerMessage::Exited(ToolExit {
                status: ExitStatus::Code(0),
                stdout: b"rehearsal".to_vec(),
                stderr: Vec::new(),
                stdout_truncated: false,
                stderr_truncated: false,
                user_cpu_us: 0,
                system_cpu_us: 0,
                worker_cpu_us: 0,
                cpu_limit_reached: None,
                stopped: false,
            }),
        );
    }
}

/// Runs the worker on the protocol socket `fd` (inherited from the supervisor's spawn).
/// Returns the process exit code.
pub fn serve_on_socket(fd: RawFd) -> i32 {
    if fd < 3 {
        return exit_code::USAGE;
    }
    // The supervisor's spawner clones us with every signal blocked (no handler may run
    // between its clone and our exec); we and the tools we start begin with none blocked.
    let _ = nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::empty()),
        None,
    );
    crate::sys::reset_signal_dispositions();
    let owned: OwnedFd = match crate::sys::adopt_descriptor(fd) {
        Ok(owned) => owned,
        Err(_) => return exit_code::USAGE,
    };
    let mut stream = UnixStream::from(owned);

    if !send(
        &mut stream,
        &WorkerMessage::Hello {
            version: PROTOCOL_VERSION,
        },
    ) {
        return exit_code::PROTOCOL;
    }
    match receive(&mut stream) {
        Some(SupervisorMessage::Hello { version }) if version == PROTOCOL_VERSION => {}
        _ => return exit_code::PROTOCOL,
    }
    let spec: SandboxSpec = match receive(&mut stream) {
        Some(SupervisorMessage::Setup(spec)) => *spec,
        _ => return exit_code::PROTOCOL,
    };
    let mut timings = StepTimings::default();
    let mut stack = None;
    match confine_worker(&spec, fd, &mut timings) {
        Ok(confined) => {
            let steps = format!("confinement steps: {}", timings.summary());
            let ready = WorkerMessage::Ready(confined.applied);
            // The seccomp listener first, as `Ready` tells the supervisor to expect.
            let descriptors: Vec<RawFd> = confined
                .seccomp_listener
                .iter()
                .map(AsRawFd::as_raw_fd)
                .chain(confined.egress_listener.iter().map(AsRawFd::as_raw_fd))
                .collect();
            let sent = send_with_descriptors(&stream, steps, &ready, &descriptors);
            // Ours close here: from now on only the supervisor holds them, and no tool we
            // start can accept on the egress listener or answer its own refusals.
            drop(confined.seccomp_listener);
            drop(confined.egress_listener);
            if !sent {
                return exit_code::PROTOCOL;
            }
            rehearse_while_idle(&stream, &mut stack);
        }
        Err(error) => {
            let _ = send(&mut stream, &WorkerMessage::SetupFailed(error.into()));
            return exit_code::SETUP;
        }
    }
    loop {
        match receive(&mut stream) {
            Some(SupervisorMessage::Run(request)) => {
                let mut timings = StepTimings::default();
                let report = run_tool(&spec, &request, &mut stack, &mut timings, &stream);
                let steps = format!("run steps: {}", timings.summary());
                if !send_after_log(&mut stream, steps, &report) {
                    return exit_code::PROTOCOL;
                }
            }
            // A Stop that crossed the report on its way: the run is over already.
            Some(SupervisorMessage::Shutdown | SupervisorMessage::Stop) | None => {
                return exit_code::OK;
            }
            Some(_) => {
                let _ = send(
                    &mut stream,
                    &WorkerMessage::Log(LogRecord {
                        level: LogLevel::Error,
                        message: "unexpected message".into(),
                    }),
                );
                return exit_code::PROTOCOL;
            }
        }
    }
}

/// Parses the worker's command line (`<socket-fd>`) and serves; for the binary's entry hook.
pub fn worker_main(args: &[String]) -> i32 {
    match args.first().and_then(|a| a.parse::<RawFd>().ok()) {
        Some(fd) => serve_on_socket(fd),
        None => exit_code::USAGE,
    }
}
