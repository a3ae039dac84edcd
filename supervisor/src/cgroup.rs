//! cgroup: one cgroup per sandbox worker, v2 or v1, beneath the supervisor's own cgroup.
//!
//! Detected once at supervisor start ([`CgroupParent`]); a worker's cgroup is created before
//! spawn, joined by the child itself, read for OOM and peak memory after the call, and
//! removed at the end ([`WorkerCgroup`]).
//!
//! Hand-written on purpose (see reference/crates.md Q6): both cgroup crates pull in big
//! trees and neither models "one cgroup per worker, kill, OOM cause, peak usage".
//!
//! Every path is computed from a filesystem root, so tests run the same code against a fake
//! tree in a temporary directory. The only operations whose effect differs between cgroupfs
//! and a plain directory are mkdir (the kernel fills the new directory with files) and rmdir
//! (the kernel removes a directory that still shows files); both go through `DirOps`.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use nix::unistd::AccessFlags;
use serde::{Deserialize, Serialize};

mod stale;
pub use stale::worker_cgroup_name;

/// The leaf a v2 supervisor moves itself into so its own cgroup may enable controllers.
const SUPERVISOR_LEAF: &str = "airlock-supervisor";
/// The v2 directory under which worker cgroups are created.
const WORKERS_DIR: &str = "airlock-workers";
/// How long `remove` keeps retrying rmdir on EBUSY while the kernel finishes tearing down.
const REMOVE_RETRY_BUDGET: Duration = Duration::from_millis(100);

/// A worker cgroup is given to another worker only if at most this much memory is still
/// charged to it once empty: page cache and slab the last worker's reads left behind. The
/// next worker's peak memory includes it (never less than the truth, at most this much
/// more), and its limit is that much tighter until reclaim takes those clean pages back.
pub const RECYCLE_MAX_LEFTOVER_BYTES: u64 = 1 << 20;

/// Empty worker cgroups kept for reuse at most, per supervisor.
const SPARE_CGROUPS: usize = 16;

const DETECT_HINT: &str = "use cgroup v2 with the memory and pids controllers available to the \
supervisor's cgroup (e.g. systemd-run --scope -p Delegate=yes), or mount the v1 memory and pids \
hierarchies, or configure a delegated parent directory";
const WRITABLE_HINT: &str = "run the supervisor as root or delegate the cgroup to its user \
(chown the directory, or systemd Delegate=yes)";
const ENABLE_HINT: &str = "the cgroup must be delegated to the supervisor and hold no processes \
but the supervisor's own (cgroup v2 \"no internal processes\" rule)";

/// Errors of the cgroup module; each variant names the failed operation and its path.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroup or proc file could not be read.
    #[error("cannot read {path}")]
    ReadFile {
        /// File read.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A cgroup control file could not be written.
    #[error("cannot write {value:?} to {path}")]
    WriteFile {
        /// File written.
        path: PathBuf,
        /// Value written.
        value: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A cgroup control file or directory could not be opened.
    #[error("cannot open {path}")]
    OpenFile {
        /// File or directory opened.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A cgroup file did not hold what the kernel documents.
    #[error("cannot parse {path}: {reason}")]
    ParseFile {
        /// File parsed.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// A cgroup directory could not be created.
    #[error("cannot create cgroup directory {path}")]
    CreateDir {
        /// Directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A cgroup directory could not be removed (EBUSY past the retry budget: processes left).
    #[error("cannot remove cgroup directory {path}")]
    RemoveDir {
        /// Directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Neither cgroup v2 nor v1 offers what workers need.
    #[error("no usable cgroup hierarchy for workers ({reason}); fix: {hint}")]
    DetectHierarchy {
        /// Why each version was rejected.
        reason: String,
        /// How to fix it.
        hint: &'static str,
    },
    /// The directory workers would be created in is not writable.
    #[error("cgroup directory {path} is not writable; fix: {hint}")]
    CheckWritable {
        /// Directory.
        path: PathBuf,
        /// How to fix it.
        hint: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Controllers could not be enabled in a v2 cgroup.subtree_control.
    #[error("cannot enable controllers {controllers:?} in {path}; fix: {hint}")]
    EnableControllers {
        /// The cgroup.subtree_control file.
        path: PathBuf,
        /// What was written.
        controllers: String,
        /// How to fix it.
        hint: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A worker cgroup name must be one plain path component.
    #[error("invalid worker cgroup name {name:?}: use [A-Za-z0-9._-], not a leading '.'")]
    ValidateName {
        /// Name as given.
        name: String,
    },
}

/// The cgroup version a worker's cgroup lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    /// Legacy per-controller hierarchies (memory and pids, cpu when mounted).
    V1,
    /// The unified hierarchy.
    V2,
}

impl fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        })
    }
}

/// Limits written into a worker's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupLimits {
    /// Memory limit in bytes (swap is disallowed on top of it where the kernel accounts swap).
    pub memory_bytes: u64,
    /// Maximum number of tasks (processes and threads).
    pub pids: u64,
    /// CPU bandwidth: `(quota_us, period_us)`; `None` leaves CPU unlimited.
    pub cpu_quota: Option<(u64, u64)>,
}

/// Counters read from a worker's cgroup after (or during) a call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupStats {
    /// Processes killed by the OOM killer in this cgroup.
    pub oom_kills: u64,
    /// Highest memory usage seen; `None` on v2 kernels without `memory.peak` (before 5.19).
    pub peak_memory_bytes: Option<u64>,
    /// Forks refused because `pids.max` was reached.
    pub pids_limit_hits: u64,
    /// Times usage ran into the memory limit (v2 `memory.events` max; v1 `memory.failcnt`
    /// plus `memory.memsw.failcnt`, which some kernels leave at 0 — see `read_stats`).
    pub memory_limit_hits: u64,
}

/// Which kind of cgroup directory an operation concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Controller {
    /// A directory in the v2 unified hierarchy.
    Unified,
    /// A directory in the v1 memory hierarchy.
    Memory,
    /// A directory in the v1 pids hierarchy.
    Pids,
    /// A directory in the v1 cpu hierarchy.
    Cpu,
}

