//! Empty network namespaces recycled between workers, one worker at a time.
//!
//! Making a network namespace and tearing it down is most of a cold spawn's kernel work,
//! and the teardown runs later on a kernel worker thread, where it competes with the next
//! calls. A `network = "none"` worker whose filter allows only unix sockets can leave
//! nothing in its namespace but unix sockets: it holds no capability over a namespace
//! the supervisor made, and no other socket family can be opened. So once the worker is
//! reaped (with it every process of its pid namespace) and the namespace lists no unix
//! socket any more (one still in flight in a queue waiting for the kernel's collector is
//! listed too), nothing of the earlier call is observable there, and the next worker may
//! have it. Never two workers at once: a namespace goes back on the shelf only with proof
//! that its worker is gone, and is dropped instead on every other path.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::sys;

/// Idle namespaces kept for the next workers; more are dropped (and torn down). Each is a
/// descriptor the supervisor holds (the daemon counts them against its open-file limit).
pub(crate) const IDLE_MAX: usize = 32;

/// The shelf of idle namespaces, shared by every spawner thread of a supervisor.
#[derive(Debug, Default)]
pub(crate) struct NamespaceShelf {
    idle: std::sync::Mutex<Vec<OwnedFd>>,
    /// Set once making a namespace was refused (an unprivileged supervisor): every worker
    /// then gets a fresh one from clone.
    unavailable: AtomicBool,
    /// Set for a one-shot supervisor: the first spawner thread to start makes one idle
    /// namespace at once, while its caller still loads the policy, so that the call does
    /// not wait for it.
    make_one_ahead: AtomicBool,
    counts: ShelfCounts,
}

/// What the shelf did, for stats and tests.
#[derive(Debug, Default)]
struct ShelfCounts {
    made: AtomicU64,
    reused: AtomicU64,
    discarded: AtomicU64,
}

/// How many namespaces the shelf made, reused and dropped because something was left in
/// them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NamespaceCounts {
    /// Made for a worker because no clean idle one was there.
    pub made: u64,
    /// Given to a worker again after an earlier one was reaped.
    pub reused: u64,
    /// Dropped when taken: a unix socket was still listed in it.
    pub discarded: u64,
}

/// A namespace lent to one worker. Dropping it drops the namespace; only
/// [`LentNamespace::give_back`] with proof that the worker is gone puts it back.
#[derive(Debug)]
pub struct LentNamespace {
    namespace: Option<OwnedFd>,
    shelf: Arc<NamespaceShelf>,
}

impl LentNamespace {
    /// Puts the namespace back on the shelf if the worker behind `pidfd` has been reaped:
    /// the kernel then no longer finds the process (ESRCH), and it was PID 1 of its pid
    /// namespace, whose other processes are gone before it can be reaped. Anything else
    /// (no pidfd, a process still there, an unexpected error) drops the namespace.
    pub fn give_back(mut self, pidfd: Option<&OwnedFd>) {
        let reaped =
            pidfd.is_some_and(|pidfd| sys::pidfd_process_is_reaped(pidfd).unwrap_or(false));
        let Some(namespace) = self.namespace.take() else {
            return;
        };
        if !reaped {
            return;
        }
        let mut idle = self
            .shelf
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if idle.len() < IDLE_MAX {
            idle.push(namespace);
        }
    }
}

impl NamespaceShelf {
    /// A shelf whose first spawner thread makes one idle namespace as it starts.
    pub(crate) fn making_one_ahead() -> Self {
        Self {
            make_one_ahead: AtomicBool::new(true),
            ..Self::default()
        }
    }

    /// Whether a namespace is to be made ahead now; true once at most.
    pub(crate) fn take_one_ahead(&self) -> bool {
        self.make_one_ahead.swap(false, Ordering::Relaxed)
    }

    /// Shelves a namespace the calling thread has just made and not used: nothing was ever
    /// in it. (It is still checked for unix sockets when it is taken.)
    pub(crate) fn put_fresh(&self, namespace: OwnedFd) {
        self.counts.made.fetch_add(1, Ordering::Relaxed);
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(namespace);
    }

    /// Remembers that making a namespace was refused: workers get theirs from clone.
    pub(crate) fn note_unavailable(&self, error: &std::io::Error) {
        if matches!(error.raw_os_error(), Some(libc::EPERM | libc::EINVAL)) {
            tracing::debug!(%error, "no recycled network namespaces: each worker makes its own");
            self.unavailable.store(true, Ordering::Relaxed);
        }
    }

    /// Moves the calling spawner thread into an empty network namespace for its next worker
    /// alone: a clean idle one, else a new one. `None` when neither worked; the thread may
    /// then be in any namespace, so the worker must get a fresh one from clone. `moved` is
    /// set when the thread left the namespace it was in.
    pub(crate) fn enter_one(
        self: &Arc<Self>,
        proc_dir: &OwnedFd,
        moved: &mut bool,
    ) -> Option<LentNamespace> {
        loop {
            let taken = self
                .idle
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .pop();
            let Some(namespace) = taken else { break };
            let entered = sys::enter_network_namespace(&namespace).and_then(|()| {
                *moved = true;
                sys::thread_network_has_unix_sockets(proc_dir)
            });
            match entered {
                Ok(false) => {
                    self.counts.reused.fetch_add(1, Ordering::Relaxed);
                    return Some(self.lend(namespace));
                }
                Ok(true) => {
                    self.counts.discarded.fetch_add(1, Ordering::Relaxed);
                }
                Err(error) => {
                    tracing::debug!(%error, "an idle network namespace could not be checked; dropped");
                }
            }
        }
        if self.unavailable.load(Ordering::Relaxed) {
            return None;
        }
        let made = sys::unshare_network_namespace().and_then(|()| {
            *moved = true;
            sys::open_thread_network_namespace(proc_dir)
        });
        match made {
            Ok(namespace) => {
                self.counts.made.fetch_add(1, Ordering::Relaxed);
                Some(self.lend(namespace))
            }
            Err(error) => {
                self.note_unavailable(&error);
                None
            }
        }
    }

