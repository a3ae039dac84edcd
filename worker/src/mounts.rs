//! Builds the sandbox's root filesystem from the mount plan, then makes it the root.
//!
//! The sandbox root is a tmpfs mounted over `/tmp` in the worker's private mount namespace
//! and assembled there from binds of host paths; then one `pivot_root` makes it `/` and the
//! host's root is detached.
//!
//! One `pivot_root`, not bubblewrap's two (a base tmpfs as root first, the host under
//! `/oldroot`): `pivot_root` walks every thread on the machine (`chroot_fs_refs`), which was
//! a tenth of a pooled worker's CPU in a throughput profile, and grows with the host.
//!
//! Every path is resolved by [`crate::paths`], component by component, and every mount is
//! made on the descriptors that walk opened: a symlink a tool planted in a writable bind
//! for the next call is refused, never followed (escape battery FS-05). The bind sources
//! are all opened first, while the host's `/tmp` is not yet covered by the new root.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::path::Path;

use airlock_protocol::MountOp;
use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat, readlinkat};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::{Mode, SFlag};
use nix::sys::statvfs::{FsFlags, fstatvfs};
use nix::unistd::{chdir, pivot_root, symlinkat};

use crate::paths::{
    Entry, FD_DIR, FileId, PathError, Tree, duplicate, fd_name, identify, make_dir,
    open_nofollow_non_directory,
};

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
    /// A path could not be resolved safely.
    #[error(transparent)]
    Path(#[from] PathError),
    /// A required host path does not exist.
    #[error("host path {0} does not exist (mark it read_optional if it may be missing)")]
    MissingSource(String),
    /// Told its root came from a template, the worker found another root.
    #[error("the root is not a read-only tmpfs, so not a template's: refusing to mount on it")]
    NotATemplateRoot,
    /// A template's worker got a mount step that belongs in the template.
    #[error("{0} is not a per-worker mount step")]
    NotPerWorker(&'static str),
}

impl MountError {
    /// The errno behind the failure, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            MountError::Syscall { source, .. } => Some(*source as i32),
            MountError::Path(e) => Some(e.errno()),
            MountError::MissingSource(_) => Some(libc::ENOENT),
            MountError::NotATemplateRoot | MountError::NotPerWorker(_) => Some(libc::EINVAL),
        }
    }
}

/// Where the new root is assembled (an existing directory of every host, covered only in
/// the worker's own mount namespace).
const NEW_ROOT: &str = "/tmp";

fn sys(operation: &'static str, path: &str) -> impl FnOnce(nix::Error) -> MountError {
    let path = path.to_string();
    move |source| MountError::Syscall {
        operation,
        path,
        source,
    }
}

fn open_dir(path: &str) -> Result<OwnedFd, MountError> {
    open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(sys("open", path))
}

/// A bind source, opened on the host before anything was mounted.
#[derive(Debug)]
enum Source {
    /// Optional and missing: the bind is skipped.
    Missing,
    /// A symlink (not below a writable bind): recreated in the sandbox with this text,
    /// where it resolves against the sandbox's own tree. Merged-/usr hosts have
    /// `/bin -> usr/bin`.
    Link(OsString),
    /// A directory or file to bind, and its identity.
    Node { fd: OwnedFd, dir: bool, id: FileId },
}

/// Opens host path `path` as a bind source.
fn open_source(host: &Tree, path: &str, optional: bool) -> Result<Source, MountError> {
    let missing = || {
        if optional {
            Ok(Source::Missing)
        } else {
            Err(MountError::MissingSource(path.to_string()))
        }
    };
    let Some(entry) = host.parent_of(path, None)? else {
        return missing();
    };
    let Some(fd) = entry.open().map_err(sys("open", path))? else {
        return missing();
    };
    let (id, kind) = identify(&fd).map_err(sys("stat", path))?;
    match kind {
        SFlag::S_IFLNK => {
            let tainted = match entry.tainted {
                Some(tainted) => tainted,
                None => host.is_tainted(path)?,
            };
            if tainted {
                return Err(PathError::PlantedSymlink {
                    path: path.to_string(),
                    link: path.to_string(),
                }
                .into());
            }
            Ok(Source::Link(
                readlinkat(&fd, "").map_err(sys("readlink", path))?,
            ))
        }
        SFlag::S_IFDIR => Ok(Source::Node { fd, dir: true, id }),
        _ => Ok(Source::Node { fd, dir: false, id }),
    }
}

