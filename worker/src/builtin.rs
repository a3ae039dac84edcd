//! Built-in tools, run in the confined, single-use worker itself (`bash` in a child that
//! execs the shell): the same namespaces, mounts, Landlock domain, seccomp filter and limits
//! as any command. Each writes its result to stdout (text for `read_file`, JSON otherwise)
//! and a [`BuiltinError`] to stderr; the worker captures both like a child's.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;

use serde_json::{Value, json};

/// Shells tried for `bash`, in order.
const SHELLS: [&str; 2] = ["/bin/bash", "/bin/sh"];

/// What the child should do for a built-in.
#[derive(Debug)]
pub enum BuiltinPlan {
    /// Exec this argv (the `bash` built-in).
    Exec(Vec<String>),
    /// Run in-process and exit with the code; output already written.
    Done(i32),
}

/// What a path names when it is not a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A directory.
    Directory,
    /// A named pipe.
    Fifo,
    /// A unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
}

impl FileKind {
    /// The kind of `file_type`, `None` for a regular file (or a symlink, never seen here:
    /// opens follow them).
    fn of(file_type: fs::FileType) -> Option<Self> {
        if file_type.is_dir() {
            Some(Self::Directory)
        } else if file_type.is_fifo() {
            Some(Self::Fifo)
        } else if file_type.is_socket() {
            Some(Self::Socket)
        } else if file_type.is_char_device() {
            Some(Self::CharDevice)
        } else if file_type.is_block_device() {
            Some(Self::BlockDevice)
        } else {
            None
        }
    }
}

impl std::fmt::Display for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Directory => "a directory",
            Self::Fifo => "a FIFO",
            Self::Socket => "a socket",
            Self::CharDevice => "a character device",
            Self::BlockDevice => "a block device",
        })
    }
}

/// Why a built-in failed. Its message is the call's stderr; the call ends `tool_failed`.
#[derive(Debug, thiserror::Error)]
pub enum BuiltinError {
    /// The arguments are not JSON (the supervisor validated them, so only a bug gets here).
    #[error("arguments are not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// A required string field is missing.
    #[error("missing string field {0:?}")]
    MissingField(&'static str),
    /// The path names something other than a regular file.
    #[error("{path} is {kind}, not a regular file: built-ins read and write regular files only")]
    NotRegularFile {
        /// The path as given.
        path: String,
        /// What it is.
        kind: FileKind,
    },
    /// A file operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was attempted.
        action: &'static str,
        /// The path as given.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// `edit`: the old text is not in the file.
    #[error("old_text not found in {0}")]
    OldTextNotFound(String),
    /// `edit`: the old text is in the file more than once.
    #[error("old_text occurs {count} times in {path}; it must occur exactly once")]
    OldTextAmbiguous {
        /// The path as given.
        path: String,
        /// How often it occurs.
        count: usize,
    },
    /// No built-in has this name.
    #[error("unknown builtin {0:?}")]
    Unknown(String),
    /// The result could not be written out.
    #[error("cannot write the result: {0}")]
    Output(#[source] io::Error),
}

fn field<'a>(input: &'a Value, name: &'static str) -> Result<&'a str, BuiltinError> {
    input
        .get(name)
        .and_then(Value::as_str)
        .ok_or(BuiltinError::MissingField(name))
}

fn io_error(action: &'static str, path: &str) -> impl FnOnce(io::Error) -> BuiltinError {
    let path = path.to_string();
    move |source| BuiltinError::Io {
        action,
        path,
        source,
    }
}

/// Opens `path` with `options` and makes sure it is a regular file.
///
/// A FIFO an earlier call left in a writable directory would block a plain open until a
/// writer (or reader) came, which no one would: the call hung until its deadline. So the
/// open is O_NONBLOCK, which returns at once for a FIFO (or fails with ENXIO, opened for
/// writing with no reader) and changes nothing for a regular file, and the type is then
/// checked on the descriptor itself, so no rename in between can swap what was checked.
/// Devices are refused too (the sandbox's `/dev/zero` would fill the output with zeros,
/// `/dev/null` swallow a write). Every open is also O_NOCTTY: built-ins run in the worker,
/// which leads its session, and a session leader opening a terminal would make it the
/// controlling terminal of that session, and so of every tool after.
fn open_regular(
    path: &str,
    options: &mut fs::OpenOptions,
    action: &'static str,
) -> Result<fs::File, BuiltinError> {
    use std::os::unix::fs::OpenOptionsExt;
    let not_regular = |kind| BuiltinError::NotRegularFile {
        path: path.to_string(),
        kind,
    };
    let file = match options
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        // ENXIO: a FIFO without a reader, or a socket; EISDIR: a directory opened to write.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENXIO | libc::EISDIR)) => {
            return Err(
                match fs::metadata(path)
                    .ok()
                    .and_then(|m| FileKind::of(m.file_type()))
                {
                    Some(kind) => not_regular(kind),
                    None => io_error(action, path)(e),
                },
            );
        }
        Err(e) => return Err(io_error(action, path)(e)),
    };
    let file_type = file
        .metadata()
        .map_err(io_error("inspect", path))?
        .file_type();
    match FileKind::of(file_type) {
        Some(kind) => Err(not_regular(kind)),
        None => Ok(file),
    }
}

