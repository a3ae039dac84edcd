//! The supervisor's raw syscalls: the sealed worker image, clone3 into fresh namespaces
//! ([`clone`]), pidfds. Every `unsafe` block of the supervisor is here, with its invariant.

pub mod audit;
mod clone;
mod idmap;
mod netns;
mod notify;
mod slots;

pub use clone::{
    CHILD_STEPS, ChildMemory, ChildStack, InFlightChild, block_all_signals_in_this_thread,
    clone_worker,
};
pub use idmap::{attach_mount, detached_read_only_view, mapping_namespace};
pub use netns::{
    enter_network_namespace, open_thread_network_namespace, thread_network_has_unix_sockets,
};
pub use notify::{
    ListenerState, Notification, continue_notification, is_seccomp_listener, notification_valid,
    poll_listener, read_tool_memory, receive_notification, refuse_notification, stat_in_root,
};
pub use slots::{ChildSlots, await_unshared};

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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

/// Whether `error` says this process (EMFILE) or the whole system (ENFILE) has no
/// descriptor to spare: a condition that passes as others close theirs, which a loop
/// accepting connections should wait out rather than retry at once or give up on.
pub fn out_of_descriptors(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Whether this process could open one more descriptor now: `Err` (EMFILE, ENFILE) if not.
pub fn descriptor_to_spare() -> io::Result<()> {
    std::fs::File::open("/dev/null").map(drop)
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
///
/// F_SEAL_WRITE fails with EBUSY while the kernel still holds transient references to
/// pages just written (the kernel waits a little, then gives up); under load that happens
/// now and then, so EBUSY is retried a bounded number of times before it is an error.
pub fn seal_memfd(fd: &OwnedFd) -> io::Result<()> {
    const ATTEMPTS: u32 = 8;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    let mut attempt = 1;
    loop {
        // SAFETY: F_ADD_SEALS only changes the seals of a descriptor we own.
        match check_int(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) }) {
            Ok(_) => return Ok(()),
            Err(error) if error.raw_os_error() == Some(libc::EBUSY) && attempt < ATTEMPTS => {
                std::thread::sleep(std::time::Duration::from_millis(5 * u64::from(attempt)));
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Asks the kernel to reclaim the whole pages inside `bytes` (MADV_PAGEOUT, Linux 5.4):
/// a hint that never changes their contents, so it is harmless on any memory. For data
/// that is part of the executable's file mapping (an `include_bytes!` image read once)
/// it gives the pages back and they stop counting in the resident set. Best effort.
pub fn page_out(bytes: &[u8]) {
    let page = 4096usize;
    let start = (bytes.as_ptr() as usize).div_ceil(page) * page;
    let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
    if end <= start {
        return;
    }
    // SAFETY: [start, end) lies inside `bytes`, which is mapped; MADV_PAGEOUT only moves
    // pages out and in again and never alters what the memory holds.
    let _ = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT) };
}

/// Gives the C allocator's free memory back to the kernel (glibc's `malloc_trim`). After a
/// burst of calls their freed blocks stay in the allocator's per-thread arenas, resident,
/// until something asks for them; this returns every whole free page. A no-op elsewhere.
pub fn give_back_free_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes no pointers; it walks and shrinks the allocator's own
    // arenas under their locks, which any thread may do at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The seals currently on a memfd.
#[cfg(test)]
pub fn memfd_seals(fd: &OwnedFd) -> io::Result<i32> {
    // SAFETY: F_GET_SEALS only reads.
    check_int(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })
}

/// The kernel's Landlock ABI version (error if Landlock is absent or disabled).
pub fn landlock_abi_version() -> io::Result<i64> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_long = 1;
    // SAFETY: with a NULL attribute pointer, size 0 and the VERSION flag the kernel reads no
    // memory and only returns the ABI number.
    check(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    })
}

/// Moves the calling thread (only) into a new, empty network namespace. Needs
/// CAP_SYS_ADMIN; threads of a process may each have their own network namespace.
pub fn unshare_network_namespace() -> io::Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

/// The host's /proc, for paths below it that must not depend on the thread's mount
/// namespace later.
pub fn open_proc_dir() -> io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    nix::fcntl::open(
        "/proc",
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// Opens `path` below `dir` for writing (close-on-exec).
pub fn open_for_writing_at(dir: &OwnedFd, path: &str) -> io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    nix::fcntl::openat(
        dir,
        path,
        OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// Moves the calling thread (only) into the mount namespace of the process behind
/// `pidfd`, and with `network` into its network namespace too. The thread first stops
/// sharing its root and working directory with the rest of the process (the kernel
/// refuses to switch a mount namespace under a shared `fs`); entering makes the
/// namespace's root the thread's root and working directory.
pub fn enter_mount_namespace_of(pidfd: &OwnedFd, network: bool) -> io::Result<()> {
    use nix::sched::CloneFlags;
    nix::sched::unshare(CloneFlags::CLONE_FS).map_err(io::Error::from)?;
    let mut flags = CloneFlags::CLONE_NEWNS;
    if network {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    nix::sched::setns(pidfd, flags).map_err(io::Error::from)
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

/// Whether the process behind `pidfd` has been reaped: the kernel no longer finds it
/// (a zombie is still found).
pub fn pidfd_process_is_reaped(pidfd: &OwnedFd) -> io::Result<bool> {
    // SAFETY: pidfd_send_signal with signal 0 and a NULL siginfo reads no memory and
    // sends nothing; it only looks the process up.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    match check(ret) {
        Ok(_) => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(true),
        Err(e) => Err(e),
    }
}

/// A pidfd of the process `pid` (tests hand airlock processes they started themselves).
#[cfg(test)]
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and reads no memory.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) })?;
    let fd = std::os::fd::RawFd::try_from(fd)
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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
    wait_pidfd(pidfd, libc::WEXITED | libc::WNOHANG)
}

