//! The escape battery: attacks a sandbox for agent tools must stop, each
//! with the outcome it must end in and the layer that stops it.
//!
//! One table, two runners: the integration tests (`tests/tests/suite/escape.rs`) run it through
//! `airlock exec --json` with the test-built `airlock-probe`, and `airlock selftest` runs it
//! through the library with the `airlock` binary itself as the probe, so an embedder can
//! prove on its own host that the isolation holds. The probe side is [`probe::main`].

pub mod probe;
mod sys;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// The sandbox profile a case runs in (all defined by [`policy_toml`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// No network, the usual limits.
    Closed,
    /// A private loopback interface only.
    Loopback,
    /// A one-second deadline, for attacks that try to outlive it.
    ShortDeadline,
    /// [`Profile::Closed`] plus a read-only bind nested below the writable workspace (where
    /// a tool can plant a symlink on its path for the next call).
    Nested,
}

impl Profile {
    /// Its name in the battery policy.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Closed => "battery",
            Profile::Loopback => "battery_loopback",
            Profile::ShortDeadline => "battery_deadline",
            Profile::Nested => "battery_nested",
        }
    }
}

/// One attack and how it must end.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// What is attempted, for the table.
    pub name: &'static str,
    /// The probe's attack.
    pub attack: &'static str,
    /// Its arguments; `{workspace}`, `{bait}`, `{abstract}`, `{socket}` and `{tcp}` are filled from
    /// the [`Fixture`].
    pub args: &'static [&'static str],
    /// Where it runs.
    pub profile: Profile,
    /// An attack run first, in its own sandbox (planting something for this one).
    pub before: Option<(&'static str, &'static [&'static str])>,
    /// The accepted outcomes, as [`observe`] spells them. More than one only where kernels
    /// legitimately differ (e.g. Landlock's EACCES before a read-only mount's EROFS).
    pub expected: &'static [&'static str],
    /// The layer that stops it.
    pub layer: &'static str,
}

const EPERM: &[&str] = &["errno=1"];
const ENOENT: &[&str] = &["errno=2"];
const ENOSYS: &[&str] = &["errno=38"];
const SIGSYS: &[&str] = &["SIGSYS"];

const fn case(
    name: &'static str,
    attack: &'static str,
    args: &'static [&'static str],
    expected: &'static [&'static str],
    layer: &'static str,
) -> Case {
    Case {
        name,
        attack,
        args,
        profile: Profile::Closed,
        before: None,
        expected,
        layer,
    }
}

const fn on(profile: Profile, c: Case) -> Case {
    Case { profile, ..c }
}

