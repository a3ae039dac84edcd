//! Thin wrappers over the raw syscalls the worker needs and `nix` does not wrap safely.
//!
//! Every `unsafe` block of the worker lives here, each returning `io::Result` and carrying a
//! `// SAFETY:` comment naming its invariant. Callers above this module are safe Rust.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use airlock_protocol::BpfInstruction;

mod alloc;
mod bounding;
mod child_signals;

pub use alloc::SingleThreadedHeap;
pub use bounding::{drop_bounding_set, last_capability};
pub use child_signals::ChildSignals;

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

/// The arguments C `main` received, as strings (lossily, for bytes that are not UTF-8: the
/// worker's only argument is a descriptor number).
///
/// # Safety
///
/// `argv` must point to `argc` NUL-terminated strings that stay alive for the call, as the
/// C runtime's `argv` for `main` does.
pub unsafe fn arguments_of_main(
    argc: libc::c_int,
    argv: *const *const libc::c_char,
) -> Vec<String> {
    let count = usize::try_from(argc).unwrap_or(0);
    if argv.is_null() {
        return Vec::new();
    }
    (0..count)
        .map(|i| {
            // SAFETY: i < argc, and the caller guarantees argv[0..argc] are valid strings.
            let arg = unsafe { *argv.add(i) };
            if arg.is_null() {
                return String::new();
            }
            // SAFETY: as above, `arg` is NUL-terminated and alive for the call.
            unsafe { CStr::from_ptr(arg) }
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// The Landlock ABI version the kernel offers (`Err` with ENOSYS or EOPNOTSUPP when
/// Landlock is compiled out or not in the active LSM list).
pub fn landlock_abi_version() -> io::Result<i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attribute pointer, size 0 and the VERSION flag the kernel reads no
    // memory and only returns the ABI number.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    check(ret).map(|v| v as i32)
}

/// Installs a seccomp filter on the calling thread (the worker is single-threaded, so the
/// whole process). `no_new_privs` must already be set.
pub fn install_seccomp_filter(program: &[BpfInstruction]) -> io::Result<()> {
    install_filter(program, 0).map(drop)
}

/// Installs `program` with a listener (`SECCOMP_FILTER_FLAG_NEW_LISTENER`, Linux 5.0) and
/// returns it: the descriptor on which the syscalls the program hands over arrive. Fails
/// with `EBUSY` where a filter in the chain has a listener already.
pub fn install_seccomp_filter_with_listener(program: &[BpfInstruction]) -> io::Result<OwnedFd> {
    let fd = install_filter(program, libc::SECCOMP_FILTER_FLAG_NEW_LISTENER)?;
    let fd = RawFd::try_from(fd)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "listener out of range"))?;
    // SAFETY: with NEW_LISTENER a successful seccomp() returns a new descriptor (close-on-
    // exec) that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn install_filter(program: &[BpfInstruction], flags: libc::c_ulong) -> io::Result<libc::c_long> {
    let filters: Vec<libc::sock_filter> = program
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    let len = u16::try_from(filters.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "seccomp program too long"))?;
    let fprog = libc::sock_fprog {
        len,
        filter: filters.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `filters`, which outlives the call; the kernel copies the
    // program during the syscall and keeps no pointer to our memory.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags as libc::c_uint,
            &fprog as *const libc::sock_fprog,
        )
    };
    check(ret)
}

/// A detached copy of the mount `source` is on, rooted at `source` itself, not recursive
/// (what `mount --bind` makes, attached nowhere yet): `open_tree(OPEN_TREE_CLONE)`, Linux 5.2.
pub fn clone_mount_detached(source: &OwnedFd) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    // <linux/mount.h>; libc names it only in a module it does not export.
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let flags =
        OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint;
    // SAFETY: the path is an empty NUL-terminated string and AT_EMPTY_PATH makes the kernel
    // use `source` itself; no other memory of ours is read.
    let fd = check(unsafe {
        libc::syscall(libc::SYS_open_tree, source.as_raw_fd(), c"".as_ptr(), flags)
    })?;
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: open_tree returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `MOUNT_ATTR_*` flags of <linux/mount.h>, for [`set_mount_attributes`].
pub mod mount_attr {
    /// Read-only.
    pub const RDONLY: u64 = 0x1;
    /// Set-user-id bits and file capabilities ignored.
    pub const NOSUID: u64 = 0x2;
    /// Device nodes unusable.
    pub const NODEV: u64 = 0x4;
    /// Nothing executable.
    pub const NOEXEC: u64 = 0x8;
}

