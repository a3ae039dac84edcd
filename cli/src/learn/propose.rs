//! From what a learning run observed to what the profile needs: the paths it read, wrote
//! and executed that its base profile does not already grant, collapsed to sensible
//! directories (never `/`, a home directory or a top-level tree like `/etc` wholesale), the
//! syscalls it made outside the allowlist, limits with headroom over what it used, and
//! the destinations it asked the egress proxy for ([`super::network`]).
//! Pure apart from the [`Host`] it asks about paths, so every rule is tested on a fake.

use std::collections::BTreeMap;

use airlock::observe::{Access, Observations};
use airlock_policy::validated::Profile;

use super::network::{NetworkProposal, propose_network};

/// What the learner asks of the host's filesystem.
pub(super) trait Host {
    /// Whether `path` exists, and is a directory.
    fn kind(&self, path: &str) -> Option<PathKind>;
    /// `path` with every symlink resolved, when it exists.
    fn resolve(&self, path: &str) -> Option<String>;
}

/// What a host path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PathKind {
    Directory,
    Other,
}

/// Directories never granted whole, however many of their files a command used: a grant
/// below them names the files, or a directory below them.
const TOO_BROAD: [&str; 16] = [
    "/",
    "/etc",
    "/var",
    "/usr",
    "/opt",
    "/srv",
    "/home",
    "/root",
    "/run",
    "/mnt",
    "/media",
    "/var/lib",
    "/var/cache",
    "/usr/lib",
    "/usr/share",
    "/usr/local",
];

/// Syscalls that only look a path up: a directory seen only through them on the way to a
/// grant needs no grant of its own.
const LOOKUPS: [&str; 8] = [
    "stat",
    "lstat",
    "newfstatat",
    "statx",
    "access",
    "faccessat",
    "faccessat2",
    "readlink",
];

/// Trees that are the sandbox's own, not the host's: never granted.
const PSEUDO: [&str; 3] = ["/proc", "/dev", "/sys"];

/// One grant to add, with the evidence for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Grant {
    pub(super) path: String,
    /// The observed uses behind it, e.g. `openat /etc/ssl/openssl.cnf (2x)`, at most a few.
    pub(super) evidence: Vec<String>,
}

/// What the profile needs beyond its base.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Proposal {
    pub(super) read: Vec<Grant>,
    pub(super) write: Vec<Grant>,
    /// Syscalls to add to `syscalls.allow`, with how often each was made.
    pub(super) syscalls: Vec<(String, u64)>,
    /// Memory limit, with headroom over the peak seen.
    pub(super) memory_bytes: Option<u64>,
    /// Network entries, from the destinations asked of the proxy (its notes are moved to
    /// `notes`).
    pub(super) network: NetworkProposal,
    /// Things seen and not granted, for the reviewer.
    pub(super) notes: Vec<String>,
}

/// Most pieces of evidence quoted per grant.
const EVIDENCE_QUOTED: usize = 3;

