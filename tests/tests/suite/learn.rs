//! `airlock learn`: the profile it writes for real programs passes `airlock check`, runs
//! the same command again with no denial, and grants neither `/`, a home directory, `/etc`
//! wholesale nor the network the program did not use; against a policy file it prints what
//! it would add, with evidence, and never writes the file. A program fetching through the
//! egress proxy learns exactly the destinations it asked for, and no more than a bound of
//! them however many it asks for.
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
    let (path, profile, text) = learned_policy_in(cwd, dir, args, command);
    // A command that used no network is granted none.
    assert_eq!(profile.network, Network::None, "{text}");
    (path, profile)
}

/// As [`learned_profile_in`], whatever the learned network, with the policy's text.
fn learned_policy_in(
    cwd: &Path,
    dir: &Path,
    args: &[&str],
    command: &[&str],
) -> (PathBuf, Profile, String) {
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
    (path, profile, text)
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
fn an_output_the_learned_command_turns_into_a_symlink_to_the_policy_is_refused() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let data = scratch("learn-plant", false);
    let text = "version = 1\n[profiles.base]\nread = [\"/usr\"]\nread_optional = [\"/bin\", \"/lib\", \"/lib64\", \"/etc/ld.so.cache\"]\ntmpfs = { \"/tmp\" = \"16MiB\" }\n";
    let policy = data.write("policy.toml", text);
    let policy_arg = policy.display().to_string();
    // The build directory, writable while learning: the command plants a symlink to the
    // policy where the result is to go, after the learner checked that name.
    let build = scratch("learn-plant-build", true);
    let dir = build.0.display().to_string();
    let plant = format!("ln -sf {policy_arg} learned.txt");
    let out = learn_in(
        &build.0,
        &[
            "--policy",
            &policy_arg,
            "--profile",
            "base",
            "--write",
            &dir,
            "--output",
            "learned.txt",
        ],
        &["/bin/sh", "-c", &plant],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is a symbolic link"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), text);
    // The symlink is left as the command made it, and nothing else is left beside it.
    let link = build.0.join("learned.txt");
    assert_eq!(std::fs::read_link(&link).unwrap(), policy);
    let names: Vec<_> = std::fs::read_dir(&build.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["learned.txt"], "{names:?}");
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

/// An HTTP server on this host's loopback answering every request with `body`; it serves
/// until the test process ends.
fn upstream(body: &'static str) -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                line.clear();
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// Whether a sandbox here can have the egress proxy; says why when it cannot (an
/// unprivileged supervisor on a host that refuses it what the proxy's namespace needs).
fn egress_available(dir: &Path) -> bool {
    let policy = dir.join("probe.toml");
    let text = "version = 1\n[profiles.probe]\nread = [\"/usr\"]\nread_optional = [\"/bin\", \"/lib\", \"/lib64\", \"/etc/ld.so.cache\"]\nnetwork = { allow = [\"127.0.0.1:9\"] }\n";
    std::fs::write(&policy, text).unwrap();
    let result = exec_json(
        Some(&policy),
        &["--profile", "probe"],
        &["/bin/sh", "-c", "test -n \"$HTTP_PROXY\""],
    );
    if result["ok"] == true {
        return true;
    }
    assert!(
        std::env::var("AIRLOCK_MUST_WORK").as_deref() != Ok("1")
            || result["error"]["kind"] == "sandbox_unavailable",
        "the egress probe failed for another reason: {result}"
    );
    eprintln!(
        "SKIP: the egress proxy is unavailable here, so nothing can be learned through it: {result}"
    );
    false
}

/// Fetches `argv[1]` through the proxy the environment names, prints the body; then tries
/// one direct connection around the proxy, which has no route in the sandbox.
const FETCH: &str = "import socket, sys, urllib.request
print(urllib.request.urlopen(sys.argv[1]).read().decode(), end='')
s = socket.socket()
try:
    s.connect(('192.0.2.1', 80))
except OSError:
    pass
";

#[test]
fn a_fetch_through_the_proxy_learns_exactly_that_destination_and_runs_under_it() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() || !installed("python3") {
        return;
    }
    let out_dir = scratch("learn-net", false);
    if !egress_available(&out_dir.0) {
        return;
    }
    let port = upstream("fetched\n");
    let url = format!("http://127.0.0.1:{port}/data");
    let command = ["python3", "-c", FETCH, url.as_str()];
    // The default profile has no network: the fetch fails there.
    assert_eq!(exec_json(None, &[], &command)["ok"], false);
    let out = learn(&[], &command);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // It says, before running, that the proxy lets everything through while learning.
    assert!(
        stderr.contains("recording every destination it asks for"),
        "{stderr}"
    );
    let (policy, profile, text) = learned_policy_in(Path::new("/"), &out_dir.0, &[], &command);
    let Network::Egress(allowlist) = &profile.network else {
        panic!("no egress allowlist learned:\n{text}");
    };
    let hosts: Vec<String> = allowlist.hosts().iter().map(ToString::to_string).collect();
    assert_eq!(hosts, [format!("127.0.0.1:{port}")], "{text}");
    let addresses: Vec<String> = allowlist
        .addresses()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(addresses, ["127.0.0.1/32"], "{text}");
    assert!(
        text.contains(&format!("# learned: HTTP 127.0.0.1:{port} (1x)")),
        "{text}"
    );
    // The direct connection is evidence, not a grant.
    assert!(
        text.contains("192.0.2.1:80 (1x) addressed directly, around the egress proxy"),
        "{text}"
    );
    assert_eq!(runs_clean(&policy, &command), "fetched\n");
    // Another destination stays refused.
    let other = format!("http://127.0.0.1:{}/data", upstream("other\n"));
    let refused = exec_json(
        Some(&policy),
        &["--profile", "learned"],
        &["python3", "-c", FETCH, other.as_str()],
    );
    assert_eq!(refused["ok"], false, "{refused}");
    assert_eq!(refused["network"]["refused"], 1, "{refused}");
}

#[test]
fn learning_against_an_allowlist_keeps_it_and_adds_the_new_destination_with_evidence() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() || !installed("python3") {
        return;
    }
    let data = scratch("learn-net-diff", false);
    if !egress_available(&data.0) {
        return;
    }
    let port = upstream("fetched\n");
    let text = "version = 1\n[profiles.base]\nread = [\"/usr\"]\nread_optional = [\"/bin\", \"/lib\", \"/lib64\", \"/etc\"]\ntmpfs = { \"/tmp\" = \"16MiB\" }\nnetwork = { allow = [\"pypi.org\"] }\n";
    let policy = data.write("policy.toml", text);
    let url = format!("http://127.0.0.1:{port}/");
    let out = learn(
        &[
            "--policy",
            &policy.display().to_string(),
            "--profile",
            "base",
        ],
        &["python3", "-c", FETCH, &url],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let allow = format!("+ network allow \"127.0.0.1:{port}\"  # HTTP 127.0.0.1:{port} (1x)");
    assert!(printed.contains(&allow), "{printed}");
    let address = format!(
        "+ network allow_addresses \"127.0.0.1/32\"  # 127.0.0.1:{port} reached 127.0.0.1, a loopback address"
    );
    assert!(printed.contains(&address), "{printed}");
    assert!(!printed.contains("pypi.org"), "{printed}");
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), text);
}

