//! Sessions' bookkeeping against their storage: limits held while storage is made, and
//! nothing left behind by an open that fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock_policy::validate::SessionPolicy;

use super::{SessionError, Sessions, reserve::Reservation};
use crate::clock::SystemClock;

/// A private directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("airlock-session-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sessions(state: &Path) -> Sessions {
    Sessions::new(state, (65_534, 65_534), Arc::new(SystemClock)).unwrap()
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

#[test]
fn an_open_in_progress_counts_against_max_sessions() {
    let scratch = Scratch::new("reserve");
    let state = scratch.0.join("state");
    let sessions = sessions(&state);
    let policy = SessionPolicy {
        max_sessions: 1,
        ..SessionPolicy::default()
    };
    // An open that has its place and is still making its storage, as when it copies a
    // large base: a second open is refused before it makes anything.
    let in_progress = Reservation::take(&sessions.opening, sessions.count(), 1).unwrap();
    let refused = sessions.open(&policy, None, Some(1 << 20), 1 << 20);
    assert!(
        matches!(refused, Err(SessionError::Limit { max: 1 })),
        "{refused:?}"
    );
    assert!(entries(&state).is_empty(), "the refused open made storage");
    drop(in_progress);

    // Its place back, an open succeeds; one that fails gives its place back too.
    let bad = sessions.open(&policy, Some("/nonexistent-base"), Some(1 << 20), 1 << 20);
    assert!(matches!(bad, Err(SessionError::Invalid { .. })), "{bad:?}");
    let opened = sessions
        .open(&policy, None, Some(1 << 20), 1 << 20)
        .unwrap();
    assert!(matches!(
        sessions.open(&policy, None, Some(1 << 20), 1 << 20),
        Err(SessionError::Limit { max: 1 })
    ));
    sessions.close(&opened.session).unwrap();
    assert!(sessions.open(&policy, None, Some(1 << 20), 1 << 20).is_ok());
    sessions.close_all();
    assert!(entries(&state).is_empty());
}

/// Mount points under `dir` in this process's mount namespace.
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|line| line.split(' ').nth(4).map(str::to_string))
        .filter(|point| point.starts_with(&prefix))
        .collect()
}

#[test]
fn an_open_whose_base_cannot_be_opened_leaves_no_storage_or_mount() {
    let scratch = Scratch::new("base-gone");
    let state = scratch.0.join("state");
    let sessions = sessions(&state);
    let policy = SessionPolicy::default();
    // A base that passed the check and was then removed (or swapped for a symlink)
    // before the open reached it.
    let gone = super::base::Base {
        root: scratch.0.join("bases"),
        rel: "project".into(),
    };
    let made = sessions.make_storage("gone", Some(&gone), &policy, 1 << 20);
    assert!(made.is_err(), "a base that is not there was opened");
    assert!(entries(&state).is_empty(), "{:?}", entries(&state));
    assert!(
        mounts_under(&state).is_empty(),
        "{:?}",
        mounts_under(&state)
    );
}

#[test]
fn a_base_outside_the_policys_bases_is_refused_alike_whether_it_exists_or_not() {
    let scratch = Scratch::new("oracle");
    let bases = scratch.0.join("bases");
    std::fs::create_dir_all(bases.join("project")).unwrap();
    let sessions = sessions(&scratch.0.join("state"));
    let policy = SessionPolicy {
        bases: vec![bases.display().to_string()],
        ..SessionPolicy::default()
    };
    let refusal = |base: &str| match sessions.open(&policy, Some(base), Some(1 << 20), 1 << 20) {
        Err(error) => (error.kind(), error.to_string()),
        Ok(opened) => panic!("{base} was opened: {opened:?}"),
    };
    let outside = refusal("/root");
    for base in [
        "/root/nonexistent-xyz",
        "/etc/shadow",
        "/nonexistent-xyz/deeper",
    ] {
        assert_eq!(refusal(base), outside, "{base}");
    }
    assert!(outside.1.contains("not under"), "{outside:?}");
    // `..` is not resolved to find out where it leads: refused before any look.
    let dotted = format!("{}/../../root", bases.display());
    assert_eq!(refusal(&dotted).0, "invalid_request");
    // Under an allowed base, what is not there is said so.
    let missing = refusal(&format!("{}/missing", bases.display()));
    assert!(missing.1.contains("does not exist"), "{missing:?}");
    let opened = sessions
        .open(
            &policy,
            Some(&format!("{}/project", bases.display())),
            Some(1 << 20),
            1 << 20,
        )
        .unwrap();
    sessions.close(&opened.session).unwrap();
}
