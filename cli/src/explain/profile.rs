//! A profile in facts: its paths, network, syscall filter, limits and layers.

use airlock_policy::compile::HIDDEN_IN_PROC;
use airlock_policy::seccomp::{DEFAULT_ALLOW, DENIED_EPERM_GROUPS, SocketFamilies};
use airlock_policy::units::{format_duration, format_size};
use airlock_policy::validate::{Network, ProcView, Profile};
use airlock_protocol::Requirement;

use super::facts::{
    DenialFacts, DenialGroup, LimitFacts, NetworkFacts, PathFacts, ProcFacts, ProfileFacts,
    RequireFacts, SyscallFacts, SyscallGroup, TmpfsFacts,
};

/// The groups of [`DEFAULT_ALLOW`], in its order, each named with its first member (the
/// list is written group by group in policies/src/seccomp/tables.rs).
const SYSCALL_GROUPS: &[(&str, &str)] = &[
    ("descriptors and I/O", "read"),
    ("files and directories", "open"),
    ("memory", "mmap"),
    ("processes and threads", "clone"),
    ("signals and timers", "rt_sigaction"),
    ("time and randomness", "clock_gettime"),
    ("System V and POSIX IPC", "shmget"),
    ("sockets", "socket"),
    ("legacy asynchronous I/O", "io_setup"),
];

/// Syscalls no policy can allow, answered with ENOSYS (policies/src/seccomp/tables.rs).
const ALWAYS_ENOSYS: [&str; 4] = [
    "clone3",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
];

/// The namespaces every worker gets (supervisor/src/sys.rs).
const NAMESPACES: [&str; 7] = ["user", "mount", "pid", "net", "ipc", "uts", "cgroup"];

fn requirement_word(requirement: Requirement) -> &'static str {
    match requirement {
        Requirement::Required => "required",
        Requirement::BestEffort => "best_effort",
    }
}

pub(super) fn describe_profile(profile: &Profile) -> ProfileFacts {
    let paths = |grants: &[airlock_policy::validate::PathGrant]| {
        grants
            .iter()
            .map(|g| PathFacts {
                path: g.path.clone(),
                optional: g.optional,
            })
            .collect()
    };
    let limits = &profile.limits;
    ProfileFacts {
        name: profile.name.clone(),
        read_only: paths(&profile.read),
        read_write: paths(&profile.write),
        tmpfs: profile
            .tmpfs
            .iter()
            .map(|(path, size)| TmpfsFacts {
                path: path.clone(),
                size_bytes: *size,
                size: format_size(*size),
            })
            .collect(),
        workspace: profile.workspace.as_ref().map(|w| TmpfsFacts {
            path: w.path.clone(),
            size_bytes: w.size_bytes,
            size: format_size(w.size_bytes),
        }),
        network: describe_network(&profile.network),
        syscalls: describe_syscalls(profile),
        limits: LimitFacts {
            memory_bytes: limits.memory_bytes,
            memory: format_size(limits.memory_bytes),
            pids: limits.pids,
            timeout_ms: u64::try_from(limits.timeout.as_millis()).unwrap_or(u64::MAX),
            timeout: format_duration(limits.timeout),
            cpu_seconds: limits.cpu.map(|d| d.as_secs()),
            cpu: limits
                .cpu
                .map_or_else(|| "unlimited".to_string(), format_duration),
            output_bytes: limits.output_bytes,
            output: format_size(limits.output_bytes),
            open_files: limits.open_files,
            file_size_bytes: limits.file_size_bytes,
            file_size: format_size(limits.file_size_bytes),
        },
        denials: DenialFacts {
            seccomp: "reported: every refused syscall by name, with its errno and argument rule \
                      (unavailable where the kernel gives no seccomp listener; clone3 is never \
                      listed: every fork tries it first)",
            landlock: "unavailable, unless the supervisor reads the kernel's audit \
                       (--landlock-audit: root, Landlock ABI 7, audit enabled): then every \
                       path or port Landlock refused, with the rights it lacked",
            mounts: "unavailable, unless the call is diagnosed (airlock exec --diagnose): then \
                     every path it named that the sandbox lacks or holds read-only",
            network: match profile.network {
                Network::Egress(_) => "reported: every destination the proxy refused, and why",
                _ => "unavailable: without an allowlist nothing answers a connection to refuse it",
            },
            limits: "reported: the limit that ended the call (memory, pids, cpu_time, \
                     file_size, deadline), refused forks and cut output",
        },
        env: profile.env.iter().cloned().collect(),
        hostname: profile.hostname.clone(),
        cwd: profile.cwd.clone(),
        proc: match profile.proc {
            ProcView::Masked => ProcFacts {
                view: "masked",
                hidden: HIDDEN_IN_PROC.to_vec(),
            },
            ProcView::Full => ProcFacts {
                view: "full",
                hidden: Vec::new(),
            },
        },
        namespaces: NAMESPACES
            .iter()
            .map(|ns| match (ns, &profile.network) {
                // Not a namespace of its own: said so, as the result record says it.
                (&"net", Network::Host { .. }) => "net:host",
                _ => ns,
            })
            .collect(),
        require: RequireFacts {
            landlock: requirement_word(profile.require.landlock),
            seccomp: requirement_word(profile.require.seccomp),
            cgroup: requirement_word(profile.require.cgroup),
        },
    }
}

