//! Resolving the mount plan's paths so that no symlink planted by an earlier call can
//! redirect them (escape battery FS-05).
//!
//! A writable bind persists between calls: a tool may leave `ws/cfg -> ../../etc` behind,
//! and a later worker that binds `ws/cfg/ssh` by path would bind the host's `/etc/ssh`.
//! So paths are never handed to the kernel whole. They are walked one component at a time
//! with `O_PATH | O_NOFOLLOW`, the walk keeps a descriptor of every step, and the mounts are
//! made on those descriptors (`/proc/self/fd/N`), never on a path looked up again.
//!
//! A symlink met on the way is followed only while the walk has not yet passed through a
//! writable bind's directory (recognised by device and inode, so an alias of it is caught
//! too): above it, links belong to whoever set up the host; below it, to the tool. Below it
//! a symlink is refused. Absolute link texts restart at the walk's root and `..` stops
//! there, so even a followed link cannot leave the tree being built.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::rc::Rc;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat, openat2, readlinkat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, mkdirat};

/// A file's identity: device and inode.
pub type FileId = (u64, u64);

/// How many symlinks one walk may follow (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// Why a path could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// A symlink below a writable bind: the tool may have planted it.
    #[error(
        "{path}: {link} is a symlink inside a writable bind, where a tool may have planted \
         it; refusing to follow it (remove it, or do not nest mounts below writable binds)"
    )]
    PlantedSymlink {
        /// The path being resolved.
        path: String,
        /// The symlink's own path, as far as the walk got.
        link: String,
    },
    /// A mount point is itself a symlink.
    #[error("{0}: the mount point is a symlink")]
    LinkAsMountPoint(String),
    /// Too many symlinks, or a component that is not a directory.
    #[error("{path}: {source}")]
    Lookup {
        /// The path being resolved.
        path: String,
        /// The errno.
        #[source]
        source: Errno,
    },
}

impl PathError {
    /// The errno closest to the failure.
    pub fn errno(&self) -> i32 {
        match self {
            PathError::PlantedSymlink { .. } | PathError::LinkAsMountPoint(_) => libc::ELOOP,
            PathError::Lookup { source, .. } => *source as i32,
        }
    }
}

/// The directory [`fd_name`] paths are relative to (the worker's working directory while
/// [`crate::mounts::build_root_filesystem`] mounts). `FD_DIR/N` is a magic link the kernel
/// resolves to exactly what descriptor N holds.
pub const FD_DIR: &str = "/proc/self/fd";

/// `fd` as a path relative to [`FD_DIR`]: its number. mount(2) takes only paths, and
/// `/proc/self/fd/N` from the root walks five components (procfs's `self` link and pid
/// directory among them) before the magic link, for each of a mount's two paths. From
/// `FD_DIR` it is the last step alone, so the path lookups under mount(2) do a fraction of
/// the walking. What is left is procfs instantiating an entry for each new descriptor.
pub fn fd_name(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(fd.as_raw_fd().to_string())
}

/// Identity and type of what `fd` holds.
pub fn identify(fd: &OwnedFd) -> nix::Result<(FileId, SFlag)> {
    let st: FileStat = fstat(fd)?;
    Ok((
        (st.st_dev, st.st_ino),
        SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()),
    ))
}

/// Opens `name` in `dir` without following it, whatever it is. A directory is asked for
/// first: an `O_PATH` open of a last component triggers an automount (autofs, systemd's
/// `.automount`) only when it asks for a directory, and binding by path always did.
fn open_nofollow(dir: &OwnedFd, name: &OsStr) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match openat(dir, name, flags | OFlag::O_DIRECTORY, Mode::empty()) {
        // Not a directory, or a symlink (never followed): open it as it is.
        Err(Errno::ENOTDIR) => openat(dir, name, flags, Mode::empty()),
        opened => opened,
    }
}

