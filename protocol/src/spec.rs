//! The compiled sandbox spec: pure data the supervisor sends a worker so it can confine itself.
//!
//! `airlock-policy` compiles a profile into a [`SandboxSpec`] once; every worker for that
//! profile receives the same value in its `Setup` message. Paths here are paths *inside* the
//! sandbox; bind sources are host paths.

use serde::{Deserialize, Serialize};

/// Everything a worker needs to confine itself, in the order it applies it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Name of the profile this spec was compiled from (for reports and logs).
    pub profile: String,
    /// Hostname set in the fresh UTS namespace.
    pub hostname: String,
    /// Mount operations, applied in order on top of a fresh tmpfs root (or, with
    /// [`RootSource::Template`], the per-worker ones on top of the template's root).
    pub mounts: Vec<MountOp>,
    /// Whether the worker builds its root or finds it already built.
    pub root: RootSource,
    /// Network namespace set-up.
    pub network: NetworkMode,
    /// Resource limits applied with setrlimit.
    pub rlimits: Rlimits,
    /// Landlock rules.
    pub landlock: LandlockSpec,
    /// The seccomp program, installed last.
    pub seccomp: SeccompSpec,
    /// The complete environment of every tool process (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Working directory of tool processes, inside the sandbox.
    pub cwd: String,
    /// With [`NetworkMode::Loopback`]: the worker listens on `127.0.0.1:<port>` in its own
    /// network namespace before confining itself and passes the listening socket to the
    /// supervisor with `Ready`; the supervisor's egress proxy accepts on it. The tools'
    /// only way out of that namespace.
    pub egress_port: Option<u16>,
}

/// Where a worker's root filesystem comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RootSource {
    /// The worker builds it from the whole mount plan in a copy of the host's mount
    /// namespace, then pivots into it.
    #[default]
    Build,
    /// The worker was cloned from a mount namespace that already holds the profile's
    /// read-only root (a template the supervisor built once); the plan holds only the
    /// per-worker mounts (tmpfs and procfs) to make on top of it.
    Template,
}

/// One step of the mount plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MountOp {
    /// A tmpfs at `target` of at most `size_bytes`, with the given octal `mode`.
    Tmpfs {
        /// Mount point inside the sandbox.
        target: String,
        /// Size limit in bytes.
        size_bytes: u64,
        /// Permission bits of the mount's root directory.
        mode: u32,
    },
    /// A bind mount of host `source` at `target`, always nosuid and nodev.
    Bind {
        /// Host path.
        source: String,
        /// Mount point inside the sandbox.
        target: String,
        /// Whether the sandbox may write through it.
        writable: bool,
        /// A missing source is skipped instead of failing the set-up.
        optional: bool,
    },
    /// A fresh procfs for the sandbox's pid namespace.
    Proc {
        /// Mount point inside the sandbox.
        target: String,
        /// Entries of it, relative to `target`, covered with an empty read-only file or
        /// directory (as container runtimes mask them): host-identifying and host-wide ones.
        /// An entry this kernel does not have is skipped.
        hide: Vec<String>,
    },
    /// A minimal `/dev`: a directory of the read-only root holding bind-mounted null,
    /// zero, full, random, urandom (and the `/dev/fd`, `/dev/std*` symlinks).
    Dev {
        /// Mount point inside the sandbox.
        target: String,
    },
    /// A symlink created inside the sandbox (for example `/bin -> usr/bin`).
    Symlink {
        /// What the link points to.
        link_target: String,
        /// Where the link is created, inside the sandbox.
        path: String,
    },
    /// An empty directory created inside the sandbox.
    Dir {
        /// Path inside the sandbox.
        path: String,
        /// Permission bits.
        mode: u32,
    },
}

/// What network a sandbox gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NetworkMode {
    /// A fresh network namespace with no interface up; no socket but `AF_UNIX`.
    None,
    /// A fresh network namespace with only loopback up.
    Loopback,
    /// The host network, narrowed by Landlock TCP port rules.
    Host,
    /// Like `None`, but the network namespace is one empty namespace the supervisor made and
    /// shares between workers (creating and destroying one per worker is most of a cold
    /// spawn's cost). Sent only in `Setup`, never compiled from a policy. Safe only because
    /// nothing in it connects workers: no interface is up, the seccomp filter allows no
    /// socket but `AF_UNIX`, path sockets live in each worker's own file system, and abstract
    /// unix sockets are scoped by Landlock (ABI 6), which the worker insists on.
    NoneShared,
}