fn ports(list: &[u16]) -> String {
    if list.is_empty() {
        "no port".into()
    } else {
        list.iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn describe_network(network: &Network) -> NetworkFacts {
    let facts = |mode, summary: String| NetworkFacts {
        mode,
        summary,
        tcp_connect: None,
        tcp_bind: None,
        udp: false,
        allow: Vec::new(),
        allow_addresses: Vec::new(),
    };
    match network {
        Network::None => facts(
            "none",
            "no network: only AF_UNIX sockets, in a network namespace with no \
             interface up (a root supervisor on a kernel that scopes abstract \
             unix sockets to each worker, Landlock ABI 6, shares one empty \
             namespace between workers; elsewhere each gets a fresh one)"
                .into(),
        ),
        Network::Loopback => facts(
            "loopback",
            "loopback only: a fresh network namespace with just `lo` up (the \
             sandbox can talk to itself, not to the host or the internet)"
                .into(),
        ),
        Network::Egress(policy) => {
            let allow: Vec<String> = policy.hosts().iter().map(ToString::to_string).collect();
            let allow_addresses: Vec<String> =
                policy.addresses().iter().map(ToString::to_string).collect();
            let listed = |items: &[String]| {
                if items.is_empty() {
                    "none".to_string()
                } else {
                    items.join(", ")
                }
            };
            NetworkFacts {
                summary: format!(
                    "egress through airlock's proxy only: a fresh network namespace with just \
                     `lo`, where HTTP_PROXY/HTTPS_PROXY/ALL_PROXY point at the supervisor's \
                     proxy; it lets through {} (ports 80 and 443 where none is given) and \
                     connects to loopback, private, link-local or metadata addresses only \
                     within {}; no DNS inside, the proxy resolves once and connects to the \
                     address it checked",
                    listed(&allow),
                    listed(&allow_addresses)
                ),
                allow,
                allow_addresses,
                ..facts("egress", String::new())
            }
        }
        Network::Host { tcp, udp } => {
            let tcp_text = match tcp {
                Some(tcp) => format!(
                    "TCP narrowed by Landlock (ABI 4 / Linux 6.7): connect to {}, bind to {}",
                    ports(&tcp.connect),
                    ports(&tcp.bind)
                ),
                None => "every TCP port".to_string(),
            };
            let udp_text = if *udp {
                "UDP allowed"
            } else {
                "UDP sockets refused by the seccomp filter"
            };
            NetworkFacts {
                summary: format!(
                    "net:host, the host's own network: {tcp_text}; {udp_text}; abstract unix \
                     sockets scoped to the sandbox (ABI 6, required)"
                ),
                tcp_connect: tcp.as_ref().map(|t| t.connect.clone()),
                tcp_bind: tcp.as_ref().map(|t| t.bind.clone()),
                udp: *udp,
                ..facts("host", String::new())
            }
        }
    }
}

fn describe_syscalls(profile: &Profile) -> SyscallFacts {
    let policy = &profile.syscalls;
    let allowed: Vec<&String> = policy
        .allow
        .iter()
        .filter(|s| !policy.deny.contains(*s))
        .collect();
    let is_allowed = |name: &str| allowed.iter().any(|s| s.as_str() == name);

    // Group boundaries by position of each group's first member in DEFAULT_ALLOW.
    let mut starts: Vec<(usize, &'static str)> = SYSCALL_GROUPS
        .iter()
        .filter_map(|(group, first)| {
            DEFAULT_ALLOW
                .iter()
                .position(|s| s == first)
                .map(|i| (i, *group))
        })
        .collect();
    starts.sort_unstable();
    let groups = starts
        .iter()
        .enumerate()
        .map(|(n, (start, group))| {
            let end = starts.get(n + 1).map_or(DEFAULT_ALLOW.len(), |(e, _)| *e);
            let members = DEFAULT_ALLOW.get(*start..end).unwrap_or_default();
            SyscallGroup {
                name: group,
                allowed: members.iter().filter(|s| is_allowed(s)).count(),
                of: members.len(),
            }
        })
        .collect();

    let always_eperm = DENIED_EPERM_GROUPS
        .iter()
        .map(|(category, members)| DenialGroup {
            category,
            syscalls: members.iter().map(|s| s.to_string()).collect(),
        })
        .filter(|g| !g.syscalls.is_empty())
        .collect();

    let families: Vec<&'static str> = match policy.families {
        SocketFamilies::UnixOnly => vec!["AF_UNIX"],
        SocketFamilies::UnixAndInet => vec!["AF_UNIX", "AF_INET", "AF_INET6"],
        SocketFamilies::UnixAndInetStreams => {
            vec!["AF_UNIX", "AF_INET (stream)", "AF_INET6 (stream)"]
        }
    };
    SyscallFacts {
        allowed_count: allowed.len(),
        otherwise: "ENOSYS",
        groups,
        added: allowed
            .iter()
            .filter(|s| !DEFAULT_ALLOW.contains(&s.as_str()))
            .map(|s| s.to_string())
            .collect(),
        denied_by_profile: policy.deny.iter().cloned().collect(),
        always_eperm,
        argument_rules: vec![
            "clone with any CLONE_NEW* flag (no nested namespaces)".into(),
            "ioctl TIOCSTI and TIOCLINUX (no typing into the terminal)".into(),
            format!(
                "socket and socketpair outside {}, and SOCK_RAW or SOCK_PACKET",
                families.join(", ")
            ),
            "mknod of character or block devices".into(),
            "personality changes (other than the harmless values)".into(),
        ],
        always_enosys: ALWAYS_ENOSYS.to_vec(),
        socket_families: families,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explain::validate_text;
    use airlock_policy::presets;

    #[test]
    fn every_syscall_group_starts_at_a_member_of_the_default_allowlist() {
        for (group, first) in SYSCALL_GROUPS {
            assert!(DEFAULT_ALLOW.contains(first), "{group}: {first}");
        }
    }

    #[test]
    fn groups_cover_the_whole_default_allowlist() {
        let text = presets::preset_text("default").unwrap();
        let (validated, _, _) = validate_text(text, "default").unwrap();
        let facts = describe_syscalls(&validated.profiles["default"]);
        let total: usize = facts.groups.iter().map(|g| g.of).sum();
        assert_eq!(total, DEFAULT_ALLOW.len());
        assert_eq!(facts.allowed_count, DEFAULT_ALLOW.len());
        assert!(facts.added.is_empty());
    }
}
