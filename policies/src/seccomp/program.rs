//! BPF generation: the syscall numbers as runs of equal outcome, searched with a binary tree
//! of `JGE`s whose leaves hold each run's action (and its argument checks).

use std::collections::BTreeMap;

use airlock_protocol::BpfInstruction;

use super::args::{Condition, Rule, argument_rules};
use super::{SeccompError, SyscallPolicy, denied_eperm, number};

pub(super) const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
/// Hands the syscall to the supervisor, which answers it (see [`Form::Reporting`]).
pub(super) const SECCOMP_RET_USER_NOTIF: u32 = 0x7fc0_0000;
/// The low bits of a return value: the errno, and in the reporting form the argument rule.
const SECCOMP_RET_DATA: u32 = 0x0000_ffff;
/// Errnos fit in 12 bits (the kernel caps them at 4095); the reporting form keeps the
/// argument rule's ordinal above them.
const ERRNO_BITS: u32 = 12;
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_ALU_AND_K: u16 = 0x54;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_JMP_JGE_K: u16 = 0x35;
const BPF_JMP_JA: u16 = 0x05;
const BPF_RET_K: u16 = 0x06;
const BPF_MAXINSNS: usize = 4096;
/// `offsetof(struct seccomp_data, args)`; the low 32 bits of `args[i]` are at `+ 8 * i`
/// (little-endian).
const SECCOMP_DATA_ARGS: u32 = 16;

/// Which form of the program to build. The errno and reporting forms differ only in the
/// value of the returns that refuse a syscall, so they refuse the same syscalls with the
/// same errnos.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// Refusals return `SECCOMP_RET_ERRNO | errno`: the kernel answers them alone.
    Errno,
    /// Refusals return `SECCOMP_RET_USER_NOTIF | rule << 12 | errno`: the kernel hands the
    /// syscall to the listener (the supervisor), which reads the same program to learn the
    /// errno and the argument rule, records the denial and answers with that errno. The
    /// kernel ignores a notification's data bits, and a filter whose listener is gone fails
    /// the syscall (`ENOSYS`): never allowed.
    Reporting,
    /// `airlock learn`'s form: the reporting form, and besides, the syscalls that name a
    /// path or a destination ([`OBSERVED`]) and those outside the allowlist that a profile
    /// could allow are handed over too, with errno 0: the supervisor records them and lets
    /// them run. Only a supervisor learning a profile answers so, and it says the command ran
    /// less confined than its profile.
    Learning,
    /// The reporting form, and besides, the observed syscalls the profile allows are handed
    /// over with errno 0 to be looked at and let run (a call run to diagnose its refusals:
    /// which paths it named that its mounts lack or hold read-only). Nothing outside the
    /// allowlist is let through.
    Observing,
}

/// The argument-rule ordinal that marks, in the learning form, a syscall outside the
/// allowlist (errno 0): let through while learning, and a candidate for `syscalls.allow`.
pub const OUTSIDE_ALLOWLIST: u32 = 15;

/// Syscalls whose arguments name a path or a destination: the learning form hands them to
/// the supervisor, which reads what they name.
pub const OBSERVED: [&str; 35] = [
    "open",
    "openat",
    "openat2",
    "creat",
    "execve",
    "execveat",
    "stat",
    "lstat",
    "newfstatat",
    "statx",
    "access",
    "faccessat",
    "faccessat2",
    "readlink",
    "readlinkat",
    "mkdir",
    "mkdirat",
    "unlink",
    "unlinkat",
    "rmdir",
    "rename",
    "renameat",
    "renameat2",
    "symlink",
    "symlinkat",
    "link",
    "linkat",
    "chdir",
    "truncate",
    "chmod",
    "fchmodat",
    "utimensat",
    "connect",
    "bind",
    "sendto",
];

/// What the program does with one syscall number.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    Allow,
    /// Learning form only: handed over with this data (errno 0), and let run.
    Observe(u32),
    Errno(u32),
    /// Refused with this errno in both forms, never reported: a refusal that runtimes meet
    /// on every process start and expect (see [`QUIET`]).
    Quiet(u32),
    /// `EPERM` if any rule (a conjunction of conditions) holds, otherwise `otherwise`.
    Checked {
        rules: Vec<Rule>,
        otherwise: Box<Action>,
    },
}

