//! Containers: whether airlock runs inside one, and which of the container's settings keep
//! sandboxes from working there. Container runtimes confine their processes with the same
//! features airlock builds sandboxes from, so the fix is a runtime setting, named per
//! runtime.
//!
//! The facts are gathered once ([`gather`]); what they mean is decided by [`classify`], a
//! pure function the unit tests drive with the facts of real runtimes.

use std::io;

use serde_json::json;

use super::probe::{
    mount_in_new_namespace, run_probe_child, set_hostname_in_new_uts, unshare_namespaces,
};
use super::{Check, Status};

/// What doctor saw of its surroundings; everything [`classify`] looks at.
#[derive(Debug, Clone, Default)]
pub(super) struct ContainerFacts {
    /// `/run/.containerenv` exists (podman and CRI-O write it).
    pub containerenv: bool,
    /// `/.dockerenv` exists.
    pub dockerenv: bool,
    /// `container=` in PID 1's environment (podman, systemd-nspawn, LXC set it).
    pub container_var: Option<String>,
    /// `KUBERNETES_SERVICE_HOST` is set: a pod.
    pub kubernetes: bool,
    /// /proc/self/cgroup.
    pub self_cgroup: String,
    /// /proc/self/mountinfo.
    pub mountinfo: String,
    /// Seccomp filters this process already runs under (the runtime's profile).
    pub seccomp_filters: u32,
    /// no_new_privs is already set.
    pub no_new_privs: bool,
    /// unshare(CLONE_NEWUSER) in a child: `None` worked, else the errno.
    pub userns_errno: Option<i32>,
    /// sethostname in a fresh user and uts namespace: `None` worked, else the errno. Every
    /// worker names its host, and runtimes' seccomp profiles refuse it.
    pub hostname_errno: Option<i32>,
    /// A tmpfs mounted in a fresh user and mount namespace: `None` worked, else the errno.
    /// AppArmor profiles of runtimes deny mount.
    pub mount_errno: Option<i32>,
    /// This process's AppArmor profile (`docker-default (enforce)`), if AppArmor says.
    pub apparmor: Option<String>,
}

/// The runtime a container belongs to, as far as its markers tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Runtime {
    Podman,
    Docker,
    Kubernetes,
    Other,
}

impl Runtime {
    fn name(self) -> &'static str {
        match self {
            Runtime::Podman => "podman",
            Runtime::Docker => "docker",
            Runtime::Kubernetes => "kubernetes",
            Runtime::Other => "a container runtime",
        }
    }
}

/// Reads the facts; runs two probes in forked children.
pub(super) fn gather() -> ContainerFacts {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let container_var = std::fs::read("/proc/1/environ").ok().and_then(|env| {
        env.split(|b| *b == 0)
            .find_map(|var| var.strip_prefix(b"container="))
            .map(|value| String::from_utf8_lossy(value).into_owned())
    });
    let status = read("/proc/self/status");
    let field = |name: &str| {
        status.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key == name).then(|| value.trim().to_string())
        })
    };
    let errno = |result: io::Result<()>| result.err().map(|e| e.raw_os_error().unwrap_or(0));
    ContainerFacts {
        containerenv: std::path::Path::new("/run/.containerenv").exists(),
        dockerenv: std::path::Path::new("/.dockerenv").exists(),
        container_var,
        kubernetes: std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
        self_cgroup: read("/proc/self/cgroup"),
        mountinfo: read("/proc/self/mountinfo"),
        seccomp_filters: field("Seccomp_filters")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| u32::from(field("Seccomp").as_deref() == Some("2"))),
        no_new_privs: field("NoNewPrivs").as_deref() == Some("1"),
        userns_errno: errno(run_probe_child(|| unshare_namespaces(libc::CLONE_NEWUSER))),
        hostname_errno: errno(run_probe_child(set_hostname_in_new_uts)),
        mount_errno: errno(run_probe_child(mount_in_new_namespace)),
        // The AppArmor-only file (Linux 5.8+): /proc/self/attr/current may be SELinux's.
        apparmor: std::fs::read_to_string("/proc/self/attr/apparmor/current")
            .ok()
            .map(|text| text.trim_end_matches(['\0', '\n']).trim().to_string())
            .filter(|text| !text.is_empty()),
    }
}

