//! Creating a worker's cgroup(s) with its limits, what the worker and the supervisor do
//! with it (join, CPU quota, kill), and removing it.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::files::{write_file, write_optional_file};
use super::{
    CgroupError, CgroupLimits, CgroupParent, CgroupVersion, Controller, DirOps, ParentLayout,
    WorkerCgroup,
};

/// How long `remove` keeps retrying rmdir on EBUSY while the kernel finishes tearing down.
const REMOVE_RETRY_BUDGET: Duration = Duration::from_millis(100);

impl CgroupParent {
    /// Creates the worker's cgroup(s) called `name` and writes `limits`, except the CPU
    /// quota, which [`WorkerCgroup::enforce_cpu_quota`] writes later. A CPU quota is
    /// applied only where a cpu controller is available; [`WorkerCgroup::applied_limits`]
    /// says whether it will be. On error, whatever was created is removed again.
    pub fn create_worker_cgroup(
        &self,
        name: &str,
        limits: &CgroupLimits,
    ) -> Result<WorkerCgroup, CgroupError> {
        validate_worker_name(name)?;
        let mut worker = WorkerCgroup {
            version: self.version(),
            dirs: Vec::new(),
            applied: CgroupLimits {
                cpu_quota: None,
                ..*limits
            },
            ops: self.ops,
            removed: false,
            counters: Vec::new(),
            killed: std::sync::atomic::AtomicBool::new(false),
            pending_cpu_quota: None,
            cpu_usage_base_us: 0,
        };
        // From here on an early return drops `worker`, which removes what was created.
        match &self.layout {
            ParentLayout::V2 { workers_dir, cpu } => {
                let dir = worker.create_dir(workers_dir, name, Controller::Unified)?;
                write_file(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
                // Absent without swap accounting (CONFIG_MEMCG_SWAP off or swapaccount=0).
                write_optional_file(&dir.join("memory.swap.max"), "0")?;
                write_file(&dir.join("pids.max"), &limits.pids.to_string())?;
                if let (Some((quota, period)), true) = (limits.cpu_quota, *cpu) {
                    worker.pending_cpu_quota =
                        Some((dir.join("cpu.max"), format!("{quota} {period}")));
                    worker.applied.cpu_quota = Some((quota, period));
                }
                // Kill the whole worker on OOM, not one arbitrary process in it (Linux 4.19).
                write_optional_file(&dir.join("memory.oom.group"), "1")?;
            }
            ParentLayout::V1 { memory, pids, cpu } => {
                let dir = worker.create_dir(memory, name, Controller::Memory)?;
                // memsw must stay >= limit_in_bytes: when raising, set limit_in_bytes first;
                // when lowering, memsw first. A fresh cgroup is unlimited, so this is raising.
                let bytes = limits.memory_bytes.to_string();
                write_file(&dir.join("memory.limit_in_bytes"), &bytes)?;
                let memsw = write_optional_file(&dir.join("memory.memsw.limit_in_bytes"), &bytes)?;
                if !memsw {
                    // No swap accounting: keep reclaim from swapping the worker's anon memory
                    // out so the limit still ends in an OOM kill rather than unbounded swap.
                    write_optional_file(&dir.join("memory.swappiness"), "0")?;
                }
                let dir = worker.create_dir(pids, name, Controller::Pids)?;
                write_file(&dir.join("pids.max"), &limits.pids.to_string())?;
                if let (Some((quota, period)), Some(cpu)) = (limits.cpu_quota, cpu) {
                    let dir = worker.create_dir(cpu, name, Controller::Cpu)?;
                    // A fresh cgroup has quota -1 (unlimited), so the period may be set
                    // now and the quota later.
                    write_file(&dir.join("cpu.cfs_period_us"), &period.to_string())?;
                    worker.pending_cpu_quota =
                        Some((dir.join("cpu.cfs_quota_us"), quota.to_string()));
                    worker.applied.cpu_quota = Some((quota, period));
                }
            }
        }
        if limits.cpu_quota.is_some() && worker.applied.cpu_quota.is_none() {
            tracing::debug!(worker = name, "cpu quota not applied: no cpu controller");
        }
        worker.open_counters()?;
        tracing::debug!(worker = name, version = %worker.version, "worker cgroup created");
        Ok(worker)
    }
}

impl WorkerCgroup {
    /// The cgroup version.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The limits actually written; `cpu_quota` is `None` if no cpu controller was available.
    pub fn applied_limits(&self) -> &CgroupLimits {
        &self.applied
    }