/// Opens every bind source of `plan` (`None` for the plan's other steps), refusing
/// symlinks below a writable bind; returns them with the host tree, which knows the
/// writable binds. Those are resolved first, parents first as the plan orders them, to
/// learn the identities that mark "below a writable bind"; then all sources are resolved
/// again knowing all of them.
fn open_sources(plan: &[MountOp]) -> Result<(Vec<Option<Source>>, Tree), MountError> {
    let mut host = Tree::new(open_dir("/")?, Vec::new()).map_err(sys("stat", "/"))?;
    for op in plan {
        if let MountOp::Bind {
            source,
            writable: true,
            optional,
            ..
        } = op
            && let Source::Node { id, .. } = open_source(&host, source, *optional)?
        {
            host.mark_writable(id);
        }
    }
    let sources = plan
        .iter()
        .map(|op| match op {
            MountOp::Bind {
                source, optional, ..
            } => open_source(&host, source, *optional).map(Some),
            _ => Ok(None),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((sources, host))
}

/// The host's five harmless devices, opened like any bind source.
const DEVICES: [&str; 5] = ["null", "zero", "full", "random", "urandom"];

fn open_devices(host: &Tree, plan: &[MountOp]) -> Result<Vec<(OwnedFd, FileId)>, MountError> {
    if !plan.iter().any(|op| matches!(op, MountOp::Dev { .. })) {
        return Ok(Vec::new());
    }
    // The host's /dev once, then each device in it: neither a directory nor a symlink
    // (never followed) is accepted as one.
    let dev = host
        .parent_of("/dev/null", None)?
        .ok_or_else(|| MountError::MissingSource("/dev".into()))?;
    DEVICES
        .iter()
        .map(|name| {
            let path = format!("/dev/{name}");
            let fd = open_nofollow_non_directory(&dev.parent, OsStr::new(name))
                .map_err(sys("open", &path))?;
            match identify(&fd).map_err(sys("stat", &path))? {
                (_, SFlag::S_IFDIR | SFlag::S_IFLNK) => Err(sys("open", &path)(Errno::ENODEV)),
                (id, _) => Ok((fd, id)),
            }
        })
        .collect()
}

/// Flags a remount must keep: in a user namespace the kernel locks the flags a mount had
/// when it was inherited, and a remount that drops one fails with EPERM.
fn locked_flags(fd: &OwnedFd, path: &str) -> Result<MsFlags, MountError> {
    let stat = fstatvfs(fd).map_err(sys("statvfs", path))?;
    // statvfs(3)'s ST_RELATIME (Linux 2.6.20) is 0x1000 on every architecture; nix names it
    // only for glibc targets, and the worker is also built against musl.
    const ST_RELATIME: FsFlags = FsFlags::from_bits_retain(0x1000);
    let f = stat.flags();
    let mut flags = MsFlags::empty();
    for (st, ms) in [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if f.contains(st) {
            flags |= ms;
        }
    }
    Ok(flags)
}

/// What a mount point must be.
#[derive(Debug, Clone, Copy)]
enum Point {
    /// A directory, created with this mode if missing.
    Dir(u32),
    /// A file, created empty if missing.
    File,
}

/// A mount point in the new root, opened: the entry it was reached by (to look it up again
/// once something is mounted on it) and the point itself.
struct MountPoint {
    entry: Entry,
    fd: OwnedFd,
    path: String,
}

impl MountPoint {
    /// Resolves `path` in the new root, creating what is missing; a symlink as the mount
    /// point is refused (the kernel would follow it).
    fn make(tree: &Tree, path: &str, point: Point) -> Result<Self, MountError> {
        let parent_mode = match point {
            Point::Dir(mode) => mode,
            Point::File => 0o755,
        };
        let entry = tree
            .parent_of(path, Some(parent_mode))?
            .ok_or_else(|| sys("mount on", path)(Errno::EINVAL))?;
        let created = match point {
            Point::Dir(mode) => make_dir(&entry.parent, &entry.name, mode),
            Point::File => openat(
                &entry.parent,
                entry.name.as_os_str(),
                OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_WRONLY
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            )
            .map(drop),
        };
        match created {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(sys("create mount point", path)(e)),
        }
        let opened = match point {
            Point::Dir(_) => entry.open(),
            Point::File => entry.open_non_directory(),
        };
        let fd = opened
            .map_err(sys("open mount point", path))?
            .ok_or_else(|| sys("open mount point", path)(Errno::ENOENT))?;
        let (_, kind) = identify(&fd).map_err(sys("stat", path))?;
        if kind == SFlag::S_IFLNK {
            let tainted = match entry.tainted {
                Some(tainted) => tainted,
                None => tree.is_tainted(path)?,
            };
            return Err(if tainted {
                PathError::PlantedSymlink {
                    path: path.to_string(),
                    link: path.to_string(),
                }
            } else {
                PathError::LinkAsMountPoint(path.to_string())
            }
            .into());
        }
        Ok(Self {
            entry,
            fd,
            path: path.to_string(),
        })
    }

    /// Mounts on the point itself, through its descriptor.
    fn mount(
        &self,
        source: Option<&Path>,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
        operation: &'static str,
    ) -> Result<(), MountError> {
        mount(source, &fd_name(&self.fd), fstype, flags, data).map_err(sys(operation, &self.path))
    }

    /// The root of what is now mounted on the point (looked up by name again: the lookup
    /// enters the new mount, the descriptor taken before does not).
    fn mounted(&self) -> Result<OwnedFd, MountError> {
        self.entry
            .open()
            .map_err(sys("open mount", &self.path))?
            .ok_or_else(|| sys("open mount", &self.path)(Errno::ENOENT))
    }

    /// Remounts what was mounted on the point with `flags`.
    fn remount(&self, top: &OwnedFd, flags: MsFlags) -> Result<(), MountError> {
        mount(
            None::<&str>,
            &fd_name(top),
            None::<&str>,
            MsFlags::MS_REMOUNT | flags,
            None::<&str>,
        )
        .map_err(sys("remount", &self.path))
    }
}

/// How binds are made. By descriptor when the kernel has the mount API for it (Linux
/// 5.12: `open_tree`, `mount_setattr`, `move_mount`): the copy gets its read-only, nosuid
/// and nodev flags while still detached, so it is never visible with weaker ones, and no
/// path is looked up. With mount(2), each bind looks up three `/proc/self/fd` names, reads
/// the source's flags (a remount must repeat the locked ones) and opens the point again to
/// check what it shows. On a kernel without those calls (ENOSYS), or where a container's
/// seccomp profile refuses them (EPERM), the worker uses mount(2) for the rest of its binds.
#[derive(Debug)]
struct Binder {
    by_descriptor: std::cell::Cell<bool>,
}

/// Which way [`Binder`] makes binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindMethod {
    /// The descriptor-based mount API, falling back to mount(2) where it is missing.
    Preferred,
    /// mount(2) and a remount only (what the fallback does; chosen by tests).
    MountSyscall,
}

impl Binder {
    fn new(method: BindMethod) -> Self {
        Self {
            by_descriptor: std::cell::Cell::new(method == BindMethod::Preferred),
        }
    }

    /// Binds `source` on the mount point (non-recursively: submounts of the host stay
    /// invisible) with the flags `extra` (nosuid, nodev, noexec), read-only unless
    /// `writable`.
    fn bind(
        &self,
        source: &OwnedFd,
        source_id: FileId,
        point: &MountPoint,
        writable: bool,
        extra: MsFlags,
    ) -> Result<(), MountError> {
        if self.by_descriptor.get() {
            match bind_by_descriptor(source, point, writable, extra) {
                Ok(()) => return Ok(()),
                Err(DescriptorBindError::Unsupported) => self.by_descriptor.set(false),
                Err(DescriptorBindError::Failed(step, errno)) => {
                    return Err(sys(step, &point.path)(errno));
                }
            }
        }
        bind_by_remount(source, source_id, point, writable, extra)
    }

    /// Binds `source` on `target` as it is, its mount's flags and all (no remount, no
    /// check that the target shows it: for targets nothing else can reach yet). `fd_path`
    /// names a descriptor for mount(2).
    fn cover(
        &self,
        source: &OwnedFd,
        target: &OwnedFd,
        fd_path: impl Fn(&OwnedFd) -> std::path::PathBuf,
    ) -> nix::Result<()> {
        let errno = |e: std::io::Error| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO));
        if self.by_descriptor.get() {
            match crate::sys::clone_mount_detached(source).map_err(errno) {
                Ok(tree) => return crate::sys::attach_mount(&tree, target).map_err(errno),
                Err(Errno::ENOSYS | Errno::EPERM) => self.by_descriptor.set(false),
                Err(e) => return Err(e),
            }
        }
        mount(
            Some(&fd_path(source)),
            &fd_path(target),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
    }
}

