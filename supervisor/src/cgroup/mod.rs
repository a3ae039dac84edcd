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
//!
//! The parts: `detect` finds where worker cgroups go (with `procfs` reading
//! /proc/self/cgroup and mountinfo, and `v2` preparing a unified cgroup to hold them);
//! `worker` creates a worker's cgroup and removes it; `counters` reads what the kernel
//! counted in it; `recycle` keeps empty ones for the next worker; `stale` removes those a
//! dead supervisor left; `files` reads and writes control files.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod counters;
mod detect;
#[cfg(test)]
mod fake_tree;
mod files;
mod procfs;
mod recycle;
mod stale;
mod v2;
mod worker;

pub(crate) use recycle::SPARE_CGROUP_FILES;
pub use recycle::{CgroupRecycler, RECYCLE_MAX_LEFTOVER_BYTES};
pub use stale::worker_cgroup_name;

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
    /// CPU time of every process in the cgroup since it was given to this worker,
    /// microseconds: v2 `cpu.stat` `usage_usec`, which also counts processes that no one
    /// waited for; `None` on v1, whose memory and pids hierarchies count no CPU.
    pub cpu_usage_us: Option<u64>,
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
    /// v2 `cpu.stat` `usage_usec` when the cgroup was last given to a worker (0 when made):
    /// a kept cgroup's count goes on from its earlier workers'.
    cpu_usage_base_us: u64,
}

impl WorkerCgroup {
    /// The directory of one kind (v2: `Unified`; v1: one per hierarchy), if it has one.
    fn dir_of(&self, kind: Controller) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, dir)| dir.as_path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
