//! Limits and deadlines: what happens to tools that run too long, eat memory, fork, flood
//! their output or open too many files — and that nothing is left on the host afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use airlock::{CancelSignal, SandboxRun};
use airlock_policy::load_policy_str;
use airlock_tests::{
    HANG_GUARD, Scratch, exec_json, hang_guard_toml, host_processes_with, must_work,
    our_cgroup_dirs, sandbox_available, stdout_of, test_policy, wait_until, wait_until_async,
};

#[test]
fn deadline_kills_a_setsid_double_forked_sigterm_ignoring_tree() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let marker = airlock_tests::sleep_marker();
    let script = format!(
        "trap '' TERM; setsid sh -c 'trap \"\" TERM; sleep {marker}' & (sh -c 'sleep {marker} &' &); sleep {marker}"
    );
    let started = Instant::now();
    let result = exec_json(None, &["--timeout", "1s"], &["/bin/sh", "-c", &script]);
    let elapsed = started.elapsed();
    assert_eq!(result["error"]["kind"], "timeout", "{result}");
    assert_eq!(result["error"]["timeout_ms"], 1000);
    // Unless killed, the tree sleeps far longer than the hang guard; how soon after the
    // deadline the answer comes is the machine's.
    assert!(elapsed < HANG_GUARD, "took {elapsed:?}");
    let left = host_processes_with(&format!("sleep {marker}"));
    assert!(left.is_empty(), "processes left on the host: {left:?}");
}

#[test]
fn memory_bomb_gives_out_of_memory() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = exec_json(
        None,
        &["--memory", "32MiB"],
        &[
            "/bin/sh",
            "-c",
            "a=xxxxxxxxxxxxxxxx; while :; do a=$a$a; done",
        ],
    );
    assert_eq!(result["error"]["kind"], "out_of_memory", "{result}");
    assert!(
        result["usage"]["peak_memory_bytes"].as_u64().unwrap() <= 32 << 20,
        "{result}"
    );
}

#[test]
fn fork_bomb_is_contained_and_reported() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("forkbomb");
    // The deadline only guards against a shell that spins on refused forks: a short one
    // could pass during a slow spawn, before the first fork, and answer `timeout`.
    let policy = scratch.write(
        "p.toml",
        &test_policy(
            &[],
            &format!("pids = 16, timeout = {}", hang_guard_toml()),
            "none",
        ),
    );
    let marker = airlock_tests::sleep_marker();
    let script = format!("while :; do sleep {marker} & done");
    let result = exec_json(Some(&policy), &[], &["/bin/sh", "-c", &script]);
    assert_eq!(result["error"]["kind"], "pids_limit", "{result}");
    assert!(host_processes_with(&format!("sleep {marker}")).is_empty());
}

#[test]
fn output_flood_is_truncated_with_the_flag_set() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // A flood not drained to the end would block the tool until its deadline, which is
    // long so that a slow machine's drain is not cut short.
    let timeout = format!("{}s", HANG_GUARD.as_secs());
    let result = exec_json(
        None,
        &["--timeout", &timeout],
        &[
            "/bin/sh",
            "-c",
            // 16 MiB: 256 times the limit, drained to the end (100 MiB took over 30 s
            // under qemu's emulation).
            "head -c 16777216 /dev/zero | tr '\\0' x; head -c 1000000 /dev/zero >&2",
        ],
    );
    assert_eq!(result["ok"], true, "{}", result["error"]);
    assert_eq!(result["stdout_truncated"], true);
    assert_eq!(result["stderr_truncated"], true);
    assert_eq!(stdout_of(&result).len(), 64 << 10);
    assert!(stdout_of(&result).bytes().all(|b| b == b'x'));
}

#[test]
fn the_largest_output_limit_fits_both_streams_in_one_report_and_no_larger_is_taken() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // Over the largest limit on both streams: each is cut there, and the worker's report
    // carrying both still fits in one frame.
    let scratch = Scratch::new("largest-output");
    let limits = format!(
        "output = \"4MiB\", memory = \"512MiB\", timeout = {}",
        hang_guard_toml()
    );
    let policy = scratch.write("p.toml", &test_policy(&[], &limits, "none"));
    let result = exec_json(
        Some(&policy),
        &[],
        &[
            "/bin/sh",
            "-c",
            "head -c 5000000 /dev/zero | tr '\\0' a; head -c 5000000 /dev/zero | tr '\\0' b >&2",
        ],
    );
    assert_eq!(result["ok"], true, "{}", result["error"]);
    assert_eq!(result["stdout_truncated"], true);
    assert_eq!(result["stderr_truncated"], true);
    assert_eq!(stdout_of(&result).len(), 4 << 20);
    assert_eq!(result["stderr"].as_str().unwrap().len(), 4 << 20);
    // A larger limit, whose two streams could not travel in one report, is refused.
    let larger = test_policy(&[], "output = \"16MiB\"", "none");
    let Err(airlock_policy::PolicyError::Invalid { diagnostics, .. }) =
        load_policy_str(&larger, "p.toml")
    else {
        panic!("an output limit of 16 MiB was taken");
    };
    assert!(
        diagnostics
            .iter()
            .any(|d| d.message.contains("limits.output")),
        "{diagnostics:?}"
    );
}