/// Why a bind by descriptor did not happen.
#[derive(Debug)]
enum DescriptorBindError {
    /// `open_tree` or `mount_setattr` is missing or refused (ENOSYS, EPERM): use mount(2).
    Unsupported,
    /// This step failed otherwise (a refused attach is always a real failure).
    Failed(&'static str, Errno),
}

fn bind_by_descriptor(
    source: &OwnedFd,
    point: &MountPoint,
    writable: bool,
    extra: MsFlags,
) -> Result<(), DescriptorBindError> {
    use crate::sys::mount_attr;
    let errno = |e: std::io::Error| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO));
    // The first two calls are the probes of what the kernel offers.
    let probe = |step: &'static str| {
        move |e: std::io::Error| match errno(e) {
            Errno::ENOSYS | Errno::EPERM => DescriptorBindError::Unsupported,
            other => DescriptorBindError::Failed(step, other),
        }
    };
    let mut set = if writable { 0 } else { mount_attr::RDONLY };
    for (flag, attr) in [
        (MsFlags::MS_NOSUID, mount_attr::NOSUID),
        (MsFlags::MS_NODEV, mount_attr::NODEV),
        (MsFlags::MS_NOEXEC, mount_attr::NOEXEC),
    ] {
        if extra.contains(flag) {
            set |= attr;
        }
    }
    // Attached by descriptor, the mount is the copy of `source` itself on the point itself:
    // no path is resolved in between, so there is nothing to re-check afterwards.
    let tree = crate::sys::clone_mount_detached(source).map_err(probe("bind"))?;
    crate::sys::set_mount_attributes(&tree, set).map_err(probe("bind flags"))?;
    crate::sys::attach_mount(&tree, &point.fd)
        .map_err(|e| DescriptorBindError::Failed("attach", errno(e)))
}

