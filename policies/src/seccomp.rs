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
//! The program is generated here rather than by seccompiler, on measurement: seccompiler
//! emits one compare per syscall in a linear chain (about 1,100 instructions for the default
//! profile), and when a filter is attached the kernel runs it once for every syscall number
//! to build its allow cache, which made installing it 1.5 ms of a worker's 2.3 ms
//! confinement (5 ms on a loaded machine). Here the syscall numbers are split into runs of
//! equal outcome and searched with a binary tree of `JGE`s — a few hundred instructions, about
//! ten compares per syscall — and argument checks (always on the low 32 bits) sit in the
//! leaves. The tests check the exact program with an interpreter against a reference model of
//! the policy, for every syscall number.

use std::collections::{BTreeMap, BTreeSet};

use airlock_protocol::BpfInstruction;

use crate::syscalls::syscall_number;

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

/// The syscalls the `default` base allows (subject to the argument rules of the deny filter).
pub const DEFAULT_ALLOW: &[&str] = &[
    // Descriptors and I/O.
    "read",
    "write",
    "readv",
    "writev",
    "pread64",
    "pwrite64",
    "preadv",
    "pwritev",
    "preadv2",
    "pwritev2",
    "lseek",
    "close",
    "close_range",
    "dup",
    "dup2",
    "dup3",
    "fcntl",
    "ioctl",
    "poll",
    "ppoll",
    "select",
    "pselect6",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "pipe",
    "pipe2",
    "eventfd",
    "eventfd2",
    "signalfd",
    "signalfd4",
    "timerfd_create",
    "timerfd_settime",
    "timerfd_gettime",
    "sendfile",
    "splice",
    "tee",
    "copy_file_range",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "syncfs",
    "sync",
    "flock",
    "readahead",
    "fadvise64",
    "memfd_create",
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
    "inotify_rm_watch",
    // Files and directories.
    "open",
    "openat",
    "openat2",
    "creat",
    "stat",
    "fstat",
    "lstat",
    "newfstatat",
    "statx",
    "statfs",
    "fstatfs",
    "access",
    "faccessat",
    "faccessat2",
    "getdents",
    "getdents64",
    "getcwd",
    "chdir",
    "fchdir",
    "rename",
    "renameat",
    "renameat2",
    "mkdir",
    "mkdirat",
    "rmdir",
    "link",
    "linkat",
    "unlink",
    "unlinkat",
    "symlink",
    "symlinkat",
    "readlink",
    "readlinkat",
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "chown",
    "fchown",
    "lchown",
    "fchownat",
    "umask",
    "truncate",
    "ftruncate",
    "fallocate",
    "utime",
    "utimes",
    "utimensat",
    "futimesat",
    "mknod",
    "mknodat",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "listxattr",
    "llistxattr",
    "flistxattr",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    // Memory.
    "mmap",
    "munmap",
    "mprotect",
    "mremap",
    "msync",
    "mincore",
    "madvise",
    "brk",
    "mlock",
    "munlock",
    "mlock2",
    "mlockall",
    "munlockall",
    "pkey_mprotect",
    "pkey_alloc",
    "pkey_free",
    "membarrier",
    "mseal",
    // Processes and threads (clone's namespace flags are refused by the deny filter).
    "clone",
    "fork",
    "vfork",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "wait4",
    "waitid",
    "kill",
    "tkill",
    "tgkill",
    "getpid",
    "getppid",
    "gettid",
    "getpgid",
    "setpgid",
    "getpgrp",
    "getsid",
    "setsid",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getresuid",
    "getresgid",
    "getgroups",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "setfsuid",
    "setfsgid",
    "capget",
    "capset",
    "prctl",
    "arch_prctl",
    "set_tid_address",
    "set_robust_list",
    "get_robust_list",
    "rseq",
    "futex",
    "futex_waitv",
    "sched_yield",
    "sched_getaffinity",
    "sched_setaffinity",
    "sched_getparam",
    "sched_setparam",
    "sched_getscheduler",
    "sched_setscheduler",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_rr_get_interval",
    "sched_getattr",
    "sched_setattr",
    "getpriority",
    "setpriority",
    "getrlimit",
    "setrlimit",
    "prlimit64",
    "getrusage",
    "times",
    "uname",
    "sysinfo",
    "personality",
    "pidfd_open",
    "pidfd_send_signal",
    "restart_syscall",
    "ioprio_get",
    "ioprio_set",
    "getcpu",
    "seccomp",
    "landlock_create_ruleset",
    "landlock_add_rule",
    "landlock_restrict_self",
    // Signals and timers.
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "rt_sigpending",
    "rt_sigtimedwait",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "rt_sigsuspend",
    "sigaltstack",
    "pause",
    "alarm",
    "getitimer",
    "setitimer",
    "timer_create",
    "timer_settime",
    "timer_gettime",
    "timer_getoverrun",
    "timer_delete",
    // Time and randomness.
    "clock_gettime",
    "clock_getres",
    "clock_nanosleep",
    "nanosleep",
    "gettimeofday",
    "time",
    "getrandom",
    // System V and POSIX IPC (the IPC namespace is the sandbox's own).
    "shmget",
    "shmat",
    "shmctl",
    "shmdt",
    "semget",
    "semop",
    "semctl",
    "semtimedop",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
    // Sockets (families are narrowed by the deny filter).
    "socket",
    "socketpair",
    "connect",
    "accept",
    "accept4",
    "bind",
    "listen",
    "getsockname",
    "getpeername",
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "sendmmsg",
    "recvmmsg",
    "shutdown",
    "setsockopt",
    "getsockopt",
    // Legacy asynchronous I/O.
    "io_setup",
    "io_destroy",
    "io_getevents",
    "io_submit",
    "io_cancel",
];

