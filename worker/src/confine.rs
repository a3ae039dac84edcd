//! The confinement recipe: the worker confines itself, step by step, in this order.
//!
//! When this runs the worker is already PID 1 of fresh user, mount, pid, net, ipc, uts and
//! cgroup namespaces (the supervisor's clone flags; the cgroup one rooted at the worker's
//! own cgroup, so `/proc/self/cgroup` reads `/`), uid 0 inside its user namespace with
//! every capability *there*, and mapped to an unprivileged host uid (the supervisor wrote
//! the uid/gid maps before letting it exec). Each step below says why it sits where it is.

use std::os::fd::{OwnedFd, RawFd};

use airlock_protocol::{
    AppliedIsolation, NetworkMode, Requirement, RootSource, SandboxSpec, SetupFailure,
};
use caps::CapSet;
use nix::errno::Errno;
use nix::sys::resource::{Resource, getrlimit, setrlimit};

use crate::landlock::{LandlockError, apply_landlock_to_current_process};
use crate::mounts::{MountError, build_root_filesystem, finish_template_root};
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

/// A failed confinement step, named by the operation that failed. It reaches the
/// supervisor as `SetupFailed`: [`ConfineError::step`] as the step, the `Display` text as
/// the message, [`ConfineError::errno`] and [`ConfineError::feature_missing`] as they are.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// The worker is not PID 1 of its own pid namespace.
    #[error("worker is not PID 1 of a fresh pid namespace")]
    NotPidOne,
    /// setsid failed.
    #[error("{0}")]
    NewSession(std::io::Error),
    /// Building the root filesystem (or finishing a template's) failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// sethostname failed.
    #[error("{0}")]
    SetHostname(Errno),
    /// Bringing the loopback interface up failed.
    #[error("{0}")]
    LoopbackUp(std::io::Error),
    /// An egress port without a namespace of our own with loopback up.
    #[error("an egress listener needs the loopback network mode")]
    EgressNeedsLoopback,
    /// Listening on the egress port failed.
    #[error("cannot listen on 127.0.0.1:{port} for the egress proxy: {source}")]
    EgressListen {
        /// The port.
        port: u16,
        /// Why.
        source: std::io::Error,
    },
    /// setrlimit failed.
    #[error("{resource}: {errno}")]
    SetRlimit {
        /// The limit, `RLIMIT_NOFILE` and so on.
        resource: &'static str,
        /// The errno.
        errno: Errno,
    },
    /// The protocol socket's descriptor number is negative.
    #[error("negative socket fd")]
    NegativeSocketFd,
    /// close_range over the inherited descriptors failed.
    #[error("{0}")]
    CloseDescriptors(std::io::Error),
    /// Clearing the dumpable flag failed.
    #[error("{0}")]
    SetNotDumpable(Errno),
    /// Emptying the capability bounding set failed.
    #[error("clear Bounding: {0}")]
    DropBoundingSet(std::io::Error),
    /// Emptying one of the other capability sets failed.
    #[error("clear {set:?}: {error}")]
    ClearCapabilities {
        /// The set being emptied.
        set: CapSet,
        /// Why it could not be.
        error: caps::errors::CapsError,
    },
    /// Setting no_new_privs failed.
    #[error("{0}")]
    SetNoNewPrivs(Errno),
    /// Landlock could not be applied as the profile requires.
    #[error(transparent)]
    Landlock(#[from] LandlockError),
    /// A shared network namespace without Landlock fully enforced at ABI 6.
    #[error(
        "a shared network namespace needs Landlock ABI 6, fully enforced, to scope abstract unix sockets; this kernel has ABI {abi}"
    )]
    SharedNetworkNeedsLandlock {
        /// The ABI Landlock was applied at.
        abi: u32,
    },
    /// The host network for a profile requiring Landlock, below ABI 6.
    #[error(
        "a profile on the host network needs Landlock ABI 6 to scope abstract unix sockets; this kernel has ABI {abi}"
    )]
    HostNetworkNeedsLandlock {
        /// The ABI Landlock was applied at.
        abi: u32,
    },
    /// Installing the seccomp filter failed.
    #[error("cannot install the seccomp filter: {0}")]
    Seccomp(std::io::Error),
    /// A shared network namespace without the seccomp filter.
    #[error("a shared network namespace needs the seccomp filter (AF_UNIX only)")]
    SharedNetworkNeedsSeccomp,
}