/// The action for every syscall number from 0 up, as runs of equal actions: `(first
/// number, action)`, each run lasting until the next one starts; numbers past the last run
/// get `ENOSYS` (the last run is that).
fn action_runs(policy: &SyscallPolicy) -> Result<Vec<(u32, Action)>, SeccompError> {
    let enosys = Action::Errno(libc::ENOSYS as u32);
    let mut actions: BTreeMap<u32, Action> = BTreeMap::new();
    for name in &policy.allow {
        actions.insert(number(name)?, Action::Allow);
    }
    for (nr, rules) in argument_rules(policy.families)? {
        let otherwise = actions.get(&nr).cloned().unwrap_or_else(|| enosys.clone());
        actions.insert(
            nr,
            Action::Checked {
                rules,
                otherwise: Box::new(otherwise),
            },
        );
    }
    // Denials win over everything, arguments or not.
    for name in denied_eperm() {
        actions.insert(number(name)?, Action::Errno(libc::EPERM as u32));
    }
    for name in &policy.deny {
        actions.insert(number(name)?, Action::Errno(libc::EPERM as u32));
    }
    for name in QUIET {
        let nr = number(name)?;
        if actions.get(&nr).is_none_or(|a| *a == enosys) {
            actions.insert(nr, Action::Quiet(libc::ENOSYS as u32));
        }
    }
    let mut runs: Vec<(u32, Action)> = Vec::new();
    let mut next = 0u32;
    for (nr, action) in actions {
        if nr > next {
            push_run(&mut runs, next, enosys.clone());
        }
        push_run(&mut runs, nr, action);
        next = nr + 1;
    }
    push_run(&mut runs, next, enosys);
    Ok(runs)
}

/// The learning and observing forms' runs: [`action_runs`] with the observed syscalls
/// handed over and, when `widen`, the allowable ones outside the allowlist let through
/// after being handed over.
fn learning_runs(policy: &SyscallPolicy, widen: bool) -> Result<Vec<(u32, Action)>, SeccompError> {
    let mut widened = policy.clone();
    for (name, _) in crate::syscalls::SYSCALLS {
        if widen
            && !super::is_never_allowed(name)
            && !policy.allow.contains(*name)
            && !policy.deny.contains(*name)
        {
            widened.allow.insert((*name).to_string());
        }
    }
    let runs = action_runs(&widened)?;
    let outside: std::collections::BTreeSet<u32> = widened
        .allow
        .iter()
        .filter(|name| !policy.allow.contains(*name))
        .map(|name| number(name))
        .collect::<Result<_, _>>()?;
    let observed: std::collections::BTreeSet<u32> = OBSERVED
        .iter()
        .map(|name| number(name))
        .collect::<Result<_, _>>()?;
    // Split the runs back into single numbers where the learning form differs, then let
    // `push_run` merge equal neighbours again.
    let mut per_number: Vec<(u32, Action)> = Vec::new();
    for (i, (start, action)) in runs.iter().enumerate() {
        let end = runs.get(i + 1).map_or(*start + 1, |(next, _)| *next);
        for nr in *start..end {
            let mark = if outside.contains(&nr) {
                Some(OUTSIDE_ALLOWLIST << ERRNO_BITS)
            } else if observed.contains(&nr) {
                Some(0)
            } else {
                None
            };
            let action = match (mark, action) {
                (Some(data), Action::Allow) => Action::Observe(data),
                (Some(data), Action::Checked { rules, otherwise })
                    if **otherwise == Action::Allow =>
                {
                    Action::Checked {
                        rules: rules.clone(),
                        otherwise: Box::new(Action::Observe(data)),
                    }
                }
                (_, action) => action.clone(),
            };
            per_number.push((nr, action));
        }
    }
    let mut merged = Vec::new();
    for (nr, action) in per_number {
        push_run(&mut merged, nr, action);
    }
    Ok(merged)
}

/// Refusals that are the expected first step of a fallback, not a tool's mistake: glibc
/// tries `clone3` for every thread and child and falls back to `clone` (checked like any
/// syscall) on `ENOSYS`. Reporting it would add a round trip through the supervisor to
/// every fork and the same line to nearly every result.
const QUIET: [&str; 1] = ["clone3"];

fn push_run(runs: &mut Vec<(u32, Action)>, start: u32, action: Action) {
    if runs.last().map(|(_, last)| last) != Some(&action) {
        runs.push((start, action));
    }
}

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> BpfInstruction {
    BpfInstruction { code, jt, jf, k }
}

