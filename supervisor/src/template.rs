//! Root templates: a profile's read-only root, built once and cloned by every pooled
//! worker instead of built by each.
//!
//! Building the root was most of a worker's set-up: a copy of the host's mount table at
//! clone, a dozen binds, symlinks and directories in a fresh tmpfs, `pivot_root` and the
//! detach of the host's mounts, and their teardown at exit — about a sixth of a pooled
//! call's CPU. With a template, one worker (the *holder*) builds the part of the plan that
//! is the same for every worker, exactly as any worker would, and a spawner thread enters
//! its mount namespace for good ([`crate::spawn::Spawner::start_template`]); the holder is
//! then killed. Every worker that thread clones gets a copy of a namespace holding only the
//! template's mounts — locked by the kernel, since the copy belongs to the worker's new user
//! namespace — and adds what must be its own: the plan's tmpfs mounts, and a procfs of its
//! pid namespace over the template's (the holder's, empty once it is gone; the kernel lets
//! a user namespace mount a procfs only where one is fully visible already).
//!
//! Shared between workers, the template holds nothing of its own that a worker could
//! change: its root tmpfs is read-only at the superblock, read-only binds are read-only
//! mounts that the workers' copies cannot make writable (locked), and a writable bind is
//! the host's directory itself, which every worker's own bind of it would be too. A plan
//! with a step below a per-worker mount is built per worker as before. So is every worker
//! of an unprivileged supervisor (entering another mount namespace needs CAP_SYS_ADMIN)
//! and of a kernel without `setns` on a pidfd (5.8).
//!
//! A bind holds the inode it was made of: what changes in it shows through, but a file the
//! host replaces by rename (an updated `ld.so.cache`, certificates), or a directory
//! replaced or mounted over, would stay old in the template; so would a step inside a
//! writable bind that a tool removed or replaced (with a symlink, say, which a worker
//! building its own root would refuse). So the identity (device, inode, type) of every
//! component of every path the root was built from — each source, and the host path
//! behind each step inside a writable bind — is taken before the holder is spawned and
//! compared again each time the template is about to give workers, before they are
//! cloned; on any change the template is dropped and built again by the same walk. A
//! worker made after a change sees it, as one building its own root would. (The change
//! time is left out on purpose: a workspace directory's changes whenever a tool creates a
//! file in it. Pooled workers made before a change keep their view, as they always did.)

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use airlock_policy::CompiledProfile;
use airlock_protocol::MountOp;

use crate::spawn::{TemplateSpawner, WorkerNetwork};

/// How long a profile whose template could not be built waits for the next attempt (a
/// failed attempt may have cost a holder worker).
pub const RETRY: Duration = Duration::from_secs(30);

/// How long a build may stay claimed before another caller may build again: longer than a
/// holder's set-up may take (10 s), so only a build whose caller was dropped midway (a
/// cancelled call building one) leaves a claim this old.
pub const BUILD_CLAIM: Duration = Duration::from_secs(30);

/// Why a profile has no template (its workers then build their own roots).
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// Entering another process's mount namespace needs CAP_SYS_ADMIN.
    #[error("an unprivileged supervisor cannot enter a template's namespace")]
    Unprivileged,
    /// The plan has a step a template cannot reproduce.
    #[error("the mount plan has a step at or below a tmpfs or procfs mount")]
    PlanNotSplittable,
    /// The holder did not get as far as waiting with its root built.
    #[error("the template's holder: {0}")]
    Holder(String),
    /// The spawner thread could not enter the holder's namespaces.
    #[error(transparent)]
    Spawner(#[from] crate::spawn::SpawnError),
    /// The workers' setup frames could not be encoded.
    #[error("cannot encode the template workers' setup: {0}")]
    Encode(#[from] airlock_protocol::FrameError),
}

/// A profile's mount plan split for a template: what the holder builds, and what each
/// worker mounts on top.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitPlan {
    /// The plan without its tmpfs mounts, with a directory for each of their mount points.
    pub template: Vec<MountOp>,
    /// The tmpfs and procfs mounts, in plan order.
    pub per_worker: Vec<MountOp>,
}

fn is_at_or_below(path: &str, top: &str) -> bool {
    let top = top.trim_end_matches('/');
    path == top || (path.starts_with(top) && path[top.len()..].starts_with('/'))
}

