//! An idmapped, read-only view of a directory, attached by descriptor: a user namespace
//! made only to describe the mapping, and the mount API calls (Linux 5.12) that use it.
//! The worker has its own calls for its binds; the library does not link the worker.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::{check, check_int};

/// A user namespace with the uid and gid maps `uid_map` and `gid_map` (lines of
/// "inside outside count"), held by its descriptor alone: the process made to own it
/// has been reaped when this returns.
///
/// A multi-threaded process cannot unshare a user namespace, so a child is cloned into
/// one; the maps are written from here (root writes any map) before the namespace is
/// opened.
pub fn mapping_namespace(uid_map: &str, gid_map: &str) -> io::Result<OwnedFd> {
    let mut ends = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given, which outlives it.
    check_int(unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded: both are fresh descriptors owned by nobody else.
    let (release_read, release_write) =
        unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
    let (read_fd, write_fd) = (release_read.as_raw_fd(), release_write.as_raw_fd());
    // SAFETY: a clone without CLONE_VM gives the child a copy of this process's memory, of
    // which it uses only the two integers above and a byte on its stack: it makes raw
    // close, read and exit syscalls and nothing else (no allocation, lock, libc state or
    // unwinding), so whatever the other threads were doing in the copy is never touched.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        // The child: its copy of the write end closed, so that the parent's going away
        // ends the read; then it lives until released.
        let mut byte = 0u8;
        // SAFETY: raw syscalls on descriptors and a byte this child owns; exit_group never
        // returns.
        unsafe {
            libc::syscall(libc::SYS_close, write_fd);
            libc::syscall(libc::SYS_read, read_fd, &mut byte as *mut u8, 1usize);
            libc::syscall(libc::SYS_exit_group, 0);
        }
        // exit_group does not return; should it, the child must not run on.
        loop {
            // SAFETY: as above.
            unsafe { libc::syscall(libc::SYS_exit_group, 0) };
        }
    }
    let pid = check(pid)?;
    let child = Child {
        pid: libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?,
        release: Some(release_write),
    };
    drop(release_read);
    let proc = format!("/proc/{}", child.pid);
    std::fs::write(format!("{proc}/uid_map"), uid_map)?;
    std::fs::write(format!("{proc}/gid_map"), gid_map)?;
    let namespace = std::fs::File::open(format!("{proc}/ns/user"))?;
    drop(child);
    Ok(OwnedFd::from(namespace))
}

/// The child holding a mapping namespace: released and reaped when dropped.
struct Child {
    pid: libc::pid_t,
    release: Option<OwnedFd>,
}

impl Drop for Child {
    fn drop(&mut self) {
        // Its read returns (end of file) and it exits.
        drop(self.release.take());
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child; `status` outlives the call.
            let ret = unsafe { libc::waitpid(self.pid, &mut status, libc::__WALL) };
            if ret >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
    }
}

/// `MOUNT_ATTR_*` of <linux/mount.h>.
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// A detached copy of the mount at `source` (not its submounts), read-only, nosuid and
/// nodev, showing owners through the maps of `userns` when one is given.
pub fn detached_read_only_view(source: &OwnedFd, userns: Option<&OwnedFd>) -> io::Result<OwnedFd> {
    // <linux/mount.h>; libc names it only in a module it does not export.
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let flags =
        OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint;
    // SAFETY: the path is an empty NUL-terminated string and AT_EMPTY_PATH makes the kernel
    // use `source` itself; no other memory of ours is read.
    let fd = check(unsafe {
        libc::syscall(libc::SYS_open_tree, source.as_raw_fd(), c"".as_ptr(), flags)
    })?;
    let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: open_tree returned a fresh descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(fd) };
    // struct mount_attr, MOUNT_ATTR_SIZE_VER0 (32 bytes).
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let mut set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    let mut userns_fd = 0;
    if let Some(userns) = userns {
        set |= MOUNT_ATTR_IDMAP;
        userns_fd = u64::try_from(userns.as_raw_fd())
            .map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    }
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd,
    };
    // SAFETY: `attr` is initialised, lives across the call and has the size passed; the
    // kernel only reads it. The empty path with AT_EMPTY_PATH names `tree` itself.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(tree)
}

/// Attaches the detached mount `tree` on the directory `point` (both by descriptor).
pub fn attach_mount(tree: &OwnedFd, point: &OwnedFd) -> io::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    // SAFETY: both paths are empty NUL-terminated strings that, with the EMPTY_PATH flags,
    // name the descriptors themselves; the kernel reads no other memory of ours.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            point.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_namespace_is_a_user_namespace_of_its_own() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let namespace = mapping_namespace("1000 4242 1\n", "1000 4343 1\n").unwrap();
        let target = std::fs::read_link(format!("/proc/self/fd/{}", namespace.as_raw_fd()))
            .unwrap()
            .display()
            .to_string();
        assert!(target.starts_with("user:["), "{target}");
        let mine = std::fs::read_link("/proc/self/ns/user").unwrap();
        assert_ne!(target, mine.display().to_string());
    }
}
