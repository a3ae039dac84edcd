//! The sealed worker image: the worker program in a sealed memfd.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::SpawnError;
use crate::sys;

/// The worker program, copied once into a sealed memfd: nothing a sandbox does can change
/// what the next worker executes (runc CVE-2019-5736 class), and no per-spawn copy is made.
#[derive(Debug)]
pub struct WorkerImage {
    fd: OwnedFd,
}

impl WorkerImage {
    /// Copies `binary` (normally /proc/self/exe) into a sealed memfd.
    pub fn seal_from(binary: &Path) -> Result<Self, SpawnError> {
        let fail = |source| SpawnError::Image {
            path: binary.display().to_string(),
            source,
        };
        let fd = sys::create_executable_memfd(c"airlock-worker").map_err(fail)?;
        let mut source = File::open(binary).map_err(fail)?;
        let mut target = File::from(fd);
        io::copy(&mut source, &mut target).map_err(fail)?;
        let fd = OwnedFd::from(target);
        sys::seal_memfd(&fd).map_err(fail)?;
        Ok(Self { fd })
    }

    /// A worker program given as bytes (a dedicated worker binary, such as the one the
    /// `airlock` CLI embeds), sealed.
    pub fn seal_bytes(image: &[u8]) -> Result<Self, SpawnError> {
        let fail = |source| SpawnError::Image {
            path: format!("{} embedded bytes", image.len()),
            source,
        };
        let fd = sys::create_executable_memfd(c"airlock-worker").map_err(fail)?;
        let mut target = File::from(fd);
        // An image embedded in our own executable is copied file to file inside the kernel:
        // writing it from memory would first fault all of it in page by page, the largest
        // single cost of a one-shot `airlock exec`.
        if copy_from_own_executable(image, &mut target).is_err() {
            target.set_len(0).map_err(fail)?;
            target.write_all(image).map_err(fail)?;
        }
        // Read once, if at all: it need not stay resident (1.2 MiB beside a supervisor's
        // ~10 MiB). Even untouched, the kernel maps pages of it around faults on the
        // read-only data next to it.
        sys::page_out(image);
        let fd = OwnedFd::from(target);
        sys::seal_memfd(&fd).map_err(fail)?;
        Ok(Self { fd })
    }

    /// The current process's own binary, sealed.
    pub fn seal_current_executable() -> Result<Self, SpawnError> {
        Self::seal_from(Path::new("/proc/self/exe"))
    }

    /// The seals on the image.
    #[cfg(test)]
    pub fn seals(&self) -> io::Result<i32> {
        sys::memfd_seals(&self.fd)
    }

    pub(super) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Copies `image`, which must lie in a file mapping of this process's own executable, from
/// that file into `target` with `copy_file_range`/`sendfile` (std's `io::copy` uses them),
/// without touching its pages. Fails, leaving `target` to be rewritten, when the bytes are
/// not such a mapping (a library caller's heap copy, say) or the copy comes up short.
fn copy_from_own_executable(image: &[u8], target: &mut File) -> io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::MetadataExt;
    let not_mapped = || io::Error::new(io::ErrorKind::NotFound, "not in the executable's mapping");
    let start = image.as_ptr() as u64;
    let end = start + image.len() as u64;
    let mut exe = File::open("/proc/self/exe")?;
    let inode = exe.metadata()?.ino();
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let offset = maps
        .lines()
        .find_map(|line| executable_offset(line, start, end, inode))
        .ok_or_else(not_mapped)?;
    exe.seek(SeekFrom::Start(offset))?;
    let copied = io::copy(&mut exe.take(image.len() as u64), target)?;
    if copied != image.len() as u64 {
        return Err(not_mapped());
    }
    Ok(())
}

/// For one /proc/self/maps line (`start-end perms offset dev inode path`): the file offset
/// of `[start, end)` if the line maps all of it from the file with inode `inode`.
fn executable_offset(line: &str, start: u64, end: u64, inode: u64) -> Option<u64> {
    let mut fields = line.split_whitespace();
    let (from, to) = fields.next()?.split_once('-')?;
    let from = u64::from_str_radix(from, 16).ok()?;
    let to = u64::from_str_radix(to, 16).ok()?;
    let file_offset = u64::from_str_radix(fields.nth(1)?, 16).ok()?;
    let line_inode: u64 = fields.nth(1)?.parse().ok()?;
    (line_inode == inode && from <= start && end <= to).then(|| file_offset + (start - from))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::io::{Read, Seek, SeekFrom};

    /// Lives in the test binary's read-only data, like the CLI's embedded worker.
    static EMBEDDED: &[u8] = include_bytes!("image.rs");

    #[test]
    fn a_sealed_image_cannot_be_written_grown_or_shrunk() {
        let image = WorkerImage::seal_bytes(b"#!/bin/false\n").unwrap();
        let seals = image.seals().unwrap();
        for seal in [
            libc::F_SEAL_WRITE,
            libc::F_SEAL_GROW,
            libc::F_SEAL_SHRINK,
            libc::F_SEAL_SEAL,
        ] {
            assert_ne!(seals & seal, 0, "seal {seal:#x} missing from {seals:#x}");
        }
    }

    #[test]
    fn an_image_in_the_executable_is_copied_from_the_file_byte_for_byte() {
        let mut target = File::from(sys::create_executable_memfd(c"test").unwrap());
        copy_from_own_executable(EMBEDDED, &mut target).unwrap();
        target.seek(SeekFrom::Start(0)).unwrap();
        let mut copied = Vec::new();
        target.read_to_end(&mut copied).unwrap();
        assert_eq!(copied, EMBEDDED);
    }

    #[test]
    fn bytes_outside_the_executable_are_refused_for_a_plain_write() {
        let heap = EMBEDDED.to_vec();
        let mut target = File::from(sys::create_executable_memfd(c"test").unwrap());
        assert!(copy_from_own_executable(&heap, &mut target).is_err());
    }

    #[test]
    fn a_maps_line_gives_the_offset_only_for_the_right_inode_and_range() {
        let line = "5000-9000 r--p 00002000 fe:00 42    /usr/bin/airlock";
        assert_eq!(executable_offset(line, 0x6000, 0x7000, 42), Some(0x3000));
        assert_eq!(executable_offset(line, 0x6000, 0x7000, 43), None);
        assert_eq!(executable_offset(line, 0x8000, 0x9001, 42), None);
        assert_eq!(executable_offset("garbage", 0, 1, 42), None);
    }
}
