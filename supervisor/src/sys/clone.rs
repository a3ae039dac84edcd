//! clone3 of a worker into fresh namespaces, and the child's side until it execs the sealed
//! worker image.
//!
//! On x86_64 the child shares the supervisor's address space (CLONE_VM, like posix_spawn)
//! and runs on a stack of its own: copying the page tables of a multi-threaded tokio process
//! for a child that execs a moment later, and then write-faulting every page the supervisor
//! touches back out of copy-on-write (with TLB shootdowns to every core running one of its
//! threads), was a quarter of the supervisor's CPU under load. The price is discipline: the
//! child may only make raw syscalls (its own instruction, so not even errno is written) on
//! memory the parent prepared and keeps alive and unmoved — [`ChildMemory`] and
//! [`ChildStack`], owned by an [`InFlightChild`] until the child has exec'd or exited — and
//! it must not run a signal handler (the spawner threads block every signal; the worker
//! unblocks them after exec). Other architectures fork the child as before.

use std::ffi::{CString, c_char};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::slots::{CLOSE_RANGE_UNSHARE, ChildSlots};

/// Child steps, by number, as reported on the report pipe.
pub const CHILD_STEPS: [&str; 9] = [
    "join cgroup",
    "wait for uid map",
    "setresgid",
    "setresuid",
    "stdio",
    "parent-death signal",
    "exec worker",
    "cgroup namespace",
    "own descriptor table",
];

/// clone3's CLONE_INTO_CGROUP (Linux 5.7); libc's constant is an overflowing i32.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The namespaces every worker gets. The kernel roots a cgroup namespace made at clone in
/// the child's cgroup only with CLONE_INTO_CGROUP; a child that joins its cgroups
/// afterwards makes itself another one there (see [`run_child`]).
pub const WORKER_NAMESPACES: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

/// Everything the child needs between clone and exec, prepared by the parent. Boxed and
/// never moved while a child may read it.
#[derive(Debug)]
pub struct ChildMemory {
    /// Owns the strings `argv` points into.
    _argv_strings: Vec<CString>,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    /// The sealed worker image.
    image: RawFd,
    /// cgroup files to write "0" into (v1 `tasks`: joins this thread, the only one).
    join_cgroups: Vec<RawFd>,
    /// Read end of the handshake pipe: one byte arrives once uid/gid maps are written.
    maps_written: RawFd,
    /// Descriptors that become the worker's 0, 1, 2.
    stdio: [RawFd; 3],
    /// The worker's protocol socket; its close-on-exec flag is cleared.
    socket: RawFd,
    /// Write end of a close-on-exec pipe where the child reports the errno of a failed step.
    report: RawFd,
    /// Write end of a pipe where the child writes one byte once it has its own descriptor
    /// table, so the parent may empty the slots again.
    unshared: RawFd,
    /// The slots the child keeps (every number above is one), ascending; set by
    /// [`clone_worker`] once every descriptor is lent.
    keep: Vec<RawFd>,
    /// The lowest number above every slot: the child's private table starts as a copy of
    /// the shared one below it.
    first_unreserved: RawFd,
}

impl ChildMemory {
    /// Descriptor numbers are slots of the spawner thread's [`ChildSlots`]: the child
    /// shares the supervisor's table until it unshares it, keeping only the slots.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        image: RawFd,
        argv: Vec<CString>,
        join_cgroups: Vec<RawFd>,
        maps_written: RawFd,
        stdio: [RawFd; 3],
        socket: RawFd,
        report: RawFd,
        unshared: RawFd,
    ) -> Box<Self> {
        let pointers = super::pointer_array(&argv);
        Box::new(Self {
            _argv_strings: argv,
            argv: pointers,
            envp: vec![std::ptr::null()],
            image,
            join_cgroups,
            maps_written,
            stdio,
            socket,
            report,
            unshared,
            keep: Vec::new(),
            first_unreserved: 3,
        })
    }
}

/// A stack for one CLONE_VM child: 64 KiB with a guard page below, so an overflow faults
/// instead of writing into the supervisor's heap. Reused across spawns by the spawner.
#[derive(Debug)]
pub struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

const GUARD: usize = 4096;
const STACK: usize = 64 << 10;

