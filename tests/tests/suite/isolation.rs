//! What a tool sees from inside the default sandbox: every property asserted from within.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use airlock_tests::{exec_json, exec_plain, sandbox_available, stdout_of};

fn sh(script: &str) -> serde_json::Value {
    exec_json(None, &[], &["/bin/sh", "-c", script])
}

#[test]
fn sandbox_root_is_not_host_root() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = sh("cat /proc/self/uid_map /proc/self/gid_map; id -u");
    assert_eq!(result["ok"], true, "{result}");
    let out = stdout_of(&result);
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    // A root supervisor maps the sandbox's root to nobody; an unprivileged one can only map
    // its own ids (and never host root).
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let (uid, gid) = if uid == 0 {
        ("65534".to_string(), "65534".to_string())
    } else {
        (uid.to_string(), gid.to_string())
    };
    assert_eq!(lines[0], vec!["0", uid.as_str(), "1"], "{out}");
    assert_eq!(lines[1], vec!["0", gid.as_str(), "1"], "{out}");
    assert_ne!(lines[0][1], "0", "{out}");
    assert_eq!(lines[2], vec!["0"], "{out}");
}

#[test]
fn tool_has_no_capabilities_and_runs_under_no_new_privs_and_seccomp() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = sh("grep -E '^(Cap|NoNewPrivs|Seccomp:)' /proc/self/status");
    let out = stdout_of(&result);
    for line in out.lines() {
        let (key, value) = line.split_once(':').unwrap();
        let value = value.trim();
        match key {
            k if k.starts_with("Cap") => assert_eq!(value, "0000000000000000", "{line}"),
            "NoNewPrivs" => assert_eq!(value, "1"),
            "Seccomp" => assert_eq!(value, "2"),
            other => panic!("unexpected line {other}"),
        }
    }
    assert_eq!(out.lines().count(), 7, "{out}");
    assert_eq!(result["isolation"]["landlock"], "full", "{result}");
    assert_eq!(
        result["isolation"]["seccomp"].as_str().map(str::len),
        Some(64)
    );
}

#[test]
fn proc_shows_only_the_sandbox_processes() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = sh("for p in /proc/[0-9]*; do echo ${p#/proc/}; done");
    let pids: Vec<u32> = stdout_of(&result)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    // The worker (1), the shell, and perhaps the glob's own helper: never the host's.
    assert!(pids.contains(&1), "{pids:?}");
    assert!(pids.len() <= 4, "{pids:?}");
}

#[test]
fn root_holds_only_what_the_profile_grants() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = sh("cut -d' ' -f5 /proc/self/mountinfo");
    let allowed = [
        "/",
        "/usr",
        "/tmp",
        "/proc",
        "/dev",
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
        "/etc/ld.so.cache",
        "/etc/localtime",
        "/etc/ssl/certs",
        "/etc/nsswitch.conf",
        "/etc/ld.so.conf",
        "/etc/ld.so.conf.d",
        "/etc/alternatives",
        "/etc/ca-certificates",
    ];
    // And what covers the masked entries of /proc.
    let masks: Vec<String> = airlock_policy::compile::HIDDEN_IN_PROC
        .iter()
        .map(|entry| format!("/proc/{entry}"))
        .collect();
    let out = stdout_of(&result);
    for mount_point in out.lines() {
        assert!(
            allowed.contains(&mount_point) || masks.iter().any(|m| m == mount_point),
            "unexpected mount {mount_point} in {out}"
        );
    }
    assert!(out.lines().any(|m| m == "/usr"));
}

#[test]
fn writes_outside_writable_places_fail_and_tmp_is_writable() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = sh(
        "echo x > /usr/airlock-escape; echo $?; echo x > /airlock-escape; echo $?; echo ok > /tmp/f && cat /tmp/f",
    );
    let out = stdout_of(&result);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, vec!["2", "2", "ok"], "{result}");
    assert!(
        result["stderr"]
            .as_str()
            .unwrap()
            .contains("Read-only file system"),
        "{result}"
    );
    assert!(!std::path::Path::new("/usr/airlock-escape").exists());
}

#[test]
fn host_secrets_are_unreachable() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result =
        sh("cat /etc/shadow; echo $?; ls /root; echo $?; ls /home; echo $?; ls /sys; echo $?");
    let out = stdout_of(&result);
    let codes: Vec<&str> = out.lines().collect();
    assert!(codes.iter().all(|c| *c != "0"), "{result}");
}

#[test]
fn network_has_no_interface_but_a_down_loopback() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result =
        sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; echo --; cat /proc/net/if_inet6");
    assert_eq!(stdout_of(&result), "lo\n--\n", "{result}");
}

