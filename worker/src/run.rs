//! Runs one tool process inside the confined worker and collects what it did.
//!
//! The worker is PID 1 and leads a session with no controlling terminal (a confinement
//! step): it starts the tool in that session (so no TIOCSTI even when stdio is the
//! caller's terminal, and no terminal to acquire), feeds stdin, drains stdout and
//! stderr into bounded buffers (reading past the limit and discarding, so a flooding tool
//! never blocks), reaps every orphan that reparents to it, and when the tool exits kills
//! whatever the tool left behind.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use std::os::unix::net::UnixStream;

use airlock_protocol::{
    ExitStatus, RunRequest, SandboxSpec, StdioMode, SupervisorMessage, ToolExit, WorkerMessage,
    read_frame,
};

use crate::builtin::{BuiltinPlan, plan_builtin, plan_builtin_with, runs_in_process};
use crate::confine::StepTimings;
use crate::sys::{self, ChildStack, Forked};

/// How long output may keep flowing after the tool itself exited (descendants holding the
/// pipes open) before the worker stops reading and kills them.
const DRAIN_GRACE: Duration = Duration::from_millis(100);

/// A bounded capture of one output stream.
#[derive(Debug, Default)]
struct Capture {
    kept: Vec<u8>,
    truncated: bool,
}

impl Capture {
    fn push(&mut self, bytes: &[u8], limit: usize) {
        let room = limit.saturating_sub(self.kept.len());
        let take = room.min(bytes.len());
        self.kept.extend_from_slice(&bytes[..take]);
        if take < bytes.len() {
            self.truncated = true;
        }
    }
}

fn cstring(text: &str) -> Option<CString> {
    CString::new(text).ok()
}

/// Finds the executable: a path with `/` as is, else the first match in the sandbox PATH.
fn resolve_executable(program: &str, spec: &SandboxSpec) -> String {
    if program.contains('/') {
        return program.to_string();
    }
    let path = spec
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or("/usr/bin:/bin", |(_, v)| v.as_str());
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let candidate = format!("{dir}/{program}");
        if std::fs::metadata(&candidate).is_ok_and(|m| m.is_file()) {
            return candidate;
        }
    }
    program.to_string()
}

/// In the vfork'd child (sharing the worker's memory until exec): wire stdio, exec —
/// syscalls on prepared data only. A failure's errno goes into `failure`, which the
/// parent reads once it resumes (the memory is shared until exec), instead of through a
/// pipe: one pipe, a read and two closes less per call. Returns only the exit code of a
/// failure it already recorded. No session of its own: the tool inherits the worker's,
/// which has no controlling terminal (see the confinement recipe).
fn exec_prepared_tool(
    program: &std::ffi::CStr,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    cwd: &std::ffi::CStr,
    stdio: Option<[RawFd; 3]>,
    failure: &AtomicI32,
) -> i32 {
    let fail = |error: std::io::Error| -> i32 {
        failure.store(error.raw_os_error().unwrap_or(libc::EIO), Ordering::Relaxed);
        sys::exit_immediately(127)
    };
    if let Some(fds) = stdio {
        for (target, fd) in fds.iter().enumerate() {
            if let Err(e) = sys::duplicate_onto(*fd, target as RawFd) {
                return fail(e);
            }
        }
    }
    sys::restore_default_signals_for_tool();
    if let Err(e) = sys::change_directory(cwd) {
        return fail(e);
    }
    fail(sys::execute_prepared(program, argv, envp))
}

