//! How the worker resolves the policy's host paths: the host's own symlinks are followed,
//! binds nest inside writable ones, and a symlink a tool planted in a writable bind fails
//! the next call closed instead of redirecting its binds (escape battery FS-05).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use airlock_tests::{Scratch, exec_json, sandbox_available, stdout_of};

/// A policy reading the system directories plus `read`, writing `write`.
fn policy(scratch: &Scratch, read: &[&Path], write: &[&Path]) -> std::path::PathBuf {
    let list = |paths: &[&Path]| {
        paths
            .iter()
            .map(|p| format!("{:?}", p.display().to_string()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    scratch.write(
        "policy.toml",
        &format!(
            r#"version = 1
[profiles.default]
read = ["/usr", {}]
read_optional = ["/bin", "/sbin", "/lib", "/lib64", "/etc/ld.so.cache"]
write = [{}]
env = {{ PATH = "/usr/bin:/bin" }}
"#,
            list(read),
            list(write)
        ),
    )
}

/// The uid the sandbox's root is on the host, so it may write a workspace we create.
fn give_to_sandbox(path: &Path) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(path, Some(65534), Some(65534)).unwrap();
    }
}

#[test]
fn a_host_symlink_on_the_path_of_a_bind_is_followed() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("mounts-hostlink");
    std::fs::create_dir_all(scratch.0.join("real/data")).unwrap();
    std::fs::write(
        scratch.0.join("real/data/file"),
        "through the host's link\n",
    )
    .unwrap();
    std::os::unix::fs::symlink("real", scratch.0.join("link")).unwrap();
    let via_link = scratch.0.join("link/data");
    let policy = policy(&scratch, &[&via_link], &[]);
    let file = via_link.join("file").display().to_string();
    let result = exec_json(Some(&policy), &[], &["/bin/cat", &file]);
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(stdout_of(&result), "through the host's link\n");
}

#[test]
fn a_bind_nested_in_a_writable_bind_stays_read_only() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("mounts-nested");
    let ws = scratch.0.join("ws");
    std::fs::create_dir_all(ws.join("cfg")).unwrap();
    give_to_sandbox(&ws);
    give_to_sandbox(&ws.join("cfg"));
    let cfg = ws.join("cfg");
    let policy = policy(&scratch, &[&cfg], &[&ws]);
    let script = format!(
        "echo x > {ws}/cfg/f; echo $?; echo x > {ws}/g; echo $?",
        ws = ws.display()
    );
    let result = exec_json(Some(&policy), &[], &["/bin/sh", "-c", &script]);
    assert_eq!(stdout_of(&result), "2\n0\n", "{result}");
    assert!(!ws.join("cfg/f").exists());
    assert!(ws.join("g").exists());
}

#[test]
fn a_symlink_planted_on_a_nested_bind_path_fails_the_next_call_closed() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("mounts-planted");
    let ws = scratch.0.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    give_to_sandbox(&ws);
    std::fs::create_dir_all(scratch.0.join("secret/ssh")).unwrap();
    std::fs::write(scratch.0.join("secret/ssh/key"), "host secret\n").unwrap();
    let nested = ws.join("cfg/ssh");
    let policy = policy(&scratch, &[], &[&ws]);
    let nested_policy = {
        let text = std::fs::read_to_string(&policy).unwrap().replace(
            "read_optional = [",
            &format!("read_optional = [{:?}, ", nested.display().to_string()),
        );
        scratch.write("nested.toml", &text)
    };

    // The first call plants the link; the nested bind does not exist yet, so it is skipped.
    let plant = format!("ln -s ../secret {}/cfg", ws.display());
    let first = exec_json(Some(&nested_policy), &[], &["/bin/sh", "-c", &plant]);
    assert_eq!(first["ok"], true, "{first}");
    assert!(ws.join("cfg").is_symlink());

    // The next call would bind the host's secret/ssh at cfg/ssh; it must not start.
    let key = nested.join("key").display().to_string();
    let second = exec_json(Some(&nested_policy), &[], &["/bin/cat", &key]);
    assert_eq!(second["ok"], false, "{second}");
    assert_eq!(second["error"]["kind"], "sandbox_unavailable", "{second}");
    let message = second["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "{} is a symlink inside a writable bind",
            ws.join("cfg").display()
        )),
        "{message}"
    );
    assert_eq!(second["stdout"], "", "{second}");
}

/// Runs the mount fixture with `method` and returns its report.
fn mount_probe(method: &str) -> Option<serde_json::Value> {
    let out = std::process::Command::new(airlock_tests::fixture_bin("airlock-mount-probe"))
        .arg(method)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{method}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    if let Some(reason) = report.get("unavailable") {
        assert!(
            !airlock_tests::must_work(),
            "user namespaces unavailable and AIRLOCK_MUST_WORK=1: {reason}"
        );
        eprintln!("SKIP: user namespaces unavailable: {reason}");
        return None;
    }
    assert!(out.status.success(), "{method}: {report}");
    Some(report)
}

#[test]
fn a_worker_told_its_root_is_a_templates_refuses_the_hosts_root_before_mounting() {
    let _guard = airlock_tests::shared();
    let Some(report) = mount_probe("template-on-host") else {
        return;
    };
    let refused = report["refused"].as_str().unwrap_or_default();
    assert!(refused.contains("not a template"), "{report}");
    assert_eq!(report["mounts_unchanged"], true, "{report}");
}

#[test]
fn binds_by_descriptor_and_by_mount_syscall_give_the_same_root() {
    let _guard = airlock_tests::shared();
    let (Some(preferred), Some(fallback)) =
        (mount_probe("preferred"), mount_probe("mount-syscall"))
    else {
        return;
    };
    assert_eq!(preferred, fallback, "the two ways of binding differ");
    // And what they give is what the plan asked for.
    let flags = |name: &str, flag: &str| preferred[name][flag].as_bool().unwrap();
    assert!(flags("usr", "rdonly") && flags("usr", "nosuid") && flags("usr", "nodev"));
    assert_eq!(preferred["usr_create"], format!("errno {}", libc::EROFS));
    assert!(!flags("dev_null", "nodev") && flags("dev_null", "noexec"));
    assert!(flags("dev_null", "nosuid") && !flags("dev_null", "rdonly"));
    assert_eq!(preferred["dev_null_write"], "ok");
    assert_eq!(preferred["tmp_create"], "created");
    assert_eq!(
        preferred["etc_exists"], false,
        "the host's /etc was not bound"
    );
}

#[test]
fn a_built_root_covers_host_identifying_proc_entries_with_empty_read_only_ones() {
    let _guard = airlock_tests::shared();
    for method in ["preferred", "mount-syscall"] {
        let Some(report) = mount_probe(method) else {
            return;
        };
        let hidden = report["proc_hidden"].as_object().unwrap();
        assert!(hidden.contains_key("cmdline"), "{method}: {report}");
        for (entry, view) in hidden {
            assert_eq!(view, "empty", "{method}: /proc/{entry}: {report}");
        }
        // The rest of the procfs works.
        assert!(report["proc_self_stat"].as_u64().unwrap() > 0, "{report}");
    }
}
