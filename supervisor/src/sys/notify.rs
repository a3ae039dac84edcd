//! A seccomp listener's side of user notification (Linux 5.0): what a notifying filter
//! handed over, and the answer. The supervisor only ever answers with an errno — never
//! `SECCOMP_USER_NOTIF_FLAG_CONTINUE` — and reads nothing of the process but the syscall's
//! number and register arguments, which the kernel copies into the notification: no
//! memory of the tool is read, so there is nothing for it to race.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// One syscall a filter handed to its listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notification {
    /// The kernel's cookie for the answer.
    pub id: u64,
    /// The calling thread, as this process's pid namespace numbers it.
    pub pid: u32,
    /// `AUDIT_ARCH_*` of the syscall.
    pub arch: u32,
    /// The syscall number.
    pub nr: u32,
    /// Its six register arguments.
    pub args: [u64; 6],
}

/// Whether `fd` is a seccomp listener: the kernel names its anonymous inode so.
pub fn is_seccomp_listener(fd: BorrowedFd<'_>) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|target| target.as_os_str() == "anon_inode:seccomp notify")
}

/// What [`poll_listener`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerState {
    /// A notification waits: [`receive_notification`] will not block.
    Pending,
    /// Nothing waits now.
    Idle,
    /// No process uses the filter any more: nothing will ever arrive.
    Gone,
}

/// Looks, without waiting, whether a notification waits on `fd`. Receiving blocks when none
/// does, so this is asked before every receive.
pub fn poll_listener(fd: BorrowedFd<'_>) -> io::Result<ListenerState> {
    let mut entry = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a timeout of 0: the call only writes `revents`.
    let ready = unsafe { libc::poll(&mut entry, 1, 0) };
    if ready < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(if entry.revents & libc::POLLIN != 0 {
        ListenerState::Pending
    } else if entry.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        ListenerState::Gone
    } else {
        ListenerState::Idle
    })
}

/// Takes the next notification from `fd`. `ENOENT` when the process that made it was
/// killed or interrupted since (nothing to answer).
pub fn receive_notification(fd: BorrowedFd<'_>) -> io::Result<Notification> {
    // SAFETY: seccomp_notif is plain data; the kernel requires it zeroed before a receive.
    let mut notif: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl writes one seccomp_notif, the size its number encodes, into
    // `notif`, which lives for the call.
    let ret = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            &mut notif as *mut libc::seccomp_notif,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Notification {
        id: notif.id,
        pid: notif.pid,
        arch: notif.data.arch,
        nr: u32::try_from(notif.data.nr).unwrap_or(u32::MAX),
        args: notif.data.args,
    })
}

/// Fails the notified syscall `id` with `errno` (positive). `ENOENT` when its process is
/// gone already.
pub fn refuse_notification(fd: BorrowedFd<'_>, id: u64, errno: i32) -> io::Result<()> {
    respond(
        fd,
        libc::seccomp_notif_resp {
            id,
            val: 0,
            error: -errno,
            flags: 0,
        },
    )
}

/// Whether notification `id` still waits for its answer: its process is alive and blocked
/// in the syscall, so its pid still names it (`SECCOMP_IOCTL_NOTIF_ID_VALID`).
pub fn notification_valid(fd: BorrowedFd<'_>, id: u64) -> bool {
    let mut id = id;
    // SAFETY: the ioctl reads one u64 from `id`, which lives for the call.
    let ret = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
            &mut id as *mut u64,
        )
    };
    ret == 0
}

/// Sends one answer to a notification.
fn respond(fd: BorrowedFd<'_>, mut response: libc::seccomp_notif_resp) -> io::Result<()> {
    // SAFETY: the ioctl reads one seccomp_notif_resp from `response`, which lives for the
    // call.
    let ret = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &mut response as *mut libc::seccomp_notif_resp,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Reads up to `len` bytes of process `pid`'s memory at `address`, stopping early at an
/// unreadable page, or at the first NUL when `until_nul` (which is then not included). Only
/// for `airlock learn`, which reads what an observed syscall names; what it reads decides
/// nothing (the syscall runs regardless), so that the tool may change that memory meanwhile
/// does not matter.
pub fn read_tool_memory(
    pid: u32,
    address: u64,
    len: usize,
    until_nul: bool,
) -> io::Result<Vec<u8>> {
    const PAGE: u64 = 4096;
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    let mut out = Vec::new();
    let mut at = address;
    while out.len() < len {
        // One page at a time: a string may end just before an unmapped page.
        let room = usize::try_from(PAGE - at % PAGE)
            .unwrap_or(1)
            .min(len - out.len());
        let mut chunk = vec![0u8; room];
        let local = libc::iovec {
            iov_base: chunk.as_mut_ptr().cast(),
            iov_len: room,
        };
        let remote = libc::iovec {
            iov_base: at as *mut libc::c_void,
            iov_len: room,
        };
        // SAFETY: `local` describes `chunk`, writable and `room` bytes long, alive for the
        // call; `remote` is only an address in the other process, which the kernel checks.
        let read = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        let read = match usize::try_from(read) {
            Ok(0) => break,
            Ok(n) => n,
            Err(_) if out.is_empty() => return Err(io::Error::last_os_error()),
            Err(_) => break,
        };
        chunk.truncate(read);
        if until_nul && let Some(end) = chunk.iter().position(|b| *b == 0) {
            out.extend_from_slice(&chunk[..end]);
            return Ok(out);
        }
        out.extend_from_slice(&chunk);
        at = at.saturating_add(read as u64);
    }
    Ok(out)
}

/// Lets the notified syscall `id` run as the tool asked (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`).
/// Only for a filter whose program hands over allowed syscalls to be observed (`airlock
/// learn`); never for one the program refuses.
pub fn continue_notification(fd: BorrowedFd<'_>, id: u64) -> io::Result<()> {
    respond(
        fd,
        libc::seccomp_notif_resp {
            id,
            val: 0,
            error: 0,
            flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        },
    )
}

/// Where `path` (absolute, as a tool named it) stands in process `pid`'s own root: resolved
/// with `RESOLVE_IN_ROOT`, so `..` and absolute symlinks the tool made stay inside its root
/// and never reach the supervisor's. For diagnosing a call: `Ok(None)` when the path does
/// not exist there, `Ok(Some(read_only))` with whether its mount is read-only.
pub fn stat_in_root(pid: u32, path: &str) -> io::Result<Option<bool>> {
    use std::ffi::CString;
    use std::os::fd::{FromRawFd, OwnedFd};
    let root = std::fs::File::open(format!("/proc/{pid}/root"))?;
    let relative = CString::new(path.trim_start_matches('/'))
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
    let relative = if relative.as_bytes().is_empty() {
        CString::from(c".")
    } else {
        relative
    };
    // SAFETY: open_how is plain data; all-zero is a valid start.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: `relative` is NUL-terminated and `how` is a valid open_how of the size given,
    // both alive for the call; the result is a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            relative.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR) => Ok(None),
            _ => Err(error),
        };
    }
    let fd = i32::try_from(fd)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "descriptor out of range"))?;
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let stats = nix::sys::statvfs::fstatvfs(&fd).map_err(io::Error::from)?;
    Ok(Some(
        stats
            .flags()
            .contains(nix::sys::statvfs::FsFlags::ST_RDONLY),
    ))
}
