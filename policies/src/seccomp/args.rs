//! Argument rules: syscalls the allowlist lets through that still get `EPERM` for some
//! arguments (namespace flags on `clone`, terminal injection, socket families and raw
//! sockets, device nodes, `personality` changes).

use std::collections::BTreeMap;

use super::{SeccompError, SocketFamilies, number};

// Namespace flags refused on clone(2) (Docker's mask 0x7E020000, flag by flag).
const CLONE_NAMESPACE_FLAGS: [(u32, &str); 7] = [
    (0x0002_0000, "CLONE_NEWNS"),
    (0x0200_0000, "CLONE_NEWCGROUP"),
    (0x0400_0000, "CLONE_NEWUTS"),
    (0x0800_0000, "CLONE_NEWIPC"),
    (0x1000_0000, "CLONE_NEWUSER"),
    (0x2000_0000, "CLONE_NEWPID"),
    (0x4000_0000, "CLONE_NEWNET"),
];
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541C;
const S_IFMT: u32 = 0o170000;
const S_IFCHR: u32 = 0o020000;
const S_IFBLK: u32 = 0o060000;
const SOCK_TYPE_MASK: u32 = 0xf;
const SOCK_RAW: u32 = 3;
const SOCK_PACKET: u32 = 10;
// personality(2) values that change nothing dangerous: PER_LINUX, query, and Docker's set.
pub(super) const PERSONALITY_ALLOWED: [u32; 5] = [0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// A test on the low 32 bits of one argument. Only the low half is ever compared: `int`
/// arguments are truncated by the kernel, so comparing 64 bits would let high garbage bits
/// slip past (CVE-2019-10063).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Condition {
    pub(super) arg: u8,
    /// `arg & mask` is compared; `None` compares the whole low word.
    pub(super) mask: Option<u32>,
    /// true: equal to `value`; false: different from it.
    pub(super) equal: bool,
    pub(super) value: u32,
}

const fn eq(arg: u8, value: u32) -> Condition {
    Condition {
        arg,
        mask: None,
        equal: true,
        value,
    }
}

const fn ne(arg: u8, value: u32) -> Condition {
    Condition {
        arg,
        mask: None,
        equal: false,
        value,
    }
}

const fn masked_eq(arg: u8, mask: u32, value: u32) -> Condition {
    Condition {
        arg,
        mask: Some(mask),
        equal: true,
        value,
    }
}

/// One argument rule: a conjunction of conditions, and what it stands for in a denial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rule {
    /// Names the refusal in results (`denials[].rule`): what the tool asked for.
    pub(super) label: &'static str,
    pub(super) conditions: Vec<Condition>,
}

fn rule(label: &'static str, conditions: Vec<Condition>) -> Rule {
    Rule { label, conditions }
}