    fn lend(self: &Arc<Self>, namespace: OwnedFd) -> LentNamespace {
        LentNamespace {
            namespace: Some(namespace),
            shelf: Arc::clone(self),
        }
    }

    /// What the shelf did so far.
    pub(crate) fn counts(&self) -> NamespaceCounts {
        NamespaceCounts {
            made: self.counts.made.load(Ordering::Relaxed),
            reused: self.counts.reused.load(Ordering::Relaxed),
            discarded: self.counts.discarded.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    /// Runs `f` on a thread of its own (it moves between network namespaces), with the
    /// host's /proc.
    fn on_own_thread<T: Send + 'static>(f: impl FnOnce(&OwnedFd) -> T + Send + 'static) -> T {
        std::thread::spawn(move || f(&sys::open_proc_dir().unwrap()))
            .join()
            .unwrap()
    }

    fn can_make_namespaces() -> bool {
        on_own_thread(|_| sys::unshare_network_namespace().is_ok())
    }

    fn reaped_child() -> OwnedFd {
        let child = std::process::Command::new("true").spawn().unwrap();
        let pidfd = sys::pidfd_open(child.id() as i32).unwrap();
        let mut child = child;
        child.wait().unwrap();
        pidfd
    }

    #[test]
    fn a_namespace_is_reused_only_after_its_worker_is_reaped() {
        if !can_make_namespaces() {
            assert!(std::env::var_os("AIRLOCK_MUST_WORK").is_none());
            return;
        }
        let shelf = Arc::new(NamespaceShelf::default());
        let s = Arc::clone(&shelf);
        let first = on_own_thread(move |proc_dir| s.enter_one(proc_dir, &mut false)).unwrap();
        // A worker still running: the namespace is dropped, not shelved.
        let mut running = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let running_pidfd = sys::pidfd_open(running.id() as i32).unwrap();
        first.give_back(Some(&running_pidfd));
        running.kill().unwrap();
        running.wait().unwrap();
        assert_eq!(shelf.idle.lock().unwrap().len(), 0);
        // No pidfd at all: dropped too.
        let s = Arc::clone(&shelf);
        on_own_thread(move |proc_dir| s.enter_one(proc_dir, &mut false))
            .unwrap()
            .give_back(None);
        assert_eq!(shelf.idle.lock().unwrap().len(), 0);
        // Reaped: shelved, and the next worker gets it.
        let s = Arc::clone(&shelf);
        on_own_thread(move |proc_dir| s.enter_one(proc_dir, &mut false))
            .unwrap()
            .give_back(Some(&reaped_child()));
        assert_eq!(shelf.idle.lock().unwrap().len(), 1);
        let s = Arc::clone(&shelf);
        let again = on_own_thread(move |proc_dir| s.enter_one(proc_dir, &mut false));
        assert!(again.is_some());
        assert_eq!(
            shelf.counts(),
            NamespaceCounts {
                made: 3,
                reused: 1,
                discarded: 0
            }
        );
    }

    #[test]
    fn a_namespace_still_holding_a_unix_socket_is_never_lent_again() {
        if !can_make_namespaces() {
            assert!(std::env::var_os("AIRLOCK_MUST_WORK").is_none());
            return;
        }
        let shelf = Arc::new(NamespaceShelf::default());
        let s = Arc::clone(&shelf);
        // A socket made inside the namespace and kept open (here by this test, as a socket
        // in flight would be kept by the kernel's queue) outlives its "worker".
        let (lent, socket) = on_own_thread(move |proc_dir| {
            let lent = s.enter_one(proc_dir, &mut false).unwrap();
            let socket = std::os::unix::net::UnixDatagram::unbound().unwrap();
            (lent, socket)
        });
        lent.give_back(Some(&reaped_child()));
        assert_eq!(shelf.idle.lock().unwrap().len(), 1);
        let s = Arc::clone(&shelf);
        let (next, inode, sockets) = on_own_thread(move |proc_dir| {
            let next = s.enter_one(proc_dir, &mut false).unwrap();
            let inode = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
            let sockets = sys::thread_network_has_unix_sockets(proc_dir).unwrap();
            (next, inode, sockets)
        });
        assert!(!sockets, "the next worker's namespace must be empty");
        assert_eq!(
            shelf.counts(),
            NamespaceCounts {
                made: 2,
                reused: 0,
                discarded: 1
            }
        );
        drop((next, inode, socket));
    }

    #[test]
    fn an_empty_namespace_has_no_unix_sockets_and_one_with_a_socket_has() {
        if !can_make_namespaces() {
            assert!(std::env::var_os("AIRLOCK_MUST_WORK").is_none());
            return;
        }
        let (empty, with_socket) = on_own_thread(|proc_dir| {
            sys::unshare_network_namespace().unwrap();
            let empty = sys::thread_network_has_unix_sockets(proc_dir).unwrap();
            let _socket = std::os::unix::net::UnixDatagram::unbound().unwrap();
            (
                empty,
                sys::thread_network_has_unix_sockets(proc_dir).unwrap(),
            )
        });
        assert!(!empty);
        assert!(with_socket);
    }
}
