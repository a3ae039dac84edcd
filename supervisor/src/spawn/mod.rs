//! Starting workers: the sealed worker image, and the long-lived spawner thread that clones
//! workers into fresh namespaces and writes their uid/gid maps (the parent-side half of the
//! handshake).
//!
//! The spawner is a dedicated thread because a worker's parent-death signal fires when the
//! *thread* that created it exits: tokio's blocking threads come and go, this one lives as
//! long as the supervisor.
//!
//! The parts: `image` seals the worker program; `spawner` runs the spawner threads and
//! clones each worker; this module holds what callers hand in and get back, and the
//! background clean-ups that kill and reap workers nobody took charge of.

use std::io;
use std::os::fd::OwnedFd;

use crate::sys::{self, CHILD_STEPS};

mod image;
mod netns;
mod spawner;

pub use image::WorkerImage;
pub(crate) use netns::IDLE_MAX as IDLE_NAMESPACES;
pub use netns::{LentNamespace, NamespaceCounts};
pub use spawner::{Spawner, TemplateSpawner};

/// Why a worker could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// Building the sealed image failed.
    #[error("cannot build the sealed worker image from {path}")]
    Image {
        /// Source binary.
        path: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A set-up syscall in the parent failed.
    #[error("cannot {operation}")]
    Parent {
        /// What failed.
        operation: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// clone3 into new namespaces failed (user namespaces restricted, for example).
    #[error("cannot create the worker's namespaces (clone3): {source}; see `airlock doctor`")]
    Clone {
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Writing the uid/gid maps failed.
    #[error("cannot write {file} of worker {pid}")]
    IdMap {
        /// Which file.
        file: &'static str,
        /// Worker pid.
        pid: i32,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The child failed between clone and exec.
    #[error("worker set-up failed at step '{step}' before exec")]
    Child {
        /// The step.
        step: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// The spawner thread is gone.
    #[error("the spawner thread has stopped")]
    SpawnerGone,
}

impl SpawnError {
    /// Whether retrying on a fresh worker could help (transient resource shortage).
    pub fn is_transient(&self) -> bool {
        let errno = match self {
            SpawnError::Clone { source }
            | SpawnError::Parent { source, .. }
            | SpawnError::Child { source, .. } => source.raw_os_error(),
            _ => None,
        };
        matches!(errno, Some(libc::EAGAIN) | Some(libc::ENOMEM))
    }
}

/// Who the sandbox's uid 0 is on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMapping {
    /// Host uid of the sandbox's uid 0.
    pub host_uid: u32,
    /// Host gid of the sandbox's gid 0.
    pub host_gid: u32,
}

/// Default host uid/gid for the sandbox root when the supervisor runs as host root.
pub const DEFAULT_SANDBOX_HOST_ID: u32 = 65534;

impl IdMapping {
    /// Root supervisors map sandbox root to `DEFAULT_SANDBOX_HOST_ID` (or a configured
    /// uid); unprivileged ones can only map their own ids.
    pub fn for_this_process(configured: Option<u32>) -> Self {
        let (uid, gid) = sys::effective_ids();
        if uid == 0 {
            let id = configured.unwrap_or(DEFAULT_SANDBOX_HOST_ID);
            Self {
                host_uid: id,
                host_gid: id,
            }
        } else {
            Self {
                host_uid: uid,
                host_gid: gid,
            }
        }
    }
}

/// What the caller hands to the spawner for one worker.
#[derive(Debug)]
pub struct SpawnRequest {
    /// Descriptors that become the worker's 0, 1, 2.
    pub stdio: [OwnedFd; 3],
    /// Files the child writes "0" into to join its cgroups (v1 `tasks`; see
    /// [`crate::cgroup::WorkerCgroup::open_join_files`]).
    pub join_cgroups: Vec<OwnedFd>,
    /// v2 cgroup directory for CLONE_INTO_CGROUP.
    pub cgroup_dir: Option<OwnedFd>,
    /// Which network namespace the worker gets.
    pub network: WorkerNetwork,
}

/// Which network namespace a worker gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerNetwork {
    /// A fresh one of its own, created and torn down with the worker (the costliest).
    Fresh,
    /// An empty one of its own, made by the supervisor and lent to one worker at a time:
    /// an earlier worker's, once that one is reaped and nothing of it is left (see
    /// `netns`). Only for workers that can open no socket but AF_UNIX and hold no
    /// capability over it; a fresh one where the supervisor cannot make namespaces.
    Recycled,
    /// The one empty namespace the supervisor shares between workers, if it made one
    /// ([`Spawner::shares_network_namespace`]).
    Shared,
    /// The host's.
    Host,
}

/// A started worker.
#[derive(Debug)]
pub struct Spawned {
    /// The process; killed and reaped if dropped before its owner takes the pidfd.
    pub child: ChildProcess,
    /// The supervisor's end of the protocol socket.
    pub socket: OwnedFd,
    /// Closes when the child execs the worker, or carries the step that failed before:
    /// pass it to [`await_exec`]. Waiting for it is the caller's, not the spawner thread's,
    /// so the next clone need not wait for this child's cgroup join (on v1 possibly an RCU
    /// grace period) and exec.
    pub exec_report: OwnedFd,
    /// The recycled network namespace the worker was cloned into, to give back once it is
    /// reaped.
    pub network: Option<LentNamespace>,
}

/// A worker process of ours that nobody has taken charge of yet. If it is dropped while it
/// still holds the pidfd (a caller that gave up on the spawn, a reply nobody read), the
/// process is killed and reaped in the background: no path leaves a worker running or a
/// zombie behind.
#[derive(Debug)]
pub struct ChildProcess {
    pidfd: Option<OwnedFd>,
    /// Its host pid (what the audit names it by).
    pid: libc::pid_t,
}

impl ChildProcess {
    /// The host pid; the pidfd, not this, is what signals and waits use.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Hands the pidfd (and with it the duty to kill and reap) to the caller.
    pub fn into_pidfd(mut self) -> Option<OwnedFd> {
        self.pidfd.take()
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Some(pidfd) = self.pidfd.take() {
            let _ = sys::signal_pidfd(&pidfd, libc::SIGKILL);
            clean_up_in_background(Some(pidfd), || {});
        }
    }
}

/// Woken whenever a call or a background clean-up finishes, so that
/// [`crate::Supervisor::close`] waits for the last one without polling (a poll's interval
/// would add to every one-shot `airlock exec`).
pub(crate) static SETTLED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Clean-ups still running in the background, in this process (see [`background_cleanups`]).
static BACKGROUND_CLEANUPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// On a short-lived thread, waits for the process behind `pidfd` (already sent SIGKILL) to
/// end and reaps it — without a time limit, since giving up would leave a zombie — and then
/// runs `then` (removing its cgroup, which must be empty first).
pub(crate) fn clean_up_in_background(pidfd: Option<OwnedFd>, then: impl FnOnce() + Send + 'static) {
    in_background(move || {
        if let Some(pidfd) = &pidfd {
            sys::reap_pidfd_blocking(pidfd);
        }
        then();
    });
}

/// Runs `job` on a short-lived thread, counted among the background clean-ups that
/// [`crate::Supervisor::close`] waits for.
fn in_background(job: impl FnOnce() + Send + 'static) {
    use std::sync::atomic::Ordering;
    BACKGROUND_CLEANUPS.fetch_add(1, Ordering::SeqCst);
    let job = move || {
        job();
        BACKGROUND_CLEANUPS.fetch_sub(1, Ordering::SeqCst);
        SETTLED.notify_waiters();
    };
    if std::thread::Builder::new()
        .name("airlock-reaper".into())
        .spawn(job)
        .is_err()
    {
        BACKGROUND_CLEANUPS.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!("cannot start a reaper thread; a worker may stay a zombie");
    }
}

/// How many background clean-ups (of workers dropped midway, and spawn requests the
/// spawner has not answered yet) are still running in this process;
/// [`crate::Supervisor::close`] waits for them.
pub(crate) fn background_cleanups() -> usize {
    BACKGROUND_CLEANUPS.load(std::sync::atomic::Ordering::SeqCst)
}

/// Waits (asynchronously) until a spawned child has exec'd the worker, or returns the step
/// that failed before exec. On failure the child is exiting; its owner reaps it.
pub async fn await_exec(report: OwnedFd) -> Result<(), SpawnError> {
    use tokio::io::AsyncReadExt;
    let parent = |source| SpawnError::Parent {
        operation: "wait for the worker's exec",
        source,
    };
    let mut reader = tokio::net::unix::pipe::Receiver::from_owned_fd(report).map_err(parent)?;
    let mut report = [0u8; 5];
    let mut got = 0;
    while got < report.len() {
        match reader.read(&mut report[got..]).await {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(parent(e)),
        }
    }
    if got < report.len() {
        // EOF: the close-on-exec write end closed at exec.
        return Ok(());
    }
    let step = CHILD_STEPS
        .get(usize::from(report[0]))
        .copied()
        .unwrap_or("unknown");
    let errno = i32::from_ne_bytes([report[1], report[2], report[3], report[4]]);
    Err(SpawnError::Child {
        step,
        source: io::Error::from_raw_os_error(errno),
    })
}

type Reply = tokio::sync::oneshot::Sender<Result<Spawned, SpawnError>>;

/// A spawn request the spawner thread has been given: await it for the worker, or give it
/// up with [`PendingSpawn::abandon`]. The worker may be cloned into its cgroup after the
/// caller stopped waiting, so whatever the caller set up for it (the cgroup) must outlive
/// that worker: `abandon` runs the caller's clean-up only once the worker, if one was
/// made, is killed and reaped. (Removing the cgroup at once raced the clone: under qemu's
/// emulation a worker cloned after the caller gave up kept its cgroup busy past rmdir's
/// retries.)
#[derive(Debug)]
pub struct PendingSpawn {
    answer: tokio::sync::oneshot::Receiver<Result<Spawned, SpawnError>>,
    abandoned: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl std::future::Future for PendingSpawn {
    type Output = Result<Spawned, SpawnError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.answer)
            .poll(cx)
            .map(|answer| answer.unwrap_or(Err(SpawnError::SpawnerGone)))
    }
}

impl PendingSpawn {
    /// Gives the spawn up: the spawner skips it if it has not started it yet (so calls
    /// given up in a burst do not each cost a worker's clone and hold its descriptors
    /// meanwhile); on a background thread, waits for the spawner's answer, kills and reaps
    /// the worker it made (if any), then runs `then`.
    pub fn abandon(self, then: impl FnOnce() + Send + 'static) {
        self.abandoned
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let answer = self.answer;
        in_background(move || {
            if let Ok(Ok(spawned)) = answer.blocking_recv()
                && let Some(pidfd) = spawned.child.into_pidfd()
            {
                let _ = sys::signal_pidfd(&pidfd, libc::SIGKILL);
                sys::reap_pidfd_blocking(&pidfd);
            }
            then();
        });
    }
}

/// A spawn request on its way through the spawner, counted among the background clean-ups
/// until its reply has been sent or dropped. A caller that gives up on a call while the
/// spawner is still cloning its worker no longer counts as an active call; without this,
/// `close` could return before that worker exists, and so before its unread reply's
/// [`ChildProcess`] is dropped, which kills and reaps it (seen once in the 6.12 VM: one
/// process left after `close` in the abandon test).
#[derive(Debug)]
struct SpawnInFlight {
    /// Set by [`PendingSpawn::abandon`]: a request given up before its turn is not cloned.
    abandoned: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SpawnInFlight {
    fn enter(abandoned: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Self {
        BACKGROUND_CLEANUPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self { abandoned }
    }

    fn is_abandoned(&self) -> bool {
        self.abandoned.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for SpawnInFlight {
    fn drop(&mut self) {
        BACKGROUND_CLEANUPS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        SETTLED.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::path::Path;
    use std::sync::mpsc;

    /// How long a test waits for the clean-up before it calls it a hang: a hang guard, not
    /// a speed budget (the suite also runs under qemu's emulation, many times slower).
    const HANG_GUARD: std::time::Duration = std::time::Duration::from_secs(300);

    /// A spawn the caller gave up while a stand-in for the spawner thread has not
    /// answered yet; `/bin/sleep` plays the worker.
    // Reaped through a pidfd (by the clean-up or by the test), not through `Child`.
    #[allow(clippy::zombie_processes)]
    fn abandoned_spawn() -> (Reply, mpsc::Receiver<bool>, i32) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let worker = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(worker.id()).unwrap();
        let (cleaned, cleaned_up) = mpsc::channel();
        PendingSpawn {
            answer,
            abandoned: std::sync::Arc::default(),
        }
        .abandon(move || {
            // Still in /proc: not reaped yet (a zombie is listed until it is).
            let _ = cleaned.send(Path::new(&format!("/proc/{pid}")).exists());
        });
        (reply, cleaned_up, pid)
    }

    #[test]
    fn an_abandoned_spawn_is_cleaned_up_only_once_its_worker_is_killed_and_reaped() {
        let (reply, cleaned_up, pid) = abandoned_spawn();
        // The worker may still be cloned into its cgroup: nothing is removed before then.
        assert!(
            cleaned_up
                .recv_timeout(std::time::Duration::from_millis(300))
                .is_err()
        );
        let (socket, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let (exec_report, _write) = nix::unistd::pipe().unwrap();
        let spawned = Spawned {
            child: ChildProcess {
                pidfd: Some(sys::pidfd_open(pid).unwrap()),
                pid,
            },
            socket: socket.into(),
            exec_report,
            network: None,
        };
        assert!(reply.send(Ok(spawned)).is_ok());
        let worker_still_there = cleaned_up.recv_timeout(HANG_GUARD).unwrap();
        assert!(
            !worker_still_there,
            "cleaned up before the worker was reaped"
        );
    }

    #[test]
    fn an_abandoned_spawn_the_spawner_never_answers_is_cleaned_up_when_the_reply_is_dropped() {
        let (reply, cleaned_up, pid) = abandoned_spawn();
        drop(reply);
        // No worker was handed over, so the stand-in is not the clean-up's to end.
        assert!(cleaned_up.recv_timeout(HANG_GUARD).unwrap());
        let pidfd = sys::pidfd_open(pid).unwrap();
        sys::signal_pidfd(&pidfd, libc::SIGKILL).unwrap();
        sys::reap_pidfd_blocking(&pidfd);
    }
}