/// Waits, blocking, until the process behind a pidfd has ended, and reaps it. Only for a
/// process that was sent SIGKILL (it cannot refuse to end); ECHILD (someone reaped it
/// already) counts as done.
pub fn reap_pidfd_blocking(pidfd: &OwnedFd) {
    while matches!(wait_pidfd(pidfd, libc::WEXITED), Err(e) if e.kind() == io::ErrorKind::Interrupted)
    {
    }
}

/// waitid(P_PIDFD) with `flags`; `Ok(None)` when WNOHANG found it still running.
fn wait_pidfd(pidfd: &OwnedFd, flags: libc::c_int) -> io::Result<Option<Ended>> {
    // SAFETY: siginfo_t is plain old data; zero is valid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid out-pointer; P_PIDFD takes the descriptor number as id.
    let ret = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            flags,
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

/// Registers a descriptor (a pidfd, a seccomp listener) with tokio's reactor for readiness.
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
            // Not named `time_t`: libc deprecates that alias on musl. A deadline past
            // 2^63 s is clamped, which fires never in practice.
            tv_sec: after.as_secs().try_into().unwrap_or(i64::MAX),
            tv_nsec: libc::c_long::from(after.subsec_nanos()),
        },
    };
    // SAFETY: `spec` is valid for reads during the call; a NULL old-value pointer is allowed.
    check_int(unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) })?;
    Ok(fd)
}

/// What one `recvmsg` on a stream socket brought: bytes, and the descriptors passed with
/// them.
#[derive(Debug)]
pub struct Received {
    /// Bytes read into the buffer (0 at the end of the stream).
    pub bytes: usize,
    /// Descriptors passed with those bytes, owned (close-on-exec).
    pub descriptors: Vec<OwnedFd>,
    /// The sender passed more descriptors than the read had room for; the kernel closed the
    /// excess.
    pub truncated: bool,
}

/// Reads from the stream socket `socket` into `buffer`, taking ownership of every
/// descriptor passed with the bytes: room for a few, and a sender passing more gets them
/// truncated by the kernel (reported) — never leaked here, as each one installed is owned.
pub fn receive_with_descriptors(socket: &impl AsRawFd, buffer: &mut [u8]) -> io::Result<Received> {
    /// Descriptors one read has room for.
    const ROOM: usize = 4;
    // u64 words: the control buffer must be aligned for `cmsghdr`.
    let mut control = [0u64; 8];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE((ROOM * std::mem::size_of::<libc::c_int>()) as u32) };
    let space = (space as usize).min(std::mem::size_of_val(&control));
    let mut iov = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is an empty header.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = &mut iov;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr().cast();
    // size_t in glibc's msghdr, socklen_t (u32) in musl's; `space` is at most 64.
    header.msg_controllen = space as _;
    // SAFETY: the header points at `buffer` and `control`, both live and of the lengths
    // given, for the duration of the call.
    let read = unsafe {
        libc::recvmsg(
            socket.as_raw_fd(),
            &mut header,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
        )
    };
    let bytes = usize::try_from(read).map_err(|_| io::Error::last_os_error())?;
    let mut descriptors = Vec::new();
    // SAFETY: the kernel set msg_controllen to the control bytes it wrote, whole headers
    // only; CMSG_FIRSTHDR/CMSG_NXTHDR stay within them, and each SCM_RIGHTS header's data
    // holds (cmsg_len - CMSG_LEN(0)) / sizeof(int) descriptors, read unaligned.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&header);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                let length = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..length / std::mem::size_of::<libc::c_int>() {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    // The kernel installed it in our table for this message: we own it.
                    descriptors.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&header, cmsg);
        }
    }
    Ok(Received {
        bytes,
        descriptors,
        truncated: header.msg_flags & libc::MSG_CTRUNC != 0,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn sealing_a_memfd_that_stays_busy_gives_up_with_ebusy() {
        let fd = create_executable_memfd(c"busy").unwrap();
        let file = std::fs::File::from(fd.try_clone().unwrap());
        file.set_len(4096).unwrap();
        // SAFETY: a fresh shared, writable mapping of one page of our own memfd; nothing
        // else uses the address, and it is unmapped below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        // A writable shared mapping keeps F_SEAL_WRITE busy for as long as it exists.
        let error = seal_memfd(&fd).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EBUSY));
        // SAFETY: `map` is the one-page mapping made above, no longer used.
        assert_eq!(unsafe { libc::munmap(map, 4096) }, 0);
        seal_memfd(&fd).unwrap();
        let seals = memfd_seals(&fd).unwrap();
        assert_ne!(seals & libc::F_SEAL_WRITE, 0);
    }
}