/// Limits applied with setrlimit (the `RLIMIT_CORE` is always 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rlimits {
    /// `RLIMIT_NOFILE`.
    pub open_files: u64,
    /// `RLIMIT_FSIZE`, bytes.
    pub file_size_bytes: u64,
    /// `RLIMIT_CPU`, seconds; `None` leaves it unlimited.
    pub cpu_seconds: Option<u64>,
}

/// How hard a confinement layer is required.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Requirement {
    /// The call fails with `sandbox_unavailable` unless the layer is fully enforced.
    Required,
    /// Applied as far as the kernel allows; the achieved level is reported.
    BestEffort,
}

/// Landlock rules, as paths inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LandlockSpec {
    /// Required or best effort.
    pub requirement: Requirement,
    /// Read and execute beneath these paths.
    pub read: Vec<String>,
    /// Read, write, create and remove beneath these paths.
    pub write: Vec<String>,
    /// TCP ports the sandbox may bind.
    pub tcp_bind: Vec<u16>,
    /// TCP ports the sandbox may connect to.
    pub tcp_connect: Vec<u16>,
    /// Whether TCP is handled at all (false means network access is left to the namespace).
    pub restrict_tcp: bool,
    /// Log the domain's refusals to the kernel's audit, the tool's included (ABI 7:
    /// `LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`), and none of domains nested in it
    /// (`LOG_SUBDOMAINS_OFF`): set by a supervisor that reads them.
    pub log_denials: bool,
}

/// One classic-BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BpfInstruction {
    /// Opcode.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Generic field.
    pub k: u32,
}

/// `SECCOMP_RET_USER_NOTIF`, and the mask of a return's action.
const RET_USER_NOTIF: u32 = 0x7fc0_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_ACTION: u32 = 0xffff_0000;
/// The errno's bits of a refusal's data; the bits above name the argument rule.
const ERRNO_MASK: u32 = 0x0fff;
const BPF_RET_K: u16 = 0x06;
/// Linux's `ENOSYS` on every architecture.
const ENOSYS: u32 = 38;

impl SeccompSpec {
    /// Whether the program hands any syscall to a listener: only then does the worker ask
    /// the kernel for one (a program compiled in the errno form never does).
    pub fn hands_over(&self) -> bool {
        self.program
            .iter()
            .any(|i| i.code == BPF_RET_K && i.k & RET_ACTION == RET_USER_NOTIF)
    }

    /// The program that refuses what [`SeccompSpec::program`] refuses, with the same errnos,
    /// without a listener: each notifying return becomes the errno return it stands for. For
    /// a kernel that cannot give the worker a listener (one is already in the filter chain,
    /// when airlock itself runs under such a filter).
    pub fn errno_form(&self) -> Vec<BpfInstruction> {
        self.program
            .iter()
            .map(|i| match i.code {
                // Errno 0 hands a syscall over to be let through (a profile being learned):
                // without a listener it fails instead, never runs unwatched.
                BPF_RET_K if i.k & RET_ACTION == RET_USER_NOTIF && i.k & ERRNO_MASK == 0 => {
                    BpfInstruction {
                        k: RET_ERRNO | ENOSYS,
                        ..*i
                    }
                }
                BPF_RET_K if i.k & RET_ACTION == RET_USER_NOTIF => BpfInstruction {
                    k: RET_ERRNO | (i.k & ERRNO_MASK),
                    ..*i
                },
                _ => *i,
            })
            .collect()
    }
}

/// A compiled seccomp filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SeccompSpec {
    /// Required or best effort.
    pub requirement: Requirement,
    /// The program, ready for `seccomp(SECCOMP_SET_MODE_FILTER)` with a listener: its
    /// refusals notify the supervisor, which answers them (see [`SeccompSpec::errno_form`]).
    pub program: Vec<BpfInstruction>,
    /// Hex SHA-256 of the program, reported in results.
    pub digest: String,
}
