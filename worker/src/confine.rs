//! The confinement recipe: the worker confines itself, step by step, in this order.
//!
//! When this runs the worker is already PID 1 of fresh user, mount, pid, net, ipc, uts and
//! cgroup namespaces (the supervisor's clone flags; the cgroup one rooted at the worker's
//! own cgroup, so `/proc/self/cgroup` reads `/`), uid 0 inside its user namespace with
//! every capability *there*, and mapped to an unprivileged host uid (the supervisor wrote
//! the uid/gid maps before letting it exec). Each step below says why it sits where it is.

use std::os::fd::RawFd;

use airlock_protocol::{
    AppliedIsolation, NetworkMode, Requirement, RootSource, SandboxSpec, SetupFailure,
};
use caps::CapSet;
use nix::sys::resource::{Resource, setrlimit};

use crate::landlock::{LandlockError, apply_landlock_to_current_process};
use crate::mounts::{build_root_filesystem, finish_template_root};
use crate::sys;

/// How long each confinement step took, for `RUST_LOG=debug` in the supervisor.
#[derive(Debug)]
pub struct StepTimings {
    last: std::time::Instant,
    steps: Vec<(&'static str, u128)>,
}

impl Default for StepTimings {
    fn default() -> Self {
        Self {
            last: std::time::Instant::now(),
            steps: Vec::new(),
        }
    }
}

impl StepTimings {
    /// Records the time since the previous mark under `step`.
    pub fn mark(&mut self, step: &'static str) {
        let now = std::time::Instant::now();
        self.steps
            .push((step, now.duration_since(self.last).as_micros()));
        self.last = now;
    }

