//! Profiles: one check per rule family — the name, filesystem grants, network, seccomp,
//! limits, environment, layer requirements, hostname, working directory and `/proc`.
//!
//! Each family reports its own errors and warnings; [`check_profile`] calls them in the order
//! of the profile's keys, which is also the order diagnostics at one position come out in.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use super::sessions::{check_workspace, granted_paths};
use super::{
    Checker, Limits, Network, PathGrant, ProcView, Profile, Requirements, TOOL_NAME, TcpPorts,
};
use super::{SessionPolicy, bounds, defaults};
use crate::egress::{Cidr, EgressPolicy, HostRule};
use crate::model::{LimitsFile, NetworkFile, ProfileFile, RequireFile, SyscallsFile};
use crate::seccomp::{DEFAULT_ALLOW, SocketFamilies, SyscallPolicy, is_never_allowed};
use crate::syscalls::syscall_number;

/// Paths airlock mounts itself; a profile may not bind over them.
const RESERVED_MOUNTS: &[&str] = &["/proc", "/dev"];
/// Paths whose writable grant is risky enough to warn about.
const RISKY_WRITABLE: &[&str] = &[
    "/", "/proc", "/sys", "/dev", "/etc", "/usr", "/boot", "/root",
];

/// Where hosts keep the unix sockets of their services and users' agents (D-Bus, journald,
/// container runtimes, X11, ssh and gpg agents), and whether what lies beneath counts too
/// (a directory of `/tmp` is as likely a build's as an agent's). A bind that reaches one
/// lets a tool connect to each socket the sandbox's uid may write: connecting needs no
/// right Landlock handles on the kernels to date, and a read-only bind does not stop it.
const SOCKET_DIRS: &[(&str, bool)] = &[
    ("/run", true),
    ("/var/run", true),
    ("/tmp/.X11-unix", true),
    ("/tmp", false),
    ("/var/tmp", false),
];

/// Validates one profile; `None` when it has errors (they are in `c`).
pub(super) fn check_profile(
    c: &mut Checker<'_>,
    name: &Spanned<String>,
    file: &ProfileFile,
    sessions: &SessionPolicy,
) -> Option<Profile> {
    let before = c.error_count();
    let profile_name = check_profile_name(c, name);
    let Mounts { read, write, tmpfs } = check_mounts(c, file);
    let network = check_network(c, file.network.as_ref());
    let syscalls = check_syscalls(c, file.syscalls.as_ref(), &network);
    let limits = check_limits(c, file.limits.as_ref());
    let env = check_env(c, &file.env);
    let require = check_require(c, file.require.as_ref());
    let hostname = check_hostname(c, file.hostname.as_ref());
    let cwd = check_cwd(c, file.cwd.as_ref(), &tmpfs);
    let proc = check_proc(c, file.proc.as_ref());
    let workspace = check_workspace(c, file, &granted_paths(&read, &write, &tmpfs), sessions);
    (c.error_count() == before).then_some(Profile {
        name: profile_name,
        read,
        write,
        tmpfs,
        network,
        syscalls,
        limits,
        env,
        require,
        hostname,
        cwd,
        proc,
        workspace,
    })
}

fn check_profile_name(c: &mut Checker<'_>, name: &Spanned<String>) -> String {
    let profile_name = name.get_ref().clone();
    if !TOOL_NAME
        .as_ref()
        .is_ok_and(|re| re.is_match(&profile_name))
    {
        c.error(
            name.span(),
            format!("profile name {profile_name:?} must match ^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$"),
        );
    }
    profile_name
}

/// The filesystem a profile grants.
struct Mounts {
    read: Vec<PathGrant>,
    write: Vec<PathGrant>,
    tmpfs: Vec<(String, u64)>,
}

