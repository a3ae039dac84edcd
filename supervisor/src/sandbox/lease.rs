//! A worker's lease: it owns the worker's pidfd, its pending spawn and its cgroup until the
//! worker is killed, reaped and the cgroup recycled or removed — however the call ends,
//! dropped midway included.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use super::{ActiveCall, error_chain};
use crate::cgroup::{CgroupRecycler, CgroupStats, WorkerCgroup};
use crate::landlock_audit::AuditRegistration;
use crate::spawn::{LentNamespace, PendingSpawn, SpawnError, Spawned};
use crate::sys;
use crate::template::RootTemplate;

/// Owns a worker's pidfd and cgroup until they are cleaned up. If the call is dropped
/// midway (cancellation by drop), `Drop` kills the tree at once and a short-lived thread
/// reaps the worker and removes its cgroup, so nothing is left behind either way.
#[derive(Debug)]
pub(super) struct WorkerLease {
    pub(super) pidfd: Option<OwnedFd>,
    /// The spawn of the worker while the spawner has not answered; a lease given up then
    /// leaves its clean-up to [`PendingSpawn::abandon`], which waits for that worker.
    pub(super) spawning: Option<PendingSpawn>,
    pub(super) cgroup: Option<WorkerCgroup>,
    /// Where the cgroup goes once the worker is reaped (it decides whether to keep it).
    pub(super) recycler: Arc<CgroupRecycler>,
    /// The recycled network namespace lent to the worker: back on the shelf once the
    /// worker is reaped, dropped on every other path.
    pub(super) network: Option<LentNamespace>,
    /// The template the worker was cloned from: its spawner thread must outlive the
    /// worker, whose parent-death signal follows that thread.
    pub(super) _template: Option<Arc<RootTemplate>>,
    /// The worker's place in the Landlock audit reader. Its marker must follow every
    /// record of the worker, so it is dropped only once the worker is reaped.
    pub(super) audit: Option<AuditRegistration>,
}

impl WorkerLease {
    /// SIGKILL to the worker alone, by pidfd: as PID 1 of its pid namespace, its death ends
    /// every process in the namespace, and so in its cgroup. Leaves out `cgroup.kill`,
    /// after which Linux 6.12 (Debian's backport, at least) SIGKILLs every process later
    /// cloned into that cgroup with CLONE_INTO_CGROUP: the cgroup could not serve another
    /// worker (seen in the VM matrix: each reused cgroup's worker died at birth).
    pub(super) fn kill_worker_only(&self) {
        if let Some(pidfd) = &self.pidfd {
            let _ = sys::signal_pidfd(pidfd, libc::SIGKILL);
        }
    }

    /// Kills the worker and, on v2, everything in its cgroup (which is then not reused).
    pub(super) fn kill(&self) {
        if let Some(cgroup) = &self.cgroup {
            let _ = cgroup.kill_all();
        }
        if let Some(pidfd) = &self.pidfd {
            let _ = sys::signal_pidfd(pidfd, libc::SIGKILL);
        }
    }

    /// Recycles or removes the (empty) cgroup; the worker must have been killed. Should it
    /// still not be reaped (it did not end within the wait of [`wait_for_exit`]), both are
    /// handed to a background clean-up rather than leaving a zombie.
    pub(super) fn release(&mut self) {
        if let Some(spawning) = self.spawning.take() {
            let (cgroup, recycler) = (self.cgroup.take(), Arc::clone(&self.recycler));
            spawning.abandon(move || recycle_or_remove(&recycler, cgroup));
            return;
        }
        let pidfd = self.pidfd.take();
        if let Some(running) = &pidfd
            && matches!(sys::try_reap_pidfd(running), Ok(None))
        {
            tracing::warn!("worker still not reaped after SIGKILL; reaping in the background");
            let (cgroup, audit) = (self.cgroup.take(), self.audit.take());
            crate::spawn::clean_up_in_background(pidfd, move || {
                drop(audit);
                remove_cgroup(cgroup);
            });
            return;
        }
        // Reaped: its marker follows all its records.
        drop(self.audit.take());
        if let Some(network) = self.network.take() {
            network.give_back(pidfd.as_ref());
        }
        recycle_or_remove(&self.recycler, self.cgroup.take());
    }

