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
        arch: notif.data.arch,
        nr: u32::try_from(notif.data.nr).unwrap_or(u32::MAX),
        args: notif.data.args,
    })
}

/// Fails the notified syscall `id` with `errno` (positive). `ENOENT` when its process is
/// gone already.
pub fn refuse_notification(fd: BorrowedFd<'_>, id: u64, errno: i32) -> io::Result<()> {
    let mut response = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: -errno,
        flags: 0,
    };
    // SAFETY: the ioctl reads one seccomp_notif_resp from `response`, which lives for the
    // call; `flags` 0 means the syscall fails with `error` and does not run.
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
