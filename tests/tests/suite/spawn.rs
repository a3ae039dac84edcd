//! Starting workers and their waiting: what a new worker is handed does not grow with what
//! the supervisor holds, and a worker whose tool runs wakes only when something happens.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use airlock::SandboxRun;
use airlock_policy::load_policy_str;
use airlock_tests::{
    HANG_GUARD, added_since, exec_json, our_children, sandbox_available, wait_until_async,
};

/// `FDSize` of a process: how many descriptors its table has room for, which never shrinks.
fn descriptor_table_size(pid: &str) -> Option<usize> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("FDSize:"))
        .and_then(|size| size.trim().parse().ok())
}

/// Raises this process's soft descriptor limit to its hard one; returns the new limit.
fn raise_descriptor_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the valid struct given.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(got, 0);
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit reads one valid rlimit; raising the soft limit to the hard one is
    // always permitted.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
}

/// A thousand descriptors held open, as a daemon with a few hundred calls in flight holds,
/// or as many as the hard limit leaves room for (the kernel matrix's VM allows 1,024).
fn hold_many_descriptors() -> Vec<std::fs::File> {
    let limit = raise_descriptor_limit();
    let count = 1000.min(limit.saturating_sub(200));
    assert!(
        count > 256,
        "a descriptor limit of {limit} leaves no room for the test"
    );
    (0..count)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect()
}

/// Every newly cloned worker has a table with room for fewer than `held` descriptors: it
/// was not given a copy of the supervisor's.
fn assert_small_tables(new_children: &[String], held: usize) {
    assert!(!new_children.is_empty(), "no worker was cloned");
    for pid in new_children {
        // A child that already ended has no status to read.
        if let Some(size) = descriptor_table_size(pid) {
            assert!(
                size < held,
                "worker {pid} has room for {size} descriptors: it was given the supervisor's table"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_gets_a_small_descriptor_table_however_many_the_supervisor_holds() {
    let _guard = airlock_tests::exclusive();
    // Exclusive: it counts this process's children, and its thousand descriptors would
    // sit below every other test's.
    if !sandbox_available() {
        return;
    }
    let text = airlock_policy::presets::preset_text("default").unwrap();
    let policy = load_policy_str(text, "default").unwrap().policy;
    let profile = Arc::clone(&policy.profiles["default"]);
    let supervisor = Arc::new(airlock_tests::supervisor());
    supervisor.keep_warm(Arc::clone(&profile), 1);
    wait_until_async("the pool is warm", || supervisor.pool_stats().idle == 1).await;

    // Before, every new worker's child got a copy of the whole table (and closed it again
    // at exec), so its table had room for at least as many.
    let held = hold_many_descriptors();
    let count = held.len();
    let children_before = our_children();
    // Taking the pooled worker makes the pool clone its replacement now.
    let result = supervisor
        .run(
            SandboxRun {
                call_id: "fds".into(),
                tool: "exec".into(),
                profile: Arc::clone(&profile),
                argv: vec!["/bin/true".into()],
                stdin: Vec::new(),
                arguments_json: "{}".into(),
                timeout: HANG_GUARD,
                inherit_stdio: None,
                builtin: None,
            },
            None,
        )
        .await;
    assert!(result.ok, "{result:?}");
    wait_until_async("the pool is refilled", || {
        let stats = supervisor.pool_stats();
        stats.hits == 1 && stats.idle == 1
    })
    .await;
    assert_small_tables(&added_since(&children_before, our_children()), count);
    drop(held);
    supervisor.close().await;
}

/// The same for a pool whose root template is made while the supervisor already holds a
/// thousand descriptors: its spawner thread starts then, and takes slots reserved when the
/// supervisor started, so its workers too get a small table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_made_late_still_gives_its_workers_a_small_descriptor_table() {
    let _guard = airlock_tests::exclusive();
    if !sandbox_available() {
        return;
    }
    let text = airlock_policy::presets::preset_text("default").unwrap();
    let policy = load_policy_str(text, "default").unwrap().policy;
    let profile = Arc::clone(&policy.profiles["default"]);
    let supervisor = Arc::new(airlock_tests::supervisor());
    let held = hold_many_descriptors();
    let count = held.len();
    let children_before = our_children();
    // The pool's first worker makes the profile's template (where this supervisor can)
    // and is cloned by its thread.
    supervisor.keep_warm(Arc::clone(&profile), 1);
    wait_until_async("the pool is warm", || supervisor.pool_stats().idle == 1).await;
    assert_small_tables(&added_since(&children_before, our_children()), count);
    drop(held);
    supervisor.close().await;
}

/// While its tool runs and nothing happens, the worker sleeps: it wakes for output, for a
/// child that ends, for the supervisor, never on a timer (which, 50 times a second per call
/// in flight, took a busy daemon's CPU). Counted from inside the sandbox, where the worker
/// is PID 1: its voluntary context switches across a second of the tool's sleep.
#[test]
fn a_worker_sleeps_while_its_tool_sleeps() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let script = "s() { while read -r k v; do [ \"$k\" = voluntary_ctxt_switches: ] && echo \"$v\"; done < /proc/1/status; }; a=$(s); sleep 1; b=$(s); echo $((b - a))";
    let result = exec_json(None, &["--timeout", "300s"], &["/bin/sh", "-c", script]);
    assert_eq!(result["exit_code"], 0, "{result}");
    let woke: u64 = result["stdout"]
        .as_str()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count printed: {result}"));
    // A timer of 20 ms woke it about 50 times here.
    assert!(
        woke < 10,
        "the worker woke {woke} times while its tool slept"
    );
}

/// The tool's orphans, which the worker inherits as its namespace's init, are reaped while
/// the tool still runs (a tool making many would otherwise fill its pids limit with
/// zombies): the tool waits until none of them is left a zombie, then says so.
#[test]
fn the_tools_orphans_are_reaped_while_it_runs() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let script = "i=0; while [ $i -lt 20 ]; do (true &); i=$((i + 1)); done; \
        while :; do z=0; for st in /proc/[0-9]*/stat; do read -r line < \"$st\" || continue; \
        case \"$line\" in *') Z '*) z=1;; esac; done; [ $z = 0 ] && break; sleep 0.05; done; \
        echo reaped";
    let result = exec_json(None, &["--timeout", "300s"], &["/bin/sh", "-c", script]);
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(result["stdout"], "reaped\n", "{result}");
}

/// A tool may signal its worker (PID 1 of the namespace, now with a SIGCHLD handler):
/// thousands of SIGCHLD while it writes a line each time cost the call nothing — every
/// line arrives, the exit status is the tool's, and the run ends when the tool does.
#[test]
fn a_tool_flooding_its_worker_with_sigchld_changes_nothing() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let script = "i=0; while [ $i -lt 2000 ]; do kill -CHLD 1 || exit 9; echo $i; \
        i=$((i + 1)); done; (true &); exit 3";
    let result = exec_json(None, &["--timeout", "300s"], &["/bin/sh", "-c", script]);
    assert_eq!(result["exit_code"], 3, "{result}");
    let stdout = result["stdout"].as_str().unwrap_or_default();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2000, "{result}");
    assert_eq!(lines.last(), Some(&"1999"));
}
