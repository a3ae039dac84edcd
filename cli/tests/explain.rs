//! `airlock explain` as a security engineer reviews a policy with it: a tool or a profile
//! in plain words, from the embedded presets or a file, in text or JSON.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};

use serde_json::Value;

fn airlock() -> Command {
    Command::new(env!("CARGO_BIN_EXE_airlock"))
}

fn explain(args: &[&str]) -> Output {
    airlock().arg("explain").args(args).output().unwrap()
}

fn stdout_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "explain failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// A policy file in a fresh temporary directory, removed with its directory when dropped
/// (also when an assertion fails first): the suite leaves nothing in the host's `/tmp`.
struct PolicyFile {
    dir: std::path::PathBuf,
    file: std::path::PathBuf,
}

impl PolicyFile {
    fn path(&self) -> &str {
        self.file.to_str().unwrap()
    }
}

impl Drop for PolicyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write_policy(tag: &str, text: &str) -> PolicyFile {
    let dir = std::env::temp_dir().join(format!("airlock-explain-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("policy.toml");
    std::fs::write(&file, text).unwrap();
    PolicyFile { dir, file }
}

#[test]
fn explain_tool_word_count_names_its_paths_network_limits_and_approval() {
    // No --policy: the `examples` preset, as `airlock run` uses.
    let text = stdout_of(&explain(&["--tool", "word_count"]));
    for expected in [
        "Tool word_count: Count the words in a text",
        "/usr/bin/wc -w",
        "the input field \"text\"",
        "side effect: read",
        "approval:    auto",
        "required: text",
        "Profile text_filter (policy preset:examples)",
        "read-only:            /usr",
        "/lib64",
        "no network",
        "AF_UNIX only",
        "memory:               64MiB",
        "processes:            8",
        "timeout:              5s",
        "open files:           32",
        "file size:            1MiB",
        "LANG=C.UTF-8",
        "always EPERM:",
        "ptrace",
        "clone3, io_uring_setup",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

#[test]
fn explain_default_profile_names_tmpfs_environment_and_required_layers() {
    // No --policy: the embedded default preset, as `airlock exec` uses.
    let text = stdout_of(&explain(&["--profile", "default"]));
    for expected in [
        "Profile default (policy preset:default)",
        "read-only:            /usr",
        "read-write:           none",
        "/tmp (64MiB",
        "no network",
        "memory:               256MiB",
        "timeout:              30s",
        "HOME=/tmp",
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "Landlock:             required",
        "cgroup limits:        required",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert!(!text.contains("Tool "), "{text}");
}

#[test]
fn explain_json_gives_the_same_facts_as_data() {
    let out = explain(&["--tool", "shell", "--json"]);
    let facts: Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    assert_eq!(facts["policy"], "preset:examples");
    assert_eq!(facts["tool"]["approval"], "human");
    assert_eq!(facts["tool"]["side_effect"], "destructive");
    assert_eq!(facts["tool"]["timeout"], "10s");
    assert_eq!(facts["tool"]["input"]["required"][0], "script");
    assert_eq!(facts["tool"]["command"][2], "{script}");
    assert!(
        facts["tool"]["gate"]["human_approval"]
            .as_str()
            .unwrap()
            .starts_with("every call"),
        "{facts:#}"
    );
    assert_eq!(facts["tool"]["gate"]["plan_mode"], false);
    let profile = &facts["profile"];
    assert_eq!(profile["name"], "default");
    assert_eq!(profile["limits"]["memory"], "256MiB");
    assert_eq!(profile["limits"]["memory_bytes"], 256u64 << 20);
    assert_eq!(profile["network"]["mode"], "none");
    assert_eq!(profile["tmpfs"][0]["path"], "/tmp");
    assert_eq!(profile["require"]["seccomp"], "required");
    assert!(profile["syscalls"]["allowed_count"].as_u64().unwrap() > 100);
    assert_eq!(profile["syscalls"]["socket_families"][0], "AF_UNIX");
}

#[test]
fn explain_a_policy_file_shows_writes_tcp_rules_syscall_changes_and_warnings() {
    let file = write_policy(
        "net",
        r#"version = 1

[profiles.net]
read = ["/usr"]
write = ["/var/tmp"]
network = { mode = "host", connect = ["tcp:443"], bind = [] }
syscalls = { allow = ["vmsplice"], deny = ["flock"] }
limits = { memory = "1GiB", cpu = "10s" }
require = { landlock = "best_effort" }

[tools.fetch]
description = "Fetch a URL"
profile = "net"
command = ["/usr/bin/curl", "-s", "{url}"]
approval = "human"
input = { type = "object", properties = { url = { type = "string", pattern = "^https://" } }, required = ["url"] }
"#,
    );
    let path = file.path();
    let text = stdout_of(&explain(&["--policy", path, "--tool", "fetch"]));
    for expected in [
        "/usr/bin/curl -s {url}",
        "exactly one argument",
        "approval:    human",
        "url: string, required, matching /^https:///",
        "read-write:           /var/tmp",
        "connect to 443, bind to no port",
        "added to the base:    vmsplice",
        "denied by profile:    flock (EPERM)",
        "AF_UNIX, AF_INET (stream), AF_INET6 (stream)",
        "net:host",
        "UDP sockets refused by the seccomp filter",
        "memory:               1GiB",
        "cpu time:             10s",
        "Landlock:             best effort",
        "warning: landlock is best_effort",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

#[test]
fn explain_an_egress_profile_shows_its_allowlist() {
    let file = write_policy(
        "egress",
        r#"version = 1

[profiles.web]
read = ["/usr"]
network = { allow = ["pypi.org", "*.pythonhosted.org", "[::1]:8080"], allow_addresses = ["127.0.0.1/32"] }
"#,
    );
    let text = stdout_of(&explain(&["--policy", file.path(), "--profile", "web"]));
    for expected in [
        "egress through airlock's proxy only",
        "pypi.org, *.pythonhosted.org, [::1]:8080",
        "within 127.0.0.1/32",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    let json: serde_json::Value = serde_json::from_str(&stdout_of(&explain(&[
        "--policy",
        file.path(),
        "--profile",
        "web",
        "--json",
    ])))
    .unwrap();
    let network = &json["profile"]["network"];
    assert_eq!(network["mode"], "egress", "{json}");
    assert_eq!(network["allow"][1], "*.pythonhosted.org", "{json}");
    assert_eq!(network["allow_addresses"][0], "127.0.0.1/32", "{json}");
}

#[test]
fn explain_a_tool_lists_the_gate_rules_that_decide_its_calls_and_its_rate_limits() {
    let gate = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../policies/examples/gate.toml"
    );
    let text = stdout_of(&explain(&["--policy", gate, "--tool", "bash"]));
    for expected in [
        "no-dangerous-shell: input field \"command\" matching one of",
        "-> deny",
        "no-git-push:",
        "otherwise: review (a human approves first), by the default decision",
        "human approval: every call (a destructive tool that declares no approval",
        "plan mode:   refused",
        "10 calls per 1m for this tool; 120 calls per 1m per session",
        "permissions: fs:read, fs:write, subprocess",
        "read-write:           /srv/agent-workspace",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    // A read-only tool stops at the read_only rule: no pattern rule, no approval.
    let text = stdout_of(&explain(&["--policy", gate, "--tool", "read_file"]));
    assert!(
        text.contains("every call: allow, by rule reads-are-free")
            && text.contains("human approval: never")
            && !text.contains("no-git-push"),
        "{text}"
    );
}

#[test]
fn explain_an_unknown_tool_or_profile_exits_1_naming_what_exists() {
    let out = explain(&["--tool", "no_such_tool"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no tool named \"no_such_tool\" in preset:examples")
            && stderr.contains("word_count"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    let out = explain(&["--profile", "text_filter"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("no profile named \"text_filter\" in preset:default; its profiles: default"),
        "{stderr}"
    );
}

#[test]
fn explain_refuses_bad_usage_and_invalid_policies() {
    // Neither --tool nor --profile, or both: a usage error (clap's exit code 2).
    assert_eq!(explain(&[]).status.code(), Some(2));
    assert_eq!(
        explain(&["--tool", "word_count", "--profile", "default"])
            .status
            .code(),
        Some(2)
    );

    let file = write_policy("bad", "version = 1\n[profiles.p]\nread = [\"usr\"]\n");
    let out = explain(&["--policy", file.path(), "--profile", "p"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("3:9") && stderr.contains("is invalid"),
        "{stderr}"
    );

    let out = explain(&["--policy", "/nonexistent/policy.toml", "--profile", "p"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read policy file"));
}
