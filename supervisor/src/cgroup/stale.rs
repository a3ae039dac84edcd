//! Worker cgroups left by supervisors that died (SIGKILL gives them no chance to clean up),
//! and the names that let a later supervisor tell them from a live supervisor's.
//!
//! A pid alone does not say whether the supervisor that made a cgroup still runs: once it
//! died, any new process may get its pid, and its cgroups then looked alive for as long as
//! that process lived. A pid and the time its process started (clock ticks after boot,
//! field 22 of `/proc/<pid>/stat`) name one process until the machine restarts, and no
//! cgroup outlives that; so a worker cgroup is named `airlock-<pid>-<start>-<n>`, and its
//! supervisor counts as alive only while `/proc/<pid>/stat` shows that start time.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::CgroupParent;
use super::files::read_whole;

/// The name of this process's `n`th worker cgroup: `airlock-<pid>-<start>-<n>`. Should
/// this process's start time be unreadable, `airlock-<pid>-<n>`, which a sweep leaves
/// alone for as long as any process has that pid (it cannot tell more).
pub fn worker_cgroup_name(n: u64) -> String {
    let pid = std::process::id();
    match own_start_time() {
        Some(start) => format!("airlock-{pid}-{start}-{n}"),
        None => format!("airlock-{pid}-{n}"),
    }
}

fn own_start_time() -> Option<u64> {
    static START: OnceLock<Option<u64>> = OnceLock::new();
    *START.get_or_init(|| {
        fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|stat| start_time(&stat))
    })
}

/// Field 22 of a `/proc/<pid>/stat` line: when the process started, in clock ticks after
/// boot. Counted after the last `)`: the second field, the command name in parentheses,
/// may hold spaces and parentheses of its own.
fn start_time(stat: &str) -> Option<u64> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// Who made a worker cgroup, read from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Maker {
    pid: u32,
    /// `None` in names made without it (`airlock-<pid>-<n>`).
    start: Option<u64>,
}

/// The maker of the worker cgroup called `name`, `None` for any other name.
fn maker_of(name: &str) -> Option<Maker> {
    let fields: Vec<&str> = name.strip_prefix("airlock-")?.split('-').collect();
    let number = |text: &str| {
        text.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| text.parse::<u64>().ok())
            .flatten()
    };
    let (pid, start, n) = match fields.as_slice() {
        [pid, start, n] => (pid, Some(number(start)?), n),
        [pid, n] => (pid, None, n),
        _ => return None,
    };
    number(n)?;
    let pid = u32::try_from(number(pid)?).ok()?;
    Some(Maker { pid, start })
}

/// Whether `maker` still runs, as far as `proc_root` (a procfs) tells: its pid is there
/// and, where the name recorded one, with that start time. When this cannot be told (a
/// stat unreadable for another reason than the process being gone, or unparsable) it
/// counts as alive: its cgroups are kept rather than taken from a live supervisor.
fn is_alive(proc_root: &Path, maker: Maker) -> bool {
    let stat = match read_whole(&proc_root.join(maker.pid.to_string()).join("stat")) {
        Ok(stat) => stat,
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            return false;
        }
        Err(_) => return true,
    };
    match (maker.start, start_time(&stat)) {
        (Some(recorded), Some(now)) => recorded == now,
        _ => true,
    }
}

impl CgroupParent {
    /// Removes the worker cgroups whose supervisor is gone (see the module's
    /// documentation), and returns them. rmdir fails harmlessly on a cgroup that still
    /// holds a process.
    pub fn remove_stale_worker_cgroups(&self) -> Vec<PathBuf> {
        self.remove_stale_worker_cgroups_with(Path::new("/proc"), std::process::id())
    }

