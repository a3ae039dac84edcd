//! A fixture for the worker's two ways of binding (`airlock_worker::mounts::BindMethod`):
//! in user and mount namespaces of its own it builds a small root with the method named on
//! its command line, pivots into it, and prints as JSON what the binds look like there.
//! The tests compare the two methods (the fallback is taken on no kernel CI has). With
//! `template-on-host` it instead asks for a template's per-worker mounts in its copy of
//! the host's namespace, which the worker must refuse before mounting anything.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use airlock_policy::compile::HIDDEN_IN_PROC;
use airlock_protocol::MountOp;
use airlock_worker::mounts::{BindMethod, build_root_filesystem_binding_by, finish_template_root};

fn enter_own_namespaces() -> Result<(), String> {
    enter_namespaces(libc::CLONE_NEWUSER | libc::CLONE_NEWNS)
}

fn enter_namespaces(flags: libc::c_int) -> Result<(), String> {
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // SAFETY: unshare only changes this (single-threaded) process's namespaces.
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(format!("unshare: {}", std::io::Error::last_os_error()));
    }
    let write =
        |path: &str, text: String| std::fs::write(path, text).map_err(|e| format!("{path}: {e}"));
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("0 {uid} 1"))?;
    write("/proc/self/gid_map", format!("0 {gid} 1"))
}

/// statvfs flags of `path`: (read-only, nosuid, nodev, noexec).
fn flags_of(path: &str) -> serde_json::Value {
    let c = std::ffi::CString::new(path).unwrap();
    // SAFETY: statvfs is plain old data that the call fills; `c` is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return serde_json::json!({ "error": std::io::Error::last_os_error().to_string() });
    }
    let has = |flag: libc::c_ulong| st.f_flag & flag != 0;
    serde_json::json!({
        "rdonly": has(libc::ST_RDONLY),
        "nosuid": has(libc::ST_NOSUID),
        "nodev": has(libc::ST_NODEV),
        "noexec": has(libc::ST_NOEXEC),
    })
}

fn create_error(path: &str) -> String {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => "created".into(),
        Err(e) => e
            .raw_os_error()
            .map_or(e.to_string(), |n| format!("errno {n}")),
    }
}

fn main() {
    let mode = std::env::args().nth(1);
    if mode.as_deref() == Some("template-on-host") {
        if let Err(e) = enter_own_namespaces() {
            println!("{}", serde_json::json!({ "unavailable": e }));
            std::process::exit(3);
        }
        let mounts = || std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let before = mounts();
        let plan = [
            MountOp::Tmpfs {
                target: "/tmp".into(),
                size_bytes: 1 << 20,
                mode: 0o1777,
            },
            MountOp::Proc {
                target: "/proc".into(),
                hide: Vec::new(),
            },
        ];
        let outcome = finish_template_root(&plan).map_err(|e| e.to_string());
        let report = serde_json::json!({
            "refused": outcome.err(),
            "mounts_unchanged": mounts() == before,
        });
        println!("{report}");
        return;
    }
    let method = match mode.as_deref() {
        Some("preferred") => BindMethod::Preferred,
        Some("mount-syscall") => BindMethod::MountSyscall,
        other => {
            eprintln!("usage: airlock-mount-probe preferred|mount-syscall (got {other:?})");
            std::process::exit(2);
        }
    };
    // A pid namespace too, for a procfs of its own: the root is built in a child, its PID 1.
    if let Err(e) = enter_namespaces(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID) {
        println!("{}", serde_json::json!({ "unavailable": e }));
        std::process::exit(3);
    }
    // SAFETY: this process has one thread; the child only builds a root and prints.
    match unsafe { libc::fork() } {
        0 => {}
        -1 => {
            eprintln!("fork: {}", std::io::Error::last_os_error());
            std::process::exit(1);
        }
        child => {
            let mut status = 0;
            // SAFETY: waits for our own child; `status` is valid for the call.
            unsafe { libc::waitpid(child, &mut status, 0) };
            std::process::exit(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                1
            });
        }
    }
    let plan = vec![
        MountOp::Bind {
            source: "/usr".into(),
            target: "/usr".into(),
            writable: false,
            optional: false,
        },
        MountOp::Bind {
            source: "/lib".into(),
            target: "/lib".into(),
            writable: false,
            optional: true,
        },
        MountOp::Tmpfs {
            target: "/tmp".into(),
            size_bytes: 1 << 20,
            mode: 0o1777,
        },
        MountOp::Proc {
            target: "/proc".into(),
            hide: HIDDEN_IN_PROC.iter().map(|p| p.to_string()).collect(),
        },
        MountOp::Dev {
            target: "/dev".into(),
        },
    ];
    // What the host's procfs has of the hidden entries, to compare with the sandbox's.
    let on_host: Vec<&str> = HIDDEN_IN_PROC
        .iter()
        .copied()
        .filter(|p| std::path::Path::new("/proc").join(p).exists())
        .collect();
    if let Err(e) = build_root_filesystem_binding_by(&plan, method) {
        println!("{}", serde_json::json!({ "error": e.to_string() }));
        std::process::exit(1);
    }
    let null_write = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .and_then(|mut f| f.write_all(b"x"))
        .map_or_else(|e| e.to_string(), |()| "ok".into());
    let mut root_entries: Vec<String> = std::fs::read_dir("/")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    root_entries.sort();
    let report = serde_json::json!({
        "usr": flags_of("/usr"),
        "usr_create": create_error("/usr/.airlock-mount-probe"),
        "dev_null": flags_of("/dev/null"),
        "dev_null_write": null_write,
        "tmp_create": create_error("/tmp/probe"),
        "etc_exists": std::path::Path::new("/etc").exists(),
        "root_entries": root_entries,
        "proc_hidden": on_host
            .iter()
            .map(|p| (p.to_string(), serde_json::Value::from(hidden_view(&format!("/proc/{p}")))))
            .collect::<serde_json::Map<_, _>>(),
        "proc_self_stat": std::fs::read("/proc/self/stat").map_or(0, |s| s.len()),
    });
    println!("{report}");
}

/// What a hidden procfs entry shows: `empty` (a file with no bytes, or a directory with no
/// entry) and read-only, or what it shows instead.
fn hidden_view(path: &str) -> String {
    let shown = match std::fs::metadata(path) {
        Err(e) => return format!("error {e}"),
        Ok(m) if m.is_dir() => std::fs::read_dir(path).map(|d| d.count()),
        Ok(_) => std::fs::read(path).map(|bytes| bytes.len()),
    };
    match (shown, flags_of(path)["rdonly"].as_bool()) {
        (Ok(0), Some(true)) => "empty".into(),
        (Ok(n), rdonly) => format!("{n} entries or bytes, read-only {rdonly:?}"),
        (Err(e), _) => format!("error {e}"),
    }
}