/// In the forked child: wire stdio, exec (in the worker's session, as above). Never
/// returns.
fn exec_tool_in_child(
    spec: &SandboxSpec,
    program: &CString,
    argv: &[CString],
    envp: &[CString],
    stdio: Option<[RawFd; 3]>,
    error_pipe: RawFd,
    builtin: Option<(&str, &str)>,
) -> ! {
    let fail = |errno: i32| -> ! {
        let bytes = errno.to_ne_bytes();
        let _ = sys::write_raw(error_pipe, &bytes);
        sys::exit_immediately(127)
    };
    if let Some(fds) = stdio {
        for (target, fd) in fds.iter().enumerate() {
            if let Err(e) = sys::duplicate_onto(*fd, target as RawFd) {
                fail(e.raw_os_error().unwrap_or(libc::EIO));
            }
        }
    }
    sys::restore_default_signals_for_tool();
    if let Err(e) = nix::unistd::chdir(spec.cwd.as_str()) {
        fail(e as i32);
    }
    if let Some((name, arguments)) = builtin {
        // Started: close the error pipe so the parent drains our output meanwhile.
        let _ = nix::unistd::close(error_pipe);
        match plan_builtin(name, arguments) {
            BuiltinPlan::Done(code) => sys::exit_immediately(code),
            BuiltinPlan::Exec(shell_argv) => {
                let Some(argv) = shell_argv
                    .iter()
                    .map(|a| cstring(a))
                    .collect::<Option<Vec<_>>>()
                else {
                    sys::exit_immediately(127)
                };
                let _ = sys::execute(&argv[0], &argv, envp);
                sys::exit_immediately(127)
            }
        }
    }
    let error = sys::execute(program, argv, envp);
    fail(error.raw_os_error().unwrap_or(libc::EIO))
}

fn read_into(fd: &OwnedFd, capture: &mut Capture, limit: usize) -> bool {
    let mut buffer = [0u8; 16 * 1024];
    loop {
        match nix::unistd::read(fd, &mut buffer) {
            Ok(0) => return false,
            Ok(n) => capture.push(&buffer[..n], limit),
            Err(nix::errno::Errno::EAGAIN) => return true,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
}

/// Runs the request and returns the message to send back. `stack` is the tool's stack,
/// made now if the worker did not make it while idle.
pub fn run_tool(
    spec: &SandboxSpec,
    request: &RunRequest,
    stack: &mut Option<ChildStack>,
    timings: &mut StepTimings,
    control: &UnixStream,
) -> WorkerMessage {
    let mut control = Control {
        stream: control,
        listening: true,
        stopped: false,
    };
    match run_tool_inner(spec, request, stack, timings, &mut control) {
        Ok(exit) => WorkerMessage::Exited(exit),
        Err(error) => WorkerMessage::RunFailed {
            message: error.to_string(),
            errno: error.errno(),
        },
    }
}

/// The supervisor's socket while a tool runs: it says `Stop` when the call's deadline passed
/// or the call was cancelled, and the tool, with everything it started, is killed at once,
/// so that what it wrote until then can still be reported.
struct Control<'a> {
    stream: &'a UnixStream,
    /// Still watched: no `Stop` (or hang-up) seen yet.
    listening: bool,
    /// `Stop` came, or the supervisor went away.
    stopped: bool,
}

impl Control<'_> {
    fn pollfd(&self) -> Option<libc::pollfd> {
        self.listening.then(|| libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
    }

    /// After a poll said the socket is readable (or hung up): reads what the supervisor
    /// sent and ends the tool. Only `Stop` may come now; anything else, or the supervisor
    /// gone, ends the tool just the same.
    fn take(&mut self) {
        let mut stream = self.stream;
        // What it said does not matter: the one thing it may say is `Stop`.
        let _ = read_frame::<_, SupervisorMessage>(&mut stream);
        self.listening = false;
        self.stopped = true;
        let _ = sys::kill_every_other_process();
    }
}

/// Why the tool could not be started, named by the operation that failed. It reaches the
/// supervisor as `RunFailed`: the `Display` text as the message, with
/// [`RunError::errno`]; the call ends `tool_failed`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Neither an argv nor a built-in to run.
    #[error("empty argv")]
    EmptyArgv,
    /// A string bound for execve holds a NUL byte.
    #[error("{what} contains NUL")]
    InteriorNul {
        /// Which string: `executable path`, `argument`, `environment` or `cwd`.
        what: &'static str,
    },
    /// Making a pipe for the tool's stdio or exec errno failed.
    #[error("pipe: {0}")]
    Pipe(std::io::Error),
    /// Forking the child that runs the `bash` built-in failed.
    #[error("fork: {0}")]
    Fork(std::io::Error),
    /// Starting the tool's child (vfork and exec) failed.
    #[error("spawn: {0}")]
    Spawn(std::io::Error),
    /// The child could not become the tool: its exec failed, or the stdio or working
    /// directory set up just before it.
    #[error("cannot execute {program}: {}", std::io::Error::from_raw_os_error(*.errno))]
    Exec {
        /// The resolved executable.
        program: String,
        /// The errno the child recorded.
        errno: i32,
    },
    /// Making the worker's ends of the stdio pipes non-blocking failed.
    #[error("nonblocking: {0}")]
    SetNonblocking(std::io::Error),
}