/// A conditional jump offset, which classic BPF limits to 8 bits.
fn short_offset(len: usize) -> Result<u8, SeccompError> {
    u8::try_from(len).map_err(|_| SeccompError::TooLong(len))
}

/// The instructions for one run's action; the accumulator holds the syscall number, which
/// argument checks overwrite (every path of a leaf returns).
fn emit_action(action: &Action, form: Form) -> Result<Vec<BpfInstruction>, SeccompError> {
    match action {
        Action::Allow => Ok(vec![insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)]),
        Action::Observe(data) => Ok(vec![insn(BPF_RET_K, 0, 0, SECCOMP_RET_USER_NOTIF | data)]),
        Action::Errno(errno) => Ok(vec![insn(BPF_RET_K, 0, 0, refusal(form, *errno, 0))]),
        Action::Quiet(errno) => Ok(vec![insn(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno)]),
        Action::Checked { rules, otherwise } => {
            let mut out = Vec::new();
            for (
                ordinal,
                Rule {
                    conditions: rule, ..
                },
            ) in (1u32..).zip(rules)
            {
                // Each condition: load, mask, compare; a failed condition skips to the next
                // rule, past the rest of this one and its `RET EPERM`.
                let per_condition = |c: &Condition| 2 + usize::from(c.mask.is_some());
                let mut remaining: usize = rule.iter().map(per_condition).sum::<usize>() + 1;
                for c in rule {
                    out.push(insn(
                        BPF_LD_W_ABS,
                        0,
                        0,
                        SECCOMP_DATA_ARGS + 8 * u32::from(c.arg),
                    ));
                    if let Some(mask) = c.mask {
                        out.push(insn(BPF_ALU_AND_K, 0, 0, mask));
                    }
                    remaining -= per_condition(c);
                    // `remaining` instructions follow this jump within the rule, the last of
                    // them the RET: skipping them lands on the next rule.
                    let skip = short_offset(remaining)?;
                    let (jt, jf) = if c.equal { (0, skip) } else { (skip, 0) };
                    out.push(insn(BPF_JMP_JEQ_K, jt, jf, c.value));
                }
                out.push(insn(
                    BPF_RET_K,
                    0,
                    0,
                    refusal(form, libc::EPERM as u32, ordinal),
                ));
            }
            out.extend(emit_action(otherwise, form)?);
            Ok(out)
        }
    }
}

/// The return value refusing a syscall with `errno`; `rule` is the argument rule's ordinal
/// (1-based) that refused it, 0 for none.
fn refusal(form: Form, errno: u32, rule: u32) -> u32 {
    match form {
        Form::Errno => SECCOMP_RET_ERRNO | errno,
        Form::Reporting | Form::Learning | Form::Observing => {
            SECCOMP_RET_USER_NOTIF | ((rule << ERRNO_BITS | errno) & SECCOMP_RET_DATA)
        }
    }
}

/// What a return value of the reporting form stands for: the errno the syscall gets, and
/// the ordinal of the argument rule that refused it (0 for none).
pub fn notified_refusal(data: u32) -> (u32, u32) {
    let data = data & SECCOMP_RET_DATA;
    (data & ((1 << ERRNO_BITS) - 1), data >> ERRNO_BITS)
}

/// A binary search over the runs: `JGE first-of-the-upper-half` splits them until one run
/// is left, whose action is the leaf. A lookup costs about log2(runs) comparisons.
fn emit_tree(runs: &[(u32, Action)], form: Form) -> Result<Vec<BpfInstruction>, SeccompError> {
    let [(_, only)] = runs else {
        let mid = runs.len() / 2;
        let lower = emit_tree(&runs[..mid], form)?;
        let upper = emit_tree(&runs[mid..], form)?;
        let split = runs[mid].0;
        let mut out = Vec::with_capacity(lower.len() + upper.len() + 2);
        match u8::try_from(lower.len()) {
            Ok(skip) => out.push(insn(BPF_JMP_JGE_K, skip, 0, split)),
            Err(_) => {
                // Too far for a conditional jump: hop over an unconditional one.
                out.push(insn(BPF_JMP_JGE_K, 0, 1, split));
                let far =
                    u32::try_from(lower.len()).map_err(|_| SeccompError::TooLong(lower.len()))?;
                out.push(insn(BPF_JMP_JA, 0, 0, far));
            }
        }
        out.extend(lower);
        out.extend(upper);
        return Ok(out);
    };
    emit_action(only, form)
}