/// What the command needs beyond `base`. `writable` are the directories the learner made
/// writable (`--write`): a write is granted only inside one of them, as that directory.
pub(super) fn propose(
    base: &Profile,
    observed: &Observations,
    writable: &[String],
    peak_memory_bytes: Option<u64>,
    host: &dyn Host,
) -> Proposal {
    let mut proposal = Proposal::default();
    let mut reads: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut writes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut refused_writes: Vec<String> = Vec::new();
    let mut too_broad: Vec<String> = Vec::new();
    for ((path, access), evidence) in &observed.paths {
        let quote = format!("{} {path} ({}x)", evidence.syscall, evidence.count);
        if is_under_any(path, PSEUDO.iter().copied()) {
            continue;
        }
        if let Some(dir) = writable.iter().find(|w| is_under(path, w)) {
            let into = if *access == Access::Write {
                &mut writes
            } else {
                &mut reads
            };
            into.entry(dir.clone()).or_default().push(quote);
            continue;
        }
        if sandbox_own(base, path) {
            continue;
        }
        if *access == Access::Write {
            // Outside the writable directories the learning run's view was read-only.
            if host.kind(path).is_some() && !granted(base, path) {
                refused_writes.push(path.clone());
            }
            continue;
        }
        let mut targets = vec![path.clone()];
        if let Some(real) = host.resolve(path).filter(|real| real != path) {
            targets.push(real);
        }
        for target in targets {
            if granted(base, &target) {
                continue;
            }
            let Some(kind) = host.kind(&target) else {
                continue; // looked for and missing: it is missing in the sandbox too
            };
            match grant_for(&target, kind) {
                Some(grant) => reads.entry(grant).or_default().push(quote.clone()),
                None => too_broad.push(target),
            }
        }
    }
    // A directory written is granted writable; read-only too would be the same bind twice.
    reads.retain(|dir, _| !writes.contains_key(dir));
    // A directory only looked up (stat, access) on the way to another grant exists in the
    // sandbox anyway, as that grant's parent: granting it would bind all it holds.
    let others: Vec<String> = reads
        .keys()
        .chain(writes.keys())
        .cloned()
        .chain(base.read.iter().chain(&base.write).map(|g| g.path.clone()))
        .collect();
    reads.retain(|dir, evidence| {
        let lookups_only = evidence.iter().all(|quote| {
            LOOKUPS
                .iter()
                .any(|syscall| quote.starts_with(&format!("{syscall} ")))
        });
        let ancestor = others
            .iter()
            .any(|other| other != dir && is_under(other, dir));
        !(lookups_only && ancestor)
    });
    proposal.read = collapse(reads);
    proposal.write = collapse(writes);
    proposal.syscalls = observed
        .outside_allowlist
        .iter()
        .map(|(name, count)| ((*name).to_string(), *count))
        .collect();
    proposal.memory_bytes = peak_memory_bytes.map(memory_with_headroom);
    refused_writes.sort();
    refused_writes.dedup();
    for path in refused_writes {
        proposal.notes.push(format!(
            "not granted: a write to {path} (read-only while learning; give --write DIR to grant a directory)"
        ));
    }
    // Every program looks `/` up; saying so would only be noise.
    too_broad.retain(|path| path != "/");
    too_broad.sort();
    too_broad.dedup();
    for path in too_broad {
        proposal.notes.push(format!(
            "not granted: {path} itself (too broad to grant whole)"
        ));
    }
    proposal.network = propose_network(base, observed);
    proposal.notes.append(&mut proposal.network.notes);
    if observed.unreadable > 0 {
        proposal.notes.push(format!(
            "{} path argument(s) could not be read (null or unmapped)",
            observed.unreadable
        ));
    }
    if observed.dropped > 0 {
        proposal.notes.push(format!(
            "{} observation(s) past the learner's bounds were not kept",
            observed.dropped
        ));
    }
    proposal
}

/// The grant for a used host path: its directory, unless that is too broad, then the path
/// itself; a directory that is too broad itself gets nothing.
fn grant_for(path: &str, kind: PathKind) -> Option<String> {
    let broad = |dir: &str| TOO_BROAD.contains(&dir) || is_home(dir);
    match kind {
        PathKind::Directory if broad(path) => None,
        PathKind::Directory => Some(path.to_string()),
        PathKind::Other => {
            let parent = parent_of(path);
            if broad(parent) {
                Some(path.to_string())
            } else {
                Some(parent.to_string())
            }
        }
    }
}

/// `/home/NAME` or `/root`: a home directory.
fn is_home(dir: &str) -> bool {
    dir == "/root"
        || dir
            .strip_prefix("/home/")
            .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'))
}

fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// Whether `path` is `dir` or below it, by whole components.
fn is_under(path: &str, dir: &str) -> bool {
    dir == "/"
        || path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

fn is_under_any<'a>(path: &str, dirs: impl IntoIterator<Item = &'a str>) -> bool {
    dirs.into_iter().any(|dir| is_under(path, dir))
}