/// Adds the [`mount_attr`] flags `set` to the mount `mount` (for example a detached tree
/// from [`clone_mount_detached`]): `mount_setattr`, Linux 5.12. Flags not named stay as
/// they are, so the ones the kernel locked on an inherited mount need no repeating.
pub fn set_mount_attributes(mount: &OwnedFd, set: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // struct mount_attr, MOUNT_ATTR_SIZE_VER0 (32 bytes).
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `attr` is initialised, lives across the call and has the size passed; the
    // kernel only reads it. The empty path with AT_EMPTY_PATH names `mount` itself.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(ret).map(drop)
}

/// Attaches the detached tree `mount` on the mount point `point`, both by descriptor (no
/// path is looked up): `move_mount`, Linux 5.2.
pub fn attach_mount(mount: &OwnedFd, point: &OwnedFd) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    // SAFETY: both paths are empty NUL-terminated strings that, with the EMPTY_PATH flags,
    // name the descriptors themselves; the kernel reads no other memory of ours.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount.as_raw_fd(),
            c"".as_ptr(),
            point.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    check(ret).map(drop)
}

/// Closes every descriptor from `first` upwards.
pub fn close_descriptors_from(first: u32) -> io::Result<()> {
    close_descriptor_range(first, u32::MAX)
}

/// Closes the descriptors `first..=last`.
pub fn close_descriptor_range(first: u32, last: u32) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; the worker owns every fd in the range
    // and holds no Rust object wrapping one of them (the protocol socket is outside it).
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
    check(ret).map(drop)
}

/// Brings the loopback interface of the current network namespace up.
pub fn bring_loopback_up() -> io::Result<()> {
    // SAFETY: plain socket creation; the fd is immediately owned by OwnedFd.
    let fd = check_int(unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)
    })?;
    // SAFETY: `fd` was just returned by socket() and is owned by nobody else.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: SIOCGIFFLAGS reads and writes only `request`, which lives across the call.
    check_int(unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut request) })?;
    // SAFETY: the union field written by SIOCGIFFLAGS is ifru_flags.
    unsafe {
        request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above; SIOCSIFFLAGS reads `request`.
    check_int(unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS as _, &request) })?;
    Ok(())
}

/// What `fork` returned.
#[derive(Debug)]
pub enum Forked {
    /// In the parent, with the child's pid.
    Parent(libc::pid_t),
    /// In the child.
    Child,
}

/// Forks the worker. Sound because the worker is single-threaded: no other thread can hold
/// a lock the child would inherit.
pub fn fork_single_threaded() -> io::Result<Forked> {
    // SAFETY: the worker never starts threads (it is a freshly exec'd, tokio-free program),
    // so the child inherits no lock held by another thread.
    let pid = check_int(unsafe { libc::fork() })?;
    Ok(if pid == 0 {
        Forked::Child
    } else {
        Forked::Parent(pid)
    })
}

/// The stack a [`spawn_vfork`] child runs on. Made once per worker, ideally while it idles
/// in the pool, with the pages the child touches already faulted in: allocated and touched
/// at spawn time it cost a 128 KiB mmap and two or three page faults on the call's
/// critical path.
pub struct ChildStack {
    memory: Box<[std::mem::MaybeUninit<u8>]>,
}

impl ChildStack {
    const BYTES: usize = 64 << 10;
    /// The child uses only the top page or two; these are touched ahead.
    const WARM_BYTES: usize = 8 << 10;

    /// Allocates the stack and faults in its top pages. Left uninitialised otherwise:
    /// zeroing all of it (`vec![0; n]`) faulted in every page, on the call's critical path.
    pub fn new() -> Self {
        let mut memory = Box::<[u8]>::new_uninit_slice(Self::BYTES);
        let len = memory.len();
        for byte in memory[len - Self::WARM_BYTES..].iter_mut().step_by(1024) {
            byte.write(0);
        }
        // Keeps the touching writes: nothing reads them before clone gets the pointer.
        std::hint::black_box(&mut memory);
        Self { memory }
    }

    /// The aligned top of the stack (it grows down), 16-byte aligned as the ABI wants.
    fn top(&mut self) -> *mut libc::c_void {
        let end = self.memory.as_mut_ptr().wrapping_add(self.memory.len());
        end.wrapping_sub(end as usize % 16).cast()
    }
}