/// Filesystem grants: `read`, `read_optional`, `write` and `tmpfs`, each path checked, none
/// over what airlock mounts itself, none listed twice; then the mounts nested in writable
/// paths.
fn check_mounts(c: &mut Checker<'_>, file: &ProfileFile) -> Mounts {
    let mut seen: BTreeMap<String, Range<usize>> = BTreeMap::new();
    let mut read = Vec::new();
    for path in &file.read {
        if let Some(p) = check_grant(c, &mut seen, path, "read path") {
            if p == "/sys" || p.starts_with("/sys/") {
                c.warning(
                    path.span(),
                    format!("read path {p:?} exposes host kernel state"),
                );
            }
            warn_socket_dirs(c, &p, path.span());
            read.push(PathGrant {
                path: p,
                optional: false,
            });
        }
    }
    for path in &file.read_optional {
        if let Some(p) = check_grant(c, &mut seen, path, "read_optional path") {
            warn_socket_dirs(c, &p, path.span());
            read.push(PathGrant {
                path: p,
                optional: true,
            });
        }
    }
    let mut write = Vec::new();
    for path in &file.write {
        if let Some(p) = check_grant(c, &mut seen, path, "write path") {
            if RISKY_WRITABLE.contains(&p.as_str()) || p.starts_with("/sys/") {
                c.warning(
                    path.span(),
                    format!("write path {p:?} lets tools change the host system"),
                );
            }
            warn_socket_dirs(c, &p, path.span());
            write.push(PathGrant {
                path: p,
                optional: false,
            });
        }
    }
    let mut tmpfs = Vec::new();
    for (path, size) in &file.tmpfs {
        let checked = check_grant(c, &mut seen, path, "tmpfs path");
        let bytes = c.size(size, "tmpfs size", bounds::TMPFS_BYTES);
        if let (Some(p), Some(b)) = (checked, bytes) {
            tmpfs.push((p, b));
        }
    }
    warn_mounts_inside_writable(c, file, &write);
    Mounts { read, write, tmpfs }
}

/// A bind of, inside or above a directory where the host keeps unix sockets.
fn warn_socket_dirs(c: &mut Checker<'_>, path: &str, span: Range<usize>) {
    let path = path.trim_end_matches('/');
    let within = |outer: &str, inner: &str| {
        outer.is_empty() || inner == outer || inner.starts_with(&format!("{outer}/"))
    };
    if let Some((dir, _)) = SOCKET_DIRS
        .iter()
        .find(|(dir, below)| (*below && within(dir, path)) || within(path, dir))
    {
        c.warning(
            span,
            format!(
                "{:?} reaches the host's unix sockets in {dir:?}: a tool may connect to any \
                 there the sandbox's uid may write (D-Bus, journald, container runtimes, \
                 agents), which neither a read-only bind nor Landlock refuses; bind only the \
                 files the tool needs",
                if path.is_empty() { "/" } else { path }
            ),
        );
    }
}

/// One granted path: valid, not reserved, not already granted (`seen`).
fn check_grant(
    c: &mut Checker<'_>,
    seen: &mut BTreeMap<String, Range<usize>>,
    path: &Spanned<String>,
    what: &str,
) -> Option<String> {
    let checked = c.path(path, what)?;
    if RESERVED_MOUNTS
        .iter()
        .any(|r| checked == *r || checked.starts_with(&format!("{r}/")))
    {
        c.error(
            path.span(),
            format!("{what} {checked:?} is mounted by airlock itself (fresh /proc, minimal /dev)"),
        );
        return None;
    }
    if seen.insert(checked.clone(), path.span()).is_some() {
        c.error(
            path.span(),
            format!("path {checked:?} is listed more than once"),
        );
        return None;
    }
    Some(checked)
}

/// A mount below a writable bind: a tool may replace a directory on its path with a
/// symlink, and the worker then refuses to build later sandboxes (escape battery FS-05).
fn warn_mounts_inside_writable(c: &mut Checker<'_>, file: &ProfileFile, write: &[PathGrant]) {
    let spans = file
        .read
        .iter()
        .chain(&file.read_optional)
        .chain(&file.write)
        .map(|p| (p.span(), p.get_ref().trim_end_matches('/').to_string()))
        .chain(
            file.tmpfs
                .keys()
                .map(|p| (p.span(), p.get_ref().trim_end_matches('/').to_string())),
        );
    for (span, path) in spans {
        if let Some(outer) = write
            .iter()
            .find(|w| path.starts_with(&format!("{}/", w.path.trim_end_matches('/'))))
        {
            c.warning(
                span,
                format!(
                    "{path:?} is mounted inside writable path {:?}: a tool there can put a \
                     symlink on its path, and later calls then fail with sandbox_unavailable \
                     until it is removed",
                    outer.path
                ),
            );
        }
    }
}

