//! A session's base: a host directory under one of the policy's `[sessions] bases`.
//!
//! The client's path is checked against the bases lexically before anything on the host is
//! looked at: the daemon (often root) answers the same for every path outside them, so its
//! answers tell nothing of what exists there. Only beneath an allowed base does the answer
//! say whether the directory is there.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use airlock_policy::validate::SessionPolicy;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::SessionError;
use super::tree;

/// A directory beneath one of the policy's bases, opened from that base's root on every
/// use without following a symlink on the way (someone who can change the directories
/// under a base cannot swap one for a link to elsewhere between the check and the copy).
#[derive(Debug)]
pub(super) struct Base {
    /// The policy's base, resolved when the session opened.
    pub(super) root: PathBuf,
    /// The client's base relative to it (`.` for the base itself).
    pub(super) rel: String,
}

impl Base {
    pub(super) fn open(&self) -> io::Result<OwnedFd> {
        let root = tree::open_root(&self.root)?;
        tree::open_beneath(
            root.as_fd(),
            self.rel.as_str(),
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .map_err(io::Error::from)
    }
}

/// The part of `path` beneath `allowed` (`.` for `allowed` itself), compared as text;
/// both are absolute and normalised, `allowed` perhaps with a trailing `/`.
fn beneath<'a>(path: &'a str, allowed: &str) -> Option<&'a str> {
    let allowed = allowed.trim_end_matches('/');
    if path == allowed || (path.is_empty() && allowed.is_empty()) {
        return Some(".");
    }
    path.strip_prefix(allowed)?.strip_prefix('/')
}

/// Resolves a client's base to a directory under one of the policy's bases.
pub(super) fn allowed_base(policy: &SessionPolicy, base: &str) -> Result<Base, SessionError> {
    const OP: &str = "session_open";
    if !base.starts_with('/') || base.contains('\0') || base.len() > tree::MAX_PATH_BYTES {
        return Err(SessionError::invalid(
            OP,
            "base must be an absolute host path",
        ));
    }
    let path = base.trim_end_matches('/');
    // Checked as text, so `..` would lead anywhere: a base must be written normalised.
    if path
        .split('/')
        .skip(1)
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(SessionError::invalid(
            OP,
            "base must be normalised: no empty, `.` or `..` components",
        ));
    }
    let Some((allowed, rel)) = policy
        .bases
        .iter()
        .find_map(|allowed| Some((allowed, beneath(path, allowed)?)))
    else {
        return Err(SessionError::invalid(
            OP,
            "base is not under any of the policy's [sessions] bases",
        ));
    };
    // The policy's own base may lie behind a symlink its writer chose; nothing beneath it
    // is followed.
    let found = std::fs::canonicalize(allowed)
        .map(|root| Base {
            root,
            rel: rel.to_string(),
        })
        .map_err(|_| SessionError::invalid(OP, "base does not exist"))?;
    match found.open() {
        Ok(_) => Ok(found),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(SessionError::invalid(OP, "base does not exist"))
        }
        Err(_) => Err(SessionError::invalid(
            OP,
            "base is not a directory reachable without symlinks",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::beneath;

    #[test]
    fn a_path_is_beneath_a_base_only_at_a_component_boundary() {
        assert_eq!(beneath("/srv/base", "/srv/base"), Some("."));
        assert_eq!(beneath("/srv/base", "/srv/base/"), Some("."));
        assert_eq!(beneath("/srv/base/a/b", "/srv/base"), Some("a/b"));
        assert_eq!(beneath("/srv/base-other", "/srv/base"), None);
        assert_eq!(beneath("/srv", "/srv/base"), None);
        assert_eq!(beneath("/etc", "/"), Some("etc"));
        assert_eq!(beneath("", "/"), Some("."));
    }
}