/// Binds with mount(2) on descriptor names, checks that the point shows the source, then
/// remounts with the flags wanted plus the ones the kernel locked.
fn bind_by_remount(
    source: &OwnedFd,
    source_id: FileId,
    point: &MountPoint,
    writable: bool,
    extra: MsFlags,
) -> Result<(), MountError> {
    let locked = locked_flags(source, &point.path)?;
    point.mount(Some(&fd_name(source)), None, MsFlags::MS_BIND, None, "bind")?;
    let top = point.mounted()?;
    // What the point shows now must be the source itself: nothing was swapped in between.
    if identify(&top).map_err(sys("stat", &point.path))?.0 != source_id {
        return Err(sys("bind", &point.path)(Errno::ESTALE));
    }
    let mut flags = MsFlags::MS_BIND | extra | locked;
    if !writable {
        flags |= MsFlags::MS_RDONLY;
    }
    point.remount(&top, flags)
}

fn mount_tmpfs(
    point: &MountPoint,
    size_bytes: u64,
    mode: u32,
    flags: MsFlags,
) -> Result<(), MountError> {
    let options = format!("size={size_bytes},mode={mode:o}");
    point.mount(
        Some(Path::new("tmpfs")),
        Some("tmpfs"),
        flags,
        Some(&options),
        "mount tmpfs",
    )
}