/// The battery, in the order it runs.
pub const CASES: &[Case] = &[
    // Namespaces and process creation.
    case(
        "nested user namespace (unshare)",
        "unshare-user",
        &[],
        EPERM,
        "seccomp",
    ),
    case(
        "clone with CLONE_NEWUSER",
        "clone-newuser",
        &[],
        EPERM,
        "seccomp",
    ),
    case(
        "clone3 (flags unreadable by BPF)",
        "clone3",
        &[],
        ENOSYS,
        "seccomp",
    ),
    case("setns", "setns", &[], EPERM, "seccomp"),
    case("mount a tmpfs", "mount", &[], EPERM, "seccomp"),
    case("umount2", "umount2", &[], EPERM, "seccomp"),
    case("pivot_root", "pivot_root", &[], EPERM, "seccomp"),
    case("chroot", "chroot", &[], EPERM, "seccomp"),
    // Kernel attack surface.
    case("ptrace", "ptrace", &[], EPERM, "seccomp"),
    case(
        "process_vm_readv",
        "process_vm_readv",
        &[],
        EPERM,
        "seccomp",
    ),
    case("bpf", "bpf", &[], EPERM, "seccomp"),
    case("perf_event_open", "perf_event_open", &[], EPERM, "seccomp"),
    case("userfaultfd", "userfaultfd", &[], EPERM, "seccomp"),
    case("keyctl", "keyctl", &[], EPERM, "seccomp"),
    case("add_key", "add_key", &[], EPERM, "seccomp"),
    case("request_key", "request_key", &[], EPERM, "seccomp"),
    case("io_uring_setup", "io_uring_setup", &[], ENOSYS, "seccomp"),
    case("kexec_load", "kexec_load", &[], EPERM, "seccomp"),
    case("init_module", "init_module", &[], EPERM, "seccomp"),
    case("finit_module", "finit_module", &[], EPERM, "seccomp"),
    case(
        "open_by_handle_at",
        "open_by_handle_at",
        &[],
        EPERM,
        "seccomp",
    ),
    case(
        "personality(READ_IMPLIES_EXEC)",
        "personality",
        &[],
        EPERM,
        "seccomp",
    ),
    case(
        "unknown syscall 1000",
        "syscall-1000",
        &[],
        ENOSYS,
        "seccomp",
    ),
    case("x32 syscall entry", "x32-getpid", &[], SIGSYS, "seccomp"),
    case(
        "32-bit int 0x80 entry",
        "int80-getpid",
        &[],
        SIGSYS,
        "seccomp",
    ),
    // Terminals.
    case("TIOCSTI", "tiocsti", &[], EPERM, "seccomp"),
    case(
        "TIOCSTI with high bits set",
        "tiocsti-hibits",
        &[],
        EPERM,
        "seccomp",
    ),
    case("TIOCLINUX", "tioclinux", &[], EPERM, "seccomp"),
    // Sockets.
    case(
        "unix socket (allowed)",
        "socket-unix",
        &[],
        &["ok"],
        "seccomp",
    ),
    case(
        "inet socket, network none",
        "socket-inet",
        &[],
        EPERM,
        "seccomp",
    ),
    on(
        Profile::Loopback,
        case(
            "inet socket, loopback (allowed)",
            "socket-inet",
            &[],
            &["ok"],
            "seccomp",
        ),
    ),
    on(
        Profile::Loopback,
        case("raw inet socket", "socket-raw", &[], EPERM, "seccomp"),
    ),
    on(
        Profile::Loopback,
        case("packet socket", "socket-packet", &[], EPERM, "seccomp"),
    ),
    on(
        Profile::Loopback,
        case("netlink socket", "socket-netlink", &[], EPERM, "seccomp"),
    ),
    on(
        Profile::Loopback,
        case("vsock socket", "socket-vsock", &[], EPERM, "seccomp"),
    ),
    on(
        Profile::Loopback,
        case("alg socket", "socket-alg", &[], EPERM, "seccomp"),
    ),
    on(
        Profile::Loopback,
        case(
            "host loopback service",
            "connect-tcp",
            &["{tcp}"],
            &["errno=111"],
            "network namespace",
        ),
    ),
    on(
        Profile::Loopback,
        case(
            "outside network",
            "connect-tcp",
            &["192.0.2.1:80"],
            &["errno=101"],
            "network namespace",
        ),
    ),
    case(
        "host abstract unix socket",
        "connect-abstract",
        &["{abstract}"],
        &["errno=111"],
        "network namespace",
    ),
    case(
        "host daemon socket by path",
        "connect-unix",
        &["{socket}"],
        ENOENT,
        "mount namespace",
    ),
    // Privileges.
    case(
        "capabilities, no_new_privs, seccomp mode",
        "creds",
        &[],
        &["capeff=0 capprm=0 capinh=0 capbnd=0 capamb=0 nnp=1 seccomp=2"],
        "capabilities",
    ),
    case(
        "setuid binaries (nosuid + no_new_privs)",
        "suid-inert",
        &[],
        &["inert"],
        "mounts",
    ),
    case(
        "inherited descriptors",
        "fds",
        &[],
        &["fds=0,1,2"],
        "worker",
    ),
    case("working directory", "cwd", &[], &["cwd=/tmp"], "worker"),
    case(
        "supervisor environment",
        "env-names",
        &[],
        &["env=LANG,PATH"],
        "worker",
    ),
    case(
        "/proc/self/cgroup (host pid, worker count)",
        "cgroup-view",
        &[],
        &["cgroup=/"],
        "cgroup namespace",
    ),
    case(
        "host identity in /proc (cmdline, boot id)",
        "proc-hidden",
        &[
            "/proc/cmdline",
            "/proc/config.gz",
            "/proc/sys/kernel/random/boot_id",
        ],
        &["hidden"],
        "mounts",
    ),
    case(
        "host-wide activity in /proc (pressure)",
        "proc-hidden",
        &[
            "/proc/pressure",
            "/proc/interrupts",
            "/proc/timer_list",
            "/proc/sched_debug",
        ],
        &["hidden"],
        "mounts",
    ),
    case(
        "what runtimes mask in /proc (keys, acpi)",
        "proc-hidden",
        &[
            "/proc/keys",
            "/proc/kcore",
            "/proc/acpi",
            "/proc/asound",
            "/proc/scsi",
            "/proc/latency_stats",
            "/proc/timer_stats",
        ],
        &["hidden"],
        "mounts",
    ),
    case(
        "host processes in /proc",
        "proc-pids",
        &[],
        &["pids<=2"],
        "pid namespace",
    ),
    case(
        "device nodes",
        "dev-list",
        &[],
        &["dev=fd,full,null,random,stderr,stdin,stdout,urandom,zero"],
        "mounts",
    ),
    // Files.
    case(
        "overwrite /proc/self/exe",
        "open-write",
        &["/proc/self/exe"],
        &["errno=13", "errno=26", "errno=30"],
        "mounts",
    ),
    case(
        "overwrite /proc/1/exe (the worker)",
        "open-write",
        &["/proc/1/exe"],
        &["errno=13"],
        "non-dumpable worker",
    ),
    case(
        "read /proc/1/mem (the worker)",
        "read-file",
        &["/proc/1/mem"],
        &["errno=13"],
        "non-dumpable worker",
    ),
    case(
        "read /etc/shadow",
        "read-file",
        &["/etc/shadow"],
        ENOENT,
        "mount namespace",
    ),
    case(
        "read /root",
        "read-file",
        &["/root"],
        ENOENT,
        "mount namespace",
    ),
    case(
        "write outside the allowlist (/etc)",
        "create-file",
        &["/etc/airlock-escape"],
        &["errno=13", "errno=30"],
        "landlock",
    ),
    case(
        "write into a read-only bind (/usr)",
        "create-file",
        &["/usr/airlock-escape"],
        &["errno=13", "errno=30"],
        "landlock",
    ),
    case(
        "core_pattern (/proc/sys)",
        "open-write",
        &["/proc/sys/kernel/core_pattern"],
        &["errno=13"],
        "user namespace",
    ),
    case(
        "sysrq trigger",
        "open-write",
        &["/proc/sysrq-trigger"],
        // ENOENT on kernels built without CONFIG_MAGIC_SYSRQ.
        &["errno=13", "errno=2"],
        "user namespace",
    ),
    case(
        "/sys (raise own cgroup limits)",
        "open-write",
        &["/sys/fs/cgroup/memory.max"],
        ENOENT,
        "mount namespace",
    ),
    case(
        "mount a cgroup hierarchy",
        "mount-cgroup",
        &[],
        EPERM,
        "seccomp",
    ),
    case("create a device node", "mknod-char", &[], EPERM, "seccomp"),
    Case {
        before: Some(("plant-symlink", &["{workspace}/sub", "/etc"])),
        ..case(
            "symlink planted for the next call's binds",
            "read-file",
            &["{workspace}/sub/shadow"],
            ENOENT,
            "mounts",
        )
    },
    // FS-05: the bind below the workspace is `nest/data`; the tool makes `nest` a link to
    // a host directory beside the workspace. Followed, the next sandbox would bind the
    // host's `bait/data` (at `bait/data` inside, reachable through the link); the set-up
    // must refuse instead.
    Case {
        before: Some(("plant-symlink", &["{workspace}/nest", "../bait"])),
        ..on(
            Profile::Nested,
            case(
                "symlink planted on the path of a nested bind",
                "read-file",
                &["{bait}/data/canary"],
                &["kind=sandbox_unavailable"],
                "mounts",
            ),
        )
    },
    case(
        "hardlink from /usr into the workspace",
        "hardlink",
        &["/usr/bin/env", "{workspace}/env-link"],
        &["errno=18"],
        "mounts",
    ),
    // Resources.
    case(
        "fork bomb",
        "fork-bomb",
        &[],
        &["errno=11", "kind=pids_limit"],
        "cgroup pids",
    ),
    case(
        "memory bomb",
        "memory-bomb",
        &[],
        &["kind=out_of_memory"],
        "cgroup memory",
    ),
    // open_files = 64 with 0, 1 and 2 open: 61 more, then EMFILE.
    case("fd bomb", "fd-bomb", &[], &["opened=61 errno=24"], "rlimit"),
    case(
        "/tmp exhaustion",
        "fill-tmp",
        &[],
        &["errno=28"],
        "sized tmpfs",
    ),
    case(
        "core dumps",
        "core-limit",
        &[],
        &["core=0/0 raise=errno=1"],
        "rlimit",
    ),
    case(
        "output flood",
        "flood",
        &[],
        &["stdout_truncated"],
        "supervisor",
    ),
    on(
        Profile::ShortDeadline,
        case(
            "CPU spin past the deadline",
            "spin",
            &[],
            &["kind=timeout"],
            "supervisor",
        ),
    ),
    on(
        Profile::ShortDeadline,
        case(
            "sleep past the deadline",
            "sleep",
            &[],
            &["kind=timeout"],
            "supervisor",
        ),
    ),
];