/// The runtime and the markers that gave it away; `None` outside a container.
pub(super) fn detect(facts: &ContainerFacts) -> Option<(Runtime, Vec<String>)> {
    let mut evidence = Vec::new();
    if facts.containerenv {
        evidence.push("/run/.containerenv".to_string());
    }
    if facts.dockerenv {
        evidence.push("/.dockerenv".to_string());
    }
    if let Some(value) = &facts.container_var {
        evidence.push(format!("container={value} in PID 1's environment"));
    }
    const CGROUP_MARKERS: [&str; 6] = ["kubepods", "libpod", "docker", "containerd", "crio", "lxc"];
    let cgroup_marker = facts.self_cgroup.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        CGROUP_MARKERS
            .iter()
            .find(|marker| path.contains(*marker))
            .map(|marker| (*marker, path.to_string()))
    });
    if let Some((_, path)) = &cgroup_marker {
        evidence.push(format!("cgroup {path}"));
    }
    if facts.kubernetes {
        evidence.push("KUBERNETES_SERVICE_HOST set".to_string());
    }
    if evidence.is_empty() {
        return None;
    }
    if root_fs_type(&facts.mountinfo).as_deref() == Some("overlay") {
        evidence.push("overlay root filesystem".to_string());
    }
    let marker = cgroup_marker.map(|(m, _)| m);
    let runtime = if facts.kubernetes || marker == Some("kubepods") {
        Runtime::Kubernetes
    } else if facts.containerenv
        || facts.container_var.as_deref() == Some("podman")
        || marker == Some("libpod")
    {
        Runtime::Podman
    } else if facts.dockerenv || marker == Some("docker") {
        Runtime::Docker
    } else {
        Runtime::Other
    };
    Some((runtime, evidence))
}

/// One line of /proc/self/mountinfo: where it is mounted, its per-mount options, its type.
struct Mount<'a> {
    point: String,
    options: &'a str,
    fstype: &'a str,
}

fn mounts(mountinfo: &str) -> impl Iterator<Item = Mount<'_>> {
    mountinfo.lines().filter_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let fields: Vec<&str> = before.split(' ').collect();
        Some(Mount {
            point: unescape_octal(fields.get(4)?),
            options: fields.get(5)?,
            fstype: after.split(' ').next()?,
        })
    })
}

/// mountinfo writes space, tab, newline and backslash in paths as `\ooo`.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|digits| {
            let text = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn root_fs_type(mountinfo: &str) -> Option<String> {
    mounts(mountinfo)
        .filter(|m| m.point == "/")
        .last()
        .map(|m| m.fstype.to_string())
}

/// The mounts over entries of /proc. The kernel lets a process in a user namespace mount a
/// new proc only when the proc it sees is not covered anywhere (except on the permanently
/// empty directories it makes for that, like binfmt_misc's), so one such mount stops
/// every sandbox at `mount proc /proc: EPERM`.
pub(super) fn proc_covers(mountinfo: &str) -> Vec<String> {
    mounts(mountinfo)
        .filter(|m| m.point.starts_with("/proc/") && m.point != "/proc/sys/fs/binfmt_misc")
        .map(|m| m.point)
        .collect()
}

/// Whether every cgroup hierarchy under /sys/fs/cgroup is mounted read-only (`None` when
/// none is mounted): what runtimes give unprivileged containers.
pub(super) fn cgroup_read_only(mountinfo: &str) -> Option<bool> {
    let mut any = false;
    let mut all_ro = true;
    for mount in mounts(mountinfo).filter(|m| {
        matches!(m.fstype, "cgroup" | "cgroup2") && m.point.starts_with("/sys/fs/cgroup")
    }) {
        any = true;
        all_ro &= mount.options.split(',').any(|o| o == "ro");
    }
    any.then_some(all_ro)
}

/// Only a v2 hierarchy (`0::` alone in /proc/self/cgroup).
fn cgroup_v2_only(self_cgroup: &str) -> bool {
    let mut lines = self_cgroup.lines().filter(|l| !l.is_empty());
    lines.clone().all(|l| l.starts_with("0::")) && lines.next().is_some()
}

const UNMASK_PROC: [(Runtime, &str); 4] = [
    (Runtime::Podman, "podman run --security-opt unmask=/proc/*"),
    (
        Runtime::Docker,
        "docker run --security-opt systempaths=unconfined",
    ),
    (
        Runtime::Kubernetes,
        "securityContext.procMount: Unmasked (with hostUsers: false)",
    ),
    (
        Runtime::Other,
        "start the container without masked or read-only paths under /proc",
    ),
];

