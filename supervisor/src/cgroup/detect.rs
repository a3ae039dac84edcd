//! Where worker cgroups go: detected from /proc/self/cgroup and /proc/self/mountinfo (v2
//! if our unified cgroup offers memory and pids, else the v1 memory and pids hierarchies,
//! as on a hybrid machine), or configured directories.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::unistd::AccessFlags;

use super::files::read_file;
use super::procfs::{
    MountEntry, ProcCgroupEntry, locate_cgroup_dir, parse_mountinfo, parse_proc_self_cgroup,
};
use super::v2::{
    ensure_controllers_enabled, has_all, prepare_v2_parent, read_controllers, v2_base,
};
use super::{CgroupDirs, CgroupError, CgroupParent, DirOps, ParentLayout};

const DETECT_HINT: &str = "use cgroup v2 with the memory and pids controllers available to the \
supervisor's cgroup (e.g. systemd-run --scope -p Delegate=yes), or mount the v1 memory and pids \
hierarchies, or configure a delegated parent directory";
const WRITABLE_HINT: &str = "run the supervisor as root or delegate the cgroup to its user \
(chown the directory, or systemd Delegate=yes)";

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
}

pub(super) fn detect_with(
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

pub(super) fn from_dirs_with(dirs: CgroupDirs, ops: DirOps) -> Result<CgroupParent, CgroupError> {
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

fn check_writable(dir: &Path) -> Result<(), CgroupError> {
    nix::unistd::access(dir, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|errno| {
        CgroupError::CheckWritable {
            path: dir.to_path_buf(),
            hint: WRITABLE_HINT,
            source: io::Error::from(errno),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake_tree::{
        FakeTree, HYBRID_MOUNTINFO, OWN_MEMORY, V2_MOUNTINFO, V2_OWN, detect_fake,
        hybrid_proc_self_cgroup, hybrid_tree, limits, populate_like_kernel, v2_tree,
    };
    use crate::cgroup::{CgroupVersion, Controller};

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
}
