//! The `airlock` binary's own unsafe calls, few and each argued.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};

use nix::sys::inotify::Inotify;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// An inotify instance as tokio's readiness wrapper takes it.
#[derive(Debug)]
pub(crate) struct InotifyFd(pub(crate) Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Registers `inotify` with tokio's reactor for readability.
pub(crate) fn register_inotify(inotify: Inotify) -> io::Result<AsyncFd<InotifyFd>> {
    // SAFETY: an Inotify owns its descriptor (an OwnedFd) and neither closes nor changes it
    // until it is dropped, which happens only with the AsyncFd that owns it from now on:
    // the contract register_with_interest requires.
    unsafe { AsyncFd::register_with_interest(InotifyFd(inotify), Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}