/// `network`: `"none"` (the default), `"loopback"`, `"host"`, or a table: the egress
/// proxy's `allow` list, or `mode = "host"` with TCP ports and UDP.
fn check_network(c: &mut Checker<'_>, network: Option<&Spanned<NetworkFile>>) -> Network {
    let Some(spanned) = network else {
        return Network::None;
    };
    let span = spanned.span();
    match spanned.get_ref() {
        NetworkFile::Mode(mode) if mode == "none" => Network::None,
        NetworkFile::Mode(mode) if mode == "loopback" => Network::Loopback,
        NetworkFile::Mode(mode) if mode == "host" => {
            warn_host_network(c, span.clone(), None);
            Network::Host {
                tcp: None,
                udp: false,
            }
        }
        NetworkFile::Mode(other) => {
            c.error(
                span,
                format!(
                    "network must be \"none\", \"loopback\", \"host\" or a table {{ allow = [...] }}, not {other:?}"
                ),
            );
            Network::None
        }
        NetworkFile::Rules(rules) => match (&rules.allow, rules.mode.as_deref()) {
            (Some(allow), None) => check_egress(c, span, allow, rules),
            (None, Some("host")) => check_host_network(c, span, rules),
            (Some(_), Some(_)) => {
                c.error(
                    span,
                    "network: allow (the egress proxy) and mode = \"host\" exclude each other",
                );
                Network::None
            }
            (None, Some(other)) => {
                c.error(
                    span,
                    format!("network.mode must be \"host\", not {other:?} (the other modes are plain strings: network = \"loopback\")"),
                );
                Network::None
            }
            (None, None) => {
                c.error(
                    span,
                    "a network table needs allow = [\"host[:port]\", ...] for the egress proxy, or mode = \"host\" for the host's own network",
                );
                Network::None
            }
        },
    }
}

/// The egress proxy's allowlist: every entry parsed, each mistake its own error.
fn check_egress(
    c: &mut Checker<'_>,
    span: std::ops::Range<usize>,
    allow: &[String],
    rules: &crate::model::NetworkRulesFile,
) -> Network {
    if rules.connect.is_some() || rules.bind.is_some() || rules.udp.is_some() {
        c.error(
            span.clone(),
            "network: connect, bind and udp belong to mode = \"host\"; with allow, the egress proxy decides every connection",
        );
    }
    let mut hosts = Vec::new();
    for entry in allow {
        match HostRule::parse(entry) {
            Ok(rule) => hosts.push(rule),
            Err(e) => c.error(span.clone(), format!("network.allow entry {entry:?}: {e}")),
        }
    }
    let mut addresses = Vec::new();
    for entry in &rules.allow_addresses {
        match Cidr::parse(entry) {
            Ok(cidr) => addresses.push(cidr),
            Err(e) => c.error(
                span.clone(),
                format!("network.allow_addresses entry {entry:?}: {e}"),
            ),
        }
    }
    if hosts.is_empty() && !allow.is_empty() {
        return Network::None;
    }
    Network::Egress(EgressPolicy::new(hosts, addresses))
}

/// `mode = "host"`: the host's network, TCP narrowed by Landlock when ports are given.
fn check_host_network(
    c: &mut Checker<'_>,
    span: std::ops::Range<usize>,
    rules: &crate::model::NetworkRulesFile,
) -> Network {
    if !rules.allow_addresses.is_empty() {
        c.error(
            span.clone(),
            "network.allow_addresses belongs to the egress proxy (allow = [...]), not to mode = \"host\"",
        );
    }
    let ports = |entries: &[String], c: &mut Checker<'_>| -> Vec<u16> {
        let mut out = Vec::new();
        for entry in entries {
            match entry.strip_prefix("tcp:").map(str::parse::<u16>) {
                Some(Ok(port)) if port > 0 => out.push(port),
                _ => c.error(
                    span.clone(),
                    format!("network rule {entry:?} must look like \"tcp:443\" (port 1-65535)"),
                ),
            }
        }
        out
    };
    // A list written out, even empty, is the ports the sandbox gets: `connect = []` reads
    // "no TCP" and must not turn into every port. Only a table without either list leaves
    // TCP as the host has it, as `network = "host"` does.
    let given = rules.connect.is_some() || rules.bind.is_some();
    let connect = ports(rules.connect.as_deref().unwrap_or_default(), c);
    let bind = ports(rules.bind.as_deref().unwrap_or_default(), c);
    let tcp = given.then_some(TcpPorts { connect, bind });
    warn_host_network(c, span, tcp.as_ref());
    Network::Host {
        tcp,
        udp: rules.udp.unwrap_or(false),
    }
}