#[test]
fn fd_bomb_hits_the_open_files_limit() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("fdbomb");
    let probe = scratch.stage("airlock-probe");
    let policy = scratch.write("p.toml", &test_policy(&[&probe], "open_files = 32", "none"));
    let result = exec_json(Some(&policy), &[], &[probe.to_str().unwrap(), "fd-bomb"]);
    assert_eq!(stdout_of(&result).trim(), "opened=29 errno=24", "{result}");
}

#[test]
fn cpu_time_and_limits_are_reported() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let result = exec_json(
        None,
        &[],
        &[
            "/bin/sh",
            "-c",
            "i=0; while [ $i -lt 50000 ]; do i=$((i+1)); done",
        ],
    );
    assert_eq!(result["ok"], true, "{result}");
    assert!(result["usage"]["cpu_ms"].as_u64().unwrap() > 0, "{result}");
    assert_eq!(result["isolation"]["limits"]["memory_bytes"], 256u64 << 20);
    assert_eq!(result["isolation"]["limits"]["pids"], 64);
    assert!(result["isolation"]["cgroup"] == "v1" || result["isolation"]["cgroup"] == "v2");
}

#[test]
fn cpu_of_children_reaped_unwaited_is_counted_where_the_cgroup_counts_cpu() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // The tool ignores SIGCHLD, so the kernel reaps its spinning child and adds its 300 ms
    // to no one's RUSAGE_CHILDREN: the worker's own count misses it.
    let scratch = Scratch::new("unwaited");
    let probe = scratch.stage("airlock-probe");
    let policy = scratch.write("p.toml", &test_policy(&[&probe], "", "none"));
    let result = exec_json(
        Some(&policy),
        &[],
        &[probe.to_str().unwrap(), "unwaited-spin"],
    );
    assert_eq!(
        stdout_of(&result).trim(),
        "child ended unwaited",
        "{result}"
    );
    let cpu_ms = result["usage"]["cpu_ms"].as_u64().unwrap();
    match result["isolation"]["cgroup"].as_str() {
        // v2 counts every process of the worker's cgroup.
        Some("v2") => assert!(cpu_ms >= 300, "{result}"),
        // v1's memory and pids hierarchies count no CPU: what no one waited for is missed,
        // as docs/policy.md says (this shows the tool really hides it).
        _ => assert!(cpu_ms < 300, "{result}"),
    }
}

#[test]
fn supervisor_death_kills_its_workers() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let marker = airlock_tests::sleep_marker();
    let mut supervisor = std::process::Command::new(airlock_tests::airlock_bin())
        .args([
            "exec",
            "--json",
            "--",
            "/bin/sh",
            "-c",
            &format!("sleep {marker}"),
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pattern = format!("sleep {marker}");
    wait_until("the tool runs", || {
        !host_processes_with(&pattern).is_empty()
    });
    let dead_pid = supervisor.id();
    supervisor.kill().unwrap();
    supervisor.wait().unwrap();
    wait_until("the workers die with their supervisor", || {
        host_processes_with(&pattern).is_empty()
    });
    // The dead supervisor could not remove its worker's cgroup; the next one sweeps it.
    let next = exec_json(None, &[], &["/bin/true"]);
    assert_eq!(next["ok"], true);
    let stale = format!("airlock-{dead_pid}-");
    for root in ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"] {
        if let Ok(entries) = std::fs::read_dir(root) {
            for entry in entries.flatten() {
                assert!(
                    !entry.file_name().to_string_lossy().starts_with(&stale),
                    "stale cgroup {:?}",
                    entry.path()
                );
            }
        }
    }
}

#[test]
fn exec_and_run_leave_no_cgroup_behind() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    for args in [
        vec!["exec", "--json", "--", "/bin/true"],
        vec![
            "run",
            "--tool",
            "word_count",
            "--input",
            "{\"text\": \"a b\"}",
        ],
    ] {
        let child = std::process::Command::new(airlock_tests::airlock_bin())
            .args(&args)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let status = child.wait_with_output().unwrap().status;
        assert!(status.success(), "{args:?}");
        let prefix = format!("airlock-{pid}-");
        for root in [
            "/sys/fs/cgroup/pids",
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/memory",
        ] {
            let Ok(entries) = std::fs::read_dir(root) else {
                continue;
            };
            for entry in entries.flatten() {
                assert!(
                    !entry.file_name().to_string_lossy().starts_with(&prefix),
                    "{args:?} left {:?}",
                    entry.path()
                );
            }
        }
    }
}

