//! `airlock learn`: the profile it writes for real programs passes `airlock check`, runs
//! the same command again with no denial, and grants neither `/`, a home directory, `/etc`
//! wholesale nor the network the program did not use; against a policy file it prints what
//! it would add, with evidence, and never writes the file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use airlock_policy::validated::{Network, Profile};
use airlock_tests::{Scratch, airlock_bin, exec_json, sandbox_available, stdout_of};

/// A scratch directory outside `/tmp` (the default profile's own tmpfs), readable by the
/// sandbox's uid, and writable by it when `writable`.
fn scratch(tag: &str, writable: bool) -> Scratch {
    use std::os::unix::fs::PermissionsExt;
    let scratch = Scratch::under(Path::new("/var/tmp"), tag);
    let mode = if writable { 0o777 } else { 0o755 };
    std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(mode)).unwrap();
    scratch
}

/// Whether `program` is installed; the VMs of the kernel matrix hold only a few programs.
fn installed(program: &str) -> bool {
    let found = ["/usr/bin", "/bin"]
        .iter()
        .any(|dir| Path::new(dir).join(program).exists());
    if !found {
        eprintln!("skipped: {program} is not installed here");
    }
    found
}

fn learn(args: &[&str], command: &[&str]) -> Output {
    learn_in(Path::new("/"), args, command)
}

fn learn_in(dir: &Path, args: &[&str], command: &[&str]) -> Output {
    Command::new(airlock_bin())
        .current_dir(dir)
        .arg("learn")
        .args(args)
        .arg("--")
        .args(command)
        .output()
        .unwrap()
}

/// Learns a profile for `command` into `dir/learned.toml`, checks it, and returns its path
/// and the learned profile.
fn learned_profile(dir: &Path, args: &[&str], command: &[&str]) -> (PathBuf, Profile) {
    learned_profile_in(Path::new("/"), dir, args, command)
}

/// As [`learned_profile`], with `airlock learn` started in `cwd`.
fn learned_profile_in(
    cwd: &Path,
    dir: &Path,
    args: &[&str],
    command: &[&str],
) -> (PathBuf, Profile) {
    let out = learn_in(cwd, args, command);
    assert!(
        out.status.success(),
        "learn failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    // It says, before anything runs, that the learning run is less confined.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("less confined than profile"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("learned.toml");
    std::fs::write(&path, &out.stdout).unwrap();
    let check = Command::new(airlock_bin())
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        check.status.success(),
        "the learned policy does not pass check: {}\n{text}",
        String::from_utf8_lossy(&check.stderr)
    );
    let file = airlock_policy::parse_policy_str(&text, "learned.toml").unwrap();
    let (mut valid, _) =
        airlock_policy::validate::validate_policy(&file, airlock_policy::Source::new("l", &text))
            .unwrap();
    let profile = valid.profiles.remove("learned").unwrap();
    for grant in profile.read.iter().chain(&profile.write) {
        assert!(
            !["/", "/home", "/root", "/etc", "/var"].contains(&grant.path.as_str()),
            "{} granted wholesale:\n{text}",
            grant.path
        );
        assert!(
            !(grant.path.starts_with("/home/") && grant.path.matches('/').count() == 2),
            "a home directory granted:\n{text}"
        );
    }
    assert_eq!(profile.network, Network::None, "{text}");
    (path, profile)
}

/// Runs `command` under the learned profile: it must succeed with nothing refused.
fn runs_clean(policy: &Path, command: &[&str]) -> String {
    let result = exec_json(Some(policy), &["--profile", "learned"], command);
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["denials"], serde_json::json!([]), "{result}");
    stdout_of(&result)
}

#[test]
fn a_shell_reading_a_data_file_learns_that_directory_and_nothing_wider() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let data = scratch("learn-data", false);
    let file = data.write("input.txt", "the data\n");
    let out_dir = scratch("learn-out", false);
    let dir = data.0.display().to_string();
    let script = format!("cat {}", file.display());
    let command = ["/bin/sh", "-c", script.as_str()];
    // The default profile cannot see it.
    assert_eq!(exec_json(None, &[], &command)["ok"], false);
    let (policy, profile) = learned_profile(&out_dir.0, &["--read", &dir], &command);
    assert!(profile.read.iter().any(|g| g.path == dir), "{profile:?}");
    assert!(profile.write.is_empty(), "{profile:?}");
    assert_eq!(runs_clean(&policy, &command), "the data\n");
}

#[test]
fn python_importing_ssl_and_reading_a_file_runs_under_its_learned_profile() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() || !installed("python3") {
        return;
    }
    let data = scratch("learn-py", false);
    let file = data.write("input.txt", "hello\n");
    let out_dir = scratch("learn-py-out", false);
    let script = format!(
        "import ssl; ssl.create_default_context(); print(open({:?}).read(), end='')",
        file.display().to_string()
    );
    let command = ["python3", "-c", script.as_str()];
    let (policy, _) = learned_profile(
        &out_dir.0,
        &["--read", &data.0.display().to_string()],
        &command,
    );
    assert_eq!(runs_clean(&policy, &command), "hello\n");
}

