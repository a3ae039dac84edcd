//! Network namespaces a spawner thread moves between: entering one by descriptor, naming
//! the thread's current one, and asking whether any unix socket still lives in it.

use std::io::{self, Read};
use std::os::fd::OwnedFd;

/// Moves the calling thread (only) into the network namespace behind `namespace` (an nsfs
/// descriptor). Needs CAP_SYS_ADMIN over the namespace's owner and in our own user
/// namespace.
pub fn enter_network_namespace(namespace: &OwnedFd) -> io::Result<()> {
    nix::sched::setns(namespace, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

/// A descriptor of the calling thread's network namespace, which keeps it alive.
pub fn open_thread_network_namespace(proc_dir: &OwnedFd) -> io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    nix::fcntl::openat(
        proc_dir,
        "thread-self/ns/net",
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// Whether the calling thread's network namespace holds any unix socket (bound or not,
/// open or only in flight in another socket's queue): `net/unix` lists every one, and is
/// only a header line when there is none.
pub fn thread_network_has_unix_sockets(proc_dir: &OwnedFd) -> io::Result<bool> {
    use nix::fcntl::OFlag;
    let fd = nix::fcntl::openat(
        proc_dir,
        "thread-self/net/unix",
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(io::Error::from)?;
    // A header line, then one line per socket: reading a little more than the header
    // is enough to tell.
    let mut head = [0u8; 256];
    let mut file = std::fs::File::from(fd);
    let mut filled = 0;
    while filled < head.len() {
        match file.read(&mut head[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    match head[..filled].iter().position(|&b| b == b'\n') {
        Some(end) => Ok(filled > end + 1),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "net/unix has no header line",
        )),
    }
}
