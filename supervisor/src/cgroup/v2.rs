//! Making our own v2 cgroup able to hold worker cgroups: the "no internal processes" rule,
//! and the controllers enabled in cgroup.subtree_control.

use std::io;
use std::path::{Path, PathBuf};

use super::files::{read_file, write_file, write_raw};
use super::{CgroupError, Controller, DirOps};

/// The leaf a v2 supervisor moves itself into so its own cgroup may enable controllers.
const SUPERVISOR_LEAF: &str = "airlock-supervisor";
/// The v2 directory under which worker cgroups are created.
const WORKERS_DIR: &str = "airlock-workers";
const ENABLE_HINT: &str = "the cgroup must be delegated to the supervisor and hold no processes \
but the supervisor's own (cgroup v2 \"no internal processes\" rule)";

/// Makes `own` (our v2 cgroup) able to hold worker cgroups and returns the directory to
/// create them in, plus whether the cpu controller is enabled there.
///
/// The "no internal processes" rule: a v2 cgroup holding processes cannot enable
/// controllers for its children. So if our cgroup holds processes and lacks memory/pids in
/// cgroup.subtree_control, this process moves into `<own>/airlock-supervisor` (writing our
/// pid to cgroup.procs moves every thread), then `<own>` and `<own>/airlock-workers` enable
/// the controllers. Idempotent: when we already sit in `airlock-supervisor`, its parent is
/// taken as our own cgroup. Nothing above our own cgroup is written.
pub(super) fn prepare_v2_parent(
    own: &Path,
    pid: u32,
    ops: DirOps,
) -> Result<(PathBuf, bool), CgroupError> {
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
pub(super) fn v2_base(own: &Path) -> &Path {
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
pub(super) fn ensure_controllers_enabled(
    dir: &Path,
    available: &[String],
) -> Result<bool, CgroupError> {
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

pub(super) fn has_all(have: &[String], wanted: &[&str]) -> bool {
    wanted.iter().all(|w| have.iter().any(|h| h == w))
}

pub(super) fn read_controllers(path: &Path) -> Result<Vec<String>, CgroupError> {
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

#[cfg(test)]
mod tests {
    use crate::cgroup::fake_tree::{
        V2_MOUNTINFO, V2_OWN, detect_fake, populate_like_kernel, v2_parent, v2_tree,
    };
    use std::fs;

    #[test]
    fn prepare_v2_parent_moves_supervisor_into_leaf_and_enables_controllers() {
        let tree = v2_tree();
        let own = format!("sys/fs/cgroup{V2_OWN}");
        v2_parent(&tree);
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
        v2_parent(&tree);
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
        let parent = v2_parent(&tree);
        assert!(!tree.path(&format!("{own}/airlock-supervisor")).exists());
        assert_eq!(
            tree.read(&format!("{own}/cgroup.subtree_control")),
            "+memory +pids"
        );
        assert!(!parent.supports_cpu_quota());
    }
}
