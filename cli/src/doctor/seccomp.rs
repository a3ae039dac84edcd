//! seccomp: the filter actions airlock's filters return, and a probe that installs a
//! filter in a child.

use serde_json::json;

use super::host::{read_trimmed, status_field};
use super::probe::{install_allow_all_seccomp_filter, run_probe_child};
use super::{Check, Status};

const SECCOMP_BREAKS: &str = "profiles with require.seccomp = \"required\" (the default) \
refuse to run; best_effort profiles run without a syscall filter";

pub(super) fn check_seccomp() -> Vec<Check> {
    // The actions airlock's filters return (policies/src/seccomp/program.rs).
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