fn read_file(input: &Value, out: &mut dyn Write) -> Result<(), BuiltinError> {
    let path = field(input, "path")?;
    let offset = input.get("offset").and_then(Value::as_u64).unwrap_or(0);
    let max = input
        .get("max_bytes")
        .and_then(Value::as_u64)
        .unwrap_or(1 << 20);
    let mut file = open_regular(path, fs::OpenOptions::new().read(true), "open")?;
    file.seek(SeekFrom::Start(offset))
        .map_err(io_error("seek", path))?;
    let mut buffer = Vec::new();
    file.take(max)
        .read_to_end(&mut buffer)
        .map_err(io_error("read", path))?;
    out.write_all(&buffer).map_err(BuiltinError::Output)
}

fn write_file(input: &Value, out: &mut dyn Write) -> Result<(), BuiltinError> {
    let path = field(input, "path")?;
    let content = field(input, "content")?;
    let append = input
        .get("append")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    // O_TRUNC empties only a regular file (the kernel ignores it for anything else), and
    // anything else is refused before a byte is written.
    let mut file = open_regular(
        path,
        fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append),
        "open for writing",
    )?;
    file.write_all(content.as_bytes())
        .map_err(io_error("write", path))?;
    writeln!(
        out,
        "{}",
        json!({"path": path, "bytes_written": content.len()})
    )
    .map_err(BuiltinError::Output)
}

/// Standard base64 (RFC 4648, padded) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut text = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let byte = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let group = byte(0) << 16 | byte(1) << 8 | byte(2);
        for i in 0..4 {
            if i <= chunk.len() {
                let sextet = (group >> (18 - 6 * i)) & 63;
                text.push(char::from(ALPHABET[sextet as usize]));
            } else {
                text.push('=');
            }
        }
    }
    text
}

/// One `list_dir` entry's name: `name` when it is UTF-8, else `name_base64`, the exact
/// bytes (a lossy string would name a file that does not exist, or two files alike).
fn entry_name(name: &std::ffi::OsStr) -> (&'static str, Value) {
    match name.to_str() {
        Some(text) => ("name", Value::from(text)),
        None => ("name_base64", Value::from(base64(name.as_bytes()))),
    }
}

