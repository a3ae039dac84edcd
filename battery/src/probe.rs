//! The hostile side: each attack does one thing a sandboxed tool must not be able to do and
//! prints one line saying what happened (`ok`, `errno=N`, or an attack-specific word). A
//! seccomp kill prints nothing; the supervisor reports it.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;

use crate::sys;

/// Runs the attack named by `args[0]` (its arguments follow) and prints what happened.
/// Returns the process exit code: 0 when the attack ran (whatever its outcome), 2 for an
/// unknown attack or missing argument.
pub fn main(args: &[String]) -> i32 {
    let Some((name, rest)) = args.split_first() else {
        eprintln!("usage: PROBE ATTACK [ARG...]");
        return 2;
    };
    match attack(name, rest) {
        Some(line) => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
            0
        }
        None => {
            eprintln!("unknown attack {name:?} or missing argument");
            2
        }
    }
}

fn show(result: Result<libc::c_long, i32>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(errno) => format!("errno={errno}"),
    }
}

fn show_io<T>(result: std::io::Result<T>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => format!("errno={}", e.raw_os_error().unwrap_or(0)),
    }
}

fn sys0(nr: libc::c_long) -> String {
    show(sys::syscall(nr, [0; 6]))
}

fn ptr(s: &std::ffi::CStr) -> libc::c_long {
    s.as_ptr() as libc::c_long
}

