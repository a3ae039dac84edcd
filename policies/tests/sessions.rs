//! Session workspaces in the policy: `[sessions]` bounds and profiles' `workspace`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use airlock_policy::{PolicyError, Severity, load_policy_str};

fn errors(text: &str) -> Vec<String> {
    match load_policy_str(text, "p.toml") {
        Err(PolicyError::Invalid { diagnostics, .. }) => diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .map(ToString::to_string)
            .collect(),
        Ok(_) => vec![],
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn a_profile_workspace_and_session_bounds_compile() {
    let text = r#"version = 1
[sessions]
bases = ["/srv/repos"]
max_sessions = 8
idle_timeout = "10m"
max_size = "512MiB"
max_inodes = 1000
[profiles.default]
read = ["/usr"]
workspace = "/workspace"
workspace_size = "64MiB"
"#;
    let loaded = load_policy_str(text, "p.toml").unwrap();
    let sessions = &loaded.policy.sessions;
    assert_eq!(sessions.bases, vec!["/srv/repos".to_string()]);
    assert_eq!(sessions.max_sessions, 8);
    assert_eq!(sessions.idle_timeout, Duration::from_secs(600));
    assert_eq!(sessions.max_size_bytes, 512 << 20);
    assert_eq!(sessions.max_inodes, 1000);
    let profile = &loaded.policy.profiles["default"];
    let workspace = profile.workspace.as_ref().unwrap();
    assert_eq!(workspace.path, "/workspace");
    assert_eq!(workspace.size_bytes, 64 << 20);
    // The shared spec binds nothing there: each session's calls add their own mount.
    let with = airlock_policy::compile::with_workspace(profile, "/state/s1");
    assert_eq!(with.spec.mounts.len(), profile.spec.mounts.len() + 1);
    assert!(with.spec.landlock.write.contains(&"/workspace".to_string()));
}

#[test]
fn the_default_workspace_size_never_exceeds_max_size() {
    let text = r#"version = 1
[sessions]
max_size = "1MiB"
[profiles.default]
workspace = "/w"
"#;
    let loaded = load_policy_str(text, "p.toml").unwrap();
    let workspace = loaded.policy.profiles["default"].workspace.clone().unwrap();
    assert_eq!(workspace.size_bytes, 1 << 20);
}

#[test]
fn bad_session_bounds_are_each_reported() {
    let text = r#"version = 1
[sessions]
bases = ["relative", "/", "/a", "/a"]
max_sessions = 0
idle_timeout = "10ms"
max_size = "1B"
max_inodes = 1
"#;
    let errors = errors(text);
    for expected in [
        "sessions base \"relative\" must be absolute",
        "would let a session copy any host file",
        "is listed more than once",
        "max_sessions must be between",
        "idle_timeout must be at least 1s",
        "max_size must be between",
        "max_inodes must be between",
    ] {
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "{expected:?} not in {errors:#?}"
        );
    }
}

#[test]
fn a_workspace_must_stand_apart_from_other_mounts_and_fit_max_size() {
    let text = r#"version = 1
[sessions]
max_size = "1MiB"
[profiles.inside]
read = ["/usr"]
workspace = "/usr/w"
[profiles.holding]
tmpfs = { "/w/tmp" = "1MiB" }
workspace = "/w"
[profiles.proc]
workspace = "/proc/w"
[profiles.big]
workspace = "/w"
workspace_size = "2MiB"
[profiles.sizeless]
workspace_size = "2MiB"
"#;
    let errors = errors(text);
    for expected in [
        "is inside the profile's path \"/usr\"",
        "holds the profile's path \"/w/tmp\"",
        "airlock mounts itself",
        "over the sessions' max_size",
        "workspace_size needs a workspace",
    ] {
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "{expected:?} not in {errors:#?}"
        );
    }
}

#[test]
fn unknown_session_keys_are_reported() {
    let errors = errors("version = 1\n[sessions]\nmax_sesions = 3\n");
    assert!(
        errors.iter().any(|e| e.contains("max_sesions")),
        "{errors:#?}"
    );
}
