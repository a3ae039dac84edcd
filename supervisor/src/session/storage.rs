//! Where sessions keep their files: one directory per session under a state directory
//! only the supervisor (and, as root, the sandbox's group, to reach its own) can enter.
//!
//! As root each session's directory is a tmpfs of its own, mounted nosuid and nodev with
//! `size=` and `nr_inodes=`, owned by the uid the sandbox's root maps to: a tool that
//! fills it gets ENOSPC from the kernel, and nothing in it can be a hard link to a file
//! anywhere else. Unprivileged, it is a plain directory: its size and inodes are counted
//! by walking it (before each `put_file`, after each call), so a tool can overshoot the
//! limit within one call, and the overshoot is reported as `workspace_full`; directories
//! a tool made unreadable get their owner's `rwx` back so that they can be counted.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::Mode;

use super::tree::{self, Kind, open_beneath, open_root};

/// The state directory of a supervisor's sessions.
#[derive(Debug)]
pub(super) struct StateDir {
    root: PathBuf,
    /// The sandbox's host uid and gid, when we are root and files we make must be its.
    pub(super) owner: Option<(u32, u32)>,
}

/// How much of its limits a workspace uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Usage {
    pub(super) bytes: u64,
    pub(super) inodes: u64,
    /// At (or, unprivileged, over) its size or inode limit.
    pub(super) full: bool,
}

impl StateDir {
    /// Makes (or takes over) `root` and removes every session a previous run left in it.
    /// `sandbox_ids` are the host uid and gid the sandbox's root maps to.
    pub(super) fn prepare(root: &Path, sandbox_ids: (u32, u32)) -> io::Result<Self> {
        let privileged = nix::unistd::geteuid().is_root();
        if let Some(parent) = root.parent() {
            std::fs::create_dir_all(parent)?;
        }
        match std::fs::create_dir(root) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        // Ours and a directory, not a symlink someone put there.
        let meta = std::fs::symlink_metadata(root)?;
        if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
            return Err(io::Error::other(format!(
                "{} is not a directory of ours",
                root.display()
            )));
        }
        let owner = privileged.then_some(sandbox_ids);
        if let Some((_, gid)) = owner {
            // The sandbox's group may pass through (not list) to reach its own session,
            // whose name it cannot guess; everyone else is kept out.
            nix::unistd::chown(root, None, Some(nix::unistd::Gid::from_raw(gid)))?;
            std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o710))?;
        } else {
            std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))?;
        }
        let state = Self {
            root: root.to_path_buf(),
            owner,
        };
        state.sweep_stale()?;
        Ok(state)
    }

    /// Removes whatever is in the state directory: sessions of a supervisor that died.
    /// What cannot be removed is logged and left: one stale directory a tool made hard to
    /// remove must not keep the supervisor from serving sessions.
    fn sweep_stale(&self) -> io::Result<()> {
        for entry in std::fs::read_dir(&self.root)? {
            let path = match entry {
                Ok(entry) => entry.path(),
                Err(error) => {
                    tracing::error!(%error, "a stale session could not be listed");
                    continue;
                }
            };
            match remove(&path, self.owner.is_some()) {
                Ok(()) => tracing::info!(path = %path.display(), "removed a stale session"),
                Err(error) => tracing::error!(
                    %error,
                    path = %path.display(),
                    "a stale session could not be removed; it is left in place"
                ),
            }
        }
        Ok(())
    }

    /// A fresh session directory named `name`, limited to `size` bytes and `inodes`.
    pub(super) fn create(&self, name: &str, size: u64, inodes: u64) -> io::Result<Storage> {
        let path = self.root.join(name);
        std::fs::create_dir(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))?;
        let storage = Storage {
            workspace: path.clone(),
            path,
            mounted: self.owner.is_some(),
            size,
            inodes,
        };
        if let Some((uid, gid)) = self.owner {
            let data = format!("size={size},nr_inodes={inodes},mode=0700,uid={uid},gid={gid}");
            let mounted = nix::mount::mount(
                Some("airlock-session"),
                &storage.path,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(data.as_str()),
            );
            if let Err(e) = mounted {
                let _ = std::fs::remove_dir(&storage.path);
                return Err(io::Error::from(e));
            }
        }
        Ok(storage)
    }
}

