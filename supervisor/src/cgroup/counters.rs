//! What the kernel counts in a worker's cgroup (OOM kills, limit hits, peak memory), read
//! through files opened once, and whether processes are still in it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::files::{parse_keyed, parse_number, read_file, read_from_start, read_optional_file};
use super::{CgroupError, CgroupStats, Controller, WorkerCgroup};

/// The counter files a worker's cgroup keeps open, by controller.
const UNIFIED_COUNTERS: &[&str] = &["memory.events", "memory.peak", "pids.events", "cpu.stat"];
/// See [`UNIFIED_COUNTERS`].
const MEMORY_COUNTERS: &[&str] = &[
    "memory.oom_control",
    "memory.failcnt",
    "memory.memsw.failcnt",
    "memory.max_usage_in_bytes",
];
/// See [`UNIFIED_COUNTERS`].
const PIDS_COUNTERS: &[&str] = &["pids.events"];

/// The most counter files one worker's cgroup holds open: v1's memory and pids
/// hierarchies together, or v2's one directory.
pub(super) const MOST_COUNTER_FILES: usize =
    if UNIFIED_COUNTERS.len() > MEMORY_COUNTERS.len() + PIDS_COUNTERS.len() {
        UNIFIED_COUNTERS.len()
    } else {
        MEMORY_COUNTERS.len() + PIDS_COUNTERS.len()
    };

impl WorkerCgroup {
    /// Reads the counters. v2: memory.events `oom_kill` (not `oom`, which counts OOM
    /// situations rather than kills; containerd#6323) and `max`, memory.peak, pids.events
    /// `max`. v1: memory.oom_control `oom_kill` (Linux 4.13), memory.failcnt (+ memsw),
    /// memory.max_usage_in_bytes, pids.events `max`.
    pub fn read_stats(&self) -> Result<CgroupStats, CgroupError> {
        if let Some(dir) = self.dir_of(Controller::Unified) {
            let events = dir.join("memory.events");
            let events_text = self.read_counter(&events)?;
            let peak = dir.join("memory.peak");
            let peak_memory_bytes = match self.read_optional_counter(&peak)? {
                Some(text) => Some(parse_number(&peak, &text)?),
                None => None,
            };
            let pids_events = dir.join("pids.events");
            let cpu_usage_us = self
                .cpu_usage_total_us()?
                .map(|total| total.saturating_sub(self.cpu_usage_base_us));
            return Ok(CgroupStats {
                oom_kills: parse_keyed(&events, &events_text, "oom_kill")?,
                peak_memory_bytes,
                pids_limit_hits: parse_keyed(
                    &pids_events,
                    &self.read_counter(&pids_events)?,
                    "max",
                )?,
                memory_limit_hits: parse_keyed(&events, &events_text, "max")?,
                cpu_usage_us,
            });
        }
        let mut stats = CgroupStats::default();
        if let Some(dir) = self.dir_of(Controller::Memory) {
            let oom_control = dir.join("memory.oom_control");
            stats.oom_kills =
                parse_keyed(&oom_control, &self.read_counter(&oom_control)?, "oom_kill")?;
            // A charge tries memory+swap first, then memory, so each refused charge counts in
            // exactly one of the two failcnt files. (Observed on 6.18: memsw.failcnt stays 0
            // even when the memsw limit is hit, so with memsw set this undercounts; trust
            // oom_kills for the OOM verdict.)
            let failcnt = dir.join("memory.failcnt");
            stats.memory_limit_hits = parse_number(&failcnt, &self.read_counter(&failcnt)?)?;
            let memsw_failcnt = dir.join("memory.memsw.failcnt");
            if let Some(text) = self.read_optional_counter(&memsw_failcnt)? {
                stats.memory_limit_hits += parse_number(&memsw_failcnt, &text)?;
            }
            let max_usage = dir.join("memory.max_usage_in_bytes");
            stats.peak_memory_bytes =
                Some(parse_number(&max_usage, &self.read_counter(&max_usage)?)?);
        }
        if let Some(dir) = self.dir_of(Controller::Pids) {
            let events = dir.join("pids.events");
            stats.pids_limit_hits = parse_keyed(&events, &self.read_counter(&events)?, "max")?;
        }
        Ok(stats)
    }

    /// v2 `cpu.stat` `usage_usec` as the kernel counts it, from every worker the cgroup
    /// held; `None` on v1, or where the file or its line is absent: a missing CPU count
    /// must not take the limits' counters down with it.
    pub(super) fn cpu_usage_total_us(&self) -> Result<Option<u64>, CgroupError> {
        let Some(dir) = self.dir_of(Controller::Unified) else {
            return Ok(None);
        };
        let cpu_stat = dir.join("cpu.stat");
        Ok(self
            .read_optional_counter(&cpu_stat)?
            .and_then(|text| parse_keyed(&cpu_stat, &text, "usage_usec").ok()))
    }

    /// The files [`WorkerCgroup::read_stats`] reads, by controller.
    fn counter_paths(&self) -> Vec<PathBuf> {
        let mut paths = Vec::new();
        for (kind, dir) in &self.dirs {
            let names: &[&str] = match kind {
                Controller::Unified => UNIFIED_COUNTERS,
                Controller::Memory => MEMORY_COUNTERS,
                Controller::Pids => PIDS_COUNTERS,
                Controller::Cpu => &[],
            };
            paths.extend(names.iter().map(|name| dir.join(name)));
        }
        paths
    }

