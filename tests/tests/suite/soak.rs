//! Soak: thousands of calls (10,000 in CI: `AIRLOCK_SOAK_CALLS`) with injected faults —
//! workers that crash, break the protocol or leave early, tools that run out of memory or
//! past their deadline, callers that cancel — from several concurrent clients. Every call
//! must get exactly one result of the kind its fault implies, and afterwards none of the
//! processes, cgroup directories, supervisor descriptors or mounts it made may remain. It
//! runs alone (`airlock_tests::exclusive`): those are the whole process's to count.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::{CancelSignal, ErrorKind, SandboxRun, Supervisor};
use airlock_policy::{CompiledProfile, load_policy_str};
use airlock_tests::{
    HANG_GUARD, added_since, our_cgroup_dirs, our_children, sandbox_available,
    supervisor_with_hostile_worker, test_policy,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    None,
    OutOfMemory,
    Timeout,
    Cancel,
    WorkerCrash,
    GarbageFrames,
    EarlyExit,
}

impl Fault {
    /// Four in ten calls are healthy; the rest cycle through the faults.
    fn for_call(i: usize) -> Fault {
        match i % 10 {
            0..=3 => Fault::None,
            4 => Fault::OutOfMemory,
            5 => Fault::Timeout,
            6 => Fault::Cancel,
            7 => Fault::WorkerCrash,
            8 => Fault::GarbageFrames,
            _ => Fault::EarlyExit,
        }
    }

    fn expected(self) -> Option<ErrorKind> {
        match self {
            Fault::None => None,
            Fault::OutOfMemory => Some(ErrorKind::OutOfMemory),
            Fault::Timeout => Some(ErrorKind::Timeout),
            Fault::Cancel => Some(ErrorKind::Cancelled),
            Fault::WorkerCrash | Fault::GarbageFrames | Fault::EarlyExit => {
                Some(ErrorKind::ProtocolViolation)
            }
        }
    }
}

struct Rig {
    real: Supervisor,
    crash: Supervisor,
    garbage: Supervisor,
    early_exit: Supervisor,
    profile: Arc<CompiledProfile>,
    probe: String,
}

impl Rig {
    async fn call(&self, i: usize) -> (usize, Fault, String, Option<ErrorKind>) {
        let fault = Fault::for_call(i);
        let call_id = format!("soak-{i}");
        let (supervisor, argv) = match fault {
            Fault::None => (&self.real, vec!["/bin/true".to_string()]),
            Fault::OutOfMemory => (&self.real, vec![self.probe.clone(), "memory-bomb".into()]),
            Fault::Timeout | Fault::Cancel => {
                (&self.real, vec![self.probe.clone(), "sleep".into()])
            }
            Fault::WorkerCrash => (&self.crash, vec!["/bin/true".to_string()]),
            Fault::GarbageFrames => (&self.garbage, vec!["/bin/true".to_string()]),
            Fault::EarlyExit => (&self.early_exit, vec!["/bin/true".to_string()]),
        };
        let run = SandboxRun {
            call_id: call_id.clone(),
            tool: "soak".into(),
            profile: Arc::clone(&self.profile),
            argv,
            stdin: Vec::new(),
            arguments_json: "{}".into(),
            // The timeout fault: a deadline the sleeping probe cannot meet. Every other call
            // ends by its own event, however loaded the machine: its deadline is a hang
            // guard.
            timeout: if fault == Fault::Timeout {
                Duration::from_millis(300)
            } else {
                HANG_GUARD
            },
            inherit_stdio: None,
            builtin: None,
        };
        let result = if fault == Fault::Cancel {
            let signal = CancelSignal::new();
            let trigger = signal.clone();
            // Cancel at varying points: before the worker is up, while it confines, while
            // the tool runs.
            let delay = Duration::from_millis((i % 7) as u64 * 15);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                trigger.cancel();
            });
            supervisor.run(run, Some(&signal)).await
        } else {
            supervisor.run(run, None).await
        };
        (
            i,
            fault,
            result.call_id.clone(),
            result.error.as_ref().map(|e| e.kind),
        )
    }
}