#[test]
fn git_init_and_commit_learn_the_workspace_as_the_only_writable_place() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() || !installed("git") {
        return;
    }
    let workspace = scratch("learn-git", true);
    let out_dir = scratch("learn-git-out", false);
    let ws = workspace.0.display().to_string();
    let script = format!(
        "cd {ws} && git init -q && git -c safe.directory='*' -c user.email=a@example.invalid \
         -c user.name=agent commit -q --allow-empty -m first && echo committed"
    );
    let command = ["/bin/sh", "-c", script.as_str()];
    let (policy, profile) = learned_profile(&out_dir.0, &["--write", &ws], &command);
    let writable: Vec<&str> = profile.write.iter().map(|g| g.path.as_str()).collect();
    assert_eq!(writable, [ws.as_str()]);
    std::fs::remove_dir_all(workspace.0.join(".git")).unwrap();
    assert_eq!(runs_clean(&policy, &command), "committed\n");
}

#[test]
fn node_learns_a_profile_it_runs_under() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() || !installed("node") {
        return;
    }
    let out_dir = scratch("learn-node", false);
    let command = ["node", "-e", "console.log(6 * 7)"];
    let (policy, _) = learned_profile(&out_dir.0, &[], &command);
    assert_eq!(runs_clean(&policy, &command), "42\n");
}

#[test]
fn a_c_compiler_build_started_in_its_source_directory_learns_it_writable_and_as_cwd() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() || !installed("cc") {
        return;
    }
    let source = scratch("learn-cc", true);
    source.write(
        "hello.c",
        "#include <stdio.h>\nint main(void) { puts(\"hi\"); return 0; }\n",
    );
    let out_dir = scratch("learn-cc-out", false);
    let src = source.0.display().to_string();
    // Started in the directory it may write, the learning run builds there, as `cc` alone
    // would, and the learned profile keeps that working directory.
    let command = ["/bin/sh", "-c", "cc hello.c -o hello && ./hello"];
    let (policy, profile) = learned_profile_in(&source.0, &out_dir.0, &["--write", &src], &command);
    assert!(profile.write.iter().any(|g| g.path == src), "{profile:?}");
    assert_eq!(profile.cwd, src);
    std::fs::remove_file(source.0.join("hello")).unwrap();
    assert_eq!(runs_clean(&policy, &command), "hi\n");
}

#[test]
fn learning_against_a_policy_file_prints_additions_with_evidence_and_never_writes_it() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let data = scratch("learn-diff", false);
    let file = data.write("input.txt", "x\n");
    let text = "version = 1\n[profiles.base]\nread = [\"/usr\"]\nread_optional = [\"/bin\", \"/lib\", \"/lib64\", \"/etc/ld.so.cache\"]\ntmpfs = { \"/tmp\" = \"16MiB\" }\n";
    let policy = data.write("policy.toml", text);
    let dir = data.0.display().to_string();
    let script = format!("cat {}", file.display());
    let policy_arg = policy.display().to_string();
    let out = learn(
        &["--policy", &policy_arg, "--profile", "base", "--read", &dir],
        &["/bin/sh", "-c", &script],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let line = format!("+ read {dir:?}  # openat {} (1x)", file.display());
    assert!(printed.contains(&line), "{printed}");
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), text);
    // Asked to write over the policy itself, by its name or another, it refuses.
    let link = data.0.join("link.toml");
    std::os::unix::fs::symlink(&policy, &link).unwrap();
    for output in [policy_arg.clone(), link.display().to_string()] {
        let out = learn(
            &[
                "--policy",
                &policy_arg,
                "--profile",
                "base",
                "--output",
                &output,
            ],
            &["/bin/true"],
        );
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("never writes the policy"),
            "{out:?}"
        );
    }
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), text);
}

#[test]
fn a_policy_tools_call_is_learned_against_its_profile() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let data = scratch("learn-tool", false);
    let file = data.write("notes.txt", "n\n");
    let policy = data.write(
        "tools.toml",
        r#"version = 1
default_decision = "allow"

[profiles.reader]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache"]
tmpfs = { "/tmp" = "16MiB" }

[tools.show]
description = "print a file"
profile = "reader"
command = ["/bin/cat", "{path}"]
side_effect = "read"
input = { type = "object", properties = { path = { type = "string" } }, required = ["path"] }

[[rules]]
name = "no-shadow"
match = "pattern"
tools = ["show"]
field = "path"
patterns = ["shadow"]
decision = "deny"
"#,
    );
    let policy = policy.display().to_string();
    let dir = data.0.display().to_string();
    let input = serde_json::json!({ "path": file.display().to_string() }).to_string();
    let out = Command::new(airlock_bin())
        .args([
            "learn", "--policy", &policy, "--tool", "show", "--input", &input,
        ])
        .args(["--read", &dir])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("to profile \"reader\""), "{printed}");
    assert!(printed.contains(&format!("+ read {dir:?}")), "{printed}");
    // A call the gate denies would never run: there is nothing to learn from it.
    let denied = Command::new(airlock_bin())
        .args(["learn", "--policy", &policy, "--tool", "show"])
        .args(["--input", r#"{"path": "/etc/shadow"}"#])
        .output()
        .unwrap();
    assert_eq!(denied.status.code(), Some(1), "{denied:?}");
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("the gate denies this call"),
        "{denied:?}"
    );
}
