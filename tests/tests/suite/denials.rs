//! What a result's `denials` list says: every syscall the filter refused, with its name, its
//! errno and the argument rule, answered exactly as the filter alone would; nothing for a
//! call that was refused nothing; a bounded list; and a listener the tool cannot reach.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use airlock_tests::{exec_json, sandbox_available, stdout_of};

/// Skips (or fails under `AIRLOCK_MUST_WORK=1`) without the sandbox or python3, whose
/// ctypes makes raw syscalls.
fn available() -> bool {
    if !sandbox_available() {
        return false;
    }
    if std::path::Path::new("/usr/bin/python3").exists() {
        return true;
    }
    assert!(
        !airlock_tests::must_work(),
        "the denials tests need /usr/bin/python3"
    );
    false
}

/// Runs a python script in the default sandbox; it gets `sc(nr, *args)`, a raw syscall
/// returning `(return value, errno)`.
fn python(script: &str) -> serde_json::Value {
    let program = format!(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n\
         def sc(nr, *args):\n    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])\n    \
         return r, ctypes.get_errno()\n{script}"
    );
    exec_json(None, &[], &["/usr/bin/python3", "-c", &program])
}

fn seccomp_denials(result: &serde_json::Value) -> Vec<serde_json::Value> {
    result["denials"]
        .as_array()
        .unwrap_or_else(|| panic!("no denials list: {result}"))
        .iter()
        .filter(|d| d["layer"] == "seccomp")
        .cloned()
        .collect()
}

fn find<'a>(denials: &'a [serde_json::Value], object: &str) -> &'a serde_json::Value {
    denials
        .iter()
        .find(|d| d["object"] == object)
        .unwrap_or_else(|| panic!("no denial of {object}: {denials:?}"))
}

#[test]
fn a_refused_syscall_is_listed_by_name_and_answered_with_the_filters_errno() {
    let _guard = airlock_tests::shared();
    if !available() {
        return;
    }
    // ptrace (101) is refused with EPERM, as the filter always did; three times, counted.
    let result = python("for _ in range(3): print(*sc(101, 0, 0, 0, 0))");
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(stdout_of(&result), "-1 1\n-1 1\n-1 1\n", "{result}");
    let denials = seccomp_denials(&result);
    let ptrace = find(&denials, "ptrace");
    assert_eq!(ptrace["errno"], "EPERM", "{ptrace}");
    assert_eq!(ptrace["count"], 3, "{ptrace}");
    assert!(ptrace.get("rule").is_none(), "{ptrace}");
    assert_eq!(
        result["isolation"]["denial_reporting"]["seccomp"], "reported",
        "{result}"
    );
}

#[test]
fn a_syscall_refused_for_its_arguments_names_the_rule() {
    let _guard = airlock_tests::shared();
    if !available() {
        return;
    }
    // socket(AF_NETLINK, SOCK_RAW) and clone(CLONE_NEWUSER | SIGCHLD): allowed syscalls,
    // refused for what they ask. A clone that were let through would fork: the child exits.
    let result = python(
        "print(*sc(41, 16, 3, 0))\nr = sc(56, 0x10000000 | 17, 0, 0, 0, 0)\n\
         import os\nif r[0] == 0: os._exit(0)\nprint(*r)",
    );
    assert_eq!(stdout_of(&result), "-1 1\n-1 1\n", "{result}");
    let denials = seccomp_denials(&result);
    let socket = find(&denials, "socket");
    assert_eq!(socket["errno"], "EPERM", "{socket}");
    assert_eq!(
        socket["rule"], "address family the profile does not allow",
        "{socket}"
    );
    let clone = find(&denials, "clone");
    assert_eq!(clone["rule"], "CLONE_NEWUSER", "{clone}");
}

#[test]
fn unknown_and_unsupported_syscalls_get_enosys_and_are_listed() {
    let _guard = airlock_tests::shared();
    if !available() {
        return;
    }
    // io_uring_setup (425) and a number no kernel has: ENOSYS (38), so runtimes fall back.
    let result = python("print(*sc(425, 8, 0))\nprint(*sc(1000))");
    assert_eq!(stdout_of(&result), "-1 38\n-1 38\n", "{result}");
    let denials = seccomp_denials(&result);
    assert_eq!(find(&denials, "io_uring_setup")["errno"], "ENOSYS");
    assert_eq!(find(&denials, "syscall_1000")["errno"], "ENOSYS");
}

#[test]
fn a_call_refused_nothing_lists_nothing_even_when_it_forks() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // Every glibc fork tries clone3 first: the filter answers that alone, unlisted.
    let result = exec_json(
        None,
        &[],
        &["/bin/sh", "-c", "ls / | wc -l; (true); /bin/true"],
    );
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["denials"], serde_json::json!([]), "{result}");
    let reporting = &result["isolation"]["denial_reporting"];
    assert_eq!(reporting["seccomp"], "reported", "{result}");
    assert_eq!(reporting["limits"], "reported", "{result}");
    // Not observed: an empty list says nothing of them, and the record says so.
    assert_eq!(reporting["landlock"], "unavailable", "{result}");
    assert_eq!(reporting["mounts"], "unavailable", "{result}");
    assert_eq!(reporting["network"], "unavailable", "{result}");
}

