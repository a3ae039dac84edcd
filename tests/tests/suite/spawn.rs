//! Starting workers: what a new worker is handed does not grow with what the supervisor
//! holds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use airlock::SandboxRun;
use airlock_policy::load_policy_str;
use airlock_tests::{HANG_GUARD, added_since, our_children, sandbox_available, wait_until_async};

/// `FDSize` of a process: how many descriptors its table has room for, which never shrinks.
fn descriptor_table_size(pid: &str) -> Option<usize> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("FDSize:"))
        .and_then(|size| size.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_gets_a_small_descriptor_table_however_many_the_supervisor_holds() {
    // Exclusive: it counts this process's children, and its thousand descriptors would
    // sit below every other test's.
    let _guard = airlock_tests::exclusive();
    if !sandbox_available() {
        return;
    }
    let text = airlock_policy::presets::preset_text("default").unwrap();
    let policy = load_policy_str(text, "default").unwrap().policy;
    let profile = Arc::clone(&policy.profiles["default"]);
    let supervisor = Arc::new(airlock_tests::supervisor());
    supervisor.keep_warm(Arc::clone(&profile), 1);
    wait_until_async("the pool is warm", || supervisor.pool_stats().idle == 1).await;

    // A thousand descriptors, as a daemon with a few hundred calls in flight holds. Before,
    // every new worker's child got a copy of the whole table (and closed it again at exec).
    let held: Vec<std::fs::File> = (0..1000)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect();
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
    let new_children = added_since(&children_before, our_children());
    assert!(!new_children.is_empty(), "no worker was cloned");
    for pid in &new_children {
        // A child that already ended has no status to read.
        if let Some(size) = descriptor_table_size(pid) {
            assert!(
                size < 1000,
                "worker {pid} has room for {size} descriptors: it was given the supervisor's table"
            );
        }
    }
    drop(held);
    supervisor.close().await;
}
