//! Builds the sandbox's root filesystem from the mount plan, then makes it the root.
//!
//! The sandbox root is a tmpfs mounted over `/tmp` in the worker's private mount namespace
//! and assembled there from binds of host paths; then one `pivot_root` makes it `/` and the
//! host's root is detached. Host paths under `/tmp` (hidden by that tmpfs) are reached
//! through a descriptor of the host's `/tmp` opened before it was covered.
//!
//! One `pivot_root`, not bubblewrap's two (a base tmpfs as root first, the host under
//! `/oldroot`): `pivot_root` walks every thread on the machine (`chroot_fs_refs`), which was
//! a tenth of a pooled worker's CPU in a throughput profile, and grows with the host.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, symlink};
use std::path::{Path, PathBuf};

use airlock_protocol::MountOp;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::statvfs::{FsFlags, statvfs};
use nix::unistd::{chdir, pivot_root};

/// Why the root filesystem could not be built.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// A mount-related syscall failed.
    #[error("{operation} {path}: {source}")]
    Syscall {
        /// What was attempted.
        operation: &'static str,
        /// The path involved.
        path: String,
        /// The errno.
        #[source]
        source: nix::Error,
    },
    /// A file or directory could not be created.
    #[error("{operation} {path}: {source}")]
    Io {
        /// What was attempted.
        operation: &'static str,
        /// The path involved.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A required host path does not exist.
    #[error("host path {0} does not exist (mark it read_optional if it may be missing)")]
    MissingSource(String),
}

impl MountError {
    /// The errno behind the failure, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            MountError::Syscall { source, .. } => Some(*source as i32),
            MountError::Io { source, .. } => source.raw_os_error(),
            MountError::MissingSource(_) => Some(libc::ENOENT),
        }
    }
}

/// Where the new root is assembled (an existing directory of every host, covered only in
/// the worker's own mount namespace).
const NEW_ROOT: &str = "/tmp";

fn sys(operation: &'static str, path: &Path) -> impl FnOnce(nix::Error) -> MountError {
    let path = path.display().to_string();
    move |source| MountError::Syscall {
        operation,
        path,
        source,
    }
}

fn io_err(operation: &'static str, path: &Path) -> impl FnOnce(io::Error) -> MountError {
    let path = path.display().to_string();
    move |source| MountError::Io {
        operation,
        path,
        source,
    }
}

/// `/newroot` + a sandbox path.
fn in_new_root(path: &str) -> PathBuf {
    Path::new(NEW_ROOT).join(path.trim_start_matches('/'))
}

/// The host's paths while the new root is assembled over [`NEW_ROOT`].
struct HostPaths {
    /// The host's own `/tmp` directory, opened before the new root covered it.
    covered: fs::File,
}

impl HostPaths {
    /// Opens the host's [`NEW_ROOT`] directory; call before mounting over it.
    fn open() -> Result<Self, MountError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = Path::new(NEW_ROOT);
        let covered = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(path)
            .map_err(io_err("open", path))?;
        Ok(Self { covered })
    }

    /// The path that names host path `path` now: itself, or, under the covered directory,
    /// the same place reached through the descriptor (a lookup from an opened directory
    /// does not enter what is mounted on top of it).
    fn source(&self, path: &str) -> PathBuf {
        use std::os::fd::AsRawFd;
        match path.strip_prefix(NEW_ROOT) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                PathBuf::from(format!("/proc/self/fd/{}", self.covered.as_raw_fd()))
                    .join(rest.trim_start_matches('/'))
            }
            _ => PathBuf::from(path),
        }
    }
}

fn create_dirs(path: &Path, mode: u32) -> Result<(), MountError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(io_err("mkdir", path))
}

fn create_file(path: &Path) -> Result<(), MountError> {
    if let Some(parent) = path.parent() {
        create_dirs(parent, 0o755)?;
    }
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map(drop)
        .map_err(io_err("create mount point", path))
}

/// Flags a remount must keep: in a user namespace the kernel locks the flags a mount had
/// when it was inherited, and a remount that drops one fails with EPERM.
fn locked_flags(path: &Path) -> Result<MsFlags, MountError> {
    let stat = statvfs(path).map_err(sys("statvfs", path))?;
    let f = stat.flags();
    let mut flags = MsFlags::empty();
    for (st, ms) in [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if f.contains(st) {
            flags |= ms;
        }
    }
    Ok(flags)
}

/// Binds `source` on `target` (non-recursively: submounts of the host stay invisible) and
/// remounts it nosuid, nodev, and read-only unless `writable`.
fn bind(source: &Path, target: &Path, writable: bool, extra: MsFlags) -> Result<(), MountError> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(sys("bind", target))?;
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | extra | locked_flags(target)?;
    if !writable {
        flags |= MsFlags::MS_RDONLY;
    }
    mount(None::<&str>, target, None::<&str>, flags, None::<&str>).map_err(sys("remount", target))
}

