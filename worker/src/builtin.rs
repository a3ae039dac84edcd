//! Built-in tools, run in the confined, single-use worker itself (`bash` in a child that
//! execs the shell): the same namespaces, mounts, Landlock domain, seccomp filter and limits
//! as any command. Each writes its result to stdout (text for `read_file`, JSON otherwise)
//! and errors to stderr; the worker captures both like a child's.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};

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

fn field<'a>(input: &'a Value, name: &str) -> Result<&'a str, String> {
    input
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("missing string field {name:?}"))
}

/// Every file a built-in opens is opened with O_NOCTTY: built-ins run in the worker, which
/// leads its session, and a session leader opening a terminal would make it the controlling
/// terminal of that session, and so of every tool after.
fn open_options() -> fs::OpenOptions {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = fs::OpenOptions::new();
    options.custom_flags(libc::O_NOCTTY);
    options
}

fn read_file(input: &Value, out: &mut dyn Write) -> Result<(), String> {
    let path = field(input, "path")?;
    let offset = input.get("offset").and_then(Value::as_u64).unwrap_or(0);
    let max = input
        .get("max_bytes")
        .and_then(Value::as_u64)
        .unwrap_or(1 << 20);
    let mut file = open_options()
        .read(true)
        .open(path)
        .map_err(|e| format!("cannot open {path}: {e}"))?;
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("cannot seek {path}: {e}"))?;
    let mut buffer = Vec::new();
    file.take(max)
        .read_to_end(&mut buffer)
        .map_err(|e| format!("cannot read {path}: {e}"))?;
    out.write_all(&buffer).map_err(|e| e.to_string())
}

fn write_file(input: &Value, out: &mut dyn Write) -> Result<(), String> {
    let path = field(input, "path")?;
    let content = field(input, "content")?;
    let append = input
        .get("append")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut file = open_options()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .map_err(|e| format!("cannot open {path} for writing: {e}"))?;
    file.write_all(content.as_bytes())
        .map_err(|e| format!("cannot write {path}: {e}"))?;
    writeln!(
        out,
        "{}",
        json!({"path": path, "bytes_written": content.len()})
    )
    .map_err(|e| e.to_string())
}

fn list_dir(input: &Value, out: &mut dyn Write) -> Result<(), String> {
    let path = field(input, "path")?;
    let mut entries = Vec::new();
    for entry in fs::read_dir(path).map_err(|e| format!("cannot list {path}: {e}"))? {
        let entry = entry.map_err(|e| format!("cannot list {path}: {e}"))?;
        let meta = entry.metadata().ok();
        let kind = match entry.file_type() {
            Ok(t) if t.is_dir() => "dir",
            Ok(t) if t.is_symlink() => "symlink",
            Ok(t) if t.is_file() => "file",
            _ => "other",
        };
        entries.push(json!({
            "name": entry.file_name().to_string_lossy(),
            "type": kind,
            "size": meta.map(|m| m.len()),
        }));
    }
    entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    writeln!(out, "{}", Value::Array(entries)).map_err(|e| e.to_string())
}

fn edit(input: &Value, out: &mut dyn Write) -> Result<(), String> {
    let path = field(input, "path")?;
    let old = field(input, "old_text")?;
    let new = field(input, "new_text")?;
    let mut text = String::new();
    open_options()
        .read(true)
        .open(path)
        .and_then(|mut file| file.read_to_string(&mut text))
        .map_err(|e| format!("cannot read {path}: {e}"))?;
    match text.matches(old).count() {
        0 => return Err(format!("old_text not found in {path}")),
        1 => {}
        n => {
            return Err(format!(
                "old_text occurs {n} times in {path}; it must occur exactly once"
            ));
        }
    }
    let updated = text.replacen(old, new, 1);
    open_options()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut file| file.write_all(updated.as_bytes()))
        .map_err(|e| format!("cannot write {path}: {e}"))?;
    writeln!(out, "{}", json!({"path": path, "replaced": 1})).map_err(|e| e.to_string())
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
        .map_err(|e| format!("arguments are not JSON: {e}"))
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
            other => Err(format!("unknown builtin {other:?}")),
        });
    let _ = stdout.flush();
    match result {
        Ok(Some(argv)) => BuiltinPlan::Exec(argv),
        Ok(None) => BuiltinPlan::Done(0),
        Err(message) => {
            let _ = writeln!(stderr, "{message}");
            BuiltinPlan::Done(1)
        }
    }
}