impl std::fmt::Debug for ChildStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildStack")
            .field("bytes", &self.memory.len())
            .finish()
    }
}

impl Default for ChildStack {
    fn default() -> Self {
        Self::new()
    }
}

/// Starts `child` in a new process that shares this one's memory and runs on `stack`,
/// with this process suspended until the child execs or exits (CLONE_VM|CLONE_VFORK,
/// what posix_spawn does): no page tables are copied and nothing is copy-on-write
/// afterwards, both of which a fork of the worker paid for on every call. `child` must
/// only make syscalls on data prepared before the call — no allocation — and end in exec
/// or `_exit`; it may store into memory it borrows (an atomic, say), which the parent sees
/// once this returns.
pub fn spawn_vfork<F: FnMut() -> i32>(
    child: &mut F,
    stack: &mut ChildStack,
) -> io::Result<libc::pid_t> {
    extern "C" fn trampoline<F: FnMut() -> i32>(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `&mut F` passed to clone below, alive while the parent is
        // suspended (CLONE_VFORK) in spawn_vfork's frame.
        let child = unsafe { &mut *arg.cast::<F>() };
        child()
    }
    let top = stack.top();
    // SAFETY: `top` is the aligned end of a live buffer only the child uses (borrowed
    // mutably for this call); the parent is suspended until the child execs or exits, so
    // `stack` and `child` outlive its use of them, and the worker is single-threaded, so
    // no other thread touches the shared memory meanwhile.
    let pid = unsafe {
        libc::clone(
            trampoline::<F>,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (child as *mut F).cast(),
        )
    };
    check_int(pid)
}

/// Changes directory without allocating (for a [`spawn_vfork`] child).
pub fn change_directory(path: &CStr) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated and lives for the call.
    check_int(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}

/// Makes the calling process the leader of a new session, with no controlling terminal.
pub fn new_session() -> io::Result<()> {
    // SAFETY: setsid takes no arguments.
    check_int(unsafe { libc::setsid() }).map(drop)
}

/// NULL-terminated pointers to `strings`, for exec; valid while `strings` lives.
pub fn pointer_array(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Executes `path` with prepared NULL-terminated `argv` and `envp` ([`pointer_array`]) without
/// allocating; returns only on failure.
pub fn execute_prepared(
    path: &CStr,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
) -> io::Error {
    if argv.last().is_none_or(|p| !p.is_null()) || envp.last().is_none_or(|p| !p.is_null()) {
        return io::Error::from_raw_os_error(libc::EINVAL);
    }
    // SAFETY: both arrays are NULL-terminated (checked above) and point to NUL-terminated
    // strings the caller keeps alive for the call.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    io::Error::last_os_error()
}

/// Duplicates `old` onto `new` (clearing close-on-exec on `new`).
pub fn duplicate_onto(old: RawFd, new: RawFd) -> io::Result<()> {
    if old == new {
        // dup2 would keep FD_CLOEXEC; clear it explicitly.
        // SAFETY: fcntl on a descriptor number only changes its flags.
        check_int(unsafe { libc::fcntl(new, libc::F_SETFD, 0) })?;
        return Ok(());
    }
    // SAFETY: dup2 only manipulates the descriptor table.
    check_int(unsafe { libc::dup2(old, new) }).map(drop)
}

/// Executes `path` with `argv` and `envp`; returns only on failure.
pub fn execute(path: &CString, argv: &[CString], envp: &[CString]) -> io::Error {
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    // SAFETY: every pointer refers to a NUL-terminated CString that outlives the call, and
    // both arrays are NULL-terminated as execve requires.
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr()) };
    io::Error::last_os_error()
}

/// Exits the calling process immediately, without running Rust destructors or atexit
/// handlers (used in a forked child whose exec failed).
pub fn exit_immediately(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no Rust state.
    unsafe { libc::_exit(code) }
}

