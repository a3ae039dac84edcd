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
"#
    )
}

/// Writable binds must be writable by the sandbox root's host uid (65534 when the test
/// runs as root; our own uid otherwise, which already owns the directory).
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
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("builtins");
    let workspace = scratch.0.join("ws");
    std::fs::create_dir(&workspace).unwrap();
    make_writable_for_sandbox(&workspace);
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
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("builtins-deny");
    let workspace = scratch.0.join("ws");
    std::fs::create_dir(&workspace).unwrap();
    make_writable_for_sandbox(&workspace);
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
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("builtins-bash");
    let workspace = scratch.0.join("ws");
    std::fs::create_dir(&workspace).unwrap();
    make_writable_for_sandbox(&workspace);
    let policy_file = scratch.write("p.toml", &policy(&workspace));
    let result = call(
        &policy_file,
        "bash",
        serde_json::json!({"command": "echo $((1+2)); cat /proc/sys/kernel/hostname; cat /etc/shadow 2>/dev/null || echo denied"}),
    );
    assert_eq!(result["stdout"], "3\nairlock\ndenied\n", "{result}");
}