fn mount_tmpfs(
    target: &Path,
    size_bytes: u64,
    mode: u32,
    flags: MsFlags,
) -> Result<(), MountError> {
    let options = format!("size={size_bytes},mode={mode:o}");
    mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        flags,
        Some(options.as_str()),
    )
    .map_err(sys("mount tmpfs", target))
}

fn apply_bind(
    host: &HostPaths,
    source: &str,
    target: &str,
    writable: bool,
    optional: bool,
) -> Result<(), MountError> {
    let from = host.source(source);
    let to = in_new_root(target);
    let meta = match fs::symlink_metadata(&from) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound && optional => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(MountError::MissingSource(source.to_string()));
        }
        Err(e) => return Err(io_err("stat", &from)(e)),
    };
    if meta.file_type().is_symlink() {
        // Merged-/usr hosts have /bin -> usr/bin: recreate the link, which resolves inside
        // the sandbox, instead of binding what it points to on the host.
        let link = fs::read_link(&from).map_err(io_err("readlink", &from))?;
        if let Some(parent) = to.parent() {
            create_dirs(parent, 0o755)?;
        }
        return symlink(&link, &to).map_err(io_err("symlink", &to));
    }
    if meta.is_dir() {
        create_dirs(&to, 0o755)?;
    } else {
        create_file(&to)?;
    }
    bind(&from, &to, writable, MsFlags::MS_NOSUID | MsFlags::MS_NODEV)
}

/// A minimal /dev: a small read-only tmpfs holding binds of the five harmless devices.
fn build_dev(host: &HostPaths, target: &str) -> Result<(), MountError> {
    let dev = in_new_root(target);
    create_dirs(&dev, 0o755)?;
    mount_tmpfs(
        &dev,
        64 << 10,
        0o755,
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
    )?;
    for name in ["null", "zero", "full", "random", "urandom"] {
        let node = dev.join(name);
        create_file(&node)?;
        bind(
            &host.source(&format!("/dev/{name}")),
            &node,
            true,
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        )?;
    }
    for (link, name) in [
        ("/proc/self/fd", "fd"),
        ("/proc/self/fd/0", "stdin"),
        ("/proc/self/fd/1", "stdout"),
        ("/proc/self/fd/2", "stderr"),
    ] {
        let path = dev.join(name);
        symlink(link, &path).map_err(io_err("symlink", &path))?;
    }
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
    mount(None::<&str>, &dev, None::<&str>, flags, None::<&str>)
        .map_err(sys("remount read-only", &dev))
}

fn apply(host: &HostPaths, op: &MountOp) -> Result<(), MountError> {
    match op {
        MountOp::Bind {
            source,
            target,
            writable,
            optional,
        } => apply_bind(host, source, target, *writable, *optional),
        MountOp::Tmpfs {
            target,
            size_bytes,
            mode,
        } => {
            let path = in_new_root(target);
            create_dirs(&path, 0o755)?;
            mount_tmpfs(
                &path,
                *size_bytes,
                *mode,
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            )
        }
        MountOp::Proc { target } => {
            let path = in_new_root(target);
            create_dirs(&path, 0o555)?;
            let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
            mount(Some("proc"), &path, Some("proc"), flags, None::<&str>)
                .map_err(sys("mount proc", &path))
        }
        MountOp::Dev { target } => build_dev(host, target),
        MountOp::Symlink { link_target, path } => {
            let at = in_new_root(path);
            if let Some(parent) = at.parent() {
                create_dirs(parent, 0o755)?;
            }
            symlink(link_target, &at).map_err(io_err("symlink", &at))
        }
        MountOp::Dir { path, mode } => create_dirs(&in_new_root(path), *mode),
    }
}

/// Builds the sandbox root from `plan` and pivots into it. Needs CAP_SYS_ADMIN in the
/// worker's own user and mount namespaces. Afterwards nothing of the host filesystem is
/// reachable but what the plan bound.
pub fn build_root_filesystem(plan: &[MountOp]) -> Result<(), MountError> {
    let root = Path::new("/");
    // Propagation private first: nothing we mount may leak to the host, and no host mount
    // event may appear in the sandbox later.
    mount(
        None::<&str>,
        root,
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(sys("make private", root))?;

    let host = HostPaths::open()?;
    let new_root = Path::new(NEW_ROOT);
    mount_tmpfs(
        new_root,
        1 << 20,
        0o755,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    )?;
    for op in plan {
        // proc must be mounted while the host's /proc is still visible: the kernel refuses
        // a new procfs in a user namespace otherwise (mount_too_revealing).
        apply(&host, op)?;
    }
    drop(host);
    // The assembled root itself is read-only; writable places are the plan's binds and tmpfs.
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(None::<&str>, new_root, None::<&str>, flags, None::<&str>)
        .map_err(sys("remount read-only", new_root))?;

    // Make the new root `/`: pivot_root(".", ".") stacks the host's root on top of it, and
    // the lazy unmount detaches that (with every host mount under it) for good.
    chdir(new_root).map_err(sys("chdir", new_root))?;
    pivot_root(".", ".").map_err(sys("pivot_root", new_root))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(sys("detach old root", root))?;
    chdir(root).map_err(sys("chdir", root))
}
