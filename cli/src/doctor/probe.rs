//! Probes that change the calling process, run in a forked child so the doctor itself
//! stays unconfined.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Stdio;

/// Runs `probe` in a forked child that exits 0 right after it succeeds; the probe's error
/// (an errno) comes back as the `Err` of this function. Never execs anything.
pub(super) fn run_probe_child(probe: fn() -> io::Result<()>) -> io::Result<()> {
    // Never executed: the child ends in the pre_exec hook.
    let mut command = std::process::Command::new("/bin/true");
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: the hook runs in the forked child, where only async-signal-safe work is
    // allowed: `probe` makes raw syscalls on stack data (no allocation, no locks), and the
    // child then ends with _exit, never returning into the copy of this process's state.
    // An error is handed back by std through its close-on-exec pipe as the spawn error.
    unsafe {
        command.pre_exec(move || {
            probe()?;
            exit_child_now()
        });
    }
    let mut child = command.spawn()?;
    let status = child.wait()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "the probe child ended with {status}"
        )))
    }
}

/// Ends a forked probe child at once, with status 0.
fn exit_child_now() -> ! {
    // SAFETY: _exit ends the process without running atexit handlers or destructors, which
    // belong to the parent; it is async-signal-safe.
    unsafe { libc::_exit(0) }
}

/// unshare(2) of the calling (forked, single-threaded) process.
pub(super) fn unshare_namespaces(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes a flag word only and reads no memory of ours.
    if unsafe { libc::unshare(flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets no_new_privs and installs a one-instruction filter that allows every syscall: it
/// changes nothing, but tells whether the kernel accepts SECCOMP_SET_MODE_FILTER.
pub(super) fn install_allow_all_seccomp_filter() -> io::Result<()> {
    let mut filter = [libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ALLOW,
    }];
    let program = libc::sock_fprog {
        len: 1,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `program` points at `filter`; both live on this stack frame for the whole
    // call, and the kernel copies the program before returning.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as libc::c_uint,
            &program as *const libc::sock_fprog,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// In a fresh user and uts namespace, names the host as every worker does; a runtime's
/// seccomp profile may refuse sethostname without CAP_SYS_ADMIN in its own namespace.
pub(super) fn set_hostname_in_new_uts() -> io::Result<()> {
    unshare_namespaces(libc::CLONE_NEWUSER | libc::CLONE_NEWUTS)?;
    let name = b"airlock";
    // SAFETY: `name` is a static byte string of the given length; the kernel copies it.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// In a fresh user and mount namespace, makes every mount private and mounts a tmpfs over
/// `/`, as every worker mounts its root: an AppArmor profile that denies mount (Docker's
/// `docker-default`) refuses it. Only raw syscalls on static strings: it runs after fork.
pub(super) fn mount_in_new_namespace() -> io::Result<()> {
    unshare_namespaces(libc::CLONE_NEWUSER | libc::CLONE_NEWNS)?;
    let root = c"/";
    // SAFETY: the strings are static and NUL-terminated; the null pointers are the source,
    // type and data mount(2) accepts as absent for a propagation change.
    let ret = unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    let tmpfs = c"tmpfs";
    // SAFETY: as above; the tmpfs gets no data (its defaults).
    let ret = unsafe {
        libc::mount(
            tmpfs.as_ptr(),
            root.as_ptr(),
            tmpfs.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