/// A minimal /dev: a directory of the new root holding binds of the five harmless devices
/// and the stdio links. Not a tmpfs of its own (it was): the directory becomes read-only
/// with the root, each device bind carries its own nosuid,noexec, and nothing else in it
/// is executable. One superblock fewer to make and to tear down at every worker's end.
fn build_dev(
    binder: &Binder,
    tree: &Tree,
    devices: &[(OwnedFd, FileId)],
    target: &str,
) -> Result<(), MountError> {
    let point = MountPoint::make(tree, target, Point::Dir(0o755))?;
    for (link, name) in [
        ("/proc/self/fd", "fd"),
        ("/proc/self/fd/0", "stdin"),
        ("/proc/self/fd/1", "stdout"),
        ("/proc/self/fd/2", "stderr"),
    ] {
        symlinkat(link, &point.fd, name).map_err(sys("symlink", target))?;
    }
    let dev = Tree::new(point.fd, Vec::new()).map_err(sys("open", target))?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
    for (name, (fd, id)) in DEVICES.iter().zip(devices) {
        let node = MountPoint::make(&dev, name, Point::File)?;
        binder.bind(fd, *id, &node, true, flags)?;
    }
    Ok(())
}

/// How a new file system names its mount point: by descriptor, relative to the host's
/// [`FD_DIR`] (the working directory while a root is built), or by path, in a template's
/// namespace, where `/proc/self` means nothing until the worker's own procfs is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Naming {
    Descriptor,
    Path,
}

impl MountPoint {
    /// Mounts a new file system of type `fstype` on the point.
    fn mount_new(
        &self,
        naming: Naming,
        fstype: &str,
        flags: MsFlags,
        data: Option<&str>,
        operation: &'static str,
    ) -> Result<(), MountError> {
        match naming {
            Naming::Descriptor => self.mount(
                Some(Path::new(fstype)),
                Some(fstype),
                flags,
                data,
                operation,
            ),
            Naming::Path => mount(Some(fstype), self.path.as_str(), Some(fstype), flags, data)
                .map_err(sys(operation, &self.path)),
        }
    }
}

/// An empty directory and an empty file, on a read-only, nosuid, nodev, noexec mount: a
/// bind of either copies those flags, so covering an entry with one is two syscalls.
struct EmptyNodes {
    dir: OwnedFd,
    file: OwnedFd,
}

/// Makes [`EmptyNodes`] in a tiny tmpfs mounted on the procfs's own mount point, which the
/// procfs then covers: nothing in the sandbox can reach them but through the binds, and
/// no empty file or directory appears anywhere else in its tree.
fn make_empty_nodes(point: &MountPoint, naming: Naming) -> Result<EmptyNodes, MountError> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    point.mount_new(
        naming,
        "tmpfs",
        flags,
        Some("size=4k,nr_inodes=4,mode=755"),
        "mount tmpfs",
    )?;
    let top = point.mounted()?;
    make_dir(&top, OsStr::new("dir"), 0o555).map_err(sys("mkdir", &point.path))?;
    openat(
        &top,
        "file",
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o444),
    )
    .map(drop)
    .map_err(sys("create", &point.path))?;
    let read_only = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | flags;
    match naming {
        Naming::Descriptor => point.remount(&top, read_only)?,
        Naming::Path => mount(
            None::<&str>,
            point.path.as_str(),
            None::<&str>,
            read_only,
            None::<&str>,
        )
        .map_err(sys("remount", &point.path))?,
    }
    let open = |name: &str| {
        open_nofollow_non_directory(&top, OsStr::new(name)).map_err(sys("open", &point.path))
    };
    Ok(EmptyNodes {
        dir: open("dir")?,
        file: open("file")?,
    })
}

/// Mounts a procfs of this worker's pid namespace on `point` and covers each entry of
/// `hide` that this kernel has with an empty read-only directory or file (a symlink is
/// refused: masking where it points is not what the list says).
fn mount_proc(
    binder: &Binder,
    point: &MountPoint,
    hide: &[String],
    naming: Naming,
) -> Result<(), MountError> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let empty = match hide.is_empty() {
        true => None,
        false => Some(make_empty_nodes(point, naming)?),
    };
    point.mount_new(naming, "proc", flags, None, "mount proc")?;
    let Some(empty) = empty else {
        return Ok(());
    };
    let procfs = Tree::new(point.mounted()?, Vec::new()).map_err(sys("open", &point.path))?;
    // mount(2), where the mount API is missing, names descriptors as paths: relative to
    // the working directory (the host's FD_DIR) while a root is built, else in the procfs
    // just mounted, the first in a template's namespace that shows this worker's.
    let fd_path = |fd: &OwnedFd| match naming {
        Naming::Descriptor => fd_name(fd),
        Naming::Path => Path::new(&point.path).join("self/fd").join(fd_name(fd)),
    };
    for path in hide {
        let shown = format!("{}/{path}", point.path.trim_end_matches('/'));
        let Some(entry) = procfs.parent_of(path, None)? else {
            continue;
        };
        let Some(target) = entry.open_non_directory().map_err(sys("open", &shown))? else {
            continue;
        };
        let source = match identify(&target).map_err(sys("stat", &shown))?.1 {
            SFlag::S_IFDIR => &empty.dir,
            SFlag::S_IFLNK => return Err(PathError::LinkAsMountPoint(shown).into()),
            _ => &empty.file,
        };
        binder
            .cover(source, &target, fd_path)
            .map_err(sys("cover", &shown))?;
    }
    Ok(())
}