fn for_runtime(table: &[(Runtime, &'static str)], runtime: Runtime) -> &'static str {
    table
        .iter()
        .find(|(r, _)| *r == runtime)
        .or_else(|| table.last())
        .map_or("", |(_, text)| text)
}

fn seccomp_fix(runtime: Runtime) -> &'static str {
    match runtime {
        Runtime::Podman => {
            "podman run --security-opt seccomp=unconfined (or a profile that also allows \
             sethostname and setdomainname); airlock installs its own filter in every sandbox"
        }
        Runtime::Docker => {
            "docker run --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
             (Docker's default profile also refuses unshare, mount and namespace flags to \
             clone); airlock installs its own filter in every sandbox"
        }
        Runtime::Kubernetes => {
            "securityContext.seccompProfile.type: Unconfined and \
             securityContext.appArmorProfile.type: Unconfined; airlock installs its own \
             filter in every sandbox"
        }
        Runtime::Other => {
            "run the container without a seccomp profile (or with one that allows unshare, \
             mount, sethostname and setdomainname) and without an AppArmor profile that \
             denies mount"
        }
    }
}

fn cgroup_fix(runtime: Runtime, v2: bool) -> &'static str {
    match (runtime, v2) {
        (Runtime::Podman, true) => {
            "podman run --cgroupns=private --security-opt unmask=/sys/fs/cgroup (a writable \
             cgroup namespace of the container's own)"
        }
        (Runtime::Podman, false) | (Runtime::Docker, false) => {
            "cgroup v1 has no delegation to containers: bind the hierarchy writable, \
             -v /sys/fs/cgroup:/sys/fs/cgroup:rw (or --privileged); workers' cgroups still go \
             beneath the container's own"
        }
        (Runtime::Docker, true) => {
            "docker run --privileged, or bind the hierarchy writable \
             (-v /sys/fs/cgroup:/sys/fs/cgroup:rw); workers' cgroups go beneath the \
             container's own"
        }
        (Runtime::Kubernetes, _) => {
            "securityContext.privileged: true (Kubernetes mounts cgroups read-only in every \
             other container), or set require.cgroup = \"best_effort\" in the policy's \
             profiles and lose per-call memory and process limits"
        }
        (Runtime::Other, _) => {
            "give the container a writable cgroup of its own (a delegated cgroup namespace), \
             or set require.cgroup = \"best_effort\""
        }
    }
}

const PROC_BREAKS: &str = "every sandbox: each worker mounts a fresh /proc for its pid \
namespace, and the kernel refuses it (mount proc /proc: EPERM)";

/// What the facts mean: a check naming the container, then one per container setting that
/// keeps sandboxes from working, each with the runtime's own words for the fix. The /proc
/// check runs outside containers too (systemd's ProtectProc and friends cover /proc the
/// same way).
pub(super) fn classify(facts: &ContainerFacts) -> Vec<Check> {
    let detected = detect(facts);
    let covers = proc_covers(&facts.mountinfo);
    let mut checks = Vec::new();

    let Some((runtime, evidence)) = detected else {
        checks.push(
            Check::ok("container", "container", "not in a container")
                .with_facts(json!({ "in_container": false })),
        );
        checks.push(proc_check(&covers, None));
        return checks;
    };
    let nnp = if facts.no_new_privs {
        "; no_new_privs is set (fine: airlock sets it on every worker)"
    } else {
        ""
    };
    checks.push(
        Check::ok(
            "container",
            "container",
            format!(
                "in a container ({}): {}{nnp}",
                runtime.name(),
                evidence.join(", ")
            ),
        )
        .with_facts(json!({
            "in_container": true,
            "runtime": runtime.name(),
            "evidence": evidence,
            "seccomp_filters": facts.seccomp_filters,
            "no_new_privs": facts.no_new_privs,
        })),
    );
    checks.push(proc_check(&covers, Some(runtime)));

    const CGROUP_TITLE: &str = "container cgroup";
    checks.push(match cgroup_read_only(&facts.mountinfo) {
        Some(true) => Check::problem(
            "container.cgroup",
            CGROUP_TITLE,
            Status::Fail,
            "the container's cgroup hierarchies are mounted read-only: no worker cgroups",
            "profiles with require.cgroup = \"required\" (the default) refuse to run; \
             best_effort profiles run without memory and process limits",
            cgroup_fix(runtime, cgroup_v2_only(&facts.self_cgroup)),
        ),
        Some(false) => Check::ok(
            "container.cgroup",
            CGROUP_TITLE,
            "a cgroup hierarchy is mounted writable (see the cgroup checks)",
        ),
        None => Check::problem(
            "container.cgroup",
            CGROUP_TITLE,
            Status::Fail,
            "no cgroup hierarchy is mounted under /sys/fs/cgroup",
            "profiles with require.cgroup = \"required\" (the default) refuse to run",
            cgroup_fix(runtime, cgroup_v2_only(&facts.self_cgroup)),
        ),
    });

    const SECCOMP_TITLE: &str = "container seccomp";
    let filtered = if facts.seccomp_filters > 0 {
        format!(
            "under the container's seccomp profile ({} filter(s))",
            facts.seccomp_filters
        )
    } else {
        "under no seccomp filter".to_string()
    };
    checks.push(match (facts.userns_errno, facts.hostname_errno) {
        (Some(errno), _) => Check::problem(
            "container.seccomp",
            SECCOMP_TITLE,
            Status::Fail,
            format!(
                "{filtered}, creating a user namespace fails ({})",
                io::Error::from_raw_os_error(errno)
            ),
            "every sandbox: each worker starts in a fresh user namespace",
            if facts.seccomp_filters > 0 {
                seccomp_fix(runtime).to_string()
            } else {
                format!(
                    "{}; if user.max_user_namespaces is 0 in the container, raise it on the \
                     host (the user namespace check above says more)",
                    seccomp_fix(runtime)
                )
            },
        ),
        (None, Some(errno)) => Check::problem(
            "container.seccomp",
            SECCOMP_TITLE,
            Status::Fail,
            format!(
                "{filtered}, sethostname in a fresh user and uts namespace fails ({})",
                io::Error::from_raw_os_error(errno)
            ),
            "every sandbox: each worker names its own host (sandbox set-up failed at \
             hostname: EPERM)",
            seccomp_fix(runtime),
        ),
        (None, None) => Check::ok(
            "container.seccomp",
            SECCOMP_TITLE,
            format!("{filtered}, a fresh user namespace can name its host"),
        ),
    });
    checks.push(mount_check(facts, runtime));
    checks
}

fn apparmor_fix(runtime: Runtime) -> &'static str {
    match runtime {
        Runtime::Podman => "podman run --security-opt apparmor=unconfined",
        Runtime::Docker => "docker run --security-opt apparmor=unconfined",
        Runtime::Kubernetes => "securityContext.appArmorProfile.type: Unconfined",
        Runtime::Other => "run the container without an AppArmor or SELinux policy denying mount",
    }
}

/// Whether a fresh user and mount namespace can mount, as every worker's root is built.
fn mount_check(facts: &ContainerFacts, runtime: Runtime) -> Check {
    const TITLE: &str = "container mounts";
    let profile = facts.apparmor.as_deref().map_or_else(
        || "no AppArmor profile".to_string(),
        |p| format!("AppArmor profile {p}"),
    );
    let facts_json = json!({ "apparmor": facts.apparmor, "mount_errno": facts.mount_errno });
    let breaks = "every sandbox: each worker builds its root from mounts in its own mount \
                  namespace";
    match (facts.userns_errno, facts.mount_errno) {
        (Some(_), _) => Check::problem(
            "container.mount",
            TITLE,
            Status::Warn,
            format!("{profile}; not probed: no user namespace (see container seccomp)"),
            breaks,
            apparmor_fix(runtime),
        ),
        (None, Some(errno)) => Check::problem(
            "container.mount",
            TITLE,
            Status::Fail,
            format!(
                "{profile}; mounting a tmpfs in a fresh user and mount namespace fails ({})",
                io::Error::from_raw_os_error(errno)
            ),
            breaks,
            apparmor_fix(runtime),
        ),
        (None, None) => Check::ok(
            "container.mount",
            TITLE,
            format!("{profile}; a fresh user and mount namespace can mount"),
        ),
    }
    .with_facts(facts_json)
}

fn proc_check(covers: &[String], runtime: Option<Runtime>) -> Check {
    const TITLE: &str = "fully visible /proc";
    let facts = json!({ "covered": covers });
    if covers.is_empty() {
        return Check::ok(
            "proc.visible",
            TITLE,
            "nothing is mounted over /proc's entries",
        )
        .with_facts(facts);
    }
    let shown: Vec<&str> = covers.iter().take(4).map(String::as_str).collect();
    let more = covers.len().saturating_sub(shown.len());
    let detail = format!(
        "{} mount(s) cover /proc: {}{}",
        covers.len(),
        shown.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    );
    let fix = match runtime {
        Some(runtime) => for_runtime(&UNMASK_PROC, runtime),
        None => {
            "remove the mounts over /proc (systemd: drop ProtectKernelTunables, \
             ProtectKernelLogs, ProtectProc and ProcSubset from the unit)"
        }
    };
    Check::problem(
        "proc.visible",
        TITLE,
        Status::Fail,
        detail,
        PROC_BREAKS,
        fix,
    )
    .with_facts(facts)
}

#[cfg(test)]
#[path = "container_tests.rs"]
mod tests;
