//! What `airlock learn` observes of a command: the paths its syscalls name (read, written,
//! executed), the syscalls it made outside its profile's allowlist, and the addresses it
//! connected or sent to. Filled by the seccomp listener of a learning run, whose program
//! hands those syscalls over to be recorded and then let run; nothing here decides
//! anything, so what a tool does to its own memory meanwhile only spoils its own profile.
//! The destinations it asked the egress proxy for come from the proxy's events
//! ([`RecordProxied`]), whose recording policy let each one through.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::sys::{self, Notification};

/// Most distinct (path, access) pairs kept; the rest are counted in `dropped`.
const MAX_PATHS: usize = 20_000;
/// Most distinct destinations kept.
const MAX_DESTINATIONS: usize = 1_000;
/// Longest path read from a tool's memory.
const PATH_MAX: usize = 4096;
/// Most distinct destinations asked of the egress proxy that are kept: well under the
/// proxy's own connection limit, so that a command asking for many is seen to be cut off.
pub const MAX_PROXIED: usize = 256;
/// Most non-public addresses kept per proxied destination.
const MAX_ADDRESSES_KEPT: usize = 4;

/// How a path was used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Access {
    /// Looked up, opened for reading, listed.
    Read,
    /// Opened for writing, created, removed, renamed, changed.
    Write,
    /// Executed.
    Exec,
}

/// The evidence for one (path, access) pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// The first syscall seen using it.
    pub syscall: &'static str,
    /// How many times.
    pub count: u64,
}

/// Everything a learning run observed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observations {
    /// Absolute, lexically normalised paths as the command named them, by access.
    pub paths: BTreeMap<(String, Access), Evidence>,
    /// Syscalls the profile does not allow, which the command made (let through).
    pub outside_allowlist: BTreeMap<&'static str, u64>,
    /// `address:port`, or `unix:PATH`, the command connected, bound or sent to.
    pub destinations: BTreeMap<String, u64>,
    /// Destinations asked of the egress proxy and let through, by (host as asked, port).
    pub proxied: BTreeMap<(String, u16), Proxied>,
    /// Connections to the proxy for destinations past [`MAX_PROXIED`], not kept.
    pub proxied_dropped: u64,
    /// Connections the proxy refused while learning (its per-call limits, malformed
    /// requests, addresses that are never a destination).
    pub proxy_refused: u64,
    /// Observed syscalls whose path could not be read.
    pub unreadable: u64,
    /// Observations past the bounds.
    pub dropped: u64,
}

/// Where a learning run's listener records what it sees.
pub type ObservationLog = Arc<Mutex<Observations>>;

/// One destination asked of the egress proxy while learning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proxied {
    /// How it was asked (`CONNECT`, `HTTP` for an absolute-form request, `SOCKS5`), and
    /// how many times.
    pub asked: BTreeMap<&'static str, u64>,
    /// The loopback, private or link-local addresses it was connected to (a profile needs
    /// `allow_addresses` for them), at most a few.
    pub non_public: BTreeSet<IpAddr>,
}

/// Records each connection of a learning run's egress proxy into the observation log.
#[derive(Debug, Clone)]
pub struct RecordProxied(pub ObservationLog);

impl crate::egress::EventSink for RecordProxied {
    fn record(&self, event: &crate::egress::EgressEvent) {
        use crate::egress::proxy::EgressKind;
        let mut log = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let asked = match event.kind {
            EgressKind::Connect => "CONNECT",
            EgressKind::Forward => "HTTP",
            EgressKind::Socks5 => "SOCKS5",
            EgressKind::Unknown => "",
        };
        // The proxy parsed the host (a name is at most 253 bytes); the length check only
        // keeps this bound where it is recorded.
        if !event.allowed
            || asked.is_empty()
            || event.port == 0
            || event.host.is_empty()
            || event.host.len() > airlock_policy::egress::MAX_ENTRY_LEN
        {
            log.proxy_refused = log.proxy_refused.saturating_add(1);
            return;
        }
        let key = (event.host.clone(), event.port);
        let known = log.proxied.contains_key(&key);
        if !known && log.proxied.len() >= MAX_PROXIED {
            log.proxied_dropped = log.proxied_dropped.saturating_add(1);
            return;
        }
        let entry = log.proxied.entry(key).or_default();
        let count = entry.asked.entry(asked).or_default();
        *count = count.saturating_add(1);
        if let Some(address) = event.address
            && !airlock_policy::egress::classify(address.ip()).is_public()
            && entry.non_public.len() < MAX_ADDRESSES_KEPT
        {
            entry.non_public.insert(address.ip().to_canonical());
        }
    }
}