#[test]
fn the_list_is_bounded_and_counts_what_it_cannot_name() {
    let _guard = airlock_tests::shared();
    if !available() {
        return;
    }
    // 100 distinct refused numbers: 64 lines, the rest counted under `other`.
    let result = python("for nr in range(1000, 1100): sc(nr)\nprint('done')");
    assert_eq!(stdout_of(&result), "done\n", "{result}");
    let denials = seccomp_denials(&result);
    assert_eq!(denials.len(), 65, "{denials:?}");
    let other = find(&denials, "other");
    assert_eq!(other["count"], 36, "{other}");
    let listed: u64 = denials.iter().map(|d| d["count"].as_u64().unwrap()).sum();
    assert_eq!(listed, 100);
}

#[test]
fn the_tool_holds_no_seccomp_listener_to_answer_its_own_refusals() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = exec_json(
        None,
        &[],
        &["/bin/sh", "-c", "ls -l /proc/self/fd/ /proc/$$/fd/ 2>&1"],
    );
    let out = stdout_of(&result);
    assert!(out.contains("/dev/null") || out.contains("pipe:"), "{out}");
    assert!(!out.contains("seccomp"), "{out}");
}

/// Collects what the gate writes to its audit log.
#[derive(Clone, Default)]
struct Buffer(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_workers_refusals_reach_the_result_and_the_audit_log() {
    let _guard = airlock_tests::shared();
    if !available() {
        return;
    }
    let policy = r#"
version = 1
default_decision = "allow"

[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = { "/tmp" = "16MiB" }
limits = { timeout = "300s" }

[tools.probe]
description = "calls ptrace once"
command = ["/usr/bin/python3", "-c", "import ctypes; print(ctypes.CDLL(None).syscall(101, 0, 0, 0, 0))"]
side_effect = "read"
input = { type = "object" }
"#;
    let policy = airlock_policy::load_policy_str(policy, "denials.toml")
        .unwrap()
        .policy;
    let supervisor = Arc::new(airlock_tests::supervisor());
    let profile = Arc::clone(&policy.profiles["default"]);
    supervisor
        .warm_exactly(&[profile], airlock::pool::PoolSize::fixed(1))
        .await;
    airlock_tests::wait_until_async("a worker is pooled", || supervisor.pool_stats().idle == 1)
        .await;
    let audit = Buffer::default();
    let gate = airlock::Gate::new(Arc::clone(&supervisor), policy).with_audit(
        airlock::audit::AuditSink::to_writer(Box::new(audit.clone())),
    );
    let call = airlock::ToolCall {
        call_id: "pooled-probe".into(),
        tool: "probe".into(),
        arguments: "{}".into(),
    };
    let result = gate.call(&call, &airlock::CallOptions::default()).await;
    assert!(result.ok, "{result:?}");
    assert_eq!(
        supervisor.pool_stats().misses,
        0,
        "the call ran on the pooled worker"
    );
    assert_eq!(result.stdout, "-1\n");
    let ptrace: Vec<_> = result
        .denials
        .iter()
        .filter(|d| d.object == "ptrace")
        .collect();
    assert_eq!(ptrace.len(), 1, "{:?}", result.denials);
    assert_eq!(ptrace[0].errno.as_deref(), Some("EPERM"));
    let text = String::from_utf8(audit.0.lock().unwrap().clone()).unwrap();
    let last: serde_json::Value =
        serde_json::from_str(text.lines().last().expect("an audit line")).unwrap();
    assert_eq!(last["call_id"], "pooled-probe", "{text}");
    assert_eq!(last["denials"][0]["layer"], "seccomp", "{text}");
    assert_eq!(last["denials"][0]["object"], "ptrace", "{text}");
}

/// A profile like the default preset's, with loopback only, compiled with its seccomp
/// program in `form`.
fn default_profile_as(form: airlock_policy::seccomp::Form) -> Arc<airlock_policy::CompiledProfile> {
    let text = airlock_policy::presets::preset_text("default")
        .unwrap()
        .replace("network = \"none\"", "network = \"loopback\"");
    let text = text.as_str();
    let file = airlock_policy::parse_policy_str(text, "default.toml").unwrap();
    let (mut valid, _) = airlock_policy::validate::validate_policy(
        &file,
        airlock_policy::Source::new("default.toml", text),
    )
    .unwrap();
    let profile = valid.profiles.remove("default").unwrap();
    Arc::new(airlock_policy::compile::compile_profile_as(&profile, form).unwrap())
}

fn run_of(profile: Arc<airlock_policy::CompiledProfile>, script: &str) -> airlock::SandboxRun {
    airlock::SandboxRun {
        call_id: "diagnose".into(),
        tool: "exec".into(),
        profile,
        argv: vec!["/usr/bin/python3".into(), "-c".into(), script.into()],
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout: airlock_tests::HANG_GUARD,
        inherit_stdio: None,
        builtin: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diagnosed_call_names_paths_its_mounts_lack_or_hold_read_only_and_unreachable_hosts() {
    let _guard = airlock_tests::shared();
    if !available() {
        return;
    }
    // Present on the host, outside the profile's binds; a write into the read-only /usr; a
    // connection the profile's empty network cannot make; a path absent everywhere.
    let outside = airlock_tests::Scratch::under(std::path::Path::new("/var/tmp"), "diagnose");
    let file = outside.write("outside.txt", "x");
    let script = r#"
import socket
for attempt in (lambda: open('OUTSIDE'), lambda: open('/usr/airlock-diagnose', 'w'),
                lambda: open('/nonexistent/airlock'),
                lambda: socket.create_connection(('192.0.2.1', 80), timeout=5)):
    try:
        attempt()
    except OSError as e:
        print(e.errno)
"#
    .replace("OUTSIDE", &file.display().to_string());
    let script = script.as_str();
    let supervisor = airlock_tests::supervisor();
    use airlock_policy::seccomp::Form;
    // A profile compiled in the observing form makes its calls diagnosed ones.
    let diagnosed = supervisor
        .run(run_of(default_profile_as(Form::Observing), script), None)
        .await;
    assert!(diagnosed.ok, "{diagnosed:?}");
    // The syscalls failed as they always do: ENOENT, EROFS, ENOENT, ENETUNREACH (there is
    // no route but loopback's).
    assert_eq!(diagnosed.stdout, "2\n30\n2\n101\n", "{diagnosed:?}");
    let lines: Vec<(&str, &str, Option<&str>)> = diagnosed
        .denials
        .iter()
        .filter(|d| d.layer != airlock::result::DenialLayer::Seccomp)
        .map(|d| (d.layer.as_str(), d.object.as_str(), d.rule.as_deref()))
        .collect();
    assert!(
        lines.contains(&(
            "mounts",
            file.display().to_string().as_str(),
            Some("not in the sandbox")
        )),
        "{lines:?}"
    );
    assert!(
        lines.contains(&("mounts", "/usr/airlock-diagnose", Some("read-only"))),
        "{lines:?}"
    );
    assert!(
        lines.contains(&(
            "network",
            "192.0.2.1:80",
            Some("the profile has only loopback (and its egress proxy, by name)")
        )),
        "{lines:?}"
    );
    assert!(
        !lines
            .iter()
            .any(|(_, object, _)| object.contains("nonexistent")),
        "{lines:?}"
    );
    let reporting = diagnosed.isolation.as_ref().unwrap().denial_reporting;
    assert_eq!(reporting.mounts, airlock::result::Coverage::Reported);
    assert_eq!(reporting.network, airlock::result::Coverage::Reported);

    // The same call, not diagnosed: the same outcome, and the record says it cannot tell.
    let plain = supervisor
        .run(run_of(default_profile_as(Form::Reporting), script), None)
        .await;
    assert_eq!(plain.stdout, diagnosed.stdout, "{plain:?}");
    assert!(
        plain
            .denials
            .iter()
            .all(|d| d.layer == airlock::result::DenialLayer::Seccomp),
        "{plain:?}"
    );
    let reporting = plain.isolation.as_ref().unwrap().denial_reporting;
    assert_eq!(reporting.mounts, airlock::result::Coverage::Unavailable);
    supervisor.close().await;
}

#[test]
fn exec_diagnose_lists_a_read_outside_the_binds_and_a_write_to_a_read_only_path() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let outside = airlock_tests::Scratch::under(std::path::Path::new("/var/tmp"), "diagnose");
    let file = outside.write("outside.txt", "x");
    let file = file.display().to_string();
    let script = format!("cat {file}; echo x > /usr/airlock-diagnose; echo done");
    let command = ["/bin/sh", "-c", script.as_str()];
    let result = exec_json(None, &["--diagnose"], &command);
    assert_eq!(stdout_of(&result), "done\n", "{result}");
    let denials = result["denials"].as_array().unwrap();
    let has = |object: &str, rule: &str| {
        denials
            .iter()
            .any(|d| d["layer"] == "mounts" && d["object"] == object && d["rule"] == rule)
    };
    assert!(has(&file, "not in the sandbox"), "{result}");
    assert!(has("/usr/airlock-diagnose", "read-only"), "{result}");
    assert_eq!(
        result["isolation"]["denial_reporting"]["mounts"], "reported",
        "{result}"
    );
}
