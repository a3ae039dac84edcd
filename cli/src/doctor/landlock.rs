//! Landlock: the ABI the kernel answers with, and whether it is among the active LSMs.

use serde_json::json;

use super::host::read_trimmed;
use super::{Check, Status};

const LANDLOCK_BREAKS: &str = "profiles with require.landlock = \"required\" (the default) \
refuse to run; best_effort profiles run without Landlock's file and TCP rules (the mount \
namespace still hides the host)";

pub(super) fn check_landlock() -> Vec<Check> {
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