/// mkdir and rmdir: on cgroupfs the kernel fills and empties directories itself; the fake
/// tree of the unit tests imitates that with a populate function.
#[derive(Debug, Clone, Copy)]
enum DirOps {
    Kernel,
    #[cfg(test)]
    Fake(fn(&Path, Controller)),
}

impl DirOps {
    fn create_dir(self, path: &Path, kind: Controller) -> io::Result<()> {
        match self {
            DirOps::Kernel => {
                let _ = kind;
                fs::create_dir(path)
            }
            #[cfg(test)]
            DirOps::Fake(populate) => {
                fs::create_dir(path)?;
                populate(path, kind);
                Ok(())
            }
        }
    }

    fn remove_dir(self, path: &Path) -> io::Result<()> {
        match self {
            DirOps::Kernel => fs::remove_dir(path),
            #[cfg(test)]
            DirOps::Fake(_) => fs::remove_dir_all(path),
        }
    }
}

/// A configured, delegated parent for worker cgroups (instead of detection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupDirs {
    /// A v2 cgroup directory that offers the memory and pids controllers.
    V2 {
        /// Worker cgroups are created directly beneath it.
        parent: PathBuf,
    },
    /// v1 directories, one per hierarchy.
    V1 {
        /// In the memory hierarchy.
        memory: PathBuf,
        /// In the pids hierarchy.
        pids: PathBuf,
        /// In the cpu hierarchy, if CPU quotas should be applied.
        cpu: Option<PathBuf>,
    },
}

#[derive(Debug, Clone)]
enum ParentLayout {
    V2 {
        workers_dir: PathBuf,
        cpu: bool,
    },
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: Option<PathBuf>,
    },
}

/// Where workers' cgroups are created (detected once at supervisor start).
#[derive(Debug, Clone)]
pub struct CgroupParent {
    layout: ParentLayout,
    ops: DirOps,
}

impl CgroupParent {
    /// Detects from /proc/self/cgroup and /proc/self/mountinfo: v2 if the unified cgroup we
    /// sit in offers the memory and pids controllers (then `prepare_v2_parent` may move this
    /// process into a leaf), else the v1 memory and pids hierarchies.
    pub fn detect() -> Result<Self, CgroupError> {
        let cgroup = read_file(Path::new("/proc/self/cgroup"))?;
        let mountinfo = read_file(Path::new("/proc/self/mountinfo"))?;
        Self::detect_from(&cgroup, &mountinfo, Path::new("/"))
    }

    /// As [`CgroupParent::detect`], from given texts and with every mount point taken
    /// relative to `fs_root` (a fake tree in tests). On v2 this writes to the tree.
    pub fn detect_from(
        proc_self_cgroup: &str,
        mountinfo: &str,
        fs_root: &Path,
    ) -> Result<Self, CgroupError> {
        detect_with(
            proc_self_cgroup,
            mountinfo,
            fs_root,
            std::process::id(),
            DirOps::Kernel,
        )
    }

    /// Uses configured directories. A v2 parent must offer memory and pids; they are
    /// enabled in its cgroup.subtree_control if they are not yet (no process is moved).
    pub fn from_dirs(dirs: CgroupDirs) -> Result<Self, CgroupError> {
        from_dirs_with(dirs, DirOps::Kernel)
    }

    /// The cgroup version workers get.
    pub fn version(&self) -> CgroupVersion {
        match self.layout {
            ParentLayout::V2 { .. } => CgroupVersion::V2,
            ParentLayout::V1 { .. } => CgroupVersion::V1,
        }
    }

    /// Whether a CPU quota can be applied (v2 cpu controller enabled, or a v1 cpu hierarchy).
    pub fn supports_cpu_quota(&self) -> bool {
        match &self.layout {
            ParentLayout::V2 { cpu, .. } => *cpu,
            ParentLayout::V1 { cpu, .. } => cpu.is_some(),
        }
    }