/// `nr_throttled` of the cgroup directory `dir`'s cpu.stat (0 where it has none).
fn nr_throttled(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("cpu.stat"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("nr_throttled "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// The kernel's own count says the quota binds. Comparing the CPU time a throttled and a
/// free run got measured the machine too: qemu's emulation accounts coarsely (a throttled
/// 583 ms against a free 1,109 once), and a loaded host gives the free run less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_quota_throttles_a_spinning_tool() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let supervisor = airlock_tests::supervisor();
    let parents: Vec<PathBuf> = match supervisor.cgroups() {
        Ok(parent) if parent.supports_cpu_quota() => {
            parent.dirs().into_iter().map(Path::to_path_buf).collect()
        }
        other => {
            let why = format!(
                "no cpu controller for quotas: {:?}",
                other.map(|p| p.dirs())
            );
            assert!(!must_work(), "{why} and AIRLOCK_MUST_WORK=1");
            eprintln!("SKIP: {why}");
            return;
        }
    };
    let text = test_policy(
        &[],
        &format!("cpu_quota = \"20%\", timeout = {}", hang_guard_toml()),
        "none",
    );
    let policy = load_policy_str(&text, "quota.toml").unwrap().policy;
    let run = SandboxRun {
        call_id: "spin".into(),
        tool: "exec".into(),
        profile: Arc::clone(&policy.profiles["default"]),
        argv: vec!["/bin/sh".into(), "-c".into(), "while :; do :; done".into()],
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout: HANG_GUARD,
        inherit_stdio: None,
        builtin: None,
    };
    let signal = CancelSignal::new();
    let call = supervisor.run(run, Some(&signal));
    tokio::pin!(call);
    // A quota that is never written never throttles: this then fails at the hang guard.
    let throttled = || {
        our_cgroup_dirs(&parents)
            .iter()
            .any(|name| parents.iter().any(|p| nr_throttled(&p.join(name)) > 0))
    };
    tokio::select! {
        result = &mut call => panic!("the spin ended before it was throttled: {result:?}"),
        () = wait_until_async("the spinning tool is throttled", throttled) => {}
    }
    signal.cancel();
    let result = call.await;
    assert_eq!(
        result.error.as_ref().map(|e| e.kind),
        Some(airlock::ErrorKind::Cancelled),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_call_keeps_what_the_tool_wrote_and_leaves_nothing_running() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // A worker answers a stop at once; the grace is only the bound for one that does not,
    // so this test waits on the answer however slow the machine.
    let supervisor = airlock::Supervisor::start(airlock::SupervisorOptions {
        worker_program: Some((airlock_tests::airlock_bin(), Vec::new())),
        stop_grace: Some(HANG_GUARD),
        ..Default::default()
    })
    .unwrap();
    let text = test_policy(&[], &format!("timeout = {}", hang_guard_toml()), "none");
    let policy = load_policy_str(&text, "stop.toml").unwrap().policy;
    let marker = airlock_tests::sleep_marker();
    let run = SandboxRun {
        call_id: "stopped".into(),
        tool: "exec".into(),
        profile: Arc::clone(&policy.profiles["default"]),
        argv: vec![
            "/bin/sh".into(),
            "-c".into(),
            // Through variables, so that only the sleeps' command lines say `sleep <marker>`.
            format!("s=sleep m={marker}; echo started; echo warning >&2; $s $m & $s $m"),
        ],
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout: HANG_GUARD,
        inherit_stdio: None,
        builtin: None,
    };
    let signal = CancelSignal::new();
    let call = supervisor.run(run, Some(&signal));
    tokio::pin!(call);
    // Both sleeps run once the shell has written both lines.
    let sleeping = || host_processes_with(&format!("sleep {marker}")).len() == 2;
    tokio::select! {
        result = &mut call => panic!("the call ended on its own: {result:?}"),
        () = wait_until_async("the tool wrote and sleeps", sleeping) => {}
    }
    signal.cancel();
    let result = call.await;
    assert_eq!(
        result.error.as_ref().map(|e| e.kind),
        Some(airlock::ErrorKind::Cancelled),
        "{result:?}"
    );
    assert_eq!(result.stdout, "started\n", "{result:?}");
    assert_eq!(result.stderr, "warning\n", "{result:?}");
    assert!(!result.stdout_truncated && !result.stderr_truncated);
    assert_eq!((result.exit_code, result.signal), (None, None));
    let left = host_processes_with(&format!("sleep {marker}"));
    assert!(left.is_empty(), "processes left on the host: {left:?}");
    supervisor.close().await;
}

#[test]
fn cpu_time_and_file_size_kills_name_their_limit() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("rlimits");
    let policy = scratch.write(
        "rlimits.toml",
        &test_policy(
            &[],
            &format!(
                "cpu = \"1s\", file_size = \"1MiB\", timeout = {}",
                hang_guard_toml()
            ),
            "none",
        ),
    );
    // The shell itself spins: the kernel kills it once it has used its second of CPU,
    // however long that takes on this machine.
    let spin = exec_json(
        Some(&policy),
        &[],
        &["/bin/sh", "-c", "while :; do :; done"],
    );
    assert_eq!(spin["error"]["kind"], "cpu_time_limit", "{spin}");
    // The precise time used can fall far short of the kernel's count (see below).
    assert!(spin["usage"]["cpu_ms"].as_u64().unwrap() > 0, "{spin}");
    assert_eq!(
        spin["denials"],
        serde_json::json!([{"layer": "limit", "object": "cpu_time", "count": 1}]),
        "{spin}"
    );
    // dd is the tool itself, so its SIGXFSZ is the tool's death.
    let big = exec_json(
        Some(&policy),
        &[],
        &[
            "/bin/dd",
            "if=/dev/zero",
            "of=/tmp/big",
            "bs=65536",
            "count=64",
        ],
    );
    assert_eq!(big["error"]["kind"], "file_size_limit", "{big}");
    assert_eq!(big["signal"], libc::SIGXFSZ, "{big}");
    assert_eq!(
        big["denials"],
        serde_json::json!([{"layer": "limit", "object": "file_size", "count": 1}]),
        "{big}"
    );
}

/// Pins the thread or process `pid` (0: the caller) to the first CPU.
fn pin_to_first_cpu(pid: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain old data, for which all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU 0 lies within the set that `set` points to.
    unsafe { libc::CPU_SET(0, &mut set) };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid set of `size` bytes for the duration of the call.
    match unsafe { libc::sched_setaffinity(pid, size, &set) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// A thread on the first CPU that wakes every 0.7 ms and then runs for 1.5 ms, until
/// dropped: it takes the CPU between the scheduler's ticks, so a task spinning beside it
/// is charged whole ticks it did not fully run.
struct TickThief {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TickThief {
    fn start() -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            pin_to_first_cpu(0).unwrap();
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_micros(700));
                let busy = Instant::now();
                while busy.elapsed() < std::time::Duration::from_micros(1500) {
                    std::hint::spin_loop();
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for TickThief {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// RLIMIT_CPU is checked against CPU time sampled at the scheduler's ticks; with another
/// task taking the CPU between ticks, a spinning tool is killed at its 1 s by that count
/// having run barely half of it. The kill is still named the CPU limit: the worker reads
/// the kernel's count, not only the precise time.
#[test]
fn a_cpu_limit_kill_is_named_while_another_task_shares_the_cpu() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("rlimit-cpu-shared");
    let policy = scratch.write(
        "cpu.toml",
        &test_policy(
            &[],
            &format!("cpu = \"1s\", timeout = {}", hang_guard_toml()),
            "none",
        ),
    );
    let _thief = TickThief::start();
    let mut command = std::process::Command::new(airlock_tests::airlock_bin());
    command
        .args(["exec", "--json", "--policy"])
        .arg(&policy)
        .args(["--", "/bin/sh", "-c", "while :; do :; done"]);
    // SAFETY: the hook runs in the forked child before exec and only makes one syscall.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || pin_to_first_cpu(0));
    }
    let out = command.output().unwrap();
    let spin: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(spin["error"]["kind"], "cpu_time_limit", "{spin}");
    assert_eq!(spin["signal"], libc::SIGKILL, "{spin}");
}

/// A hard limit lower than the profile's, inherited from whoever started airlock, is
/// kept (it is stricter) instead of failing the call trying to raise it: the tool runs
/// with the lower one.
#[test]
fn a_lower_inherited_limit_is_kept_and_the_call_runs() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("inherited-rlimits");
    let policy = scratch.write(
        "rlimits.toml",
        &test_policy(
            &[],
            &format!("open_files = 256, timeout = {}", hang_guard_toml()),
            "none",
        ),
    );
    let mut command = std::process::Command::new(airlock_tests::airlock_bin());
    command
        .args(["exec", "--json", "--policy"])
        .arg(&policy)
        .args(["--", "/bin/sh", "-c", "ulimit -Sn; ulimit -Hn"]);
    airlock_tests::with_open_file_limit(&mut command, 128, 128);
    let out = command.output().unwrap();
    let result: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["stdout"], "128\n128\n", "{result}");
}
