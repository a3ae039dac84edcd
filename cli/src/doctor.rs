//! `airlock doctor`: checks, one by one, the kernel features a sandbox needs — user
//! namespaces (and the sysctls and AppArmor switch that restrict them), Landlock, seccomp,
//! cgroups — says for each missing piece what it breaks and how to fix it, and ends with a
//! real sandbox in the default profile, whose success alone decides the exit status.
//!
//! Probes that change the calling process (unshare, a seccomp filter) run in a forked child
//! that exits right after, so the doctor itself stays unconfined.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use airlock::cgroup::{CgroupLimits, CgroupParent, CgroupVersion};
use airlock::{SandboxRun, Supervisor, SupervisorOptions, ToolResult};
use airlock_policy::{load_policy_str, presets, units};
use serde::Serialize;
use serde_json::{Value, json};

/// Options of `airlock doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print the report as one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    /// Works.
    Ok,
    /// Works, with a limitation worth knowing.
    Warn,
    /// Missing: something airlock needs does not work.
    Fail,
}

/// One check of the report.
#[derive(Debug, Serialize)]
struct Check {
    /// Stable identifier (`userns.probe`).
    id: &'static str,
    /// What was checked, in words.
    title: &'static str,
    status: Status,
    /// What was found.
    detail: String,
    /// What does not work because of it (warn and fail only).
    #[serde(skip_serializing_if = "Option::is_none")]
    breaks: Option<String>,
    /// How to fix it (warn and fail only).
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
    /// Machine-readable findings.
    #[serde(skip_serializing_if = "Value::is_null")]
    facts: Value,
}

impl Check {
    fn ok(id: &'static str, title: &'static str, detail: impl Into<String>) -> Self {
        Self {
            id,
            title,
            status: Status::Ok,
            detail: detail.into(),
            breaks: None,
            fix: None,
            facts: Value::Null,
        }
    }

    fn problem(
        id: &'static str,
        title: &'static str,
        status: Status,
        detail: impl Into<String>,
        breaks: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            id,
            title,
            status,
            detail: detail.into(),
            breaks: Some(breaks.into()),
            fix: Some(fix.into()),
            facts: Value::Null,
        }
    }

    fn with_facts(mut self, facts: Value) -> Self {
        self.facts = facts;
        self
    }
}

/// The whole report, as `doctor --json` prints it.
#[derive(Debug, Serialize)]
struct Report {
    /// The default profile ran a command in a real sandbox.
    ok: bool,
    /// One sentence.
    summary: String,
    checks: Vec<Check>,
}

const USERNS_BREAKS: &str = "every sandbox: each worker starts in a fresh user namespace that \
owns its mount, pid, net, ipc, uts and cgroup namespaces";
const LANDLOCK_BREAKS: &str = "profiles with require.landlock = \"required\" (the default) \
refuse to run; best_effort profiles run without Landlock's file and TCP rules (the mount \
namespace still hides the host)";
const SECCOMP_BREAKS: &str = "profiles with require.seccomp = \"required\" (the default) \
refuse to run; best_effort profiles run without a syscall filter";
const CGROUP_BREAKS: &str = "profiles with require.cgroup = \"required\" (the default) refuse \
to run; best_effort profiles run without memory and process limits";
const CGROUP_FIX: &str = "run airlock as root, or give it a delegated cgroup: on cgroup v2 \
start it under `systemd-run --user --scope -p Delegate=yes`, on v1 chown a directory in the \
memory and pids hierarchies to its user";

/// The namespaces every worker gets besides its user namespace (supervisor/src/sys.rs).
const INNER_NAMESPACES: libc::c_int = libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP;

/// CAP_SYS_ADMIN's bit in the capability sets of /proc/self/status.
const CAP_SYS_ADMIN_BIT: u32 = 21;