    /// The directories worker cgroups are created in (v2: one; v1: memory, pids, cpu).
    pub fn dirs(&self) -> Vec<&Path> {
        match &self.layout {
            ParentLayout::V2 { workers_dir, .. } => vec![workers_dir.as_path()],
            ParentLayout::V1 { memory, pids, cpu } => {
                let mut dirs = vec![memory.as_path(), pids.as_path()];
                dirs.extend(cpu.as_deref());
                dirs
            }
        }
    }

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

/// One worker's cgroup: a single v2 directory, or one directory per v1 hierarchy.
/// Dropping it removes the directories (best effort, logged); prefer [`WorkerCgroup::remove`].
#[derive(Debug)]
pub struct WorkerCgroup {
    version: CgroupVersion,
    dirs: Vec<(Controller, PathBuf)>,
    applied: CgroupLimits,
    ops: DirOps,
    removed: bool,
    /// Counter files opened once the cgroup exists (see [`WorkerCgroup::read_stats`]).
    counters: Vec<(PathBuf, Option<fs::File>)>,
    /// `cgroup.kill` was written: such a cgroup is never reused (see `kill_all`).
    killed: std::sync::atomic::AtomicBool,
    /// The CPU quota file and what to write there (see [`WorkerCgroup::enforce_cpu_quota`]).
    pending_cpu_quota: Option<(PathBuf, String)>,
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
    /// period (on a slow machine under load, seconds); and confinement should not spend the
    /// tool's CPU budget (a 10 % quota made a worker's start-up ten times slower).
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
    /// an RCU grace period (5-16 ms here, 27 ms cold); moving only the calling thread ("0"
    /// into `tasks`) skips that lock where the kernel knows it may (`cgroup_procs_write_start`;
    /// 6.18 here) and takes about 20 µs. For a child with one thread, moving the thread moves
    /// the process; older kernels take the lock anyway, which is only slower.
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
            return Ok(CgroupStats {
                oom_kills: parse_keyed(&events, &events_text, "oom_kill")?,
                peak_memory_bytes,
                pids_limit_hits: parse_keyed(
                    &pids_events,
                    &self.read_counter(&pids_events)?,
                    "max",
                )?,
                memory_limit_hits: parse_keyed(&events, &events_text, "max")?,
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

    /// The files [`WorkerCgroup::read_stats`] reads, by controller.
    fn counter_paths(&self) -> Vec<PathBuf> {
        let mut paths = Vec::new();
        for (kind, dir) in &self.dirs {
            let names: &[&str] = match kind {
                Controller::Unified => &["memory.events", "memory.peak", "pids.events"],
                Controller::Memory => &[
                    "memory.oom_control",
                    "memory.failcnt",
                    "memory.memsw.failcnt",
                    "memory.max_usage_in_bytes",
                ],
                Controller::Pids => &["pids.events"],
                Controller::Cpu => &[],
            };
            paths.extend(names.iter().map(|name| dir.join(name)));
        }
        paths
    }

    /// Opens the counter files now, while the worker is made (off the call's critical path
    /// for pooled workers), so reading them after the call is one pread each instead of an
    /// open, read and close of a cgroupfs file (about 20-60 µs apiece on v1 here). A file
    /// the kernel does not offer (no swap accounting, no memory.peak before 5.19) is
    /// remembered as absent.
    fn open_counters(&mut self) -> Result<(), CgroupError> {
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
        let usage = match self.version {
            CgroupVersion::V2 => self
                .dir_of(Controller::Unified)
                .map(|d| d.join("memory.current")),
            CgroupVersion::V1 => self
                .dir_of(Controller::Memory)
                .map(|d| d.join("memory.usage_in_bytes")),
        }?;
        match read_file(&usage).and_then(|text| parse_number(&usage, &text)) {
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

    fn dir_of(&self, kind: Controller) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, dir)| dir.as_path())
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

/// Empty worker cgroups kept for reuse, so most workers skip a mkdir, the limit writes, the
/// counter opens and an rmdir per hierarchy (on v1 here: the supervisor's CPU per call
/// 0.525-0.54 -> 0.415-0.42 ms with two clients, +9 % calls/s). A cgroup is only taken back
/// when [`WorkerCgroup::not_recyclable_because`] finds nothing, and only handed out for the
/// same limits; it never holds two workers at once. Dropping the recycler removes what it
/// holds.
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
    pub fn recycle_or_remove(&self, cgroup: WorkerCgroup) -> Result<(), CgroupError> {
        if let Some(why) = cgroup.not_recyclable_because() {
            tracing::debug!(%why, "worker cgroup not kept for reuse");
            // Its worker was killed alone (see `kill_all`); should anything be left, the
            // whole cgroup goes now.
            if matches!(cgroup.is_populated(), Ok(true)) {
                let _ = cgroup.kill_all();
            }
            return cgroup.remove();
        }
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

fn detect_with(
    proc_self_cgroup: &str,
    mountinfo: &str,
    fs_root: &Path,
    pid: u32,
    ops: DirOps,
) -> Result<CgroupParent, CgroupError> {
    let entries = parse_proc_self_cgroup(proc_self_cgroup);
    let mounts = parse_mountinfo(mountinfo);
    let v2_reason = match find_v2_own_dir(&entries, &mounts, fs_root) {
        Ok(own) => {
            let (workers_dir, cpu) = prepare_v2_parent(&own, pid, ops)?;
            check_writable(&workers_dir)?;
            return Ok(CgroupParent {
                layout: ParentLayout::V2 { workers_dir, cpu },
                ops,
            });
        }
        Err(reason) => reason,
    };
    let memory = find_v1_own_dir(&entries, &mounts, "memory", fs_root);
    let pids = find_v1_own_dir(&entries, &mounts, "pids", fs_root);
    let (memory, pids) = match (memory, pids) {
        (Ok(memory), Ok(pids)) => (memory, pids),
        (memory, pids) => {
            let v1_reason = [memory.err(), pids.err()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", ");
            return Err(CgroupError::DetectHierarchy {
                reason: format!("v2: {v2_reason}; v1: {v1_reason}"),
                hint: DETECT_HINT,
            });
        }
    };
    check_writable(&memory)?;
    check_writable(&pids)?;
    let cpu = match find_v1_own_dir(&entries, &mounts, "cpu", fs_root) {
        Ok(cpu) if check_writable(&cpu).is_ok() => Some(cpu),
        Ok(cpu) => {
            tracing::debug!(dir = %cpu.display(), "v1 cpu cgroup not writable; cpu quotas off");
            None
        }
        Err(reason) => {
            tracing::debug!(%reason, "no v1 cpu hierarchy; cpu quotas off");
            None
        }
    };
    Ok(CgroupParent {
        layout: ParentLayout::V1 { memory, pids, cpu },
        ops,
    })
}

fn from_dirs_with(dirs: CgroupDirs, ops: DirOps) -> Result<CgroupParent, CgroupError> {
    let layout = match dirs {
        CgroupDirs::V2 { parent } => {
            let available = read_controllers(&parent.join("cgroup.controllers"))?;
            if !has_all(&available, &["memory", "pids"]) {
                return Err(CgroupError::DetectHierarchy {
                    reason: format!(
                        "v2: {} offers {:?}, not memory and pids",
                        parent.join("cgroup.controllers").display(),
                        available.join(" ")
                    ),
                    hint: DETECT_HINT,
                });
            }
            check_writable(&parent)?;
            let cpu = ensure_controllers_enabled(&parent, &available)?;
            ParentLayout::V2 {
                workers_dir: parent,
                cpu,
            }
        }
        CgroupDirs::V1 { memory, pids, cpu } => {
            check_writable(&memory)?;
            check_writable(&pids)?;
            if let Some(cpu) = &cpu {
                check_writable(cpu)?;
            }
            ParentLayout::V1 { memory, pids, cpu }
        }
    };
    Ok(CgroupParent { layout, ops })
}

/// Makes `own` (our v2 cgroup) able to hold worker cgroups and returns the directory to
/// create them in, plus whether the cpu controller is enabled there.
///
/// The "no internal processes" rule: a v2 cgroup holding processes cannot enable
/// controllers for its children. So if our cgroup holds processes and lacks memory/pids in
/// cgroup.subtree_control, this process moves into `<own>/airlock-supervisor` (writing our
/// pid to cgroup.procs moves every thread), then `<own>` and `<own>/airlock-workers` enable
/// the controllers. Idempotent: when we already sit in `airlock-supervisor`, its parent is
/// taken as our own cgroup. Nothing above our own cgroup is written.
fn prepare_v2_parent(own: &Path, pid: u32, ops: DirOps) -> Result<(PathBuf, bool), CgroupError> {
    let base = v2_base(own);
    let available = read_controllers(&base.join("cgroup.controllers"))?;
    let enabled = read_controllers(&base.join("cgroup.subtree_control"))?;
    if !has_all(&enabled, &wanted_controllers(&available)) {
        let procs = read_file(&base.join("cgroup.procs"))?;
        if !procs.trim().is_empty() {
            let leaf = base.join(SUPERVISOR_LEAF);
            create_dir_if_missing(ops, &leaf)?;
            write_file(&leaf.join("cgroup.procs"), &pid.to_string())?;
            tracing::info!(cgroup = %leaf.display(), "moved the supervisor into a leaf cgroup");
        }
    }
    let cpu = ensure_controllers_enabled(base, &available)?;
    let workers = base.join(WORKERS_DIR);
    create_dir_if_missing(ops, &workers)?;
    let offered: Vec<String> = ["memory", "pids"]
        .into_iter()
        .chain(cpu.then_some("cpu"))
        .map(String::from)
        .collect();
    let cpu = ensure_controllers_enabled(&workers, &offered)? && cpu;
    Ok((workers, cpu))
}

/// The cgroup that worker cgroups go beneath: our own, or its parent when we already sit in
/// our `airlock-supervisor` leaf (moved there by an earlier start, or placed there by
/// whoever delegated the cgroup to us).
fn v2_base(own: &Path) -> &Path {
    match (own.file_name(), own.parent()) {
        (Some(leaf), Some(parent)) if leaf == SUPERVISOR_LEAF => parent,
        _ => own,
    }
}

/// The controllers worker cgroups need, plus cpu when it is offered.
fn wanted_controllers(available: &[String]) -> Vec<&'static str> {
    let mut wanted = vec!["memory", "pids"];
    if available.iter().any(|c| c == "cpu") {
        wanted.push("cpu");
    }
    wanted
}

/// Enables memory, pids (and cpu when `available` lists it) in `dir`'s cgroup.subtree_control
/// unless they already are. cpu is best effort: it cannot be enabled while real-time tasks
/// sit in the subtree (CONFIG_RT_GROUP_SCHED). Returns whether cpu is enabled.
fn ensure_controllers_enabled(dir: &Path, available: &[String]) -> Result<bool, CgroupError> {
    let path = dir.join("cgroup.subtree_control");
    let enabled = read_controllers(&path)?;
    let wanted = wanted_controllers(available);
    if has_all(&enabled, &wanted) {
        return Ok(wanted.contains(&"cpu"));
    }
    let format = |controllers: &[&str]| {
        controllers
            .iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let value = format(&wanted);
    match write_raw(&path, &value) {
        Ok(()) => return Ok(wanted.contains(&"cpu")),
        Err(error) if wanted.contains(&"cpu") => {
            tracing::warn!(path = %path.display(), %error, "cpu controller not enabled; no cpu quotas");
        }
        Err(source) => {
            return Err(CgroupError::EnableControllers {
                path,
                controllers: value,
                hint: ENABLE_HINT,
                source,
            });
        }
    }
    let value = format(&["memory", "pids"]);
    write_raw(&path, &value).map_err(|source| CgroupError::EnableControllers {
        path: path.clone(),
        controllers: value,
        hint: ENABLE_HINT,
        source,
    })?;
    Ok(false)
}

fn has_all(have: &[String], wanted: &[&str]) -> bool {
    wanted.iter().all(|w| have.iter().any(|h| h == w))
}

fn read_controllers(path: &Path) -> Result<Vec<String>, CgroupError> {
    Ok(read_file(path)?
        .split_whitespace()
        .map(String::from)
        .collect())
}

fn create_dir_if_missing(ops: DirOps, path: &Path) -> Result<(), CgroupError> {
    match ops.create_dir(path, Controller::Unified) {
        Err(source) if source.kind() != io::ErrorKind::AlreadyExists => {
            Err(CgroupError::CreateDir {
                path: path.to_path_buf(),
                source,
            })
        }
        _ => Ok(()),
    }
}

fn check_writable(dir: &Path) -> Result<(), CgroupError> {
    nix::unistd::access(dir, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|errno| {
        CgroupError::CheckWritable {
            path: dir.to_path_buf(),
            hint: WRITABLE_HINT,
            source: io::Error::from(errno),
        }
    })
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

// ---- /proc parsing -------------------------------------------------------------------

/// One line of /proc/self/cgroup: `hierarchy-id:controller-list:cgroup-path`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProcCgroupEntry<'a> {
    hierarchy_id: &'a str,
    controllers: Vec<&'a str>,
    path: &'a str,
}

fn parse_proc_self_cgroup(text: &str) -> Vec<ProcCgroupEntry<'_>> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let hierarchy_id = fields.next()?;
            let controllers = fields.next()?;
            let path = fields.next()?;
            Some(ProcCgroupEntry {
                hierarchy_id,
                controllers: controllers.split(',').filter(|c| !c.is_empty()).collect(),
                path,
            })
        })
        .collect()
}

/// The fields of one /proc/self/mountinfo line that locate a cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountEntry {
    /// The directory of the filesystem mounted here (not "/" in bind mounts and namespaces).
    root: PathBuf,
    mount_point: PathBuf,
    fs_type: String,
    super_options: Vec<String>,
}

fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            // id parent major:minor root mount-point options [optional...] - type source super
            let fields: Vec<&str> = line.split(' ').collect();
            let separator = fields.iter().skip(6).position(|f| *f == "-")? + 6;
            Some(MountEntry {
                root: PathBuf::from(unescape_mountinfo(fields.get(3)?)),
                mount_point: PathBuf::from(unescape_mountinfo(fields.get(4)?)),
                fs_type: (*fields.get(separator + 1)?).to_string(),
                super_options: fields
                    .get(separator + 3)?
                    .split(',')
                    .map(String::from)
                    .collect(),
            })
        })
        .collect()
}