    /// Opens the counter files now, while the worker is made (off the call's critical path
    /// for pooled workers), so reading them after the call is one pread each instead of an
    /// open, read and close of a cgroupfs file. A file the kernel does not offer (no swap
    /// accounting, no memory.peak before 5.19) is remembered as absent.
    pub(super) fn open_counters(&mut self) -> Result<(), CgroupError> {
        for path in self.counter_paths() {
            let file = match fs::File::open(&path) {
                Ok(file) => Some(file),
                Err(error) if error.kind() == io::ErrorKind::NotFound => None,
                Err(source) => return Err(CgroupError::ReadFile { path, source }),
            };
            self.counters.push((path, file));
        }
        Ok(())
    }

    /// A counter's current text: from its pre-opened file, or opened now.
    fn read_optional_counter(&self, path: &Path) -> Result<Option<String>, CgroupError> {
        match self.counters.iter().find(|(p, _)| p == path) {
            Some((_, None)) => Ok(None),
            Some((_, Some(file))) => {
                read_from_start(file)
                    .map(Some)
                    .map_err(|source| CgroupError::ReadFile {
                        path: path.to_path_buf(),
                        source,
                    })
            }
            None => read_optional_file(path),
        }
    }

    fn read_counter(&self, path: &Path) -> Result<String, CgroupError> {
        self.read_optional_counter(path)?
            .ok_or_else(|| CgroupError::ReadFile {
                path: path.to_path_buf(),
                source: io::Error::from(io::ErrorKind::NotFound),
            })
    }

    /// Whether any process is still in the cgroup (v2: cgroup.events `populated`, which
    /// covers descendants; v1: any cgroup.procs non-empty).
    pub fn is_populated(&self) -> Result<bool, CgroupError> {
        if let Some(dir) = self.dir_of(Controller::Unified) {
            let events = dir.join("cgroup.events");
            return Ok(parse_keyed(&events, &read_file(&events)?, "populated")? != 0);
        }
        for (_, dir) in &self.dirs {
            if !read_file(&dir.join("cgroup.procs"))?.trim().is_empty() {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake_tree::{
        HYBRID_MOUNTINFO, OWN_MEMORY, V2_OWN, detect_fake, hybrid_proc_self_cgroup, hybrid_tree,
        limits, populate_like_kernel, v2_parent, v2_tree,
    };

    #[test]
    fn v2_read_stats_counts_oom_kill_not_oom() {
        let tree = v2_tree();
        let parent = v2_parent(&tree);
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        let dir = format!("sys/fs/cgroup{V2_OWN}/airlock-workers/w");
        tree.write(
            &format!("{dir}/memory.events"),
            "low 0\nhigh 0\nmax 2\noom 5\noom_kill 1\noom_group_kill 0\n",
        );
        tree.write(&format!("{dir}/memory.peak"), "16777216\n");
        tree.write(&format!("{dir}/pids.events"), "max 3\n");
        tree.write(
            &format!("{dir}/cpu.stat"),
            "usage_usec 52000\nuser_usec 40000\nsystem_usec 12000\n",
        );
        assert_eq!(
            worker.read_stats().unwrap(),
            CgroupStats {
                oom_kills: 1,
                peak_memory_bytes: Some(16 << 20),
                pids_limit_hits: 3,
                memory_limit_hits: 2,
                cpu_usage_us: Some(52_000),
            }
        );
    }

    #[test]
    fn v1_read_stats_reads_oom_control_failcnt_and_max_usage() {
        let tree = hybrid_tree();
        let parent = detect_fake(
            &tree,
            &hybrid_proc_self_cgroup(),
            HYBRID_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        let memory = format!("sys/fs/cgroup/memory{OWN_MEMORY}/w");
        tree.write(
            &format!("{memory}/memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        );
        tree.write(&format!("{memory}/memory.failcnt"), "5\n");
        tree.write(&format!("{memory}/memory.memsw.failcnt"), "2\n");
        tree.write(&format!("{memory}/memory.max_usage_in_bytes"), "1048576\n");
        tree.write("sys/fs/cgroup/pids/w/pids.events", "max 4\n");
        assert_eq!(
            worker.read_stats().unwrap(),
            CgroupStats {
                oom_kills: 3,
                peak_memory_bytes: Some(1 << 20),
                pids_limit_hits: 4,
                memory_limit_hits: 7,
                cpu_usage_us: None,
            }
        );
    }

    #[test]
    fn read_stats_reports_a_missing_counter_with_its_path() {
        let tree = hybrid_tree();
        let parent = detect_fake(
            &tree,
            &hybrid_proc_self_cgroup(),
            HYBRID_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        let memory = format!("sys/fs/cgroup/memory{OWN_MEMORY}/w");
        tree.write(
            &format!("{memory}/memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\n",
        );
        let error = worker.read_stats().unwrap_err().to_string();
        assert_eq!(
            error,
            format!(
                "cannot parse {}: no \"oom_kill\" line",
                tree.path(&format!("{memory}/memory.oom_control")).display()
            )
        );
    }

    #[test]
    fn is_populated_reads_cgroup_events_on_v2_and_procs_on_v1() {
        let tree = v2_tree();
        let parent = v2_parent(&tree);
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        assert!(!worker.is_populated().unwrap());
        tree.write(
            &format!("sys/fs/cgroup{V2_OWN}/airlock-workers/w/cgroup.events"),
            "populated 1\nfrozen 0\n",
        );
        assert!(worker.is_populated().unwrap());

        let tree = hybrid_tree();
        let parent = detect_fake(
            &tree,
            &hybrid_proc_self_cgroup(),
            HYBRID_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        assert!(!worker.is_populated().unwrap());
        tree.write("sys/fs/cgroup/pids/w/cgroup.procs", "77\n");
        assert!(worker.is_populated().unwrap());
    }
}
