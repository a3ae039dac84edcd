//! The fake cgroup tree the unit tests run against: a temporary directory standing in for
//! `/`, filled as the kernel would fill cgroupfs.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::detect::detect_with;
use super::{CgroupError, CgroupLimits, CgroupParent, Controller, DirOps};

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

    pub(super) fn read(&self, relative: &str) -> String {
        fs::read_to_string(self.path(relative)).unwrap()
    }

    /// A directory the kernel would have created, with its files.
    pub(super) fn cgroup(&self, relative: &str, kind: Controller) {
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

/// What mkdir on cgroupfs creates (the files the cgroup module touches).
pub(super) fn populate_like_kernel(dir: &Path, kind: Controller) {
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
            ("memory.reclaim", ""),
            ("pids.max", "max\n"),
            ("pids.events", "max 0\n"),
            ("cpu.max", "max 100000\n"),
            (
                "cpu.stat",
                "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 0\n",
            ),
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
            ("memory.force_empty", ""),
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
pub(super) fn populate_like_kernel_without_swap_accounting(dir: &Path, kind: Controller) {
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
pub(super) fn populate_like_kernel_with_broken_pids(dir: &Path, kind: Controller) {
    populate_like_kernel(dir, kind);
    if kind == Controller::Pids {
        let _ = fs::remove_file(dir.join("pids.max"));
    }
}

pub(super) const OWN_MEMORY: &str = "/process_api/8e7a8d54810cf6c46986e2dd06347d05";

/// /proc/self/cgroup of the development machine (cgroup v1 hybrid).
pub(super) fn hybrid_proc_self_cgroup() -> String {
    format!(
        "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/\n5:devices:/\n\
         4:memory:{OWN_MEMORY}\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n"
    )
}

/// /proc/self/mountinfo of the development machine, cgroup lines and a few others.
pub(super) const HYBRID_MOUNTINFO: &str = "\
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

pub(super) const V2_OWN: &str = "/user.slice/user-1000.slice/session-3.scope";

/// A systemd machine on pure cgroup v2 (Debian 12 default).
pub(super) const V2_MOUNTINFO: &str = "\
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
pub(super) fn v2_tree() -> FakeTree {
    let tree = FakeTree::new();
    let own = format!("sys/fs/cgroup{V2_OWN}");
    tree.cgroup(&own, Controller::Unified);
    tree.write(&format!("{own}/cgroup.procs"), "4242\n4243\n");
    tree
}

pub(super) fn detect_fake(
    tree: &FakeTree,
    cgroup: &str,
    mountinfo: &str,
    populate: fn(&Path, Controller),
) -> Result<CgroupParent, CgroupError> {
    detect_with(cgroup, mountinfo, &tree.root, 4242, DirOps::Fake(populate))
}

pub(super) fn limits() -> CgroupLimits {
    CgroupLimits {
        memory_bytes: 32 << 20,
        pids: 16,
        cpu_quota: Some((50_000, 100_000)),
    }
}

pub(super) fn no_quota() -> CgroupLimits {
    CgroupLimits {
        cpu_quota: None,
        ..limits()
    }
}

/// The parent detected in [`v2_tree`], with our process in its own cgroup.
pub(super) fn v2_parent(tree: &FakeTree) -> CgroupParent {
    detect_fake(
        tree,
        &format!("0::{V2_OWN}\n"),
        V2_MOUNTINFO,
        populate_like_kernel,
    )
    .unwrap()
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