fn list_dir(input: &Value, out: &mut dyn Write) -> Result<(), BuiltinError> {
    let path = field(input, "path")?;
    let mut entries = Vec::new();
    for entry in fs::read_dir(path).map_err(io_error("list", path))? {
        let entry = entry.map_err(io_error("list", path))?;
        let meta = entry.metadata().ok();
        let kind = match entry.file_type() {
            Ok(t) if t.is_dir() => "dir",
            Ok(t) if t.is_symlink() => "symlink",
            Ok(t) if t.is_file() => "file",
            _ => "other",
        };
        let name = entry.file_name();
        let (key, shown) = entry_name(&name);
        let mut fields = serde_json::Map::new();
        fields.insert(key.into(), shown);
        fields.insert("type".into(), Value::from(kind));
        fields.insert("size".into(), json!(meta.map(|m| m.len())));
        entries.push((name, Value::Object(fields)));
    }
    // By the names' bytes, whichever way each is shown.
    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let listing = Value::Array(entries.into_iter().map(|(_, entry)| entry).collect());
    writeln!(out, "{listing}").map_err(BuiltinError::Output)
}

fn edit(input: &Value, out: &mut dyn Write) -> Result<(), BuiltinError> {
    let path = field(input, "path")?;
    let old = field(input, "old_text")?;
    let new = field(input, "new_text")?;
    // One descriptor for the read and the write: the path is not looked up twice, so what
    // was read (and checked to be a regular file) is what gets written.
    let mut file = open_regular(
        path,
        fs::OpenOptions::new().read(true).write(true),
        "open for editing",
    )?;
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(io_error("read", path))?;
    match text.matches(old).count() {
        0 => return Err(BuiltinError::OldTextNotFound(path.to_string())),
        1 => {}
        count => {
            return Err(BuiltinError::OldTextAmbiguous {
                path: path.to_string(),
                count,
            });
        }
    }
    let updated = text.replacen(old, new, 1);
    file.set_len(0)
        .and_then(|()| file.seek(SeekFrom::Start(0)))
        .and_then(|_| file.write_all(updated.as_bytes()))
        .map_err(io_error("write", path))?;
    writeln!(out, "{}", json!({"path": path, "replaced": 1})).map_err(BuiltinError::Output)
}

/// Whether built-in `name` runs without exec'ing a program (every one but `bash`).
pub fn runs_in_process(name: &str) -> bool {
    name != "bash"
}

/// Decides what the child does for built-in `name` with `arguments_json`. In-process
/// built-ins run here and write to stdout/stderr.
pub fn plan_builtin(name: &str, arguments_json: &str) -> BuiltinPlan {
    let mut stdout = std::io::stdout().lock();
    let mut stderr = std::io::stderr();
    plan_builtin_with(name, arguments_json, &mut stdout, &mut stderr)
}