/// Asks the proxy (`HTTP_PROXY`) for 2,000 distinct destinations, one connection each:
/// `CONNECT 127.0.N.M:9`, which nothing answers; every reply is read and ignored. Eight
/// times the learner's bound shows the cut as well as more would, and stays quick under
/// the kernel matrix's emulation.
const MANY: &str = "import os, socket
proxy = os.environ['HTTP_PROXY'].rsplit('/', 1)[-1].rsplit(':', 1)
for i in range(2000):
    s = socket.create_connection((proxy[0], int(proxy[1])))
    target = '127.%d.%d.%d:9' % (i // 65536 + 1, i // 256 % 256, i % 256)
    s.sendall(('CONNECT %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n' % (target, target)).encode())
    s.recv(4096)
    s.close()
print('asked')
";

#[test]
fn a_command_asking_for_two_thousand_destinations_is_recorded_within_a_bound_and_told_so() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() || !installed("python3") {
        return;
    }
    let out_dir = scratch("learn-net-many", false);
    if !egress_available(&out_dir.0) {
        return;
    }
    let guard = format!("{}s", airlock_tests::HANG_GUARD.as_secs());
    let out = learn(&["--timeout", &guard], &["python3", "-c", MANY]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stderr}\n{text}");
    assert!(
        stderr.contains("asked the proxy for more than 256 destinations"),
        "{stderr}"
    );
    let file = airlock_policy::parse_policy_str(&text, "learned.toml").unwrap();
    let (mut valid, _) =
        airlock_policy::validate::validate_policy(&file, airlock_policy::Source::new("l", &text))
            .unwrap();
    let profile = valid.profiles.remove("learned").unwrap();
    let Network::Egress(allowlist) = &profile.network else {
        panic!("no egress allowlist learned:\n{text}");
    };
    assert_eq!(allowlist.hosts().len(), 256, "{text}");
    assert!(text.contains("past the learner's bound of 256"), "{text}");
}