fn attack(name: &str, args: &[String]) -> Option<String> {
    let arg = |i: usize| args.get(i).map(String::as_str);
    let z = [0 as libc::c_long; 6];
    Some(match name {
        // ---- namespaces and process creation
        "unshare-user" => show(sys::syscall(
            libc::SYS_unshare,
            [libc::CLONE_NEWUSER as _, 0, 0, 0, 0, 0],
        )),
        "clone-newuser" => {
            let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_long;
            match sys::syscall(libc::SYS_clone, [flags, 0, 0, 0, 0, 0]) {
                Ok(0) => sys::exit_child(),
                other => show(other),
            }
        }
        "clone3" => show(sys::clone3(libc::CLONE_NEWUSER as u64)),
        "setns" => sys0(libc::SYS_setns),
        "mount" => show(sys::syscall(
            libc::SYS_mount,
            [ptr(c"none"), ptr(c"/tmp"), ptr(c"tmpfs"), 0, 0, 0],
        )),
        "mount-cgroup" => show(sys::syscall(
            libc::SYS_mount,
            [ptr(c"none"), ptr(c"/tmp"), ptr(c"cgroup2"), 0, 0, 0],
        )),
        "umount2" => show(sys::syscall(
            libc::SYS_umount2,
            [ptr(c"/tmp"), libc::MNT_DETACH as _, 0, 0, 0, 0],
        )),
        "pivot_root" => show(sys::syscall(
            libc::SYS_pivot_root,
            [ptr(c"/tmp"), ptr(c"/tmp"), 0, 0, 0, 0],
        )),
        "chroot" => show(sys::syscall(
            libc::SYS_chroot,
            [ptr(c"/tmp"), 0, 0, 0, 0, 0],
        )),
        // ---- kernel attack surface
        "ptrace" => show(sys::syscall(
            libc::SYS_ptrace,
            [libc::PTRACE_TRACEME as _, 0, 0, 0, 0, 0],
        )),
        "process_vm_readv" => show(sys::syscall(libc::SYS_process_vm_readv, [1, 0, 0, 0, 0, 0])),
        "bpf" => sys0(libc::SYS_bpf),
        "perf_event_open" => sys0(libc::SYS_perf_event_open),
        "userfaultfd" => sys0(libc::SYS_userfaultfd),
        "keyctl" => sys0(libc::SYS_keyctl),
        "add_key" => sys0(libc::SYS_add_key),
        "request_key" => sys0(libc::SYS_request_key),
        "io_uring_setup" => show(sys::syscall(libc::SYS_io_uring_setup, [1, 0, 0, 0, 0, 0])),
        "kexec_load" => sys0(libc::SYS_kexec_load),
        "init_module" => sys0(libc::SYS_init_module),
        "finit_module" => show(sys::syscall(libc::SYS_finit_module, [-1, 0, 0, 0, 0, 0])),
        "open_by_handle_at" => sys0(libc::SYS_open_by_handle_at),
        "personality" => show(sys::syscall(
            libc::SYS_personality,
            [0x0040_0000, 0, 0, 0, 0, 0], // READ_IMPLIES_EXEC
        )),
        "syscall-1000" => show(sys::syscall(1000, z)),
        "x32-getpid" => show(sys::syscall(0x4000_0000 | libc::SYS_getpid, z)),
        "int80-getpid" => show(Ok(sys::int80_getpid())),
        // ---- terminals
        "tiocsti" => show(sys::syscall(
            libc::SYS_ioctl,
            [0, libc::TIOCSTI as _, ptr(c"x"), 0, 0, 0],
        )),
        // The high 32 bits of the request are ignored by the kernel: a filter comparing all
        // 64 bits would let this through.
        "tiocsti-hibits" => show(sys::syscall(
            libc::SYS_ioctl,
            [
                0,
                ((0x123_i64 << 32) | libc::TIOCSTI as i64) as _,
                ptr(c"x"),
                0,
                0,
                0,
            ],
        )),
        "tioclinux" => show(sys::syscall(
            libc::SYS_ioctl,
            [0, libc::TIOCLINUX as _, 0, 0, 0, 0],
        )),
        // ---- sockets
        "socket-unix" => socket(libc::AF_UNIX, libc::SOCK_STREAM),
        "socket-inet" => socket(libc::AF_INET, libc::SOCK_STREAM),
        "socket-raw" => socket(libc::AF_INET, libc::SOCK_RAW),
        "socket-packet" => socket(libc::AF_PACKET, libc::SOCK_RAW),
        "socket-netlink" => socket(libc::AF_NETLINK, libc::SOCK_RAW),
        "socket-vsock" => socket(libc::AF_VSOCK, libc::SOCK_STREAM),
        "socket-alg" => socket(libc::AF_ALG, libc::SOCK_SEQPACKET),
        "connect-abstract" => {
            use std::os::linux::net::SocketAddrExt;
            let name = arg(0)?;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes());
            show_io(addr.and_then(|a| UnixStream::connect_addr(&a)))
        }
        // Bait for a neighbour: listens on abstract name arg 0, creates file arg 1 once
        // listening (a shared writable directory tells the test when to attack), waits for
        // a connection until file arg 2 appears (the test's attack is over: no deadline
        // that a slow machine's attack could outlast) and prints `accepted` or `nobody`,
        // then this sandbox's network namespace (`net:[inode]`).
        "listen-abstract" => {
            let listened = listen_abstract(
                arg(0)?,
                std::path::Path::new(arg(1)?),
                std::path::Path::new(arg(2)?),
            );
            format!("{listened} {}", netns())
        }
        // The control for the above: a listener and a client in the same sandbox reach each
        // other, so `nobody`/`errno` across sandboxes is the boundary, not a broken probe.
        "abstract-pair" => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(arg(0)?.as_bytes());
            show_io(addr.and_then(|a| {
                let _listener = std::os::unix::net::UnixListener::bind_addr(&a)?;
                UnixStream::connect_addr(&a)
            }))
        }
        // What a call finds of the calls before it in its network namespace: the unix
        // sockets listed there, whether abstract name arg 0 is free, and the namespace.
        "abstract-bind" => {
            use std::os::linux::net::SocketAddrExt;
            let sockets = std::fs::read_to_string("/proc/net/unix")
                .map(|t| t.lines().count().saturating_sub(1).to_string())
                .unwrap_or_else(|e| format!("errno={}", e.raw_os_error().unwrap_or(0)));
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(arg(0)?.as_bytes());
            let bound = show_io(addr.and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a)));
            format!("sockets={sockets} bind={bound} {}", netns())
        }
        // A plant for the next call: a listener on abstract name arg 0 and a socket pair,
        // sent in a message queued on the pair itself, so that they outlive this process
        // until the kernel's collector finds the cycle.
        "abstract-inflight" => format!("inflight={} {}", plant_in_flight(arg(0)?), netns()),
        "connect-unix" => show_io(UnixStream::connect(arg(0)?)),
        "connect-tcp" => {
            let addr: std::net::SocketAddr = arg(0)?.parse().ok()?;
            show_io(std::net::TcpStream::connect_timeout(
                &addr,
                std::time::Duration::from_secs(2),
            ))
        }
        // ---- files
        "read-file" => {
            let mut buf = [0u8; 1];
            show_io(std::fs::File::open(arg(0)?).and_then(|mut f| f.read(&mut buf)))
        }
        // Opens for writing without O_CREAT/O_TRUNC and writes nothing: proves the open is
        // refused without damaging anything if it is not.
        "open-write" => show_io(std::fs::OpenOptions::new().write(true).open(arg(0)?)),
        "create-file" => show_io(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(arg(0)?),
        ),
        "mknod-char" => show(sys::syscall(
            libc::SYS_mknodat,
            [
                libc::AT_FDCWD as _,
                ptr(c"/tmp/null2"),
                (libc::S_IFCHR | 0o666) as _,
                libc::makedev(1, 3) as _,
                0,
                0,
            ],
        )),
        "plant-symlink" => {
            // Replace a directory the next sandbox binds with a link to a host directory.
            let (at, target) = (arg(0)?, arg(1)?);
            let _ = std::fs::remove_dir(at);
            show_io(std::os::unix::fs::symlink(target, at))
        }
        "hardlink" => show_io(std::fs::hard_link(arg(0)?, arg(1)?)),
        "suid-inert" => suid_inert(),
        // ---- what the tool can see
        "creds" => creds(),
        "fds" => fds(),
        "cwd" => match std::env::current_dir() {
            Ok(dir) => format!("cwd={}", dir.display()),
            Err(e) => show_io::<()>(Err(e)),
        },
        "env-names" => {
            let mut names: Vec<String> = std::env::vars_os()
                .map(|(k, _)| k.to_string_lossy().into_owned())
                .collect();
            names.sort();
            format!("env={}", names.join(","))
        }
        "dev-list" => {
            let mut names: Vec<String> = match std::fs::read_dir("/dev") {
                Ok(dir) => dir
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect(),
                Err(e) => return Some(show_io::<()>(Err(e))),
            };
            names.sort();
            format!("dev={}", names.join(","))
        }
        "cgroup-view" => cgroup_view(),
        "proc-hidden" => proc_hidden(args),
        "proc-pids" => {
            let count = std::fs::read_dir("/proc")
                .map(|dir| {
                    dir.flatten()
                        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
                        .count()
                })
                .unwrap_or(0);
            // The worker (1) and this probe: anything more is someone else's process.
            if count <= 2 {
                "pids<=2".into()
            } else {
                format!("pids={count}")
            }
        }
        "core-limit" => {
            let now = sys::getrlimit(libc::RLIMIT_CORE);
            let raise = sys::setrlimit(libc::RLIMIT_CORE, 1 << 20, 1 << 20);
            let raise = match raise {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("errno={e}"),
            };
            match now {
                Ok((soft, hard)) => format!("core={soft}/{hard} raise={raise}"),
                Err(e) => format!("errno={e}"),
            }
        }
        // ---- resources
        "fork-bomb" => fork_bomb(),
        "memory-bomb" => memory_bomb(),
        "fd-bomb" => {
            let mut held = Vec::new();
            loop {
                match std::fs::File::open("/dev/null") {
                    Ok(f) => held.push(f),
                    Err(e) => {
                        break format!(
                            "opened={} errno={}",
                            held.len(),
                            e.raw_os_error().unwrap_or(0)
                        );
                    }
                }
            }
        }
        "fill-tmp" => fill_tmp(),
        "unwaited-spin" => unwaited_spin(),
        "spin" => loop {
            std::hint::black_box(0u64);
        },
        "sleep" => {
            std::thread::sleep(std::time::Duration::from_secs(3600));
            "woke".into()
        }
        "flood" => {
            // 4 MiB, 64 times the battery's output limit: enough to show the bound, little
            // enough to drain well within the case's deadline on an emulated machine.
            let chunk = vec![b'x'; 1 << 16];
            let mut out = std::io::stdout().lock();
            for _ in 0..64 {
                if out.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = out.write_all(b"\n");
            "flooded".into()
        }
        _ => return None,
    })
}