/// Runs every check, prints the report, and exits 0 only if the default profile works.
pub fn run_doctor(args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let mut checks = vec![check_kernel(), check_privileges(), check_worker_image()];
    checks.extend(check_user_namespaces());
    checks.extend(check_landlock());
    checks.extend(check_seccomp());
    let (cgroup_checks, parent) = check_cgroups();
    checks.extend(cgroup_checks);
    let sandbox = check_default_sandbox(parent);
    let ok = sandbox.status == Status::Ok;
    checks.push(sandbox);

    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| c.id)
        .collect();
    let warned = checks.iter().filter(|c| c.status == Status::Warn).count();
    let summary = match (ok, failed.as_slice(), warned) {
        (true, [], 0) => {
            "airlock works here: the default profile ran a command in a sandbox".into()
        }
        (true, _, _) => format!(
            "airlock works here: the default profile ran a command in a sandbox ({} failed \
             and {warned} warning check(s) limit other profiles; see above)",
            failed.len()
        ),
        (false, _, _) => format!(
            "airlock cannot run the default profile here; fix the failed checks: {}",
            failed.join(", ")
        ),
    };
    let report = Report {
        ok,
        summary,
        checks,
    };
    if args.json {
        crate::write_stdout(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else {
        crate::write_stdout(&render_report(&report))?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One line per check; the breaks and fix hints of a problem indented beneath it.
fn render_report(report: &Report) -> String {
    let mut out = String::new();
    for check in &report.checks {
        let label = match check.status {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        out.push_str(&format!(
            "{label:<5} {:<28} {}\n",
            check.title, check.detail
        ));
        if let Some(breaks) = &check.breaks {
            out.push_str(&format!("        breaks: {breaks}\n"));
        }
        if let Some(fix) = &check.fix {
            out.push_str(&format!("        fix:    {fix}\n"));
        }
    }
    out.push_str(&format!("\n{}\n", report.summary));
    out
}

/// Which program the supervisor execs as its worker: the dedicated one `build.rs` embeds,
/// or (if that build failed) this whole binary.
fn check_worker_image() -> Check {
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
fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// A field of /proc/self/status (`CapEff`, `Seccomp`, ...).
fn status_field(name: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then(|| value.trim().to_string())
    })
}

/// Whether this process holds CAP_SYS_ADMIN, which the userns sysctls do not restrict.
fn has_cap_sys_admin() -> bool {
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

fn check_kernel() -> Check {
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

fn check_privileges() -> Check {
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

fn check_user_namespaces() -> Vec<Check> {
    let admin = has_cap_sys_admin();
    let mut checks = Vec::new();

    const MAX: &str = "user.max_user_namespaces";
    const MAX_TITLE: &str = "user namespace limit";
    checks.push(match read_trimmed("/proc/sys/user/max_user_namespaces") {
        None => Check::problem(
            "userns.max",
            MAX_TITLE,
            Status::Fail,
            format!("{MAX} is absent: the kernel has no user namespaces"),
            USERNS_BREAKS,
            "use a kernel built with CONFIG_USER_NS=y",
        ),
        Some(value) if value.parse::<u64>().is_ok_and(|n| n > 0) => {
            Check::ok("userns.max", MAX_TITLE, format!("{MAX} = {value}"))
        }
        Some(value) => Check::problem(
            "userns.max",
            MAX_TITLE,
            Status::Fail,
            format!("{MAX} = {value}: user namespaces are disabled"),
            USERNS_BREAKS,
            "sysctl -w user.max_user_namespaces=15000 (and persist it in /etc/sysctl.d/)",
        ),
    });

    // Debian's patch (and older Ubuntu): only processes without CAP_SYS_ADMIN are refused.
    const DEBIAN: &str = "kernel.unprivileged_userns_clone";
    const DEBIAN_TITLE: &str = "Debian userns switch";
    checks.push(
        match read_trimmed("/proc/sys/kernel/unprivileged_userns_clone") {
            None => Check::ok(
                "userns.unprivileged_clone",
                DEBIAN_TITLE,
                format!("{DEBIAN} is not present (no such switch in this kernel)"),
            ),
            Some(value) if value != "0" => Check::ok(
                "userns.unprivileged_clone",
                DEBIAN_TITLE,
                format!("{DEBIAN} = {value}"),
            ),
            Some(value) if admin => Check::ok(
                "userns.unprivileged_clone",
                DEBIAN_TITLE,
                format!("{DEBIAN} = {value}, which does not restrict a process with CAP_SYS_ADMIN"),
            ),
            Some(value) => Check::problem(
                "userns.unprivileged_clone",
                DEBIAN_TITLE,
                Status::Fail,
                format!("{DEBIAN} = {value}: unprivileged users cannot create user namespaces"),
                USERNS_BREAKS,
                "sysctl -w kernel.unprivileged_userns_clone=1 (persist it in /etc/sysctl.d/), \
                 or run airlock as root",
            ),
        },
    );

    // Ubuntu 23.10+: unprivileged user namespaces are created without capabilities unless
    // an AppArmor profile grants `userns`, so the worker cannot mount its root.
    const APPARMOR: &str = "kernel.apparmor_restrict_unprivileged_userns";
    const APPARMOR_TITLE: &str = "AppArmor userns restriction";
    checks.push(
        match read_trimmed("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") {
            None => Check::ok(
                "userns.apparmor",
                APPARMOR_TITLE,
                format!("{APPARMOR} is not present (no such restriction in this kernel)"),
            ),
            Some(value) if value == "0" => Check::ok(
                "userns.apparmor",
                APPARMOR_TITLE,
                format!("{APPARMOR} = {value}"),
            ),
            Some(value) if admin => Check::ok(
                "userns.apparmor",
                APPARMOR_TITLE,
                format!(
                    "{APPARMOR} = {value}, which does not restrict a process with CAP_SYS_ADMIN"
                ),
            ),
            Some(value) => Check::problem(
                "userns.apparmor",
                APPARMOR_TITLE,
                Status::Fail,
                format!(
                    "{APPARMOR} = {value}: AppArmor strips the capabilities of user namespaces \
                     made by unprivileged programs"
                ),
                USERNS_BREAKS,
                "give the airlock binary an AppArmor profile with the `userns,` rule \
                 (/etc/apparmor.d/airlock: `abi <abi/4.0>, include <tunables/global> profile \
                 airlock /path/to/airlock flags=(unconfined) { userns, }`, then \
                 `apparmor_parser -r` it), or sysctl -w \
                 kernel.apparmor_restrict_unprivileged_userns=0, or run airlock as root",
            ),
        },
    );

    checks.push(probe_user_namespaces());
    checks
}

/// Creates a user namespace, then the worker's other namespaces inside it, in a child.
fn probe_user_namespaces() -> Check {
    const TITLE: &str = "user namespace probe";
    let fix = |error: &io::Error| match error.raw_os_error() {
        Some(libc::ENOSPC) => "raise user.max_user_namespaces (sysctl -w \
                               user.max_user_namespaces=15000)"
            .to_string(),
        Some(libc::EPERM) => "see the sysctl checks above; inside a container, run it with \
                              user namespaces allowed (e.g. without a seccomp profile that \
                              blocks unshare), or run airlock on the host"
            .to_string(),
        _ => "see the checks above".to_string(),
    };
    if let Err(error) = run_probe_child(|| unshare_namespaces(libc::CLONE_NEWUSER)) {
        return Check::problem(
            "userns.probe",
            TITLE,
            Status::Fail,
            format!("unshare(CLONE_NEWUSER) failed: {error}"),
            USERNS_BREAKS,
            fix(&error),
        )
        .with_facts(json!({ "user_namespace": false }));
    }
    if let Err(error) = run_probe_child(|| {
        unshare_namespaces(libc::CLONE_NEWUSER)?;
        unshare_namespaces(INNER_NAMESPACES)
    }) {
        return Check::problem(
            "userns.probe",
            TITLE,
            Status::Fail,
            format!(
                "a user namespace can be created, but not the mount, pid, net, ipc, uts and \
                 cgroup namespaces inside it: {error}"
            ),
            USERNS_BREAKS,
            format!(
                "{}; this is what Ubuntu's AppArmor restriction looks like",
                fix(&error)
            ),
        )
        .with_facts(json!({ "user_namespace": true, "inner_namespaces": false }));
    }
    Check::ok(
        "userns.probe",
        TITLE,
        "a child created a user namespace and mount, pid, net, ipc, uts and cgroup \
         namespaces inside it",
    )
    .with_facts(json!({ "user_namespace": true, "inner_namespaces": true }))
}

fn check_landlock() -> Vec<Check> {
    const TITLE: &str = "Landlock ABI";
    let abi = airlock_worker::sys::landlock_abi_version();
    let abi_check = match &abi {
        Ok(version) if *version >= 4 => Check::ok(
            "landlock.abi",
            TITLE,
            format!("ABI {version}: file and TCP rules are enforced"),
        ),
        Ok(version) => Check::problem(
            "landlock.abi",
            TITLE,
            Status::Warn,
            format!("ABI {version}: file rules only (TCP rules need ABI 4, Linux 6.7)"),
            "profiles with network = { connect/bind } rules get only partial Landlock \
             (reported as landlock = \"partial\"); required ones refuse to run",
            "upgrade to Linux 6.7 or later",
        ),
        Err(error) if error.raw_os_error() == Some(libc::EOPNOTSUPP) => Check::problem(
            "landlock.abi",
            TITLE,
            Status::Fail,
            "Landlock is built into the kernel but not enabled",
            LANDLOCK_BREAKS,
            "add landlock to the lsm= kernel command line (e.g. \
             lsm=landlock,lockdown,yama,integrity,apparmor,bpf) and reboot",
        ),
        Err(error) => Check::problem(
            "landlock.abi",
            TITLE,
            Status::Fail,
            format!("landlock_create_ruleset failed: {error}"),
            LANDLOCK_BREAKS,
            "use Linux 5.13 or later built with CONFIG_SECURITY_LANDLOCK=y and landlock in \
             lsm=",
        ),
    };
    let abi_value = abi.as_ref().ok().copied();
    let abi_check = abi_check.with_facts(json!({ "abi": abi_value }));

    const LSM_TITLE: &str = "active LSMs";
    let lsm_check = match read_trimmed("/sys/kernel/security/lsm") {
        Some(list) if list.split(',').any(|l| l == "landlock") => {
            Check::ok("landlock.lsm", LSM_TITLE, list.clone())
                .with_facts(json!({ "lsm": list, "landlock": true }))
        }
        Some(list) => Check::problem(
            "landlock.lsm",
            LSM_TITLE,
            Status::Fail,
            format!("{list} (no landlock)"),
            LANDLOCK_BREAKS,
            format!("boot with lsm={list},landlock"),
        )
        .with_facts(json!({ "lsm": list, "landlock": false })),
        None if abi_value.is_some() => Check::ok(
            "landlock.lsm",
            LSM_TITLE,
            "/sys/kernel/security/lsm is not readable (securityfs not mounted), but Landlock \
             answered the ABI query, so it is active",
        )
        .with_facts(json!({ "lsm": null, "landlock": true })),
        None => Check::problem(
            "landlock.lsm",
            LSM_TITLE,
            Status::Warn,
            "/sys/kernel/security/lsm is not readable (securityfs not mounted)",
            "nothing by itself; the ABI check above says whether Landlock works",
            "mount -t securityfs securityfs /sys/kernel/security to see the list",
        )
        .with_facts(json!({ "lsm": null, "landlock": null })),
    };
    vec![abi_check, lsm_check]
}

fn check_seccomp() -> Vec<Check> {
    // The actions airlock's filters return (policies/src/seccomp.rs).
    const NEEDED: [&str; 3] = ["kill_process", "errno", "allow"];
    const TITLE: &str = "seccomp actions";
    let actions_check = match read_trimmed("/proc/sys/kernel/seccomp/actions_avail") {
        Some(actions) => {
            let available: Vec<&str> = actions.split_whitespace().collect();
            let missing: Vec<&str> = NEEDED
                .iter()
                .copied()
                .filter(|a| !available.contains(a))
                .collect();
            let facts = json!({ "actions": available });
            if missing.is_empty() {
                Check::ok("seccomp.actions", TITLE, actions.clone()).with_facts(facts)
            } else {
                Check::problem(
                    "seccomp.actions",
                    TITLE,
                    Status::Fail,
                    format!("{actions} (missing: {})", missing.join(", ")),
                    SECCOMP_BREAKS,
                    "use Linux 4.14 or later built with CONFIG_SECCOMP_FILTER=y",
                )
                .with_facts(facts)
            }
        }
        None => Check::problem(
            "seccomp.actions",
            TITLE,
            Status::Fail,
            "/proc/sys/kernel/seccomp/actions_avail is absent: no seccomp filters",
            SECCOMP_BREAKS,
            "use a kernel built with CONFIG_SECCOMP=y and CONFIG_SECCOMP_FILTER=y",
        ),
    };

    const FILTER_TITLE: &str = "seccomp filter probe";
    // A filter this process already runs under (a container runtime's) stays in force in
    // every sandbox on top of airlock's own.
    let inherited = status_field("Seccomp_filters")
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    let note = if inherited > 0 {
        format!(
            " (airlock itself already runs under {inherited} filter(s), e.g. a container's; \
             they stay in force inside every sandbox)"
        )
    } else {
        String::new()
    };
    let filter_check = match run_probe_child(install_allow_all_seccomp_filter) {
        Ok(()) => Check::ok(
            "seccomp.filter",
            FILTER_TITLE,
            format!("a child installed a filter with SECCOMP_SET_MODE_FILTER{note}"),
        ),
        Err(error) => Check::problem(
            "seccomp.filter",
            FILTER_TITLE,
            Status::Fail,
            format!("SECCOMP_SET_MODE_FILTER failed: {error}{note}"),
            SECCOMP_BREAKS,
            "use a kernel built with CONFIG_SECCOMP_FILTER=y; inside a container, allow the \
             seccomp and prctl syscalls",
        ),
    };
    let filter_check = filter_check.with_facts(json!({ "inherited_filters": inherited }));
    vec![actions_check, filter_check]
}

/// `unified` (v2 only), `hybrid` (v1 controllers and a v2 mount) or `legacy` (v1 only).
fn cgroup_layout() -> Option<&'static str> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let unified = text.lines().any(|l| l.starts_with("0::"));
    let legacy = text.lines().any(|l| !l.starts_with("0::") && !l.is_empty());
    Some(match (unified, legacy) {
        (true, false) => "unified (v2 only)",
        (true, true) => "hybrid (v1 controllers, v2 mounted)",
        _ => "legacy (v1 only)",
    })
}

/// Controllers the kernel has enabled, from /proc/cgroups.
fn enabled_controllers() -> Option<Vec<String>> {
    let text = std::fs::read_to_string("/proc/cgroups").ok()?;
    Some(
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let fields: Vec<&str> = l.split_whitespace().collect();
                (fields.get(3) == Some(&"1")).then(|| fields.first().map(|s| s.to_string()))?
            })
            .collect(),
    )
}

/// The cgroup checks, and the detected parent for the sandbox check to reuse (on v2,
/// detection moves this process into a leaf, which must happen once).
fn check_cgroups() -> (Vec<Check>, Option<CgroupParent>) {
    let mut checks = Vec::new();
    const TITLE: &str = "cgroup version";
    let layout = cgroup_layout().unwrap_or("unknown (/proc/self/cgroup unreadable)");
    let parent = match CgroupParent::detect() {
        Ok(parent) => {
            let dirs: Vec<String> = parent
                .dirs()
                .iter()
                .map(|d| d.display().to_string())
                .collect();
            checks.push(
                Check::ok(
                    "cgroup.version",
                    TITLE,
                    format!(
                        "{layout}; worker cgroups use {} under {}",
                        parent.version(),
                        dirs.join(", ")
                    ),
                )
                .with_facts(json!({
                    "layout": layout,
                    "version": parent.version(),
                    "parent_dirs": dirs,
                })),
            );
            Some(parent)
        }
        Err(error) => {
            checks.push(
                Check::problem(
                    "cgroup.version",
                    TITLE,
                    Status::Fail,
                    format!(
                        "{layout}; no usable parent for worker cgroups: {}",
                        without_fix_hint(&error.to_string())
                    ),
                    CGROUP_BREAKS,
                    CGROUP_FIX,
                )
                .with_facts(json!({ "layout": layout, "version": null })),
            );
            None
        }
    };

    const CONTROLLERS_TITLE: &str = "cgroup controllers";
    let enabled = enabled_controllers().unwrap_or_default();
    let has = |name: &str| enabled.iter().any(|c| c == name);
    let missing: Vec<&str> = ["memory", "pids"].into_iter().filter(|c| !has(c)).collect();
    let cpu_note = match &parent {
        Some(p) if p.supports_cpu_quota() => "cpu available to workers",
        Some(_) => {
            "no cpu controller for workers (not needed: CPU time is limited with \
                    RLIMIT_CPU)"
        }
        None => "cpu: unknown",
    };
    let facts = json!({
        "memory": has("memory"),
        "pids": has("pids"),
        "cpu": has("cpu"),
        "cpu_for_workers": parent.as_ref().map(CgroupParent::supports_cpu_quota),
    });
    checks.push(if missing.is_empty() {
        Check::ok(
            "cgroup.controllers",
            CONTROLLERS_TITLE,
            format!("memory, pids enabled; {cpu_note}"),
        )
        .with_facts(facts)
    } else {
        Check::problem(
            "cgroup.controllers",
            CONTROLLERS_TITLE,
            Status::Fail,
            format!("not enabled: {}; {cpu_note}", missing.join(", ")),
            CGROUP_BREAKS,
            "use a kernel with CONFIG_MEMCG and CONFIG_CGROUP_PIDS, and remove \
             cgroup_disable= from the kernel command line",
        )
        .with_facts(facts)
    });

    const CREATE_TITLE: &str = "worker cgroup create/remove";
    checks.push(match &parent {
        None => Check::problem(
            "cgroup.create",
            CREATE_TITLE,
            Status::Fail,
            "skipped: no cgroup parent (see above)",
            CGROUP_BREAKS,
            CGROUP_FIX,
        ),
        Some(parent) => probe_worker_cgroup(parent),
    });
    (checks, parent)
}

/// Creates a worker cgroup with the default profile's limits where a worker's would go,
/// then removes it. Its name is a supervisor's worker cgroup name, so a later supervisor
/// sweeps it away should this process die in between.
fn probe_worker_cgroup(parent: &CgroupParent) -> Check {
    const TITLE: &str = "worker cgroup create/remove";
    let name = airlock::cgroup::worker_cgroup_name(u64::from(u32::MAX));
    let limits = CgroupLimits {
        memory_bytes: airlock_policy::validate::defaults::MEMORY_BYTES,
        pids: airlock_policy::validate::defaults::PIDS,
        cpu_quota: None,
    };
    let cgroup = match parent.create_worker_cgroup(&name, &limits) {
        Ok(cgroup) => cgroup,
        Err(error) => {
            return Check::problem(
                "cgroup.create",
                TITLE,
                Status::Fail,
                format!("cannot create {name}: {}", error_chain(&error)),
                CGROUP_BREAKS,
                CGROUP_FIX,
            );
        }
    };
    let paths: Vec<String> = cgroup
        .paths()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let swap_accounted = cgroup.paths().iter().any(|p| {
        p.join("memory.memsw.limit_in_bytes").exists() || p.join("memory.swap.max").exists()
    });
    let version = cgroup.version();
    let facts = json!({ "paths": paths, "version": version, "swap_accounting": swap_accounted });
    match cgroup.remove() {
        Ok(()) => Check::ok(
            "cgroup.create",
            TITLE,
            format!(
                "created and removed {} ({version}; memory and pids limits written; swap {})",
                paths.join(", "),
                if swap_accounted {
                    "accounted and forbidden"
                } else if version == CgroupVersion::V1 {
                    "not accounted, swappiness 0"
                } else {
                    "not accounted"
                }
            ),
        )
        .with_facts(facts),
        Err(error) => Check::problem(
            "cgroup.create",
            TITLE,
            Status::Warn,
            format!(
                "created {} but could not remove it: {}",
                paths.join(", "),
                error_chain(&error)
            ),
            "worker cgroups may be left behind after calls",
            "remove the directory by hand (rmdir) and check that nothing else writes there",
        )
        .with_facts(facts),
    }
}

/// Starts a real sandbox in the embedded default profile running `/bin/true`.
fn check_default_sandbox(parent: Option<CgroupParent>) -> Check {
    const TITLE: &str = "default profile sandbox";
    let breaks = "`airlock exec` and `airlock run` with the default policy";
    let result = run_true_in_default_profile(parent);
    let result = match result {
        Ok(result) => result,
        Err(error) => {
            return Check::problem(
                "sandbox.default",
                TITLE,
                Status::Fail,
                format!("cannot start the supervisor: {error:#}"),
                breaks,
                "fix the failed checks above; RUST_LOG=airlock=debug shows each step",
            );
        }
    };
    // An ok result always ran in a worker; the default only spares an unwrap.
    let isolation = &result.isolation.clone().unwrap_or_default();
    let facts = json!({
        "ok": result.ok,
        "duration_ms": result.duration_ms,
        "error": result.error,
        "isolation": isolation,
    });
    if result.ok {
        let seccomp = isolation
            .seccomp
            .as_deref()
            .map_or("none".to_string(), |d| {
                format!("filter {}", d.get(..12).unwrap_or(d))
            });
        Check::ok(
            "sandbox.default",
            TITLE,
            format!(
                "ran /bin/true in {} ms: namespaces {}; Landlock ABI {} ({}); seccomp {}; \
                 cgroup {}; memory {}, {} processes",
                result.duration_ms,
                isolation.namespaces.join(", "),
                isolation.landlock_abi,
                serde_json::to_value(isolation.landlock)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                seccomp,
                isolation.cgroup.as_deref().unwrap_or("none"),
                units::format_size(isolation.limits.memory_bytes),
                isolation.limits.pids,
            ),
        )
        .with_facts(facts)
    } else {
        let what = match &result.error {
            Some(error) => format!(
                "{}{}: {}",
                serde_json::to_value(error.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                error
                    .step
                    .as_deref()
                    .map(|s| format!(" at step {s}"))
                    .unwrap_or_default(),
                error.message
            ),
            None => "failed without an error".into(),
        };
        Check::problem(
            "sandbox.default",
            TITLE,
            Status::Fail,
            format!("/bin/true failed: {what}"),
            breaks,
            "fix the failed checks above; RUST_LOG=airlock=debug shows each step",
        )
        .with_facts(facts)
    }
}

fn run_true_in_default_profile(parent: Option<CgroupParent>) -> anyhow::Result<ToolResult> {
    let text = presets::preset_text(presets::DEFAULT_PRESET)
        .ok_or_else(|| anyhow::anyhow!("the default preset is not embedded"))?;
    let loaded = load_policy_str(text, &format!("preset:{}", presets::DEFAULT_PRESET))?;
    let profile = loaded
        .policy
        .profiles
        .get(airlock_policy::validate::defaults::PROFILE)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("the default preset has no default profile"))?;
    // A healthy sandbox runs /bin/true in well under a second; do not wait 30 s for a
    // broken one.
    let timeout = profile.limits.timeout.min(Duration::from_secs(10));
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let supervisor = Supervisor::start(SupervisorOptions {
            cgroup_parent: parent,
            ..crate::supervisor_options()
        })?;
        let run = SandboxRun {
            call_id: "doctor".into(),
            tool: "exec".into(),
            profile: Arc::clone(&profile),
            argv: vec!["/bin/true".into()],
            stdin: Vec::new(),
            arguments_json: "{}".into(),
            timeout,
            inherit_stdio: None,
            builtin: None,
        };
        let result = supervisor.run(run, None).await;
        supervisor.close().await;
        anyhow::Ok(result)
    })
}

/// A cgroup error's message without its own "; fix: ..." tail (the check has its fix).
fn without_fix_hint(message: &str) -> &str {
    message.split("; fix: ").next().unwrap_or(message)
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// Runs `probe` in a forked child that exits 0 right after it succeeds; the probe's error
/// (an errno) comes back as the `Err` of this function. Never execs anything.
fn run_probe_child(probe: fn() -> io::Result<()>) -> io::Result<()> {
    // Never executed: the child ends in the pre_exec hook.
    let mut command = std::process::Command::new("/bin/true");
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: the hook runs in the forked child, where only async-signal-safe work is
    // allowed: `probe` makes raw syscalls on stack data (no allocation, no locks), and the
    // child then ends with _exit, never returning into the copy of this process's state.
    // An error is handed back by std through its close-on-exec pipe as the spawn error.
    unsafe {
        command.pre_exec(move || {
            probe()?;
            exit_child_now()
        });
    }
    let mut child = command.spawn()?;
    let status = child.wait()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "the probe child ended with {status}"
        )))
    }
}

