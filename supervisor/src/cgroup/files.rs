//! Reading and writing cgroup control files, and parsing what they hold.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use super::CgroupError;

pub(super) fn read_file(path: &Path) -> Result<String, CgroupError> {
    read_whole(path).map_err(|source| CgroupError::ReadFile {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a whole procfs or cgroupfs file into a buffer of a page or more from the start:
/// such files report size 0, so `fs::read_to_string` starts at 32 bytes and doubles,
/// 8 reads for a 2 KiB mountinfo, each of which the kernel regenerates from the start.
/// (Not `File::read_to_string` either, which asks for the size first: two more syscalls.)
pub(super) fn read_whole(path: &Path) -> io::Result<String> {
    use std::io::Read;
    let mut file = fs::File::open(path)?;
    let mut bytes = vec![0u8; 8192];
    let mut len = 0;
    loop {
        if len == bytes.len() {
            bytes.resize(len * 2, 0);
        }
        match file.read(&mut bytes[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    bytes.truncate(len);
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Reads a whole (small) file with pread from offset 0, so an open descriptor can be read
/// again and again: cgroupfs regenerates the text at offset 0.
pub(super) fn read_from_start(file: &fs::File) -> io::Result<String> {
    use std::os::unix::fs::FileExt;
    let mut bytes = Vec::with_capacity(256);
    let mut buffer = [0u8; 4096];
    loop {
        match file.read_at(&mut buffer, bytes.len() as u64) {
            Ok(0) => break,
            // cgroupfs (seq_file) fills the buffer as far as the text goes, so a short read
            // is the end: one pread per counter instead of two on the call's critical path.
            Ok(n) if n < buffer.len() => {
                bytes.extend_from_slice(&buffer[..n]);
                break;
            }
            Ok(n) => bytes.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if bytes.len() > 1 << 20 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "counter file too large",
            ));
        }
    }
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

pub(super) fn read_optional_file(path: &Path) -> Result<Option<String>, CgroupError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CgroupError::ReadFile {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes `value` in one write(2) to an existing control file (cgroupfs files cannot be
/// created, so no O_CREAT: a missing file is an error, not a new plain file).
pub(super) fn write_raw(path: &Path, value: &str) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).truncate(true).open(path)?;
    file.write_all(value.as_bytes())
}

pub(super) fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    write_raw(path, value).map_err(|source| CgroupError::WriteFile {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    })
}

/// Writes a control file that older kernels or some configurations lack; returns whether
/// it existed.
pub(super) fn write_optional_file(path: &Path, value: &str) -> Result<bool, CgroupError> {
    match write_raw(path, value) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(CgroupError::WriteFile {
            path: path.to_path_buf(),
            value: value.to_string(),
            source,
        }),
    }
}

pub(super) fn parse_number(path: &Path, text: &str) -> Result<u64, CgroupError> {
    text.trim().parse().map_err(|_| CgroupError::ParseFile {
        path: path.to_path_buf(),
        reason: format!("expected a number, found {:?}", text.trim()),
    })
}

/// Reads `key value` from a flat-keyed file such as memory.events or memory.oom_control.
pub(super) fn parse_keyed(path: &Path, text: &str, key: &str) -> Result<u64, CgroupError> {
    let value = text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.next() == Some(key))
            .then(|| fields.next())
            .flatten()
    });
    match value {
        Some(value) => parse_number(path, value),
        None => Err(CgroupError::ParseFile {
            path: path.to_path_buf(),
            reason: format!("no {key:?} line"),
        }),
    }
}