#[test]
fn tools_start_with_no_signal_blocked_or_ignored() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // The spawner clones workers with every signal blocked; the worker must undo that
    // before any tool exists, or `kill -TERM` and Ctrl-C would be ignored by tools.
    let result = sh("grep -E '^Sig(Blk|Ign)' /proc/self/status");
    assert_eq!(
        stdout_of(&result),
        "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n",
        "{result}"
    );
}

#[test]
fn tools_have_no_controlling_terminal_and_cannot_acquire_one() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // /proc/<pid>/stat fields 1, 6 and 7: the pid, its session and its terminal. The tool
    // (the shell) runs in the worker's session, which has no terminal, and is not its
    // leader: only a session leader acquires a terminal by opening one.
    let result = sh("cut -d' ' -f1,6,7 /proc/$$/stat");
    assert_eq!(result["ok"], true, "{result}");
    let out = stdout_of(&result);
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{out}");
    assert_eq!(
        fields[1], "1",
        "the worker (PID 1) leads the tool's session: {out}"
    );
    assert_ne!(fields[0], fields[1], "the tool leads no session: {out}");
    assert_eq!(fields[2], "0", "no controlling terminal: {out}");
}

#[test]
fn a_missing_executable_fails_the_call_with_its_errno() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = exec_json(None, &[], &["/usr/bin/airlock-no-such-tool"]);
    assert_eq!(result["ok"], false, "{result}");
    assert_eq!(result["error"]["kind"], "tool_failed", "{result}");
    let message = result["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cannot execute /usr/bin/airlock-no-such-tool")
            && message.contains("No such file or directory"),
        "{result}"
    );
}

#[test]
fn hostname_is_the_sandboxes() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = sh("cat /proc/sys/kernel/hostname");
    assert_eq!(stdout_of(&result), "airlock\n");
}

#[test]
fn tools_inherit_only_stdio() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // `ls` opens the directory itself as fd 3.
    let result = sh("ls /proc/self/fd");
    let out = stdout_of(&result);
    let fds: Vec<&str> = out.lines().map(str::trim).collect();
    assert_eq!(fds, vec!["0", "1", "2", "3"], "{result}");
}

#[test]
fn exec_passes_stdio_and_the_exit_code_through() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let out = exec_plain(
        None,
        &[],
        &["/bin/sh", "-c", "echo out; echo err >&2; exit 7"],
    );
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
    let out = exec_plain(None, &[], &["/bin/sh", "-c", "kill -9 $$"]);
    assert_eq!(out.status.code(), Some(137));
    let out = exec_plain(None, &[], &["/no/such/program"]);
    assert_eq!(
        out.status.code(),
        Some(127),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_cgroup_view_is_rooted_at_the_sandboxs_own_cgroup() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = sh("cat /proc/self/cgroup");
    assert_eq!(result["ok"], true, "{result}");
    let out = stdout_of(&result);
    assert!(!out.is_empty());
    // Rooted above the worker, the paths named the supervisor's host pid and how many
    // workers it had made (`/airlock-<pid>-<n>`).
    for line in out.lines() {
        assert_eq!(line.splitn(3, ':').nth(2), Some("/"), "{out}");
    }
}

/// What the sandbox shows of its procfs's host-identifying entries: the bytes of the
/// kernel command line and the boot id, and the entries of /proc/pressure.
const PROC_IDENTITY: &str = "wc -c < /proc/cmdline; wc -c < /proc/sys/kernel/random/boot_id; \
     ls -A /proc/pressure 2>/dev/null | wc -l; grep -q . /proc/self/stat && echo stat";

#[test]
fn host_identifying_proc_entries_read_empty() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = sh(PROC_IDENTITY);
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(stdout_of(&result), "0\n0\n0\nstat\n", "{result}");
    // Read-only: nothing can be written into what hides them.
    let write = sh("echo x > /proc/cmdline 2>/dev/null || echo refused");
    assert_eq!(stdout_of(&write), "refused\n", "{write}");
}

#[test]
fn a_profile_with_proc_full_sees_the_whole_procfs() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = airlock_tests::Scratch::new("proc-full");
    let preset = airlock_policy::presets::preset_text("default").unwrap();
    let policy = scratch.write(
        "full.toml",
        &preset.replace(
            "[profiles.default]\n",
            "[profiles.default]\nproc = \"full\"\n",
        ),
    );
    let result = exec_json(
        Some(&policy),
        &[],
        &[
            "/bin/sh",
            "-c",
            "wc -c < /proc/sys/kernel/random/boot_id; grep -q . /proc/cmdline && echo cmdline",
        ],
    );
    assert_eq!(stdout_of(&result), "37\ncmdline\n", "{result}");
}
