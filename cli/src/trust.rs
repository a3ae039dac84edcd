//! Whether the policy file of `serve` and `mcp` is the daemon's owner's to change alone.
//!
//! The daemon reloads its policy whenever the file's text changes, so whoever can write
//! the file — or replace it, by writing any directory its path goes through — decides
//! what every tool call may do. A daemon running as root refuses to start with, or reload,
//! a policy that anyone but root (or its own uid) could change that way; any other daemon
//! warns, since its policy is no more than its own user's to lose. The sticky bit of
//! `/tmp` is no exception: it keeps others from renaming the file away, not from making
//! the path's next directory first.
//!
//! A file or directory on a read-only mount is writable by no one through this path,
//! whatever its mode: making the mount writable again takes root's privileges over the
//! mount namespace. Kubernetes mounts a ConfigMap volume read-only with a root of mode 0777,
//! and a policy kept there is accepted. Like every other part of the check, this judges the
//! path as the daemon sees it: a writable mount of the same directory elsewhere (the
//! kubelet's own, root's alone) is outside what it looks at.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why the policy path is not the daemon's alone.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TrustError {
    /// A file or directory of the path cannot be examined.
    #[error("cannot examine {path}")]
    Stat {
        /// The file or directory.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The current directory, for a relative policy path, is unknown.
    #[error("cannot find the current directory")]
    CurrentDir(#[source] std::io::Error),
    /// A file or directory of the path is writable by its group or by everyone.
    #[error(
        "policy {policy}: {path} is writable by {who} (mode {mode:04o}); a policy loaded as \
         root must be writable by root alone, and so must every directory above it"
    )]
    Writable {
        /// The policy file, as given.
        policy: String,
        /// The file or directory.
        path: String,
        /// "its group", "everyone" or both.
        who: &'static str,
        /// Its permission bits.
        mode: u32,
    },
    /// A file or directory of the path is owned by another user.
    #[error(
        "policy {policy}: {path} is owned by uid {uid}, not by root or the daemon's uid \
         {euid}; that user could change the policy"
    )]
    Owner {
        /// The policy file, as given.
        policy: String,
        /// The file or directory.
        path: String,
        /// Its owner.
        uid: u32,
        /// The daemon's effective uid.
        euid: u32,
    },
}

/// Checks the policy at `policy` for a daemon of effective uid `euid`: the file and every
/// directory its lookup goes through, both along the path as given (whose symlinks are
/// followed) and along the path they resolve to.
pub(crate) fn check_policy_path(policy: &Path, euid: u32) -> Result<(), TrustError> {
    let shown = policy.display().to_string();
    let absolute = if policy.is_absolute() {
        policy.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(TrustError::CurrentDir)?
            .join(policy)
    };
    let resolved = std::fs::canonicalize(&absolute).map_err(|source| TrustError::Stat {
        path: shown.clone(),
        source,
    })?;
    let mut seen: Vec<PathBuf> = Vec::new();
    for path in resolved.ancestors().chain(absolute.ancestors()) {
        if seen.iter().any(|p| p == path) {
            continue;
        }
        seen.push(path.to_path_buf());
        check_one(&shown, path, euid)?;
    }
    Ok(())
}

/// Checks one file or directory (followed, if a symlink).
fn check_one(policy: &str, path: &Path, euid: u32) -> Result<(), TrustError> {
    let meta = std::fs::metadata(path).map_err(|source| TrustError::Stat {
        path: path.display().to_string(),
        source,
    })?;
    let mode = meta.mode() & 0o7777;
    let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => Some("its group and everyone"),
        (true, false) => Some("its group"),
        (false, true) => Some("everyone"),
        (false, false) => None,
    };
    if let Some(who) = who.filter(|_| !on_read_only_mount(path)) {
        return Err(TrustError::Writable {
            policy: policy.to_string(),
            path: path.display().to_string(),
            who,
            mode,
        });
    }
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(TrustError::Owner {
            policy: policy.to_string(),
            path: path.display().to_string(),
            uid: meta.uid(),
            euid,
        });
    }
    Ok(())
}

/// Whether `path` (followed, if a symlink) lies on a mount that is read-only, for the mount
/// or its whole filesystem. Unknown counts as writable.
fn on_read_only_mount(path: &Path) -> bool {
    use nix::sys::statvfs::{FsFlags, statvfs};
    statvfs(path).is_ok_and(|st| st.flags().contains(FsFlags::ST_RDONLY))
}