/// [`plan_builtin`] with explicit output streams (the worker runs in-process built-ins
/// straight into its capture buffers).
pub fn plan_builtin_with(
    name: &str,
    arguments_json: &str,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> BuiltinPlan {
    let result = serde_json::from_str::<Value>(arguments_json)
        .map_err(BuiltinError::NotJson)
        .and_then(|input| match name {
            "read_file" => read_file(&input, stdout).map(|()| None),
            "write_file" => write_file(&input, stdout).map(|()| None),
            "list_dir" => list_dir(&input, stdout).map(|()| None),
            "edit" => edit(&input, stdout).map(|()| None),
            "bash" => {
                let command = field(&input, "command")?.to_string();
                let shell = SHELLS
                    .iter()
                    .find(|s| fs::metadata(s).is_ok())
                    .copied()
                    .unwrap_or("/bin/sh");
                Ok(Some(vec![shell.to_string(), "-c".to_string(), command]))
            }
            other => Err(BuiltinError::Unknown(other.to_string())),
        });
    let _ = stdout.flush();
    match result {
        Ok(Some(argv)) => BuiltinPlan::Exec(argv),
        Ok(None) => BuiltinPlan::Done(0),
        Err(error) => {
            let _ = writeln!(stderr, "{error}");
            BuiltinPlan::Done(1)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use std::os::unix::ffi::OsStrExt;
    use std::path::PathBuf;
    use std::time::Duration;

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("airlock-builtin-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Runs built-in `name` on another thread: (exit code, stdout, stderr), or a panic if it
    /// has not finished in 10 s (a hang, which is what a FIFO used to cause).
    fn run(name: &'static str, input: Value) -> (i32, String, String) {
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let code = match plan_builtin_with(name, &input.to_string(), &mut out, &mut err) {
                BuiltinPlan::Done(code) => code,
                BuiltinPlan::Exec(_) => -1,
            };
            let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
            let _ = done.send((code, text(out), text(err)));
        });
        result
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{name} hung"))
    }

    #[test]
    fn a_planted_fifo_is_refused_at_once_by_every_file_builtin() {
        let dir = scratch("fifo");
        let fifo = dir.join("pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        let path = fifo.display().to_string();
        for (name, input) in [
            ("read_file", json!({"path": path})),
            ("write_file", json!({"path": path, "content": "x"})),
            (
                "write_file",
                json!({"path": path, "content": "x", "append": true}),
            ),
            (
                "edit",
                json!({"path": path, "old_text": "a", "new_text": "b"}),
            ),
        ] {
            let (code, _, stderr) = run(name, input);
            assert_eq!(code, 1, "{name}: {stderr}");
            assert_eq!(
                stderr,
                format!(
                    "{path} is a FIFO, not a regular file: built-ins read and write regular files only\n"
                ),
                "{name}"
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn device_nodes_and_directories_are_refused() {
        for (name, input, kind) in [
            (
                "read_file",
                json!({"path": "/dev/zero"}),
                "a character device",
            ),
            (
                "write_file",
                json!({"path": "/dev/null", "content": "x"}),
                "a character device",
            ),
            (
                "edit",
                json!({"path": "/dev/null", "old_text": "a", "new_text": "b"}),
                "a character device",
            ),
            ("read_file", json!({"path": "/"}), "a directory"),
            (
                "write_file",
                json!({"path": "/", "content": "x"}),
                "a directory",
            ),
        ] {
            let (code, stdout, stderr) = run(name, input);
            assert_eq!((code, stdout.len()), (1, 0), "{name}: {stderr}");
            assert!(
                stderr.contains(&format!("is {kind}, not a regular file")),
                "{name}: {stderr}"
            );
        }
    }

    #[test]
    fn regular_files_still_read_write_and_edit() {
        let dir = scratch("regular");
        let path = dir.join("f").display().to_string();
        assert_eq!(
            run("write_file", json!({"path": path, "content": "one two"})).0,
            0
        );
        assert_eq!(
            run(
                "write_file",
                json!({"path": path, "content": "!", "append": true})
            )
            .0,
            0
        );
        assert_eq!(
            run(
                "edit",
                json!({"path": path, "old_text": "two", "new_text": "2"})
            )
            .0,
            0
        );
        assert_eq!(run("read_file", json!({"path": path})).1, "one 2!");
        // /proc files are regular files: they still read.
        assert!(
            !run("read_file", json!({"path": "/proc/self/stat"}))
                .1
                .is_empty()
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn list_dir_reports_a_name_that_is_not_utf8_exactly() {
        let dir = scratch("names");
        let raw = std::ffi::OsStr::from_bytes(b"bad\xff\xfename");
        fs::write(dir.join(raw), b"").unwrap();
        fs::write(dir.join("good.txt"), b"").unwrap();
        let (code, stdout, stderr) = run("list_dir", json!({"path": dir.display().to_string()}));
        assert_eq!(code, 0, "{stderr}");
        let entries: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(
            entries,
            json!([
                {"name_base64": "YmFk//5uYW1l", "type": "file", "size": 0},
                {"name": "good.txt", "type": "file", "size": 0},
            ])
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn base64_is_the_standard_padded_alphabet() {
        for (bytes, text) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"\xff\xfe\xfd", "//79"),
        ] {
            assert_eq!(base64(bytes), text);
        }
    }
}
