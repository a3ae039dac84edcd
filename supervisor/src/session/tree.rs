//! Reading and writing inside a directory a tool controls, without ever leaving it: every
//! path is opened with `openat2` beneath a descriptor of the tree's root, refusing
//! symlinks (and magic links, and other mounts) on the way, and every file is opened
//! non-blocking and checked to be a regular file before a byte moves.
//!
//! The same walk serves a session's base on the host (its owner may change it while we
//! copy) and its workspace (a tool may have planted anything there).

use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, mkdirat};
use nix::unistd::{Gid, Uid, fchown};

/// Longest relative path a client may name, bytes.
pub const MAX_PATH_BYTES: usize = 1024;
/// Deepest relative path a client may name, components.
const MAX_COMPONENTS: usize = 64;
/// Deepest directory a walk descends into.
pub const MAX_DEPTH: usize = 128;
/// Most bytes of paths one walk collects. Without it a tool could make each of a walk's
/// entries a path of ~33 KB (128 nested directories of 255-byte names) and one walk hold
/// gigabytes; with [`MAX_PATH_BYTES`] per path it still could at a large `max_inodes`. Real
/// paths average well under 100 bytes: 16 MiB holds over 160,000 of them, more than twice
/// the default `max_inodes`.
pub const MAX_WALK_PATH_BYTES: usize = 16 << 20;

/// What may be crossed on the way to a name beneath a root: nothing but plain directories
/// of the same mount.
fn resolve() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
        | ResolveFlag::RESOLVE_NO_XDEV
}

/// Why a client's relative path is refused.
pub fn check_relative(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("the path is empty".into());
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(format!("the path is over {MAX_PATH_BYTES} bytes"));
    }
    if path.starts_with('/') {
        return Err("the path must be relative to the workspace".into());
    }
    if path.contains('\0') {
        return Err("the path holds a NUL byte".into());
    }
    let components: Vec<&str> = path.split('/').collect();
    if components.len() > MAX_COMPONENTS {
        return Err(format!("the path has over {MAX_COMPONENTS} components"));
    }
    if components
        .iter()
        .any(|c| c.is_empty() || *c == "." || *c == "..")
    {
        return Err("the path must be normalised: no empty, `.` or `..` components".into());
    }
    if components.iter().any(|c| c.len() > 255) {
        return Err("a path component is over 255 bytes".into());
    }
    Ok(())
}

/// Opens the root of a tree: a directory, not a symlink to one.
pub fn open_root(path: &Path) -> io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC);
    openat2(nix::fcntl::AT_FDCWD, path, how).map_err(io::Error::from)
}

/// Opens `rel` beneath `root` with `flags`, crossing no symlink and no other mount. `rel`
/// is text or, for a name read from a directory, bytes (`OsStr`).
pub fn open_beneath<P: ?Sized + nix::NixPath>(
    root: BorrowedFd<'_>,
    rel: &P,
    flags: OFlag,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .mode(mode)
        .resolve(resolve());
    openat2(root, rel, how)
}

/// What a walk found at one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symlink (never followed).
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

impl Kind {
    fn of(stat: &FileStat) -> Self {
        match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFREG => Kind::File,
            SFlag::S_IFDIR => Kind::Dir,
            SFlag::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        }
    }
}

/// One entry of a walked tree.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Relative to the root, `/`-separated.
    pub path: String,
    /// What it is.
    pub kind: Kind,
    /// Bytes (of a file; a symlink's target length).
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Its device and inode numbers: the same pair in the workspace and the base is the
    /// same file (an overlay shows a file it has not copied up as the base's own).
    pub identity: (u64, u64),
}

/// Every entry beneath `root` (not the root itself), parents before children, in name
/// order. At most `limit` entries, none with a path over [`MAX_PATH_BYTES`] and
/// [`MAX_WALK_PATH_BYTES`] of paths in all: a tree past any of them is
/// [`ReadError::TreeTooLarge`], never a shortened list.
pub fn walk(root: BorrowedFd<'_>, limit: u64) -> Result<Vec<Entry>, ReadError> {
    walk_within(root, limit, MAX_WALK_PATH_BYTES)
}

/// [`walk`] with a budget of `path_bytes` bytes of paths.
fn walk_within(
    root: BorrowedFd<'_>,
    limit: u64,
    path_bytes: usize,
) -> Result<Vec<Entry>, ReadError> {
    let mut walk = Walk {
        limit,
        path_bytes,
        out: Vec::new(),
    };
    walk.dir(root, "", 0)?;
    Ok(walk.out)
}

