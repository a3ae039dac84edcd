//! The `airlock` binary's own unsafe calls, few and each argued.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};

use nix::sys::inotify::Inotify;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

pub(crate) mod heap;

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

/// Reserves `len` bytes of address space, inaccessible and uncharged, for the switched
/// heap's range; None if the kernel refuses (an address-space limit, say).
fn reserve_address_range(len: usize) -> Option<usize> {
    // SAFETY: a new anonymous mapping at an address the kernel picks touches no existing
    // memory; PROT_NONE and MAP_NORESERVE leave it unbacked until pages are committed.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (addr != libc::MAP_FAILED).then_some(addr as usize)
}

/// Replaces the pages at `addr..addr + len` of a reserved range with fresh zeroed pages of
/// `prot`, keeping the range's addresses mapped (so reserved) whatever `prot` is. Only
/// inaccessible pages are left uncharged: accessible ones count against the commit limit
/// as any heap's do.
fn remap_pages(addr: usize, len: usize, prot: libc::c_int) -> bool {
    let uncharged = if prot == libc::PROT_NONE {
        libc::MAP_NORESERVE
    } else {
        0
    };
    // SAFETY: callers (`commit_pages`, `decommit_pages`) pass page-aligned pages of the
    // heap's reserved range that hold no live block, so replacing them discards nothing in
    // use; MAP_FIXED over our own mapping cannot hit another one.
    let mapped = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | uncharged,
            -1,
            0,
        )
    };
    mapped != libc::MAP_FAILED
}

/// Makes pages of the reserved range readable and writable (and zero) for the heap.
fn commit_pages(addr: usize, len: usize) -> bool {
    remap_pages(addr, len, libc::PROT_READ | libc::PROT_WRITE)
}

/// Gives pages of the reserved range back to the kernel; they stay reserved.
fn decommit_pages(addr: usize, len: usize) -> bool {
    remap_pages(addr, len, libc::PROT_NONE)
}