/// Syscalls that always get `EPERM`, by why: each defeats a layer of the sandbox or widens
/// the kernel's attack surface (escape battery SY-02..SY-18).
pub const DENIED_EPERM_GROUPS: &[(&str, &[&str])] = &[
    (
        "inspecting other processes",
        &[
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "process_madvise",
            "pidfd_getfd",
            "kcmp",
        ],
    ),
    (
        "kernel attack surface",
        &["bpf", "perf_event_open", "userfaultfd", "memfd_secret"],
    ),
    ("kernel keyrings", &["keyctl", "add_key", "request_key"]),
    (
        "mounts and root changes",
        &[
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "open_tree",
            "move_mount",
            "mount_setattr",
        ],
    ),
    ("namespaces", &["unshare", "setns"]),
    (
        "kernel code",
        &[
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
        ],
    ),
    ("file handles", &["open_by_handle_at", "name_to_handle_at"]),
    (
        "host administration",
        &[
            "reboot",
            "swapon",
            "swapoff",
            "clock_settime",
            "settimeofday",
            "adjtimex",
            "clock_adjtime",
            "acct",
            "quotactl",
            "quotactl_fd",
            "syslog",
            "vhangup",
            "iopl",
            "ioperm",
            "sethostname",
            "setdomainname",
            "lookup_dcookie",
            "fanotify_init",
            "process_mrelease",
        ],
    ),
    (
        "memory policy and x86 quirks",
        &[
            "modify_ldt",
            "mbind",
            "set_mempolicy",
            "set_mempolicy_home_node",
            "migrate_pages",
            "move_pages",
            "get_mempolicy",
        ],
    ),
];

/// Every syscall of [`DENIED_EPERM_GROUPS`].
pub fn denied_eperm() -> impl Iterator<Item = &'static str> {
    DENIED_EPERM_GROUPS
        .iter()
        .flat_map(|(_, names)| names.iter().copied())
}

/// Syscalls a policy can never allow, because allowing them defeats the filter itself:
/// everything in [`DENIED_EPERM_GROUPS`], plus `clone3` (its flags live in memory seccomp cannot
/// read) and `io_uring_*` (its operations bypass seccomp entirely).
pub fn is_never_allowed(name: &str) -> bool {
    denied_eperm().any(|n| n == name)
        || matches!(
            name,
            "clone3" | "io_uring_setup" | "io_uring_enter" | "io_uring_register"
        )
}

/// Which socket families the profile's network setting permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketFamilies {
    /// `AF_UNIX` only.
    UnixOnly,
    /// `AF_UNIX`, `AF_INET`, `AF_INET6`.
    UnixAndInet,
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

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
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