fn warn_host_network(c: &mut Checker<'_>, span: std::ops::Range<usize>, tcp: Option<&TcpPorts>) {
    let what = match tcp {
        Some(t) if t.connect.is_empty() && t.bind.is_empty() => "no TCP port is allowed",
        Some(_) => "only the listed TCP ports are filtered",
        None => "no TCP port is filtered",
    };
    c.warning(
        span,
        format!(
            "network = \"host\" shares the host's network: tools reach every host service and address their ports allow ({what}); prefer allow = [...] through the egress proxy"
        ),
    );
}

/// `syscalls`: the base allowlist, extra names to allow (never one that defeats the filter)
/// and names to deny; the socket families follow the network.
fn check_syscalls(
    c: &mut Checker<'_>,
    syscalls: Option<&SyscallsFile>,
    network: &Network,
) -> SyscallPolicy {
    let default_syscalls = SyscallsFile::default();
    let syscalls_file = syscalls.unwrap_or(&default_syscalls);
    let mut allow: BTreeSet<String> = BTreeSet::new();
    match &syscalls_file.base {
        Some(base) if base.get_ref() != "default" => {
            c.error(
                base.span(),
                format!(
                    "syscalls.base must be \"default\", not {:?}",
                    base.get_ref()
                ),
            );
        }
        _ => allow.extend(DEFAULT_ALLOW.iter().map(|s| s.to_string())),
    }
    for name in &syscalls_file.allow {
        let n = name.get_ref();
        if syscall_number(n).is_none() {
            c.error(name.span(), format!("unknown syscall {n:?}"));
        } else if is_never_allowed(n) {
            c.error(
                name.span(),
                format!("syscall {n:?} can never be allowed: it defeats the sandbox (see docs/policy.md, Seccomp)"),
            );
        } else {
            allow.insert(n.clone());
        }
    }
    let mut deny = BTreeSet::new();
    for name in &syscalls_file.deny {
        let n = name.get_ref();
        if syscall_number(n).is_none() {
            c.error(name.span(), format!("unknown syscall {n:?}"));
        } else {
            deny.insert(n.clone());
        }
    }
    let families = match network {
        Network::None => SocketFamilies::UnixOnly,
        Network::Loopback | Network::Egress(_) | Network::Host { udp: true, .. } => {
            SocketFamilies::UnixAndInet
        }
        Network::Host { udp: false, .. } => SocketFamilies::UnixAndInetStreams,
    };
    SyscallPolicy {
        allow,
        deny,
        families,
    }
}