impl RunError {
    /// The errno behind the failure, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::EmptyArgv | Self::InteriorNul { .. } => None,
            Self::Pipe(e) | Self::Fork(e) | Self::Spawn(e) | Self::SetNonblocking(e) => {
                e.raw_os_error()
            }
            Self::Exec { errno, .. } => Some(*errno),
        }
    }
}

/// `text` for execve, or the error naming `what` it is when it holds a NUL.
fn checked_cstring(text: &str, what: &'static str) -> Result<CString, RunError> {
    cstring(text).ok_or(RunError::InteriorNul { what })
}

fn run_tool_inner(
    spec: &SandboxSpec,
    request: &RunRequest,
    stack: &mut Option<ChildStack>,
    timings: &mut StepTimings,
    control: &mut Control<'_>,
) -> Result<ToolExit, RunError> {
    let builtin = request
        .builtin
        .as_deref()
        .map(|name| (name, request.arguments_json.as_str()));
    let limit = usize::try_from(request.output_limit_bytes).unwrap_or(usize::MAX);
    // In-process built-ins run in the worker itself: it is confined exactly as a child
    // would be and is discarded after this one call, so a fork, pipes and a reap would
    // cost the call time and buy nothing.
    if let (Some((name, arguments)), StdioMode::Capture) = (builtin, request.stdio)
        && runs_in_process(name)
    {
        return Ok(run_builtin_here(spec, name, arguments, limit, timings));
    }
    let first = match (request.argv.first(), builtin) {
        (Some(first), _) => first.as_str(),
        (None, Some((name, _))) => name,
        (None, None) => return Err(RunError::EmptyArgv),
    };
    let resolved = resolve_executable(first, spec);
    let program = checked_cstring(&resolved, "executable path")?;
    let argv: Vec<CString> = request
        .argv
        .iter()
        .map(|a| checked_cstring(a, "argument"))
        .collect::<Result<_, _>>()?;
    let envp: Vec<CString> = spec
        .env
        .iter()
        .map(|(k, v)| checked_cstring(&format!("{k}={v}"), "environment"))
        .collect::<Result<_, _>>()?;

    timings.mark("prepare");
    let pipes = match request.stdio {
        StdioMode::Inherit => None,
        StdioMode::Capture => Some([
            sys::cloexec_pipe().map_err(RunError::Pipe)?,
            sys::cloexec_pipe().map_err(RunError::Pipe)?,
            sys::cloexec_pipe().map_err(RunError::Pipe)?,
        ]),
    };
    let child_stdio = pipes.as_ref().map(|[stdin, stdout, stderr]| {
        [
            stdin.0.as_raw_fd(),
            stdout.1.as_raw_fd(),
            stderr.1.as_raw_fd(),
        ]
    });

    // The child, and the errno of its exec if that failed.
    let (pid, exec_errno) = if builtin.is_some() {
        // The bash built-in decides in the child what to exec (and allocates): a real
        // fork, which shares no memory, so its errno comes through a pipe that closes on
        // exec (EOF) or once the child has started.
        let (error_read, error_write) = sys::cloexec_pipe().map_err(RunError::Pipe)?;
        let pid = match sys::fork_single_threaded().map_err(RunError::Fork)? {
            Forked::Child => exec_tool_in_child(
                spec,
                &program,
                &argv,
                &envp,
                child_stdio,
                error_write.as_raw_fd(),
                builtin,
            ),
            Forked::Parent(pid) => pid,
        };
        drop(error_write);
        let mut errno_bytes = [0u8; 4];
        let errno = matches!(nix::unistd::read(&error_read, &mut errno_bytes), Ok(4))
            .then(|| i32::from_ne_bytes(errno_bytes));
        (pid, errno)
    } else {
        let cwd = checked_cstring(&spec.cwd, "cwd")?;
        let argv_ptrs = sys::pointer_array(&argv);
        let envp_ptrs = sys::pointer_array(&envp);
        let failure = AtomicI32::new(0);
        let mut child = || -> i32 {
            exec_prepared_tool(
                &program,
                &argv_ptrs,
                &envp_ptrs,
                &cwd,
                child_stdio,
                &failure,
            )
        };
        let pid = sys::spawn_vfork(&mut child, stack.get_or_insert_with(ChildStack::new))
            .map_err(RunError::Spawn)?;
        // Resumed: the child has exec'd (nothing stored) or stored its errno and exited.
        (
            pid,
            Some(failure.load(Ordering::Relaxed)).filter(|&e| e != 0),
        )
    };
    timings.mark("fork");
    if let Some(errno) = exec_errno {
        let _ = sys::reap_all_children();
        return Err(RunError::Exec {
            program: resolved,
            errno,
        });
    }
    // Polled for the tool's exit, so no loop sleeps past it.
    let tool_pidfd = sys::open_pidfd(pid).ok();
    // The tool's orphans end too, and are the worker's to reap: with SIGCHLD as a
    // descriptor the loops below sleep until something happens. Without it (a profile
    // refusing rt_sigaction), they look every 20 ms as before.
    let child_signals = sys::ChildSignals::install().ok();
    let wait_ms = |exited_at: Option<Instant>| -> i32 {
        match (&child_signals, exited_at) {
            (None, _) => 20,
            (Some(_), None) => -1,
            // The tool is gone; its descendants may hold the pipes until the grace ends.
            (Some(_), Some(at)) => {
                let left = DRAIN_GRACE.saturating_sub(at.elapsed());
                i32::try_from(left.as_millis())
                    .unwrap_or(i32::MAX)
                    .saturating_add(1)
            }
        }
    };
    // Emptied before each reap, so that a child ending after the reap wakes the poll.
    let drain_signals = || child_signals.iter().for_each(sys::ChildSignals::drain);
    let signal_fd = |fds: &mut Vec<libc::pollfd>| {
        if let Some(signals) = &child_signals {
            fds.push(libc::pollfd {
                fd: signals.fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
    };

    timings.mark("exec");
    let mut stdout = Capture::default();
    let mut stderr = Capture::default();
    let mut status: Option<ExitStatus> = None;
    let mut exited_at: Option<Instant> = None;
    // The CPU-time limit the tool inherited; with none, there is none to reach and no need
    // to look at the tool's time when it ends.
    let cpu_limit = sys::cpu_soft_limit_s();
    let mut cpu_limit_reached = match cpu_limit {
        Ok(None) => Some(false),
        Ok(Some(_)) | Err(_) => None,
    };
    let cpu_limit_s = cpu_limit.ok().flatten();

    if let Some([stdin, stdout_pipe, stderr_pipe]) = pipes {
        // Close the child's ends here, or the pipes never reach EOF.
        let (stdin_read, stdin_write) = stdin;
        let (stdout_read, stdout_write) = stdout_pipe;
        let (stderr_read, stderr_write) = stderr_pipe;
        drop((stdin_read, stdout_write, stderr_write));
        for fd in [
            stdin_write.as_raw_fd(),
            stdout_read.as_raw_fd(),
            stderr_read.as_raw_fd(),
        ] {
            sys::set_fresh_pipe_nonblocking(fd).map_err(RunError::SetNonblocking)?;
        }
        let mut stdin_write = Some(stdin_write);
        let mut written = 0usize;
        if request.stdin.is_empty() {
            stdin_write = None;
        }
        let mut stdout_open = true;
        let mut stderr_open = true;
        loop {
            drain_signals();
            reap(
                pid,
                &mut status,
                &mut exited_at,
                cpu_limit_s,
                &mut cpu_limit_reached,
            );
            let done_reading = !stdout_open && !stderr_open;
            let grace_over = exited_at.is_some_and(|t| t.elapsed() >= DRAIN_GRACE);
            if status.is_some() && (done_reading || grace_over) {
                break;
            }
            let mut fds = Vec::with_capacity(3);
            if stdout_open {
                fds.push(libc::pollfd {
                    fd: stdout_read.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            if stderr_open {
                fds.push(libc::pollfd {
                    fd: stderr_read.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            if let Some(w) = &stdin_write {
                fds.push(libc::pollfd {
                    fd: w.as_raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                });
            }
            // The tool's pidfd wakes us the moment it exits; the timeout reaps orphans.
            if let (None, Some(pidfd)) = (&status, &tool_pidfd) {
                fds.push(libc::pollfd {
                    fd: pidfd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            let watched = control.pollfd().inspect(|fd| fds.push(*fd)).is_some();
            let control_at = fds.len().wrapping_sub(1);
            signal_fd(&mut fds);
            let _ = sys::poll_descriptors(&mut fds, wait_ms(exited_at));
            if watched && fds.get(control_at).is_some_and(|fd| fd.revents != 0) {
                control.take();
            }
            if stdout_open {
                stdout_open = read_into(&stdout_read, &mut stdout, limit);
            }
            if stderr_open {
                stderr_open = read_into(&stderr_read, &mut stderr, limit);
            }
            if let Some(w) = &stdin_write {
                match nix::unistd::write(w, &request.stdin[written..]) {
                    Ok(n) => written += n,
                    Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                    // EPIPE: the tool closed stdin; that is its right.
                    Err(_) => written = request.stdin.len(),
                }
                if written >= request.stdin.len() {
                    stdin_write = None;
                }
            }
        }
    } else {
        while status.is_none() {
            drain_signals();
            reap(
                pid,
                &mut status,
                &mut exited_at,
                cpu_limit_s,
                &mut cpu_limit_reached,
            );
            if status.is_none() {
                let mut fds: Vec<libc::pollfd> = tool_pidfd
                    .iter()
                    .map(|fd| libc::pollfd {
                        fd: fd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    })
                    .collect();
                let watched = control.pollfd().inspect(|fd| fds.push(*fd)).is_some();
                let control_at = fds.len().wrapping_sub(1);
                signal_fd(&mut fds);
                let _ = sys::poll_descriptors(&mut fds, wait_ms(None));
                if watched && fds.get(control_at).is_some_and(|fd| fd.revents != 0) {
                    control.take();
                }
            }
        }
    }

    timings.mark("tool");
    // Whatever the tool left running (daemons, double forks) dies with it. kill(-1) visits
    // every process on the host, not just ours, so it is skipped when nothing is left.
    if sys::has_children() {
        let _ = sys::kill_every_other_process();
        let _ = sys::reap_all_children();
    }
    timings.mark("reap");
    let (user_cpu_us, system_cpu_us) = sys::children_cpu_time_us();
    Ok(ToolExit {
        status: status.unwrap_or(ExitStatus::Signal(libc::SIGKILL)),
        stdout: stdout.kept,
        stderr: stderr.kept,
        stdout_truncated: stdout.truncated,
        stderr_truncated: stderr.truncated,
        user_cpu_us,
        system_cpu_us,
        worker_cpu_us: sys::own_cpu_time_us(),
        cpu_limit_reached,
        stopped: control.stopped,
    })
}

/// A bounded capture as an `io::Write`: output past the limit is counted as truncated.
struct CaptureWriter<'a> {
    capture: &'a mut Capture,
    limit: usize,
}

impl std::io::Write for CaptureWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.capture.push(bytes, self.limit);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs an in-process built-in in this (confined, single-use) worker, in the profile's
/// working directory, with its output captured like a child's.
fn run_builtin_here(
    spec: &SandboxSpec,
    name: &str,
    arguments: &str,
    limit: usize,
    timings: &mut StepTimings,
) -> ToolExit {
    let mut stdout = Capture::default();
    let mut stderr = Capture::default();
    let code = match nix::unistd::chdir(spec.cwd.as_str()) {
        Ok(()) => {
            sys::ignore_file_size_signal();
            let plan = plan_builtin_with(
                name,
                arguments,
                &mut CaptureWriter {
                    capture: &mut stdout,
                    limit,
                },
                &mut CaptureWriter {
                    capture: &mut stderr,
                    limit,
                },
            );
            match plan {
                BuiltinPlan::Done(code) => code,
                // Only `bash` execs, and it never gets here.
                BuiltinPlan::Exec(_) => 127,
            }
        }
        Err(e) => {
            stderr.push(
                format!("cannot enter {}: {e}\n", spec.cwd).as_bytes(),
                limit,
            );
            1
        }
    };
    timings.mark("builtin");
    ToolExit {
        status: ExitStatus::Code(code),
        stdout: stdout.kept,
        stderr: stderr.kept,
        stdout_truncated: stdout.truncated,
        stderr_truncated: stderr.truncated,
        user_cpu_us: 0,
        system_cpu_us: 0,
        worker_cpu_us: 0,
        cpu_limit_reached: None,
        stopped: false,
    }
}

/// Reaps every child that changed state; records the tool's own status and, with a CPU
/// limit of `cpu_limit_s` seconds, whether the tool had used it up (read while it is dead
/// but not yet reaped).
fn reap(
    tool: libc::pid_t,
    status: &mut Option<ExitStatus>,
    exited_at: &mut Option<Instant>,
    cpu_limit_s: Option<u64>,
    cpu_limit_reached: &mut Option<bool>,
) {
    if let Some(limit) = cpu_limit_s
        && status.is_none()
        && sys::child_has_ended(tool)
    {
        let limit_us = limit.saturating_mul(1_000_000);
        *cpu_limit_reached = sys::rlimit_cpu_clock_us(tool).map(|used| used >= limit_us);
    }
    while let Ok(Some((pid, raw))) = sys::reap_any_child() {
        if pid == tool {
            let decoded = if libc::WIFEXITED(raw) {
                Some(ExitStatus::Code(libc::WEXITSTATUS(raw)))
            } else if libc::WIFSIGNALED(raw) {
                Some(ExitStatus::Signal(libc::WTERMSIG(raw)))
            } else {
                None
            };
            if decoded.is_some() {
                *status = decoded;
                *exited_at = Some(Instant::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_exec_names_the_program_and_its_errno() {
        let error = RunError::Exec {
            program: "/usr/bin/missing".into(),
            errno: libc::ENOENT,
        };
        assert_eq!(error.errno(), Some(libc::ENOENT));
        // The CLI tells 127 from 126 by this text.
        assert_eq!(
            error.to_string(),
            "cannot execute /usr/bin/missing: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn other_failures_name_the_operation() {
        let pipe = RunError::Pipe(std::io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!(pipe.errno(), Some(libc::EMFILE));
        assert!(pipe.to_string().starts_with("pipe: "), "{pipe}");
        let nul = checked_cstring("a\0b", "argument").err();
        assert_eq!(
            nul.map(|e| (e.to_string(), e.errno())),
            Some(("argument contains NUL".to_string(), None))
        );
        assert_eq!(RunError::EmptyArgv.to_string(), "empty argv");
    }
}