// Namespace flags refused on clone(2) (Docker's mask 0x7E020000, flag by flag).
const CLONE_NAMESPACE_FLAGS: [u32; 7] = [
    0x0002_0000, // CLONE_NEWNS
    0x0200_0000, // CLONE_NEWCGROUP
    0x0400_0000, // CLONE_NEWUTS
    0x0800_0000, // CLONE_NEWIPC
    0x1000_0000, // CLONE_NEWUSER
    0x2000_0000, // CLONE_NEWPID
    0x4000_0000, // CLONE_NEWNET
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
const PERSONALITY_ALLOWED: [u32; 5] = [0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

fn number(name: &str) -> Result<u32, SeccompError> {
    syscall_number(name)
        .and_then(|nr| u32::try_from(nr).ok())
        .ok_or_else(|| SeccompError::UnknownSyscall(name.to_string()))
}

/// A test on the low 32 bits of one argument. Only the low half is ever compared: `int`
/// arguments are truncated by the kernel, so comparing 64 bits would let high garbage bits
/// slip past (CVE-2019-10063).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Condition {
    arg: u8,
    /// `arg & mask` is compared; `None` compares the whole low word.
    mask: Option<u32>,
    /// true: equal to `value`; false: different from it.
    equal: bool,
    value: u32,
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

/// What the program does with one syscall number.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    Allow,
    Errno(u32),
    /// `EPERM` if any rule (a conjunction of conditions) holds, otherwise `otherwise`.
    Checked {
        rules: Vec<Vec<Condition>>,
        otherwise: Box<Action>,
    },
}

/// Argument rules under which a syscall that is otherwise allowed gets `EPERM`.
fn argument_rules(
    families: SocketFamilies,
) -> Result<BTreeMap<u32, Vec<Vec<Condition>>>, SeccompError> {
    let mut rules = BTreeMap::new();
    let clone = CLONE_NAMESPACE_FLAGS
        .iter()
        .map(|flag| vec![masked_eq(0, *flag, *flag)])
        .collect();
    rules.insert(number("clone")?, clone);
    rules.insert(
        number("ioctl")?,
        vec![vec![eq(1, TIOCSTI)], vec![eq(1, TIOCLINUX)]],
    );
    let allowed_families: &[u32] = match families {
        SocketFamilies::UnixOnly => &[libc::AF_UNIX as u32],
        SocketFamilies::UnixAndInet => &[
            libc::AF_UNIX as u32,
            libc::AF_INET as u32,
            libc::AF_INET6 as u32,
        ],
    };
    let other_family: Vec<Condition> = allowed_families.iter().map(|f| ne(0, *f)).collect();
    rules.insert(
        number("socket")?,
        vec![
            other_family.clone(),
            vec![masked_eq(1, SOCK_TYPE_MASK, SOCK_RAW)],
            vec![masked_eq(1, SOCK_TYPE_MASK, SOCK_PACKET)],
        ],
    );
    rules.insert(number("socketpair")?, vec![other_family]);
    let device = |arg| {
        vec![
            vec![masked_eq(arg, S_IFMT, S_IFCHR)],
            vec![masked_eq(arg, S_IFMT, S_IFBLK)],
        ]
    };
    rules.insert(number("mknod")?, device(1));
    rules.insert(number("mknodat")?, device(2));
    rules.insert(
        number("personality")?,
        vec![PERSONALITY_ALLOWED.iter().map(|v| ne(0, *v)).collect()],
    );
    Ok(rules)
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
fn emit_action(action: &Action) -> Result<Vec<BpfInstruction>, SeccompError> {
    match action {
        Action::Allow => Ok(vec![insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)]),
        Action::Errno(errno) => Ok(vec![insn(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno)]),
        Action::Checked { rules, otherwise } => {
            let mut out = Vec::new();
            for rule in rules {
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
                    SECCOMP_RET_ERRNO | libc::EPERM as u32,
                ));
            }
            out.extend(emit_action(otherwise)?);
            Ok(out)
        }
    }
}