/// One session's directory.
#[derive(Debug)]
pub(super) struct Storage {
    pub(super) path: PathBuf,
    /// What the session's calls and the gateway see: `path` itself, or the merged view of
    /// an overlay inside it.
    pub(super) workspace: PathBuf,
    mounted: bool,
    size: u64,
    inodes: u64,
}

impl Storage {
    /// Its size limit, bytes.
    pub(super) fn size(&self) -> u64 {
        self.size
    }

    /// What the workspace holds against its limits.
    pub(super) fn usage(&self) -> io::Result<Usage> {
        if self.mounted {
            let stat = nix::sys::statvfs::statvfs(&self.path)?;
            let block = stat.fragment_size();
            let bytes = stat.blocks().saturating_sub(stat.blocks_free()) * block;
            let inodes = stat.files().saturating_sub(stat.files_free());
            return Ok(Usage {
                bytes,
                inodes,
                full: stat.blocks_available() == 0 || stat.files_available() == 0,
            });
        }
        // The workspace's root too: a tool there may chmod it (it is the bind's root).
        if let Ok(meta) = std::fs::symlink_metadata(&self.path)
            && meta.mode() & 0o700 != 0o700
        {
            let mode = (meta.mode() & 0o7777) | 0o700;
            std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(mode))?;
        }
        let root = open_root(&self.path)?;
        // A tool may have made directories unreadable to us (the same uid, without root's
        // override); what cannot be counted cannot be bounded, so their owner (us) gets
        // back into them.
        let _ = open_up(root.as_fd(), 0);
        // One entry past the limit is enough to know it is over.
        let entries = match tree::walk(root.as_fd(), self.inodes) {
            Ok(entries) => entries,
            Err(_) => {
                return Ok(Usage {
                    bytes: self.size,
                    inodes: self.inodes.saturating_add(1),
                    full: true,
                });
            }
        };
        let bytes: u64 = entries
            .iter()
            .filter(|e| e.kind != Kind::Dir)
            .map(|e| e.size)
            .sum();
        let inodes = u64::try_from(entries.len()).unwrap_or(u64::MAX);
        Ok(Usage {
            bytes,
            inodes,
            full: bytes >= self.size || inodes >= self.inodes,
        })
    }

    /// Whether `more` bytes (in one new file) still fit; always true where the kernel
    /// enforces the limit itself.
    pub(super) fn fits(&self, more: u64) -> io::Result<bool> {
        if self.mounted {
            return Ok(true);
        }
        let usage = self.usage()?;
        Ok(usage.bytes.saturating_add(more) <= self.size && usage.inodes < self.inodes)
    }

    /// A guard that removes this storage when dropped, unless disarmed.
    pub(super) fn removal(&self) -> Removal {
        Removal {
            path: self.path.clone(),
            mounted: self.mounted,
            armed: true,
        }
    }

    /// Unmounts and removes the directory and everything in it.
    pub(super) fn remove(&self) -> io::Result<()> {
        remove(&self.path, self.mounted)
    }
}

/// Removes a session's storage (mount and directory) when dropped, unless disarmed: an
/// open holds one from the moment its storage exists, so that every error path it leaves
/// by removes what it made.
#[derive(Debug)]
#[must_use]
pub(super) struct Removal {
    path: PathBuf,
    mounted: bool,
    armed: bool,
}

impl Removal {
    /// The open succeeded: the storage stays.
    pub(super) fn disarm(mut self) {
        self.armed = false;
    }

    /// Removes the storage now (an open going on with storage made afresh); on an error
    /// the drop tries once more.
    pub(super) fn remove_now(mut self) -> io::Result<()> {
        remove(&self.path, self.mounted)?;
        self.armed = false;
        Ok(())
    }
}

impl Drop for Removal {
    fn drop(&mut self) {
        if self.armed
            && let Err(error) = remove(&self.path, self.mounted)
        {
            tracing::error!(%error, path = %self.path.display(), "the storage of a failed session_open is left for the next start to remove");
        }
    }
}

