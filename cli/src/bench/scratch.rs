//! The bench's scratch directories: the policy files, sockets and session bases it makes.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A new directory `PREFIX-PID-RANDOM` (see [`parent`] for where), removed with
/// everything in it when dropped, whichever way the section that made it ends. Drop what
/// runs from it first (a daemon, sessions whose workspaces are mounted beneath it).
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Makes the directory with `mode` (0700, or 0711 where the sandbox's user must pass
    /// through it). Never one that exists already: the bench usually runs as root, and a
    /// directory another user could name in advance and make first (or point elsewhere by
    /// a symlink) would let them swap the policy the bench's sandboxes run under, or its
    /// daemon's socket.
    pub fn new(prefix: &str, mode: u32) -> io::Result<Self> {
        make_private_dir(&parent(), prefix, mode, random_u64).map(Self)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where the directories go: the system's temporary directory, unless the bench runs as
/// root and that directory is one others may write (`/tmp` is, sticky bit or not), where
/// the daemons it starts would refuse their policy (see `trust`); then `/var/lib`, which
/// only root writes and which, unlike `/run` on some systems, may hold the programs the
/// bench copies and runs.
fn parent() -> PathBuf {
    let temp = std::env::temp_dir();
    let root = nix::unistd::geteuid().is_root();
    if root && crate::trust::check_policy_path(&temp, 0).is_err() {
        PathBuf::from("/var/lib")
    } else {
        temp
    }
}

fn make_private_dir(
    parent: &Path,
    prefix: &str,
    mode: u32,
    mut random: impl FnMut() -> io::Result<u64>,
) -> io::Result<PathBuf> {
    for _ in 0..16 {
        let dir = parent.join(format!(
            "{prefix}-{}-{:016x}",
            std::process::id(),
            random()?
        ));
        // mkdir itself: it fails on any existing name, a symlink's included.
        match std::fs::DirBuilder::new().mode(mode).create(&dir) {
            // The umask may have taken bits away.
            Ok(()) => {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "no unused name for a scratch directory in {}",
            parent.display()
        ),
    ))
}

fn random_u64() -> io::Result<u64> {
    airlock::approvals::os_random::<8>()
        .map(u64::from_ne_bytes)
        .ok_or_else(|| io::Error::other("no random source (/dev/urandom) for its name"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn test_parent(name: &str) -> PathBuf {
        let parent = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        std::fs::create_dir(&parent).unwrap();
        parent
    }

    #[test]
    fn a_name_made_first_by_someone_else_is_never_used() {
        let parent = test_parent("airlock-scratch-taken");
        let name = |n: u64| parent.join(format!("p-{}-{n:016x}", std::process::id()));
        std::fs::create_dir(name(1)).unwrap();
        std::os::unix::fs::symlink("/", name(2)).unwrap();
        let mut next = 0;
        let dir = make_private_dir(&parent, "p", 0o700, || {
            next += 1;
            Ok(next)
        })
        .unwrap();
        assert_eq!(dir, name(3));
        let mode = std::fs::symlink_metadata(&dir)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::remove_dir_all(&parent).unwrap();
    }

    #[test]
    fn scratch_dirs_are_new_each_time_with_the_mode_asked_and_gone_when_dropped() {
        let a = ScratchDir::new("airlock-scratch-test", 0o700).unwrap();
        let b = ScratchDir::new("airlock-scratch-test", 0o711).unwrap();
        assert_ne!(a.path(), b.path());
        for (dir, mode) in [(&a, 0o700), (&b, 0o711)] {
            let meta = std::fs::symlink_metadata(dir.path()).unwrap();
            assert!(meta.is_dir());
            assert_eq!(meta.permissions().mode() & 0o777, mode);
        }
        std::fs::create_dir_all(a.path().join("x/y")).unwrap();
        std::fs::write(a.path().join("x/y/f"), b"data").unwrap();
        let paths = [a.path().to_path_buf(), b.path().to_path_buf()];
        drop((a, b));
        for path in paths {
            assert!(std::fs::symlink_metadata(path).is_err());
        }
    }
}