    /// Waits for the spawner's answer, which the lease holds meanwhile: a caller that
    /// gives up (or drops this future) leaves the spawn to the lease's clean-up.
    pub(super) async fn spawned(&mut self) -> Result<Spawned, SpawnError> {
        let Some(spawning) = self.spawning.as_mut() else {
            return Err(SpawnError::SpawnerGone);
        };
        let spawned = spawning.await;
        self.spawning = None;
        spawned
    }
}

fn recycle_or_remove(recycler: &CgroupRecycler, cgroup: Option<WorkerCgroup>) {
    if let Some(Err(e)) = cgroup.map(|cgroup| recycler.recycle_or_remove(cgroup)) {
        tracing::warn!(error = %error_chain(&e), "cgroup left behind");
    }
}

fn remove_cgroup(cgroup: Option<WorkerCgroup>) {
    if let Some(Err(e)) = cgroup.map(WorkerCgroup::remove) {
        tracing::warn!(error = %error_chain(&e), "cgroup left behind");
    }
}

impl Drop for WorkerLease {
    fn drop(&mut self) {
        if self.pidfd.is_none() && self.cgroup.is_none() && self.spawning.is_none() {
            return;
        }
        self.kill();
        let (cgroup, audit) = (self.cgroup.take(), self.audit.take());
        match self.spawning.take() {
            Some(spawning) => spawning.abandon(move || {
                drop(audit);
                remove_cgroup(cgroup);
            }),
            None => crate::spawn::clean_up_in_background(self.pidfd.take(), move || {
                drop(audit);
                remove_cgroup(cgroup);
            }),
        }
    }
}

/// Kills the worker tree, waits for the worker to be reaped, reads the cgroup counters and
/// removes the cgroup.
pub(super) async fn finish_worker(lease: &mut WorkerLease) -> Option<CgroupStats> {
    let stats = reap_worker(lease).await;
    lease.release();
    stats
}

/// Removes a reaped worker's cgroup off the async threads (rmdir may retry with short
/// sleeps, and is slow on v1), still counted as active so `close` waits for it. A one-shot
/// supervisor, whose runtime has nothing else to run, removes it right here instead of
/// starting a blocking thread for it.
pub(super) fn release_later(mut lease: WorkerLease, active: ActiveCall, one_shot: bool) {
    if one_shot {
        lease.release();
        drop(active);
        return;
    }
    tokio::task::spawn_blocking(move || {
        lease.release();
        drop(active);
    });
}

/// Kills the worker tree, waits until the worker is reaped, and reads the cgroup counters
/// (final by then); the cgroup itself stays until [`WorkerLease::release`].
pub(super) async fn reap_worker(lease: &WorkerLease) -> Option<CgroupStats> {
    lease.kill();
    if let Some(pidfd) = &lease.pidfd {
        wait_for_exit(pidfd).await;
    }
    lease.cgroup.as_ref().and_then(|c| c.read_stats().ok())
}

/// Waits until the worker (already sent SIGKILL) has exited and is reaped.
pub(super) async fn wait_for_exit(pidfd: &OwnedFd) {
    // A pidfd becomes readable when the process exits.
    let registered = pidfd
        .try_clone()
        .ok()
        .and_then(|fd| sys::register_async_fd(fd).ok());
    if let Some(async_fd) = &registered {
        let _ = tokio::time::timeout(Duration::from_secs(5), async_fd.readable()).await;
    }
    for _ in 0..5000 {
        match sys::try_reap_pidfd(pidfd) {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
    tracing::warn!("worker did not exit within 5 s of SIGKILL");
}
