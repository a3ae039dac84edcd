//! The only `unsafe` of the battery: raw system calls a hostile tool would make. Every call
//! here either passes scalars/NULL, or pointers to memory owned by the caller for the whole
//! call; the kernel (or the seccomp filter in front of it) validates everything else.

use std::ffi::CStr;

/// The calling thread's errno after a failed libc call.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A raw syscall with six arguments: the return value, or the errno.
pub fn syscall(nr: libc::c_long, args: [libc::c_long; 6]) -> Result<libc::c_long, i32> {
    // SAFETY: callers pass scalars, NULL, or pointers into memory they own for the duration
    // of the call (see the module comment); a bad pointer makes the kernel return EFAULT.
    let ret = unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) };
    if ret < 0 { Err(errno()) } else { Ok(ret) }
}

/// `clone`/`clone3` succeeded in the child: leave at once, without running destructors or
/// flushing the parent's buffers twice.
pub fn exit_child() -> ! {
    // SAFETY: _exit has no preconditions and never returns.
    unsafe { libc::_exit(0) }
}

/// `clone3` with the given flags; the child exits at once.
pub fn clone3(flags: u64) -> Result<libc::c_long, i32> {
    // SAFETY: clone_args is plain old data; all-zero is a valid value.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = flags;
    args.exit_signal = libc::SIGCHLD as u64;
    let ptr = &mut args as *mut libc::clone_args as libc::c_long;
    let size = std::mem::size_of::<libc::clone_args>() as libc::c_long;
    match syscall(libc::SYS_clone3, [ptr, size, 0, 0, 0, 0]) {
        Ok(0) => exit_child(),
        other => other,
    }
}

/// `getpid` through the 32-bit `int 0x80` entry (the filter must kill us here).
pub fn int80_getpid() -> libc::c_long {
    let mut ret: i64 = 20; // __NR_getpid on i386
    // SAFETY: the i386 getpid takes no arguments and touches no memory.
    unsafe { std::arch::asm!("int 0x80", inout("rax") ret, options(nostack)) };
    ret
}

/// `fork()`: Ok(0) in the child, Ok(pid) in the parent.
pub fn fork() -> Result<libc::pid_t, i32> {
    // SAFETY: the probe is single-threaded when it forks, and children only call
    // async-signal-safe functions (pause, _exit).
    let pid = unsafe { libc::fork() };
    if pid < 0 { Err(errno()) } else { Ok(pid) }
}

/// Blocks until a signal arrives (a forked child of the fork bomb waits here).
pub fn pause() -> ! {
    loop {
        // SAFETY: pause has no preconditions.
        unsafe { libc::pause() };
    }
}

/// getrlimit's resource argument: an enum type of its own in glibc, a plain int in musl
/// (the static `airlock` is built against musl).
#[cfg(target_env = "gnu")]
pub type RlimitResource = libc::__rlimit_resource_t;
/// getrlimit's resource argument: an enum type of its own in glibc, a plain int in musl
/// (the static `airlock` is built against musl).
#[cfg(not(target_env = "gnu"))]
pub type RlimitResource = libc::c_int;

/// getrlimit: (soft, hard).
pub fn getrlimit(resource: RlimitResource) -> Result<(u64, u64), i32> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the whole call.
    if unsafe { libc::getrlimit(resource, &mut limit) } < 0 {
        return Err(errno());
    }
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// setrlimit to (soft, hard).
pub fn setrlimit(resource: RlimitResource, soft: u64, hard: u64) -> Result<(), i32> {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `limit` is a valid rlimit read by the kernel during the call.
    if unsafe { libc::setrlimit(resource, &limit) } < 0 {
        return Err(errno());
    }
    Ok(())
}

/// The mount flags of the filesystem holding `path` (`ST_*` bits).
pub fn statvfs_flags(path: &CStr) -> Result<u64, i32> {
    // SAFETY: statvfs is plain old data; all-zero is valid.
    let mut buf: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `buf` is writable for the whole call.
    if unsafe { libc::statvfs(path.as_ptr(), &mut buf) } < 0 {
        return Err(errno());
    }
    Ok(buf.f_flag)
}

/// Ignores SIGXFSZ so that exceeding RLIMIT_FSIZE shows as EFBIG rather than a kill.
pub fn ignore_sigxfsz() {
    // SAFETY: SIG_IGN is a valid disposition for SIGXFSZ and no handler code runs.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
}

/// Lets the kernel reap this process's children as they end, unwaited for: their CPU
/// time is then added to no one's `RUSAGE_CHILDREN`.
pub fn ignore_sigchld() {
    // SAFETY: SIG_IGN is a valid disposition for SIGCHLD and no handler code runs.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
}

/// Waits until `pid`, a child nobody waits for, has ended: with SIGCHLD ignored,
/// `waitpid` blocks until it is gone, then fails with ECHILD.
pub fn wait_gone(pid: libc::pid_t) {
    loop {
        // SAFETY: a null status pointer is allowed; waitpid only reads its arguments.
        let ret = unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        if ret == -1 && errno() != libc::EINTR {
            return;
        }
    }
}

/// This process's CPU time (user and system), microseconds.
pub fn own_cpu_us() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid out-pointer for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    (now.tv_sec as u64) * 1_000_000 + (now.tv_nsec as u64) / 1000
}

/// Sends one byte on the unix socket `socket` with `fds` attached (SCM_RIGHTS).
pub fn send_fds(socket: libc::c_int, fds: &[libc::c_int]) -> Result<(), i32> {
    let payload_len = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(payload_len as u32) } as usize;
    // u64 elements keep the buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: msghdr is plain old data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` bytes we own, so CMSG_FIRSTHDR returns a
    // pointer inside it; the header and `payload_len` bytes of data fit (CMSG_SPACE).
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        if header.is_null() {
            return Err(libc::EINVAL);
        }
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(payload_len as u32) as _;
        std::ptr::copy_nonoverlapping(
            fds.as_ptr().cast::<u8>(),
            libc::CMSG_DATA(header),
            payload_len,
        );
    }
    // SAFETY: `msg` and everything it points to (iov, byte, control) live across the call.
    let sent = unsafe { libc::sendmsg(socket, &msg, 0) };
    if sent < 0 { Err(errno()) } else { Ok(()) }
}