/// Host-side bait and a workspace: a listening abstract unix socket, a unix socket by path,
/// a TCP listener on the host's loopback, and a directory the sandbox may write. Removed on
/// drop.
#[derive(Debug)]
pub struct Fixture {
    dir: PathBuf,
    /// The writable workspace (with a `sub` directory the battery tries to replace).
    pub workspace: PathBuf,
    abstract_name: String,
    socket: PathBuf,
    tcp: std::net::SocketAddr,
    _listeners: (UnixListener, UnixListener, std::net::TcpListener),
}

impl Fixture {
    /// Creates it under `parent`. `sandbox_uid` owns the workspace (the host uid the
    /// sandbox's root maps to), so the sandbox can write it.
    pub fn new(parent: &Path, sandbox_uid: Option<u32>) -> std::io::Result<Self> {
        use std::os::linux::net::SocketAddrExt;
        let tag = format!(
            "airlock-battery-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        let dir = parent.join(&tag);
        let workspace = dir.join("ws");
        std::fs::create_dir_all(workspace.join("sub"))?;
        // The sandbox's root, another uid, must reach the workspace and the staged probe.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        if let Some(uid) = sandbox_uid {
            for d in [&workspace, &workspace.join("sub")] {
                std::os::unix::fs::chown(d, Some(uid), Some(uid))?;
            }
        }
        // Bait beside the workspace: what a symlink planted in it may try to bring in.
        std::fs::create_dir_all(dir.join("bait/data"))?;
        std::fs::create_dir_all(dir.join("bait/public"))?;
        std::fs::write(dir.join("bait/data/canary"), b"host file")?;
        let abstract_name = tag.clone();
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes())?;
        let abstract_listener = UnixListener::bind_addr(&addr)?;
        let socket = dir.join("host.sock");
        let path_listener = UnixListener::bind(&socket)?;
        let tcp_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let tcp = tcp_listener.local_addr()?;
        Ok(Self {
            dir,
            workspace,
            abstract_name,
            socket,
            tcp,
            _listeners: (abstract_listener, path_listener, tcp_listener),
        })
    }

    /// `program` staged in the fixture's directory for [`Fixture::policy_toml`] to bind as the
    /// probe: see [`stage_program`].
    pub fn stage_probe(&self, program: &Path) -> std::io::Result<PathBuf> {
        stage_program(program, &self.dir)
    }

    fn fill(&self, arg: &str) -> String {
        arg.replace("{workspace}", &self.workspace.display().to_string())
            .replace("{bait}", &self.dir.join("bait").display().to_string())
            .replace("{abstract}", &self.abstract_name)
            .replace("{socket}", &self.socket.display().to_string())
            .replace("{tcp}", &self.tcp.to_string())
    }

    /// The battery's policy: the profiles of [`Profile`], reading the system directories and
    /// `probe` (the hostile program), writing the workspace.
    pub fn policy_toml(&self, probe: &Path) -> String {
        let ws = self.workspace.display().to_string();
        let sub = format!("{ws}/sub");
        let probe = probe.display().to_string();
        let mut text = String::from("version = 1\n");
        let sub = format!("{sub:?}");
        // The nested bind, and a bind that makes the bait's directory exist in the new
        // root too, so that a followed link would find its mount point there.
        let nested = format!(
            "{:?}, {:?}",
            format!("{ws}/nest/data"),
            self.dir.join("bait/public").display().to_string()
        );
        for (profile, network, timeout, extra) in [
            (Profile::Closed, "none", "20s", &sub),
            (Profile::Loopback, "loopback", "20s", &sub),
            (Profile::ShortDeadline, "none", "1s", &sub),
            (Profile::Nested, "none", "20s", &nested),
        ] {
            text.push_str(&format!(
                r#"
[profiles.{name}]
read = ["/usr", {probe:?}]
read_optional = ["/bin", "/sbin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives", {extra}]
write = [{ws:?}]
tmpfs = {{ "/tmp" = "16MiB" }}
network = "{network}"
limits = {{ memory = "64MiB", pids = 32, timeout = "{timeout}", output = "64KiB", open_files = 64, file_size = "64MiB" }}
env = {{ PATH = "/usr/bin:/bin", LANG = "C.UTF-8" }}
"#,
                name = profile.name(),
            ));
        }
        text
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Puts `program` into `dir`, world-executable, for a policy to bind, and returns its new
/// path. The sandbox's root is another uid (65534 under a root supervisor), which may not
/// reach the program where it lies: below a 0700 home or a checkout in a `mktemp -d`
/// directory. A hard link where it can be (no copy of a large binary), else a copy.
pub fn stage_program(program: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    use std::io::ErrorKind;
    let name = program
        .file_name()
        .ok_or_else(|| std::io::Error::new(ErrorKind::InvalidInput, "no file name"))?;
    let staged = dir.join(name);
    if std::fs::metadata(program)?.permissions().mode() & 0o005 == 0o005 {
        match std::fs::hard_link(program, &staged) {
            Ok(()) => return Ok(staged),
            // Never write into a file already there: it may be a link to the program.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => return Err(e),
            Err(_) => {}
        }
    }
    let mut copy = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&staged)?;
    std::io::copy(&mut std::fs::File::open(program)?, &mut copy)?;
    copy.set_permissions(std::fs::Permissions::from_mode(0o755))?;
    Ok(staged)
}