fn socket(family: libc::c_int, kind: libc::c_int) -> String {
    show(sys::syscall(
        libc::SYS_socket,
        [family as _, kind as _, 0, 0, 0, 0],
    ))
}

/// `capeff=… capprm=… capbnd=… capamb=… nnp=… seccomp=…` from /proc/self/status.
fn creds() -> String {
    let status = match std::fs::read_to_string("/proc/self/status") {
        Ok(s) => s,
        Err(e) => return show_io::<()>(Err(e)),
    };
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    let cap = |key: &str| {
        let v = field(key);
        if v.chars().all(|c| c == '0') {
            "0".to_string()
        } else {
            v
        }
    };
    format!(
        "capeff={} capprm={} capinh={} capbnd={} capamb={} nnp={} seccomp={}",
        cap("CapEff:"),
        cap("CapPrm:"),
        cap("CapInh:"),
        cap("CapBnd:"),
        cap("CapAmb:"),
        field("NoNewPrivs:"),
        field("Seccomp:")
    )
}

/// Open descriptors other than the one reading the directory.
fn fds() -> String {
    let mut fds: Vec<u32> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir
            .flatten()
            // read_dir's own descriptor points at this very directory: leave exactly it out.
            .filter(|e| {
                std::fs::read_link(e.path())
                    .map(|target| !(target.starts_with("/proc") && target.ends_with("fd")))
                    .unwrap_or(true)
            })
            .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            .collect(),
        Err(e) => return show_io::<()>(Err(e)),
    };
    fds.sort_unstable();
    let list: Vec<String> = fds.iter().map(u32::to_string).collect();
    format!("fds={}", list.join(","))
}