/// Removes a session directory: its tmpfs detached first (a call still running keeps its
/// own view until it ends), then whatever is left.
fn remove(path: &Path, privileged: bool) -> io::Result<()> {
    if privileged {
        match nix::mount::umount2(path, MntFlags::MNT_DETACH) {
            // EINVAL: not a mount point (a stale directory whose mount is already gone).
            Ok(()) | Err(nix::errno::Errno::EINVAL) => {}
            Err(e) => return Err(io::Error::from(e)),
        }
    } else if let Ok(root) = {
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
        open_root(path)
    } {
        // A tool may have left directories we (the same uid, without root's override)
        // cannot list or empty; what is left closed makes the removal below fail.
        if let Err(error) = open_up(root.as_fd(), 0) {
            tracing::warn!(%error, path = %path.display(), "not every directory could be opened up for removal");
        }
    }
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Makes every directory beneath `dir` ours to list and empty (owner `rwx` added, the
/// rest of its mode kept), without following a symlink: each is opened `O_PATH` beneath
/// its parent and changed through that descriptor, then entered. Names are taken as the
/// bytes they are. Deeper than a walk goes is an error (after opening up what is within
/// reach), never a silent stop.
fn open_up(dir: BorrowedFd<'_>, depth: usize) -> io::Result<()> {
    if depth > tree::MAX_DEPTH {
        return Err(io::Error::other(format!(
            "deeper than {} directories",
            tree::MAX_DEPTH
        )));
    }
    let listing = open_beneath(
        dir,
        ".",
        OFlag::O_DIRECTORY | OFlag::O_RDONLY,
        Mode::empty(),
    )?;
    let mut names: Vec<OsString> = Vec::new();
    for entry in nix::dir::Dir::from_fd(listing)?.iter().flatten() {
        let name = entry.file_name().to_bytes();
        if entry.file_type() == Some(nix::dir::Type::Directory) && name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    let mut outcome = Ok(());
    for name in names {
        let Ok(handle) = open_beneath(
            dir,
            name.as_os_str(),
            OFlag::O_PATH | OFlag::O_DIRECTORY,
            Mode::empty(),
        ) else {
            continue;
        };
        // Only what the owner lacks is added: the mode a tool chose otherwise stays.
        let mode = nix::sys::stat::fstat(&handle).map_or(0, |st| st.st_mode & 0o7777);
        if mode & 0o700 != 0o700 {
            let by_fd = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&handle));
            let _ = std::fs::set_permissions(by_fd, std::fs::Permissions::from_mode(mode | 0o700));
        }
        if let Ok(sub) = open_beneath(
            dir,
            name.as_os_str(),
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        ) && let Err(error) = open_up(sub.as_fd(), depth + 1)
            && outcome.is_ok()
        {
            outcome = Err(error);
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("airlock-storage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o777
    }

    #[test]
    fn directories_with_names_that_are_not_utf8_are_opened_up() {
        let dir = scratch("bytes");
        let odd = dir.join("a").join(OsStr::from_bytes(b"\xff"));
        std::fs::create_dir_all(odd.join(OsStr::from_bytes(b"\xfe\x80"))).unwrap();
        std::fs::set_permissions(&odd, std::fs::Permissions::from_mode(0o000)).unwrap();
        let root = open_root(&dir).unwrap();
        open_up(root.as_fd(), 0).unwrap();
        assert_eq!(mode(&odd), 0o700, "the owner gets rwx back, nothing else");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_tree_deeper_than_the_walks_bound_is_an_error_not_a_silent_stop() {
        let dir = scratch("deep");
        let mut deepest = dir.clone();
        for _ in 0..140 {
            deepest.push("d");
        }
        std::fs::create_dir_all(&deepest).unwrap();
        let root = open_root(&dir).unwrap();
        assert!(open_up(root.as_fd(), 0).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stale_entry_that_cannot_be_removed_leaves_sessions_served() {
        let dir = scratch("stale");
        let state = dir.join("state");
        std::fs::create_dir_all(state.join("gone")).unwrap();
        // Not a session directory: nothing removes it as one.
        std::fs::write(state.join("stray"), "x").unwrap();
        let prepared = StateDir::prepare(&state, (65_534, 65_534));
        assert!(prepared.is_ok(), "{prepared:?}");
        assert!(!state.join("gone").exists(), "what can be removed is");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
