//! The syscall part of the escape battery: each attempt runs as a hostile program inside a
//! real sandbox and must end exactly as documented (README, "Seccomp"). Prints a table.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use airlock_tests::{Scratch, exec_json, sandbox_available, stdout_of, test_policy};

const EPERM: &str = "errno=1";
const ENOSYS: &str = "errno=38";

/// (probe, network mode, expected): expected is a probe output line, or `SIGSYS`.
const CASES: &[(&str, &str, &str)] = &[
    ("unshare-user", "none", EPERM),
    ("clone-newuser", "none", EPERM),
    ("clone3", "none", ENOSYS),
    ("setns", "none", EPERM),
    ("mount", "none", EPERM),
    ("umount2", "none", EPERM),
    ("pivot_root", "none", EPERM),
    ("chroot", "none", EPERM),
    ("ptrace", "none", EPERM),
    ("process_vm_readv", "none", EPERM),
    ("bpf", "none", EPERM),
    ("perf_event_open", "none", EPERM),
    ("userfaultfd", "none", EPERM),
    ("keyctl", "none", EPERM),
    ("add_key", "none", EPERM),
    ("request_key", "none", EPERM),
    ("io_uring_setup", "none", ENOSYS),
    ("kexec_load", "none", EPERM),
    ("init_module", "none", EPERM),
    ("finit_module", "none", EPERM),
    ("open_by_handle_at", "none", EPERM),
    ("tiocsti", "none", EPERM),
    ("tiocsti-hibits", "none", EPERM),
    ("tioclinux", "none", EPERM),
    ("personality", "none", EPERM),
    ("mknod-char", "none", EPERM),
    ("socket-unix", "none", "ok"),
    ("socket-inet", "none", EPERM),
    ("socket-inet", "loopback", "ok"),
    ("socket-packet", "loopback", EPERM),
    ("socket-netlink", "loopback", EPERM),
    ("socket-vsock", "loopback", EPERM),
    ("socket-alg", "loopback", EPERM),
    ("syscall-1000", "none", ENOSYS),
    ("x32-getpid", "none", "SIGSYS"),
    ("int80-getpid", "none", "SIGSYS"),
];

#[test]
fn every_listed_syscall_attack_gets_its_documented_outcome() {
    if !sandbox_available() {
        return;
    }
    let probe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_airlock-probe"));
    let scratch = Scratch::new("seccomp");
    let none = scratch.write(
        "none.toml",
        &test_policy(&[&probe], "timeout = \"10s\"", "none"),
    );
    let loopback = scratch.write(
        "loopback.toml",
        &test_policy(&[&probe], "timeout = \"10s\"", "loopback"),
    );
    let mut table = Vec::new();
    let mut failures = Vec::new();
    for (case, network, expected) in CASES {
        let policy = if *network == "none" { &none } else { &loopback };
        let result = exec_json(Some(policy), &[], &[probe.to_str().unwrap(), case]);
        let seen =
            if result["error"]["kind"] == "seccomp_violation" && result["signal"] == libc::SIGSYS {
                "SIGSYS".to_string()
            } else {
                stdout_of(&result).trim().to_string()
            };
        let pass = seen == *expected;
        table.push(format!(
            "{case:<20} {network:<9} expected {expected:<9} saw {seen:<9} {}",
            if pass { "ok" } else { "FAIL" }
        ));
        if !pass {
            failures.push(format!("{case}: expected {expected}, saw {seen}: {result}"));
        }
    }
    eprintln!("\nescape battery (seccomp)\n{}", table.join("\n"));
    assert!(failures.is_empty(), "{failures:#?}");
}