/// Setuid binaries cannot raise privileges: every place a program runs from is mounted
/// nosuid, and no_new_privs is set (either one alone disarms them).
fn suid_inert() -> String {
    let mut nosuid = true;
    for dir in [c"/usr", c"/usr/bin", c"/bin", c"/tmp"] {
        match sys::statvfs_flags(dir) {
            Ok(flags) => nosuid &= flags & libc::ST_NOSUID != 0,
            Err(libc::ENOENT) => {}
            Err(e) => return format!("errno={e}"),
        }
    }
    let nnp = std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l == "NoNewPrivs:\t1"))
        .unwrap_or(false);
    match (nosuid, nnp) {
        (true, true) => "inert".into(),
        (false, _) => "suid-mount".into(),
        (true, false) => "no-nnp".into(),
    }
}

/// Forks until refused; the children wait to be killed with the sandbox.
fn fork_bomb() -> String {
    for _ in 0..100_000 {
        match sys::fork() {
            Ok(0) => sys::pause(),
            Ok(_) => {}
            Err(e) => return format!("errno={e}"),
        }
    }
    "unbounded".into()
}

/// A child that uses 300 ms of CPU and is reaped by the kernel, unwaited for, since this
/// process ignores SIGCHLD: its time reaches no `RUSAGE_CHILDREN`, only the cgroup's count.
fn unwaited_spin() -> String {
    sys::ignore_sigchld();
    match sys::fork() {
        Ok(0) => {
            while sys::own_cpu_us() < 300_000 {
                std::hint::black_box(0u64);
            }
            sys::exit_child()
        }
        Ok(pid) => {
            sys::wait_gone(pid);
            "child ended unwaited".into()
        }
        Err(e) => format!("errno={e}"),
    }
}