    /// Writes the CPU quota, if there is one (again is harmless). Call it once the worker
    /// is confined and before its tool runs. Not earlier, for two reasons: the worker's
    /// child runs on the supervisor's memory until it execs (CLONE_VM), and if throttled
    /// while holding that memory's mmap lock it stalls the whole supervisor until the next
    /// period; and confinement should neither spend the tool's CPU budget nor be throttled
    /// by it.
    pub fn enforce_cpu_quota(&self) -> Result<(), CgroupError> {
        match &self.pending_cpu_quota {
            Some((file, value)) => write_file(file, value),
            None => Ok(()),
        }
    }

    /// The worker's cgroup directories (v2: one; v1: memory, pids, and cpu if applied).
    pub fn paths(&self) -> Vec<&Path> {
        self.dirs.iter().map(|(_, dir)| dir.as_path()).collect()
    }

    /// Opens the files a freshly cloned, single-threaded child writes "0" into to join the
    /// worker's cgroups, O_WRONLY|O_CLOEXEC, before the clone: on v1 each hierarchy's
    /// `tasks` file, on v2 `cgroup.procs` (used only where CLONE_INTO_CGROUP is not).
    ///
    /// Why `tasks` on v1: writing to `cgroup.procs`, or any pid but "0", migrates a whole
    /// thread group under the global `cgroup_threadgroup_rwsem`, whose write side waits for
    /// an RCU grace period, long beside the rest of a spawn; moving only the calling thread
    /// ("0" into `tasks`) skips that lock, and the wait, where the kernel knows it may
    /// (`cgroup_procs_write_start`; 6.18 here). For a child with one thread, moving the thread
    /// moves the process; older kernels take the lock anyway, which is only slower.
    pub fn open_join_files(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        self.dirs
            .iter()
            .map(|(kind, dir)| {
                let file = match kind {
                    Controller::Unified => "cgroup.procs",
                    Controller::Memory | Controller::Pids | Controller::Cpu => "tasks",
                };
                let path = dir.join(file);
                OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(&path)
                    .map(OwnedFd::from)
                    .map_err(|source| CgroupError::OpenFile { path, source })
            })
            .collect()
    }

    /// v2 only: an O_RDONLY|O_DIRECTORY|O_CLOEXEC fd of the cgroup directory, for
    /// clone3(CLONE_INTO_CGROUP) (Linux 5.7). `None` on v1.
    pub fn open_dir_v2(&self) -> Result<Option<OwnedFd>, CgroupError> {
        let Some(dir) = self.dir_of(Controller::Unified) else {
            return Ok(None);
        };
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)
            .map(|file| Some(OwnedFd::from(file)))
            .map_err(|source| CgroupError::OpenFile {
                path: dir.to_path_buf(),
                source,
            })
    }

    /// v2: writes "1" to cgroup.kill (Linux 5.14; older kernels lack the file, which is
    /// ignored). v1: nothing to do — the worker is PID 1 of its pid namespace, and killing
    /// it kills every process in the namespace.
    ///
    /// The cgroup is then never given to another worker: after a `cgroup.kill`, Linux 6.12
    /// kills every process later cloned into the cgroup with CLONE_INTO_CGROUP.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        if let Some(dir) = self.dir_of(Controller::Unified) {
            self.killed.store(true, std::sync::atomic::Ordering::SeqCst);
            write_optional_file(&dir.join("cgroup.kill"), "1")?;
        }
        Ok(())
    }

    /// Removes every directory, retrying on EBUSY for up to 100 ms in all while the kernel
    /// finishes tearing exited processes down. Fails, naming the directory, if processes
    /// remain; the other directories are still attempted.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.remove_dirs()
    }

    fn remove_dirs(&mut self) -> Result<(), CgroupError> {
        self.removed = true;
        self.counters.clear();
        let deadline = Instant::now() + REMOVE_RETRY_BUDGET;
        let mut first_error = None;
        for (_, dir) in self.dirs.iter().rev() {
            if let Err(source) = remove_dir_with_retry(self.ops, dir, deadline) {
                first_error.get_or_insert(CgroupError::RemoveDir {
                    path: dir.clone(),
                    source,
                });
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn create_dir(
        &mut self,
        parent: &Path,
        name: &str,
        kind: Controller,
    ) -> Result<PathBuf, CgroupError> {
        let dir = parent.join(name);
        self.ops
            .create_dir(&dir, kind)
            .map_err(|source| CgroupError::CreateDir {
                path: dir.clone(),
                source,
            })?;
        self.dirs.push((kind, dir.clone()));
        Ok(dir)
    }
}

impl Drop for WorkerCgroup {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        if let Err(error) = self.remove_dirs() {
            let cause = std::error::Error::source(&error).map(ToString::to_string);
            tracing::warn!(%error, ?cause, "worker cgroup left behind");
        }
    }
}

fn validate_worker_name(name: &str) -> Result<(), CgroupError> {
    let valid = !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(CgroupError::ValidateName {
            name: name.to_string(),
        })
    }
}