/// `limits`: each within its bounds, defaults for the rest.
fn check_limits(c: &mut Checker<'_>, limits: Option<&LimitsFile>) -> Limits {
    let default_limits = LimitsFile::default();
    let l = limits.unwrap_or(&default_limits);
    Limits {
        memory_bytes: l
            .memory
            .as_ref()
            .and_then(|v| c.size(v, "limits.memory", bounds::MEMORY_BYTES))
            .unwrap_or(defaults::MEMORY_BYTES),
        pids: l
            .pids
            .as_ref()
            .and_then(|v| c.integer(v, "limits.pids", bounds::PIDS))
            .unwrap_or(defaults::PIDS),
        timeout: l
            .timeout
            .as_ref()
            .and_then(|v| c.duration(v, "limits.timeout"))
            .unwrap_or(defaults::TIMEOUT),
        cpu: l.cpu.as_ref().and_then(|v| {
            let d = c.duration(v, "limits.cpu")?;
            if d < Duration::from_secs(1) || d.subsec_nanos() != 0 {
                c.error(
                    v.span(),
                    "limits.cpu is enforced with RLIMIT_CPU: use whole seconds",
                );
                return None;
            }
            Some(d)
        }),
        cpu_quota_percent: l.cpu_quota.as_ref().and_then(|v| {
            let parsed = v
                .get_ref()
                .trim()
                .strip_suffix('%')
                .and_then(|n| n.trim().parse::<u32>().ok());
            match parsed {
                Some(p) if (1..=25_600).contains(&p) => Some(p),
                _ => {
                    c.error(v.span(), "limits.cpu_quota must be a percentage of one core between 1% and 25600%, like \"50%\"");
                    None
                }
            }
        }),
        output_bytes: l
            .output
            .as_ref()
            .and_then(|v| c.size(v, "limits.output", bounds::OUTPUT_BYTES))
            .unwrap_or(defaults::OUTPUT_BYTES),
        open_files: l
            .open_files
            .as_ref()
            .and_then(|v| c.integer(v, "limits.open_files", bounds::OPEN_FILES))
            .unwrap_or(defaults::OPEN_FILES),
        file_size_bytes: l
            .file_size
            .as_ref()
            .and_then(|v| c.size(v, "limits.file_size", bounds::FILE_SIZE_BYTES))
            .unwrap_or(defaults::FILE_SIZE_BYTES),
    }
}

/// `env`: the whole environment of tools (a default `PATH` when empty).
fn check_env(
    c: &mut Checker<'_>,
    vars: &BTreeMap<Spanned<String>, Spanned<String>>,
) -> Vec<(String, String)> {
    let mut env = Vec::new();
    if vars.is_empty() {
        env.push(("PATH".to_string(), defaults::PATH.to_string()));
    }
    for (key, value) in vars {
        let k = key.get_ref();
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            c.error(
                key.span(),
                format!("environment name {k:?} must be non-empty, without `=` or NUL"),
            );
            continue;
        }
        if value.get_ref().contains('\0') {
            c.error(
                value.span(),
                format!("environment value of {k} must not contain NUL"),
            );
            continue;
        }
        if k.starts_with("LD_") {
            c.warning(
                key.span(),
                format!("{k} changes which code the dynamic linker loads"),
            );
        }
        env.push((k.clone(), value.get_ref().clone()));
    }
    env
}

/// `require`: how hard each isolation layer is required.
fn check_require(c: &mut Checker<'_>, require: Option<&RequireFile>) -> Requirements {
    let default_require = RequireFile::default();
    let r = require.unwrap_or(&default_require);
    Requirements {
        landlock: c.requirement(r.landlock.as_ref(), "landlock"),
        seccomp: c.requirement(r.seccomp.as_ref(), "seccomp"),
        cgroup: c.requirement(r.cgroup.as_ref(), "cgroup"),
    }
}

fn check_hostname(c: &mut Checker<'_>, hostname: Option<&Spanned<String>>) -> String {
    let Some(h) = hostname else {
        return defaults::HOSTNAME.to_string();
    };
    let text = h.get_ref();
    let ok = !text.is_empty()
        && text.len() <= 64
        && text
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '.');
    if !ok {
        c.error(
            h.span(),
            "hostname must be 1-64 characters of letters, digits, `-` and `.`",
        );
    }
    text.clone()
}

/// `cwd`: as given, else `/tmp` when the profile mounts a tmpfs there, else `/`.
fn check_cwd(
    c: &mut Checker<'_>,
    cwd: Option<&Spanned<String>>,
    tmpfs: &[(String, u64)],
) -> String {
    match cwd {
        Some(cwd) => c.path(cwd, "cwd").unwrap_or_default(),
        None if tmpfs.iter().any(|(p, _)| p == "/tmp") => "/tmp".to_string(),
        None => "/".to_string(),
    }
}

fn check_proc(c: &mut Checker<'_>, proc: Option<&Spanned<String>>) -> ProcView {
    match proc.map(|v| (v, v.get_ref().as_str())) {
        None | Some((_, "masked")) => ProcView::Masked,
        Some((_, "full")) => ProcView::Full,
        Some((value, other)) => {
            c.error(
                value.span(),
                format!("proc must be \"masked\" or \"full\", not {other:?}"),
            );
            ProcView::Masked
        }
    }
}