/// Waits for any child without blocking; `Ok(None)` when none has changed state.
pub fn reap_any_child() -> io::Result<Option<(libc::pid_t, libc::c_int)>> {
    let mut status: libc::c_int = 0;
    // SAFETY: `status` is a valid out-pointer for the duration of the call.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
    match pid {
        0 => Ok(None),
        p if p > 0 => Ok(Some((p, status))),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Sends SIGKILL to every process this one may signal; as PID 1 of a pid namespace that is
/// every other process in the namespace.
pub fn kill_every_other_process() -> io::Result<()> {
    // SAFETY: kill with pid -1 has no memory effects.
    check_int(unsafe { libc::kill(-1, libc::SIGKILL) }).map(drop)
}

/// Whether `pid`, a child of this process, has ended; it is left unreaped (a zombie), so
/// that what the kernel still keeps of it can be read.
pub fn child_has_ended(pid: libc::pid_t) -> bool {
    let Ok(id) = libc::id_t::try_from(pid) else {
        return false;
    };
    // SAFETY: siginfo_t is plain old data, for which all zeroes is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: `info` is a valid out-pointer; WNOWAIT leaves the child as it is.
    let ret = unsafe { libc::waitid(libc::P_PID, id, &mut info, flags) };
    // SAFETY: after a successful waitid, si_pid is the child's pid, or 0 when it has not
    // changed state.
    ret == 0 && unsafe { info.si_pid() } == pid
}

/// The CPU time the kernel checks `pid`'s RLIMIT_CPU against, in µs: its process clock of
/// kind PROF, user plus system time as sampled at the scheduler's ticks. Readable while
/// the process is unreaped.
pub fn rlimit_cpu_clock_us(pid: libc::pid_t) -> Option<u64> {
    // The kernel's id for a process's CPU clock: the pid's complement shifted past the
    // three low bits, which say the kind (PROF is 0) and, unset, a whole process.
    let clock = (!libc::clockid_t::from(pid)) << 3;
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `time` is a valid out-pointer for the duration of the call.
    let ret = unsafe { libc::clock_gettime(clock, &mut time) };
    let seconds = u64::try_from(time.tv_sec).ok()?;
    let nanos = u64::try_from(time.tv_nsec).ok()?;
    (ret == 0).then(|| {
        seconds
            .saturating_mul(1_000_000)
            .saturating_add(nanos / 1_000)
    })
}

/// This process's soft CPU-time limit in seconds (what the tool it forks inherits), `None`
/// when unlimited.
pub fn cpu_soft_limit_s() -> io::Result<Option<u64>> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid out-pointer for the duration of the call.
    check_int(unsafe { libc::getrlimit(libc::RLIMIT_CPU, &mut limit) })?;
    Ok((limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur))
}

/// CPU time used by reaped children: (user µs, system µs).
pub fn children_cpu_time_us() -> (u64, u64) {
    cpu_time_us(libc::RUSAGE_CHILDREN)
}

/// The worker's own user plus system CPU time, microseconds (0 if it cannot be read).
pub fn own_cpu_time_us() -> u64 {
    let (user, system) = cpu_time_us(libc::RUSAGE_SELF);
    user.saturating_add(system)
}

/// `getrusage(who)`'s user and system time, microseconds ((0, 0) if it fails).
fn cpu_time_us(who: libc::c_int) -> (u64, u64) {
    // SAFETY: rusage is plain old data and getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid out-pointer.
    let ret = unsafe { libc::getrusage(who, &mut usage) };
    if ret != 0 {
        return (0, 0);
    }
    let micros = |t: libc::timeval| {
        (t.tv_sec as u64)
            .saturating_mul(1_000_000)
            .saturating_add(t.tv_usec as u64)
    };
    (micros(usage.ru_utime), micros(usage.ru_stime))
}

/// A pidfd for a child, so the worker can poll for its exit.
pub fn open_pidfd(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) })?;
    // SAFETY: the descriptor was just created for us and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Polls descriptors for readability/writability; returns the revents per entry.
pub fn poll_descriptors(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: `fds` is a valid mutable slice of pollfd for the duration of the call.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    match check_int(ret) {
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        other => other.map(|n| n as usize),
    }
}

/// Marks a freshly made pipe end non-blocking. Its only status flag is its access mode,
/// which F_SETFL ignores, so no F_GETFL is needed to keep the others.
pub fn set_fresh_pipe_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor number only changes its status flags.
    check_int(unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) }).map(drop)
}

