//! Empty worker cgroups kept and given to the next worker with the same limits.

use std::fs::OpenOptions;
use std::io::Write;

use super::files::{parse_number, read_file, write_file, write_optional_file};
use super::{CgroupError, CgroupLimits, CgroupVersion, Controller, WorkerCgroup};

/// A worker cgroup is given to another worker only if at most this much memory is still
/// charged to it once empty: page cache and slab the last worker's reads left behind. The
/// next worker's peak memory includes it (never less than the truth, at most this much
/// more), and its limit is that much tighter until reclaim takes those clean pages back.
pub const RECYCLE_MAX_LEFTOVER_BYTES: u64 = 1 << 20;

/// Empty worker cgroups kept for reuse at most, per supervisor.
const SPARE_CGROUPS: usize = 16;

/// Descriptors the kept cgroups hold at most: their counter files (the daemon counts them
/// against its open-file limit).
pub(crate) const SPARE_CGROUP_FILES: usize = SPARE_CGROUPS * super::counters::MOST_COUNTER_FILES;

impl WorkerCgroup {
    /// Why this cgroup may not serve another worker, or `None` if it may (see
    /// [`CgroupRecycler`]): it must hold no process, no limit may ever have been reached in
    /// it (so every counter the next worker's result reads is still 0), no CPU quota may
    /// have been written, and at most [`RECYCLE_MAX_LEFTOVER_BYTES`] may still be charged.
    pub fn not_recyclable_because(&self) -> Option<String> {
        if self.removed {
            return Some("removed".into());
        }
        if self.applied.cpu_quota.is_some() || self.pending_cpu_quota.is_some() {
            return Some("has a cpu quota".into());
        }
        if self.killed.load(std::sync::atomic::Ordering::SeqCst) {
            return Some("cgroup.kill was written".into());
        }
        match self.is_populated() {
            Ok(false) => {}
            Ok(true) => return Some("still populated".into()),
            Err(e) => return Some(e.to_string()),
        }
        match self.read_stats() {
            Ok(s) if s.oom_kills == 0 && s.pids_limit_hits == 0 && s.memory_limit_hits == 0 => {}
            Ok(s) => return Some(format!("a limit was reached: {s:?}")),
            Err(e) => return Some(e.to_string()),
        }
        let (usage, reclaim, request) = match self.version {
            CgroupVersion::V2 => {
                let dir = self.dir_of(Controller::Unified)?;
                (
                    dir.join("memory.current"),
                    dir.join("memory.reclaim"),
                    // Linux 5.19: reclaim this much from the cgroup, best effort.
                    format!("{}", 4 * RECYCLE_MAX_LEFTOVER_BYTES),
                )
            }
            CgroupVersion::V1 => {
                let dir = self.dir_of(Controller::Memory)?;
                // An empty v1 cgroup gives back all it can when 0 is written here.
                (
                    dir.join("memory.usage_in_bytes"),
                    dir.join("memory.force_empty"),
                    "0".to_string(),
                )
            }
        };
        let charged = || read_file(&usage).and_then(|text| parse_number(&usage, &text));
        let bytes = match charged() {
            Ok(bytes) if bytes > RECYCLE_MAX_LEFTOVER_BYTES => {
                // Clean page cache and slab the last worker left behind are usually just
                // over the bar; taking them back is cheaper than a new cgroup. A failed
                // reclaim only means the cgroup is not reused.
                let _ = write_optional_file(&reclaim, &request);
                charged()
            }
            other => other,
        };
        match bytes {
            Ok(bytes) if bytes <= RECYCLE_MAX_LEFTOVER_BYTES => None,
            Ok(bytes) => Some(format!("{bytes} bytes still charged")),
            Err(e) => Some(e.to_string()),
        }
    }