/// This process's descriptors, `<fd> -> <target>`, but for the one listing them: its number
/// is the lowest free one, which changes as earlier tests' descriptors close.
fn open_fds() -> Vec<String> {
    let listing = format!("/proc/{}/fd", std::process::id());
    let mut fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            if target == Path::new(&listing) {
                return None;
            }
            Some(format!(
                "{} -> {}",
                e.file_name().to_string_lossy(),
                target.display()
            ))
        })
        .collect();
    fds.sort();
    fds
}

/// Mounts in this namespace, but those of another test process's daemons (session tmpfs
/// mounts below scratch directories named with that process's pid), which come and go
/// beside this test and are none of its business.
fn mount_count() -> usize {
    let ours = format!("-{}-", std::process::id());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|line| !line.contains("airlock-test-") || line.contains(&ours))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_of_a_faulty_soak_gets_one_result_and_nothing_is_left_behind() {
    let _guard = airlock_tests::exclusive();
    if !sandbox_available() {
        return;
    }
    let env_number = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let calls = env_number("AIRLOCK_SOAK_CALLS", 1000);
    let clients = env_number("AIRLOCK_SOAK_CLIENTS", 8);
    // What earlier tests of the suite still have is theirs.
    let fds_before = open_fds();
    let children_before = our_children();
    let mounts_before = mount_count();

    let scratch = airlock_tests::Scratch::new("soak");
    let probe = scratch.stage("airlock-probe");
    let text = test_policy(&[&probe], "memory = \"32MiB\", pids = 16", "none");
    let policy = load_policy_str(&text, "soak").unwrap();
    let rig = Arc::new(Rig {
        real: airlock_tests::supervisor(),
        crash: supervisor_with_hostile_worker("crash"),
        garbage: supervisor_with_hostile_worker("garbage"),
        early_exit: supervisor_with_hostile_worker("early-exit"),
        profile: Arc::clone(&policy.policy.profiles["default"]),
        probe: probe.display().to_string(),
    });
    let parents: Vec<PathBuf> = [&rig.real, &rig.crash, &rig.garbage, &rig.early_exit]
        .iter()
        .filter_map(|s| s.cgroups().ok())
        .flat_map(|p| p.dirs().into_iter().map(PathBuf::from))
        .collect();
    let cgroups_before = our_cgroup_dirs(&parents);

    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..clients {
        let rig = Arc::clone(&rig);
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for i in (client..calls).step_by(clients) {
                seen.push(rig.call(i).await);
            }
            seen
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed();

    // Exactly one result per call, carrying its own call id, of the fault's kind.
    assert_eq!(results.len(), calls);
    let ids: HashSet<usize> = results.iter().map(|r| r.0).collect();
    assert_eq!(ids.len(), calls, "a call answered twice or not at all");
    let mut tally: BTreeMap<(Fault, String), usize> = BTreeMap::new();
    let mut wrong = Vec::new();
    for (i, fault, call_id, kind) in &results {
        *tally.entry((*fault, format!("{kind:?}"))).or_default() += 1;
        if call_id != &format!("soak-{i}") || *kind != fault.expected() {
            wrong.push(format!("call {i} ({fault:?}): {call_id} {kind:?}"));
        }
    }
    eprintln!(
        "soak: {calls} calls from {clients} clients in {elapsed:?} ({:.0} calls/s)",
        calls as f64 / elapsed.as_secs_f64()
    );
    for ((fault, kind), n) in &tally {
        eprintln!("  {:<14} → {kind:<26} {n}", format!("{fault:?}"));
    }
    assert!(
        wrong.is_empty(),
        "{} wrong: {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(20)]
    );

    // Nothing left: close waits for the off-critical-path cleanup of every worker.
    let rig = Arc::into_inner(rig).expect("all clients are done");
    for supervisor in [&rig.real, &rig.crash, &rig.garbage, &rig.early_exit] {
        supervisor.close().await;
    }
    assert_eq!(
        added_since(&children_before, our_children()),
        Vec::<String>::new(),
        "processes left"
    );
    assert_eq!(
        added_since(&cgroups_before, our_cgroup_dirs(&parents)),
        Vec::<String>::new(),
        "cgroups left"
    );
    drop(rig);
    assert_eq!(mount_count(), mounts_before, "mounts left");
    assert_eq!(
        added_since(&fds_before, open_fds()),
        Vec::<String>::new(),
        "supervisor descriptors left"
    );
}