/// Splits `plan`, or `None` where a template would not give the same root: a step at or
/// below a per-worker mount (it would be covered), or per-worker mounts inside one another.
pub fn split_plan(plan: &[MountOp]) -> Option<SplitPlan> {
    let per_worker_target = |op: &MountOp| match op {
        MountOp::Tmpfs { target, .. } | MountOp::Proc { target, .. } => Some(target.clone()),
        _ => None,
    };
    let tops: Vec<String> = plan.iter().filter_map(per_worker_target).collect();
    for (i, a) in tops.iter().enumerate() {
        if a == "/"
            || tops
                .iter()
                .skip(i + 1)
                .any(|b| is_at_or_below(a, b) || is_at_or_below(b, a))
        {
            return None;
        }
    }
    let mut split = SplitPlan {
        template: Vec::new(),
        per_worker: Vec::new(),
    };
    for op in plan {
        let path = match op {
            MountOp::Bind { target, .. } | MountOp::Dev { target } => target,
            MountOp::Symlink { path, .. } | MountOp::Dir { path, .. } => path,
            MountOp::Tmpfs { target, .. } => {
                split.template.push(MountOp::Dir {
                    path: target.clone(),
                    mode: 0o755,
                });
                split.per_worker.push(op.clone());
                continue;
            }
            MountOp::Proc { target, .. } => {
                // The holder's procfs is what makes each worker's own allowed, and only
                // while nothing is mounted in it: a worker's copy of a mask would be locked,
                // and a procfs with a locked mount over a file or a non-empty directory is
                // not "fully visible", so the kernel would refuse the worker's. Each worker
                // masks its own procfs.
                split.template.push(MountOp::Proc {
                    target: target.clone(),
                    hide: Vec::new(),
                });
                split.per_worker.push(op.clone());
                continue;
            }
        };
        if tops.iter().any(|top| is_at_or_below(path, top)) {
            return None;
        }
        split.template.push(op.clone());
    }
    Some(split)
}

/// What a template's content depends on: a host path and what was there.
type SourceIdentity = (String, Option<(u64, u64, u32)>);

fn identify(path: &str) -> SourceIdentity {
    use std::os::unix::fs::MetadataExt;
    let id = std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.mode() & libc::S_IFMT));
    (path.to_string(), id)
}

/// The identities, now, of every component of every host path `plan` builds from: bind
/// sources, the devices of `/dev`, and the host path behind each step inside a writable
/// bind (its mount point or entry lives in the host's directory).
pub fn source_identities(plan: &[MountOp]) -> Vec<SourceIdentity> {
    let writable: Vec<(&str, &str)> = plan
        .iter()
        .filter_map(|op| match op {
            MountOp::Bind {
                source,
                target,
                writable: true,
                ..
            } => Some((target.as_str(), source.as_str())),
            _ => None,
        })
        .collect();
    let mut paths = std::collections::BTreeSet::new();
    let mut add = |path: &str| {
        let mut prefix = String::new();
        for component in path.split('/').filter(|c| !c.is_empty()) {
            prefix.push('/');
            prefix.push_str(component);
            paths.insert(prefix.clone());
        }
    };
    for op in plan {
        let target = match op {
            MountOp::Bind { source, target, .. } => {
                add(source);
                target
            }
            MountOp::Dev { target } => {
                for device in ["null", "zero", "full", "random", "urandom"] {
                    add(&format!("/dev/{device}"));
                }
                target
            }
            MountOp::Tmpfs { target, .. } | MountOp::Proc { target, .. } => target,
            MountOp::Symlink { path, .. } | MountOp::Dir { path, .. } => path,
        };
        for (top, host) in &writable {
            if target != top && is_at_or_below(target, top) {
                let below = &target[top.trim_end_matches('/').len()..];
                add(&format!("{}{below}", host.trim_end_matches('/')));
            }
        }
    }
    paths.iter().map(|p| identify(p)).collect()
}

/// A built template: the spawner thread living in its mount namespace, the frames its
/// workers get, and what it was built from.
#[derive(Debug)]
pub struct RootTemplate {
    /// Clones workers from the template's namespace.
    pub spawner: TemplateSpawner,
    /// Hello and Setup (root from the template, the per-worker plan), encoded once.
    pub frames: Arc<[u8]>,
    sources: Vec<SourceIdentity>,
}

impl RootTemplate {
    /// A template of sources taken as `sources` (before the holder was spawned).
    pub fn new(spawner: TemplateSpawner, frames: Arc<[u8]>, sources: Vec<SourceIdentity>) -> Self {
        Self {
            spawner,
            frames,
            sources,
        }
    }

    /// Whether every path is still what the template was built from.
    pub fn is_current(&self) -> bool {
        self.sources
            .iter()
            .all(|(path, id)| identify(path).1 == *id)
    }
}

/// One profile's template state, by profile identity and network namespace kind.
#[derive(Debug)]
enum State {
    Ready(Arc<RootTemplate>),
    /// Building it failed at this time (plan, privileges, kernel, or a holder that did
    /// not make it): tried again after [`RETRY`].
    Unavailable(Instant),
    /// Claimed by the caller that found none at this time, which builds it; other callers
    /// build their own roots meanwhile rather than a second template.
    Building(Instant),
}

