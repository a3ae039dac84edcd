//! A workspace against its base: the copy made when a session opens (where no overlay
//! shows the base), and what a tool added, modified and deleted since.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
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
    /// Reading the base failed (or it holds more entries than the workspace may).
    #[error("reading the base: {0}")]
    Base(#[source] io::Error),
    /// A file of the base cannot be read as one.
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
    let entries = tree::walk(base, max_entries).map_err(CopyError::Base)?;
    for entry in entries {
        match entry.kind {
            Kind::Dir => {
                tree::make_dirs(workspace, &entry.path, owner)?;
            }
            Kind::File => {
                if entry.size > max_bytes {
                    return Err(CopyError::Workspace(WriteError::Full));
                }
                // Streamed: a base file is never held in memory whole.
                let file = tree::open_file(base, &entry.path).map_err(CopyError::BaseFile)?;
                tree::write_file(workspace, &entry.path, file, entry.mode, owner)?;
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

/// What differs between `workspace` and `base` (every file, without a base): paths that
/// are not directories, in path order.
pub fn changes(
    workspace: BorrowedFd<'_>,
    base: Option<BorrowedFd<'_>>,
    max_entries: u64,
) -> io::Result<Vec<Change>> {
    let now = files(workspace, max_entries)?;
    let mut before = match base {
        Some(base) => files(base, max_entries)?,
        None => BTreeMap::new(),
    };
    // A copy leaves out the base's FIFOs, sockets and devices and an overlay shows them
    // as they are: either way, not changes of the tool.
    let special: BTreeSet<String> = before
        .iter()
        .filter(|(_, e)| e.kind == Kind::Other)
        .map(|(path, _)| path.clone())
        .collect();
    before.retain(|_, e| e.kind != Kind::Other);
    let mut out = Vec::new();
    for (path, entry) in &now {
        if entry.kind == Kind::Other && special.contains(path) {
            continue;
        }
        let kind = match before.get(path) {
            None => Some(ChangeKind::Added),
            Some(old) if differs(workspace, entry, base, old) => Some(ChangeKind::Modified),
            Some(_) => None,
        };
        if let Some(kind) = kind {
            out.push(Change {
                path: path.clone(),
                kind,
                size: entry.size,
            });
        }
    }
    for path in before.keys().filter(|p| !now.contains_key(*p)) {
        out.push(Change {
            path: path.clone(),
            kind: ChangeKind::Deleted,
            size: 0,
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The entries of a tree that are not directories, by path.
fn files(root: BorrowedFd<'_>, max_entries: u64) -> io::Result<BTreeMap<String, Entry>> {
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