/// The kernel escapes space, tab, newline and backslash in mountinfo paths as `\ooo`.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        match octal {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of `cgroup_path` under the first mount of `fs_type` (and `controller` among
/// its options) whose root contains it. A path with `..` (our cgroup lies outside our cgroup
/// namespace) is refused: resolving it would point above or beside our own cgroup.
fn locate_cgroup_dir(
    mounts: &[MountEntry],
    fs_type: &str,
    controller: Option<&str>,
    cgroup_path: &str,
    fs_root: &Path,
) -> Result<PathBuf, String> {
    let path = Path::new(cgroup_path);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "our cgroup path {cgroup_path:?} lies outside our cgroup namespace"
        ));
    }
    mounts
        .iter()
        .filter(|m| m.fs_type == fs_type)
        .filter(|m| controller.is_none_or(|c| m.super_options.iter().any(|o| o == c)))
        .find_map(|m| {
            let relative = path.strip_prefix(&m.root).ok()?;
            let mount_point = m.mount_point.strip_prefix("/").ok()?;
            Some(fs_root.join(mount_point).join(relative))
        })
        .ok_or_else(|| match controller {
            Some(c) => format!("no {fs_type} mount with {c} holds our cgroup {cgroup_path:?}"),
            None => format!("no {fs_type} mount holds our cgroup {cgroup_path:?}"),
        })
}