/// Makes the symlink `path` in the new root (its directory must not be reached through a
/// symlink below a writable bind either).
fn make_symlink(tree: &Tree, link_target: &OsStr, path: &str) -> Result<(), MountError> {
    let entry = tree
        .parent_of(path, Some(0o755))?
        .ok_or_else(|| sys("symlink", path)(Errno::EINVAL))?;
    symlinkat(link_target, &entry.parent, entry.name.as_os_str()).map_err(sys("symlink", path))
}

fn apply(
    binder: &Binder,
    tree: &Tree,
    devices: &[(OwnedFd, FileId)],
    op: &MountOp,
    source: Option<Source>,
) -> Result<(), MountError> {
    match op {
        MountOp::Bind {
            target, writable, ..
        } => match source {
            None | Some(Source::Missing) => Ok(()),
            Some(Source::Link(text)) => make_symlink(tree, &text, target),
            Some(Source::Node { fd, dir, id }) => {
                let point = if dir { Point::Dir(0o755) } else { Point::File };
                let point = MountPoint::make(tree, target, point)?;
                binder.bind(
                    &fd,
                    id,
                    &point,
                    *writable,
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                )
            }
        },
        MountOp::Tmpfs {
            target,
            size_bytes,
            mode,
        } => {
            let point = MountPoint::make(tree, target, Point::Dir(0o755))?;
            mount_tmpfs(
                &point,
                *size_bytes,
                *mode,
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            )
        }
        MountOp::Proc { target, hide } => {
            let point = MountPoint::make(tree, target, Point::Dir(0o555))?;
            mount_proc(binder, &point, hide, Naming::Descriptor)
        }
        MountOp::Dev { target } => build_dev(binder, tree, devices, target),
        MountOp::Symlink { link_target, path } => make_symlink(tree, OsStr::new(link_target), path),
        MountOp::Dir { path, mode } => {
            let entry = tree
                .parent_of(path, Some(*mode))?
                .ok_or_else(|| sys("mkdir", path)(Errno::EINVAL))?;
            make_dir(&entry.parent, &entry.name, *mode).map_err(sys("mkdir", path))
        }
    }
}

/// Makes every mount of this namespace private (recursively from `/`).
fn make_every_mount_private() -> Result<(), MountError> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(sys("make private", "/"))
}

/// Builds the sandbox root from `plan` and pivots into it. Needs CAP_SYS_ADMIN in the
/// worker's own user and mount namespaces. Afterwards nothing of the host filesystem is
/// reachable but what the plan bound.
pub fn build_root_filesystem(plan: &[MountOp]) -> Result<(), MountError> {
    build_root_filesystem_binding_by(plan, BindMethod::Preferred)
}