/// Argument rules under which a syscall that is otherwise allowed gets `EPERM`.
pub(super) fn argument_rules(
    families: SocketFamilies,
) -> Result<BTreeMap<u32, Vec<Rule>>, SeccompError> {
    let mut rules = BTreeMap::new();
    let clone = CLONE_NAMESPACE_FLAGS
        .iter()
        .map(|(flag, label)| rule(label, vec![masked_eq(0, *flag, *flag)]))
        .collect();
    rules.insert(number("clone")?, clone);
    rules.insert(
        number("ioctl")?,
        vec![
            rule("TIOCSTI", vec![eq(1, TIOCSTI)]),
            rule("TIOCLINUX", vec![eq(1, TIOCLINUX)]),
        ],
    );
    let allowed_families: &[u32] = match families {
        SocketFamilies::UnixOnly => &[libc::AF_UNIX as u32],
        SocketFamilies::UnixAndInet | SocketFamilies::UnixAndInetStreams => &[
            libc::AF_UNIX as u32,
            libc::AF_INET as u32,
            libc::AF_INET6 as u32,
        ],
    };
    let other_family: Vec<Condition> = allowed_families.iter().map(|f| ne(0, *f)).collect();
    let family_label = "address family the profile does not allow";
    let mut socket = vec![
        rule(family_label, other_family.clone()),
        rule("SOCK_RAW", vec![masked_eq(1, SOCK_TYPE_MASK, SOCK_RAW)]),
        rule(
            "SOCK_PACKET",
            vec![masked_eq(1, SOCK_TYPE_MASK, SOCK_PACKET)],
        ),
    ];
    if families == SocketFamilies::UnixAndInetStreams {
        for (family, label) in [
            (libc::AF_INET as u32, "AF_INET datagram socket"),
            (libc::AF_INET6 as u32, "AF_INET6 datagram socket"),
        ] {
            socket.push(rule(
                label,
                vec![
                    eq(0, family),
                    masked_eq(1, SOCK_TYPE_MASK, libc::SOCK_DGRAM as u32),
                ],
            ));
        }
    }
    rules.insert(number("socket")?, socket);
    rules.insert(
        number("socketpair")?,
        vec![rule(family_label, other_family)],
    );
    let device = |arg| {
        vec![
            rule("character device", vec![masked_eq(arg, S_IFMT, S_IFCHR)]),
            rule("block device", vec![masked_eq(arg, S_IFMT, S_IFBLK)]),
        ]
    };
    rules.insert(number("mknod")?, device(1));
    rules.insert(number("mknodat")?, device(2));
    rules.insert(
        number("personality")?,
        vec![rule(
            "personality change",
            PERSONALITY_ALLOWED.iter().map(|v| ne(0, *v)).collect(),
        )],
    );
    Ok(rules)
}

/// The label of argument rule `ordinal` (1-based, as the reporting program returns it) of
/// syscall `nr`; `None` for 0 or an ordinal the syscall has no rule for. Every family
/// setting numbers its rules alike; the streams-only one has them all.
pub(super) fn rule_label(nr: u32, ordinal: u32) -> Option<&'static str> {
    let index = usize::try_from(ordinal).ok()?.checked_sub(1)?;
    argument_rules(SocketFamilies::UnixAndInetStreams)
        .ok()?
        .remove(&nr)?
        .get(index)
        .map(|r| r.label)
}

#[cfg(test)]
mod tests {
    use super::super::interpret::Verdict;
    use super::super::test_support::{EPERM, default_policy, verdict};
    use super::super::{SocketFamilies, compile_seccomp_program};

    // Arguments are 64-bit in seccomp_data; these shadow the 32-bit program constants.
    const TIOCSTI: u64 = super::TIOCSTI as u64;
    const TIOCLINUX: u64 = super::TIOCLINUX as u64;
    const S_IFCHR: u64 = super::S_IFCHR as u64;
    const S_IFBLK: u64 = super::S_IFBLK as u64;
    const SOCK_RAW: u64 = super::SOCK_RAW as u64;
    const CLONE_NAMESPACE_FLAGS: [u64; 7] = [
        0x0002_0000,
        0x0200_0000,
        0x0400_0000,
        0x0800_0000,
        0x1000_0000,
        0x2000_0000,
        0x4000_0000,
    ];

    #[test]
    fn clone_with_any_namespace_flag_gets_eperm() {
        let p = compile_seccomp_program(&default_policy(SocketFamilies::UnixOnly)).unwrap();
        for flag in CLONE_NAMESPACE_FLAGS {
            assert_eq!(
                verdict(&p, "clone", [flag | 0x11, 0, 0, 0, 0, 0]),
                EPERM,
                "{flag:#x}"
            );
        }
    }

