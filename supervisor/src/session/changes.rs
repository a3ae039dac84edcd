//! A workspace against its base: the copy made when a session opens (where no overlay
//! shows the base), and what a tool added, modified and deleted since.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::os::fd::BorrowedFd;

use serde::Serialize;

use super::tree::{self, Entry, Kind, WriteError};

/// How a path differs from the base.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Not in the base.
    Added,
    /// In the base, with other content or of another kind.
    Modified,
    /// In the base, gone from the workspace.
    Deleted,
}

/// One changed path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Relative to the workspace.
    pub path: String,
    /// How it changed.
    pub kind: ChangeKind,
    /// Its size in the workspace now (0 when deleted).
    pub size: u64,
}

/// Why a base could not be copied.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// Reading a symlink of the base failed.
    #[error("reading the base: {0}")]
    Base(#[source] io::Error),
    /// A file of the base cannot be read as one, or the base is past a walk's bounds
    /// (more entries than the workspace may hold, a path too long).
    #[error("reading the base: {0}")]
    BaseFile(#[source] tree::ReadError),
    /// Writing the copy failed.
    #[error(transparent)]
    Workspace(#[from] WriteError),
}

/// Copies the directories, regular files and symlinks of `base` into `workspace`
/// (FIFOs, sockets and devices are left out), owned by `owner`, setuid, setgid and
/// sticky bits dropped. Nothing in the base is followed: a symlink is copied as one.
pub fn copy_base(
    base: BorrowedFd<'_>,
    workspace: BorrowedFd<'_>,
    owner: Option<(u32, u32)>,
    max_entries: u64,
    max_bytes: u64,
) -> Result<(), CopyError> {
    let entries = tree::walk(base, max_entries).map_err(CopyError::BaseFile)?;
    // What the copy may still write: the sizes the walk saw are only a first look (a base
    // file may grow while it is copied), so the bytes themselves are counted as they go.
    let mut left = max_bytes;
    for entry in entries {
        match entry.kind {
            Kind::Dir => {
                tree::make_dirs(workspace, &entry.path, owner)?;
            }
            Kind::File => {
                if entry.size > left {
                    return Err(CopyError::Workspace(WriteError::Full));
                }
                // Streamed: a base file is never held in memory whole.
                let file = tree::open_file(base, &entry.path).map_err(CopyError::BaseFile)?;
                let mut bounded = Bounded { inner: file, left };
                tree::write_file(workspace, &entry.path, &mut bounded, entry.mode, owner)?;
                left = bounded.left;
            }
            Kind::Symlink => {
                let target = tree::read_link(base, &entry.path).map_err(CopyError::Base)?;
                tree::make_symlink(workspace, &entry.path, &target, owner)?;
            }
            Kind::Other => {}
        }
    }
    Ok(())
}

/// A reader that yields at most `left` bytes and fails with "no space" when its source
/// holds more, before any byte past the bound is written.
struct Bounded<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            // At the bound: anything more in the source is over the size.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                // EDQUOT: what the workspace's quota would answer; a write maps it to Full.
                _ => Err(io::Error::from_raw_os_error(libc::EDQUOT)),
            };
        }
        let room = usize::try_from(self.left)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = self.inner.read(&mut buf[..room])?;
        self.left -= u64::try_from(n).unwrap_or(u64::MAX).min(self.left);
        Ok(n)
    }
}

/// What differs between `workspace` and `base` (every file, without a base): paths that
/// are not directories, in path order. A tree past a walk's bounds is an error
/// ([`tree::ReadError::TreeTooLarge`]), never a shortened list a client could take as all.
pub fn changes(
    workspace: BorrowedFd<'_>,
    base: Option<BorrowedFd<'_>>,
    max_entries: u64,
) -> Result<Vec<Change>, tree::ReadError> {
    let now = files(workspace, max_entries)?;
    let mut before = match base {
        Some(base) => files(base, max_entries)?,
        None => BTreeMap::new(),
    };
    let mut out = Vec::new();
    for (path, entry) in now {
        // A copy leaves out the base's FIFOs, sockets and devices and an overlay shows
        // them as they are: either way, not changes of the tool.
        let kind = match before.remove(&path) {
            None => Some(ChangeKind::Added),
            Some(old) if old.kind == Kind::Other && entry.kind == Kind::Other => None,
            Some(old) if old.kind == Kind::Other => Some(ChangeKind::Added),
            Some(old) if differs(workspace, &entry, base, &old) => Some(ChangeKind::Modified),
            Some(_) => None,
        };
        if let Some(kind) = kind {
            out.push(Change {
                path,
                kind,
                size: entry.size,
            });
        }
    }
    for (path, old) in before {
        if old.kind != Kind::Other {
            out.push(Change {
                path,
                kind: ChangeKind::Deleted,
                size: 0,
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The entries of a tree that are not directories, by path (each entry keeps its own
/// copy of the path: the walk's bounds cap both).
fn files(
    root: BorrowedFd<'_>,
    max_entries: u64,
) -> Result<BTreeMap<String, Entry>, tree::ReadError> {
    Ok(tree::walk(root, max_entries)?
        .into_iter()
        .filter(|e| e.kind != Kind::Dir)
        .map(|e| (e.path.clone(), e))
        .collect())
}

/// Whether a path's content differs; anything unreadable counts as changed.
fn differs(
    workspace: BorrowedFd<'_>,
    now: &Entry,
    base: Option<BorrowedFd<'_>>,
    old: &Entry,
) -> bool {
    let Some(base) = base else {
        return true;
    };
    if now.kind != old.kind || now.size != old.size || now.mode & 0o111 != old.mode & 0o111 {
        return true;
    }
    // One file (an overlay's lower file, not copied up): nothing to read.
    if now.identity == old.identity {
        return false;
    }
    match now.kind {
        Kind::File => {
            let a = tree::open_file(workspace, &now.path);
            let b = tree::open_file(base, &old.path);
            !matches!((a, b), (Ok(a), Ok(b)) if tree::same_content(&a, &b).unwrap_or(false))
        }
        Kind::Symlink => {
            let a = tree::read_link(workspace, &now.path);
            let b = tree::read_link(base, &old.path);
            !matches!((a, b), (Ok(a), Ok(b)) if a == b)
        }
        Kind::Dir | Kind::Other => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::os::fd::AsFd;

    use super::*;

    /// Bytes in the regular files beneath `dir`.
    fn bytes_under(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| {
                let meta = e.metadata().unwrap();
                if meta.is_dir() {
                    bytes_under(&e.path())
                } else {
                    meta.len()
                }
            })
            .sum()
    }

    #[test]
    fn a_copy_never_writes_more_than_the_size_and_fails_as_soon_as_it_would() {
        let dir = std::env::temp_dir().join(format!("airlock-copy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("base/sub")).unwrap();
        std::fs::create_dir_all(dir.join("workspace")).unwrap();
        let size: u64 = 100_000;
        let part = vec![7u8; 60_000];
        std::fs::write(dir.join("base/a"), &part).unwrap();
        std::fs::write(dir.join("base/sub/b"), &part).unwrap();
        let base = tree::open_root(&dir.join("base")).unwrap();
        let workspace = tree::open_root(&dir.join("workspace")).unwrap();
        let copied = copy_base(base.as_fd(), workspace.as_fd(), None, 100, size);
        assert!(
            matches!(copied, Err(CopyError::Workspace(WriteError::Full))),
            "{copied:?}"
        );
        let written = bytes_under(&dir.join("workspace"));
        assert!(
            written <= size,
            "{written} bytes written for a size of {size}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
