//! Noticing that the policy file changed, so `serve` and `mcp` reload it without a SIGHUP.
//!
//! The policy's directory is watched, not the file: editors replace a file by renaming a
//! new one over it, and a Kubernetes ConfigMap volume swaps a `..data` symlink to a new
//! directory of files; neither touches the old file's inode, and a watch on it would see
//! nothing. Any change in the directory is only a hint: the caller reads the file and
//! reloads only when its text differs. inotify through nix, which the workspace already
//! depends on, rather than a cross-platform watcher crate: airlock runs on Linux only.
//!
//! A quiet directory does not mean a finished file: a writer that truncates the file and
//! writes it slowly (`cat > policy.toml` over a slow link) may pause mid-way, or never let
//! the directory settle, and a prefix of a policy can be a valid policy with its trailing
//! deny rules missing. So the file is read twice, [`SETTLE`] apart, and reloaded only when
//! both reads found the same text and the same size and modification time; a file that
//! changed between them is left for the change events its writer makes next.

use std::future::Future;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;

use crate::sys::{InotifyFd, register_inotify};

/// Changes this close together are one: a ConfigMap swap or an editor's save is several
/// events, and the file is read once they have settled (and read again this long after).
pub(crate) const SETTLE: Duration = Duration::from_millis(200);

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

/// What a file's descriptor says of it: enough to tell a rewrite from no change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    fn of(file: &std::fs::File) -> std::io::Result<Self> {
        let meta = file.metadata()?;
        Ok(Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

/// One read of the policy file: its stamp before and after, and the bytes between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) before: Stamp,
    pub(crate) after: Stamp,
    pub(crate) text: Vec<u8>,
}

impl Snapshot {
    /// Reads the file at `path` (following symlinks, as loading it does).
    pub(crate) fn read(path: &Path) -> std::io::Result<Self> {
        let mut file = std::fs::File::open(path)?;
        let before = Stamp::of(&file)?;
        let mut text = Vec::new();
        file.read_to_end(&mut text)?;
        let after = Stamp::of(&file)?;
        Ok(Self {
            before,
            after,
            text,
        })
    }

    /// Whether nothing was written to the file during this read or between it and `later`.
    fn unchanged_until(&self, later: &Self) -> bool {
        self.before == self.after
            && later.before == later.after
            && self.after == later.before
            && self.text == later.text
    }
}

/// The policy file's text once it holds still, or why not.
#[derive(Debug)]
pub(crate) enum Settled {
    /// Both reads found this text, unchanged.
    Text(Vec<u8>),
    /// The file changed between or during the reads: still being written.
    Changing,
    /// A read failed.
    Unreadable(std::io::Error),
}

/// Reads the file with `read`, waits for `pause`, and reads it again; its text only when
/// both reads agree. The reader and the pause are parameters so that the decision can be
/// tested without a file being written at a given speed.
pub(crate) async fn read_settled<R, P, F>(mut read: R, pause: P) -> Settled
where
    R: FnMut() -> std::io::Result<Snapshot>,
    P: FnOnce() -> F,
    F: Future<Output = ()>,
{
    let first = match read() {
        Ok(first) => first,
        Err(e) => return Settled::Unreadable(e),
    };
    pause().await;
    match read() {
        Ok(second) if first.unchanged_until(&second) => Settled::Text(second.text),
        Ok(_) => Settled::Changing,
        Err(e) => Settled::Unreadable(e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn stamp(len: u64, second: u64) -> Stamp {
        Stamp {
            dev: 1,
            ino: 2,
            len,
            modified: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(second)),
        }
    }

    fn snapshot(text: &str, second: u64) -> Snapshot {
        let len = text.len() as u64;
        Snapshot {
            before: stamp(len, second),
            after: stamp(len, second),
            text: text.as_bytes().to_vec(),
        }
    }

    /// `read_settled` over `reads`, in order; also how many reads came before the pause.
    async fn settle(reads: Vec<std::io::Result<Snapshot>>) -> (Settled, usize) {
        let reads = std::cell::RefCell::new(reads.into_iter());
        let done = std::cell::Cell::new(0);
        let mut paused_after = None;
        let settled = read_settled(
            || {
                done.set(done.get() + 1);
                reads.borrow_mut().next().expect("no more reads")
            },
            || {
                paused_after = Some(done.get());
                std::future::ready(())
            },
        )
        .await;
        (settled, paused_after.expect("never paused"))
    }

    const PREFIX: &str = "version = 1\ndefault_decision = \"allow\"\n";
    const WHOLE: &str = "version = 1\ndefault_decision = \"allow\"\n[[rules]]\nname = \"no\"\ndecision = \"deny\"\n";

    #[tokio::test]
    async fn a_policy_read_twice_unchanged_is_taken_after_the_pause() {
        let (settled, paused_after) =
            settle(vec![Ok(snapshot(WHOLE, 5)), Ok(snapshot(WHOLE, 5))]).await;
        assert_eq!(paused_after, 1);
        match settled {
            Settled::Text(text) => assert_eq!(text, WHOLE.as_bytes()),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_valid_prefix_followed_by_more_text_is_never_taken() {
        let (settled, _) = settle(vec![Ok(snapshot(PREFIX, 5)), Ok(snapshot(WHOLE, 6))]).await;
        assert!(matches!(settled, Settled::Changing), "{settled:?}");
    }

    #[tokio::test]
    async fn the_same_text_written_again_between_the_reads_waits_for_the_next_change() {
        let (settled, _) = settle(vec![Ok(snapshot(PREFIX, 5)), Ok(snapshot(PREFIX, 6))]).await;
        assert!(matches!(settled, Settled::Changing), "{settled:?}");
    }

    #[tokio::test]
    async fn a_file_growing_while_it_is_read_is_never_taken() {
        let mut torn = snapshot(PREFIX, 5);
        torn.after = stamp(WHOLE.len() as u64, 6);
        let (settled, _) = settle(vec![Ok(torn.clone()), Ok(torn)]).await;
        assert!(matches!(settled, Settled::Changing), "{settled:?}");
    }

    #[tokio::test]
    async fn a_file_that_cannot_be_read_is_reported_so() {
        let gone = || Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        let (settled, _) = settle(vec![Ok(snapshot(WHOLE, 5)), gone()]).await;
        assert!(matches!(settled, Settled::Unreadable(_)), "{settled:?}");
    }

    #[test]
    fn a_snapshot_of_a_file_holds_its_text_and_a_steady_stamp() {
        let dir = std::env::temp_dir().join(format!("airlock-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("policy.toml");
        std::fs::write(&path, WHOLE).unwrap();
        let read = Snapshot::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read.text, WHOLE.as_bytes());
        assert_eq!(read.before, read.after);
        assert_eq!(read.after.len, WHOLE.len() as u64);
    }
}