/// Whether the base profile already makes `path` visible.
fn granted(base: &Profile, path: &str) -> bool {
    is_under_any(
        path,
        base.read
            .iter()
            .chain(&base.write)
            .map(|grant| grant.path.as_str()),
    )
}

/// Whether `path` is in a mount the sandbox makes itself (a tmpfs, the workspace).
fn sandbox_own(base: &Profile, path: &str) -> bool {
    is_under_any(path, base.tmpfs.iter().map(|(dir, _)| dir.as_str()))
        || base
            .workspace
            .as_ref()
            .is_some_and(|w| is_under(path, &w.path))
}

/// Grants with their evidence, dropping any below another grant.
fn collapse(grants: BTreeMap<String, Vec<String>>) -> Vec<Grant> {
    let mut kept: Vec<Grant> = Vec::new();
    for (path, mut evidence) in grants {
        evidence.sort();
        evidence.dedup();
        if let Some(parent) = kept.iter_mut().find(|g| is_under(&path, &g.path)) {
            parent.evidence.extend(evidence);
            continue;
        }
        kept.push(Grant { path, evidence });
    }
    for grant in &mut kept {
        grant.evidence.truncate(EVIDENCE_QUOTED);
    }
    kept
}

/// Twice the peak, rounded up to 16 MiB, at least 64 MiB.
fn memory_with_headroom(peak: u64) -> u64 {
    const STEP: u64 = 16 << 20;
    let doubled = peak.saturating_mul(2).max(64 << 20);
    doubled.div_ceil(STEP).saturating_mul(STEP)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::collections::BTreeSet;

    use airlock::observe::Evidence;
    use airlock_policy::validated::PathGrant;

    use super::*;

    struct FakeHost {
        dirs: BTreeSet<&'static str>,
        files: BTreeSet<&'static str>,
        links: BTreeMap<&'static str, &'static str>,
    }

    impl Host for FakeHost {
        fn kind(&self, path: &str) -> Option<PathKind> {
            if self.dirs.contains(path) {
                Some(PathKind::Directory)
            } else if self.files.contains(path) {
                Some(PathKind::Other)
            } else {
                None
            }
        }
        fn resolve(&self, path: &str) -> Option<String> {
            self.links
                .get(path)
                .map(|p| p.to_string())
                .or_else(|| self.kind(path).map(|_| path.to_string()))
        }
    }

    fn host() -> FakeHost {
        FakeHost {
            dirs: [
                "/etc",
                "/etc/ssl",
                "/home/ann",
                "/srv/data",
                "/ws",
                "/ws/.git",
                "/usr",
            ]
            .into(),
            files: [
                "/etc/gitconfig",
                "/etc/ssl/openssl.cnf",
                "/home/ann/.gitconfig",
                "/srv/data/input.txt",
                "/usr/bin/python3",
                "/etc/localtime",
                "/usr/share/zoneinfo/UTC",
            ]
            .into(),
            links: [("/etc/localtime", "/usr/share/zoneinfo/UTC")].into(),
        }
    }

    fn base() -> Profile {
        let loaded = airlock_policy::parse_policy_str(
            airlock_policy::presets::preset_text("default").unwrap(),
            "default.toml",
        )
        .unwrap();
        let source = airlock_policy::Source::new(
            "default.toml",
            airlock_policy::presets::preset_text("default").unwrap(),
        );
        let (mut valid, _) = airlock_policy::validate::validate_policy(&loaded, source).unwrap();
        let mut profile = valid.profiles.remove("default").unwrap();
        profile.read.push(PathGrant {
            path: "/usr".into(),
            optional: false,
        });
        profile
    }

    fn saw(entries: &[(&str, Access, &'static str)]) -> Observations {
        let mut observed = Observations::default();
        for (path, access, syscall) in entries {
            observed
                .paths
                .insert((path.to_string(), *access), Evidence { syscall, count: 1 });
        }
        observed
    }

    fn paths(grants: &[Grant]) -> Vec<&str> {
        grants.iter().map(|g| g.path.as_str()).collect()
    }

    #[test]
    fn a_file_is_granted_by_its_directory_unless_that_is_too_broad() {
        let observed = saw(&[
            ("/etc/ssl/openssl.cnf", Access::Read, "openat"),
            ("/etc/gitconfig", Access::Read, "openat"),
            ("/home/ann/.gitconfig", Access::Read, "newfstatat"),
            ("/srv/data/input.txt", Access::Read, "openat"),
            ("/usr/bin/python3", Access::Exec, "execve"),
        ]);
        let proposal = propose(&base(), &observed, &[], None, &host());
        assert_eq!(
            paths(&proposal.read),
            [
                "/etc/gitconfig",
                "/etc/ssl",
                "/home/ann/.gitconfig",
                "/srv/data"
            ]
        );
        assert_eq!(
            proposal.read[1].evidence,
            ["openat /etc/ssl/openssl.cnf (1x)"]
        );
    }

    #[test]
    fn nothing_is_granted_wholesale_nor_what_is_missing_pseudo_or_the_sandboxs_own() {
        let observed = saw(&[
            ("/etc", Access::Read, "openat"),
            ("/home/ann", Access::Read, "openat"),
            ("/", Access::Read, "newfstatat"),
            ("/etc/missing.conf", Access::Read, "openat"),
            ("/proc/self/maps", Access::Read, "openat"),
            ("/tmp/scratch", Access::Write, "openat"),
        ]);
        let proposal = propose(&base(), &observed, &[], None, &host());
        assert!(proposal.read.is_empty(), "{proposal:?}");
        assert!(proposal.write.is_empty(), "{proposal:?}");
        assert!(
            proposal.notes.iter().any(|n| n.contains("/etc itself")),
            "{proposal:?}"
        );
    }

    #[test]
    fn a_symlinks_target_is_granted_too() {
        let observed = saw(&[("/etc/localtime", Access::Read, "openat")]);
        let proposal = propose(&base(), &observed, &[], None, &host());
        // /etc/localtime is in the base; its target under /usr is too.
        assert!(proposal.read.is_empty(), "{proposal:?}");
    }

    #[test]
    fn writes_are_granted_only_as_the_writable_directory_they_fell_in() {
        let observed = saw(&[
            ("/ws/.git/HEAD", Access::Write, "openat"),
            ("/ws/.git", Access::Read, "newfstatat"),
            ("/etc/gitconfig", Access::Write, "openat"),
        ]);
        let proposal = propose(&base(), &observed, &["/ws".into()], None, &host());
        assert_eq!(paths(&proposal.write), ["/ws"]);
        assert!(proposal.read.is_empty(), "{proposal:?}");
        assert!(
            proposal
                .notes
                .iter()
                .any(|n| n.contains("a write to /etc/gitconfig")),
            "{proposal:?}"
        );
    }

    #[test]
    fn a_directory_only_looked_up_on_the_way_to_a_grant_is_not_granted() {
        let mut host = host();
        host.dirs.insert("/srv");
        let observed = saw(&[
            ("/srv/data", Access::Read, "newfstatat"),
            ("/srv/data/input.txt", Access::Read, "openat"),
            ("/ws", Access::Read, "newfstatat"),
            ("/ws/.git/HEAD", Access::Write, "openat"),
        ]);
        let proposal = propose(&base(), &observed, &["/ws".into()], None, &host);
        assert_eq!(paths(&proposal.read), ["/srv/data"]);
        assert_eq!(paths(&proposal.write), ["/ws"]);
    }

    #[test]
    fn syscalls_outside_the_allowlist_and_memory_headroom_are_proposed() {
        let mut observed = Observations::default();
        observed.outside_allowlist.insert("sched_setattr", 2);
        let proposal = propose(&base(), &observed, &[], Some(40 << 20), &host());
        assert_eq!(proposal.syscalls, [("sched_setattr".to_string(), 2)]);
        assert_eq!(proposal.memory_bytes, Some(80 << 20));
        assert_eq!(memory_with_headroom(1), 64 << 20);
    }
}