/// The canonical outcome of a call, as the table's `expected` spells it: `SIGSYS` for a
/// seccomp kill, `kind=KIND` for any other typed failure except the tool's own exit,
/// `stdout_truncated` for a flood, otherwise the probe's line.
pub fn observe(result: &serde_json::Value) -> String {
    let kind = result["error"]["kind"].as_str();
    if kind == Some("seccomp_violation") && result["signal"] == libc::SIGSYS {
        return "SIGSYS".into();
    }
    if let Some(kind) = kind.filter(|k| *k != "tool_failed") {
        return format!("kind={kind}");
    }
    if result["stdout_truncated"] == true {
        return "stdout_truncated".into();
    }
    let stdout = result["stdout"].as_str().unwrap_or_default();
    match stdout.lines().next().map(str::trim) {
        Some(line) if !line.is_empty() => line.to_string(),
        _ => format!(
            "no output (exit {}, signal {}, error {})",
            result["exit_code"], result["signal"], result["error"]["message"]
        ),
    }
}

/// One line of the battery's report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The case's name.
    pub name: String,
    /// The layer that stops it.
    pub layer: String,
    /// Accepted outcomes, `|`-separated.
    pub expected: String,
    /// What happened.
    pub observed: String,
    /// Whether it was one of the accepted outcomes.
    pub ok: bool,
}