/// What a call's seccomp listener does besides answering refusals.
#[derive(Debug, Clone, Default)]
pub enum Watching {
    /// Only refusals: the profile's own program hands nothing else over.
    #[default]
    Refusals,
    /// Diagnosing (the observing form): each path an observed syscall names is looked up in
    /// the tool's own root, and one its mounts lack (but the host has) or hold read-only is
    /// a `mounts` denial; a connection the profile's network cannot make is a `network` one.
    Diagnose,
    /// Learning (the learning form): everything observed is recorded into the log.
    Learn(ObservationLog),
}

/// Why a diagnosed path or destination would fail in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    /// `true` for a destination (a `network` denial), `false` for a path (`mounts`).
    pub(crate) network: bool,
    pub(crate) object: String,
    pub(crate) rule: &'static str,
}

/// What diagnosing `notification` (a call of `syscall`) finds, for a sandbox whose network
/// is `network`.
pub(crate) fn diagnose(
    syscall: &'static str,
    notification: &Notification,
    network: airlock_protocol::NetworkMode,
) -> Vec<Finding> {
    use airlock_protocol::NetworkMode;
    let mut found = Vec::new();
    for arg in path_args(syscall) {
        let Ok(Some((path, access))) = path_of(notification, &arg) else {
            continue;
        };
        let in_root = |p: &str| sys::stat_in_root(notification.pid, p).ok();
        let host_has = |p: &str| std::fs::symlink_metadata(p).is_ok();
        // A write names a path that may not exist yet: then its directory decides. The
        // path itself is looked up once.
        let (target, state) = match (access, in_root(&path)) {
            (_, None) => continue,
            (Access::Write, Some(None)) => {
                let parent = parent_of(&path).to_string();
                let state = in_root(&parent);
                (parent, state)
            }
            (_, state) => (path.clone(), state),
        };
        let rule = match state {
            Some(None) if host_has(&target) => "not in the sandbox",
            Some(Some(true)) if access == Access::Write => "read-only",
            _ => continue,
        };
        found.push(Finding {
            network: false,
            object: path,
            rule,
        });
    }
    if syscall == "connect"
        && let Some(destination) =
            destination_of(notification.pid, notification.args[1], notification.args[2])
        && !destination.starts_with("unix:")
    {
        let loopback = destination.starts_with("127.") || destination.starts_with("[::1]");
        let rule = match network {
            NetworkMode::None | NetworkMode::NoneShared => Some("the profile has no network"),
            NetworkMode::Loopback if !loopback => {
                Some("the profile has only loopback (and its egress proxy, by name)")
            }
            _ => None,
        };
        if let Some(rule) = rule {
            found.push(Finding {
                network: true,
                object: destination,
                rule,
            });
        }
    }
    found
}

fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// Where an observed syscall's path sits: its argument, and the argument holding the
/// directory descriptor it is relative to (none: relative to the working directory).
#[derive(Debug, Clone, Copy)]
struct PathArg {
    path: usize,
    dirfd: Option<usize>,
    access: AccessFrom,
}

/// How an argument's access is known.
#[derive(Debug, Clone, Copy)]
enum AccessFrom {
    Fixed(Access),
    /// From `open`-style flags in this argument.
    OpenFlags(usize),
}

const fn at(path: usize, access: Access) -> PathArg {
    PathArg {
        path,
        dirfd: None,
        access: AccessFrom::Fixed(access),
    }
}

const fn at_dir(dirfd: usize, path: usize, access: Access) -> PathArg {
    PathArg {
        path,
        dirfd: Some(dirfd),
        access: AccessFrom::Fixed(access),
    }
}

/// The paths each observed syscall names.
fn path_args(syscall: &str) -> Vec<PathArg> {
    use Access::{Exec, Read, Write};
    match syscall {
        "open" => vec![PathArg {
            path: 0,
            dirfd: None,
            access: AccessFrom::OpenFlags(1),
        }],
        "openat" => vec![PathArg {
            path: 1,
            dirfd: Some(0),
            access: AccessFrom::OpenFlags(2),
        }],
        // openat2's flags live in memory (`struct open_how`): counted as a read.
        "openat2" => vec![at_dir(0, 1, Read)],
        "creat" | "mkdir" | "unlink" | "rmdir" | "truncate" | "chmod" => vec![at(0, Write)],
        "execve" => vec![at(0, Exec)],
        "execveat" => vec![at_dir(0, 1, Exec)],
        "stat" | "lstat" | "access" | "readlink" | "chdir" => vec![at(0, Read)],
        "newfstatat" | "statx" | "faccessat" | "faccessat2" | "readlinkat" => {
            vec![at_dir(0, 1, Read)]
        }
        "mkdirat" | "unlinkat" | "fchmodat" | "utimensat" => vec![at_dir(0, 1, Write)],
        "rename" | "link" => vec![at(0, Write), at(1, Write)],
        "renameat" | "renameat2" | "linkat" => vec![at_dir(0, 1, Write), at_dir(2, 3, Write)],
        "symlink" => vec![at(1, Write)],
        "symlinkat" => vec![at_dir(1, 2, Write)],
        _ => vec![],
    }
}