impl ChildStack {
    /// Maps a fresh stack.
    pub fn new() -> io::Result<Self> {
        let len = GUARD + STACK;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing; no
        // existing memory is affected.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self { base, len };
        // SAFETY: the lowest page of the mapping just made, which nothing uses yet.
        if unsafe { libc::mprotect(base, GUARD, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The initial stack pointer region for clone3: (lowest usable address, size).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn usable(&self) -> (u64, u64) {
        (self.base as u64 + GUARD as u64, STACK as u64)
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made; no child uses it any more (an
        // InFlightChild returns its stack only once its child has exec'd or exited).
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

/// A child that may still be running on [`ChildMemory`] and [`ChildStack`]: holds both
/// until the child has exec'd or exited (its end of `gone`, close-on-exec, is closed).
#[derive(Debug)]
pub struct InFlightChild {
    _memory: Box<ChildMemory>,
    stack: Option<ChildStack>,
    gone: OwnedFd,
}

impl InFlightChild {
    /// Whether the child has exec'd or exited (never blocks).
    pub fn is_gone(&self) -> bool {
        poll_hangup(&self.gone, 0)
    }

    /// Blocks until the child has exec'd or exited, then gives the stack back for reuse.
    pub fn finish(self) -> Option<ChildStack> {
        while !poll_hangup(&self.gone, -1) {}
        self.stack
    }
}

/// Polls a pipe's read end for hang-up (every write end closed); `timeout_ms` -1 blocks.
fn poll_hangup(fd: &OwnedFd, timeout_ms: libc::c_int) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let ready = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    // Nothing is ever written to `gone`, so readiness means hang-up (or an error).
    ready > 0
}

/// A cloned worker: its pid and pidfd.
#[derive(Debug)]
pub struct Cloned {
    /// Host pid.
    pub pid: libc::pid_t,
    /// pidfd of the worker, for signalling and waiting without pid reuse races.
    pub pidfd: OwnedFd,
}

/// Blocks every signal for the calling thread, for good. Spawner threads call it first:
/// their CLONE_VM children inherit the mask, so no handler can run on the supervisor's
/// memory between clone and exec. Process-directed signals go to the other threads.
pub fn block_all_signals_in_this_thread() -> io::Result<()> {
    let all = nix::sys::signal::SigSet::all();
    nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_SETMASK, Some(&all), None)
        .map_err(io::Error::from)
}

/// clone3 into fresh namespaces (optionally directly into a v2 cgroup); the child runs
/// [`run_child`] on `memory` and `stack`, which the returned [`InFlightChild`] keeps.
///
/// The child shares the supervisor's descriptor table (`CLONE_FILES`) until its first
/// steps give it a private one holding only `slots` (see [`ChildSlots`]): every
/// descriptor `memory` names must already be lent to a slot, and the caller must not empty
/// the slots before [`super::await_unshared`] has returned, nor on error before this
/// function has.
pub fn clone_worker(
    mut memory: Box<ChildMemory>,
    stack: ChildStack,
    slots: &mut ChildSlots,
    cgroup_dir: Option<RawFd>,
    new_network_namespace: bool,
) -> io::Result<(Cloned, InFlightChild)> {
    let (gone_read, gone_write) = super::cloexec_pipe()?;
    // The child's copy of the write end closes at its exec (or exit); the slot's copy
    // closes when the slots are emptied.
    slots.lend(gone_write.as_raw_fd())?;
    (memory.keep, memory.first_unreserved) = slots.lent();
    let mut pidfd: libc::c_int = -1;
    let mut flags = WORKER_NAMESPACES | libc::CLONE_PIDFD as u64 | libc::CLONE_FILES as u64;
    if !new_network_namespace {
        // The spawning thread's: the host network (TCP narrowed by Landlock port rules,
        // abstract sockets by scoping), or the thread's shared empty namespace.
        flags &= !(libc::CLONE_NEWNET as u64);
    }
    if cgroup_dir.is_some() {
        flags |= CLONE_INTO_CGROUP;
    }
    // SAFETY: clone_args is plain old data; zero is a valid value for every field.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = flags;
    args.pidfd = (&mut pidfd as *mut libc::c_int) as u64;
    args.exit_signal = libc::SIGCHLD as u64;
    args.cgroup = cgroup_dir.map_or(0, |fd| fd as u64);
    let memory_ptr: *const ChildMemory = &*memory;
    let pid = clone_child(&mut args, &stack, memory_ptr);
    drop(gone_write);
    if pid < 0 {
        return Err(io::Error::from_raw_os_error((-pid) as i32));
    }
    // SAFETY: CLONE_PIDFD stored a fresh descriptor for the child in `pidfd`.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok((
        Cloned {
            pid: pid as libc::pid_t,
            pidfd,
        },
        InFlightChild {
            _memory: memory,
            stack: Some(stack),
            gone: gone_read,
        },
    ))
}

/// The child's entry on its own stack. Never returns.
extern "C" fn child_entry(memory: *const ChildMemory) -> ! {
    // SAFETY: the parent keeps the ChildMemory boxed, unmoved and unmodified until this
    // child has exec'd or exited (InFlightChild).
    run_child(unsafe { &*memory })
}

/// clone3 with CLONE_VM: the child starts on `stack` and calls [`child_entry`]. Returns the
/// child's pid, or -errno.
#[cfg(target_arch = "x86_64")]
fn clone_child(args: &mut libc::clone_args, stack: &ChildStack, memory: *const ChildMemory) -> i64 {
    let (low, size) = stack.usable();
    args.flags |= libc::CLONE_VM as u64;
    args.stack = low;
    args.stack_size = size;
    let entry: extern "C" fn(*const ChildMemory) -> ! = child_entry;
    let ret: i64;
    // SAFETY: `args` is valid for the call and names a stack nothing else uses, 16-byte
    // aligned at its top (mmap'd pages), so `call` enters child_entry with the alignment
    // the ABI expects. The kernel preserves every register but rax, rcx and r11, so in the
    // child r12/r13 still hold the argument and the entry; the child never comes back into
    // this function (child_entry diverges; ud2 traps if it ever did). The parent continues
    // after the label with the pid (or -errno) in rax and its own stack untouched.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov rdi, r12",
            "call r13",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") args as *mut libc::clone_args,
            in("rsi") std::mem::size_of::<libc::clone_args>(),
            in("r12") memory,
            in("r13") entry,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// Elsewhere: fork-style clone3 (the child continues on a copy of this thread's stack).
#[cfg(not(target_arch = "x86_64"))]
fn clone_child(
    args: &mut libc::clone_args,
    _stack: &ChildStack,
    memory: *const ChildMemory,
) -> i64 {
    // SAFETY: `args` is valid for the call; without CLONE_VM the child has its own copy of
    // memory and only runs child_entry, which execs or exits.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args as *mut libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    if pid == 0 {
        child_entry(memory);
    }
    if pid < 0 {
        -i64::from(
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL),
        )
    } else {
        pid
    }
}

/// A raw syscall for the child: returns the result or -errno and writes no memory (glibc's
/// `syscall` stores errno in thread-local storage, which a CLONE_VM child shares with the
/// spawner thread).
#[cfg(target_arch = "x86_64")]
fn child_syscall(nr: i64, a: i64, b: i64, c: i64, d: i64, e: i64) -> i64 {
    let ret: i64;
    // SAFETY: the syscall instruction with scalar or parent-prepared pointer arguments;
    // it clobbers only rax (the result), rcx and r11.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") a,
            in("rsi") b,
            in("rdx") c,
            in("r10") d,
            in("r8") e,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

#[cfg(not(target_arch = "x86_64"))]
fn child_syscall(nr: i64, a: i64, b: i64, c: i64, d: i64, e: i64) -> i64 {
    // SAFETY: the plain syscall with scalar or parent-prepared pointer arguments; this child
    // has its own copy of memory, so glibc's errno store is its own.
    let ret = unsafe { libc::syscall(nr as libc::c_long, a, b, c, d, e) };
    if ret < 0 {
        -i64::from(
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL),
        )
    } else {
        ret
    }
}

/// In the child: reports `errno` of `step` on the report pipe and exits.
fn child_fail(memory: &ChildMemory, step: u8, errno: i64) -> ! {
    let mut message = [0u8; 5];
    message[0] = step;
    message[1..].copy_from_slice(&(errno as i32).to_ne_bytes());
    child_syscall(
        libc::SYS_write,
        i64::from(memory.report),
        message.as_ptr() as i64,
        message.len() as i64,
        0,
        0,
    );
    loop {
        child_syscall(libc::SYS_exit_group, 127, 0, 0, 0, 0);
    }
}

/// Runs `nr` in the child; on a negative result fails `step`.
fn child_step(memory: &ChildMemory, step: u8, nr: i64, args: [i64; 3]) -> i64 {
    let ret = child_syscall(nr, args[0], args[1], args[2], 0, 0);
    if ret < 0 {
        child_fail(memory, step, -ret);
    }
    ret
}

/// The child side: raw syscalls only, never returns.
fn run_child(memory: &ChildMemory) -> ! {
    // A child whose supervisor dies before releasing it must not wait for its uid map
    // forever: it dies with the spawning thread from the start (set again below: the
    // credential change clears it).
    child_step(
        memory,
        5,
        libc::SYS_prctl,
        [
            i64::from(libc::PR_SET_PDEATHSIG),
            i64::from(libc::SIGKILL),
            0,
        ],
    );
    // 8 (numbered last, so the other steps keep their numbers). Its own descriptor table,
    // before any descriptor is closed or replaced: until now the table is the supervisor's
    // own. Only the numbers below the slots are copied (the supervisor's table may hold
    // thousands); the rest of the range is then closed in the copy alone.
    child_step(
        memory,
        8,
        libc::SYS_close_range,
        [
            i64::from(memory.first_unreserved),
            i64::from(u32::MAX),
            CLOSE_RANGE_UNSHARE,
        ],
    );
    let byte = 1u8;
    let wrote = child_step(
        memory,
        8,
        libc::SYS_write,
        [i64::from(memory.unshared), (&byte as *const u8) as i64, 1],
    );
    if wrote != 1 {
        child_fail(memory, 8, i64::from(libc::EIO));
    }
    // The copy's other low numbers are the supervisor's (one of them possibly the write
    // end of the uid-map handshake, whose closing must read as EOF here): closed, so the
    // table holds only the slots. From here on the parent may empty its slots.
    let mut next: i64 = 0;
    for fd in &memory.keep {
        let fd = i64::from(*fd);
        if fd > next {
            child_step(memory, 8, libc::SYS_close_range, [next, fd - 1, 0]);
        }
        next = fd + 1;
    }
    // 0. Join the worker's cgroups first, so everything the worker does is accounted.
    for fd in &memory.join_cgroups {
        let written = child_step(
            memory,
            0,
            libc::SYS_write,
            [i64::from(*fd), c"0".as_ptr() as i64, 1],
        );
        if written != 1 {
            child_fail(memory, 0, i64::from(libc::EIO));
        }
    }
    // 7 (numbered last, so the other steps keep their numbers). Having joined by writing
    // (v1), a cgroup namespace rooted at the cgroups just joined, so that /proc/self/cgroup
    // reads "/" in every hierarchy. The one made at clone is rooted where the supervisor
    // is, and showed the worker's path below it: the supervisor's host pid and a count of
    // the workers it had made.
    if !memory.join_cgroups.is_empty() {
        child_step(
            memory,
            7,
            libc::SYS_unshare,
            [i64::from(libc::CLONE_NEWCGROUP), 0, 0],
        );
    }
    // 1. Wait until the parent has written our uid/gid maps; EOF means it gave up.
    let mut byte = 0u8;
    let got = child_step(
        memory,
        1,
        libc::SYS_read,
        [
            i64::from(memory.maps_written),
            (&mut byte as *mut u8) as i64,
            1,
        ],
    );
    if got != 1 {
        child_fail(memory, 1, i64::from(libc::EPIPE));
    }
    // 2-3. Become uid/gid 0 *inside* the user namespace (an unprivileged host uid outside),
    // so the exec'd worker keeps its capabilities in the namespace. Raw syscalls: glibc's
    // wrappers would try to synchronise threads that do not exist in this child.
    child_step(memory, 2, libc::SYS_setresgid, [0, 0, 0]);
    child_step(memory, 3, libc::SYS_setresuid, [0, 0, 0]);
    // 4. stdio, then the socket survives exec.
    for (target, fd) in memory.stdio.iter().enumerate() {
        if *fd == target as RawFd {
            child_step(
                memory,
                4,
                libc::SYS_fcntl,
                [i64::from(*fd), i64::from(libc::F_SETFD), 0],
            );
        } else {
            child_step(
                memory,
                4,
                libc::SYS_dup3,
                [i64::from(*fd), target as i64, 0],
            );
        }
    }
    child_step(
        memory,
        4,
        libc::SYS_fcntl,
        [i64::from(memory.socket), i64::from(libc::F_SETFD), 0],
    );
    // 5. Die with the spawning thread (a long-lived thread of the supervisor). Set after the
    // credential change, which clears the parent-death signal.
    child_step(
        memory,
        5,
        libc::SYS_prctl,
        [
            i64::from(libc::PR_SET_PDEATHSIG),
            i64::from(libc::SIGKILL),
            0,
        ],
    );
    // 6. Exec the sealed image: no path, so nothing in any sandbox can replace it.
    let ret = child_syscall(
        libc::SYS_execveat,
        i64::from(memory.image),
        c"".as_ptr() as i64,
        memory.argv.as_ptr() as i64,
        memory.envp.as_ptr() as i64,
        i64::from(libc::AT_EMPTY_PATH),
    );
    child_fail(memory, 6, -ret)
}