/// Allocates and touches memory until something stops it (the cgroup's OOM killer).
fn memory_bomb() -> String {
    let mut held: Vec<Vec<u8>> = Vec::new();
    for _ in 0..(64 * 1024) {
        // 1 MiB at a time, written so the pages are really ours.
        held.push(vec![0x5a; 1 << 20]);
    }
    format!("survived={}", held.len())
}

/// Writes to /tmp until refused: the sized tmpfs (ENOSPC) or RLIMIT_FSIZE (EFBIG) stop it.
fn fill_tmp() -> String {
    sys::ignore_sigxfsz();
    let chunk = vec![0u8; 1 << 20];
    for n in 0..100_000 {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(format!("/tmp/fill-{n}"));
        let mut file = match file {
            Ok(f) => f,
            Err(e) => return format!("errno={}", e.raw_os_error().unwrap_or(0)),
        };
        for _ in 0..64 {
            if let Err(e) = file.write_all(&chunk) {
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return format!("errno={}", e.raw_os_error().unwrap_or(0));
            }
        }
    }
    "unbounded".into()
}

/// This process's network namespace (`net:[inode]`).
fn netns() -> String {
    std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_else(|e| format!("netns-errno={}", e.raw_os_error().unwrap_or(0)))
}

fn plant_in_flight(name: &str) -> String {
    use std::os::fd::AsRawFd;
    use std::os::linux::net::SocketAddrExt;
    let planted = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a))
        .and_then(|listener| UnixStream::pair().map(|pair| (listener, pair)));
    let (listener, (a, b)) = match planted {
        Ok(planted) => planted,
        Err(e) => return format!("errno={}", e.raw_os_error().unwrap_or(0)),
    };
    let fds = [listener.as_raw_fd(), a.as_raw_fd(), b.as_raw_fd()];
    match sys::send_fds(a.as_raw_fd(), &fds) {
        Ok(()) => "ok".into(),
        Err(errno) => format!("errno={errno}"),
    }
}

fn listen_abstract(name: &str, ready: &std::path::Path, done: &std::path::Path) -> String {
    use std::os::linux::net::SocketAddrExt;
    let listener = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a))
        .and_then(|l| l.set_nonblocking(true).map(|()| l));
    let listener = match listener {
        Ok(listener) => listener,
        Err(e) => return format!("listen-errno={}", e.raw_os_error().unwrap_or(0)),
    };
    if let Err(e) = std::fs::write(ready, b"listening") {
        return format!("ready-errno={}", e.raw_os_error().unwrap_or(0));
    }
    loop {
        // Looked at before accepting: a connection made before `done` appeared is seen.
        let over = done.exists();
        match listener.accept() {
            Ok(_) => return "accepted".into(),
            Err(e) if e.kind() == ErrorKind::WouldBlock && over => return "nobody".into(),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => return format!("accept-errno={}", e.raw_os_error().unwrap_or(0)),
        }
    }
}

/// `cgroup=/` when `/proc/self/cgroup` shows the sandbox's own cgroup as the root in every
/// hierarchy, else `cgroup=` and the paths it shows (which named the supervisor's pid and
/// its count of workers when the namespace was rooted above the worker).
fn cgroup_view() -> String {
    let text = match std::fs::read_to_string("/proc/self/cgroup") {
        Ok(text) => text,
        Err(e) => return show_io::<()>(Err(e)),
    };
    let mut paths: Vec<&str> = text
        .lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .collect();
    paths.sort_unstable();
    paths.dedup();
    format!("cgroup={}", paths.join(","))
}

/// `hidden` when every path is missing, unreadable, an empty file or an empty directory;
/// else the first that shows something and how much.
fn proc_hidden(paths: &[String]) -> String {
    for path in paths {
        let shown = match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => std::fs::read_dir(path).map(|dir| dir.count()),
            Ok(_) => std::fs::read(path).map(|bytes| bytes.len()),
            Err(e) => Err(e),
        };
        match shown {
            Ok(0) => {}
            Ok(n) => return format!("shown={path}:{n}"),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::EACCES | libc::EPERM)
                ) => {}
            Err(e) => return format!("{path}: {}", show_io::<()>(Err(e))),
        }
    }
    "hidden".into()
}