    /// `step=µs` pairs, in order.
    pub fn summary(&self) -> String {
        self.steps
            .iter()
            .map(|(s, us)| format!("{s}={us}us"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The namespaces the supervisor creates for every worker.
pub const NAMESPACES: [&str; 7] = ["user", "mnt", "pid", "net", "ipc", "uts", "cgroup"];

/// A failed confinement step, reported to the supervisor as `SetupFailed`.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {message}")]
pub struct ConfineError {
    /// The step that failed.
    pub step: &'static str,
    /// What went wrong.
    pub message: String,
    /// The errno, if any.
    pub errno: Option<i32>,
    /// A required kernel feature is missing (→ `sandbox_unavailable`).
    pub feature_missing: bool,
}

impl ConfineError {
    fn at(step: &'static str, error: impl std::fmt::Display, errno: Option<i32>) -> Self {
        Self {
            step,
            message: error.to_string(),
            errno,
            feature_missing: false,
        }
    }
}

impl From<ConfineError> for SetupFailure {
    fn from(e: ConfineError) -> Self {
        SetupFailure {
            step: e.step.to_string(),
            message: e.message,
            errno: e.errno,
            feature_missing: e.feature_missing,
        }
    }
}

fn io_errno(e: &std::io::Error) -> Option<i32> {
    e.raw_os_error()
}

/// Confines the calling worker process according to `spec`. `keep_fd` is the protocol
/// socket; stdio (0, 1, 2) is kept for the tool.
pub fn confine_worker(
    spec: &SandboxSpec,
    keep_fd: RawFd,
    timings: &mut StepTimings,
) -> Result<AppliedIsolation, ConfineError> {
    // 1. Sanity: PID 1 of our own pid namespace, or killing us would not kill the tool tree.
    if std::process::id() != 1 {
        return Err(ConfineError::at(
            "namespaces",
            "worker is not PID 1 of a fresh pid namespace",
            None,
        ));
    }

    // 1b. A session of our own, with no controlling terminal. Every tool we start
    //     inherits it, so none has a terminal to push keystrokes into (TIOCSTI) even when
    //     its stdio is the caller's terminal, and none can acquire one by opening a tty
    //     (only a session leader can; the built-ins, which run in this process, open files
    //     with O_NOCTTY). Once here rather than per tool: with scheduler autogroups on
    //     (Debian's default) setsid also makes one, 16 µs on each warm call's critical
    //     path when it ran per tool.
    sys::new_session().map_err(|e| ConfineError::at("session", &e, io_errno(&e)))?;

    timings.mark("session");
    // 2. Mounts first: they need CAP_SYS_ADMIN in our mount namespace and the host root
    //    still reachable as the source of binds (and of the "fully visible /proc" check),
    //    or, for a worker cloned from its profile's template, that template's root.
    let mounted = match spec.root {
        RootSource::Build => build_root_filesystem(&spec.mounts),
        RootSource::Template => finish_template_root(&spec.mounts),
    };
    mounted.map_err(|e| {
        let errno = e.errno();
        ConfineError::at("mount", e, errno)
    })?;

    timings.mark("mount");
    // 3. Hostname: needs CAP_SYS_ADMIN in our UTS namespace, so before dropping caps.
    nix::unistd::sethostname(&spec.hostname)
        .map_err(|e| ConfineError::at("hostname", e, Some(e as i32)))?;

    timings.mark("hostname");
    // 4. Network: bringing loopback up needs CAP_NET_ADMIN in our network namespace. With
    //    "none" the namespace keeps only a down loopback: no interface at all works.
    if spec.network == NetworkMode::Loopback {
        sys::bring_loopback_up().map_err(|e| ConfineError::at("network", &e, io_errno(&e)))?;
    }

    timings.mark("network");
    // 5. Resource limits: lowering needs no privilege, but set them before the tool exists.
    //    Core dumps are off: a dump could land in a writable bind with the tool's memory.
    let limit = |resource, value: u64, name: &'static str| {
        setrlimit(resource, value, value)
            .map_err(|e| ConfineError::at("rlimits", format!("{name}: {e}"), Some(e as i32)))
    };
    limit(
        Resource::RLIMIT_NOFILE,
        spec.rlimits.open_files,
        "RLIMIT_NOFILE",
    )?;
    limit(
        Resource::RLIMIT_FSIZE,
        spec.rlimits.file_size_bytes,
        "RLIMIT_FSIZE",
    )?;
    limit(Resource::RLIMIT_CORE, 0, "RLIMIT_CORE")?;
    if let Some(cpu) = spec.rlimits.cpu_seconds {
        limit(Resource::RLIMIT_CPU, cpu, "RLIMIT_CPU")?;
    }

    timings.mark("rlimits");
    // 6. Descriptors: nothing inherited may reach the tool (CVE-2024-21626 class). Keep
    //    stdio and the protocol socket, which is always the highest fd we hold.
    close_inherited_descriptors(keep_fd)?;

    timings.mark("descriptors");
    // 7. Not dumpable: tools in the sandbox cannot ptrace or read /proc/1/mem of the worker
    //    that holds the protocol socket (runc CVE-2016-9962 pattern).
    nix::sys::prctl::set_dumpable(false)
        .map_err(|e| ConfineError::at("dumpable", e, Some(e as i32)))?;

    timings.mark("dumpable");
    // 8. Capabilities: all sets emptied, bounding first (dropping it needs CAP_SETPCAP,
    //    which the later steps remove). An empty bounding set also means exec'ing as uid 0
    //    gains nothing.
    sys::drop_bounding_set().map_err(|e| {
        ConfineError::at("capabilities", format!("clear Bounding: {e}"), io_errno(&e))
    })?;
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set)
            .map_err(|e| ConfineError::at("capabilities", format!("clear {set:?}: {e}"), None))?;
    }

    timings.mark("capabilities");
    // 9. no_new_privs: no setuid or file-capability gain on exec; required by Landlock and
    //    by seccomp for an unprivileged process.
    nix::sys::prctl::set_no_new_privs()
        .map_err(|e| ConfineError::at("no_new_privs", e, Some(e as i32)))?;

    timings.mark("no_new_privs");
    // 10. Landlock: after the mounts (rules are opened on the final paths) and before
    //     seccomp (whose allowlist does not include the landlock_* set-up flow we need).
    let landlock = apply_landlock_to_current_process(&spec.landlock).map_err(|e| {
        let missing = matches!(
            e,
            LandlockError::Unavailable(_)
                | LandlockError::AbiTooOld { .. }
                | LandlockError::NotFullyEnforced(_)
        );
        ConfineError {
            step: "landlock",
            message: e.to_string(),
            errno: None,
            feature_missing: missing,
        }
    })?;

    timings.mark("landlock");
    // A network namespace shared with other workers connects nobody only while abstract
    // unix sockets are scoped to each worker's Landlock domain (ABI 6): the supervisor
    // shares one only then, and this is the check that holds it to that.
    if spec.network == NetworkMode::NoneShared && (landlock.abi < 6 || !landlock.fully_enforced) {
        return Err(ConfineError {
            step: "landlock",
            message: format!(
                "a shared network namespace needs Landlock ABI 6, fully enforced, to scope abstract unix sockets; this kernel has ABI {}",
                landlock.abi
            ),
            errno: None,
            feature_missing: true,
        });
    }
    // On the host network, abstract unix sockets of host daemons are reachable unless
    // Landlock scopes them (ABI 6, Linux 6.12); TCP is narrowed by the port rules.
    if spec.network == NetworkMode::Host
        && landlock.abi < 6
        && spec.landlock.requirement == Requirement::Required
    {
        return Err(ConfineError {
            step: "landlock",
            message: format!(
                "a profile on the host network needs Landlock ABI 6 to scope abstract unix sockets; this kernel has ABI {}",
                landlock.abi
            ),
            errno: None,
            feature_missing: true,
        });
    }

    // 11. seccomp last: everything above uses syscalls the filter refuses (mount,
    //     sethostname, ...). From here on the worker itself runs under the filter too.
    let seccomp_installed = match sys::install_seccomp_filter(&spec.seccomp.program) {
        Ok(()) => true,
        Err(e) if spec.seccomp.requirement == Requirement::BestEffort => {
            let _ = e;
            false
        }
        Err(e) => {
            return Err(ConfineError {
                step: "seccomp",
                message: format!("cannot install the seccomp filter: {e}"),
                errno: io_errno(&e),
                feature_missing: matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL) | Some(libc::ENOSYS)
                ),
            });
        }
    };