/// Templates by profile identity, bounded like the pool keys: each entry holds its `Arc`,
/// so the address is not reused.
#[derive(Debug, Default)]
pub struct Templates(Mutex<Vec<(Arc<CompiledProfile>, WorkerNetwork, State)>>);

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// A current template.
    Ready(Arc<RootTemplate>),
    /// Tried lately and not possible.
    Unavailable,
    /// Another caller is building it.
    Building,
    /// None yet, or it was stale (and is forgotten now): this caller builds one, and must
    /// [`Templates::record`] what it got.
    Missing,
}

impl Templates {
    const MAX: usize = 64;

    /// The template of `profile` for `network` workers. A `Missing` answer claims the
    /// build for this caller: until it records the outcome (or [`BUILD_CLAIM`] passes),
    /// every other caller is told `Building`.
    pub fn find(&self, profile: &Arc<CompiledProfile>, network: WorkerNetwork) -> Lookup {
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let claim = |known: &mut Vec<_>| {
            if known.len() >= Self::MAX {
                known.clear();
            }
            known.push((
                Arc::clone(profile),
                network,
                State::Building(Instant::now()),
            ));
            Lookup::Missing
        };
        let Some(i) = known
            .iter()
            .position(|(p, n, _)| Arc::ptr_eq(p, profile) && *n == network)
        else {
            return claim(&mut known);
        };
        match &known[i].2 {
            State::Unavailable(since) if since.elapsed() < RETRY => Lookup::Unavailable,
            State::Building(since) if since.elapsed() < BUILD_CLAIM => Lookup::Building,
            State::Unavailable(_) | State::Building(_) => {
                known.swap_remove(i);
                claim(&mut known)
            }
            State::Ready(t) if t.is_current() => Lookup::Ready(Arc::clone(t)),
            State::Ready(_) => {
                tracing::debug!(profile = %profile.name, "a template's source changed; building it again");
                known.swap_remove(i);
                claim(&mut known)
            }
        }
    }

    /// Records what building the template gave.
    pub fn record(
        &self,
        profile: &Arc<CompiledProfile>,
        network: WorkerNetwork,
        template: Option<Arc<RootTemplate>>,
    ) {
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        known.retain(|(p, n, _)| !(Arc::ptr_eq(p, profile) && *n == network));
        if known.len() >= Self::MAX {
            known.clear();
        }
        let state = match template {
            Some(t) => State::Ready(t),
            None => State::Unavailable(Instant::now()),
        };
        known.push((Arc::clone(profile), network, state));
    }

    /// Puts the template of `profile` for `network` workers aside, as if building it had
    /// failed now (its workers keep it alive until they are gone).
    pub fn set_aside(&self, profile: &Arc<CompiledProfile>, network: WorkerNetwork) {
        self.record(profile, network, None);
    }

    /// Templates ready now.
    pub fn ready(&self) -> usize {
        let known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        known
            .iter()
            .filter(|(.., s)| matches!(s, State::Ready(_)))
            .count()
    }

