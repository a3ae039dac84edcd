//! Writing `learn --output`: the file is written only after the learned command has run,
//! and that command may write where the output goes (`--write "$PWD" --output
//! learned.txt`). Whatever it left at that name is never written through: the result goes
//! to a new file beside it, which is renamed over the name only when the name is absent or
//! a regular file that is not the policy file — checked when the result is written, not
//! only before the command ran.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, open, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fchmod, fstat, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// Why the output was not written; the file at its name is as it was.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OutputError {
    /// The output names a directory, or nothing (`/`, `..`).
    #[error("--output {0} names no file")]
    NoFileName(String),
    /// The output is the policy file, by name or by inode.
    #[error("--output {0} is the policy file itself; learn never writes the policy it was given")]
    PolicyFile(String),
    /// Something other than a regular file is at the output's name now.
    #[error("--output {path} is {what}; learn writes only a new file or over a regular one")]
    NotRegular {
        /// The output.
        path: String,
        /// What is there.
        what: &'static str,
    },
    /// The output's directory is another one than it was before the command ran.
    #[error("--output {0}: its directory was replaced while learning; nothing written")]
    DirectoryMoved(String),
    /// A system call failed.
    #[error("cannot write {path}")]
    Io {
        /// The output.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// The output's directory and name, as found before the command runs.
#[derive(Debug)]
pub(crate) struct Output {
    path: PathBuf,
    dir: PathBuf,
    name: PathBuf,
    /// The directory's device and inode before the run: the command may replace the
    /// directory (a symlink to `/etc`, say) as well as the file in it.
    dir_id: (u64, u64),
}

impl Output {
    /// The output at `path`, refused at once when it is the policy file `policy` or has no
    /// directory to go in.
    pub(crate) fn prepare(path: &Path, policy: Option<&Path>) -> Result<Self, OutputError> {
        let shown = path.display().to_string();
        let name = match path.file_name() {
            Some(name) => PathBuf::from(name),
            None => return Err(OutputError::NoFileName(shown)),
        };
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let io = |source| OutputError::Io {
            path: shown.clone(),
            source,
        };
        let meta = std::fs::metadata(&dir).map_err(io)?;
        if let Some(policy) = policy {
            let same_inode = match (std::fs::metadata(path), std::fs::metadata(policy)) {
                (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
                _ => false,
            };
            if same_inode || path == policy {
                return Err(OutputError::PolicyFile(shown));
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            dir,
            name,
            dir_id: (meta.dev(), meta.ino()),
        })
    }

    /// Writes `text` as a new file renamed over the output's name, unless what is at that
    /// name now is a symlink, not a regular file, or the policy file `policy`.
    pub(crate) fn write(&self, text: &str, policy: Option<&Path>) -> Result<(), OutputError> {
        let shown = self.path.display().to_string();
        let io = |source: std::io::Error| OutputError::Io {
            path: shown.clone(),
            source,
        };
        let errno = |e: Errno| io(e.into());
        let dir = open(
            &self.dir,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        let found = fstat(dir.as_fd()).map_err(errno)?;
        if (found.st_dev, found.st_ino) != self.dir_id {
            return Err(OutputError::DirectoryMoved(shown));
        }
        let kept_mode = self.check_target(&dir, policy)?;
        let (temp, file) = create_temp(&dir, &self.name).map_err(errno)?;
        let written = (|| {
            // A file written over keeps its permissions, as it did when it was written in
            // place: an output made private stays private.
            if let Some(mode) = kept_mode {
                fchmod(file.as_fd(), Mode::from_bits_truncate(mode)).map_err(errno)?;
            }
            let mut file = std::fs::File::from(file);
            file.write_all(text.as_bytes()).map_err(io)?;
            file.sync_all().map_err(io)?;
            // Checked again just before the rename: the learned command is gone by now,
            // but whoever else shares the directory is not.
            self.check_target(&dir, policy)?;
            renameat(dir.as_fd(), &temp, dir.as_fd(), &self.name).map_err(errno)
        })();
        if written.is_err() {
            let _ = unlinkat(dir.as_fd(), &temp, UnlinkatFlags::NoRemoveDir);
            return written;
        }
        // The rename is durable once the directory is; a failure here leaves the file
        // written, so it is not worth an error.
        let _ = nix::unistd::fsync(dir.as_fd());
        Ok(())
    }

    /// Refuses what is at the output's name in `dir` unless it is absent or a regular file
    /// other than the policy file; the permission bits of the file there, if any.
    fn check_target(
        &self,
        dir: &OwnedFd,
        policy: Option<&Path>,
    ) -> Result<Option<u32>, OutputError> {
        let shown = || self.path.display().to_string();
        let found = match fstatat(dir.as_fd(), &self.name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(found) => found,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => {
                return Err(OutputError::Io {
                    path: shown(),
                    source: e.into(),
                });
            }
        };
        let kind = SFlag::from_bits_truncate(found.st_mode) & SFlag::S_IFMT;
        if kind != SFlag::S_IFREG {
            let what = match kind {
                SFlag::S_IFLNK => "a symbolic link",
                SFlag::S_IFDIR => "a directory",
                _ => "not a regular file",
            };
            return Err(OutputError::NotRegular {
                path: shown(),
                what,
            });
        }
        if let Some(meta) = policy.and_then(|p| std::fs::metadata(p).ok())
            && (meta.dev(), meta.ino()) == (found.st_dev, found.st_ino)
        {
            return Err(OutputError::PolicyFile(shown()));
        }
        Ok(Some(found.st_mode & 0o777))
    }
}

/// A new file `.NAME.learn-N` in `dir`, made by this call (`O_EXCL`, never through a
/// symlink), with the mode a new file written by the shell gets (0666 less the umask).
fn create_temp(dir: &OwnedFd, name: &Path) -> Result<(PathBuf, OwnedFd), Errno> {
    let mut temp = name.as_os_str().to_owned();
    temp.push(format!(".learn-{}", std::process::id()));
    let base = PathBuf::from(format!(".{}", temp.to_string_lossy()));
    let mut attempt = 0u32;
    loop {
        let candidate = if attempt == 0 {
            base.clone()
        } else {
            PathBuf::from(format!("{}-{attempt}", base.display()))
        };
        match openat(
            dir.as_fd(),
            &candidate,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::from_bits_truncate(0o666),
        ) {
            Ok(fd) => return Ok((candidate, fd)),
            Err(Errno::EEXIST) if attempt < 100 => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}
