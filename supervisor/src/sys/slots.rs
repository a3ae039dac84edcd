//! Low descriptor numbers a spawner thread keeps for the descriptors its children need.
//!
//! A worker's child is cloned sharing the supervisor's descriptor table (`CLONE_FILES`) and
//! its first act is `close_range(first, ~0, CLOSE_RANGE_UNSHARE)`, which gives it a private
//! table holding a copy of only the descriptors below `first`. Copying the whole table
//! instead (a plain clone), and closing it again at exec, cost O(descriptors the supervisor
//! holds), which grows with the calls in flight: a 1,024-call burst spent its time there.
//! So whatever the child needs is first copied (`dup3`) into a slot: a number reserved
//! here while the supervisor was young, so `first` stays small. A slot never closes while
//! the thread lives (its number could go to another thread's file); emptied, it holds
//! `/dev/null` again.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `close_range`'s flag: unshare the table first, copying only what lies below the range
/// (Linux 5.9).
pub const CLOSE_RANGE_UNSHARE: i64 = 1 << 1;

/// Slots reserved up front: stdio, socket, image, the handshake, report, unshared and gone
/// pipes, and three cgroup join files (v1: memory, pids, cpu).
const INITIAL_SLOTS: usize = 13;

/// One spawner thread's slots; see the module documentation.
#[derive(Debug)]
pub struct ChildSlots {
    /// What an empty slot holds.
    placeholder: OwnedFd,
    slots: Vec<OwnedFd>,
    /// How many slots, from the first, hold lent descriptors.
    lent: usize,
}

impl ChildSlots {
    /// Reserves the slots: the lowest free numbers from 3 up (never 0–2, which the child
    /// overwrites with the worker's stdio).
    pub fn reserve() -> io::Result<Self> {
        // SAFETY: open of a constant, NUL-terminated path; the result is checked.
        let fd = unsafe {
            libc::open(
                c"/dev/null".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: open returned a fresh descriptor owned by nobody else.
        let placeholder = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut slots = Self {
            placeholder,
            slots: Vec::with_capacity(INITIAL_SLOTS),
            lent: 0,
        };
        for _ in 0..INITIAL_SLOTS {
            slots.add_slot()?;
        }
        Ok(slots)
    }

    fn add_slot(&mut self) -> io::Result<()> {
        // SAFETY: F_DUPFD_CLOEXEC of a descriptor we own returns a fresh one, or -1.
        let fd = unsafe { libc::fcntl(self.placeholder.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        self.slots.push(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(())
    }

    /// Copies `fd` into the next empty slot (close-on-exec) and returns the slot's number.
    pub fn lend(&mut self, fd: RawFd) -> io::Result<RawFd> {
        if self.lent == self.slots.len() {
            self.add_slot()?;
        }
        let slot = self.slots[self.lent].as_raw_fd();
        dup_into(fd, slot)?;
        self.lent += 1;
        Ok(slot)
    }

    /// Whether no slot holds a lent descriptor.
    pub fn is_empty(&self) -> bool {
        self.lent == 0
    }

    /// The lent slots' numbers, ascending, and the lowest number above every slot: what
    /// the child keeps, and where its `close_range` starts.
    pub fn lent(&self) -> (Vec<RawFd>, RawFd) {
        let mut lent: Vec<RawFd> = self.slots[..self.lent]
            .iter()
            .map(AsRawFd::as_raw_fd)
            .collect();
        lent.sort_unstable();
        let first_unreserved = self
            .slots
            .iter()
            .map(AsRawFd::as_raw_fd)
            .max()
            .map_or(3, |fd| fd + 1);
        (lent, first_unreserved)
    }

    /// Empties every lent slot, dropping this table's copies of what it held. Call it only
    /// once no child shares the table any more. A slot that cannot be emptied is closed
    /// instead (it must not keep a copy: a held report pipe would hide a child's exec).
    pub fn clear(&mut self) {
        let placeholder = self.placeholder.as_raw_fd();
        let mut index = 0;
        while index < self.lent {
            if dup_into(placeholder, self.slots[index].as_raw_fd()).is_ok() {
                index += 1;
            } else {
                drop(self.slots.remove(index));
                self.lent -= 1;
            }
        }
        self.lent = 0;
    }
}

/// `dup3(fd, target, O_CLOEXEC)`: atomically replaces what `target` held.
fn dup_into(fd: RawFd, target: RawFd) -> io::Result<()> {
    loop {
        // SAFETY: dup3 onto a number this thread reserved and owns; the file it held is
        // released by the kernel, and the OwnedFd keeps owning the number.
        let ret = unsafe { libc::dup3(fd, target, libc::O_CLOEXEC) };
        if ret >= 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        // EBUSY: another thread's open racing for the number (never ours, but retry).
        if !matches!(error.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) {
            return Err(error);
        }
    }
}

/// Blocks until the child behind `pidfd` has written its byte to `unshared` (it has its
/// own descriptor table now) or has exited. Either way the supervisor's table is its own
/// again.
pub fn await_unshared(unshared: &OwnedFd, pidfd: &OwnedFd) -> io::Result<()> {
    let mut fds = [
        libc::pollfd {
            fd: unshared.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: two valid pollfds for the duration of the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if ready > 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EINTR) {
            return Err(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lent_slots_hold_copies_until_cleared_and_keep_their_numbers() {
        let mut slots = ChildSlots::reserve().unwrap();
        let (read, write) = crate::sys::cloexec_pipe().unwrap();
        let slot = slots.lend(write.as_raw_fd()).unwrap();
        assert!(slot >= 3);
        drop(write);
        let (lent, first_unreserved) = slots.lent();
        assert_eq!(lent, vec![slot]);
        assert!(first_unreserved > slot);
        // The slot's copy keeps the pipe open: no hang-up yet.
        let mut pfd = libc::pollfd {
            fd: read.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        assert_eq!(unsafe { libc::poll(&mut pfd, 1, 0) }, 0);
        slots.clear();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::poll(&mut pfd, 1, 0) }, 1);
        assert!(pfd.revents & libc::POLLHUP != 0);
        assert!(slots.lent().0.is_empty());
        // The number is still ours, now /dev/null again.
        let link = std::fs::read_link(format!("/proc/self/fd/{slot}")).unwrap();
        assert_eq!(link, std::path::Path::new("/dev/null"));
    }

    #[test]
    fn more_descriptors_than_slots_reserve_more() {
        let mut slots = ChildSlots::reserve().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let lent: Vec<RawFd> = (0..INITIAL_SLOTS + 2)
            .map(|_| slots.lend(file.as_raw_fd()).unwrap())
            .collect();
        let mut unique = lent.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), lent.len());
        slots.clear();
    }
}
