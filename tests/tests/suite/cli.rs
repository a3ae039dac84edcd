//! The conventions of the `airlock` command line: completion scripts and man pages, usage
//! errors' exit statuses, `--input @-`, `--log-format json`, the daemon's `AIRLOCK_*`
//! variables, and the commands the `examples` preset's comments show.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use airlock_tests::daemon::DAEMON_POLICY;
use airlock_tests::{Scratch, airlock_bin, sandbox_available, wait_until};

fn airlock(args: &[&str]) -> Output {
    Command::new(airlock_bin()).args(args).output().unwrap()
}

/// `airlock args...` with `stdin` on its standard input.
fn airlock_with_stdin(args: &[&str], stdin: Vec<u8>) -> Output {
    let mut child = Command::new(airlock_bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    // A refused input is not read to its end: the pipe may close under the writer.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn completions_for_bash_zsh_and_fish_name_the_subcommands() {
    let _guard = airlock_tests::shared();
    for shell in ["bash", "zsh", "fish"] {
        let out = airlock(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        for subcommand in ["exec", "run", "serve", "mcp", "completions"] {
            assert!(script.contains(subcommand), "{shell}: no {subcommand}");
        }
    }
}

#[test]
fn completions_for_an_unknown_shell_are_a_usage_error() {
    let _guard = airlock_tests::shared();
    let out = airlock(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("tcsh"));
}

#[test]
fn the_man_page_is_roff_naming_exec_and_serve() {
    let _guard = airlock_tests::shared();
    let out = airlock(&["man"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = text(&out.stdout);
    assert!(page.contains(".TH airlock 1"), "{page}");
    assert!(page.contains("exec") && page.contains("serve"), "{page}");
    let out = airlock(&["man", "serve"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = text(&out.stdout);
    assert!(page.contains(".TH airlock-serve 1"), "{page}");
    assert!(page.contains("AIRLOCK_POLICY"), "{page}");
}

#[test]
fn a_usage_error_of_exec_or_run_exits_125_with_the_usage_on_stderr() {
    let _guard = airlock_tests::shared();
    for args in [
        &["exec", "--no-such-flag", "--", "/bin/true"][..],
        &["exec"],
        &["exec", "--sandbox-uid", "many", "--", "/bin/true"],
        &["--log-format", "json", "exec", "--no-such-flag"],
        &["run", "--tool", "word_count"],
        &["run", "--no-such-flag"],
    ] {
        let out = airlock(args);
        assert_eq!(out.status.code(), Some(125), "{args:?}");
        let stderr = text(&out.stderr);
        // clap's message: the usage line, or for a refused value where to find it.
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert!(
            stderr.contains("Usage: airlock") || stderr.contains("try '--help'"),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn help_and_version_exit_0_and_other_usage_errors_keep_2() {
    let _guard = airlock_tests::shared();
    for args in [&["exec", "--help"][..], &["run", "--help"], &["--version"]] {
        let out = airlock(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(!out.stdout.is_empty(), "{args:?}");
    }
    let out = airlock(&["check", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn input_at_dash_reads_the_arguments_from_stdin() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let args = [
        "run",
        "--preset",
        "examples",
        "--tool",
        "word_count",
        "--input",
        "@-",
    ];
    let out = airlock_with_stdin(&args, br#"{"text": "one two three"}"#.to_vec());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["stdout"], "3\n", "{result}");
}

#[test]
fn input_at_file_reads_the_arguments_from_the_file() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("cli-input");
    let file = scratch.write("input.json", r#"{"text": "a b"}"#);
    let input = format!("@{}", file.display());
    let out = airlock(&[
        "run",
        "--preset",
        "examples",
        "--tool",
        "word_count",
        "--input",
        &input,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["stdout"], "2\n", "{result}");
}

#[test]
fn input_beyond_the_gates_limit_is_refused_with_a_clear_error() {
    let _guard = airlock_tests::shared();
    let args = [
        "run",
        "--preset",
        "examples",
        "--tool",
        "word_count",
        "--input",
        "@-",
    ];
    let out = airlock_with_stdin(&args, vec![b' '; (1 << 20) + 1]);
    assert_eq!(out.status.code(), Some(125));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--input @-: more than 1048576 bytes"),
        "{stderr}"
    );
    let out = airlock(&[
        "run",
        "--preset",
        "examples",
        "--tool",
        "word_count",
        "--input",
        "@/nonexistent/in.json",
    ]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("/nonexistent/in.json"));
}

/// The commands the `examples` preset shows in its comments (`#   airlock ...`, or a pipe
/// into one), as embedded in this build.
fn commands_in_the_examples_preset() -> Vec<String> {
    let out = airlock(&["preset", "examples"]);
    assert!(out.status.success());
    text(&out.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix("#   "))
        .filter(|command| command.starts_with("airlock ") || command.contains("| airlock "))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_commands_in_the_examples_presets_comments_succeed() {
    let _guard = airlock_tests::shared();
    let commands = commands_in_the_examples_preset();
    assert!(commands.len() >= 2, "{commands:?}");
    if !sandbox_available() {
        return;
    }
    let bin = airlock_bin();
    for command in commands {
        // `airlock` is this build, whatever its path (AIRLOCK_BIN may name another).
        let script = format!("airlock() {{ \"$AIRLOCK_UNDER_TEST\" \"$@\"; }}\n{command}");
        let out = Command::new("/bin/sh")
            .args(["-c", &script])
            .env("AIRLOCK_UNDER_TEST", &bin)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{command}: {}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_ne!(result["ok"], false, "{command}: {result}");
    }
}

/// `airlock serve` with `args` and `env`, stderr piped; waits for `socket`.
fn serve(args: &[&str], env: &[(&str, &Path)], socket: &Path, log_env: bool) -> Child {
    let mut command = Command::new(airlock_bin());
    command.args(args).stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    if log_env {
        command.env("RUST_LOG", "airlock=info");
    }
    let mut child = command.spawn().unwrap();
    wait_until("the daemon creates its socket", || {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .unwrap();
            panic!("the daemon exited ({status}) without creating its socket: {stderr}");
        }
        socket.exists()
    });
    child
}

/// SIGTERM, then the daemon's exit status and stderr.
fn stop(mut child: Child) -> (std::process::ExitStatus, String) {
    // SAFETY: kill on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (child.wait().unwrap(), stderr)
}

#[test]
fn serve_takes_its_policy_and_socket_from_the_environment() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("cli-env");
    let policy = scratch.write("policy.toml", DAEMON_POLICY);
    let socket = scratch.0.join("env.sock");
    let env = [
        ("AIRLOCK_POLICY", policy.as_path()),
        ("AIRLOCK_SOCKET", &socket),
    ];
    let daemon = serve(&["serve", "--pool", "0"], &env, &socket, false);
    let (status, stderr) = stop(daemon);
    assert!(status.success(), "{status}: {stderr}");
}

#[test]
fn a_flag_wins_over_its_environment_variable() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("cli-env-flag");
    let policy = scratch.write("policy.toml", DAEMON_POLICY);
    let socket = scratch.0.join("flag.sock");
    let nowhere = Path::new("/nonexistent/airlock");
    let env = [("AIRLOCK_POLICY", nowhere), ("AIRLOCK_SOCKET", nowhere)];
    let args = [
        "serve",
        "--pool",
        "0",
        "--policy",
        policy.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
    ];
    let daemon = serve(&args, &env, &socket, false);
    let (status, stderr) = stop(daemon);
    assert!(status.success(), "{status}: {stderr}");
}

#[test]
fn a_bad_value_from_the_environment_names_its_variable() {
    let _guard = airlock_tests::shared();
    let out = Command::new(airlock_bin())
        .args([
            "serve",
            "--policy",
            "/nonexistent/p.toml",
            "--socket",
            "/nonexistent/s",
        ])
        .env("AIRLOCK_MAX_CONCURRENT", "many")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("AIRLOCK_MAX_CONCURRENT"), "{stderr}");
    // Parsed, but out of range: refused before anything starts.
    let out = Command::new(airlock_bin())
        .args([
            "serve",
            "--policy",
            "/nonexistent/p.toml",
            "--socket",
            "/nonexistent/s",
        ])
        .env("AIRLOCK_MAX_CONCURRENT", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("AIRLOCK_MAX_CONCURRENT): at least 1"),
        "{stderr}"
    );
}

#[test]
fn log_format_json_makes_every_log_line_a_json_object() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("cli-json-logs");
    let policy = scratch.write("policy.toml", DAEMON_POLICY);
    let socket = scratch.0.join("json.sock");
    let args = [
        "--log-format",
        "json",
        "serve",
        "--pool",
        "0",
        "--policy",
        policy.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
    ];
    let daemon = serve(&args, &[], &socket, true);
    let (status, stderr) = stop(daemon);
    assert!(status.success(), "{status}: {stderr}");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert!(lines.iter().all(serde_json::Value::is_object), "{stderr}");
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "airlock daemon listening"),
        "{stderr}"
    );
}