/// Ends a forked probe child at once, with status 0.
fn exit_child_now() -> ! {
    // SAFETY: _exit ends the process without running atexit handlers or destructors, which
    // belong to the parent; it is async-signal-safe.
    unsafe { libc::_exit(0) }
}

/// unshare(2) of the calling (forked, single-threaded) process.
fn unshare_namespaces(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes a flag word only and reads no memory of ours.
    if unsafe { libc::unshare(flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets no_new_privs and installs a one-instruction filter that allows every syscall: it
/// changes nothing, but tells whether the kernel accepts SECCOMP_SET_MODE_FILTER.
fn install_allow_all_seccomp_filter() -> io::Result<()> {
    let mut filter = [libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ALLOW,
    }];
    let program = libc::sock_fprog {
        len: 1,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `program` points at `filter`; both live on this stack frame for the whole
    // call, and the kernel copies the program before returning.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as libc::c_uint,
            &program as *const libc::sock_fprog,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_parse_to_major_and_minor() {
        assert_eq!(parse_kernel_release("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(parse_kernel_release("5.4.0-150-generic"), Some((5, 4)));
        assert_eq!(parse_kernel_release("6.1"), Some((6, 1)));
        assert_eq!(parse_kernel_release("garbage"), None);
    }

    #[test]
    fn human_report_indents_breaks_and_fix_under_the_check() {
        let report = Report {
            ok: false,
            summary: "no".into(),
            checks: vec![
                Check::ok("a", "first", "fine"),
                Check::problem("b", "second", Status::Fail, "bad", "it", "do this"),
            ],
        };
        let text = render_report(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("ok    first"), "{text}");
        assert!(lines[1].starts_with("FAIL  second"), "{text}");
        assert_eq!(lines[2], "        breaks: it");
        assert_eq!(lines[3], "        fix:    do this");
    }
}
