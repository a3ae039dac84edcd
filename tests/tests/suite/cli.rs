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
    let scratch = Scratch::trusted("cli-env");
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
    let scratch = Scratch::trusted("cli-env-flag");
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
    let scratch = Scratch::trusted("cli-json-logs");
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

/// `airlock run --socket S args...`: the exit code, the record printed (if any), stderr.
fn run_through(socket: &Path, args: &[&str]) -> (Option<i32>, Option<serde_json::Value>, String) {
    let mut all = vec!["run", "--socket", socket.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = airlock(&all);
    let stdout = text(&out.stdout);
    let record = (!stdout.trim().is_empty())
        .then(|| serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}")));
    (out.status.code(), record, text(&out.stderr))
}

#[test]
fn run_through_a_daemon_prints_its_record_with_the_one_shot_exit_codes() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = airlock_tests::daemon::Daemon::start(&["--pool", "1"]);
    let socket = daemon.socket.as_path();
    let (code, record, stderr) = run_through(
        socket,
        &[
            "--tool",
            "echo",
            "--input",
            r#"{"text":"hi"}"#,
            "--call-id",
            "c-7",
        ],
    );
    let record = record.unwrap_or_else(|| panic!("no record: {stderr}"));
    assert_eq!(code, Some(0), "{record}");
    assert_eq!(record["ok"], true, "{record}");
    assert_eq!(record["stdout"], "hi\n", "{record}");
    assert_eq!(record["call_id"], "c-7", "{record}");
    assert_eq!(record["isolation"]["backend"], "airlock", "{record}");
    // The gate's refusals are records too, and the call did not succeed: exit 1.
    for (input, kind) in [
        (r#"{}"#, "invalid_input"),
        (r#"{"text": 1"#, "invalid_input"),
    ] {
        let (code, record, _) = run_through(socket, &["--tool", "echo", "--input", input]);
        let record = record.unwrap();
        assert_eq!(code, Some(1), "{record}");
        assert_eq!(record["error"]["kind"], kind, "{record}");
    }
    let (code, record, _) =
        run_through(socket, &["--tool", "guarded", "--input", r#"{"text":"x"}"#]);
    assert_eq!(code, Some(1));
    assert_eq!(record.unwrap()["error"]["kind"], "approval_required");
    // The daemon's plan mode refuses a tool that writes.
    let (code, record, _) = run_through(
        socket,
        &[
            "--tool",
            "guarded",
            "--input",
            r#"{"text":"x"}"#,
            "--plan-mode",
        ],
    );
    assert_eq!(code, Some(1));
    assert_eq!(record.unwrap()["error"]["kind"], "denied");
    // A dry run prints the plan and runs nothing.
    let (code, plan, _) = run_through(
        socket,
        &["--tool", "echo", "--input", r#"{"text":"hi"}"#, "--dry-run"],
    );
    let plan = plan.unwrap();
    assert_eq!(code, Some(0), "{plan}");
    assert_eq!(
        plan["argv"],
        serde_json::json!(["/bin/echo", "hi"]),
        "{plan}"
    );
    // A request the daemon refuses whole: no record, airlock's own failure.
    let (code, record, stderr) = run_through(
        socket,
        &["--tool", "echo", "--input", "{}", "--call-id", "a\tb"],
    );
    assert_eq!((code, record), (Some(125), None));
    assert!(
        stderr.contains("invalid_request") && stderr.contains("call_id"),
        "{stderr}"
    );
}

#[test]
fn run_through_a_socket_refuses_the_one_shot_flags_and_a_peer_that_does_not_answer() {
    let _guard = airlock_tests::shared();
    let scratch = Scratch::new("cli-run-socket");
    let socket = scratch.0.join("mute.sock");
    // The daemon's policy, sandbox user and audit apply: flags that would choose them
    // locally are a usage error, not silently ignored.
    for flag in [
        &["--policy", "p.toml"][..],
        &["--preset", "examples"],
        &["--sandbox-uid", "1000"],
        &["--audit", "-"],
        &["--landlock-audit"],
    ] {
        let (code, record, stderr) =
            run_through(&socket, &[&["--tool", "t", "--input", "{}"], flag].concat());
        assert_eq!((code, record), (Some(125), None), "{flag:?}: {stderr}");
        assert!(stderr.contains("--socket"), "{flag:?}: {stderr}");
    }
    let (code, _, stderr) = run_through(&socket, &["--tool", "t", "--input", "{}"]);
    assert_eq!(code, Some(125));
    assert!(stderr.contains("cannot connect"), "{stderr}");
    // A peer that reads the request and hangs up without a word, and one that answers
    // something else than a call's answer.
    for reply in [
        &b""[..],
        b"{\"id\":1,\"result\":{\"stdout\":\"x\"}}\n",
        b"{\"id\":1,",
    ] {
        let _ = std::fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let peer = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            while stream.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
                line.push(byte[0]);
            }
            stream.write_all(reply).unwrap();
            String::from_utf8(line).unwrap()
        });
        let (code, record, stderr) = run_through(&socket, &["--tool", "t", "--input", "{}"]);
        let request: serde_json::Value = serde_json::from_str(&peer.join().unwrap()).unwrap();
        assert_eq!(request["op"], "call");
        assert_eq!((code, record), (Some(125), None), "{stderr}");
        assert!(
            stderr.contains("without answering") || stderr.contains("not a call's answer"),
            "{stderr}"
        );
    }
}

#[test]
fn run_through_a_daemon_cancels_its_call_when_interrupted() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = airlock_tests::daemon::Daemon::start(&[]);
    let marker = format!("300.{}", std::process::id());
    let mut client = Command::new(airlock_bin())
        .args(["run", "--socket", daemon.socket.to_str().unwrap()])
        .args(["--tool", "sleep", "--input"])
        .arg(format!(r#"{{"seconds":"{marker}"}}"#))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sleeping = || airlock_tests::host_processes_with(&format!("sleep {marker}")).len() == 1;
    wait_until("the tool sleeps", sleeping);
    // SAFETY: kill on our own child's pid, not yet waited for.
    assert_eq!(unsafe { libc::kill(client.id() as i32, libc::SIGINT) }, 0);
    let _ = client.wait().unwrap();
    wait_until("the daemon killed the abandoned call's tool", || {
        airlock_tests::host_processes_with(&format!("sleep {marker}")).is_empty()
    });
}