    #[test]
    fn terminal_injection_ioctls_get_eperm_even_with_high_bits_set() {
        let p = compile_seccomp_program(&default_policy(SocketFamilies::UnixOnly)).unwrap();
        assert_eq!(verdict(&p, "ioctl", [0, TIOCSTI, 0, 0, 0, 0]), EPERM);
        assert_eq!(verdict(&p, "ioctl", [0, TIOCLINUX, 0, 0, 0, 0]), EPERM);
        assert_eq!(
            verdict(&p, "ioctl", [0, (0x123 << 32) | TIOCSTI, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(
            verdict(&p, "ioctl", [0, 0x5401 /* TCGETS */, 0, 0, 0, 0]),
            Verdict::Allow
        );
    }

    #[test]
    fn socket_families_follow_the_network_setting() {
        let none = compile_seccomp_program(&default_policy(SocketFamilies::UnixOnly)).unwrap();
        let inet = compile_seccomp_program(&default_policy(SocketFamilies::UnixAndInet)).unwrap();
        let stream = 1;
        let af = |f: i32| f as u64;
        assert_eq!(
            verdict(&none, "socket", [af(libc::AF_UNIX), stream, 0, 0, 0, 0]),
            Verdict::Allow
        );
        assert_eq!(
            verdict(&none, "socket", [af(libc::AF_INET), stream, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(
            verdict(&inet, "socket", [af(libc::AF_INET), stream, 0, 0, 0, 0]),
            Verdict::Allow
        );
        assert_eq!(
            verdict(&inet, "socket", [af(libc::AF_INET6), stream, 0, 0, 0, 0]),
            Verdict::Allow
        );
        for family in [
            libc::AF_PACKET,
            libc::AF_NETLINK,
            libc::AF_VSOCK,
            libc::AF_ALG,
        ] {
            assert_eq!(
                verdict(&inet, "socket", [af(family), stream, 0, 0, 0, 0]),
                EPERM
            );
            assert_eq!(
                verdict(&none, "socketpair", [af(family), stream, 0, 0, 0, 0]),
                EPERM
            );
        }
        // The family is an int: high bits must not smuggle AF_PACKET past the filter.
        let smuggled = (1u64 << 32) | af(libc::AF_PACKET);
        assert_eq!(
            verdict(&inet, "socket", [smuggled, stream, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(
            verdict(&inet, "socket", [af(libc::AF_INET), SOCK_RAW, 0, 0, 0, 0]),
            EPERM
        );
    }

    #[test]
    fn a_host_network_without_udp_refuses_inet_datagram_sockets_only() {
        let streams =
            compile_seccomp_program(&default_policy(SocketFamilies::UnixAndInetStreams)).unwrap();
        let af = |f: i32| f as u64;
        let (stream, dgram) = (libc::SOCK_STREAM as u64, libc::SOCK_DGRAM as u64);
        let flags = (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as u64;
        for family in [libc::AF_INET, libc::AF_INET6] {
            assert_eq!(
                verdict(&streams, "socket", [af(family), stream | flags, 0, 0, 0, 0]),
                Verdict::Allow
            );
            assert_eq!(
                verdict(&streams, "socket", [af(family), dgram, 0, 0, 0, 0]),
                EPERM
            );
            assert_eq!(
                verdict(&streams, "socket", [af(family), dgram | flags, 0, 0, 0, 0]),
                EPERM
            );
        }
        assert_eq!(
            verdict(&streams, "socket", [af(libc::AF_UNIX), dgram, 0, 0, 0, 0]),
            Verdict::Allow
        );
        let inet = compile_seccomp_program(&default_policy(SocketFamilies::UnixAndInet)).unwrap();
        assert_eq!(
            verdict(&inet, "socket", [af(libc::AF_INET), dgram, 0, 0, 0, 0]),
            Verdict::Allow
        );
    }

    #[test]
    fn device_nodes_and_personality_changes_get_eperm() {
        let p = compile_seccomp_program(&default_policy(SocketFamilies::UnixOnly)).unwrap();
        assert_eq!(
            verdict(&p, "mknod", [0, S_IFCHR | 0o600, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(
            verdict(&p, "mknodat", [0, 0, S_IFBLK | 0o600, 0, 0, 0]),
            EPERM
        );
        assert_eq!(
            verdict(&p, "mknodat", [0, 0, 0o010000 /* FIFO */ | 0o600, 0, 0, 0]),
            Verdict::Allow
        );
        assert_eq!(
            verdict(&p, "personality", [0xffff_ffff, 0, 0, 0, 0, 0]),
            Verdict::Allow
        );
        assert_eq!(
            verdict(
                &p,
                "personality",
                [0x0040_0000 /* READ_IMPLIES_EXEC */, 0, 0, 0, 0, 0]
            ),
            EPERM
        );
    }
}
