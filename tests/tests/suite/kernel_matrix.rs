//! Kernel matrix: tests that adapt to the kernel they run on and check airlock reports (and
//! enforces) what that kernel offers — Landlock present or absent, cgroup v1 or v2. They run
//! on the host and, through `ci/vm-test`, inside VMs booting Debian 12's 6.1 kernel with and
//! without Landlock in `lsm=`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use airlock_tests::{Scratch, exec_json, must_work, test_policy};

/// `LANDLOCK_CREATE_RULESET_VERSION`: asks landlock_create_ruleset for the ABI version.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

/// The kernel's Landlock ABI version, or why there is none (compiled out: ENOSYS; built in
/// but left out of `lsm=`: EOPNOTSUPP).
fn kernel_landlock_abi() -> Result<u32, std::io::Error> {
    // SAFETY: with a NULL attribute pointer, size 0 and the VERSION flag the syscall reads no
    // memory and returns the ABI version (or -1 with errno); no descriptor is created.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(u32::try_from(ret).unwrap())
}

/// Whether Landlock is usable here. The active LSM list (securityfs, when mounted) must
/// agree with the syscall, so a VM booted with `lsm=` that forgot or kept Landlock by
/// mistake is caught instead of silently testing the wrong thing.
fn landlock_present() -> bool {
    let abi = kernel_landlock_abi();
    if let Ok(lsm) = std::fs::read_to_string("/sys/kernel/security/lsm") {
        let listed = lsm.trim().split(',').any(|m| m == "landlock");
        assert_eq!(
            listed,
            abi.is_ok(),
            "/sys/kernel/security/lsm is {lsm:?} but landlock_create_ruleset says {abi:?}"
        );
    }
    match abi {
        Ok(version) => {
            eprintln!("kernel: landlock ABI {version}");
            true
        }
        Err(error) => {
            eprintln!("kernel: no landlock ({error})");
            false
        }
    }
}

/// "v2" when /sys/fs/cgroup is the unified hierarchy itself, "v1" otherwise (legacy or
/// hybrid: memory and pids under v1, which is where airlock puts workers then).
fn expected_cgroup_version() -> &'static str {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let unified = mountinfo.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let mount_point = fields.get(4).copied();
        let fs_type = fields
            .iter()
            .position(|f| *f == "-")
            .and_then(|sep| fields.get(sep + 1).copied());
        mount_point == Some("/sys/fs/cgroup") && fs_type == Some("cgroup2")
    });
    if unified { "v2" } else { "v1" }
}

/// The integration tests' policy with Landlock downgraded to `best_effort`: everything else
/// (namespaces, seccomp, cgroup) stays required.
fn best_effort_landlock_policy(scratch: &Scratch, extra_read: &[&Path]) -> PathBuf {
    let mut text = test_policy(
        extra_read,
        &format!("timeout = {}", airlock_tests::hang_guard_toml()),
        "none",
    );
    // test_policy ends inside [profiles.default], so this line belongs to that profile.
    text.push_str(
        "require = { landlock = \"best_effort\", seccomp = \"required\", cgroup = \"required\" }\n",
    );
    scratch.write("best-effort.toml", &text)
}

/// Proceeds only if the sandbox works apart from Landlock (skips loudly, or fails under
/// `AIRLOCK_MUST_WORK=1`), so a missing Landlock is not confused with a broken sandbox.
fn sandbox_works_without_landlock(policy: &Path) -> bool {
    let result = exec_json(Some(policy), &[], &["/bin/true"]);
    if result["ok"] == true {
        return true;
    }
    if must_work() {
        panic!(
            "sandbox unavailable (even with best_effort landlock) and AIRLOCK_MUST_WORK=1: {result}"
        );
    }
    eprintln!("SKIP: sandbox unavailable on this machine: {result}");
    false
}

