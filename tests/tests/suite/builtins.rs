//! Built-in tools run inside the sandbox, confined like any command: they can touch what
//! the profile grants and nothing else.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

use airlock_tests::{Scratch, airlock_bin, sandbox_available};

fn policy(workspace: &Path) -> String {
    format!(
        r#"version = 1
[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
write = [{workspace:?}]
tmpfs = {{ "/tmp" = "16MiB" }}
cwd = {workspace:?}

[tools.read_file]
description = "Read a file"
builtin = "read_file"

[tools.write_file]
description = "Write a file"
builtin = "write_file"

[tools.list_dir]
description = "List a directory"
builtin = "list_dir"

[tools.edit]
description = "Replace one exact text in a file"
builtin = "edit"

[tools.bash]
description = "Run a shell command in the sandbox"
builtin = "bash"
# Destructive, so it would wait for a human: these tests are about confinement.
approval = "auto"
"#
    )
}

/// Writable binds must be writable by the sandbox root's host uid (65534 when the test
/// runs as root; our own uid otherwise, which already owns the directory).
/// A scratch directory with a `ws` workspace the sandbox's root may write.
fn writable_workspace(tag: &str) -> (Scratch, std::path::PathBuf) {
    let scratch = Scratch::new(tag);
    let workspace = scratch.0.join("ws");
    std::fs::create_dir(&workspace).unwrap();
    make_writable_for_sandbox(&workspace);
    (scratch, workspace)
}

fn make_writable_for_sandbox(dir: &Path) {
    if nix_is_root() {
        std::os::unix::fs::chown(dir, Some(65534), Some(65534)).unwrap();
    }
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn call(policy: &Path, tool: &str, input: serde_json::Value) -> serde_json::Value {
    let out = Command::new(airlock_bin())
        .args(["run", "--policy"])
        .arg(policy)
        .args(["--tool", tool, "--input", &input.to_string()])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn builtins_read_write_list_and_edit_inside_the_granted_workspace() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let (scratch, workspace) = writable_workspace("builtins");
    let policy_file = scratch.write("p.toml", &policy(&workspace));
    let file = workspace.join("notes.txt");
    let path = file.display().to_string();

    let written = call(
        &policy_file,
        "write_file",
        serde_json::json!({"path": path, "content": "hello world\n"}),
    );
    assert_eq!(written["ok"], true, "{written}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "hello world\n");

    let read = call(
        &policy_file,
        "read_file",
        serde_json::json!({"path": "notes.txt"}),
    );
    assert_eq!(read["stdout"], "hello world\n", "{read}");

    let edited = call(
        &policy_file,
        "edit",
        serde_json::json!({"path": path, "old_text": "world", "new_text": "sandbox"}),
    );
    assert_eq!(edited["ok"], true, "{edited}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "hello sandbox\n");
    let missing = call(
        &policy_file,
        "edit",
        serde_json::json!({"path": path, "old_text": "absent", "new_text": "x"}),
    );
    assert_eq!(missing["error"]["kind"], "tool_failed", "{missing}");
    assert!(missing["stderr"].as_str().unwrap().contains("not found"));

    let listed = call(
        &policy_file,
        "list_dir",
        serde_json::json!({"path": workspace.display().to_string()}),
    );
    let entries: serde_json::Value =
        serde_json::from_str(listed["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(entries[0]["name"], "notes.txt", "{listed}");
    assert_eq!(entries[0]["type"], "file");
}

#[test]
fn builtins_cannot_reach_beyond_the_profile() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let (scratch, workspace) = writable_workspace("builtins-deny");
    let policy_file = scratch.write("p.toml", &policy(&workspace));

    let shadow = call(
        &policy_file,
        "read_file",
        serde_json::json!({"path": "/etc/shadow"}),
    );
    assert_eq!(shadow["error"]["kind"], "tool_failed", "{shadow}");
    // Outside the writable bind, a path under /tmp lands in the sandbox's own tmpfs: the
    // host never sees it.
    let outside = scratch.0.join("outside.txt");
    let _ = call(
        &policy_file,
        "write_file",
        serde_json::json!({"path": outside.display().to_string(), "content": "x"}),
    );
    assert!(!outside.exists());
    let usr = call(
        &policy_file,
        "write_file",
        serde_json::json!({"path": "/usr/airlock-builtin", "content": "x"}),
    );
    assert_eq!(usr["error"]["kind"], "tool_failed", "{usr}");
    let bad = call(
        &policy_file,
        "read_file",
        serde_json::json!({"path": "x", "extra": 1}),
    );
    assert_eq!(bad["error"]["kind"], "invalid_input", "{bad}");
}

#[test]
fn bash_runs_inside_the_sandbox_not_on_the_host() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let (scratch, workspace) = writable_workspace("builtins-bash");
    let policy_file = scratch.write("p.toml", &policy(&workspace));
    let result = call(
        &policy_file,
        "bash",
        serde_json::json!({"command": "echo $((1+2)); cat /proc/sys/kernel/hostname; cat /etc/shadow 2>/dev/null || echo denied"}),
    );
    assert_eq!(result["stdout"], "3\nairlock\ndenied\n", "{result}");
}

/// A workspace whose policy gives every call the hang guard: a built-in that blocks fails
/// the test by timing out, not by hanging it, and one that does not never races a deadline
/// however slowly the machine runs.
fn short_policy(scratch: &Scratch, workspace: &Path) -> std::path::PathBuf {
    let limits = format!(
        "limits = {{ timeout = {} }}\ncwd = ",
        airlock_tests::hang_guard_toml()
    );
    let text = policy(workspace).replace("cwd = ", &limits);
    scratch.write("p.toml", &text)
}

#[test]
fn a_fifo_planted_by_an_earlier_call_is_refused_at_once_instead_of_hanging_the_call() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let (scratch, workspace) = writable_workspace("builtins-fifo");
    let policy_file = short_policy(&scratch, &workspace);
    let planted = call(
        &policy_file,
        "bash",
        serde_json::json!({"command": "mkfifo pipe"}),
    );
    assert_eq!(planted["ok"], true, "{planted}");
    let pipe = workspace.join("pipe").display().to_string();
    for (tool, input) in [
        ("read_file", serde_json::json!({"path": pipe})),
        (
            "edit",
            serde_json::json!({"path": pipe, "old_text": "a", "new_text": "b"}),
        ),
        (
            "write_file",
            serde_json::json!({"path": pipe, "content": "x"}),
        ),
    ] {
        let result = call(&policy_file, tool, input);
        assert_eq!(result["error"]["kind"], "tool_failed", "{tool}: {result}");
        assert_eq!(
            result["stderr"],
            format!(
                "{pipe} is a FIFO, not a regular file: built-ins read and write regular files only\n"
            ),
            "{tool}"
        );
    }
}

#[test]
fn device_nodes_are_not_files_to_read_or_write() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let (scratch, workspace) = writable_workspace("builtins-dev");
    let policy_file = short_policy(&scratch, &workspace);
    for (tool, input) in [
        ("read_file", serde_json::json!({"path": "/dev/zero"})),
        (
            "write_file",
            serde_json::json!({"path": "/dev/null", "content": "x"}),
        ),
    ] {
        let result = call(&policy_file, tool, input);
        assert_eq!(result["error"]["kind"], "tool_failed", "{tool}: {result}");
        assert_eq!(result["stdout"], "", "{tool}");
        assert!(
            result["stderr"]
                .as_str()
                .unwrap()
                .contains("is a character device, not a regular file"),
            "{tool}: {result}"
        );
    }
}

#[test]
fn list_dir_gives_a_name_that_is_not_utf8_as_its_exact_bytes() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    use std::os::unix::ffi::OsStrExt;
    let (scratch, workspace) = writable_workspace("builtins-names");
    let policy_file = short_policy(&scratch, &workspace);
    std::fs::write(workspace.join(std::ffi::OsStr::from_bytes(b"caf\xe9")), "").unwrap();
    std::fs::write(workspace.join("caf\u{e9}"), "").unwrap();
    let listed = call(
        &policy_file,
        "list_dir",
        serde_json::json!({"path": workspace.display().to_string()}),
    );
    let entries: serde_json::Value =
        serde_json::from_str(listed["stdout"].as_str().unwrap()).unwrap();
    // Latin-1 "café" and UTF-8 "café": two files, told apart (lossily both were "caf\u{fffd}"
    // and "café", and the first named no file that exists).
    assert_eq!(
        entries,
        serde_json::json!([
            {"name": "caf\u{e9}", "type": "file", "size": 0},
            {"name_base64": "Y2Fm6Q==", "type": "file", "size": 0},
        ]),
        "{listed}"
    );
}
