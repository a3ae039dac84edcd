//! The host and this build: the kernel release, this process's privileges and open-file
//! limits, and which worker program the supervisor execs.

use serde_json::json;

use super::{Check, Status};

/// CAP_SYS_ADMIN's bit in the capability sets of /proc/self/status.
const CAP_SYS_ADMIN_BIT: u32 = 21;

/// Which program the supervisor execs as its worker: the dedicated one `build.rs` embeds,
/// or (if that build failed) this whole binary.
pub(super) fn check_worker_image() -> Check {
    let bytes = crate::WORKER_IMAGE.len();
    let target = env!("AIRLOCK_WORKER_TARGET");
    if bytes > 0 && target.ends_with("-musl") {
        Check::ok(
            "worker.image",
            "worker program",
            format!(
                "the dedicated airlock-worker, embedded ({} KiB, static, {target})",
                bytes / 1024
            ),
        )
        .with_facts(json!({ "embedded": true, "bytes": bytes, "target": target }))
    } else if bytes > 0 {
        Check::problem(
            "worker.image",
            "worker program",
            Status::Warn,
            format!(
                "the dedicated airlock-worker, embedded ({} KiB, static, {target}), built against glibc",
                bytes / 1024
            ),
            "nothing: workers are confined the same way, but glibc's start-up costs each worker CPU (0.2-0.7 ms of cpuid traps on a virtual machine)",
            "rustup target add x86_64-unknown-linux-musl, then rebuild airlock (cargo clean -p airlock-cli)",
        )
        .with_facts(json!({ "embedded": true, "bytes": bytes, "target": target }))
    } else {
        Check::problem(
            "worker.image",
            "worker program",
            Status::Warn,
            "no dedicated worker was embedded at build time; workers exec this whole binary",
            "nothing: workers are confined the same way, but each starts slower and takes more memory",
            "rebuild airlock and read the build's warning about the airlock-worker binary",
        )
        .with_facts(json!({ "embedded": false, "bytes": 0 }))
    }
}

/// A file under /proc or /sys, trimmed; `None` when it does not exist or cannot be read.
pub(super) fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// A field of /proc/self/status (`CapEff`, `Seccomp`, ...).
pub(super) fn status_field(name: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then(|| value.trim().to_string())
    })
}

/// Whether this process holds CAP_SYS_ADMIN, which the userns sysctls do not restrict.
pub(super) fn has_cap_sys_admin() -> bool {
    status_field("CapEff")
        .and_then(|hex| u64::from_str_radix(&hex, 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN_BIT) != 0)
}

/// `6.18.44-foo` → (6, 18).
fn parse_kernel_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

pub(super) fn check_kernel() -> Check {
    const TITLE: &str = "kernel version";
    let arch = std::env::consts::ARCH;
    let Some(release) = read_trimmed("/proc/sys/kernel/osrelease") else {
        return Check::problem(
            "kernel",
            TITLE,
            Status::Warn,
            "cannot read /proc/sys/kernel/osrelease",
            "nothing by itself; the checks below probe each feature directly",
            "mount /proc",
        );
    };
    let version = parse_kernel_release(&release);
    let facts = json!({
        "release": release,
        "arch": arch,
        "major": version.map(|v| v.0),
        "minor": version.map(|v| v.1),
    });
    let detail = format!("Linux {release} on {arch}");
    if arch != "x86_64" {
        return Check::problem(
            "kernel",
            TITLE,
            Status::Fail,
            detail,
            "every sandbox: airlock's seccomp filters are built for x86_64 only",
            "run airlock on an x86_64 machine",
        )
        .with_facts(facts);
    }
    let check = match version {
        Some(v) if v < (5, 9) => Check::problem(
            "kernel",
            TITLE,
            Status::Fail,
            detail,
            "every sandbox: the supervisor needs clone3 (5.3), pidfds (5.4) and the worker \
             close_range (5.9)",
            "upgrade to Linux 5.13 or later (6.7 or later for Landlock TCP rules)",
        ),
        Some(v) if v < (5, 13) => Check::problem(
            "kernel",
            TITLE,
            Status::Warn,
            detail,
            "Landlock needs Linux 5.13: profiles that require it cannot run",
            "upgrade to Linux 5.13 or later (6.7 or later for Landlock TCP rules)",
        ),
        Some(_) => Check::ok("kernel", TITLE, detail),
        None => Check::problem(
            "kernel",
            TITLE,
            Status::Warn,
            format!("cannot parse the kernel release {release:?}"),
            "nothing by itself; the checks below probe each feature directly",
            "none needed if the checks below pass",
        ),
    };
    check.with_facts(facts)
}

