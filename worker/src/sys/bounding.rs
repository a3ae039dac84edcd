//! The capability bounding set, emptied up to the last capability the running kernel
//! knows rather than up to the last one a crate was compiled with.
//!
//! A fixed list (the `caps` crate's `all()`) misses any capability added to the kernel
//! after that list was written: it would stay in the bounding set, so a uid-0 exec inside
//! the sandbox could regain it. The kernel says how many it has in
//! `/proc/sys/kernel/cap_last_cap`; where that cannot be read, PR_CAPBSET_READ answers
//! EINVAL for the first number past the last one, which is the same fact.

use std::io;

/// Capability numbers index a 64-bit mask in the kernel (`kernel_cap_t`), so none can be
/// above 63; a larger value read from /proc is not believed.
const HIGHEST_POSSIBLE: u32 = 63;

const CAP_LAST_CAP: &str = "/proc/sys/kernel/cap_last_cap";

/// The number of the kernel's last capability as `/proc/sys/kernel/cap_last_cap` gives
/// it, or `None` when that file cannot be read or parsed (no /proc in this mount
/// namespace). Read it before the mounts change what /proc is.
pub fn last_capability() -> Option<u32> {
    std::fs::read_to_string(CAP_LAST_CAP)
        .ok()
        .and_then(|text| parse_last_capability(&text))
}

fn parse_last_capability(text: &str) -> Option<u32> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|&last| last <= HIGHEST_POSSIBLE)
}

/// Empties the bounding set: PR_CAPBSET_DROP for every capability from 0 up, until the
/// kernel answers EINVAL past `last` (from [`last_capability`]). Dropping goes on past
/// `last` until that EINVAL, so a stale or missing `last` still empties the whole set;
/// EINVAL at or below `last` means /proc and the kernel disagree, and is an error rather
/// than a guess. One syscall per capability and one more, without a read before each.
pub fn drop_bounding_set(last: Option<u32>) -> io::Result<()> {
    for cap in 0..=HIGHEST_POSSIBLE {
        // SAFETY: PR_CAPBSET_DROP takes a capability number and reads no memory.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        if ret == 0 {
            continue;
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EINVAL) {
            return Err(error);
        }
        return match last {
            Some(last) if cap <= last => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{CAP_LAST_CAP} says {last}, but the kernel has no capability {cap}"),
            )),
            _ => Ok(()),
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `cap` is in the calling thread's bounding set; `None` past the kernel's last.
    fn in_bounding_set(cap: u32) -> Option<bool> {
        // SAFETY: PR_CAPBSET_READ takes a capability number and reads no memory.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_READ, libc::c_ulong::from(cap), 0, 0, 0) };
        (ret >= 0).then_some(ret == 1)
    }

    /// The kernel's last capability by probing, the way the fallback finds it.
    fn probed_last() -> u32 {
        (0..=HIGHEST_POSSIBLE)
            .take_while(|&cap| in_bounding_set(cap).is_some())
            .last()
            .unwrap()
    }

    #[test]
    fn cap_last_cap_is_read_and_matches_what_the_kernel_answers() {
        let last = last_capability().expect("/proc/sys/kernel/cap_last_cap is readable");
        // CAP_CHECKPOINT_RESTORE (40) exists since Linux 5.9.
        assert!(last >= 40, "cap_last_cap {last}");
        assert_eq!(last, probed_last());
    }

    #[test]
    fn only_a_plain_number_in_range_is_believed() {
        assert_eq!(parse_last_capability("40\n"), Some(40));
        assert_eq!(parse_last_capability("63"), Some(63));
        assert_eq!(parse_last_capability("64"), None);
        assert_eq!(parse_last_capability(""), None);
        assert_eq!(parse_last_capability("-1"), None);
        assert_eq!(parse_last_capability("forty"), None);
    }

    /// In a forked child with a user namespace of its own (where it holds CAP_SETPCAP
    /// whoever runs the test), drops the bounding set given `last`, then reports through
    /// its exit status: 0 when every capability the kernel has is gone, 1 when one is
    /// left, 2 when the drop failed, 3 when no user namespace could be made.
    fn drop_in_child(last: Option<u32>) -> i32 {
        let kernel_last = probed_last();
        // SAFETY: the child calls only unshare, prctl and _exit (no allocation on the
        // success paths, no locks) before it exits; the parent waits for it below.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: unshare takes flags only.
            if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
                // SAFETY: _exit ends the child without running the parent's destructors.
                unsafe { libc::_exit(3) };
            }
            let code = match drop_bounding_set(last) {
                Err(_) => 2,
                Ok(()) if (0..=kernel_last).any(|cap| in_bounding_set(cap) != Some(false)) => 1,
                Ok(()) => 0,
            };
            // SAFETY: as above.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above; `status` outlives the call.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(waited, pid);
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn every_capability_the_kernel_has_is_dropped_even_past_a_stale_last() {
        let last = last_capability();
        // The kernel's own value, an old kernel's (CAP_AUDIT_READ, 37), and none at all:
        // each leaves an empty bounding set.
        for given in [last, Some(37), Some(0), None] {
            match drop_in_child(given) {
                0 => {}
                3 if std::env::var_os("AIRLOCK_MUST_WORK").is_none() => {
                    eprintln!("skipped: no user namespace for the test's child");
                    return;
                }
                code => panic!("last {given:?}: child exited {code}"),
            }
        }
    }

    #[test]
    fn a_last_beyond_what_the_kernel_has_is_an_error() {
        let beyond = probed_last() + 1;
        match drop_in_child(Some(beyond)) {
            2 => {}
            3 if std::env::var_os("AIRLOCK_MUST_WORK").is_none() => {
                eprintln!("skipped: no user namespace for the test's child");
            }
            code => panic!("child exited {code}"),
        }
    }
}