impl ConfineError {
    /// The step of the recipe that failed, as the supervisor reports it (`error.step`).
    pub fn step(&self) -> &'static str {
        match self {
            Self::NotPidOne => "namespaces",
            Self::NewSession(_) => "session",
            Self::Mount(_) => "mount",
            Self::SetHostname(_) => "hostname",
            Self::LoopbackUp(_) | Self::EgressNeedsLoopback | Self::EgressListen { .. } => {
                "network"
            }
            Self::SetRlimit { .. } => "rlimits",
            Self::NegativeSocketFd | Self::CloseDescriptors(_) => "descriptors",
            Self::SetNotDumpable(_) => "dumpable",
            Self::DropBoundingSet(_) | Self::ClearCapabilities { .. } => "capabilities",
            Self::SetNoNewPrivs(_) => "no_new_privs",
            Self::Landlock(_)
            | Self::SharedNetworkNeedsLandlock { .. }
            | Self::HostNetworkNeedsLandlock { .. } => "landlock",
            Self::Seccomp(_) | Self::SharedNetworkNeedsSeccomp => "seccomp",
        }
    }

    /// The errno behind the failure, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::NewSession(e)
            | Self::LoopbackUp(e)
            | Self::EgressListen { source: e, .. }
            | Self::CloseDescriptors(e)
            | Self::DropBoundingSet(e)
            | Self::Seccomp(e) => e.raw_os_error(),
            Self::SetHostname(errno)
            | Self::SetRlimit { errno, .. }
            | Self::SetNotDumpable(errno)
            | Self::SetNoNewPrivs(errno) => Some(*errno as i32),
            Self::Mount(e) => e.errno(),
            Self::NotPidOne
            | Self::EgressNeedsLoopback
            | Self::NegativeSocketFd
            | Self::ClearCapabilities { .. }
            | Self::Landlock(_)
            | Self::SharedNetworkNeedsLandlock { .. }
            | Self::HostNetworkNeedsLandlock { .. }
            | Self::SharedNetworkNeedsSeccomp => None,
        }
    }

    /// A required kernel feature is missing (the call ends `sandbox_unavailable`).
    pub fn feature_missing(&self) -> bool {
        match self {
            Self::Landlock(e) => matches!(
                e,
                LandlockError::Unavailable(_)
                    | LandlockError::AbiTooOld { .. }
                    | LandlockError::NotFullyEnforced(_)
            ),
            Self::SharedNetworkNeedsLandlock { .. }
            | Self::HostNetworkNeedsLandlock { .. }
            | Self::SharedNetworkNeedsSeccomp => true,
            Self::Seccomp(e) => matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)),
            _ => false,
        }
    }
}

impl From<ConfineError> for SetupFailure {
    fn from(e: ConfineError) -> Self {
        SetupFailure {
            step: e.step().to_string(),
            message: e.to_string(),
            errno: e.errno(),
            feature_missing: e.feature_missing(),
        }
    }
}

/// A confined worker: what it applied, and the egress listener it made for the supervisor
/// (to pass on with `Ready`, then close).
#[derive(Debug)]
pub struct Confined {
    /// The isolation applied.
    pub applied: AppliedIsolation,
    /// Listening on `127.0.0.1:<spec.egress_port>` in the worker's network namespace.
    pub egress_listener: Option<std::net::TcpListener>,
    /// The seccomp filter's listener, for the supervisor; nothing the tool may hold.
    pub seccomp_listener: Option<OwnedFd>,
}

