//! A hostile tool for the escape tests: each subcommand attempts one thing a sandboxed
//! tool must not be able to do and prints `ok` or `errno=N` (or dies, for seccomp kills).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn report(ret: libc::c_long) {
    let line = if ret < 0 {
        format!("errno={}", errno())
    } else {
        "ok".to_string()
    };
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// A raw syscall with six arguments.
fn sys(nr: libc::c_long, args: [libc::c_long; 6]) -> libc::c_long {
    // SAFETY: every probe passes scalar or NULL/garbage pointer arguments that the kernel
    // validates (or seccomp refuses) before touching memory; this is what a hostile tool does.
    unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) }
}

fn main() {
    let what = std::env::args().nth(1).unwrap_or_default();
    let z = [0 as libc::c_long; 6];
    let ret = match what.as_str() {
        "unshare-user" => sys(libc::SYS_unshare, [libc::CLONE_NEWUSER as _, 0, 0, 0, 0, 0]),
        "clone-newuser" => {
            let r = sys(
                libc::SYS_clone,
                [(libc::CLONE_NEWUSER | libc::SIGCHLD) as _, 0, 0, 0, 0, 0],
            );
            if r == 0 {
                // SAFETY: in the (should-not-exist) child: leave at once.
                unsafe { libc::_exit(0) }
            }
            r
        }
        "clone3" => {
            // SAFETY: clone_args is plain old data.
            let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
            args.flags = libc::CLONE_NEWUSER as u64;
            args.exit_signal = libc::SIGCHLD as u64;
            let r = sys(
                libc::SYS_clone3,
                [
                    (&mut args as *mut libc::clone_args) as _,
                    std::mem::size_of::<libc::clone_args>() as _,
                    0,
                    0,
                    0,
                    0,
                ],
            );
            if r == 0 {
                // SAFETY: as above.
                unsafe { libc::_exit(0) }
            }
            r
        }
        "setns" => sys(libc::SYS_setns, [0, 0, 0, 0, 0, 0]),
        "mount" => sys(
            libc::SYS_mount,
            [
                c"none".as_ptr() as _,
                c"/tmp".as_ptr() as _,
                c"tmpfs".as_ptr() as _,
                0,
                0,
                0,
            ],
        ),
        "umount2" => sys(
            libc::SYS_umount2,
            [c"/tmp".as_ptr() as _, libc::MNT_DETACH as _, 0, 0, 0, 0],
        ),
        "pivot_root" => sys(
            libc::SYS_pivot_root,
            [c"/tmp".as_ptr() as _, c"/tmp".as_ptr() as _, 0, 0, 0, 0],
        ),
        "chroot" => sys(libc::SYS_chroot, [c"/tmp".as_ptr() as _, 0, 0, 0, 0, 0]),
        "ptrace" => sys(libc::SYS_ptrace, [libc::PTRACE_TRACEME as _, 0, 0, 0, 0, 0]),
        "process_vm_readv" => sys(libc::SYS_process_vm_readv, [1, 0, 0, 0, 0, 0]),
        "bpf" => sys(libc::SYS_bpf, z),
        "perf_event_open" => sys(libc::SYS_perf_event_open, z),
        "userfaultfd" => sys(libc::SYS_userfaultfd, z),
        "keyctl" => sys(libc::SYS_keyctl, z),
        "add_key" => sys(libc::SYS_add_key, z),
        "request_key" => sys(libc::SYS_request_key, z),
        "io_uring_setup" => sys(libc::SYS_io_uring_setup, [1, 0, 0, 0, 0, 0]),
        "kexec_load" => sys(libc::SYS_kexec_load, z),
        "init_module" => sys(libc::SYS_init_module, z),
        "finit_module" => sys(libc::SYS_finit_module, [-1, 0, 0, 0, 0, 0]),
        "open_by_handle_at" => sys(libc::SYS_open_by_handle_at, z),
        "tiocsti" => sys(
            libc::SYS_ioctl,
            [0, libc::TIOCSTI as _, c"x".as_ptr() as _, 0, 0, 0],
        ),
        "tiocsti-hibits" => sys(
            libc::SYS_ioctl,
            [
                0,
                ((0x123_i64 << 32) | libc::TIOCSTI as i64) as _,
                c"x".as_ptr() as _,
                0,
                0,
                0,
            ],
        ),
        "tioclinux" => sys(libc::SYS_ioctl, [0, libc::TIOCLINUX as _, 0, 0, 0, 0]),
        "personality" => sys(libc::SYS_personality, [0x0040_0000, 0, 0, 0, 0, 0]),
        "socket-unix" => sys(
            libc::SYS_socket,
            [libc::AF_UNIX as _, libc::SOCK_STREAM as _, 0, 0, 0, 0],
        ),
        "socket-inet" => sys(
            libc::SYS_socket,
            [libc::AF_INET as _, libc::SOCK_STREAM as _, 0, 0, 0, 0],
        ),
        "socket-packet" => sys(
            libc::SYS_socket,
            [libc::AF_PACKET as _, libc::SOCK_RAW as _, 0, 0, 0, 0],
        ),
        "socket-netlink" => sys(
            libc::SYS_socket,
            [libc::AF_NETLINK as _, libc::SOCK_RAW as _, 0, 0, 0, 0],
        ),
        "socket-vsock" => sys(
            libc::SYS_socket,
            [libc::AF_VSOCK as _, libc::SOCK_STREAM as _, 0, 0, 0, 0],
        ),
        "socket-alg" => sys(
            libc::SYS_socket,
            [libc::AF_ALG as _, libc::SOCK_SEQPACKET as _, 0, 0, 0, 0],
        ),
        "mknod-char" => sys(
            libc::SYS_mknodat,
            [
                libc::AT_FDCWD as _,
                c"/tmp/null2".as_ptr() as _,
                (libc::S_IFCHR | 0o666) as _,
                libc::makedev(1, 3) as _,
                0,
                0,
            ],
        ),
        "syscall-1000" => sys(1000, z),
        "x32-getpid" => sys(0x4000_0000 | libc::SYS_getpid, z),
        "int80-getpid" => {
            let mut ret: i64 = 20; // __NR_getpid on i386
            // SAFETY: the 32-bit syscall entry with getpid's number touches no memory;
            // the seccomp filter is expected to kill the process here.
            unsafe { std::arch::asm!("int 0x80", inout("rax") ret, options(nostack)) };
            ret
        }
        "fd-bomb" => {
            let mut opened = 0;
            loop {
                // SAFETY: open of a constant path; the descriptor is leaked on purpose.
                let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
                if fd < 0 {
                    println!("opened={opened} errno={}", errno());
                    std::process::exit(0);
                }
                opened += 1;
            }
        }
        other => {
            eprintln!("unknown probe {other:?}");
            std::process::exit(2)
        }
    };
    report(ret);
}