/// A binary search over the runs: `JGE first-of-the-upper-half` splits them until one run
/// is left, whose action is the leaf. A lookup costs about log2(runs) comparisons.
fn emit_tree(runs: &[(u32, Action)]) -> Result<Vec<BpfInstruction>, SeccompError> {
    let [(_, only)] = runs else {
        let mid = runs.len() / 2;
        let lower = emit_tree(&runs[..mid])?;
        let upper = emit_tree(&runs[mid..])?;
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
    emit_action(only)
}

/// Builds the single BPF program for a profile's syscall policy: the prologue that kills
/// other architectures and x32 numbers, then a binary search on the syscall number.
pub fn compile_seccomp_program(
    policy: &SyscallPolicy,
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
    program.extend(emit_tree(&action_runs(policy)?)?);
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

/// A tiny interpreter for the classic-BPF subset seccomp programs use, so tests can ask
/// "what happens to this syscall" of the exact program a worker installs.
pub mod interpret {
    use airlock_protocol::BpfInstruction;

    /// What the kernel does with a syscall.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Verdict {
        /// The syscall runs.
        Allow,
        /// It fails with this errno.
        Errno(u32),
        /// The process is killed with SIGSYS.
        KillProcess,
        /// Any other return value.
        Other(u32),
        /// The program is malformed (out-of-bounds jump or unknown opcode).
        Invalid,
    }

    /// Runs `program` on a syscall (`nr`, `arch`, `args`).
    pub fn evaluate(program: &[BpfInstruction], arch: u32, nr: u32, args: [u64; 6]) -> Verdict {
        run(program, arch, nr, args).0
    }

    /// How many instructions the program executes for a syscall (what each syscall costs).
    pub fn steps(program: &[BpfInstruction], arch: u32, nr: u32, args: [u64; 6]) -> usize {
        run(program, arch, nr, args).1
    }

    fn run(program: &[BpfInstruction], arch: u32, nr: u32, args: [u64; 6]) -> (Verdict, usize) {
        let mut steps = 0;
        let verdict = run_counting(program, arch, nr, args, &mut steps);
        (verdict, steps)
    }

    fn run_counting(
        program: &[BpfInstruction],
        arch: u32,
        nr: u32,
        args: [u64; 6],
        steps: &mut usize,
    ) -> Verdict {
        let load = |offset: u32| -> Option<u32> {
            match offset {
                0 => Some(nr),
                4 => Some(arch),
                16..=63 => {
                    let index = ((offset - 16) / 8) as usize;
                    let high = (offset - 16) % 8 == 4;
                    let value = args[index];
                    Some(if high {
                        (value >> 32) as u32
                    } else {
                        value as u32
                    })
                }
                _ => None,
            }
        };
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        while let Some(i) = program.get(pc) {
            pc += 1;
            *steps += 1;
            match i.code {
                0x20 => match load(i.k) {
                    Some(v) => acc = v,
                    None => return Verdict::Invalid,
                },
                0x54 => acc &= i.k,
                0x05 => pc += i.k as usize,
                0x15 | 0x25 | 0x35 | 0x45 => {
                    let taken = match i.code {
                        0x15 => acc == i.k,
                        0x25 => acc > i.k,
                        0x35 => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                0x06 => {
                    return match i.k {
                        0x7fff_0000 => Verdict::Allow,
                        0x8000_0000 => Verdict::KillProcess,
                        k if k & 0xffff_0000 == 0x0005_0000 => Verdict::Errno(k & 0xffff),
                        k => Verdict::Other(k),
                    };
                }
                _ => return Verdict::Invalid,
            }
        }
        Verdict::Invalid
    }
}

#[cfg(test)]
mod tests {
    use super::interpret::{Verdict, evaluate};
    use super::*;

    const EPERM: Verdict = Verdict::Errno(1);
    const ENOSYS: Verdict = Verdict::Errno(38);
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

    fn default_policy(families: SocketFamilies) -> SyscallPolicy {
        SyscallPolicy {
            allow: DEFAULT_ALLOW.iter().map(|s| s.to_string()).collect(),
            deny: BTreeSet::new(),
            families,
        }
    }

    fn verdict(program: &[BpfInstruction], name: &str, args: [u64; 6]) -> Verdict {
        let nr = syscall_number(name).unwrap() as u32;
        evaluate(program, AUDIT_ARCH_X86_64, nr, args)
    }

    #[test]
    fn default_allowlist_has_no_never_allowed_syscall_and_only_known_names() {
        for name in DEFAULT_ALLOW {
            assert!(!is_never_allowed(name), "{name}");
            assert!(syscall_number(name).is_some(), "{name}");
        }
        for name in denied_eperm() {
            assert!(syscall_number(name).is_some(), "{name}");
        }
    }

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
            SocketFamilies::UnixAndInet => &[1, 2, 10],
        };
        let refused = match name {
            "clone" => low(0) & 0x7e02_0000 != 0,
            "ioctl" => low(1) == 0x5412 || low(1) == 0x541c,
            "socket" => !families.contains(&low(0)) || low(1) & 0xf == 3 || low(1) & 0xf == 10,
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
        ];
        for policy in [
            default_policy(SocketFamilies::UnixOnly),
            default_policy(SocketFamilies::UnixAndInet),
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
