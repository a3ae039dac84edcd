//! Calls given up while their worker is still being spawned — a deadline shorter than the
//! spawn, a cancellation at once, a caller that drops the call's future — answer with their
//! own kind at once (the deadline does not wait for a slow spawn or exec to finish), and
//! every worker so abandoned is killed and reaped: no process, zombie or cgroup is left. It
//! runs alone (`airlock_tests::exclusive`): those are the whole process's to count.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use airlock::{CancelSignal, ErrorKind, SandboxRun};
use airlock_policy::load_policy_str;
use airlock_tests::{added_since, our_cgroup_dirs, our_children, sandbox_available};

#[derive(Debug, Clone, Copy)]
enum GiveUp {
    /// A deadline of 0–2 ms: it passes during the cgroup set-up, the spawn or the exec.
    Deadline(u64),
    /// Cancelled before the call starts.
    Cancel,
    /// The caller drops the call's future after polling it for 0–2 ms.
    Drop(u64),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_given_up_during_the_spawn_answer_and_leave_nothing_behind() {
    let _guard = airlock_tests::exclusive();
    if !sandbox_available() {
        return;
    }
    // What earlier tests of the suite still have is theirs.
    let children_before = our_children();
    let supervisor = Arc::new(airlock_tests::supervisor());
    let policy = load_policy_str(
        airlock_policy::presets::preset_text("default").unwrap(),
        "default",
    )
    .unwrap();
    let profile = Arc::clone(&policy.policy.profiles["default"]);
    let parents = supervisor.cgroups().map(|p| p.dirs()).unwrap_or_default();
    let cgroups_before = our_cgroup_dirs(&parents);

    let mut clients = Vec::new();
    for client in 0..4u64 {
        let supervisor = Arc::clone(&supervisor);
        let profile = Arc::clone(&profile);
        clients.push(tokio::spawn(async move {
            let mut wrong = Vec::new();
            for i in 0..60u64 {
                let give_up = match (client + i) % 3 {
                    0 => GiveUp::Deadline(i % 3),
                    1 => GiveUp::Cancel,
                    _ => GiveUp::Drop(i % 3),
                };
                let run = SandboxRun {
                    call_id: format!("a{client}-{i}"),
                    tool: "exec".into(),
                    profile: Arc::clone(&profile),
                    argv: vec!["/bin/sleep".into(), "30".into()],
                    stdin: Vec::new(),
                    arguments_json: "{}".into(),
                    timeout: match give_up {
                        GiveUp::Deadline(ms) => Duration::from_millis(ms),
                        _ => Duration::from_secs(30),
                    },
                    inherit_stdio: None,
                    builtin: None,
                };
                match give_up {
                    GiveUp::Deadline(_) => {
                        let result = supervisor.run(run, None).await;
                        let kind = result.error.as_ref().map(|e| e.kind);
                        if kind != Some(ErrorKind::Timeout) {
                            wrong.push(format!("{give_up:?}: {:?}", result.error));
                        }
                    }
                    GiveUp::Cancel => {
                        let signal = CancelSignal::new();
                        signal.cancel();
                        let result = supervisor.run(run, Some(&signal)).await;
                        let kind = result.error.as_ref().map(|e| e.kind);
                        if kind != Some(ErrorKind::Cancelled) {
                            wrong.push(format!("{give_up:?}: {:?}", result.error));
                        }
                    }
                    GiveUp::Drop(ms) => {
                        let call = supervisor.run(run, None);
                        let _ = tokio::time::timeout(Duration::from_millis(ms), call).await;
                    }
                }
            }
            wrong
        }));
    }
    let mut wrong = Vec::new();
    for client in clients {
        wrong.extend(client.await.unwrap());
    }
    assert!(wrong.is_empty(), "{wrong:#?}");

    // close waits for the calls' clean-up and for the background reaping of workers whose
    // spawn was abandoned.
    supervisor.close().await;
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
}