/// Confines the calling worker process according to `spec`. `keep_fd` is the protocol
/// socket; stdio (0, 1, 2) is kept for the tool.
pub fn confine_worker(
    spec: &SandboxSpec,
    keep_fd: RawFd,
    timings: &mut StepTimings,
) -> Result<Confined, ConfineError> {
    // 1. Sanity: PID 1 of our own pid namespace, or killing us would not kill the tool tree.
    if std::process::id() != 1 {
        return Err(ConfineError::NotPidOne);
    }

    // 1b. A session of our own, with no controlling terminal. Every tool we start
    //     inherits it, so none has a terminal to push keystrokes into (TIOCSTI) even when
    //     its stdio is the caller's terminal, and none can acquire one by opening a tty
    //     (only a session leader can; the built-ins, which run in this process, open files
    //     with O_NOCTTY). Once here rather than per tool: with scheduler autogroups on
    //     (Debian's default) setsid also makes one, work that sat on each warm call's
    //     critical path when it ran per tool.
    sys::new_session().map_err(ConfineError::NewSession)?;
    // How many capabilities this kernel has, for step 8, read while /proc is still the
    // one the worker was started with: the mounts below may leave none.
    let last_capability = sys::last_capability();

    timings.mark("session");
    // 2. Mounts first: they need CAP_SYS_ADMIN in our mount namespace and the host root
    //    still reachable as the source of binds (and of the "fully visible /proc" check),
    //    or, for a worker cloned from its profile's template, that template's root.
    match spec.root {
        RootSource::Build => build_root_filesystem(&spec.mounts)?,
        RootSource::Template => finish_template_root(&spec.mounts)?,
    }

    timings.mark("mount");
    // 3. Hostname: needs CAP_SYS_ADMIN in our UTS namespace, so before dropping caps.
    nix::unistd::sethostname(&spec.hostname).map_err(ConfineError::SetHostname)?;

    timings.mark("hostname");
    // 4. Network: bringing loopback up needs CAP_NET_ADMIN in our network namespace. With
    //    "none" the namespace keeps only a down loopback: no interface at all works.
    if spec.network == NetworkMode::Loopback {
        sys::bring_loopback_up().map_err(ConfineError::LoopbackUp)?;
    }

    timings.mark("network");
    // 5. Resource limits: lowering needs no privilege, but set them before the tool exists.
    //    Core dumps are off: a dump could land in a writable bind with the tool's memory.
    //    A profile's limit is a ceiling: a lower hard limit inherited from whoever started
    //    airlock (`ulimit -Hn 128`) stays, since raising it is refused and lower is stricter.
    let limit = |resource, value: u64, name: &'static str| {
        let failed = |errno| ConfineError::SetRlimit {
            resource: name,
            errno,
        };
        let (_, hard) = getrlimit(resource).map_err(failed)?;
        let value = value.min(hard);
        setrlimit(resource, value, value).map_err(failed)
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
    // 6b. Egress: the listener the supervisor's proxy accepts on, made after the inherited
    //     descriptors are gone and before Landlock and seccomp, which may refuse binding.
    //     The only way out of this namespace; the worker hands it over and closes it.
    let egress_listener = match spec.egress_port {
        Some(_) if spec.network != NetworkMode::Loopback => {
            return Err(ConfineError::EgressNeedsLoopback);
        }
        Some(port) => Some(
            std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
                .map_err(|source| ConfineError::EgressListen { port, source })?,
        ),
        None => None,
    };
    // 7. Not dumpable: tools in the sandbox cannot ptrace or read /proc/1/mem of the worker
    //    that holds the protocol socket (runc CVE-2016-9962 pattern).
    nix::sys::prctl::set_dumpable(false).map_err(ConfineError::SetNotDumpable)?;

    timings.mark("dumpable");
    // 8. Capabilities: all sets emptied, bounding first (dropping it needs CAP_SETPCAP,
    //    which the later steps remove). An empty bounding set also means exec'ing as uid 0
    //    gains nothing.
    sys::drop_bounding_set(last_capability).map_err(ConfineError::DropBoundingSet)?;
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(|error| ConfineError::ClearCapabilities { set, error })?;
    }

    timings.mark("capabilities");
    // 9. no_new_privs: no setuid or file-capability gain on exec; required by Landlock and
    //    by seccomp for an unprivileged process.
    nix::sys::prctl::set_no_new_privs().map_err(ConfineError::SetNoNewPrivs)?;

    timings.mark("no_new_privs");
    // 10. Landlock: after the mounts (rules are opened on the final paths) and before
    //     seccomp (whose allowlist does not include the landlock_* set-up flow we need).
    let landlock = apply_landlock_to_current_process(&spec.landlock)?;

    timings.mark("landlock");
    // A network namespace shared with other workers connects nobody only while abstract
    // unix sockets are scoped to each worker's Landlock domain (ABI 6): the supervisor
    // shares one only then, and this is the check that holds it to that.
    if spec.network == NetworkMode::NoneShared && (landlock.abi < 6 || !landlock.fully_enforced) {
        return Err(ConfineError::SharedNetworkNeedsLandlock { abi: landlock.abi });
    }
    // On the host network, abstract unix sockets of host daemons are reachable unless
    // Landlock scopes them (ABI 6, Linux 6.12); TCP is narrowed by the port rules.
    if spec.network == NetworkMode::Host
        && landlock.abi < 6
        && spec.landlock.requirement == Requirement::Required
    {
        return Err(ConfineError::HostNetworkNeedsLandlock { abi: landlock.abi });
    }

    // 11. seccomp last: everything above uses syscalls the filter refuses (mount,
    //     sethostname, ...). From here on the worker itself runs under the filter too.
    //     With a listener, the supervisor answers each refusal with the errno the filter
    //     names and records it; where the kernel cannot give one, the errno form refuses
    //     the same syscalls alike, unreported.
    let seccomp = if spec.seccomp.hands_over() {
        match sys::install_seccomp_filter_with_listener(&spec.seccomp.program) {
            Ok(listener) => Ok(Some(listener)),
            Err(_) => sys::install_seccomp_filter(&spec.seccomp.errno_form()).map(|()| None),
        }
    } else {
        sys::install_seccomp_filter(&spec.seccomp.program).map(|()| None)
    };
    let (seccomp_installed, seccomp_listener) = match seccomp {
        Ok(listener) => (true, listener),
        Err(_) if spec.seccomp.requirement == Requirement::BestEffort => (false, None),
        Err(e) => return Err(ConfineError::Seccomp(e)),
    };

    // ...and while no socket but AF_UNIX can be made: the filter is what says so.
    if spec.network == NetworkMode::NoneShared && !seccomp_installed {
        return Err(ConfineError::SharedNetworkNeedsSeccomp);
    }

    timings.mark("seccomp");
    let applied = AppliedIsolation {
        namespaces: NAMESPACES
            .iter()
            .map(|ns| match (spec.network, *ns) {
                (NetworkMode::Host, "net") => "net:host".to_string(),
                (NetworkMode::NoneShared, "net") => "net:shared".to_string(),
                _ => ns.to_string(),
            })
            .collect(),
        landlock_abi: landlock.abi,
        landlock_fully_enforced: landlock.fully_enforced,
        seccomp_installed,
        seccomp_listener: seccomp_listener.is_some(),
        landlock_logged: landlock.logged,
    };
    Ok(Confined {
        applied,
        egress_listener,
        seccomp_listener,
    })
}