/// Builds the single BPF program for a profile's syscall policy in its errno form: the
/// prologue that kills other architectures and x32 numbers, then a binary search on the
/// syscall number.
pub fn compile_seccomp_program(
    policy: &SyscallPolicy,
) -> Result<Vec<BpfInstruction>, SeccompError> {
    compile_seccomp_program_as(policy, Form::Errno)
}

/// [`compile_seccomp_program`] in either form.
pub fn compile_seccomp_program_as(
    policy: &SyscallPolicy,
    form: Form,
) -> Result<Vec<BpfInstruction>, SeccompError> {
    let mut program = vec![
        // seccomp_data.arch is at offset 4, .nr at offset 0.
        insn(BPF_LD_W_ABS, 0, 0, 4),
        insn(BPF_JMP_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        insn(BPF_LD_W_ABS, 0, 0, 0),
        insn(BPF_JMP_JGE_K, 0, 1, X32_SYSCALL_BIT),
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
    ];
    let runs = match form {
        Form::Learning => learning_runs(policy, true)?,
        Form::Observing => learning_runs(policy, false)?,
        Form::Errno | Form::Reporting => action_runs(policy)?,
    };
    program.extend(emit_tree(&runs, form)?);
    if program.len() > BPF_MAXINSNS {
        return Err(SeccompError::TooLong(program.len()));
    }
    Ok(program)
}

/// Hex SHA-256 of a program's bytes as the kernel sees them, reported in results.
pub fn digest_program(program: &[BpfInstruction]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for i in program {
        hasher.update(i.code.to_le_bytes());
        hasher.update([i.jt, i.jf]);
        hasher.update(i.k.to_le_bytes());
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::args::PERSONALITY_ALLOWED;
    use super::super::interpret::{self, Verdict, evaluate};
    use super::super::test_support::{ENOSYS, EPERM, default_policy, verdict};
    use super::super::{SocketFamilies, SyscallPolicy, denied_eperm};
    use super::*;

    #[test]
    fn ordinary_syscalls_are_allowed() {
        let p = compile_seccomp_program(&default_policy(SocketFamilies::UnixOnly)).unwrap();
        for name in [
            "read",
            "write",
            "openat",
            "execve",
            "exit_group",
            "mmap",
            "futex",
        ] {
            assert_eq!(verdict(&p, name, [0; 6]), Verdict::Allow, "{name}");
        }
        // fork-style clone and thread clone stay allowed.
        assert_eq!(
            verdict(&p, "clone", [0x11 /* SIGCHLD */, 0, 0, 0, 0, 0]),
            Verdict::Allow
        );
        assert_eq!(
            verdict(&p, "clone", [0x003d_0f00, 0, 0, 0, 0, 0]),
            Verdict::Allow
        );
    }

    #[test]
    fn dangerous_syscalls_get_eperm() {
        let p = compile_seccomp_program(&default_policy(SocketFamilies::UnixOnly)).unwrap();
        for name in denied_eperm() {
            assert_eq!(verdict(&p, name, [0; 6]), EPERM, "{name}");
        }
    }

    #[test]
    fn clone3_io_uring_and_unknown_numbers_get_enosys() {
        let p = compile_seccomp_program(&default_policy(SocketFamilies::UnixOnly)).unwrap();
        for name in [
            "clone3",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
        ] {
            assert_eq!(verdict(&p, name, [0; 6]), ENOSYS, "{name}");
        }
        assert_eq!(evaluate(&p, AUDIT_ARCH_X86_64, 1000, [0; 6]), ENOSYS);
    }

    #[test]
    fn wrong_architecture_and_x32_numbers_kill_the_process() {
        let p = compile_seccomp_program(&default_policy(SocketFamilies::UnixOnly)).unwrap();
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        assert_eq!(
            evaluate(&p, AUDIT_ARCH_I386, 20, [0; 6]),
            Verdict::KillProcess
        );
        let x32_getpid = X32_SYSCALL_BIT | 39;
        assert_eq!(
            evaluate(&p, AUDIT_ARCH_X86_64, x32_getpid, [0; 6]),
            Verdict::KillProcess
        );
    }

    #[test]
    fn profile_deny_list_overrides_the_allowlist_with_eperm() {
        let mut policy = default_policy(SocketFamilies::UnixOnly);
        policy.deny.insert("mkdir".to_string());
        let p = compile_seccomp_program(&policy).unwrap();
        assert_eq!(verdict(&p, "mkdir", [0; 6]), EPERM);
        assert_eq!(verdict(&p, "rmdir", [0; 6]), Verdict::Allow);
    }

    /// The policy's meaning, written out plainly: what the program must answer.
    fn reference(policy: &SyscallPolicy, nr: u32, args: [u64; 6]) -> Verdict {
        let name = crate::syscalls::SYSCALLS
            .iter()
            .find(|(_, n)| *n as u32 == nr)
            .map(|(name, _)| *name);
        let Some(name) = name else {
            return ENOSYS;
        };
        if denied_eperm().any(|d| d == name) || policy.deny.contains(name) {
            return EPERM;
        }
        let low = |i: usize| args[i] as u32;
        let families: &[u32] = match policy.families {
            SocketFamilies::UnixOnly => &[1],
            SocketFamilies::UnixAndInet | SocketFamilies::UnixAndInetStreams => &[1, 2, 10],
        };
        let inet_datagram = policy.families == SocketFamilies::UnixAndInetStreams
            && matches!(low(0), 2 | 10)
            && low(1) & 0xf == 2;
        let refused = match name {
            "clone" => low(0) & 0x7e02_0000 != 0,
            "ioctl" => low(1) == 0x5412 || low(1) == 0x541c,
            "socket" => {
                !families.contains(&low(0))
                    || low(1) & 0xf == 3
                    || low(1) & 0xf == 10
                    || inet_datagram
            }
            "socketpair" => !families.contains(&low(0)),
            "mknod" => matches!(low(1) & 0o170000, 0o020000 | 0o060000),
            "mknodat" => matches!(low(2) & 0o170000, 0o020000 | 0o060000),
            "personality" => !PERSONALITY_ALLOWED.contains(&low(0)),
            _ => false,
        };
        if refused {
            EPERM
        } else if policy.allow.contains(name) {
            Verdict::Allow
        } else {
            ENOSYS
        }
    }

    #[test]
    fn program_matches_the_reference_model_for_every_syscall_number() {
        let mut with_deny = default_policy(SocketFamilies::UnixAndInet);
        with_deny.deny.insert("mkdir".into());
        with_deny.deny.insert("clone".into());
        let mut without_ioctl = default_policy(SocketFamilies::UnixOnly);
        without_ioctl.allow.remove("ioctl");
        without_ioctl.allow.remove("socket");
        let argument_sets: Vec<[u64; 6]> = vec![
            [0; 6],
            [0x11, 0, 0, 0, 0, 0],
            [0x1000_0011, 0, 0, 0, 0, 0],
            [(7 << 32) | 0x4000_0000, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [2, 1, 0, 0, 0, 0],
            [10, 3, 0, 0, 0, 0],
            [17, 3, 0, 0, 0, 0],
            [1, 0x80003, 0, 0, 0, 0],
            [0, 0x5412, 0, 0, 0, 0],
            [0, (1 << 40) | 0x541c, 0, 0, 0, 0],
            [0, 0x5401, 0, 0, 0, 0],
            [0, 0o020644, 0o060644, 0, 0, 0],
            [0, 0o010644, 0o100644, 0, 0, 0],
            [0xffff_ffff, 0, 0, 0, 0, 0],
            [0x0040_0000, 0, 0, 0, 0, 0],
            [0x20008, 0, 0, 0, 0, 0],
            [2, 2, 0, 0, 0, 0],
            [10, 0x80802, 0, 0, 0, 0],
            [(1 << 32) | 2, 2, 0, 0, 0, 0],
            [1, 2, 0, 0, 0, 0],
        ];
        for policy in [
            default_policy(SocketFamilies::UnixOnly),
            default_policy(SocketFamilies::UnixAndInet),
            default_policy(SocketFamilies::UnixAndInetStreams),
            with_deny,
            without_ioctl,
        ] {
            let program = compile_seccomp_program(&policy).unwrap();
            for nr in 0..1100u32 {
                for args in &argument_sets {
                    assert_eq!(
                        evaluate(&program, AUDIT_ARCH_X86_64, nr, *args),
                        reference(&policy, nr, *args),
                        "syscall {nr} args {args:x?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_reporting_form_refuses_exactly_what_the_errno_form_refuses_with_the_same_errno() {
        let mut with_deny = default_policy(SocketFamilies::UnixAndInetStreams);
        with_deny.deny.insert("mkdir".into());
        for policy in [
            default_policy(SocketFamilies::UnixOnly),
            default_policy(SocketFamilies::UnixAndInet),
            with_deny,
        ] {
            let errno = compile_seccomp_program(&policy).unwrap();
            let reporting = compile_seccomp_program_as(&policy, Form::Reporting).unwrap();
            // What a worker installs where it cannot have a listener is the errno form itself.
            let fallback = airlock_protocol::SeccompSpec {
                requirement: airlock_protocol::Requirement::Required,
                program: reporting.clone(),
                digest: String::new(),
            }
            .errno_form();
            assert_eq!(fallback, errno);
            let clone3 = crate::syscalls::syscall_number("clone3").unwrap() as u32;
            for nr in 0..1100u32 {
                for args in [[0; 6], [16, 3, 0, 0, 0, 0], [0x1000_0011, 0, 0, 0, 0, 0]] {
                    let plain = evaluate(&errno, AUDIT_ARCH_X86_64, nr, args);
                    let told = evaluate(&reporting, AUDIT_ARCH_X86_64, nr, args);
                    match (plain, told) {
                        // clone3 is answered by the filter alone: every fork tries it.
                        (Verdict::Errno(e), Verdict::Errno(r)) if nr == clone3 => {
                            assert_eq!((e, r), (38, 38));
                        }
                        (Verdict::Errno(e), Verdict::Notify(data)) => {
                            assert_eq!(notified_refusal(data).0, e, "syscall {nr}");
                        }
                        (plain, told) => assert_eq!(plain, told, "syscall {nr} {args:x?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn a_notified_refusal_names_its_syscall_errno_and_argument_rule() {
        let policy = default_policy(SocketFamilies::UnixOnly);
        let p = compile_seccomp_program_as(&policy, Form::Reporting).unwrap();
        let nr = |name| crate::syscalls::syscall_number(name).unwrap() as u32;
        let ask = |name, args| super::super::refusal_of(&p, AUDIT_ARCH_X86_64, nr(name), args);
        let netlink = ask("socket", [16, 3, 0, 0, 0, 0]).unwrap();
        assert_eq!(netlink.syscall, Some("socket"));
        assert_eq!(netlink.errno, 1);
        assert_eq!(
            netlink.rule,
            Some("address family the profile does not allow")
        );
        let raw_unix = ask("socket", [1, 3, 0, 0, 0, 0]).unwrap();
        assert_eq!(raw_unix.rule, Some("SOCK_RAW"));
        let newpid = ask("clone", [0x2000_0011, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(newpid.rule, Some("CLONE_NEWPID"));
        let ptrace = ask("ptrace", [0; 6]).unwrap();
        assert_eq!((ptrace.errno, ptrace.rule), (1, None));
        let uring = ask("io_uring_setup", [0; 6]).unwrap();
        assert_eq!(uring.errno, 38);
        let unknown = super::super::refusal_of(&p, AUDIT_ARCH_X86_64, 1000, [0; 6]).unwrap();
        assert_eq!((unknown.syscall, unknown.errno), (None, 38));
        // Allowed syscalls, and clone3, never reach the supervisor.
        assert_eq!(ask("read", [0; 6]), None);
        assert_eq!(ask("clone3", [0; 6]), None);
        assert_eq!(ask("socket", [1, 1, 0, 0, 0, 0]), None);
    }

    #[test]
    fn the_learning_form_hands_over_observed_and_outside_syscalls_and_still_refuses_the_rest() {
        use super::super::{Notified, notification_of};
        let policy = default_policy(SocketFamilies::UnixOnly);
        let p = compile_seccomp_program_as(&policy, Form::Learning).unwrap();
        let errno = compile_seccomp_program(&policy).unwrap();
        let ask = |nr: u32, args| notification_of(&p, AUDIT_ARCH_X86_64, nr, args);
        let nr = |name| crate::syscalls::syscall_number(name).unwrap() as u32;
        assert_eq!(
            ask(nr("openat"), [0; 6]),
            Some(Notified::Observed { syscall: "openat" })
        );
        assert_eq!(verdict(&p, "read", [0; 6]), Verdict::Allow);
        // Allowed by default, not observed; a syscall a profile could allow but this one
        // does not: handed over, marked.
        assert!(!policy.allow.contains("vmsplice"));
        assert_eq!(
            ask(nr("vmsplice"), [0; 6]),
            Some(Notified::OutsideAllowlist {
                syscall: "vmsplice"
            })
        );
        // Never allowed, denied or refused for arguments: refused as always.
        for (name, args) in [
            ("ptrace", [0; 6]),
            ("io_uring_setup", [0; 6]),
            ("socket", [16, 3, 0, 0, 0, 0]),
        ] {
            assert!(
                matches!(ask(nr(name), args), Some(Notified::Refused(_))),
                "{name}"
            );
        }
        assert_eq!(verdict(&p, "clone3", [0; 6]), ENOSYS);
        // Without a listener nothing handed over to be let through runs: the errno form
        // of the learning program fails it.
        let fallback = airlock_protocol::SeccompSpec {
            requirement: airlock_protocol::Requirement::Required,
            program: p.clone(),
            digest: String::new(),
        }
        .errno_form();
        assert_eq!(verdict(&fallback, "openat", [0; 6]), ENOSYS);
        assert_eq!(verdict(&fallback, "vmsplice", [0; 6]), ENOSYS);
        assert_eq!(verdict(&fallback, "ptrace", [0; 6]), EPERM);
        // Everything not observed behaves as in the errno form.
        let observed: Vec<u32> = OBSERVED.iter().map(|n| nr(n)).collect();
        for n in 0..600u32 {
            let learning = evaluate(&p, AUDIT_ARCH_X86_64, n, [0; 6]);
            let plain = evaluate(&errno, AUDIT_ARCH_X86_64, n, [0; 6]);
            match (plain, learning) {
                (Verdict::Allow, Verdict::Notify(0)) => assert!(observed.contains(&n), "{n}"),
                (Verdict::Allow, learning) => assert_eq!(learning, Verdict::Allow, "{n}"),
                (Verdict::Errno(_), Verdict::Notify(data)) => {
                    let (e, rule) = notified_refusal(data);
                    assert!(e != 0 || rule == OUTSIDE_ALLOWLIST, "{n}");
                }
                (plain, learning) => assert_eq!(plain, learning, "{n}"),
            }
        }
    }

    #[test]
    fn the_observing_form_hands_over_observed_syscalls_and_lets_nothing_else_through() {
        use super::super::{Notified, notification_of};
        let policy = default_policy(SocketFamilies::UnixOnly);
        let observing = compile_seccomp_program_as(&policy, Form::Observing).unwrap();
        let reporting = compile_seccomp_program_as(&policy, Form::Reporting).unwrap();
        let nr = |name| crate::syscalls::syscall_number(name).unwrap() as u32;
        assert_eq!(
            notification_of(&observing, AUDIT_ARCH_X86_64, nr("openat"), [0; 6]),
            Some(Notified::Observed { syscall: "openat" })
        );
        let observed: Vec<u32> = OBSERVED.iter().map(|n| nr(n)).collect();
        for n in 0..1100u32 {
            for args in [[0; 6], [16, 3, 0, 0, 0, 0]] {
                let seen = evaluate(&observing, AUDIT_ARCH_X86_64, n, args);
                let plain = evaluate(&reporting, AUDIT_ARCH_X86_64, n, args);
                if plain == Verdict::Allow && observed.contains(&n) {
                    assert_eq!(seen, Verdict::Notify(0), "{n}");
                } else {
                    assert_eq!(seen, plain, "{n} {args:?}");
                }
            }
        }
    }

    #[test]
    fn program_is_compact_and_every_lookup_is_short() {
        let p = compile_seccomp_program(&default_policy(SocketFamilies::UnixAndInet)).unwrap();
        // seccompiler's linear chains needed about 1,100 instructions for this profile.
        assert!(p.len() < 400, "{} instructions", p.len());
        let longest = (0..600u32)
            .map(|nr| interpret::steps(&p, AUDIT_ARCH_X86_64, nr, [0; 6]))
            .max()
            .unwrap();
        assert!(longest <= 40, "a lookup took {longest} instructions");
    }

    #[test]
    fn program_fits_the_kernel_limit_and_has_a_stable_digest() {
        let a = compile_seccomp_program(&default_policy(SocketFamilies::UnixOnly)).unwrap();
        let b = compile_seccomp_program(&default_policy(SocketFamilies::UnixOnly)).unwrap();
        assert!(a.len() <= BPF_MAXINSNS);
        assert_eq!(digest_program(&a), digest_program(&b));
        assert_eq!(digest_program(&a).len(), 64);
    }
}
