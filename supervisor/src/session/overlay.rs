//! A session's base seen through overlayfs instead of copied: opening a session costs the
//! same whatever the base holds, and a tool's writes land in the session's own tmpfs.
//!
//! Inside the session's directory (its tmpfs, which bounds everything written):
//! `lower` holds a read-only, nosuid, nodev bind of the base, `upper` and `work` are the
//! overlay's, and `ws` is the merged view the session's calls and the gateway see. The
//! base's files keep their owners, so the bind is an idmapped mount that shows the
//! base's owner as the sandbox's user: tools may then change what the project's owner may
//! (a copy would have made every file theirs; files of other owners stay read-only to
//! them, as they are on the host). The overlay is mounted by the supervisor, whose
//! credentials overlayfs uses for copy-ups, never by a tool.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use nix::mount::MsFlags;

/// The merged view inside a session's directory.
const MERGED: &str = "ws";

/// Why a base could not be laid under an overlay (the session gets a copy instead).
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub struct OverlayError {
    /// The step that failed.
    step: &'static str,
    /// Cause.
    #[source]
    source: io::Error,
}

fn failed(step: &'static str) -> impl FnOnce(io::Error) -> OverlayError {
    move |source| OverlayError { step, source }
}

/// The user namespaces describing "the base's owner is the sandbox's user", by the base
/// owner's uid and gid: making one clones a process, and the bases of one deployment
/// have few owners.
#[derive(Debug, Default)]
pub(super) struct Mappings {
    by_owner: Mutex<HashMap<(u32, u32), Arc<OwnedFd>>>,
}

/// Owners remembered at most; past that the list starts again.
const MAX_MAPPINGS: usize = 64;

impl Mappings {
    fn get(&self, base: (u32, u32), owner: (u32, u32)) -> io::Result<Arc<OwnedFd>> {
        let mut known = self.by_owner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(userns) = known.get(&base) {
            return Ok(Arc::clone(userns));
        }
        let userns = Arc::new(crate::sys::mapping_namespace(
            &format!("{} {} 1\n", base.0, owner.0),
            &format!("{} {} 1\n", base.1, owner.1),
        )?);
        if known.len() >= MAX_MAPPINGS {
            known.clear();
        }
        known.insert(base, Arc::clone(&userns));
        Ok(userns)
    }
}

/// Lays `base` under an overlay in the session directory `dir` and returns the merged
/// directory. `owner` is the sandbox's host uid and gid, who owns what tools write.
pub(super) fn mount(
    dir: &Path,
    base: &OwnedFd,
    owner: (u32, u32),
    mappings: &Mappings,
) -> Result<PathBuf, OverlayError> {
    let make = |name: &str, theirs: bool| -> io::Result<OwnedFd> {
        let path = dir.join(name);
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        if theirs {
            nix::unistd::chown(
                &path,
                Some(nix::unistd::Uid::from_raw(owner.0)),
                Some(nix::unistd::Gid::from_raw(owner.1)),
            )?;
        }
        Ok(OwnedFd::from(std::fs::File::open(&path)?))
    };
    // The merged root takes the upper root's owner and mode: the sandbox's, 0700.
    let upper = make("upper", true).map_err(failed("make the upper directory"))?;
    let work = make("work", false).map_err(failed("make the work directory"))?;
    let lower = make("lower", false).map_err(failed("make the lower directory"))?;
    let merged = make(MERGED, false).map_err(failed("make the merged directory"))?;

    let stat = nix::sys::stat::fstat(base)
        .map_err(io::Error::from)
        .map_err(failed("stat the base"))?;
    let maps = if (stat.st_uid, stat.st_gid) == owner {
        None
    } else {
        Some(
            mappings
                .get((stat.st_uid, stat.st_gid), owner)
                .map_err(failed("make the id mapping"))?,
        )
    };
    let tree = crate::sys::detached_read_only_view(base, maps.as_deref())
        .map_err(failed("make a read-only view of the base"))?;
    crate::sys::attach_mount(&tree, &lower).map_err(failed("attach the base"))?;
    // By descriptor: no option string carries a path, so none needs escaping, and each
    // names the directory made above, not whatever a path resolves to now.
    let fd = |f: &OwnedFd| format!("/proc/self/fd/{}", f.as_raw_fd());
    // No directory renames recorded in xattrs (a rename of a base directory is refused with
    // EXDEV and tools copy instead), no index, no metadata-only copy-ups: the upper layer
    // holds plain files only, which `changes` and the next open read as they are.
    let options = format!(
        "lowerdir={},upperdir={},workdir={},redirect_dir=off,index=off,metacopy=off,xino=off",
        fd(&tree),
        fd(&upper),
        fd(&work)
    );
    nix::mount::mount(
        Some("airlock-workspace"),
        fd(&merged).as_str(),
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .map_err(io::Error::from)
    .map_err(failed("mount the overlay"))?;
    Ok(dir.join(MERGED))
}
