//! Noticing that the policy file changed, so `serve` and `mcp` reload it without a SIGHUP.
//!
//! The policy's directory is watched, not the file: editors replace a file by renaming a
//! new one over it, and a Kubernetes ConfigMap volume swaps a `..data` symlink to a new
//! directory of files; neither touches the old file's inode, and a watch on it would see
//! nothing. Any change in the directory is only a hint: the caller reads the file and
//! reloads only when its text differs. inotify through nix, which the workspace already
//! depends on, rather than a cross-platform watcher crate: airlock runs on Linux only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;

use crate::sys::{InotifyFd, register_inotify};

/// Changes this close together are one: a ConfigMap swap or an editor's save is several
/// events, and the file is read once they have settled.
const SETTLE: Duration = Duration::from_millis(200);

/// The longest a change waits for the directory to settle: a directory that never stays
/// quiet (another file in it written all the time) still gets its policy read.
const MAX_SETTLE: Duration = Duration::from_secs(2);

/// Why the policy file cannot be watched (or no longer is).
#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchError {
    /// inotify_init1 failed.
    #[error("cannot start watching files")]
    Init(#[source] Errno),
    /// inotify_add_watch on the policy's directory failed.
    #[error("cannot watch the directory {dir}")]
    AddWatch {
        /// The directory.
        dir: String,
        /// Cause.
        #[source]
        source: Errno,
    },
    /// Registering the inotify descriptor with the runtime failed.
    #[error("cannot register the file watch")]
    Register(#[source] std::io::Error),
    /// Reading events failed.
    #[error("cannot read file events of {dir}")]
    Read {
        /// The directory.
        dir: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The directory was removed or moved away: its watch ended.
    #[error("the directory {dir} is gone; its policy file is no longer watched")]
    Gone {
        /// The directory.
        dir: String,
    },
}

/// A watch on the policy file's directory.
#[derive(Debug)]
pub(crate) struct PolicyWatch {
    fd: AsyncFd<InotifyFd>,
    dir: PathBuf,
}

impl PolicyWatch {
    /// Watches the directory of `policy` (as given: a symlinked directory is followed).
    pub(crate) fn new(policy: &Path) -> Result<Self, WatchError> {
        let dir = match policy.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(WatchError::Init)?;
        let events = AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF;
        inotify
            .add_watch(&dir, events)
            .map_err(|source| WatchError::AddWatch {
                dir: dir.display().to_string(),
                source,
            })?;
        let fd = register_inotify(inotify).map_err(WatchError::Register)?;
        Ok(Self { fd, dir })
    }

    /// Waits for something in the directory to change, then for the changes to settle
    /// (or [`MAX_SETTLE`], whichever comes first).
    pub(crate) async fn changed(&mut self) -> Result<(), WatchError> {
        self.next_events().await?;
        let until = tokio::time::Instant::now() + MAX_SETTLE;
        while tokio::time::Instant::now() < until {
            match tokio::time::timeout(SETTLE, self.next_events()).await {
                Err(_settled) => return Ok(()),
                Ok(more) => more?,
            }
        }
        Ok(())
    }

    /// Waits for at least one event, and takes every event queued.
    async fn next_events(&self) -> Result<(), WatchError> {
        let dir = || self.dir.display().to_string();
        loop {
            let mut ready = self
                .fd
                .readable()
                .await
                .map_err(|source| WatchError::Read { dir: dir(), source })?;
            match ready.get_inner().0.read_events() {
                Ok(events) => {
                    let gone = AddWatchFlags::IN_IGNORED
                        | AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF;
                    if events.iter().any(|e| e.mask.intersects(gone)) {
                        return Err(WatchError::Gone { dir: dir() });
                    }
                    return Ok(());
                }
                Err(Errno::EAGAIN) => ready.clear_ready(),
                Err(e) => {
                    return Err(WatchError::Read {
                        dir: dir(),
                        source: e.into(),
                    });
                }
            }
        }
    }
}