/// A pipe whose both ends are close-on-exec: (read end, write end).
pub fn cloexec_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    check_int(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 returned two fresh descriptors that nobody else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Writes bytes to a raw descriptor (used in a forked child before exec, where the only
/// handle to the error pipe is its number).
pub fn write_raw(fd: RawFd, bytes: &[u8]) -> io::Result<usize> {
    // SAFETY: `bytes` is a valid slice for the duration of the call; write does not retain it.
    let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Whether this process has any child left, running, stopped or a zombie. As PID 1 of a
/// pid namespace, none means the namespace holds no other process: every process in it
/// descends from us, and an orphan is re-parented to us or to a subreaper that is itself
/// a descendant.
pub fn has_children() -> bool {
    // SAFETY: an all-zero siginfo_t is a valid value of the plain C struct.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL;
    // SAFETY: `info` is a valid out-pointer for the duration of the call; WNOWAIT leaves
    // any child it reports waitable.
    let ret = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, flags) };
    !(ret == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD))
}

/// Blocks until every child has been reaped (ECHILD).
pub fn reap_all_children() -> io::Result<()> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: `status` is a valid out-pointer for the duration of the call.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
        if pid < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ECHILD) => return Ok(()),
                Some(libc::EINTR) => continue,
                _ => return Err(e),
            }
        }
    }
}

/// Takes ownership of an inherited descriptor number after checking it is open, and marks
/// it close-on-exec so no tool process inherits it.
pub fn adopt_descriptor(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_SETFD only changes the descriptor's flags; it fails with EBADF if not open.
    check_int(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) })?;
    // SAFETY: the descriptor is open (checked above) and was handed to this process by the
    // supervisor for exactly this purpose; nothing else in the worker owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Ignores SIGXFSZ: a built-in running in the worker itself that passes RLIMIT_FSIZE gets
/// EFBIG and reports it, instead of the signal killing the worker.
pub fn ignore_file_size_signal() {
    // SAFETY: SIG_IGN installs no handler code; the worker is single-threaded.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
}

/// Puts every signal back to its default action, except SIGPIPE, which the worker ignores
/// (a tool that exits without reading its stdin must not kill the worker writing it). The
/// worker inherits the supervisor's dispositions across exec wherever they are "ignore",
/// including glibc's reserved signals 32 and 33, which glibc's `signal` refuses to touch:
/// so the raw syscall.
pub fn reset_signal_dispositions() {
    for signal in 1..=libc::SIGRTMAX() {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        set_disposition_raw(signal, signal == libc::SIGPIPE);
    }
}

#[cfg(target_arch = "x86_64")]
fn set_disposition_raw(signal: libc::c_int, ignore: bool) {
    /// The kernel's `struct sigaction` on x86_64 (not glibc's).
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }
    let action = KernelSigaction {
        // SIG_DFL is 0, SIG_IGN 1: no handler code is installed.
        handler: usize::from(ignore),
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: `action` is a valid kernel sigaction for the call, no old action is asked
    // for, the mask size is the kernel's (8 bytes); the worker is single-threaded.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            signal,
            &action as *const KernelSigaction,
            std::ptr::null::<KernelSigaction>(),
            8usize,
        )
    };
}

#[cfg(not(target_arch = "x86_64"))]
fn set_disposition_raw(signal: libc::c_int, ignore: bool) {
    let action = if ignore { libc::SIG_IGN } else { libc::SIG_DFL };
    // SAFETY: SIG_DFL/SIG_IGN install no handler code; the worker is single-threaded.
    // (glibc refuses its reserved signals here; they keep their state.)
    unsafe { libc::signal(signal, action) };
}

/// In a forked tool child: the signals the worker ignores for itself go back to their
/// default, since exec would keep them ignored for the tool.
pub fn restore_default_signals_for_tool() {
    for signal in [libc::SIGPIPE, libc::SIGXFSZ] {
        // SAFETY: SIG_DFL installs no handler code; the child is single-threaded.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_of_main_reads_argc_strings_and_replaces_bad_utf8() {
        let owned = [
            CString::new("airlock-worker").unwrap(),
            CString::new("__airlock_worker").unwrap(),
            CString::new(b"3\xff".to_vec()).unwrap(),
            CString::new("past argc").unwrap(),
        ];
        let argv = pointer_array(&owned);
        // SAFETY: argv holds 4 valid strings (and a NULL), alive until the end of the test.
        let args = unsafe { arguments_of_main(3, argv.as_ptr()) };
        assert_eq!(args, ["airlock-worker", "__airlock_worker", "3\u{fffd}"]);
        // SAFETY: a null argv is refused before it is read.
        assert!(unsafe { arguments_of_main(2, std::ptr::null()) }.is_empty());
        // SAFETY: a negative count reads nothing.
        assert!(unsafe { arguments_of_main(-1, argv.as_ptr()) }.is_empty());
    }
}
