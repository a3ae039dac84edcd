//! Landlock's refusals read from the kernel's audit (`--landlock-audit`): listed in the call
//! whose tool caused them and no other, bounded however many a tool makes, never from a
//! domain a tool nests itself; `unavailable` without the opt-in.
//!
//! These need root, Landlock ABI 7 and a kernel with audit: the tests turn the audit on for
//! their duration when it is off (and back off afterwards, failed or not) under the suite's
//! exclusive lock. Elsewhere they skip, saying why, unless `AIRLOCK_MUST_WORK=1` on a host
//! that is root with ABI 7, where they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use airlock::landlock_audit::{host_audit_enabled, host_landlock_abi, set_host_audit_enabled};
use airlock::{SandboxRun, Supervisor, SupervisorOptions};
use airlock_tests::{HANG_GUARD, airlock_bin, exec_json, sandbox_available};

/// The audit on for a test; put back as it was when dropped (a failed test included).
struct AuditOn {
    restore: bool,
}

impl Drop for AuditOn {
    fn drop(&mut self) {
        if self.restore {
            set_host_audit_enabled(false).expect("cannot turn the audit back off");
        }
    }
}

/// The audit on, or why these tests cannot run here (a failure under
/// `AIRLOCK_MUST_WORK=1` on a root host with Landlock ABI 7).
fn audit_on() -> Option<AuditOn> {
    if !sandbox_available() {
        return None;
    }
    let root = effective_uid() == 0;
    let abi = host_landlock_abi();
    let skip = |why: String| {
        assert!(
            !(airlock_tests::must_work() && root && abi >= 7),
            "AIRLOCK_MUST_WORK=1 on a root host with Landlock ABI {abi}: {why}"
        );
        eprintln!("SKIP: Landlock refusals cannot be read from the audit here: {why}");
        None
    };
    if !root {
        return skip(
            "not root (the audit is read with CAP_AUDIT_READ in the initial user namespace)".into(),
        );
    }
    if abi < 7 {
        return skip(format!(
            "Landlock ABI {abi}, logging a tool's refusals needs 7"
        ));
    }
    match host_audit_enabled() {
        Ok(true) => Some(AuditOn { restore: false }),
        Ok(false) => match set_host_audit_enabled(true) {
            Ok(()) => Some(AuditOn { restore: true }),
            Err(e) => skip(format!("cannot turn the audit on: {e}")),
        },
        Err(e) => skip(format!("no kernel audit (CONFIG_AUDIT): {e}")),
    }
}

/// This process's effective uid, from its status (no unsafe in the suite).
fn effective_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1))
                .and_then(|id| id.parse().ok())
        })
        .unwrap_or(u32::MAX)
}

fn landlock_denials(result: &serde_json::Value) -> Vec<serde_json::Value> {
    result["denials"]
        .as_array()
        .unwrap_or_else(|| panic!("no denials list: {result}"))
        .iter()
        .filter(|d| d["layer"] == "landlock")
        .cloned()
        .collect()
}

fn reporting(result: &serde_json::Value) -> &serde_json::Value {
    &result["isolation"]["denial_reporting"]["landlock"]
}

fn default_profile() -> Arc<airlock_policy::CompiledProfile> {
    let text = airlock_policy::presets::preset_text("default").unwrap();
    let policy = airlock_policy::load_policy_str(text, "default")
        .unwrap()
        .policy;
    Arc::clone(&policy.profiles["default"])
}

fn run(profile: &Arc<airlock_policy::CompiledProfile>, id: &str, argv: &[&str]) -> SandboxRun {
    SandboxRun {
        call_id: id.into(),
        tool: "exec".into(),
        profile: Arc::clone(profile),
        argv: argv.iter().map(|a| (*a).to_string()).collect(),
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout: HANG_GUARD,
        inherit_stdio: None,
        builtin: None,
    }
}

