//! Limits and deadlines: what happens to tools that run too long, eat memory, fork, flood
//! their output or open too many files — and that nothing is left on the host afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use airlock_tests::{
    Scratch, exec_json, host_processes_with, sandbox_available, stdout_of, test_policy,
};

#[test]
fn deadline_kills_a_setsid_double_forked_sigterm_ignoring_tree() {
    if !sandbox_available() {
        return;
    }
    let marker = format!("1{}.25", std::process::id());
    let script = format!(
        "trap '' TERM; setsid sh -c 'trap \"\" TERM; sleep {marker}' & (sh -c 'sleep {marker} &' &); sleep {marker}"
    );
    let started = Instant::now();
    let result = exec_json(None, &["--timeout", "1s"], &["/bin/sh", "-c", &script]);
    let elapsed = started.elapsed();
    assert_eq!(result["error"]["kind"], "timeout", "{result}");
    assert_eq!(result["error"]["timeout_ms"], 1000);
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    let left = host_processes_with(&format!("sleep {marker}"));
    assert!(left.is_empty(), "processes left on the host: {left:?}");
}

#[test]
fn memory_bomb_gives_out_of_memory() {
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
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("forkbomb");
    let policy = scratch.write(
        "p.toml",
        &test_policy(&[], "pids = 16, timeout = \"2s\"", "none"),
    );
    let marker = format!("2{}.5", std::process::id());
    let script = format!("while :; do sleep {marker} & done");
    let result = exec_json(Some(&policy), &[], &["/bin/sh", "-c", &script]);
    assert_eq!(result["error"]["kind"], "pids_limit", "{result}");
    assert!(host_processes_with(&format!("sleep {marker}")).is_empty());
}

#[test]
fn output_flood_is_truncated_with_the_flag_set() {
    if !sandbox_available() {
        return;
    }
    let started = Instant::now();
    let result = exec_json(
        None,
        &[],
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
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn fd_bomb_hits_the_open_files_limit() {
    if !sandbox_available() {
        return;
    }
    let probe = airlock_tests::fixture_bin("airlock-probe");
    let scratch = Scratch::new("fdbomb");
    let policy = scratch.write("p.toml", &test_policy(&[&probe], "open_files = 32", "none"));
    let result = exec_json(Some(&policy), &[], &[probe.to_str().unwrap(), "fd-bomb"]);
    assert_eq!(stdout_of(&result).trim(), "opened=29 errno=24", "{result}");
}

#[test]
fn cpu_time_and_limits_are_reported() {
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
fn supervisor_death_kills_its_workers() {
    if !sandbox_available() {
        return;
    }
    let marker = format!("5{}.5", std::process::id());
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while host_processes_with(&pattern).is_empty() {
        assert!(Instant::now() < deadline, "the tool never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let dead_pid = supervisor.id();
    supervisor.kill().unwrap();
    supervisor.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !host_processes_with(&pattern).is_empty() {
        assert!(
            Instant::now() < deadline,
            "workers outlived their supervisor: {:?}",
            host_processes_with(&pattern)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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

#[test]
fn cpu_quota_throttles_a_spinning_tool() {
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("cpuquota");
    let spin = [
        "/bin/sh",
        "-c",
        "/usr/bin/timeout 1 /bin/sh -c 'while :; do :; done'; true",
    ];
    let cpu_ms = |limits: &str| {
        let policy = scratch.write(
            &format!("p{}.toml", limits.len()),
            &test_policy(&[], limits, "none"),
        );
        let result = exec_json(Some(&policy), &[], &spin);
        assert_eq!(result["ok"], true, "{result}");
        result["usage"]["cpu_ms"].as_u64().unwrap()
    };
    let free = cpu_ms("timeout = \"10s\"");
    let throttled = cpu_ms("cpu_quota = \"20%\", timeout = \"10s\"");
    // 20% of one core for one second is ~200 ms of CPU; unthrottled the spin gets far more
    // (on the host ~1,000 against ~200). Under qemu's emulation the CPU accounting is
    // coarse: one VM run of 6.1 measured 583 against 1,109 ms, so the bound is 3/4 of the
    // free run — still far below what an unenforced quota gives (the same as free).
    assert!(free > 300, "the unthrottled spin got only {free} ms");
    assert!(
        throttled * 4 < free * 3,
        "throttled {throttled} ms vs free {free} ms"
    );
}