    /// Prepares a recycled cgroup for its next worker: the peak memory counter starts again
    /// from what is charged now. v1: writes 0 to `memory.max_usage_in_bytes` (and the memsw
    /// one). v2: `memory.peak` is reset per open file (Linux 6.12), so the counter file is
    /// reopened read-write, reset, and kept as the one `read_stats` reads; on older kernels
    /// the file is not writable and this fails: the cgroup is then not reused.
    fn reset_for_reuse(&mut self) -> Result<(), CgroupError> {
        if let Some(dir) = self.dir_of(Controller::Unified) {
            let peak = dir.join("memory.peak");
            let reset = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&peak)
                .and_then(|mut file| file.write_all(b"reset\n").map(|()| file))
                .map_err(|source| CgroupError::WriteFile {
                    path: peak.clone(),
                    value: "reset".into(),
                    source,
                })?;
            match self.counters.iter_mut().find(|(path, _)| *path == peak) {
                Some(entry) => entry.1 = Some(reset),
                None => self.counters.push((peak, Some(reset))),
            }
            return Ok(());
        }
        if let Some(dir) = self.dir_of(Controller::Memory) {
            write_file(&dir.join("memory.max_usage_in_bytes"), "0")?;
            write_optional_file(&dir.join("memory.memsw.max_usage_in_bytes"), "0")?;
        }
        Ok(())
    }
}

/// Empty worker cgroups kept for reuse, so most workers skip a mkdir, the limit writes, the
/// counter opens and an rmdir per hierarchy, a good share of the supervisor's CPU time per
/// call. A cgroup is only taken back when [`WorkerCgroup::not_recyclable_because`] finds
/// nothing, and only handed out for the same limits; it never holds two workers at once.
/// Dropping the recycler removes what it holds.
#[derive(Debug, Default)]
pub struct CgroupRecycler {
    spares: std::sync::Mutex<Vec<WorkerCgroup>>,
    /// Set by [`CgroupRecycler::clear`]: nothing is kept from then on.
    closed: std::sync::atomic::AtomicBool,
    /// Cgroups handed out again so far.
    reused: std::sync::atomic::AtomicU64,
    /// A peak counter could not be reset (cgroup v2 before Linux 6.12): from then on nothing
    /// is kept or handed out, so each worker does not pay a failed reset and an rmdir on
    /// its spawn path.
    reset_unsupported: std::sync::atomic::AtomicBool,
}