/// Closes every descriptor but stdio and `keep_fd`.
fn close_inherited_descriptors(keep_fd: RawFd) -> Result<(), ConfineError> {
    // The socket keeps the number it had in the supervisor; close everything above it,
    // then everything between stdio and it.
    let keep = u32::try_from(keep_fd).map_err(|_| ConfineError::NegativeSocketFd)?;
    sys::close_descriptors_from(keep + 1).map_err(ConfineError::CloseDescriptors)?;
    if keep > 3 {
        // One close_range, not a close per number (34 of them, nearly all EBADF, for a
        // socket at fd 37).
        sys::close_descriptor_range(3, keep - 1).map_err(ConfineError::CloseDescriptors)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(error: ConfineError) -> SetupFailure {
        error.into()
    }

    #[test]
    fn each_failure_reaches_the_supervisor_as_its_step_message_and_errno() {
        assert_eq!(
            wire(ConfineError::NotPidOne),
            SetupFailure {
                step: "namespaces".into(),
                message: "worker is not PID 1 of a fresh pid namespace".into(),
                errno: None,
                feature_missing: false,
            }
        );
        assert_eq!(
            wire(ConfineError::SetRlimit {
                resource: "RLIMIT_NOFILE",
                errno: Errno::EPERM,
            }),
            SetupFailure {
                step: "rlimits".into(),
                message: format!("RLIMIT_NOFILE: {}", Errno::EPERM),
                errno: Some(libc::EPERM),
                feature_missing: false,
            }
        );
        let bounding = std::io::Error::from_raw_os_error(libc::EPERM);
        assert_eq!(
            wire(ConfineError::DropBoundingSet(bounding)),
            SetupFailure {
                step: "capabilities".into(),
                message: format!(
                    "clear Bounding: {}",
                    std::io::Error::from_raw_os_error(libc::EPERM)
                ),
                errno: Some(libc::EPERM),
                feature_missing: false,
            }
        );
        let missing = MountError::MissingSource("/opt/x".into());
        let message = missing.to_string();
        assert_eq!(
            wire(ConfineError::Mount(missing)),
            SetupFailure {
                step: "mount".into(),
                message,
                errno: Some(libc::ENOENT),
                feature_missing: false,
            }
        );
    }

    #[test]
    fn a_missing_kernel_feature_is_marked_so() {
        let old = wire(ConfineError::Landlock(LandlockError::AbiTooOld {
            have: 3,
            need: 4,
            what: "filter TCP ports",
        }));
        assert_eq!(
            (old.step.as_str(), old.errno, old.feature_missing),
            ("landlock", None, true)
        );
        assert_eq!(
            old.message,
            "landlock ABI 3 cannot filter TCP ports (needs ABI 4)"
        );

        let shared = wire(ConfineError::SharedNetworkNeedsLandlock { abi: 5 });
        assert_eq!(
            (shared.step.as_str(), shared.feature_missing),
            ("landlock", true)
        );
        assert!(
            shared.message.ends_with("this kernel has ABI 5"),
            "{shared:?}"
        );

        let no_filter = wire(ConfineError::Seccomp(std::io::Error::from_raw_os_error(
            libc::ENOSYS,
        )));
        assert_eq!(
            (
                no_filter.step.as_str(),
                no_filter.errno,
                no_filter.feature_missing
            ),
            ("seccomp", Some(libc::ENOSYS), true)
        );
        assert!(
            no_filter
                .message
                .starts_with("cannot install the seccomp filter: "),
            "{no_filter:?}"
        );
        let refused = wire(ConfineError::Seccomp(std::io::Error::from_raw_os_error(
            libc::EPERM,
        )));
        assert!(!refused.feature_missing, "{refused:?}");
    }
}