fn find_v2_own_dir(
    entries: &[ProcCgroupEntry<'_>],
    mounts: &[MountEntry],
    fs_root: &Path,
) -> Result<PathBuf, String> {
    let entry = entries
        .iter()
        .find(|e| e.hierarchy_id == "0" && e.controllers.is_empty())
        .ok_or("/proc/self/cgroup has no unified (0::) line")?;
    let dir = locate_cgroup_dir(mounts, "cgroup2", None, entry.path, fs_root)?;
    // Check where `prepare_v2_parent` will enable the controllers: in our leaf,
    // cgroup.controllers lists only what the base already enabled, which is nothing until a
    // first start has prepared it (found booting Debian 12's 6.1 kernel, ci/vm-test).
    let path = v2_base(&dir).join("cgroup.controllers");
    let available = fs::read_to_string(&path)
        .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    let available: Vec<String> = available.split_whitespace().map(String::from).collect();
    if has_all(&available, &["memory", "pids"]) {
        Ok(dir)
    } else {
        Err(format!(
            "{} offers {:?}, not memory and pids",
            path.display(),
            available.join(" ")
        ))
    }
}

fn find_v1_own_dir(
    entries: &[ProcCgroupEntry<'_>],
    mounts: &[MountEntry],
    controller: &str,
    fs_root: &Path,
) -> Result<PathBuf, String> {
    let entry = entries
        .iter()
        .find(|e| e.hierarchy_id != "0" && e.controllers.contains(&controller))
        .ok_or_else(|| format!("no {controller} hierarchy in /proc/self/cgroup"))?;
    locate_cgroup_dir(mounts, "cgroup", Some(controller), entry.path, fs_root)
}

// ---- file access ---------------------------------------------------------------------

fn read_file(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::ReadFile {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a whole (small) file with pread from offset 0, so an open descriptor can be read
/// again and again: cgroupfs regenerates the text at offset 0.
fn read_from_start(file: &fs::File) -> io::Result<String> {
    use std::os::unix::fs::FileExt;
    let mut bytes = Vec::with_capacity(256);
    let mut buffer = [0u8; 4096];
    loop {
        match file.read_at(&mut buffer, bytes.len() as u64) {
            Ok(0) => break,
            // cgroupfs (seq_file) fills the buffer as far as the text goes, so a short read
            // is the end: one pread per counter instead of two on the call's critical path.
            Ok(n) if n < buffer.len() => {
                bytes.extend_from_slice(&buffer[..n]);
                break;
            }
            Ok(n) => bytes.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if bytes.len() > 1 << 20 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "counter file too large",
            ));
        }
    }
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn read_optional_file(path: &Path) -> Result<Option<String>, CgroupError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CgroupError::ReadFile {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes `value` in one write(2) to an existing control file (cgroupfs files cannot be
/// created, so no O_CREAT: a missing file is an error, not a new plain file).
fn write_raw(path: &Path, value: &str) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).truncate(true).open(path)?;
    file.write_all(value.as_bytes())
}

fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    write_raw(path, value).map_err(|source| CgroupError::WriteFile {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    })
}

/// Writes a control file that older kernels or some configurations lack; returns whether
/// it existed.
fn write_optional_file(path: &Path, value: &str) -> Result<bool, CgroupError> {
    match write_raw(path, value) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(CgroupError::WriteFile {
            path: path.to_path_buf(),
            value: value.to_string(),
            source,
        }),
    }
}

fn parse_number(path: &Path, text: &str) -> Result<u64, CgroupError> {
    text.trim().parse().map_err(|_| CgroupError::ParseFile {
        path: path.to_path_buf(),
        reason: format!("expected a number, found {:?}", text.trim()),
    })
}

/// Reads `key value` from a flat-keyed file such as memory.events or memory.oom_control.
fn parse_keyed(path: &Path, text: &str, key: &str) -> Result<u64, CgroupError> {
    let value = text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.next() == Some(key))
            .then(|| fields.next())
            .flatten()
    });
    match value {
        Some(value) => parse_number(path, value),
        None => Err(CgroupError::ParseFile {
            path: path.to_path_buf(),
            reason: format!("no {key:?} line"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A temporary directory standing in for `/`; removed on drop.
    pub(super) struct FakeTree {
        root: PathBuf,
    }

    impl FakeTree {
        pub(super) fn new() -> Self {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let root = std::env::temp_dir().join(format!(
                "airlock-cgroup-test-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(&root).unwrap();
            FakeTree { root }
        }

        pub(super) fn path(&self, relative: &str) -> PathBuf {
            self.root.join(relative)
        }

        pub(super) fn write(&self, relative: &str, content: &str) {
            let path = self.path(relative);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, content).unwrap();
        }

        fn read(&self, relative: &str) -> String {
            fs::read_to_string(self.path(relative)).unwrap()
        }

        /// A directory the kernel would have created, with its files.
        fn cgroup(&self, relative: &str, kind: Controller) {
            fs::create_dir_all(self.path(relative)).unwrap();
            populate_like_kernel(&self.path(relative), kind);
        }
    }

    impl Drop for FakeTree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    fn write_files(dir: &Path, files: &[(&str, &str)]) {
        for (name, content) in files {
            fs::write(dir.join(name), content).unwrap();
        }
    }

    /// What mkdir on cgroupfs creates (the files this module touches).
    fn populate_like_kernel(dir: &Path, kind: Controller) {
        let files: &[(&str, &str)] = match kind {
            Controller::Unified => &[
                ("cgroup.procs", ""),
                ("cgroup.controllers", "cpu memory pids\n"),
                ("cgroup.subtree_control", "\n"),
                ("cgroup.events", "populated 0\nfrozen 0\n"),
                ("cgroup.kill", ""),
                ("memory.max", "max\n"),
                ("memory.swap.max", "max\n"),
                ("memory.oom.group", "0\n"),
                (
                    "memory.events",
                    "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
                ),
                ("memory.peak", "0\n"),
                ("memory.current", "8192\n"),
                ("pids.max", "max\n"),
                ("pids.events", "max 0\n"),
                ("cpu.max", "max 100000\n"),
            ],
            Controller::Memory => &[
                ("cgroup.procs", ""),
                ("tasks", ""),
                ("memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory.memsw.limit_in_bytes", "9223372036854771712\n"),
                ("memory.swappiness", "60\n"),
                (
                    "memory.oom_control",
                    "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
                ),
                ("memory.failcnt", "0\n"),
                ("memory.memsw.failcnt", "0\n"),
                ("memory.max_usage_in_bytes", "0\n"),
                ("memory.memsw.max_usage_in_bytes", "0\n"),
                ("memory.usage_in_bytes", "8192\n"),
            ],
            Controller::Pids => &[
                ("cgroup.procs", ""),
                ("tasks", ""),
                ("pids.max", "max\n"),
                ("pids.events", "max 0\n"),
            ],
            Controller::Cpu => &[
                ("cgroup.procs", ""),
                ("tasks", ""),
                ("cpu.cfs_period_us", "100000\n"),
                ("cpu.cfs_quota_us", "-1\n"),
            ],
        };
        write_files(dir, files);
    }

    /// A kernel booted with swapaccount=0 and an old v2 kernel (no swap, peak, kill files).
    fn populate_like_kernel_without_swap_accounting(dir: &Path, kind: Controller) {
        populate_like_kernel(dir, kind);
        for name in [
            "memory.memsw.limit_in_bytes",
            "memory.swap.max",
            "memory.peak",
            "cgroup.kill",
        ] {
            let _ = fs::remove_file(dir.join(name));
        }
    }

    /// A pids hierarchy whose new directories lack pids.max: creation must fail.
    fn populate_like_kernel_with_broken_pids(dir: &Path, kind: Controller) {
        populate_like_kernel(dir, kind);
        if kind == Controller::Pids {
            let _ = fs::remove_file(dir.join("pids.max"));
        }
    }

    const OWN_MEMORY: &str = "/process_api/8e7a8d54810cf6c46986e2dd06347d05";

    /// /proc/self/cgroup of the development machine (cgroup v1 hybrid).
    fn hybrid_proc_self_cgroup() -> String {
        format!(
            "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/\n5:devices:/\n\
             4:memory:{OWN_MEMORY}\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n"
        )
    }

    /// /proc/self/mountinfo of the development machine, cgroup lines and a few others.
    const HYBRID_MOUNTINFO: &str = "\
23 1 0:21 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const V2_OWN: &str = "/user.slice/user-1000.slice/session-3.scope";

    /// A systemd machine on pure cgroup v2 (Debian 12 default).
    const V2_MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
25 22 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 25 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    pub(super) fn hybrid_tree() -> FakeTree {
        let tree = FakeTree::new();
        tree.cgroup(
            &format!("sys/fs/cgroup/memory{OWN_MEMORY}"),
            Controller::Memory,
        );
        tree.cgroup("sys/fs/cgroup/pids", Controller::Pids);
        tree.cgroup("sys/fs/cgroup/cpu", Controller::Cpu);
        tree.write("sys/fs/cgroup/unified/cgroup.controllers", "hugetlb\n");
        tree
    }

    /// A pure-v2 tree whose own cgroup holds the supervisor and one more process.
    fn v2_tree() -> FakeTree {
        let tree = FakeTree::new();
        let own = format!("sys/fs/cgroup{V2_OWN}");
        tree.cgroup(&own, Controller::Unified);
        tree.write(&format!("{own}/cgroup.procs"), "4242\n4243\n");
        tree
    }

    fn detect_fake(
        tree: &FakeTree,
        cgroup: &str,
        mountinfo: &str,
        populate: fn(&Path, Controller),
    ) -> Result<CgroupParent, CgroupError> {
        detect_with(cgroup, mountinfo, &tree.root, 4242, DirOps::Fake(populate))
    }

    fn limits() -> CgroupLimits {
        CgroupLimits {
            memory_bytes: 32 << 20,
            pids: 16,
            cpu_quota: Some((50_000, 100_000)),
        }
    }

    #[test]
    fn proc_self_cgroup_parses_hybrid_layout() {
        let text = hybrid_proc_self_cgroup();
        let entries = parse_proc_self_cgroup(&text);
        assert_eq!(entries.len(), 10);
        assert_eq!(
            entries[5],
            ProcCgroupEntry {
                hierarchy_id: "4",
                controllers: vec!["memory"],
                path: OWN_MEMORY
            }
        );
        assert_eq!(
            entries[9],
            ProcCgroupEntry {
                hierarchy_id: "0",
                controllers: vec![],
                path: "/"
            }
        );
    }

    #[test]
    fn proc_self_cgroup_keeps_colons_in_the_path() {
        let entries = parse_proc_self_cgroup("2:cpu,cpuacct:/a:b\n0::/x\n");
        assert_eq!(entries[0].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(entries[0].path, "/a:b");
    }

    #[test]
    fn mountinfo_parses_optional_fields_and_escaped_paths() {
        let mounts = parse_mountinfo(
            "26 25 0:23 /sub /sys/fs/my\\040cgroup rw shared:9 master:2 - cgroup cgroup rw,cpu,cpuacct\n",
        );
        assert_eq!(
            mounts,
            vec![MountEntry {
                root: PathBuf::from("/sub"),
                mount_point: PathBuf::from("/sys/fs/my cgroup"),
                fs_type: "cgroup".into(),
                super_options: vec!["rw".into(), "cpu".into(), "cpuacct".into()],
            }]
        );
    }

    #[test]
    fn mountinfo_parses_the_hybrid_layout() {
        let mounts = parse_mountinfo(HYBRID_MOUNTINFO);
        assert_eq!(mounts.len(), 12);
        let unified = mounts.iter().find(|m| m.fs_type == "cgroup2").unwrap();
        assert_eq!(unified.mount_point, Path::new("/sys/fs/cgroup/unified"));
    }

    #[test]
    fn cgroup_dir_strips_the_mount_root() {
        let mounts =
            parse_mountinfo("35 31 0:32 /process_api /mnt/memory rw - cgroup cgroup rw,memory\n");
        let dir = locate_cgroup_dir(
            &mounts,
            "cgroup",
            Some("memory"),
            "/process_api/abc",
            Path::new("/root"),
        );
        assert_eq!(dir, Ok(PathBuf::from("/root/mnt/memory/abc")));
    }

    #[test]
    fn cgroup_path_outside_our_namespace_is_refused() {
        let mounts = parse_mountinfo(V2_MOUNTINFO);
        let dir = locate_cgroup_dir(&mounts, "cgroup2", None, "/../sibling", Path::new("/"));
        assert!(dir.unwrap_err().contains("outside our cgroup namespace"));
    }

    #[test]
    fn detect_picks_v1_on_hybrid_machine_with_hugetlb_only_unified() {
        let tree = hybrid_tree();
        let parent = detect_fake(
            &tree,
            &hybrid_proc_self_cgroup(),
            HYBRID_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        assert_eq!(parent.version(), CgroupVersion::V1);
        assert!(parent.supports_cpu_quota());
        assert_eq!(
            parent.dirs(),
            vec![
                tree.path(&format!("sys/fs/cgroup/memory{OWN_MEMORY}")),
                tree.path("sys/fs/cgroup/pids"),
                tree.path("sys/fs/cgroup/cpu"),
            ]
        );
    }

    #[test]
    fn detect_without_cpu_hierarchy_turns_cpu_quotas_off() {
        let tree = hybrid_tree();
        let cgroup = hybrid_proc_self_cgroup().replace("1:cpu:/\n", "");
        let parent = detect_fake(&tree, &cgroup, HYBRID_MOUNTINFO, populate_like_kernel).unwrap();
        assert!(!parent.supports_cpu_quota());
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        assert_eq!(worker.applied_limits().cpu_quota, None);
        assert_eq!(worker.paths().len(), 2);
        assert!(!tree.path("sys/fs/cgroup/cpu/w").exists());
    }

    #[test]
    fn detect_fails_with_hint_when_no_hierarchy_offers_memory() {
        let tree = hybrid_tree();
        let cgroup = hybrid_proc_self_cgroup().replace("4:memory:", "4:devices2:");
        let error = detect_fake(&tree, &cgroup, HYBRID_MOUNTINFO, populate_like_kernel)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("no usable cgroup hierarchy for workers (v2: "),
            "{error}"
        );
        assert!(error.contains("offers \"hugetlb\""), "{error}");
        assert!(
            error.contains("no memory hierarchy in /proc/self/cgroup"),
            "{error}"
        );
        assert!(error.contains("fix: use cgroup v2"), "{error}");
    }

    #[test]
    fn detect_picks_v2_when_unified_cgroup_offers_memory_and_pids() {
        let tree = v2_tree();
        let cgroup = format!("0::{V2_OWN}\n");
        let parent = detect_fake(&tree, &cgroup, V2_MOUNTINFO, populate_like_kernel).unwrap();
        assert_eq!(parent.version(), CgroupVersion::V2);
        assert!(parent.supports_cpu_quota());
        assert_eq!(
            parent.dirs(),
            vec![tree.path(&format!("sys/fs/cgroup{V2_OWN}/airlock-workers"))]
        );
    }

    #[test]
    fn prepare_v2_parent_moves_supervisor_into_leaf_and_enables_controllers() {
        let tree = v2_tree();
        let own = format!("sys/fs/cgroup{V2_OWN}");
        detect_fake(
            &tree,
            &format!("0::{V2_OWN}\n"),
            V2_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        assert_eq!(
            tree.read(&format!("{own}/airlock-supervisor/cgroup.procs")),
            "4242"
        );
        assert_eq!(
            tree.read(&format!("{own}/cgroup.subtree_control")),
            "+memory +pids +cpu"
        );
        assert_eq!(
            tree.read(&format!("{own}/airlock-workers/cgroup.subtree_control")),
            "+memory +pids +cpu"
        );
        // Nothing written above our own cgroup.
        assert_eq!(
            fs::read_dir(tree.path("sys/fs/cgroup/user.slice/user-1000.slice"))
                .unwrap()
                .count(),
            1
        );
    }

    #[test]
    fn prepare_v2_parent_is_idempotent_after_the_move() {
        let tree = v2_tree();
        let own = format!("sys/fs/cgroup{V2_OWN}");
        detect_fake(
            &tree,
            &format!("0::{V2_OWN}\n"),
            V2_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        // What the kernel would now show.
        tree.write(&format!("{own}/cgroup.procs"), "4243\n");
        tree.write(
            &format!("{own}/cgroup.subtree_control"),
            "cpu memory pids\n",
        );
        tree.write(
            &format!("{own}/airlock-workers/cgroup.subtree_control"),
            "cpu memory pids\n",
        );
        let again = detect_fake(
            &tree,
            &format!("0::{V2_OWN}/airlock-supervisor\n"),
            V2_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        assert_eq!(
            again.dirs(),
            vec![tree.path(&format!("{own}/airlock-workers"))]
        );
        assert!(
            !tree
                .path(&format!("{own}/airlock-supervisor/airlock-supervisor"))
                .exists()
        );
        assert!(
            !tree
                .path(&format!("{own}/airlock-supervisor/airlock-workers"))
                .exists()
        );
        assert_eq!(
            tree.read(&format!("{own}/cgroup.subtree_control")),
            "cpu memory pids\n"
        );
    }

    #[test]
    fn prepare_v2_parent_does_not_move_from_an_empty_cgroup() {
        let tree = v2_tree();
        let own = format!("sys/fs/cgroup{V2_OWN}");
        tree.write(&format!("{own}/cgroup.procs"), "");
        tree.write(&format!("{own}/cgroup.controllers"), "memory pids io\n");
        let parent = detect_fake(
            &tree,
            &format!("0::{V2_OWN}\n"),
            V2_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        assert!(!tree.path(&format!("{own}/airlock-supervisor")).exists());
        assert_eq!(
            tree.read(&format!("{own}/cgroup.subtree_control")),
            "+memory +pids"
        );
        assert!(!parent.supports_cpu_quota());
    }

    #[test]
    fn detect_v2_in_a_leaf_whose_parent_has_not_enabled_controllers_yet() {
        // A launcher put us straight into <own>/airlock-supervisor of a fresh delegated
        // cgroup: as on a real kernel, the leaf offers nothing until <own> enables them.
        let tree = v2_tree();
        let own = format!("sys/fs/cgroup{V2_OWN}");
        tree.write(&format!("{own}/cgroup.procs"), "");
        tree.cgroup(&format!("{own}/airlock-supervisor"), Controller::Unified);
        tree.write(&format!("{own}/airlock-supervisor/cgroup.controllers"), "");
        tree.write(&format!("{own}/airlock-supervisor/cgroup.procs"), "4242\n");
        let parent = detect_fake(
            &tree,
            &format!("0::{V2_OWN}/airlock-supervisor\n"),
            V2_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        assert_eq!(
            parent.dirs(),
            vec![tree.path(&format!("{own}/airlock-workers"))]
        );
        assert_eq!(
            tree.read(&format!("{own}/cgroup.subtree_control")),
            "+memory +pids +cpu"
        );
        assert!(
            !tree
                .path(&format!("{own}/airlock-supervisor/airlock-supervisor"))
                .exists()
        );
    }

    #[test]
    fn from_dirs_v2_enables_controllers_in_the_configured_parent() {
        let tree = FakeTree::new();
        tree.cgroup("delegated", Controller::Unified);
        let parent = from_dirs_with(
            CgroupDirs::V2 {
                parent: tree.path("delegated"),
            },
            DirOps::Fake(populate_like_kernel),
        )
        .unwrap();
        assert_eq!(parent.version(), CgroupVersion::V2);
        assert_eq!(
            tree.read("delegated/cgroup.subtree_control"),
            "+memory +pids +cpu"
        );
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        assert_eq!(worker.paths(), vec![tree.path("delegated/w")]);
    }

    #[test]
    fn from_dirs_v2_refuses_a_parent_without_memory() {
        let tree = FakeTree::new();
        tree.cgroup("delegated", Controller::Unified);
        tree.write("delegated/cgroup.controllers", "pids\n");
        let error = CgroupParent::from_dirs(CgroupDirs::V2 {
            parent: tree.path("delegated"),
        })
        .unwrap_err();
        assert!(
            matches!(error, CgroupError::DetectHierarchy { .. }),
            "{error}"
        );
    }

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
        let parent = detect_fake(
            &tree,
            &format!("0::{V2_OWN}\n"),
            V2_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
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
    fn v2_read_stats_counts_oom_kill_not_oom() {
        let tree = v2_tree();
        let parent = detect_fake(
            &tree,
            &format!("0::{V2_OWN}\n"),
            V2_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
        let worker = parent.create_worker_cgroup("w", &limits()).unwrap();
        let dir = format!("sys/fs/cgroup{V2_OWN}/airlock-workers/w");
        tree.write(
            &format!("{dir}/memory.events"),
            "low 0\nhigh 0\nmax 2\noom 5\noom_kill 1\noom_group_kill 0\n",
        );
        tree.write(&format!("{dir}/memory.peak"), "16777216\n");
        tree.write(&format!("{dir}/pids.events"), "max 3\n");
        assert_eq!(
            worker.read_stats().unwrap(),
            CgroupStats {
                oom_kills: 1,
                peak_memory_bytes: Some(16 << 20),
                pids_limit_hits: 3,
                memory_limit_hits: 2,
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
    fn v2_kill_all_writes_one_to_cgroup_kill() {
        let tree = v2_tree();
        let parent = detect_fake(
            &tree,
            &format!("0::{V2_OWN}\n"),
            V2_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
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
    fn is_populated_reads_cgroup_events_on_v2_and_procs_on_v1() {
        let tree = v2_tree();
        let parent = detect_fake(
            &tree,
            &format!("0::{V2_OWN}\n"),
            V2_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
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
        let parent = detect_fake(
            &tree,
            &format!("0::{V2_OWN}\n"),
            V2_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
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
        let parent = detect_fake(
            &tree,
            &format!("0::{V2_OWN}\n"),
            V2_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
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

    #[test]
    fn cgroup_version_displays_and_serializes_lowercase() {
        assert_eq!(CgroupVersion::V1.to_string(), "v1");
        assert_eq!(CgroupVersion::V2.to_string(), "v2");
        assert_eq!(serde_json::to_string(&CgroupVersion::V2).unwrap(), "\"v2\"");
        assert_eq!(
            serde_json::from_str::<CgroupVersion>("\"v1\"").unwrap(),
            CgroupVersion::V1
        );
    }

    fn no_quota() -> CgroupLimits {
        CgroupLimits {
            cpu_quota: None,
            ..limits()
        }
    }

    pub(super) fn hybrid_parent(tree: &FakeTree) -> CgroupParent {
        detect_fake(
            tree,
            &hybrid_proc_self_cgroup(),
            HYBRID_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap()
    }

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
    fn v2_reuse_resets_memory_peak_through_a_read_write_counter_file() {
        let tree = v2_tree();
        let parent = detect_fake(
            &tree,
            &format!("0::{V2_OWN}\n"),
            V2_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
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
        let parent = detect_fake(
            &tree,
            &format!("0::{V2_OWN}\n"),
            V2_MOUNTINFO,
            populate_like_kernel,
        )
        .unwrap();
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