/// Where an observed syscall's socket address sits: (address argument, length argument).
fn address_args(syscall: &str) -> Option<(usize, usize)> {
    match syscall {
        "connect" | "bind" => Some((1, 2)),
        "sendto" => Some((4, 5)),
        _ => None,
    }
}

/// What one observed syscall named, read from the tool's memory.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    paths: Vec<(String, Access)>,
    unreadable: u64,
    destination: Option<String>,
}

/// Reads what `notification` (a call of `syscall`) names. The caller records it only if
/// the notification is still valid afterwards: its process may have been killed and its pid
/// reused meanwhile, and then what was read belongs to another process.
pub(crate) fn seen(syscall: &'static str, notification: &Notification) -> Seen {
    let mut seen = Seen::default();
    for arg in path_args(syscall) {
        match path_of(notification, &arg) {
            Ok(Some(seen_path)) => seen.paths.push(seen_path),
            // An empty path (`AT_EMPTY_PATH`, a null `utimensat`) names the descriptor.
            Ok(None) => {}
            Err(()) => seen.unreadable += 1,
        }
    }
    seen.destination = address_args(syscall).and_then(|(addr, len)| {
        destination_of(
            notification.pid,
            notification.args[addr],
            notification.args[len],
        )
    });
    seen
}

/// Records what [`seen`] read into `log`.
pub(crate) fn record(log: &ObservationLog, syscall: &'static str, seen: Seen) {
    let Seen {
        paths: seen,
        unreadable,
        destination,
    } = seen;
    let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
    log.unreadable = log.unreadable.saturating_add(unreadable);
    for (path, access) in seen {
        let key = (path, access);
        if let Some(evidence) = log.paths.get_mut(&key) {
            evidence.count = evidence.count.saturating_add(1);
        } else if log.paths.len() < MAX_PATHS {
            log.paths.insert(key, Evidence { syscall, count: 1 });
        } else {
            log.dropped = log.dropped.saturating_add(1);
        }
    }
    if let Some(destination) = destination {
        if let Some(count) = log.destinations.get_mut(&destination) {
            *count = count.saturating_add(1);
        } else if log.destinations.len() < MAX_DESTINATIONS {
            log.destinations.insert(destination, 1);
        } else {
            log.dropped = log.dropped.saturating_add(1);
        }
    }
}

/// Records a syscall outside the profile's allowlist.
pub(crate) fn outside_allowlist(log: &ObservationLog, syscall: &'static str) {
    let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
    let count = log.outside_allowlist.entry(syscall).or_default();
    *count = count.saturating_add(1);
}

/// The absolute path and access one argument names: `Ok(None)` for an empty or null path
/// (the syscall names a descriptor), `Err` when it cannot be read or resolved.
fn path_of(notification: &Notification, arg: &PathArg) -> Result<Option<(String, Access)>, ()> {
    let address = notification.args[arg.path];
    if address == 0 {
        return Ok(None);
    }
    let raw = sys::read_tool_memory(notification.pid, address, PATH_MAX, true).map_err(|_| ())?;
    if raw.is_empty() {
        return Ok(None);
    }
    let named = PathBuf::from(String::from_utf8_lossy(&raw).into_owned());
    let absolute = if named.is_absolute() {
        named
    } else {
        let base = match arg.dirfd.map(|i| notification.args[i] as u32 as i32) {
            None | Some(libc::AT_FDCWD) => format!("/proc/{}/cwd", notification.pid),
            Some(fd) => format!("/proc/{}/fd/{fd}", notification.pid),
        };
        std::fs::read_link(base).map_err(|_| ())?.join(named)
    };
    let access = match arg.access {
        AccessFrom::Fixed(access) => access,
        AccessFrom::OpenFlags(i) => {
            let flags = notification.args[i] as u32 as i32;
            let writes = flags & libc::O_ACCMODE != libc::O_RDONLY
                || flags & (libc::O_CREAT | libc::O_TRUNC) != 0;
            if writes { Access::Write } else { Access::Read }
        }
    };
    Ok(Some((normalise(&absolute), access)))
}