    /// [`CgroupParent::remove_stale_worker_cgroups`] with the procfs at `proc_root`, for
    /// a supervisor whose pid is `own_pid` (whose cgroups are never stale).
    fn remove_stale_worker_cgroups_with(&self, proc_root: &Path, own_pid: u32) -> Vec<PathBuf> {
        let mut removed = Vec::new();
        // A live supervisor has cgroups in every hierarchy, and reused ones besides: its
        // stat is read once a scan, not once a cgroup.
        let mut alive: HashMap<Maker, bool> = HashMap::new();
        for dir in self.dirs() {
            let Ok(entries) = fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(maker) = name.to_str().and_then(maker_of) else {
                    continue;
                };
                if maker.pid == own_pid
                    || *alive
                        .entry(maker)
                        .or_insert_with(|| is_alive(proc_root, maker))
                {
                    continue;
                }
                let path = entry.path();
                match self.ops.remove_dir(&path) {
                    Ok(()) => {
                        tracing::info!(cgroup = %path.display(), "removed a stale worker cgroup");
                        removed.push(path);
                    }
                    Err(e) => {
                        tracing::debug!(cgroup = %path.display(), error = %e, "stale worker cgroup not removed");
                    }
                }
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::super::fake_tree::{FakeTree, hybrid_parent, hybrid_tree};
    use super::*;

    /// A `/proc/<pid>/stat` line started at `start`, with a command name that holds
    /// spaces and parentheses (which a split on white space alone would miscount).
    fn stat_line(pid: u32, start: u64) -> String {
        format!(
            "{pid} (tool (x) y) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
             {start} 1000000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
        )
    }

    #[test]
    fn the_start_time_is_field_22_counted_after_the_command_name() {
        assert_eq!(start_time(&stat_line(7, 123_456)), Some(123_456));
        assert_eq!(start_time("7 (x) S 1"), None);
        let own = fs::read_to_string("/proc/self/stat").unwrap();
        assert_eq!(start_time(&own), own_start_time());
        assert!(own_start_time().is_some());
    }

    #[test]
    fn worker_cgroup_names_record_pid_and_start_and_parse_back() {
        let name = worker_cgroup_name(5);
        assert_eq!(
            maker_of(&name),
            Some(Maker {
                pid: std::process::id(),
                start: own_start_time(),
            })
        );
        assert_eq!(
            maker_of("airlock-12-34"),
            Some(Maker {
                pid: 12,
                start: None
            })
        );
        for other in [
            "airlock-supervisor",
            "airlock-workers",
            "airlock-12",
            "airlock-12-34-x",
            "airlock-12-34-5-6",
            "airlock--1-2",
            "airlock-+1-2",
            "airlock-99999999999-1-2",
            "other-12-34",
        ] {
            assert_eq!(maker_of(other), None, "{other}");
        }
    }

    /// A fake procfs where `live` runs, started at `start`.
    fn fake_proc(tree: &FakeTree, live: u32, start: u64) -> PathBuf {
        tree.write(&format!("proc/{live}/stat"), &stat_line(live, start));
        tree.path("proc")
    }

    #[test]
    fn a_supervisor_pid_reused_by_another_process_leaves_its_cgroups_stale() {
        let tree = hybrid_tree();
        let parent = hybrid_parent(&tree);
        let (live, start, dead, own) = (300, 5000, 301, 302);
        let proc_root = fake_proc(&tree, live, start);
        let names = [
            (format!("airlock-{live}-{start}-0"), true),
            // The pid is alive, but the process behind it started later: reused.
            (format!("airlock-{live}-{}-1", start - 1), false),
            (format!("airlock-{dead}-{start}-2"), false),
            // Names without a start time: a live pid keeps them, as before.
            (format!("airlock-{live}-3"), true),
            (format!("airlock-{dead}-4"), false),
            (format!("airlock-{own}-1-5"), true),
            ("airlock-supervisor".to_string(), true),
            ("unrelated".to_string(), true),
        ];
        for dir in parent.dirs() {
            for (name, _) in &names {
                fs::create_dir(dir.join(name)).unwrap();
            }
        }
        let removed = parent.remove_stale_worker_cgroups_with(&proc_root, own);
        assert_eq!(removed.len(), 3 * parent.dirs().len(), "{removed:?}");
        for dir in parent.dirs() {
            for (name, kept) in &names {
                assert_eq!(
                    dir.join(name).exists(),
                    *kept,
                    "{name} in {}",
                    dir.display()
                );
            }
        }
    }

    #[test]
    fn a_maker_whose_stat_cannot_be_read_or_parsed_counts_as_alive() {
        let tree = FakeTree::new();
        tree.write("proc/40/stat", "40 (garbled");
        // A directory where the file should be: reading it fails, but not with ENOENT.
        fs::create_dir_all(tree.path("proc/41/stat")).unwrap();
        let proc_root = tree.path("proc");
        for pid in [40, 41] {
            let maker = Maker {
                pid,
                start: Some(1),
            };
            assert!(is_alive(&proc_root, maker), "{pid}");
        }
        let gone = Maker {
            pid: 42,
            start: Some(1),
        };
        assert!(!is_alive(&proc_root, gone));
    }
}