#[test]
fn landlock_required_profile_fails_closed_without_landlock() {
    let _guard = airlock_tests::shared();
    let scratch = Scratch::new("matrix-required");
    if !sandbox_works_without_landlock(&best_effort_landlock_policy(&scratch, &[])) {
        return;
    }
    // The embedded default policy requires Landlock.
    let result = exec_json(None, &[], &["/bin/true"]);
    if landlock_present() {
        assert_eq!(result["ok"], true, "{result}");
        assert_eq!(result["isolation"]["landlock"], "full", "{result}");
        let abi = result["isolation"]["landlock_abi"].as_u64().unwrap();
        assert!(abi >= 1, "{result}");
        assert_eq!(abi, u64::from(kernel_landlock_abi().unwrap()), "{result}");
    } else {
        assert_eq!(result["ok"], false, "{result}");
        assert_eq!(result["error"]["kind"], "sandbox_unavailable", "{result}");
        assert_eq!(result["error"]["step"], "landlock", "{result}");
        let message = result["error"]["message"].as_str().unwrap().to_lowercase();
        assert!(message.contains("landlock"), "{result}");
        // Fail closed: the tool never ran, so there is no exit code and no output.
        assert!(result["exit_code"].is_null(), "{result}");
        assert_eq!(
            result["stdout"].as_str().unwrap_or_default(),
            "",
            "{result}"
        );
    }
}

#[test]
fn best_effort_landlock_profile_runs_and_reports_what_it_got() {
    let _guard = airlock_tests::shared();
    let scratch = Scratch::new("matrix-best-effort");
    let policy = best_effort_landlock_policy(&scratch, &[]);
    if !sandbox_works_without_landlock(&policy) {
        return;
    }
    let result = exec_json(Some(&policy), &[], &["/bin/sh", "-c", "echo ran"]);
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["stdout"], "ran\n", "{result}");
    if landlock_present() {
        assert_eq!(result["isolation"]["landlock"], "full", "{result}");
        assert_eq!(
            result["isolation"]["landlock_abi"].as_u64(),
            Some(u64::from(kernel_landlock_abi().unwrap())),
            "{result}"
        );
    } else {
        assert_eq!(result["isolation"]["landlock"], "none", "{result}");
        assert_eq!(result["isolation"]["landlock_abi"], 0, "{result}");
    }
    // The other layers stay in force whatever Landlock did.
    assert_eq!(
        result["isolation"]["seccomp"].as_str().map(str::len),
        Some(64),
        "{result}"
    );
    // Every kernel of the matrix gives the worker a seccomp listener (Linux 5.0), so refused
    // syscalls are listed; Landlock's refusals are not observed on any, and the record says
    // so rather than showing an empty list as if nothing had been refused.
    let reporting = &result["isolation"]["denial_reporting"];
    assert_eq!(reporting["seccomp"], "reported", "{result}");
    assert_eq!(reporting["landlock"], "unavailable", "{result}");
    assert_eq!(result["denials"], serde_json::json!([]), "{result}");
}

#[test]
fn cgroup_version_is_reported_and_limits_apply() {
    let _guard = airlock_tests::shared();
    let scratch = Scratch::new("matrix-cgroup");
    // best_effort Landlock, so this also runs on the boot without Landlock.
    let policy = best_effort_landlock_policy(&scratch, &[]);
    if !sandbox_works_without_landlock(&policy) {
        return;
    }
    let expected = expected_cgroup_version();
    eprintln!("expecting cgroup {expected}");
    let result = exec_json(
        Some(&policy),
        &["--memory", "32MiB"],
        &[
            "/bin/sh",
            "-c",
            "a=xxxxxxxxxxxxxxxx; while :; do a=$a$a; done",
        ],
    );
    assert_eq!(result["isolation"]["cgroup"], expected, "{result}");
    assert_eq!(result["error"]["kind"], "out_of_memory", "{result}");
    assert_eq!(
        result["isolation"]["limits"]["memory_bytes"],
        32u64 << 20,
        "{result}"
    );
    let peak = result["usage"]["peak_memory_bytes"].as_u64().unwrap();
    assert!(peak > 0 && peak <= 32 << 20, "{result}");
}