impl CgroupRecycler {
    /// Takes back a cgroup whose worker is gone and reaped; removes it instead when it is
    /// not fit for another worker or enough are kept already.
    pub fn recycle_or_remove(&self, mut cgroup: WorkerCgroup) -> Result<(), CgroupError> {
        if let Some(why) = cgroup.not_recyclable_because() {
            tracing::debug!(%why, "worker cgroup not kept for reuse");
            // Its worker was killed alone (see `kill_all`); should anything be left, the
            // whole cgroup goes now.
            if matches!(cgroup.is_populated(), Ok(true)) {
                let _ = cgroup.kill_all();
            }
            return cgroup.remove();
        }
        // The CPU count cannot be reset, and an empty cgroup's stands still: the next
        // worker's starts from here. Read now, off the path that hands the cgroup out.
        cgroup.cpu_usage_base_us = cgroup.cpu_usage_total_us()?.unwrap_or(0);
        let mut spares = self.lock();
        if spares.len() >= SPARE_CGROUPS
            || self.closed.load(std::sync::atomic::Ordering::SeqCst)
            || self
                .reset_unsupported
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            drop(spares);
            return cgroup.remove();
        }
        spares.push(cgroup);
        Ok(())
    }

    /// A kept cgroup with exactly `limits` (and no CPU quota), its peak counter reset; or
    /// `None`. A cgroup that cannot be reset is removed, and no cgroup is reused after it.
    pub fn take(&self, limits: &CgroupLimits) -> Option<WorkerCgroup> {
        if limits.cpu_quota.is_some()
            || self
                .reset_unsupported
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            return None;
        }
        let mut cgroup = {
            let mut spares = self.lock();
            let index = spares.iter().position(|c| c.applied == *limits)?;
            spares.swap_remove(index)
        };
        match cgroup.reset_for_reuse() {
            Ok(()) => {
                self.reused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Some(cgroup)
            }
            Err(error) => {
                tracing::debug!(%error, "worker cgroups cannot be reset for reuse here");
                self.reset_unsupported
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                let _ = cgroup.remove();
                None
            }
        }
    }

    /// Removes every kept cgroup, and keeps none from now on.
    pub fn clear(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let spares = std::mem::take(&mut *self.lock());
        for cgroup in spares {
            if let Err(error) = cgroup.remove() {
                tracing::warn!(%error, "spare worker cgroup left behind");
            }
        }
    }

    /// How many cgroups were handed out again so far.
    pub fn reused(&self) -> u64 {
        self.reused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many cgroups are kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<WorkerCgroup>> {
        // A panic while holding the lock cannot leave the list half-changed (push, remove).
        self.spares
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake_tree::{
        OWN_MEMORY, V2_OWN, hybrid_parent, hybrid_tree, limits, no_quota, v2_parent, v2_tree,
    };
    use std::fs;
    use std::path::{Path, PathBuf};

    #[test]
    fn a_recycler_keeps_an_empty_clean_cgroup_and_hands_it_out_only_for_the_same_limits() {
        let tree = hybrid_tree();
        let parent = hybrid_parent(&tree);
        let recycler = CgroupRecycler::default();
        let worker = parent.create_worker_cgroup("w", &no_quota()).unwrap();
        let paths: Vec<PathBuf> = worker.paths().into_iter().map(Path::to_path_buf).collect();
        recycler.recycle_or_remove(worker).unwrap();
        assert_eq!(recycler.len(), 1);
        assert!(paths.iter().all(|p| p.is_dir()), "a kept cgroup stays");
        let other = CgroupLimits {
            memory_bytes: 64 << 20,
            ..no_quota()
        };
        assert!(
            recycler.take(&other).is_none(),
            "other limits, other cgroup"
        );
        // The last worker's peak is still in the counter until the cgroup is handed out.
        let memory = format!("sys/fs/cgroup/memory{OWN_MEMORY}/w");
        tree.write(&format!("{memory}/memory.max_usage_in_bytes"), "7340032\n");
        let again = recycler.take(&no_quota()).unwrap();
        assert_eq!(
            tree.read(&format!("{memory}/memory.max_usage_in_bytes")),
            "0"
        );
        assert_eq!(
            tree.read(&format!("{memory}/memory.memsw.max_usage_in_bytes")),
            "0"
        );
        assert_eq!(
            again.paths(),
            paths.iter().map(PathBuf::as_path).collect::<Vec<_>>()
        );
        assert_eq!((recycler.len(), recycler.reused()), (0, 1));
    }

    #[test]
    fn a_cgroup_that_reached_a_limit_holds_a_process_or_stays_charged_is_removed_not_kept() {
        let memory = format!("sys/fs/cgroup/memory{OWN_MEMORY}/w");
        let cases: Vec<(&str, String, &str)> = vec![
            (
                "oom kill",
                format!("{memory}/memory.oom_control"),
                "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
            ),
            (
                "memory limit hit",
                format!("{memory}/memory.failcnt"),
                "1\n",
            ),
            (
                "pids limit hit",
                "sys/fs/cgroup/pids/w/pids.events".into(),
                "max 1\n",
            ),
            ("a process left", format!("{memory}/cgroup.procs"), "77\n"),
            (
                "2 MiB charged",
                format!("{memory}/memory.usage_in_bytes"),
                "2097152\n",
            ),
        ];
        for (case, file, content) in cases {
            let tree = hybrid_tree();
            let parent = hybrid_parent(&tree);
            let recycler = CgroupRecycler::default();
            let worker = parent.create_worker_cgroup("w", &no_quota()).unwrap();
            let paths: Vec<PathBuf> = worker.paths().into_iter().map(Path::to_path_buf).collect();
            tree.write(&file, content);
            assert!(worker.not_recyclable_because().is_some(), "{case}");
            recycler.recycle_or_remove(worker).unwrap();
            assert_eq!(recycler.len(), 0, "{case}");
            assert!(paths.iter().all(|p| !p.exists()), "{case}: removed");
        }
        // A CPU quota stays written in the cgroup: never reused.
        let tree = hybrid_tree();
        let parent = hybrid_parent(&tree);
        let recycler = CgroupRecycler::default();
        recycler
            .recycle_or_remove(parent.create_worker_cgroup("w", &limits()).unwrap())
            .unwrap();
        assert_eq!(recycler.len(), 0);
        assert!(recycler.take(&limits()).is_none());
    }

    #[test]
    fn a_cgroup_charged_over_the_bar_is_asked_to_give_memory_back_before_it_is_judged() {
        let memory = format!("sys/fs/cgroup/memory{OWN_MEMORY}/w");
        let tree = hybrid_tree();
        let parent = hybrid_parent(&tree);
        let worker = parent.create_worker_cgroup("w", &no_quota()).unwrap();
        tree.write(&format!("{memory}/memory.usage_in_bytes"), "1100000\n");
        // The fake counter does not move, so the cgroup is still refused, but only after
        // the kernel was asked to reclaim.
        assert!(worker.not_recyclable_because().is_some());
        assert_eq!(tree.read(&format!("{memory}/memory.force_empty")), "0");
    }

    #[test]
    fn v2_reuse_resets_memory_peak_through_a_read_write_counter_file() {
        let tree = v2_tree();
        let parent = v2_parent(&tree);
        let recycler = CgroupRecycler::default();
        recycler
            .recycle_or_remove(parent.create_worker_cgroup("w", &no_quota()).unwrap())
            .unwrap();
        assert_eq!(recycler.len(), 1);
        let worker = recycler.take(&no_quota()).unwrap();
        // The kernel resets the peak seen through the file written to (Linux 6.12); the fake
        // file just shows the write.
        let dir = format!("sys/fs/cgroup{V2_OWN}/airlock-workers/w");
        assert!(
            tree.read(&format!("{dir}/memory.peak"))
                .starts_with("reset")
        );
        let peak = worker.dirs[0].1.join("memory.peak");
        let (_, file) = worker.counters.iter().find(|(p, _)| *p == peak).unwrap();
        let flags =
            nix::fcntl::fcntl(file.as_ref().unwrap(), nix::fcntl::FcntlArg::F_GETFL).unwrap();
        assert_eq!(
            flags & libc::O_ACCMODE,
            libc::O_RDWR,
            "the counter read is the one reset"
        );
    }

    #[test]
    fn a_reused_v2_cgroup_counts_only_its_new_workers_cpu() {
        let tree = v2_tree();
        let parent = v2_parent(&tree);
        let recycler = CgroupRecycler::default();
        let cpu_stat = format!("sys/fs/cgroup{V2_OWN}/airlock-workers/w/cpu.stat");
        let first = parent.create_worker_cgroup("w", &no_quota()).unwrap();
        tree.write(&cpu_stat, "usage_usec 7000\nuser_usec 5000\n");
        assert_eq!(first.read_stats().unwrap().cpu_usage_us, Some(7000));
        recycler.recycle_or_remove(first).unwrap();
        let second = recycler.take(&no_quota()).unwrap();
        // The fake peak file holds what the reset wrote; the kernel's would read 0.
        let peak = format!("sys/fs/cgroup{V2_OWN}/airlock-workers/w/memory.peak");
        tree.write(&peak, "0\n");
        assert_eq!(second.read_stats().unwrap().cpu_usage_us, Some(0));
        tree.write(&cpu_stat, "usage_usec 9500\nuser_usec 6000\n");
        assert_eq!(second.read_stats().unwrap().cpu_usage_us, Some(2500));
    }

    #[test]
    fn clearing_a_recycler_removes_what_it_keeps_and_keeps_nothing_after() {
        let tree = hybrid_tree();
        let parent = hybrid_parent(&tree);
        let recycler = CgroupRecycler::default();
        let a = parent.create_worker_cgroup("a", &no_quota()).unwrap();
        let b = parent.create_worker_cgroup("b", &no_quota()).unwrap();
        let paths: Vec<PathBuf> = [&a, &b]
            .iter()
            .flat_map(|w| w.paths().into_iter().map(Path::to_path_buf))
            .collect();
        recycler.recycle_or_remove(a).unwrap();
        recycler.clear();
        recycler.recycle_or_remove(b).unwrap();
        assert!(recycler.is_empty());
        assert!(paths.iter().all(|p| !p.exists()));
    }

    #[test]
    fn once_a_peak_counter_cannot_be_reset_no_cgroup_is_kept_or_reused() {
        let tree = v2_tree();
        let parent = v2_parent(&tree);
        let recycler = CgroupRecycler::default();
        let first = parent.create_worker_cgroup("a", &no_quota()).unwrap();
        let first_dir = first.dirs[0].1.clone();
        recycler.recycle_or_remove(first).unwrap();
        assert_eq!(recycler.len(), 1);
        // Like memory.peak before Linux 6.12: it cannot be opened for writing.
        fs::remove_file(first_dir.join("memory.peak")).unwrap();
        fs::create_dir(first_dir.join("memory.peak")).unwrap();
        assert!(recycler.take(&no_quota()).is_none());
        assert_eq!((recycler.len(), recycler.reused()), (0, 0));
        let second = parent.create_worker_cgroup("b", &no_quota()).unwrap();
        let second_dir = second.dirs[0].1.clone();
        recycler.recycle_or_remove(second).unwrap();
        assert!(recycler.is_empty(), "kept after a failed reset");
        assert!(!second_dir.exists(), "removed instead");
    }
}
