//! User namespaces: the sysctls and AppArmor switch that restrict them, then a probe that
//! creates one with the worker's other namespaces inside it.

use std::io;

use serde_json::json;

use super::host::{has_cap_sys_admin, read_trimmed};
use super::probe::{run_probe_child, unshare_namespaces};
use super::{Check, Status};

const USERNS_BREAKS: &str = "every sandbox: each worker starts in a fresh user namespace that \
owns its mount, pid, net, ipc, uts and cgroup namespaces";

/// The namespaces every worker gets besides its user namespace (supervisor/src/sys.rs).
const INNER_NAMESPACES: libc::c_int = libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP;

pub(super) fn check_user_namespaces() -> Vec<Check> {
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