fn remove_dir_with_retry(ops: DirOps, dir: &Path, deadline: Instant) -> io::Result<()> {
    let mut pause = Duration::from_millis(1);
    loop {
        match ops.remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error)
                if error.raw_os_error() == Some(libc::EBUSY)
                    && Instant::now() + pause <= deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(16));
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake_tree::{
        HYBRID_MOUNTINFO, OWN_MEMORY, V2_MOUNTINFO, V2_OWN, detect_fake, hybrid_proc_self_cgroup,
        hybrid_tree, limits, populate_like_kernel, populate_like_kernel_with_broken_pids,
        populate_like_kernel_without_swap_accounting, v2_parent, v2_tree,
    };

    #[test]
    fn v1_worker_cgroup_gets_memory_and_swap_limits() {
        let tree = hybrid_tree();
        let parent = detect_fake(
            &tree,
            &hybrid_proc_self_cgroup(),
            HYBRID_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        let worker = parent
            .create_worker_cgroup("airlock-1-0", &limits())
            .unwrap();
        let memory = format!("sys/fs/cgroup/memory{OWN_MEMORY}/airlock-1-0");
        assert_eq!(worker.version(), CgroupVersion::V1);
        assert_eq!(
            tree.read(&format!("{memory}/memory.limit_in_bytes")),
            "33554432"
        );
        assert_eq!(
            tree.read(&format!("{memory}/memory.memsw.limit_in_bytes")),
            "33554432"
        );
        // Swap is already capped by memsw; swappiness is left alone.
        assert_eq!(tree.read(&format!("{memory}/memory.swappiness")), "60\n");
        assert_eq!(tree.read("sys/fs/cgroup/pids/airlock-1-0/pids.max"), "16");
        // The quota waits until the worker is confined.
        assert_eq!(
            tree.read("sys/fs/cgroup/cpu/airlock-1-0/cpu.cfs_quota_us"),
            "-1\n"
        );
        worker.enforce_cpu_quota().unwrap();
        assert_eq!(
            tree.read("sys/fs/cgroup/cpu/airlock-1-0/cpu.cfs_quota_us"),
            "50000"
        );
        assert_eq!(
            tree.read("sys/fs/cgroup/cpu/airlock-1-0/cpu.cfs_period_us"),
            "100000"
        );
        assert_eq!(worker.applied_limits(), &limits());
        assert_eq!(
            worker.paths(),
            vec![
                tree.path(&memory),
                tree.path("sys/fs/cgroup/pids/airlock-1-0"),
                tree.path("sys/fs/cgroup/cpu/airlock-1-0"),
            ]
        );
    }

    #[test]
    fn v1_worker_cgroup_without_swap_accounting_sets_swappiness_zero() {
        let tree = hybrid_tree();
        let parent = detect_fake(
            &tree,
            &hybrid_proc_self_cgroup(),
            HYBRID_MOUNTINFO,
            populate_like_kernel_without_swap_accounting,
        )
        .unwrap();
        let _worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        let memory = format!("sys/fs/cgroup/memory{OWN_MEMORY}/w");
        assert_eq!(
            tree.read(&format!("{memory}/memory.limit_in_bytes")),
            "33554432"
        );
        assert!(
            !tree
                .path(&format!("{memory}/memory.memsw.limit_in_bytes"))
                .exists()
        );
        assert_eq!(tree.read(&format!("{memory}/memory.swappiness")), "0");
    }

    #[test]
    fn v2_worker_cgroup_gets_memory_swap_pids_cpu_and_oom_group() {
        let tree = v2_tree();
        let parent = v2_parent(&tree);
        let worker = parent
            .create_worker_cgroup("airlock-1-0", &limits())
            .unwrap();
        let dir = format!("sys/fs/cgroup{V2_OWN}/airlock-workers/airlock-1-0");
        assert_eq!(worker.version(), CgroupVersion::V2);
        assert_eq!(worker.paths(), vec![tree.path(&dir)]);
        // The quota waits until the worker is confined.
        assert_eq!(tree.read(&format!("{dir}/cpu.max")), "max 100000\n");
        worker.enforce_cpu_quota().unwrap();
        for (file, value) in [
            ("memory.max", "33554432"),
            ("memory.swap.max", "0"),
            ("pids.max", "16"),
            ("cpu.max", "50000 100000"),
            ("memory.oom.group", "1"),
        ] {
            assert_eq!(tree.read(&format!("{dir}/{file}")), value, "{file}");
        }
        assert_eq!(worker.applied_limits(), &limits());
    }

    #[test]
    fn v2_worker_cgroup_tolerates_kernels_without_swap_peak_and_kill() {
        let tree = v2_tree();
        let parent = detect_fake(
            &tree,
            &format!("0::{V2_OWN}\n"),
            V2_MOUNTINFO,
            populate_like_kernel_without_swap_accounting,
        )
        .unwrap();
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        let dir = format!("sys/fs/cgroup{V2_OWN}/airlock-workers/w");
        assert!(!tree.path(&format!("{dir}/memory.swap.max")).exists());
        assert!(!tree.path(&format!("{dir}/cgroup.kill")).exists());
        worker.kill_all().unwrap();
        assert_eq!(worker.read_stats().unwrap().peak_memory_bytes, None);
    }

    #[test]
    fn v2_kill_all_writes_one_to_cgroup_kill() {
        let tree = v2_tree();
        let parent = v2_parent(&tree);
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        worker.kill_all().unwrap();
        assert_eq!(
            tree.read(&format!(
                "sys/fs/cgroup{V2_OWN}/airlock-workers/w/cgroup.kill"
            )),
            "1"
        );
    }

    #[test]
    fn v1_kill_all_writes_nothing() {
        let tree = hybrid_tree();
        let parent = detect_fake(
            &tree,
            &hybrid_proc_self_cgroup(),
            HYBRID_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        worker.kill_all().unwrap();
        assert!(!tree.path("sys/fs/cgroup/pids/w/cgroup.kill").exists());
    }

    #[test]
    fn open_join_files_gives_one_fd_per_hierarchy_and_dir_fd_only_on_v2() {
        let tree = hybrid_tree();
        let parent = detect_fake(
            &tree,
            &hybrid_proc_self_cgroup(),
            HYBRID_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        assert_eq!(worker.open_join_files().unwrap().len(), 3);
        assert!(worker.open_dir_v2().unwrap().is_none());

        let tree = v2_tree();
        let parent = v2_parent(&tree);
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        assert_eq!(worker.open_join_files().unwrap().len(), 1);
        assert!(worker.open_dir_v2().unwrap().is_some());
    }

    #[test]
    fn remove_deletes_every_directory() {
        let tree = hybrid_tree();
        let parent = detect_fake(
            &tree,
            &hybrid_proc_self_cgroup(),
            HYBRID_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        let paths: Vec<PathBuf> = worker.paths().into_iter().map(Path::to_path_buf).collect();
        assert!(paths.iter().all(|p| p.is_dir()));
        worker.remove().unwrap();
        assert!(paths.iter().all(|p| !p.exists()));
    }

    #[test]
    fn dropping_a_worker_cgroup_removes_it() {
        let tree = v2_tree();
        let parent = v2_parent(&tree);
        let dir = parent.create_worker_cgroup("w", &limits()).unwrap().paths()[0].to_path_buf();
        assert!(!dir.exists());
    }

    #[test]
    fn failed_creation_removes_what_was_created() {
        let tree = hybrid_tree();
        let parent = detect_fake(
            &tree,
            &hybrid_proc_self_cgroup(),
            HYBRID_MOUNTINFO,
            populate_like_kernel_with_broken_pids,
        )
        .unwrap();
        let error = parent.create_worker_cgroup("w", &limits()).unwrap_err();
        assert!(
            matches!(&error, CgroupError::WriteFile { path, .. } if path.ends_with("pids/w/pids.max")),
            "{error}"
        );
        assert!(
            !tree
                .path(&format!("sys/fs/cgroup/memory{OWN_MEMORY}/w"))
                .exists()
        );
        assert!(!tree.path("sys/fs/cgroup/pids/w").exists());
    }

    #[test]
    fn create_worker_cgroup_refuses_names_that_are_not_one_plain_component() {
        let tree = hybrid_tree();
        let parent = detect_fake(
            &tree,
            &hybrid_proc_self_cgroup(),
            HYBRID_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        for name in ["", ".", "..", "../x", "a/b", ".hidden", "a b", "x\0"] {
            let error = parent.create_worker_cgroup(name, &limits()).unwrap_err();
            assert!(
                matches!(error, CgroupError::ValidateName { .. }),
                "{name:?}"
            );
        }
    }

    #[test]
    fn create_worker_cgroup_refuses_an_existing_directory() {
        let tree = hybrid_tree();
        let parent = detect_fake(
            &tree,
            &hybrid_proc_self_cgroup(),
            HYBRID_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        let _first = parent.create_worker_cgroup("w", &limits()).unwrap();
        let error = parent.create_worker_cgroup("w", &limits()).unwrap_err();
        assert!(matches!(error, CgroupError::CreateDir { .. }), "{error}");
        // The failed second attempt must not remove the first worker's directories.
        assert!(tree.path("sys/fs/cgroup/pids/w").is_dir());
    }
}