/// `path` with `.` and `..` resolved lexically (the way the profile names paths; symlinks
/// are the learner's to follow on the host).
pub fn normalise(path: &Path) -> String {
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let mut out = String::new();
    for part in parts {
        out.push('/');
        out.push_str(&part.to_string_lossy());
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// A socket address in the tool's memory, as `address:port` or `unix:PATH`.
fn destination_of(pid: u32, address: u64, len: u64) -> Option<String> {
    if address == 0 {
        return None;
    }
    let len = usize::try_from(len).ok()?.min(128);
    let bytes = sys::read_tool_memory(pid, address, len, false).ok()?;
    let family = u16::from_ne_bytes([*bytes.first()?, *bytes.get(1)?]);
    let port = |b: &[u8]| u16::from_be_bytes([b[2], b[3]]);
    match i32::from(family) {
        libc::AF_INET if bytes.len() >= 8 => {
            let ip = std::net::Ipv4Addr::new(bytes[4], bytes[5], bytes[6], bytes[7]);
            Some(format!("{ip}:{}", port(&bytes)))
        }
        libc::AF_INET6 if bytes.len() >= 24 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&bytes[8..24]);
            let ip = std::net::Ipv6Addr::from(octets);
            Some(format!("[{ip}]:{}", port(&bytes)))
        }
        libc::AF_UNIX => {
            let name = bytes.get(2..)?;
            Some(match name.first() {
                Some(0) => format!("unix:@{}", String::from_utf8_lossy(&name[1..])),
                _ => {
                    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
                    format!("unix:{}", String::from_utf8_lossy(&name[..end]))
                }
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_lexically() {
        assert_eq!(normalise(Path::new("/usr/lib/../bin/./sh")), "/usr/bin/sh");
        assert_eq!(normalise(Path::new("/..")), "/");
        assert_eq!(normalise(Path::new("/a//b/")), "/a/b");
    }

    fn proxied(host: &str, port: u16, address: &str) -> crate::egress::EgressEvent {
        crate::egress::EgressEvent {
            kind: crate::egress::proxy::EgressKind::Connect,
            host: host.into(),
            port,
            address: Some(std::net::SocketAddr::new(address.parse().unwrap(), port)),
            allowed: true,
            rule_or_reason: "any destination (recording)".into(),
            bytes_up: 0,
            bytes_down: 0,
            end: None,
            error: None,
        }
    }

    #[test]
    fn a_command_asking_the_proxy_for_many_destinations_is_recorded_within_bounds() {
        use crate::egress::EventSink;
        let log = ObservationLog::default();
        let sink = RecordProxied(Arc::clone(&log));
        for i in 0..10_000u32 {
            let host = format!("h{i}.example");
            sink.record(&proxied(&host, 443, "93.184.216.34"));
        }
        // The same destination again is counted, not added.
        sink.record(&proxied("h0.example", 443, "93.184.216.34"));
        // A host longer than any entry, however the proxy came to pass it, is not kept.
        sink.record(&proxied(&"a".repeat(5_000), 443, "93.184.216.34"));
        let mut refused = proxied("refused.example", 443, "93.184.216.34");
        refused.allowed = false;
        sink.record(&refused);
        let log = log.lock().unwrap();
        assert_eq!(log.proxied.len(), MAX_PROXIED);
        assert_eq!(log.proxied_dropped, 10_000 - MAX_PROXIED as u64);
        assert_eq!(log.proxy_refused, 2);
        let first = &log.proxied[&("h0.example".to_string(), 443)];
        assert_eq!(first.asked["CONNECT"], 2);
        assert!(first.non_public.is_empty());
    }

    #[test]
    fn a_proxied_destination_keeps_the_non_public_addresses_it_reached() {
        use crate::egress::EventSink;
        let log = ObservationLog::default();
        let sink = RecordProxied(Arc::clone(&log));
        sink.record(&proxied("127.0.0.1", 8080, "127.0.0.1"));
        for i in 1..=10u8 {
            sink.record(&proxied("intranet.example", 80, &format!("10.0.0.{i}")));
        }
        let log = log.lock().unwrap();
        let local = &log.proxied[&("127.0.0.1".to_string(), 8080)];
        assert_eq!(
            local.non_public.iter().collect::<Vec<_>>(),
            [&"127.0.0.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            log.proxied[&("intranet.example".to_string(), 80)]
                .non_public
                .len(),
            MAX_ADDRESSES_KEPT
        );
    }

    #[test]
    fn every_observed_syscall_is_read_for_a_path_or_an_address() {
        for syscall in airlock_policy::seccomp::OBSERVED {
            assert!(
                !path_args(syscall).is_empty() || address_args(syscall).is_some(),
                "{syscall}"
            );
        }
    }
}