    /// Forgets `profile`'s templates, for every network kind (their threads end with
    /// their last worker): the profile is no longer kept warm.
    pub fn forget(&self, profile: &Arc<CompiledProfile>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(p, ..)| !Arc::ptr_eq(p, profile));
    }

    /// Forgets the templates of every profile but `kept` (their threads end with their
    /// last worker): what a policy reload leaves unused.
    pub fn keep_only(&self, kept: &[Arc<CompiledProfile>]) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(p, ..)| kept.iter().any(|k| Arc::ptr_eq(p, k)));
    }

    /// Forgets every template (their threads end with their last worker).
    pub fn clear(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn bind(source: &str, target: &str, writable: bool) -> MountOp {
        MountOp::Bind {
            source: source.into(),
            target: target.into(),
            writable,
            optional: false,
        }
    }

    fn tmpfs(target: &str) -> MountOp {
        MountOp::Tmpfs {
            target: target.into(),
            size_bytes: 1 << 20,
            mode: 0o1777,
        }
    }

    #[test]
    fn a_read_only_plan_splits_into_the_shared_root_and_the_per_worker_mounts() {
        let proc = MountOp::Proc {
            target: "/proc".into(),
            hide: vec!["cmdline".into()],
        };
        let unmasked_proc = MountOp::Proc {
            target: "/proc".into(),
            hide: Vec::new(),
        };
        let plan = vec![
            bind("/usr", "/usr", false),
            tmpfs("/tmp"),
            proc.clone(),
            MountOp::Dev {
                target: "/dev".into(),
            },
        ];
        let split = split_plan(&plan).unwrap();
        assert_eq!(
            split.template,
            vec![
                bind("/usr", "/usr", false),
                MountOp::Dir {
                    path: "/tmp".into(),
                    mode: 0o755
                },
                // Masks are each worker's: see split_plan.
                unmasked_proc,
                MountOp::Dev {
                    target: "/dev".into()
                },
            ]
        );
        assert_eq!(split.per_worker, vec![tmpfs("/tmp"), proc]);
    }

    #[test]
    fn plans_a_template_cannot_reproduce_are_not_split() {
        // A writable bind is the host's directory for every worker alike: it splits.
        assert!(split_plan(&[bind("/srv", "/srv", true)]).is_some());
        // A step below a per-worker mount would be covered by it.
        assert_eq!(
            split_plan(&[tmpfs("/tmp"), bind("/usr", "/tmp/usr", false)]),
            None
        );
        assert_eq!(
            split_plan(&[
                tmpfs("/work"),
                MountOp::Dir {
                    path: "/work/a".into(),
                    mode: 0o755
                }
            ]),
            None
        );
        // Per-worker mounts inside one another, or over the root.
        assert_eq!(split_plan(&[tmpfs("/tmp"), tmpfs("/tmp/x")]), None);
        assert_eq!(split_plan(&[tmpfs("/")]), None);
        // A sibling that merely shares a prefix is fine.
        assert!(split_plan(&[tmpfs("/tmp"), bind("/tmpdata", "/tmpdata", false)]).is_some());
    }

    fn profile() -> Arc<CompiledProfile> {
        let policy = airlock_policy::load_policy_str(
            "version = 1\n[profiles.p]\nread = [\"/usr\"]\n",
            "t.toml",
        )
        .unwrap()
        .policy;
        Arc::clone(&policy.profiles["p"])
    }

    #[test]
    fn a_missing_template_is_claimed_by_one_caller_and_the_others_wait_their_turn() {
        let templates = Templates::default();
        let (p, q) = (profile(), profile());
        let net = WorkerNetwork::Recycled;
        assert!(matches!(templates.find(&p, net), Lookup::Missing));
        // Concurrent callers build their own roots rather than a second template.
        assert!(matches!(templates.find(&p, net), Lookup::Building));
        assert!(matches!(templates.find(&p, net), Lookup::Building));
        // Another profile (by identity) or network kind is its own claim.
        assert!(matches!(templates.find(&q, net), Lookup::Missing));
        assert!(matches!(
            templates.find(&p, WorkerNetwork::Host),
            Lookup::Missing
        ));
        // The builder failed: nobody tries again before the retry time.
        templates.record(&p, net, None);
        assert!(matches!(templates.find(&p, net), Lookup::Unavailable));
        // A reload that no longer uses `p` forgets it: a later `p` is missing again.
        templates.keep_only(std::slice::from_ref(&q));
        assert!(matches!(templates.find(&p, net), Lookup::Missing));
        assert!(matches!(templates.find(&q, net), Lookup::Building));
    }

    #[test]
    fn a_source_replaced_by_rename_makes_the_template_stale() {
        let dir = std::env::temp_dir().join(format!("airlock-tpl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, "old").unwrap();
        let path = file.to_str().unwrap().to_string();
        let before = source_identities(&[bind(&path, "/f", false)]);
        assert_eq!(before, source_identities(&[bind(&path, "/f", false)]));
        let next = dir.join("f.new");
        std::fs::write(&next, "new").unwrap();
        std::fs::rename(&next, &file).unwrap();
        let after = source_identities(&[bind(&path, "/f", false)]);
        assert_ne!(before, after);
        // What changes inside a directory source leaves it the same source.
        let dir_path = dir.to_str().unwrap().to_string();
        let dir_before = source_identities(&[bind(&dir_path, "/d", true)]);
        std::fs::write(dir.join("written-by-a-tool"), "x").unwrap();
        assert_eq!(
            dir_before,
            source_identities(&[bind(&dir_path, "/d", true)])
        );
        // A step inside a writable bind: the host path behind it counts, and a symlink
        // planted in its place changes it.
        let nested = [bind(&dir_path, "/ws", true), bind("/usr", "/ws/sub", false)];
        std::fs::create_dir(dir.join("sub")).unwrap();
        let with_dir = source_identities(&nested);
        assert!(
            with_dir
                .iter()
                .any(|(p, _)| *p == format!("{dir_path}/sub"))
        );
        std::fs::remove_dir(dir.join("sub")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.join("sub")).unwrap();
        assert_ne!(with_dir, source_identities(&nested));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
