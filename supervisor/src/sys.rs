//! The supervisor's raw syscalls: the sealed worker image, clone3 into fresh namespaces,
//! pidfds. Every `unsafe` block of the supervisor is here, with its invariant.
//!
//! The child side of [`clone_worker`] runs between clone and exec in a copy of a
//! multi-threaded tokio process: it may only make raw, async-signal-safe syscalls on data
//! prepared beforehand — no allocation, no locks, no glibc set*id wrappers (they broadcast
//! to threads that do not exist in the child).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_int(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Creates an anonymous, sealable, close-on-exec memory file that may be executed.
pub fn create_executable_memfd(name: &CStr) -> io::Result<OwnedFd> {
    const MFD_EXEC: libc::c_uint = 0x0010;
    let base = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let mut fd = unsafe { libc::memfd_create(name.as_ptr(), base | MFD_EXEC) };
    if fd < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // Kernels before 6.3 do not know MFD_EXEC; their memfds are executable anyway.
        // SAFETY: as above.
        fd = unsafe { libc::memfd_create(name.as_ptr(), base) };
    }
    let fd = check_int(fd)?;
    // SAFETY: memfd_create returned a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Seals a memfd against every further change (shrink, grow, write, and re-sealing).
pub fn seal_memfd(fd: &OwnedFd) -> io::Result<()> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS only changes the seals of a descriptor we own.
    check_int(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) }).map(drop)
}

/// The seals currently on a memfd.
pub fn memfd_seals(fd: &OwnedFd) -> io::Result<i32> {
    // SAFETY: F_GET_SEALS only reads.
    check_int(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })
}

/// Makes this process a child subreaper, so orphans of workers come back to us, not init.
pub fn become_child_subreaper() -> io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(io::Error::from)
}

/// Everything the child needs between clone and exec, prepared by the parent (the child
/// must not allocate).
#[derive(Debug)]
pub struct ChildPlan<'a> {
    /// The sealed worker image.
    pub image: RawFd,
    /// argv of the worker, NULL-terminated.
    pub argv: &'a [*const libc::c_char],
    /// envp of the worker, NULL-terminated.
    pub envp: &'a [*const libc::c_char],
    /// cgroup.procs files to write "0" into (v1: join our own cgroups).
    pub join_cgroups: &'a [RawFd],
    /// Read end of the handshake pipe: one byte arrives once uid/gid maps are written.
    pub maps_written: RawFd,
    /// Descriptors that become the worker's 0, 1, 2.
    pub stdio: [RawFd; 3],
    /// The worker's protocol socket; its close-on-exec flag is cleared.
    pub socket: RawFd,
    /// Write end of a close-on-exec pipe where the child reports the errno of a failed step.
    pub report: RawFd,
}

/// clone3's CLONE_INTO_CGROUP (Linux 5.7); libc's constant is an overflowing i32.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The namespaces every worker gets.
pub const WORKER_NAMESPACES: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

/// A raw syscall returning -errno style results as io errors, usable in the child.
fn raw(nr: libc::c_long, a: libc::c_long, b: libc::c_long, c: libc::c_long) -> libc::c_long {
    // SAFETY: callers pass syscall numbers and scalar or valid-pointer arguments; this is
    // the plain syscall instruction, async-signal-safe.
    unsafe { libc::syscall(nr, a, b, c) }
}

/// In the child: reports the errno of `step` on the report pipe and exits.
fn child_fail(plan: &ChildPlan<'_>, step: u8) -> ! {
    // SAFETY: __errno_location is thread-local storage of the calling thread.
    let errno = unsafe { *libc::__errno_location() };
    let mut message = [0u8; 5];
    message[0] = step;
    message[1..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: writes a stack buffer to an fd; then _exit, which never returns.
    unsafe {
        libc::write(plan.report, message.as_ptr().cast(), message.len());
        libc::_exit(127)
    }
}

/// Child steps, by number, for [`ChildFailure`].
pub const CHILD_STEPS: [&str; 7] = [
    "join cgroup",
    "wait for uid map",
    "setresgid",
    "setresuid",
    "stdio",
    "parent-death signal",
    "exec worker",
];

/// The child side: runs only raw syscalls, never returns.
fn run_child(plan: &ChildPlan<'_>) -> ! {
    // 0. Join the worker's cgroups first, so everything the worker does is accounted.
    for fd in plan.join_cgroups {
        if raw(
            libc::SYS_write,
            *fd as libc::c_long,
            c"0".as_ptr() as libc::c_long,
            1,
        ) != 1
        {
            child_fail(plan, 0);
        }
    }
    // 1. Wait until the parent has written our uid/gid maps; EOF means it gave up.
    let mut byte = 0u8;
    if raw(
        libc::SYS_read,
        plan.maps_written as libc::c_long,
        (&mut byte as *mut u8) as libc::c_long,
        1,
    ) != 1
    {
        child_fail(plan, 1);
    }
    // 2-3. Become uid/gid 0 *inside* the user namespace (an unprivileged host uid outside),
    // so the exec'd worker keeps its capabilities in the namespace. Raw syscalls: glibc's
    // wrappers would try to synchronise threads that do not exist in this child.
    if raw(libc::SYS_setresgid, 0, 0, 0) != 0 {
        child_fail(plan, 2);
    }
    if raw(libc::SYS_setresuid, 0, 0, 0) != 0 {
        child_fail(plan, 3);
    }
    // 4. stdio, then the socket survives exec.
    for (target, fd) in plan.stdio.iter().enumerate() {
        let ok = if *fd == target as RawFd {
            raw(
                libc::SYS_fcntl,
                *fd as libc::c_long,
                libc::F_SETFD as libc::c_long,
                0,
            ) == 0
        } else {
            raw(
                libc::SYS_dup2,
                *fd as libc::c_long,
                target as libc::c_long,
                0,
            ) >= 0
        };
        if !ok {
            child_fail(plan, 4);
        }
    }
    if raw(
        libc::SYS_fcntl,
        plan.socket as libc::c_long,
        libc::F_SETFD as libc::c_long,
        0,
    ) != 0
    {
        child_fail(plan, 4);
    }
    // 5. Die with the spawning thread (a long-lived thread of the supervisor). Set after the
    // credential change, which clears the parent-death signal.
    if raw(
        libc::SYS_prctl,
        libc::PR_SET_PDEATHSIG as libc::c_long,
        libc::SIGKILL as libc::c_long,
        0,
    ) != 0
    {
        child_fail(plan, 5);
    }
    // 6. Exec the sealed image: no path, so nothing in any sandbox can replace it.
    // SAFETY: argv and envp are NULL-terminated arrays of pointers to CStrings the parent
    // keeps alive until clone returns in the parent (the child has its own copy of memory).
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            plan.image,
            c"".as_ptr(),
            plan.argv.as_ptr(),
            plan.envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
    }
    child_fail(plan, 6)
}