/// Opens `name` in `dir` without following it, for a name that should not be a directory
/// (a device, a file mount point just made): one lookup, with no directory asked for
/// first. A directory is still opened, `O_PATH` (so no automount), for the caller to refuse.
pub fn open_nofollow_non_directory(dir: &OwnedFd, name: &OsStr) -> nix::Result<OwnedFd> {
    openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Creates the directory `name` in `dir` unless something of that name exists already.
pub fn make_dir(dir: &OwnedFd, name: &OsStr, mode: u32) -> nix::Result<()> {
    match mkdirat(dir, name, Mode::from_bits_truncate(mode)) {
        Ok(()) | Err(Errno::EEXIST) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A second descriptor of what `fd` holds.
pub fn duplicate(fd: &OwnedFd) -> nix::Result<OwnedFd> {
    fd.try_clone().map_err(|e| io_errno(&e))
}

fn components(path: &OsStr) -> impl Iterator<Item = OsString> + '_ {
    path.as_bytes()
        .split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(|c| OsStr::from_bytes(c).to_os_string())
}

/// The last component of a resolved path, in the directory that holds it.
#[derive(Debug)]
pub struct Entry {
    /// The directory, opened `O_PATH`.
    pub parent: Rc<OwnedFd>,
    /// The name in it.
    pub name: OsString,
    /// Whether the walk passed through a writable bind to get here; `None` when a single
    /// lookup that follows no symlink found the directory (see [`Tree::is_tainted`]).
    pub tainted: Option<bool>,
}

impl Entry {
    /// Opens the entry itself without following it, `None` when it does not exist.
    pub fn open(&self) -> Result<Option<OwnedFd>, nix::Error> {
        found(open_nofollow(&self.parent, &self.name))
    }

    /// [`Entry::open`] for an entry that should not be a directory
    /// ([`open_nofollow_non_directory`]).
    pub fn open_non_directory(&self) -> Result<Option<OwnedFd>, nix::Error> {
        found(open_nofollow_non_directory(&self.parent, &self.name))
    }
}

fn found(opened: nix::Result<OwnedFd>) -> Result<Option<OwnedFd>, nix::Error> {
    match opened {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A directory tree whose paths are resolved component by component: the host's root for
/// bind sources, the new root for mount points.
#[derive(Debug)]
pub struct Tree {
    /// Shared with the entries found directly in it: no descriptor copy per lookup.
    root: Rc<OwnedFd>,
    root_id: FileId,
    writable: Vec<FileId>,
}

impl Tree {
    /// A tree rooted at the directory `root`; `writable` holds the identities of the
    /// writable binds' directories, below which symlinks are refused.
    pub fn new(root: OwnedFd, writable: Vec<FileId>) -> nix::Result<Self> {
        let (root_id, _) = identify(&root)?;
        Ok(Self {
            root: Rc::new(root),
            root_id,
            writable,
        })
    }

    /// Marks the directory `id` as a writable bind's: symlinks below it are refused.
    pub fn mark_writable(&mut self, id: FileId) {
        self.writable.push(id);
    }

    /// The identities marked writable.
    pub fn writable(&self) -> &[FileId] {
        &self.writable
    }

    /// Resolves every component of `path` but the last to a directory, creating missing
    /// ones with `make_mode` if given (else a missing one gives `None`). The last
    /// component is returned unopened; `path` naming the root itself gives `Ok(None)` too
    /// (no plan mounts over `/`).
    ///
    /// Most paths have no symlink on the way: one `openat2(RESOLVE_NO_SYMLINKS)` resolves
    /// those, and only a path it refuses (a link on the way, a missing directory, a kernel
    /// before 5.6) is walked one component at a time.
    pub fn parent_of(
        &self,
        path: &str,
        make_mode: Option<u32>,
    ) -> Result<Option<Entry>, PathError> {
        let parts: Vec<OsString> = components(OsStr::new(path)).collect();
        let Some((name, dirs)) = parts.split_last() else {
            return Ok(None);
        };
        if name != ".." && !dirs.iter().any(|d| d == "..") {
            let parent = if dirs.is_empty() {
                Some(Rc::clone(&self.root))
            } else {
                let relative = dirs.join(OsStr::new("/"));
                let how = OpenHow::new()
                    .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                    .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_BENEATH);
                openat2(&*self.root, relative.as_os_str(), how)
                    .ok()
                    .map(Rc::new)
            };
            if let Some(parent) = parent {
                let tainted = if dirs.is_empty() {
                    Some(self.writable.contains(&self.root_id))
                } else {
                    None
                };
                return Ok(Some(Entry {
                    parent,
                    name: name.clone(),
                    tainted,
                }));
            }
        }
        self.walk_parent(path, make_mode)
    }

    /// Whether `path`'s directory lies below a writable bind (for the rare last component
    /// that is a symlink, where [`Tree::parent_of`]'s single lookup did not find out).
    pub fn is_tainted(&self, path: &str) -> Result<bool, PathError> {
        Ok(self
            .walk_parent(path, None)?
            .and_then(|entry| entry.tainted)
            .unwrap_or(false))
    }

    /// [`Tree::parent_of`] one component at a time.
    fn walk_parent(&self, path: &str, make_mode: Option<u32>) -> Result<Option<Entry>, PathError> {
        let lookup = |source: Errno| PathError::Lookup {
            path: path.to_string(),
            source,
        };
        let mut pending: VecDeque<OsString> = components(OsStr::new(path)).collect();
        let Some(name) = pending.pop_back() else {
            return Ok(None);
        };
        if name == ".." {
            return Err(lookup(Errno::EINVAL));
        }
        let mut dir = Rc::clone(&self.root);
        let mut tainted = self.writable.contains(&self.root_id);
        let mut walked = PathBuf::from("/");
        let mut links = 0;
        while let Some(step) = pending.pop_front() {
            if step == ".." {
                // Only from a link text (policy paths have no `..`); never above the root.
                let (id, _) = identify(&dir).map_err(lookup)?;
                if id != self.root_id {
                    dir = Rc::new(
                        openat(
                            &dir,
                            "..",
                            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                            Mode::empty(),
                        )
                        .map_err(lookup)?,
                    );
                }
                walked.pop();
                continue;
            }
            walked.push(&step);
            let next = match open_nofollow(&dir, &step) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => match make_mode {
                    None => return Ok(None),
                    Some(mode) => {
                        make_dir(&dir, &step, mode).map_err(lookup)?;
                        open_nofollow(&dir, &step).map_err(lookup)?
                    }
                },
                Err(e) => return Err(lookup(e)),
            };
            let (id, kind) = identify(&next).map_err(lookup)?;
            if kind == SFlag::S_IFLNK {
                if tainted {
                    return Err(PathError::PlantedSymlink {
                        path: path.to_string(),
                        link: walked.display().to_string(),
                    });
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(lookup(Errno::ELOOP));
                }
                let text = readlinkat(&next, "").map_err(lookup)?;
                if text.as_bytes().starts_with(b"/") {
                    dir = Rc::clone(&self.root);
                    walked = PathBuf::from("/");
                } else {
                    walked.pop();
                }
                for part in components(&text).collect::<Vec<_>>().into_iter().rev() {
                    pending.push_front(part);
                }
                continue;
            }
            if kind != SFlag::S_IFDIR {
                return Err(lookup(Errno::ENOTDIR));
            }
            tainted |= self.writable.contains(&id);
            dir = Rc::new(next);
        }
        let (id, _) = identify(&dir).map_err(lookup)?;
        Ok(Some(Entry {
            parent: dir,
            name,
            tainted: Some(tainted || self.writable.contains(&id)),
        }))
    }
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use std::os::unix::fs::symlink;

    fn open_dir(path: &std::path::Path) -> OwnedFd {
        openat(
            nix::fcntl::AT_FDCWD,
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("airlock-paths-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The identity of what `entry` names, following nothing.
    fn target_id(entry: &Entry) -> FileId {
        identify(&entry.open().unwrap().unwrap()).unwrap().0
    }

    fn id_of(path: &std::path::Path) -> FileId {
        identify(&open_dir(path)).unwrap().0
    }

    #[test]
    fn a_link_planted_below_a_writable_directory_is_refused() {
        let dir = scratch("planted");
        std::fs::create_dir_all(dir.join("ws")).unwrap();
        std::fs::create_dir_all(dir.join("secret/data")).unwrap();
        symlink("../secret", dir.join("ws/cfg")).unwrap();
        let tree = Tree::new(open_dir(&dir), vec![id_of(&dir.join("ws"))]).unwrap();
        let err = tree.parent_of("/ws/cfg/data", None).unwrap_err();
        assert!(
            matches!(&err, PathError::PlantedSymlink { link, .. } if link == "/ws/cfg"),
            "{err}"
        );
        // The same link, with no writable directory above it, is the host's own: followed.
        let tree = Tree::new(open_dir(&dir), vec![]).unwrap();
        let entry = tree.parent_of("/ws/cfg/data", None).unwrap().unwrap();
        assert_eq!(target_id(&entry), id_of(&dir.join("secret/data")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_alias_of_a_writable_directory_taints_the_walk_too() {
        let dir = scratch("alias");
        std::fs::create_dir_all(dir.join("ws")).unwrap();
        std::fs::create_dir_all(dir.join("etc/ssh")).unwrap();
        symlink("ws", dir.join("alias")).unwrap();
        symlink("../etc", dir.join("ws/cfg")).unwrap();
        let tree = Tree::new(open_dir(&dir), vec![id_of(&dir.join("ws"))]).unwrap();
        let err = tree.parent_of("/alias/cfg/ssh", None).unwrap_err();
        assert!(matches!(err, PathError::PlantedSymlink { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn links_and_dotdot_never_leave_the_root() {
        let dir = scratch("beneath");
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        symlink("../../../../etc", root.join("up")).unwrap();
        symlink("/etc", root.join("abs")).unwrap();
        let tree = Tree::new(open_dir(&root), vec![]).unwrap();
        for path in ["/up/x", "/abs/x"] {
            let entry = tree.parent_of(path, None).unwrap().unwrap();
            assert_eq!(
                identify(&entry.parent).unwrap().0,
                id_of(&root.join("etc")),
                "{path}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_directories_are_created_only_when_asked() {
        let dir = scratch("make");
        let tree = Tree::new(open_dir(&dir), vec![]).unwrap();
        assert!(tree.parent_of("/a/b/c", None).unwrap().is_none());
        let entry = tree.parent_of("/a/b/c", Some(0o755)).unwrap().unwrap();
        assert_eq!(entry.name, "c");
        assert!(dir.join("a/b").is_dir());
        assert!(entry.open().unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_path_without_links_is_resolved_in_one_lookup_and_its_taint_on_demand() {
        let dir = scratch("fast");
        std::fs::create_dir_all(dir.join("ws/a")).unwrap();
        symlink("/etc", dir.join("ws/a/link")).unwrap();
        let tree = Tree::new(open_dir(&dir), vec![id_of(&dir.join("ws"))]).unwrap();
        let entry = tree.parent_of("/ws/a/link", None).unwrap().unwrap();
        assert_eq!(entry.tainted, None);
        assert_eq!(identify(&entry.parent).unwrap().0, id_of(&dir.join("ws/a")));
        assert!(tree.is_tainted("/ws/a/link").unwrap());
        let outside = Tree::new(open_dir(&dir), vec![]).unwrap();
        assert!(!outside.is_tainted("/ws/a/link").unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_symlink_loop_ends_in_eloop() {
        let dir = scratch("loop");
        symlink("b", dir.join("a")).unwrap();
        symlink("a", dir.join("b")).unwrap();
        let tree = Tree::new(open_dir(&dir), vec![]).unwrap();
        let err = tree.parent_of("/a/x", None).unwrap_err();
        assert_eq!(err.errno(), libc::ELOOP, "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_in_the_middle_is_not_a_directory() {
        let dir = scratch("notdir");
        std::fs::write(dir.join("f"), b"").unwrap();
        let tree = Tree::new(open_dir(&dir), vec![]).unwrap();
        let err = tree.parent_of("/f/x", None).unwrap_err();
        assert_eq!(err.errno(), libc::ENOTDIR, "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
