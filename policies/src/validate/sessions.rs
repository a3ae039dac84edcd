//! Session workspaces: the `[sessions]` table (bases and bounds) and each profile's
//! `workspace` and `workspace_size`.

use super::{Checker, PathGrant, SessionPolicy, Workspace, bounds};
use crate::model::{ProfileFile, SessionsFile};

/// Default size of a workspace whose profile names none (cut to the sessions' `max_size`).
pub const DEFAULT_WORKSPACE_BYTES: u64 = 256 << 20;

/// The `[sessions]` table, every bound checked; defaults for what it leaves out.
pub(super) fn check_sessions(c: &mut Checker<'_>, file: Option<&SessionsFile>) -> SessionPolicy {
    let mut policy = SessionPolicy::default();
    let Some(file) = file else {
        return policy;
    };
    for base in &file.bases {
        let Some(path) = c.path(base, "sessions base") else {
            continue;
        };
        if path == "/" {
            c.error(
                base.span(),
                "sessions base \"/\" would let a session copy any host file",
            );
        } else if policy.bases.contains(&path) {
            c.error(
                base.span(),
                format!("sessions base {path:?} is listed more than once"),
            );
        } else {
            policy.bases.push(path);
        }
    }
    if let Some(max) = &file.max_sessions
        && let Some(n) = c.integer(max, "sessions max_sessions", bounds::MAX_SESSIONS)
    {
        policy.max_sessions = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(idle) = &file.idle_timeout
        && let Some(d) = c.duration(idle, "sessions idle_timeout")
    {
        if d < bounds::IDLE_TIMEOUT_MIN {
            c.error(idle.span(), "sessions idle_timeout must be at least 1s");
        } else {
            policy.idle_timeout = d;
        }
    }
    if let Some(lifetime) = &file.max_lifetime {
        match crate::units::parse_duration(lifetime.get_ref()) {
            Ok(d) if (bounds::LIFETIME.0..=bounds::LIFETIME.1).contains(&d) => {
                policy.max_lifetime = d;
            }
            Ok(_) => c.error(
                lifetime.span(),
                "sessions max_lifetime must be from 1s to 30 days (720h)",
            ),
            Err(e) => c.error(lifetime.span(), format!("sessions max_lifetime: {e}")),
        }
    }
    if let Some(size) = &file.max_size
        && let Some(bytes) = c.size(size, "sessions max_size", bounds::TMPFS_BYTES)
    {
        policy.max_size_bytes = bytes;
    }
    if let Some(inodes) = &file.max_inodes
        && let Some(n) = c.integer(inodes, "sessions max_inodes", bounds::INODES)
    {
        policy.max_inodes = n;
    }
    policy
}

/// A profile's `workspace` (a path of its own: not airlock's, not another grant's, not
/// nested in one or holding one) and `workspace_size` (within the sessions' `max_size`).
pub(super) fn check_workspace(
    c: &mut Checker<'_>,
    file: &ProfileFile,
    grants: &[&str],
    sessions: &SessionPolicy,
) -> Option<Workspace> {
    let Some(path) = &file.workspace else {
        if let Some(size) = &file.workspace_size {
            c.error(size.span(), "workspace_size needs a workspace");
        }
        return None;
    };
    let checked = c.path(path, "workspace");
    let size = match &file.workspace_size {
        Some(size) => c.size(size, "workspace_size", bounds::TMPFS_BYTES),
        None => Some(DEFAULT_WORKSPACE_BYTES.min(sessions.max_size_bytes)),
    };
    if let (Some(size), Some(written)) = (size, &file.workspace_size)
        && size > sessions.max_size_bytes
    {
        c.error(
            written.span(),
            format!(
                "workspace_size is over the sessions' max_size of {}",
                crate::units::format_size(sessions.max_size_bytes)
            ),
        );
        return None;
    }
    let checked = checked?;
    if let Some(problem) = overlap(&checked, grants) {
        c.error(path.span(), format!("workspace {checked:?} {problem}"));
        return None;
    }
    Some(Workspace {
        path: checked,
        size_bytes: size?,
    })
}

/// Why a workspace at `path` cannot be mounted beside the profile's other paths.
fn overlap(path: &str, grants: &[&str]) -> Option<String> {
    if path == "/" {
        return Some("would hide the whole sandbox root".into());
    }
    let inside = |outer: &str, inner: &str| {
        outer == "/" || inner == outer || inner.starts_with(&format!("{outer}/"))
    };
    for reserved in ["/proc", "/dev"] {
        if inside(reserved, path) {
            return Some(format!("is under {reserved}, which airlock mounts itself"));
        }
    }
    grants.iter().find_map(|grant| {
        if inside(grant, path) {
            Some(format!("is inside the profile's path {grant:?}"))
        } else if inside(path, grant) {
            Some(format!("holds the profile's path {grant:?}"))
        } else {
            None
        }
    })
}

/// The paths a profile mounts, for [`check_workspace`].
pub(super) fn granted_paths<'a>(
    read: &'a [PathGrant],
    write: &'a [PathGrant],
    tmpfs: &'a [(String, u64)],
) -> Vec<&'a str> {
    read.iter()
        .chain(write)
        .map(|g| g.path.as_str())
        .chain(tmpfs.iter().map(|(p, _)| p.as_str()))
        .collect()
}