fn reading_supervisor() -> Arc<Supervisor> {
    let supervisor = Supervisor::start(SupervisorOptions {
        worker_program: Some((airlock_bin(), Vec::new())),
        landlock_audit: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        supervisor.landlock_audit(),
        &airlock::LandlockAuditState::Reading
    );
    Arc::new(supervisor)
}

/// A tool that floods refusals (80 distinct objects: /proc/<pid>/comm of 80 children, which
/// Landlock leaves read-only in a writable procfs), and nests a Landlock domain of its own
/// asking for its refusals to be logged, then is refused by it.
const HOSTILE: &str = "\
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for _ in range(80):
    pid = os.fork()
    if pid == 0:
        try:
            os.close(os.open('/proc/self/comm', os.O_WRONLY))
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
attr = (ctypes.c_uint64 * 3)(1 << 1, 0, 0)
fd = libc.syscall(444, ctypes.byref(attr), ctypes.c_size_t(16), ctypes.c_uint32(0))
assert fd >= 0, ctypes.get_errno()
assert libc.syscall(446, fd, ctypes.c_uint32(2)) == 0, ctypes.get_errno()
try:
    open('/tmp/nested-refusal', 'w')
    print('nested write allowed')
except PermissionError:
    print('nested write refused')
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_refusals_are_bounded_its_own_and_never_from_a_domain_it_nests() {
    let _guard = airlock_tests::exclusive();
    let Some(_audit) = audit_on() else {
        return;
    };
    if !std::path::Path::new("/usr/bin/python3").exists() {
        eprintln!("SKIP: needs /usr/bin/python3 for raw Landlock syscalls");
        return;
    }
    let supervisor = reading_supervisor();
    let profile = default_profile();
    let hostile = run(&profile, "hostile", &["/usr/bin/python3", "-c", HOSTILE]);
    let quiet = run(
        &profile,
        "quiet",
        &["/bin/sh", "-c", "cat /proc/self/comm >/dev/null"],
    );
    let (hostile, quiet) = tokio::join!(supervisor.run(hostile, None), supervisor.run(quiet, None));
    let hostile = serde_json::to_value(&hostile).unwrap();
    let quiet = serde_json::to_value(&quiet).unwrap();
    assert_eq!(hostile["ok"], true, "{hostile}");
    assert_eq!(
        airlock_tests::stdout_of(&hostile),
        "nested write refused\n",
        "{hostile}"
    );
    assert_eq!(reporting(&hostile), "reported", "{hostile}");
    let listed = landlock_denials(&hostile);
    // Bounded: 64 distinct objects, the rest counted as `other`.
    assert_eq!(listed.len(), 65, "{hostile}");
    let other = listed.last().unwrap();
    assert_eq!(
        (other["object"].as_str(), other["count"].as_u64()),
        (Some("other"), Some(16))
    );
    for denial in &listed[..64] {
        let object = denial["object"].as_str().unwrap();
        assert!(
            object.starts_with("/proc/") && object.ends_with("/comm"),
            "{denial}"
        );
        assert_eq!(denial["rule"], "fs.write_file", "{denial}");
        assert_eq!(denial["count"], 1, "{denial}");
    }
    // The nested domain logs nothing: its refusal is nowhere, here or in the other call.
    assert!(!hostile.to_string().contains("nested-refusal"), "{hostile}");
    assert_eq!(quiet["ok"], true, "{quiet}");
    assert_eq!(reporting(&quiet), "reported", "{quiet}");
    assert!(landlock_denials(&quiet).is_empty(), "{quiet}");
    supervisor.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_workers_refusal_is_listed_in_its_call_with_path_and_right() {
    let _guard = airlock_tests::exclusive();
    let Some(_audit) = audit_on() else {
        return;
    };
    let supervisor = reading_supervisor();
    let profile = default_profile();
    supervisor.keep_warm(Arc::clone(&profile), 1);
    airlock_tests::wait_until_async("a pooled worker is idle", || {
        supervisor.pool_stats().idle >= 1
    })
    .await;
    let misses = supervisor.pool_stats().misses;
    let result = supervisor
        .run(
            run(
                &profile,
                "pooled",
                &["/bin/sh", "-c", "echo x >/proc/self/comm"],
            ),
            None,
        )
        .await;
    assert_eq!(supervisor.pool_stats().misses, misses, "not a pooled call");
    let result = serde_json::to_value(&result).unwrap();
    assert_eq!(reporting(&result), "reported", "{result}");
    let listed = landlock_denials(&result);
    let write = listed
        .iter()
        .find(|d| d["rule"] == "fs.write_file")
        .unwrap_or_else(|| panic!("no refused write: {result}"));
    let object = write["object"].as_str().unwrap();
    assert!(
        object.starts_with("/proc/") && object.ends_with("/comm"),
        "{write}"
    );
    assert_eq!(write["count"], 1, "{write}");
    supervisor.close().await;
}

#[test]
fn the_cli_lists_landlock_refusals_only_when_asked() {
    let _guard = airlock_tests::exclusive();
    let Some(_audit) = audit_on() else {
        return;
    };
    let command = ["/bin/sh", "-c", "echo x >/proc/self/comm"];
    let asked = exec_json(None, &["--landlock-audit"], &command);
    assert_eq!(reporting(&asked), "reported", "{asked}");
    let listed = landlock_denials(&asked);
    assert!(
        listed.iter().any(|d| d["rule"] == "fs.write_file"
            && d["object"].as_str().is_some_and(|o| o.ends_with("/comm"))),
        "{asked}"
    );
    // Without the opt-in nothing changes: the layer says it cannot report.
    let plain = exec_json(None, &[], &command);
    assert_eq!(reporting(&plain), "unavailable", "{plain}");
    assert!(landlock_denials(&plain).is_empty(), "{plain}");
}

#[test]
fn asking_where_the_host_cannot_read_the_audit_says_why_and_reports_unavailable() {
    let _guard = airlock_tests::exclusive();
    if !sandbox_available() {
        return;
    }
    // Root with ABI 7 and the audit on can read it: that is the tests above.
    let can =
        effective_uid() == 0 && host_landlock_abi() >= 7 && host_audit_enabled().unwrap_or(false);
    if can {
        eprintln!("SKIP: this host can read the audit (the audit is on)");
        return;
    }
    let out = std::process::Command::new(airlock_bin())
        .args([
            "exec",
            "--json",
            "--landlock-audit",
            "--",
            "/bin/sh",
            "-c",
            "echo x >/proc/self/comm",
        ])
        .output()
        .unwrap();
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reporting(&result), "unavailable", "{result}");
    assert!(landlock_denials(&result).is_empty(), "{result}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Landlock refusals will not be read from the audit"),
        "{stderr}"
    );
}