/// A walk's bounds and what it has collected.
struct Walk {
    limit: u64,
    /// Bytes of paths it may still collect.
    path_bytes: usize,
    out: Vec<Entry>,
}

impl Walk {
    fn dir(&mut self, dir: BorrowedFd<'_>, prefix: &str, depth: usize) -> Result<(), ReadError> {
        if depth > MAX_DEPTH {
            return Err(ReadError::TreeTooLarge(format!(
                "it is deeper than {MAX_DEPTH} directories"
            )));
        }
        let listing = open_beneath(
            dir,
            ".",
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .map_err(io::Error::from)?;
        let mut names: Vec<Vec<u8>> = Vec::new();
        let mut listing = nix::dir::Dir::from_fd(listing).map_err(io::Error::from)?;
        for entry in listing.iter() {
            let entry = entry.map_err(io::Error::from)?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(name.to_vec());
            }
        }
        names.sort();
        for name in names {
            let Ok(text) = String::from_utf8(name) else {
                return Err(ReadError::Io(io::Error::other(format!(
                    "{prefix}: a name is not UTF-8 and cannot be reported"
                ))));
            };
            // Bounded before the path is made: neither one path nor all of them together
            // may grow past what the walk allows.
            let len = if prefix.is_empty() {
                text.len()
            } else {
                prefix.len() + 1 + text.len()
            };
            if len > MAX_PATH_BYTES {
                return Err(ReadError::TreeTooLarge(format!(
                    "it holds a path over {MAX_PATH_BYTES} bytes"
                )));
            }
            let Some(left) = self.path_bytes.checked_sub(len) else {
                return Err(ReadError::TreeTooLarge(format!(
                    "its paths are over {MAX_WALK_PATH_BYTES} bytes together"
                )));
            };
            self.path_bytes = left;
            let stat = fstatat(dir, text.as_str(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(io::Error::from)?;
            let kind = Kind::of(&stat);
            let path = if prefix.is_empty() {
                text.clone()
            } else {
                format!("{prefix}/{text}")
            };
            if u64::try_from(self.out.len()).unwrap_or(u64::MAX) >= self.limit {
                return Err(ReadError::TreeTooLarge(format!(
                    "it holds more than {} entries",
                    self.limit
                )));
            }
            self.out.push(Entry {
                path: path.clone(),
                kind,
                size: u64::try_from(stat.st_size).unwrap_or(0),
                mode: stat.st_mode & 0o7777,
                identity: (stat.st_dev, stat.st_ino),
            });
            if kind == Kind::Dir {
                let sub = open_beneath(
                    dir,
                    text.as_str(),
                    OFlag::O_DIRECTORY | OFlag::O_RDONLY,
                    Mode::empty(),
                )
                .map_err(io::Error::from)?;
                self.dir(sub.as_fd(), &path, depth + 1)?;
            }
        }
        Ok(())
    }
}

/// Why a file or a tree could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Not there, or a symlink, FIFO, device or directory on the way or at the end.
    #[error("{0}")]
    Refused(String),
    /// Larger than the caller takes.
    #[error("the file is over {0} bytes")]
    TooLarge(u64),
    /// A walked tree past one of the walk's bounds (what is past it is said).
    #[error("the tree is too large to walk: {0}")]
    TreeTooLarge(String),
    /// Reading failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Opens the regular file `rel` beneath `root` for reading, without ever opening
/// anything else: the name is first opened `O_PATH` (which opens no FIFO or device),
/// checked to be a regular file, and only that inode is then opened for reading, through
/// its descriptor. Reading goes through the returned file: replacing the name meanwhile
/// changes nothing read.
pub fn open_file(root: BorrowedFd<'_>, rel: &str) -> Result<std::fs::File, ReadError> {
    let handle =
        open_beneath(root, rel, OFlag::O_PATH, Mode::empty()).map_err(|e| refusal(rel, e))?;
    let stat = fstat(&handle).map_err(io::Error::from)?;
    if Kind::of(&stat) != Kind::File {
        return Err(ReadError::Refused(format!("{rel:?} is not a regular file")));
    }
    let by_fd = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&handle));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(by_fd)?;
    // The same inode, still a regular file (a descriptor's magic link cannot be redirected).
    let opened = fstat(&file).map_err(io::Error::from)?;
    if (opened.st_dev, opened.st_ino) != (stat.st_dev, stat.st_ino) {
        return Err(ReadError::Refused(format!("{rel:?} changed while opened")));
    }
    Ok(file)
}

