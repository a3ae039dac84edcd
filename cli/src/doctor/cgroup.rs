//! cgroups: the layout, the parent for worker cgroups, the memory and pids controllers,
//! and a worker cgroup created and removed where a worker's would go.

use airlock::cgroup::{CgroupLimits, CgroupParent, CgroupVersion};
use serde_json::json;

use super::{Check, Status};

const CGROUP_BREAKS: &str = "profiles with require.cgroup = \"required\" (the default) refuse \
to run; best_effort profiles run without memory and process limits";
const CGROUP_FIX: &str = "run airlock as root, or give it a delegated cgroup: on cgroup v2 \
start it under `systemd-run --user --scope -p Delegate=yes`, on v1 chown a directory in the \
memory and pids hierarchies to its user";

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
pub(super) fn check_cgroups() -> (Vec<Check>, Option<CgroupParent>) {
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
