//! Builds the sandbox's root filesystem from the mount plan, then makes it the root.
//!
//! The bubblewrap way: a private tmpfs "base" becomes the root first, with the host root
//! under `/oldroot` as the source of every bind; the sandbox root is assembled at
//! `/newroot`; finally `/newroot` becomes `/` and everything of the host is detached.

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

const BASE: &str = "/tmp";
const OLD_ROOT: &str = "/oldroot";
const NEW_ROOT: &str = "/newroot";

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

/// `/oldroot` + a host path.
fn in_old_root(path: &str) -> PathBuf {
    Path::new(OLD_ROOT).join(path.trim_start_matches('/'))
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
    source: &str,
    target: &str,
    writable: bool,
    optional: bool,
) -> Result<(), MountError> {
    let from = in_old_root(source);
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
fn build_dev(target: &str) -> Result<(), MountError> {
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
            &in_old_root(&format!("/dev/{name}")),
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

fn apply(op: &MountOp) -> Result<(), MountError> {
    match op {
        MountOp::Bind {
            source,
            target,
            writable,
            optional,
        } => apply_bind(source, target, *writable, *optional),
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
        MountOp::Dev { target } => build_dev(target),
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

    // The base tmpfs becomes the root, with the host root moved under /oldroot.
    let base = Path::new(BASE);
    mount_tmpfs(base, 1 << 20, 0o755, MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?;
    create_dirs(&base.join("oldroot"), 0o755)?;
    create_dirs(&base.join("newroot"), 0o755)?;
    pivot_root(base, &base.join("oldroot")).map_err(sys("pivot_root", base))?;
    chdir(root).map_err(sys("chdir", root))?;

    let new_root = Path::new(NEW_ROOT);
    mount_tmpfs(
        new_root,
        1 << 20,
        0o755,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    )?;
    for op in plan {
        // proc must be mounted while the host's /proc is still visible under /oldroot: the
        // kernel refuses a new procfs in a user namespace otherwise (mount_too_revealing).
        apply(op)?;
    }
    // The assembled root itself is read-only; writable places are the plan's binds and tmpfs.
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(None::<&str>, new_root, None::<&str>, flags, None::<&str>)
        .map_err(sys("remount read-only", new_root))?;

    // Detach the host root, then make /newroot the root: pivot_root(".", ".") stacks the
    // old root on top, and the lazy unmount removes it (and the base tmpfs) for good.
    let old_root = Path::new(OLD_ROOT);
    umount2(old_root, MntFlags::MNT_DETACH).map_err(sys("detach", old_root))?;
    chdir(new_root).map_err(sys("chdir", new_root))?;
    pivot_root(".", ".").map_err(sys("pivot_root", new_root))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(sys("detach old root", root))?;
    chdir(root).map_err(sys("chdir", root))
}