/// The bytes of the regular file `rel` beneath `root`, at most `max` of them (see
/// [`open_file`]).
pub fn read_file(root: BorrowedFd<'_>, rel: &str, max: u64) -> Result<Vec<u8>, ReadError> {
    let file = open_file(root, rel)?;
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > max {
        return Err(ReadError::TooLarge(max));
    }
    Ok(bytes)
}

/// Whether two readers yield the same bytes, compared a block at a time.
pub fn same_content(mut a: impl Read, mut b: impl Read) -> io::Result<bool> {
    let (mut x, mut y) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    loop {
        let n = read_full(&mut a, &mut x)?;
        let m = read_full(&mut b, &mut y)?;
        if n != m || x[..n] != y[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

/// Fills `buf` as far as the reader goes; the count read (short only at its end).
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn refusal(rel: &str, errno: Errno) -> ReadError {
    match errno {
        Errno::ENOENT => ReadError::Refused(format!("{rel:?} does not exist")),
        Errno::ELOOP | Errno::EXDEV => ReadError::Refused(format!(
            "{rel:?} is or passes through a symlink or another mount"
        )),
        Errno::ENOTDIR => ReadError::Refused(format!("a parent of {rel:?} is not a directory")),
        Errno::ENXIO | Errno::EACCES | Errno::EPERM => {
            ReadError::Refused(format!("{rel:?} cannot be opened as a regular file"))
        }
        other => ReadError::Io(io::Error::from(other)),
    }
}

/// Writes a regular file `rel` beneath `root` (its parents made as needed), owned by
/// `owner` when given, with the permission bits `mode` (never setuid, setgid or sticky).
/// Refuses to write through a symlink or into anything but a regular file.
pub fn write_file(
    root: BorrowedFd<'_>,
    rel: &str,
    mut content: impl Read,
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), WriteError> {
    let (parent, name) = match rel.rsplit_once('/') {
        Some((parent, name)) => (Some(parent), name),
        None => (None, rel),
    };
    let dir = match parent {
        Some(parent) => make_dirs(root, parent, owner)?,
        None => open_beneath(
            root,
            ".",
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .map_err(WriteError::from_errno)?,
    };
    let fd = open_beneath(
        dir.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(WriteError::from_errno)?;
    let stat = fstat(&fd).map_err(WriteError::from_errno)?;
    if Kind::of(&stat) != Kind::File {
        return Err(WriteError::Refused(format!(
            "{rel:?} exists and is not a regular file"
        )));
    }
    chown(&fd, owner)?;
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode & 0o777))
        .map_err(WriteError::from_errno)?;
    nix::unistd::ftruncate(&fd, 0).map_err(WriteError::from_errno)?;
    let mut file = std::fs::File::from(fd);
    io::copy(&mut content, &mut file).map_err(WriteError::from_io)?;
    file.sync_data().map_err(WriteError::from_io)?;
    Ok(())
}

/// Why a file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// No space or inodes left.
    #[error("no space left in the workspace")]
    Full,
    /// A symlink, FIFO, device or non-directory on the way or at the end.
    #[error("{0}")]
    Refused(String),
    /// Writing failed.
    #[error(transparent)]
    Io(io::Error),
}

impl WriteError {
    fn from_errno(errno: Errno) -> Self {
        match errno {
            Errno::ENOSPC | Errno::EDQUOT => WriteError::Full,
            Errno::ELOOP | Errno::EXDEV => WriteError::Refused(
                "the path is or passes through a symlink or another mount".into(),
            ),
            Errno::ENOTDIR | Errno::EISDIR | Errno::ENXIO => {
                WriteError::Refused("something on the path is not what it must be".into())
            }
            other => WriteError::Io(io::Error::from(other)),
        }
    }

    fn from_io(error: io::Error) -> Self {
        match error.raw_os_error() {
            Some(code) => Self::from_errno(Errno::from_raw(code)),
            None => WriteError::Io(error),
        }
    }
}

/// Gives `fd` to `owner` (a root supervisor writing for the sandbox's uid).
fn chown(fd: &OwnedFd, owner: Option<(u32, u32)>) -> Result<(), WriteError> {
    if let Some((uid, gid)) = owner {
        fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
            .map_err(WriteError::from_errno)?;
    }
    Ok(())
}

/// Opens (making what is missing) each directory of `rel` beneath `root`.
pub fn make_dirs(
    root: BorrowedFd<'_>,
    rel: &str,
    owner: Option<(u32, u32)>,
) -> Result<OwnedFd, WriteError> {
    let mut dir = open_beneath(
        root,
        ".",
        OFlag::O_DIRECTORY | OFlag::O_RDONLY,
        Mode::empty(),
    )
    .map_err(WriteError::from_errno)?;
    for component in rel.split('/') {
        match mkdirat(&dir, component, Mode::from_bits_truncate(0o755)) {
            Ok(()) => {
                let made = open_beneath(
                    dir.as_fd(),
                    component,
                    OFlag::O_DIRECTORY | OFlag::O_RDONLY,
                    Mode::empty(),
                )
                .map_err(WriteError::from_errno)?;
                chown(&made, owner)?;
                dir = made;
            }
            Err(Errno::EEXIST) => {
                dir = open_beneath(
                    dir.as_fd(),
                    component,
                    OFlag::O_DIRECTORY | OFlag::O_RDONLY,
                    Mode::empty(),
                )
                .map_err(WriteError::from_errno)?;
            }
            Err(e) => return Err(WriteError::from_errno(e)),
        }
    }
    Ok(dir)
}

/// Makes the symlink `rel` (its parent exists) pointing at `target`, owned by `owner`.
pub fn make_symlink(
    root: BorrowedFd<'_>,
    rel: &str,
    target: &[u8],
    owner: Option<(u32, u32)>,
) -> Result<(), WriteError> {
    let (parent, name) = match rel.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => (".", rel),
    };
    let dir = open_beneath(
        root,
        parent,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY,
        Mode::empty(),
    )
    .map_err(WriteError::from_errno)?;
    let target = std::ffi::OsStr::from_bytes(target);
    nix::unistd::symlinkat(target, &dir, name).map_err(WriteError::from_errno)?;
    if let Some((uid, gid)) = owner {
        nix::unistd::fchownat(
            &dir,
            name,
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(WriteError::from_errno)?;
    }
    Ok(())
}

/// The target of the symlink `rel` beneath `root`.
pub fn read_link(root: BorrowedFd<'_>, rel: &str) -> io::Result<Vec<u8>> {
    let (parent, name) = match rel.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => (".", rel),
    };
    let dir = open_beneath(
        root,
        parent,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY,
        Mode::empty(),
    )?;
    let target = nix::fcntl::readlinkat(&dir, name)?;
    Ok(target.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_normalised_and_bounded() {
        for good in [
            "a",
            "a/b",
            ".hidden",
            "..dots",
            "a/...",
            "x".repeat(255).as_str(),
        ] {
            assert_eq!(check_relative(good), Ok(()), "{good:?}");
        }
        let long = "a/".repeat(600) + "a";
        let deep = "a/".repeat(64) + "a";
        for bad in [
            "",
            "/a",
            "a/",
            "a//b",
            ".",
            "..",
            "./a",
            "a/./b",
            "a/..",
            "../a",
            "a\0b",
            &"x".repeat(256),
            &long,
            &deep,
        ] {
            assert!(check_relative(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reads_and_writes_stay_beneath_the_root_and_on_regular_files() {
        let dir = std::env::temp_dir().join(format!("airlock-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("root/sub")).unwrap();
        std::fs::write(dir.join("outside"), "secret").unwrap();
        std::os::unix::fs::symlink("../outside", dir.join("root/link")).unwrap();
        std::os::unix::fs::symlink("..", dir.join("root/up")).unwrap();
        let root = open_root(&dir.join("root")).unwrap();
        let root = root.as_fd();

        write_file(root, "sub/new/file", &b"data"[..], 0o4755, None).unwrap();
        assert_eq!(read_file(root, "sub/new/file", 16).unwrap(), b"data");
        let mode = std::fs::metadata(dir.join("root/sub/new/file")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o7777,
            0o755,
            "no setuid bit is ever written"
        );
        assert!(matches!(
            read_file(root, "sub/new/file", 3),
            Err(ReadError::TooLarge(3))
        ));
        for refused in ["link", "up/outside", "sub", "missing"] {
            assert!(
                matches!(read_file(root, refused, 16), Err(ReadError::Refused(_))),
                "{refused}"
            );
        }
        assert!(matches!(
            write_file(root, "link", &b"x"[..], 0o644, None),
            Err(WriteError::Refused(_))
        ));
        assert!(matches!(
            write_file(root, "up/planted", &b"x"[..], 0o644, None),
            Err(WriteError::Refused(_))
        ));
        assert!(!dir.join("planted").exists());
        assert_eq!(std::fs::read(dir.join("outside")).unwrap(), b"secret");
        let paths: Vec<(String, Kind)> = walk(root, 100)
            .unwrap()
            .into_iter()
            .map(|e| (e.path, e.kind))
            .collect();
        assert_eq!(
            paths,
            vec![
                ("link".to_string(), Kind::Symlink),
                ("sub".to_string(), Kind::Dir),
                ("sub/new".to_string(), Kind::Dir),
                ("sub/new/file".to_string(), Kind::File),
                ("up".to_string(), Kind::Symlink),
            ]
        );
        assert!(walk(root, 2).is_err(), "more entries than the limit");

        // A file replaced (by a symlink to a secret) while it is being read: what is read
        // is the file that was opened, never what the name points at later.
        let mut opened = open_file(root, "sub/new/file").unwrap();
        std::fs::remove_file(dir.join("root/sub/new/file")).unwrap();
        std::os::unix::fs::symlink("../../../outside", dir.join("root/sub/new/file")).unwrap();
        let mut bytes = Vec::new();
        opened.read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes, b"data");
        assert!(matches!(
            read_file(root, "sub/new/file", 16),
            Err(ReadError::Refused(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Makes `count` nested directories named `name` beneath `root`; the deepest.
    fn nest(root: BorrowedFd<'_>, name: &str, count: usize) -> OwnedFd {
        let mut dir = open_beneath(
            root,
            ".",
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .unwrap();
        for _ in 0..count {
            mkdirat(&dir, name, Mode::from_bits_truncate(0o755)).unwrap();
            dir = open_beneath(
                dir.as_fd(),
                name,
                OFlag::O_DIRECTORY | OFlag::O_RDONLY,
                Mode::empty(),
            )
            .unwrap();
        }
        dir
    }

    fn touch_many(dir: BorrowedFd<'_>, count: usize, name_len: usize) {
        for i in 0..count {
            let name = format!("{i:0>name_len$}");
            open_beneath(
                dir,
                name.as_str(),
                OFlag::O_WRONLY | OFlag::O_CREAT,
                Mode::from_bits_truncate(0o644),
            )
            .unwrap();
        }
    }

    #[test]
    fn a_walk_refuses_long_paths_and_bounds_the_bytes_it_collects() {
        let dir = std::env::temp_dir().join(format!("airlock-walk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("deep")).unwrap();
        std::fs::create_dir_all(dir.join("wide")).unwrap();

        // 128 nested directories of 255-byte names, many empty files at the bottom: each
        // path ~33 KB. The walk stops at the first path over the limit the file ops use.
        let deep = open_root(&dir.join("deep")).unwrap();
        let bottom = nest(deep.as_fd(), &"d".repeat(255), 128);
        touch_many(bottom.as_fd(), 500, 255);
        match walk(deep.as_fd(), u64::MAX) {
            Err(ReadError::TreeTooLarge(reason)) => {
                assert!(reason.contains("path over 1024 bytes"), "{reason}");
            }
            other => panic!("a 33 KB path was walked: {:?}", other.map(|e| e.len())),
        }

        // Paths within the limit, but more bytes of them together than the budget: an
        // error, not a shortened list; within the budget the same tree is walked whole.
        let wide = open_root(&dir.join("wide")).unwrap();
        let bottom = nest(wide.as_fd(), &"w".repeat(200), 3);
        touch_many(bottom.as_fd(), 100, 200);
        let per_file = 4 * 200 + 3;
        let collected = |entries: &[Entry]| entries.iter().map(|e| e.path.len()).sum::<usize>();
        let whole = walk_within(wide.as_fd(), u64::MAX, 103 * per_file).unwrap();
        assert_eq!(whole.len(), 103);
        assert!(collected(&whole) <= 103 * per_file);
        assert!(matches!(
            walk_within(wide.as_fd(), u64::MAX, 50 * per_file),
            Err(ReadError::TreeTooLarge(reason)) if reason.contains("bytes together")
        ));
        assert!(matches!(
            walk(wide.as_fd(), 102),
            Err(ReadError::TreeTooLarge(reason)) if reason.contains("more than 102 entries")
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