/// Runs one sandboxed call: `profile`'s name and the full argv (probe first). Returns the
/// result record as JSON, or why no record came back.
pub trait Runner {
    /// Runs the call.
    fn run(&mut self, profile: &str, argv: Vec<String>) -> Result<serde_json::Value, String>;
}

/// Runs every case. `probe` is the argv prefix that starts the probe (the program and, for
/// `airlock`, its hidden probe subcommand).
pub fn run(runner: &mut dyn Runner, probe: &[String], fixture: &Fixture) -> Vec<Report> {
    CASES
        .iter()
        .map(|case| {
            let argv = |attack: &str, args: &[&str]| {
                let mut argv = probe.to_vec();
                argv.push(attack.to_string());
                argv.extend(args.iter().map(|a| fixture.fill(a)));
                argv
            };
            let mut observed = None;
            if let Some((attack, args)) = case.before
                && let Err(e) = runner.run(case.profile.name(), argv(attack, args))
            {
                observed = Some(format!("set-up call failed: {e}"));
            }
            let observed = observed.unwrap_or_else(|| {
                match runner.run(case.profile.name(), argv(case.attack, case.args)) {
                    Ok(result) => observe(&result),
                    Err(e) => format!("no result: {e}"),
                }
            });
            Report {
                name: case.name.into(),
                layer: case.layer.into(),
                expected: case.expected.join("|"),
                ok: case.expected.contains(&observed.as_str()),
                observed,
            }
        })
        .collect()
}

/// The reports as an aligned text table.
pub fn table(reports: &[Report]) -> String {
    let mut out = format!(
        "{:<42} {:<20} {:<28} {:<28} {}\n",
        "case", "layer", "expected", "observed", "ok"
    );
    for r in reports {
        out.push_str(&format!(
            "{:<42} {:<20} {:<28} {:<28} {}\n",
            r.name,
            r.layer,
            r.expected,
            r.observed,
            if r.ok { "ok" } else { "FAIL" }
        ));
    }
    out
}
