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
max_lifetime = "240h"
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
    assert_eq!(sessions.max_lifetime, Duration::from_secs(240 * 3600));
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
    // A session lives a day unless the policy says otherwise.
    assert_eq!(
        loaded.policy.sessions.max_lifetime,
        Duration::from_secs(24 * 3600)
    );
}

#[test]
fn bad_session_bounds_are_each_reported() {
    let text = r#"version = 1
[sessions]
bases = ["relative", "/", "/a", "/a"]
max_sessions = 0
idle_timeout = "10ms"
max_lifetime = "721h"
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
        "max_lifetime must be from 1s to 30 days",
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

fn diagnostics(text: &str) -> Vec<String> {
    match load_policy_str(text, "p.toml") {
        Err(PolicyError::Invalid { diagnostics, .. }) => {
            diagnostics.iter().map(ToString::to_string).collect()
        }
        Ok(loaded) => loaded.warnings.iter().map(ToString::to_string).collect(),
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

const WORKSPACE_PROFILE: &str = r#"version = 1
[profiles.default]
read = ["/usr"]
workspace = "/workspace"
"#;

#[test]
fn a_workspace_is_writable_for_the_permission_checks() {
    let tool = |permissions: &str| {
        format!(
            "{WORKSPACE_PROFILE}[tools.t]\ndescription = \"d\"\ncommand = [\"/usr/bin/true\"]\nside_effect = \"write\"\npermissions = {permissions}\ninput = {{ type = \"object\" }}\n"
        )
    };
    assert_eq!(
        errors(&tool("[\"fs:read\"]")),
        vec![
            "p.toml:9:15: error: tool t does not declare fs:write but profile default has a workspace (writable, kept across a session's calls)"
        ]
    );
    assert_eq!(
        errors(&tool("[\"fs:read\", \"fs:write\"]")),
        Vec::<String>::new()
    );
}

#[test]
fn a_read_only_tool_on_a_workspace_profile_is_warned_about() {
    let text = format!(
        "{WORKSPACE_PROFILE}[tools.t]\ndescription = \"d\"\ncommand = [\"/usr/bin/true\"]\nside_effect = \"read\"\ninput = {{ type = \"object\" }}\n"
    );
    let found = diagnostics(&text);
    assert!(
        found.contains(
            &"p.toml:5:8: warning: tool t is declared read-only but profile default has a workspace (writable, kept across a session's calls)".to_string()
        ),
        "{found:?}"
    );
}

#[test]
fn built_ins_that_write_cannot_be_declared_read_only() {
    for builtin in ["write_file", "edit", "bash"] {
        let text = format!(
            "version = 1\n[profiles.default]\nread = [\"/usr\"]\n[tools.t]\ndescription = \"d\"\nbuiltin = \"{builtin}\"\nside_effect = \"read\"\n"
        );
        assert_eq!(
            errors(&text),
            vec![format!(
                "p.toml:7:15: error: tool t: the {builtin} built-in can change files, so its side_effect cannot be \"read\" (plan mode and read_only rules would let it run)"
            )],
            "{builtin}"
        );
    }
    for builtin in ["read_file", "list_dir"] {
        let text = format!(
            "version = 1\n[profiles.default]\nread = [\"/usr\"]\n[tools.t]\ndescription = \"d\"\nbuiltin = \"{builtin}\"\nside_effect = \"read\"\n"
        );
        assert_eq!(errors(&text), Vec::<String>::new(), "{builtin}");
    }
}
