//! SIGCHLD as a descriptor: a handler writes a byte to a pipe, so the worker's poll wakes
//! the moment any child changes state — the tool, or an orphan of the tool that the
//! worker, init of its pid namespace, inherited — instead of waking on a timer to look.
//! A worker woken 50 times a second per call in flight spent a busy daemon's CPU on
//! nothing while its tools slept.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use super::{cloexec_pipe, set_fresh_pipe_nonblocking};

/// The write end the handler reports on; -1 while no [`ChildSignals`] exists.
static REPORT_TO: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_child_signal(_: libc::c_int) {
    let fd = REPORT_TO.load(Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    // SAFETY: __errno_location returns this thread's errno slot (glibc and musl alike);
    // it is saved and restored so that the interrupted code never sees write's errno.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: as above; reading and writing one's own errno slot.
    let saved = unsafe { *errno };
    let byte = 1u8;
    // SAFETY: write(2) is async-signal-safe; the byte lives on this frame. The pipe is
    // non-blocking: when it is full (EAGAIN) the reader is already woken.
    let _ = unsafe { libc::write(fd, (&raw const byte).cast(), 1) };
    // SAFETY: restoring the slot read above.
    unsafe { *errno = saved };
}

/// While it lives, SIGCHLD makes [`ChildSignals::fd`] readable.
#[derive(Debug)]
pub struct ChildSignals {
    read: OwnedFd,
    /// Closed on drop, after the handler stopped using it.
    _write: OwnedFd,
}

impl ChildSignals {
    /// Installs the handler (with SA_RESTART, so no other call of the worker sees EINTR).
    /// Handlers do not survive exec, so the tool starts with SIGCHLD at its default.
    pub fn install() -> io::Result<Self> {
        let (read, write) = cloexec_pipe()?;
        set_fresh_pipe_nonblocking(read.as_raw_fd())?;
        set_fresh_pipe_nonblocking(write.as_raw_fd())?;
        REPORT_TO.store(write.as_raw_fd(), Ordering::SeqCst);
        if let Err(error) =
            set_child_signal_action(on_child_signal as *const () as libc::sighandler_t)
        {
            REPORT_TO.store(-1, Ordering::SeqCst);
            return Err(error);
        }
        Ok(Self {
            read,
            _write: write,
        })
    }

    /// The descriptor to poll for readability.
    pub fn fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }

    /// Empties the pipe; call before reaping, so that a child ending after the reap
    /// still wakes the next poll.
    pub fn drain(&self) {
        let mut buffer = [0u8; 64];
        loop {
            // SAFETY: reads into a buffer of the given length on a descriptor we own.
            let n = unsafe { libc::read(self.fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
            if n <= 0 {
                return;
            }
        }
    }
}

impl Drop for ChildSignals {
    fn drop(&mut self) {
        // The handler stops reporting before the descriptor it writes to is closed (and
        // its number possibly reused).
        REPORT_TO.store(-1, Ordering::SeqCst);
        let _ = set_child_signal_action(libc::SIG_DFL);
    }
}

fn set_child_signal_action(handler: libc::sighandler_t) -> io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid starting point; every field used is set below.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler;
    action.sa_flags = libc::SA_RESTART | libc::SA_NOCLDSTOP;
    // SAFETY: sa_mask is a valid sigset_t inside `action`.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: `action` is fully initialised; the handler (if any) is async-signal-safe.
    let ret = unsafe { libc::sigaction(libc::SIGCHLD, &action, std::ptr::null_mut()) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
