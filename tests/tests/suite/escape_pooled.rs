//! The escape battery against pooled workers: every attack runs in a worker that was
//! pre-confined in a pool — as root, one cloned from its profile's root template — and must
//! end exactly as it does in a cold sandbox (`escape.rs`). Each call gets a supervisor of
//! its own, so that its worker (and its template) is made after the previous call ended:
//! the cases that plant something for the next call see it, as a cold call would.
//!
//! It runs alone (`airlock_tests::exclusive`): it puts a secret in the process environment
//! for its duration, which no other test may race with.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use airlock::{ErrorKind, SandboxRun, Supervisor};
use airlock_battery::{Fixture, Runner};
use airlock_policy::{CompiledPolicy, CompiledProfile};
use airlock_tests::{HANG_GUARD, Scratch, sandbox_available, wait_until_async};

/// Waits until `supervisor`'s pool of `profile` holds a worker, or until a cold worker of
/// the profile shows that none can be made (its set-up is refused) — never for a set time,
/// which a slow machine's spawn could outlast.
async fn pool_filled_or_refused(supervisor: &Supervisor, profile: &Arc<CompiledProfile>) {
    let filled = wait_until_async("the pool holds a worker", || {
        supervisor.pool_stats().idle >= 1
    });
    tokio::pin!(filled);
    // Most pools fill at once; only for one still empty is a cold worker asked. The pause
    // saves work, nothing depends on it.
    tokio::select! {
        () = &mut filled => return,
        () = tokio::time::sleep(Duration::from_secs(1)) => {}
    }
    let cold = airlock_tests::supervisor();
    let refused = async {
        let result = cold
            .run(
                SandboxRun {
                    call_id: "can-it-start".into(),
                    tool: "exec".into(),
                    profile: Arc::clone(profile),
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
        result
            .error
            .is_some_and(|e| e.kind == ErrorKind::SandboxUnavailable)
    };
    tokio::select! {
        () = &mut filled => {}
        refused = refused => {
            if !refused {
                filled.await;
            }
        }
    }
    cold.close().await;
}

/// A variable of this process's environment, removed again on drop (also when the test
/// fails), so that no later test's tool or supervisor inherits it.
struct SecretInEnvironment(&'static str);

impl SecretInEnvironment {
    /// Only while holding the suite alone (`airlock_tests::exclusive`): no other test runs
    /// then, the threads earlier tests may leave behind (a supervisor's reapers) do not
    /// read the environment, and std's own readers (`Command`, `env::var`) take the lock
    /// this write holds.
    fn set(name: &'static str, value: &str) -> Self {
        // SAFETY: see above: no test runs beside this one to read the environment while
        // it changes.
        unsafe { std::env::set_var(name, value) };
        Self(name)
    }
}

impl Drop for SecretInEnvironment {
    fn drop(&mut self) {
        // SAFETY: as in `set`: the test that set it still holds the suite alone.
        unsafe { std::env::remove_var(self.0) };
    }
}

struct PooledRunner {
    runtime: tokio::runtime::Runtime,
    policy: CompiledPolicy,
    /// Calls served by a pooled worker, and those of them whose worker came from a
    /// template.
    pooled: usize,
    templated: usize,
    calls: usize,
    /// Calls whose pool never filled (its workers' set-up is refused), and how they ended.
    unfilled: Vec<serde_json::Value>,
}

impl Runner for PooledRunner {
    fn run(&mut self, profile: &str, argv: Vec<String>) -> Result<serde_json::Value, String> {
        let profile = Arc::clone(
            self.policy
                .profiles
                .get(profile)
                .ok_or_else(|| format!("no profile {profile}"))?,
        );
        let (result, stats) = self.runtime.block_on(async {
            let supervisor = Arc::new(airlock_tests::supervisor());
            supervisor.keep_warm(Arc::clone(&profile), 1);
            pool_filled_or_refused(&supervisor, &profile).await;
            let templated = supervisor.pool_stats().templates_ready;
            let run = SandboxRun {
                call_id: "battery".into(),
                tool: "exec".into(),
                timeout: profile.limits.timeout,
                profile,
                argv,
                stdin: Vec::new(),
                arguments_json: "{}".into(),
                inherit_stdio: None,
                builtin: None,
            };
            let result = supervisor.run(run, None).await;
            let stats = (supervisor.pool_stats().hits, templated);
            supervisor.close().await;
            (result, stats)
        });
        self.calls += 1;
        let result = serde_json::to_value(&result).map_err(|e| e.to_string())?;
        if stats.0 == 1 {
            self.pooled += 1;
            if stats.1 > 0 {
                self.templated += 1;
            }
        } else {
            self.unfilled.push(result.clone());
        }
        Ok(result)
    }
}

#[test]
fn every_attack_in_the_battery_ends_the_documented_way_in_pooled_workers() {
    let _guard = airlock_tests::exclusive();
    if !sandbox_available() {
        return;
    }
    // The "supervisor environment" case fails if it reaches a tool.
    let _secret = SecretInEnvironment::set("AIRLOCK_BATTERY_SECRET", "hunter2");
    // Not below /tmp, and neither is the probe the profiles bind (a checkout may be there):
    // the battery's profiles mount a tmpfs on /tmp, and a bind below a per-worker tmpfs
    // keeps a profile from having a template.
    let scratch = Scratch::under(std::path::Path::new("/var/tmp"), "escape-pooled");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let fixture = Fixture::new(&scratch.0, root.then_some(65534)).unwrap();
    let probe = scratch.0.join("airlock-probe");
    std::fs::copy(airlock_tests::fixture_bin("airlock-probe"), &probe).unwrap();
    let text = fixture.policy_toml(&probe);
    let policy = airlock_policy::load_policy_str(&text, "battery.toml")
        .unwrap()
        .policy;
    let mut runner = PooledRunner {
        runtime: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap(),
        policy,
        pooled: 0,
        templated: 0,
        calls: 0,
        unfilled: Vec::new(),
    };
    let reports = airlock_battery::run(&mut runner, &[probe.display().to_string()], &fixture);
    eprintln!(
        "\nescape battery, pooled workers ({} calls, {} pooled, {} from a template)\n{}",
        runner.calls,
        runner.pooled,
        runner.templated,
        airlock_battery::table(&reports)
    );
    let failed: Vec<_> = reports.iter().filter(|r| !r.ok).collect();
    assert!(failed.is_empty(), "{failed:#?}");
    // Only the call after one that planted a symlink on a nested bind's path finds no
    // pooled worker: the set-up of every worker of it is refused (the template's holder's
    // too), so the pool never fills, and the cold call refuses it the same way.
    assert_eq!(runner.unfilled.len(), 1, "{:#?}", runner.unfilled);
    assert_eq!(
        runner.unfilled[0]["error"]["kind"], "sandbox_unavailable",
        "{:#?}",
        runner.unfilled
    );
    assert_eq!(runner.pooled + 1, runner.calls);
    if root {
        // As root, every profile of the battery has a template: every pooled call came
        // from one.
        assert_eq!(runner.templated, runner.pooled);
    }
}