    // ...and while no socket but AF_UNIX can be made: the filter is what says so.
    if spec.network == NetworkMode::NoneShared && !seccomp_installed {
        return Err(ConfineError {
            step: "seccomp",
            message: "a shared network namespace needs the seccomp filter (AF_UNIX only)".into(),
            errno: None,
            feature_missing: true,
        });
    }

    timings.mark("seccomp");
    Ok(AppliedIsolation {
        namespaces: NAMESPACES
            .iter()
            .filter_map(|ns| match (spec.network, *ns) {
                (NetworkMode::Host, "net") => None,
                (NetworkMode::NoneShared, "net") => Some("net:shared".to_string()),
                _ => Some(ns.to_string()),
            })
            .collect(),
        landlock_abi: landlock.abi,
        landlock_fully_enforced: landlock.fully_enforced,
        seccomp_installed,
    })
}

/// Closes every descriptor but stdio and `keep_fd`.
fn close_inherited_descriptors(keep_fd: RawFd) -> Result<(), ConfineError> {
    let fail = |e: std::io::Error| ConfineError::at("descriptors", &e, e.raw_os_error());
    // The socket keeps the number it had in the supervisor; close everything above it,
    // then everything between stdio and it.
    let keep = u32::try_from(keep_fd)
        .map_err(|_| ConfineError::at("descriptors", "negative socket fd", None))?;
    sys::close_descriptors_from(keep + 1).map_err(fail)?;
    if keep > 3 {
        // One close_range, not a close per number (34 of them, nearly all EBADF, for a
        // socket at fd 37).
        sys::close_descriptor_range(3, keep - 1).map_err(fail)?;
    }
    Ok(())
}