pub(super) fn check_privileges() -> Check {
    let uid = status_field("Uid")
        .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_else(|| "?".into());
    let admin = has_cap_sys_admin();
    let detail = if admin {
        format!(
            "effective uid {uid} with CAP_SYS_ADMIN: sandboxes map their root to an \
             unprivileged host uid (65534 unless --sandbox-uid)"
        )
    } else {
        format!(
            "effective uid {uid} without CAP_SYS_ADMIN: sandboxes need unprivileged user \
             namespaces and a cgroup delegated to this user"
        )
    };
    Check::ok("privileges", "privileges", detail)
        .with_facts(json!({ "euid": uid, "cap_sys_admin": admin }))
}

/// The open-file check's id and title.
const OPEN_FILES_ID: &str = "open_files";
/// See [`OPEN_FILES_ID`].
const OPEN_FILES_TITLE: &str = "open-file limit";
/// How to give airlock more descriptors.
const OPEN_FILES_FIX: &str =
    "raise the hard limit (ulimit -Hn, LimitNOFILE= in a unit, --ulimit nofile= for a container)";

/// The open-file limit this shell gives airlock, against what a tool's default profile
/// and `airlock serve` with its default flags can use.
pub(super) fn check_open_files() -> Check {
    let Ok((soft, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    else {
        return Check::problem(
            OPEN_FILES_ID,
            OPEN_FILES_TITLE,
            Status::Warn,
            "RLIMIT_NOFILE cannot be read",
            "nothing known: calls may fail for want of descriptors",
            "none known",
        );
    };
    let serve = airlock::daemon::open_files_needed_by(&airlock::daemon::DaemonConfig::new(
        "/run/airlock/airlock.sock".into(),
    ));
    let profile = airlock_policy::validate::defaults::OPEN_FILES;
    let facts = json!({ "soft": soft, "hard": hard, "serve_defaults_need": serve, "profile_default": profile });
    assess_open_files(soft, hard, serve, profile).with_facts(facts)
}

/// [`check_open_files`]'s verdict on the limits `soft` and `hard`, given what `serve` with
/// its default flags needs and the default profile's `open_files`.
fn assess_open_files(soft: u64, hard: u64, serve: u64, profile: u64) -> Check {
    let limits = format!("soft {soft}, hard {hard}");
    if hard < profile {
        return Check::problem(
            OPEN_FILES_ID,
            OPEN_FILES_TITLE,
            Status::Warn,
            format!("{limits}: below the default profile's open_files ({profile})"),
            format!(
                "tools get the lower hard limit ({hard}) instead of their profile's, and `airlock serve` runs fewer calls at once"
            ),
            OPEN_FILES_FIX,
        );
    }
    if hard < serve {
        return Check::problem(
            OPEN_FILES_ID,
            OPEN_FILES_TITLE,
            Status::Warn,
            format!(
                "{limits}: below the about {serve} that `airlock serve` with its default flags can use"
            ),
            "`airlock serve` runs fewer calls at once than --max-concurrent and queues the rest",
            OPEN_FILES_FIX,
        );
    }
    Check::ok(
        OPEN_FILES_ID,
        OPEN_FILES_TITLE,
        format!(
            "{limits}: room for tools' defaults and for `airlock serve`'s (about {serve}); \
             the daemon raises its soft limit to the hard one"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hard_open_file_limit_below_the_profile_or_the_daemon_is_a_warning() {
        assert_eq!(
            assess_open_files(1024, 524_288, 800, 256).status,
            Status::Ok
        );
        let short = assess_open_files(1024, 1024, 1100, 256);
        assert_eq!(short.status, Status::Warn);
        assert!(short.breaks.unwrap().contains("fewer calls at once"));
        let tools = assess_open_files(128, 128, 800, 256);
        assert_eq!(tools.status, Status::Warn);
        assert!(tools.breaks.unwrap().contains("lower hard limit (128)"));
    }

    #[test]
    fn kernel_releases_parse_to_major_and_minor() {
        assert_eq!(parse_kernel_release("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(parse_kernel_release("5.4.0-150-generic"), Some((5, 4)));
        assert_eq!(parse_kernel_release("6.1"), Some((6, 1)));
        assert_eq!(parse_kernel_release("garbage"), None);
    }
}
