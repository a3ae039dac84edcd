//! The filesystem, process and IPC part of the escape battery: each attack runs inside a
//! real sandbox and must fail the documented way. Prints a table.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::net::UnixListener;
use std::path::Path;

use airlock_tests::{Scratch, exec_json, sandbox_available, stdout_of, test_policy};

fn sh_in(policy: &Path, script: &str) -> serde_json::Value {
    exec_json(Some(policy), &[], &["/bin/sh", "-c", script])
}

#[test]
fn filesystem_and_process_escapes_fail() {
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("escape-fs");
    let workspace = scratch.0.join("ws");
    std::fs::create_dir_all(workspace.join("sub")).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(&workspace, Some(65534), Some(65534)).unwrap();
        std::os::unix::fs::chown(workspace.join("sub"), Some(65534), Some(65534)).unwrap();
    }
    let ws = workspace.display().to_string();
    let policy_text = test_policy(&[], "timeout = \"10s\"", "none").replace(
        "tmpfs = {",
        &format!("write = [{ws:?}]\nread_optional = [\"/bin\", \"/sbin\", \"/lib\", \"/lib64\", \"/etc/ld.so.cache\", \"/etc/alternatives\", {:?}]\ntmpfs = {{", format!("{ws}/sub")),
    );
    let policy_text = policy_text.replacen("read_optional = [\"/bin\", \"/sbin\", \"/lib\", \"/lib64\", \"/etc/ld.so.cache\", \"/etc/alternatives\"]\n", "", 1);
    let policy = scratch.write("p.toml", &policy_text);

    // Host-side bait: an abstract socket and a socket by path.
    let abstract_name = format!("airlock-escape-{}", std::process::id());
    let abstract_addr =
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
            abstract_name.as_bytes(),
        )
        .unwrap();
    let _abstract = UnixListener::bind_addr(&abstract_addr).unwrap();
    let path_socket = scratch.0.join("host.sock");
    let _by_path = UnixListener::bind(&path_socket).unwrap();
    let exe_before = std::fs::read(airlock_tests::airlock_bin()).unwrap();

    let cases: Vec<(&str, String, &str)> = vec![
        (
            "overwrite /proc/self/exe",
            "echo x > /proc/self/exe 2>/dev/null && echo written || echo refused".into(),
            "refused",
        ),
        (
            "overwrite /proc/1/exe (the worker)",
            "echo x > /proc/1/exe 2>/dev/null && echo written || echo refused".into(),
            "refused",
        ),
        (
            "read /proc/1/mem of the worker",
            "head -c1 /proc/1/mem >/dev/null 2>&1 && echo read || echo refused".into(),
            "refused",
        ),
        (
            "raise RLIMIT_NOFILE above the profile",
            "ulimit -n 100000 2>/dev/null && echo raised || echo refused".into(),
            "refused",
        ),
        (
            "setuid binaries are inert (nosuid /usr)",
            "grep -q ' /usr .*nosuid' /proc/self/mountinfo && echo nosuid || echo suid".into(),
            "nosuid",
        ),
        (
            "sysrq trigger",
            "echo b > /proc/sysrq-trigger 2>/dev/null && echo written || echo refused".into(),
            "refused",
        ),
        (
            "kernel tunables under /proc/sys",
            "echo 1 > /proc/sys/kernel/sysrq 2>/dev/null && echo written || echo refused".into(),
            "refused",
        ),
        (
            "host daemon socket by path",
            format!(
                "test -e {} && echo visible || echo absent",
                path_socket.display()
            ),
            "absent",
        ),
        (
            "create a device node",
            "mknod /tmp/null2 c 1 3 2>/dev/null && echo created || echo refused".into(),
            "refused",
        ),
        (
            "mount over /tmp",
            "mount -t tmpfs none /tmp 2>/dev/null && echo mounted || echo refused".into(),
            "refused",
        ),
        (
            "write to /etc",
            "echo x > /etc/airlock-escape 2>/dev/null && echo written || echo refused".into(),
            "refused",
        ),
    ];
    let mut table = Vec::new();
    let mut failures = Vec::new();
    for (name, script, expected) in &cases {
        let result = sh_in(&policy, script);
        let seen = stdout_of(&result).trim().to_string();
        let pass = seen == *expected;
        table.push(format!(
            "{name:<42} expected {expected:<8} saw {seen:<10} {}",
            if pass { "ok" } else { "FAIL" }
        ));
        if !pass {
            failures.push(format!("{name}: {result}"));
        }
    }
    // Abstract unix sockets live in the network namespace: the host's are out of reach.
    let code = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(b'\\0{abstract_name}')\n    print('connected')\nexcept OSError:\n    print('refused')\n"
    );
    let abstract_result = exec_json(Some(&policy), &[], &["/usr/bin/python3", "-c", &code]);
    let seen = stdout_of(&abstract_result).trim().to_string();
    table.push(format!(
        "{:<42} expected {:<8} saw {:<10} {}",
        "host abstract unix socket",
        "refused",
        seen,
        if seen == "refused" { "ok" } else { "FAIL" }
    ));
    if seen != "refused" {
        failures.push(format!("abstract socket: {abstract_result}"));
    }
    // Symlink planting in a writable bind, aimed at the next call's set-up: replace the
    // bound subdirectory with a link to /etc; the next sandbox must not bind host /etc.
    let plant = sh_in(
        &policy,
        &format!("rmdir {ws}/sub 2>/dev/null; ln -s /etc {ws}/sub && echo planted"),
    );
    let next = sh_in(
        &policy,
        &format!("cat {ws}/sub/shadow 2>/dev/null && echo leaked || echo safe"),
    );
    let pass = stdout_of(&next).trim() == "safe";
    table.push(format!(
        "{:<42} expected {:<8} saw {:<10} {}",
        "symlink planted for the next call",
        "safe",
        stdout_of(&next).trim(),
        if pass { "ok" } else { "FAIL" }
    ));
    if !pass {
        failures.push(format!("symlink planting: {plant} {next}"));
    }
    // A hardlink to a file outside the writable bind cannot be made (different mount).
    let hard = sh_in(
        &policy,
        &format!("ln /usr/bin/env {ws}/env-link 2>/dev/null && echo linked || echo refused"),
    );
    let pass = stdout_of(&hard).trim() == "refused";
    table.push(format!(
        "{:<42} expected {:<8} saw {:<10} {}",
        "hardlink from /usr into the workspace",
        "refused",
        stdout_of(&hard).trim(),
        if pass { "ok" } else { "FAIL" }
    ));
    if !pass {
        failures.push(format!("hardlink: {hard}"));
    }
    assert_eq!(
        std::fs::read(airlock_tests::airlock_bin()).unwrap(),
        exe_before,
        "the airlock binary changed"
    );
    eprintln!(
        "\nescape battery (filesystem, processes, IPC)\n{}",
        table.join("\n")
    );
    assert!(failures.is_empty(), "{failures:#?}");
}
