//! Compiles a profile's syscall policy into one seccomp BPF program.
//!
//! Outcomes, a documented choice (see docs/policy.md, "Seccomp"):
//! - a syscall from a non-native architecture (`int 0x80`) or with the x32 bit set: the
//!   process is killed (`SIGSYS`, reported as `seccomp_violation`);
//! - a known-dangerous syscall (the [`DENIED_EPERM_GROUPS`] table, namespace flags on `clone`,
//!   `TIOCSTI`/`TIOCLINUX`, socket families outside the profile, device `mknod`,
//!   `personality` changes, and the profile's own `deny` list): `EPERM`;
//! - anything else not on the allowlist, including `clone3` and `io_uring_*`: `ENOSYS`, so
//!   libc and runtimes fall back (glibc treats `EPERM` from `clone3` as fatal; tokio-uring
//!   and libuv fall back to epoll on `ENOSYS`).
//!
//! The program is generated here rather than by seccompiler: seccompiler emits one compare
//! per syscall in a linear chain (about 1,100 instructions for the default profile), and when
//! a filter is attached the kernel runs it once for every syscall number to build its allow
//! cache, so installing such a chain was most of a worker's confinement
//! (docs/performance-breakdown.md has the figures). Here the syscall numbers are split
//! into runs of equal outcome and searched with a binary tree of `JGE`s — a few hundred
//! instructions, about ten compares per syscall — and argument checks (always on the low
//! 32 bits) sit in the leaves. The tests check the exact program with an interpreter
//! against a reference model of the policy, for every syscall number.
//!
//! By concern: `tables` holds the syscall lists (what the default allows, what is always
//! refused), `args` the argument rules, `program` the BPF generation, and [`interpret`] runs a
//! program the way the kernel does, for tests.

use std::collections::BTreeSet;

use airlock_protocol::BpfInstruction;

use crate::syscalls::syscall_number;

mod args;
pub mod interpret;
mod program;
mod tables;

pub use program::{
    Form, OBSERVED, OUTSIDE_ALLOWLIST, compile_seccomp_program, compile_seccomp_program_as,
    digest_program, notified_refusal,
};
pub use tables::{DEFAULT_ALLOW, DENIED_EPERM_GROUPS, denied_eperm, is_never_allowed};

/// Why a seccomp program could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// A syscall name is not in the table.
    #[error("unknown syscall {0:?}")]
    UnknownSyscall(String),
    /// The program exceeds the kernel's limit.
    #[error("seccomp program has {0} instructions; the kernel accepts at most 4096")]
    TooLong(usize),
}

/// Which socket families the profile's network setting permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketFamilies {
    /// `AF_UNIX` only.
    UnixOnly,
    /// `AF_UNIX`, `AF_INET`, `AF_INET6`.
    UnixAndInet,
    /// `AF_UNIX`, and `AF_INET`/`AF_INET6` stream sockets only: no UDP out of a host
    /// network.
    UnixAndInetStreams,
}

/// The syscall policy of one profile, after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyscallPolicy {
    /// Allowed syscall names.
    pub allow: BTreeSet<String>,
    /// Names the profile denies explicitly (they get `EPERM`).
    pub deny: BTreeSet<String>,
    /// Socket families.
    pub families: SocketFamilies,
}

/// A syscall the reporting program handed to the supervisor, as that program decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The syscall's name; `None` for a number the table does not know.
    pub syscall: Option<&'static str>,
    /// Its number.
    pub nr: u32,
    /// The errno the filter answers with.
    pub errno: u32,
    /// The argument rule that refused it, for a syscall refused for its arguments.
    pub rule: Option<&'static str>,
}

/// Why a program handed a syscall to the supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notified {
    /// It is refused: answer with the refusal's errno.
    Refused(Refusal),
    /// Learning form: a syscall naming a path or destination, allowed by the profile.
    Observed {
        /// Its name.
        syscall: &'static str,
    },
    /// Learning form: a syscall the profile does not allow but could.
    OutsideAllowlist {
        /// Its name.
        syscall: &'static str,
    },
}

/// What `program` (a reporting or learning form) decides for a syscall the kernel handed
/// over, read from the same program the kernel ran, so the answer is the one the errno
/// form gives. `None` when the program does not hand this syscall over: the caller must
/// still refuse it, never let it run.
pub fn notification_of(
    program: &[BpfInstruction],
    arch: u32,
    nr: u32,
    args: [u64; 6],
) -> Option<Notified> {
    let interpret::Verdict::Notify(data) = interpret::evaluate(program, arch, nr, args) else {
        return None;
    };
    let name = crate::syscalls::syscall_name(i64::from(nr));
    match (notified_refusal(data), name) {
        ((0, 0), Some(syscall)) => Some(Notified::Observed { syscall }),
        ((0, program::OUTSIDE_ALLOWLIST), Some(syscall)) => {
            Some(Notified::OutsideAllowlist { syscall })
        }
        ((0, _), _) => None,
        ((errno, ordinal), syscall) => Some(Notified::Refused(Refusal {
            syscall,
            nr,
            errno,
            rule: args::rule_label(nr, ordinal),
        })),
    }
}

/// [`notification_of`] for a refusal only.
pub fn refusal_of(
    program: &[BpfInstruction],
    arch: u32,
    nr: u32,
    args: [u64; 6],
) -> Option<Refusal> {
    match notification_of(program, arch, nr, args)? {
        Notified::Refused(refusal) => Some(refusal),
        _ => None,
    }
}

/// A syscall's number as the program compares it (the accumulator is 32 bits).
fn number(name: &str) -> Result<u32, SeccompError> {
    syscall_number(name)
        .and_then(|nr| u32::try_from(nr).ok())
        .ok_or_else(|| SeccompError::UnknownSyscall(name.to_string()))
}

/// What the tests of every concern share: a default profile and a way to ask its program
/// about one syscall.
#[cfg(test)]
mod test_support {
    use std::collections::BTreeSet;

    use airlock_protocol::BpfInstruction;

    use super::interpret::{Verdict, evaluate};
    use super::program::AUDIT_ARCH_X86_64;
    use super::{DEFAULT_ALLOW, SocketFamilies, SyscallPolicy};
    use crate::syscalls::syscall_number;

    pub const EPERM: Verdict = Verdict::Errno(1);
    pub const ENOSYS: Verdict = Verdict::Errno(38);

    pub fn default_policy(families: SocketFamilies) -> SyscallPolicy {
        SyscallPolicy {
            allow: DEFAULT_ALLOW.iter().map(|s| s.to_string()).collect(),
            deny: BTreeSet::new(),
            families,
        }
    }

    pub fn verdict(program: &[BpfInstruction], name: &str, args: [u64; 6]) -> Verdict {
        let nr = syscall_number(name).unwrap() as u32;
        evaluate(program, AUDIT_ARCH_X86_64, nr, args)
    }
}