/// The check as the daemon applies it: an error for a root daemon, a logged warning (and
/// Ok) for any other.
pub(crate) fn trusted_policy(policy: &Path) -> Result<(), TrustError> {
    let euid = nix::unistd::geteuid().as_raw();
    match check_policy_path(policy, euid) {
        Err(e) if euid != 0 => {
            tracing::warn!(error = %format!("{:#}", anyhow::Error::from(e)), "policy file not protected");
            Ok(())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A directory under a fresh one of mode 0755, removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("airlock-trust-{tag}-{}", std::process::id()))
                .join("inner");
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn chmod(path: &Path, mode: u32) {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
        }
    }

    /// Checks `path` from its parent down: the system temp directory above is shared and
    /// not what these tests are about.
    fn check_below(top: &Path, path: &Path, euid: u32) -> Result<(), TrustError> {
        for p in path.ancestors().take_while(|p| p.starts_with(top)) {
            check_one("p", p, euid)?;
        }
        Ok(())
    }

    #[test]
    fn a_policy_in_a_directory_others_may_write_is_refused() {
        let dir = Dir::new("others");
        let policy = dir.0.join("p.toml");
        std::fs::write(&policy, "version = 1\n").unwrap();
        Dir::chmod(&policy, 0o644);
        Dir::chmod(&dir.0, 0o755);
        assert!(check_below(&dir.0, &policy, 0).is_ok());
        Dir::chmod(&dir.0, 0o777);
        let refused = check_below(&dir.0, &policy, 0).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("writable by its group and everyone"),
            "{refused}"
        );
        Dir::chmod(&dir.0, 0o1777);
        assert!(matches!(
            check_below(&dir.0, &policy, 0),
            Err(TrustError::Writable { .. })
        ));
        Dir::chmod(&dir.0, 0o775);
        assert!(matches!(
            check_below(&dir.0, &policy, 0),
            Err(TrustError::Writable {
                who: "its group",
                ..
            })
        ));
    }

    #[test]
    fn a_policy_file_others_may_write_is_refused() {
        let dir = Dir::new("file");
        let policy = dir.0.join("p.toml");
        std::fs::write(&policy, "version = 1\n").unwrap();
        Dir::chmod(&dir.0, 0o755);
        Dir::chmod(&policy, 0o646);
        assert!(matches!(
            check_below(&dir.0, &policy, 0),
            Err(TrustError::Writable {
                who: "everyone",
                ..
            })
        ));
    }

    #[test]
    fn a_policy_owned_by_another_user_is_refused() {
        let dir = Dir::new("owner");
        let policy = dir.0.join("p.toml");
        std::fs::write(&policy, "version = 1\n").unwrap();
        Dir::chmod(&dir.0, 0o755);
        Dir::chmod(&policy, 0o644);
        let mine = std::fs::metadata(&policy).unwrap().uid();
        // Owned by this process's user: fine for a daemon of that uid, and for root's
        // only when that user is root.
        assert!(check_below(&dir.0, &policy, mine).is_ok());
        let other = if mine == 0 { 4242 } else { 0 };
        if mine != 0 {
            assert!(matches!(
                check_below(&dir.0, &policy, other),
                Err(TrustError::Owner { .. })
            ));
        } else {
            std::os::unix::fs::chown(&policy, Some(4242), None).unwrap();
            assert!(matches!(
                check_below(&dir.0, &policy, 0),
                Err(TrustError::Owner { uid: 4242, .. })
            ));
            assert!(check_below(&dir.0, &policy, other).is_ok());
        }
    }

    /// As the kubelet makes a ConfigMap volume: a root of mode 0777, the files in a
    /// timestamped 0755 directory reached through the `..data` symlink, mounted read-only.
    /// The mounts are made in a mount namespace of the test's own thread, so only as root.
    #[test]
    fn a_policy_on_a_read_only_mount_may_sit_below_a_mode_0777_directory() {
        use nix::mount::{MsFlags, mount};
        use std::os::unix::fs::symlink;

        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: mounting needs root");
            return;
        }
        let dir = Dir::new("configmap");
        let volume = dir.0.join("volume");
        std::fs::create_dir(&volume).unwrap();
        let dir_path = dir.0.clone();
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).unwrap();
            let none: Option<&str> = None;
            mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none).unwrap();
            mount(
                Some("tmpfs"),
                &volume,
                Some("tmpfs"),
                MsFlags::empty(),
                none,
            )
            .unwrap();
            Dir::chmod(&volume, 0o777);
            let stamped = volume.join("..2026_01_01_00_00_00.1");
            std::fs::create_dir(&stamped).unwrap();
            Dir::chmod(&stamped, 0o755);
            std::fs::write(stamped.join("policy.toml"), "version = 1\n").unwrap();
            Dir::chmod(&stamped.join("policy.toml"), 0o644);
            symlink("..2026_01_01_00_00_00.1", volume.join("..data")).unwrap();
            symlink("..data/policy.toml", volume.join("policy.toml")).unwrap();
            let policy = volume.join("policy.toml");
            let check = |euid| {
                for p in [stamped.join("policy.toml"), stamped.clone(), volume.clone()] {
                    check_one("p", &p, euid)?;
                }
                check_below(&dir_path, &policy, euid)
            };
            // Writable, the volume's root is everyone's to fill.
            assert!(matches!(
                check(0),
                Err(TrustError::Writable {
                    who: "its group and everyone",
                    ..
                })
            ));
            let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
            mount(none, &volume, none, flags, none).unwrap();
            check(0).unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_symlinked_policy_is_checked_where_it_leads() {
        let dir = Dir::new("link");
        let open = dir.0.join("open");
        std::fs::create_dir(&open).unwrap();
        let policy = open.join("p.toml");
        std::fs::write(&policy, "version = 1\n").unwrap();
        Dir::chmod(&dir.0, 0o755);
        Dir::chmod(&policy, 0o644);
        Dir::chmod(&open, 0o777);
        let link = dir.0.join("p.toml");
        std::os::unix::fs::symlink(&policy, &link).unwrap();
        // The directory the link leads into comes first, whatever lies above the test's.
        match check_policy_path(&link, 0) {
            Err(TrustError::Writable { path, .. }) => assert_eq!(path, open.display().to_string()),
            other => panic!("{other:?}"),
        }
    }
}