/// [`build_root_filesystem`], making binds the way `method` says (tests run both).
pub fn build_root_filesystem_binding_by(
    plan: &[MountOp],
    method: BindMethod,
) -> Result<(), MountError> {
    let binder = Binder::new(method);
    // Propagation private first: nothing we mount may leak to the host, and no host mount
    // event may appear in the sandbox later.
    make_every_mount_private()?;

    // Sources first, while the host's /tmp is still visible under the new root's place.
    let (sources, host) = open_sources(plan)?;
    let devices = open_devices(&host, plan)?;

    let new_root = open_dir(NEW_ROOT)?;
    // Every mount below names its source and target by descriptor, as paths relative to
    // FD_DIR (see `fd_name`), so that is the working directory until the pivot.
    chdir(FD_DIR).map_err(sys("chdir", FD_DIR))?;
    let root_point = MountPoint {
        entry: Entry {
            parent: open_dir("/")?.into(),
            name: OsString::from(NEW_ROOT.trim_start_matches('/')),
            tainted: Some(false),
        },
        fd: new_root,
        path: NEW_ROOT.to_string(),
    };
    mount_tmpfs(
        &root_point,
        1 << 20,
        0o755,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    )?;
    let top = root_point.mounted()?;
    let tree = duplicate(&top)
        .and_then(|root| Tree::new(root, host.writable().to_vec()))
        .map_err(sys("open", NEW_ROOT))?;
    drop(host);
    for (op, source) in plan.iter().zip(sources) {
        // proc must be mounted while the host's /proc is still visible: the kernel refuses
        // a new procfs in a user namespace otherwise (mount_too_revealing).
        apply(&binder, &tree, &devices, op, source)?;
    }
    drop(tree);
    // The assembled root itself is read-only; writable places are the plan's binds and tmpfs.
    root_point.remount(
        &top,
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    )?;
    drop((top, root_point, devices));

    // Make the new root `/`: pivot_root(".", ".") stacks the host's root on top of it, and
    // the lazy unmount detaches that (with every host mount under it) for good.
    chdir(NEW_ROOT).map_err(sys("chdir", NEW_ROOT))?;
    pivot_root(".", ".").map_err(sys("pivot_root", NEW_ROOT))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(sys("detach old root", "/"))?;
    chdir("/").map_err(sys("chdir", "/"))
}

/// Completes a root that came from the profile's template: the worker was cloned from a
/// mount namespace that holds the read-only root already (built once by the supervisor,
/// `template` module there), with a procfs of the template's own, empty pid namespace at
/// the proc target; that one is what lets the kernel allow a new procfs in this user
/// namespace. What must be each worker's own is made here: the plan's tmpfs mounts, and a
/// procfs of this worker's pid namespace over the template's. No bind, no `pivot_root`,
/// no copy of the host's mount table to detach: that was most of a worker's set-up.
pub fn finish_template_root(plan: &[MountOp]) -> Result<(), MountError> {
    let root = open_dir("/")?;
    // A template's root is a read-only tmpfs. Anything else is refused before a mount is
    // made: a worker cloned from the host's namespace by mistake would otherwise mount over
    // the host's /tmp and keep the host's root.
    let kind = nix::sys::statfs::fstatfs(&root).map_err(sys("statfs", "/"))?;
    let read_only = fstatvfs(&root)
        .map_err(sys("statvfs", "/"))?
        .flags()
        .contains(FsFlags::ST_RDONLY);
    if kind.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC || !read_only {
        return Err(MountError::NotATemplateRoot);
    }
    // The template's mounts are private, and so are their copies; this keeps it so
    // whatever the template was built from.
    make_every_mount_private()?;
    let tree = Tree::new(root, Vec::new()).map_err(sys("stat", "/"))?;
    let binder = Binder::new(BindMethod::Preferred);
    for op in plan {
        // Mounted by path, not by descriptor name: `/proc/self` means nothing until this
        // worker's procfs is there. The points were checked by the walk (a directory,
        // not a symlink), and nothing can change them in between: the tree is read-only
        // to everyone, the template's holder is gone.
        match op {
            MountOp::Tmpfs {
                target,
                size_bytes,
                mode,
            } => MountPoint::make(&tree, target, Point::Dir(0o755))?.mount_new(
                Naming::Path,
                "tmpfs",
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(&format!("size={size_bytes},mode={mode:o}")),
                "mount",
            )?,
            MountOp::Proc { target, hide } => {
                let point = MountPoint::make(&tree, target, Point::Dir(0o555))?;
                mount_proc(&binder, &point, hide, Naming::Path)?;
            }
            MountOp::Bind { .. } => return Err(MountError::NotPerWorker("bind")),
            MountOp::Dev { .. } => return Err(MountError::NotPerWorker("dev")),
            MountOp::Symlink { .. } => return Err(MountError::NotPerWorker("symlink")),
            MountOp::Dir { .. } => return Err(MountError::NotPerWorker("dir")),
        }
    }
    drop(tree);
    chdir("/").map_err(sys("chdir", "/"))
}