/// A cloned worker: its pid and pidfd.
#[derive(Debug)]
pub struct Cloned {
    /// Host pid.
    pub pid: libc::pid_t,
    /// pidfd of the worker, for signalling and waiting without pid reuse races.
    pub pidfd: OwnedFd,
}

/// clone3 into fresh namespaces (optionally directly into a v2 cgroup), and in the child
/// run [`run_child`].
pub fn clone_worker(
    plan: &ChildPlan<'_>,
    cgroup_dir: Option<RawFd>,
    new_network_namespace: bool,
) -> io::Result<Cloned> {
    let mut pidfd: libc::c_int = -1;
    let mut flags = WORKER_NAMESPACES | libc::CLONE_PIDFD as u64;
    if !new_network_namespace {
        // Host network (TCP narrowed by Landlock port rules, abstract sockets by scoping).
        flags &= !(libc::CLONE_NEWNET as u64);
    }
    if cgroup_dir.is_some() {
        flags |= CLONE_INTO_CGROUP;
    }
    // SAFETY: clone_args is plain old data; zero is a valid value for every field.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = flags;
    args.pidfd = (&mut pidfd as *mut libc::c_int) as u64;
    args.exit_signal = libc::SIGCHLD as u64;
    args.cgroup = cgroup_dir.map_or(0, |fd| fd as u64);
    // SAFETY: `args` is valid for the call; with stack = 0 the child continues on a copy of
    // this thread's stack like fork(), and runs only `run_child`, which makes raw syscalls
    // on memory the parent prepared and then execs or _exits — it never returns here.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    if pid == 0 {
        run_child(plan);
    }
    let pid = check(pid)? as libc::pid_t;
    // SAFETY: CLONE_PIDFD stored a fresh descriptor for the child in `pidfd`.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(Cloned { pid, pidfd })
}

/// Sends a signal through a pidfd (never to a recycled pid).
pub fn signal_pidfd(pidfd: &OwnedFd, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: pidfd_send_signal with a NULL siginfo reads no memory.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    match check(ret) {
        // ESRCH: already exited; that is what we wanted.
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        other => other.map(drop),
    }
}

/// How a process ended, from waitid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Exit code.
    Exited(i32),
    /// Signal.
    Killed(i32),
}

/// Reaps the process behind a pidfd if it has ended (`Ok(None)` if it still runs).
pub fn try_reap_pidfd(pidfd: &OwnedFd) -> io::Result<Option<Ended>> {
    // SAFETY: siginfo_t is plain old data; zero is valid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid out-pointer; P_PIDFD takes the descriptor number as id.
    let ret = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG,
        )
    };
    check_int(ret)?;
    // SAFETY: after a successful waitid these union fields are initialised (pid 0 = none).
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    Ok(Some(if info.si_code == libc::CLD_EXITED {
        Ended::Exited(status)
    } else {
        Ended::Killed(status)
    }))
}

/// Builds a NULL-terminated pointer array over CStrings (which must outlive its use).
pub fn pointer_array(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// A socketpair of close-on-exec stream sockets.
pub fn stream_socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    check_int(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: socketpair returned two fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A close-on-exec pipe: (read end, write end).
pub fn cloexec_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    check_int(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 returned two fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The effective uid and gid of this process.
pub fn effective_ids() -> (u32, u32) {
    (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    )
}

/// Registers a descriptor (a pidfd) with tokio's reactor for readiness.
pub fn register_async_fd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd stays open and keeps the same number until the AsyncFd (its owner
    // from now on) drops it, which is the contract register_with_interest requires.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// A one-shot `CLOCK_MONOTONIC` timer descriptor that becomes readable `after` from now.
pub fn oneshot_timerfd(after: std::time::Duration) -> io::Result<OwnedFd> {
    // SAFETY: timerfd_create takes a clock id and flags and returns a new descriptor.
    let fd = check_int(unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    })?;
    // SAFETY: the descriptor was just created for us and nobody else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // An all-zero it_value would disarm the timer instead of firing at once.
    let after = after.max(std::time::Duration::from_nanos(1));
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: libc::time_t::try_from(after.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(after.subsec_nanos()),
        },
    };
    // SAFETY: `spec` is valid for reads during the call; a NULL old-value pointer is allowed.
    check_int(unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) })?;
    Ok(fd)
}
