//! Pooled workers: pre-confined and waiting, each used for exactly one call, and no weaker
//! than cold ones — the same isolation seen from inside.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::SandboxRun;
use airlock::pool::{ManualClock, PoolSize};
use airlock_policy::load_policy_str;
use airlock_tests::{HANG_GUARD, sandbox_available, wait_until_async};

fn run(profile: &Arc<airlock_policy::CompiledProfile>, script: &str) -> SandboxRun {
    SandboxRun {
        call_id: "p".into(),
        tool: "exec".into(),
        profile: Arc::clone(profile),
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout: HANG_GUARD,
        inherit_stdio: None,
        builtin: None,
    }
}

/// Waits until the supervisor's pool counters satisfy `done` (fails only at the hang guard).
async fn wait_for(
    supervisor: &airlock::Supervisor,
    what: &str,
    done: impl Fn(&airlock::pool::PoolStats) -> bool,
) {
    let deadline = Instant::now() + HANG_GUARD;
    while !done(&supervisor.pool_stats()) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting until {what}: {:?}",
            supervisor.pool_stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `calls` calls of `script` at once; every one must succeed.
async fn burst(
    supervisor: &Arc<airlock::Supervisor>,
    profile: &Arc<airlock_policy::CompiledProfile>,
    script: &'static str,
    calls: usize,
) {
    let running: Vec<_> = (0..calls)
        .map(|_| {
            let supervisor = Arc::clone(supervisor);
            let profile = Arc::clone(profile);
            tokio::spawn(async move { supervisor.run(run(&profile, script), None).await })
        })
        .collect();
    for call in running {
        let result = call.await.unwrap();
        assert!(result.ok, "{result:?}");
    }
}

/// The embedded default preset's profile, as `airlock exec` uses it.
fn default_profile() -> Arc<airlock_policy::CompiledProfile> {
    let text = airlock_policy::presets::preset_text("default").unwrap();
    let policy = load_policy_str(text, "default").unwrap().policy;
    Arc::clone(&policy.profiles["default"])
}

const INSIDE: &str = "cat /proc/self/uid_map; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; cat /proc/sys/kernel/hostname; cut -d' ' -f5 /proc/self/mountinfo | sort; ls /proc/self/fd; echo x > /usr/x 2>/dev/null || echo ro; echo $$";

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// As root, `supervisor` built one template for the default profile and keeps it; an
/// unprivileged supervisor builds none (entering a holder's mount namespace needs
/// CAP_SYS_ADMIN, see `template`).
fn assert_one_template_as_root(supervisor: &airlock::Supervisor) {
    let stats = supervisor.pool_stats();
    assert_eq!(
        (stats.templates_built, stats.templates_ready),
        if is_root() { (1, 1) } else { (0, 0) },
        "{stats:?}"
    );
}

/// `INSIDE` as seen by a worker cloned from a template (as root) and by one that built its
/// own root: the same, PID aside (the last line), but for the template's procfs under the
/// worker's own, which a template's worker has at `/proc` too (covered, and locked in place
/// by the kernel).
fn assert_same_view(templated: &airlock::ToolResult, own_root: &airlock::ToolResult) {
    let strip_pid = |s: &str| s.lines().rev().skip(1).collect::<Vec<_>>().join("\n");
    let mut expected = strip_pid(&own_root.stdout);
    if is_root() {
        expected = expected.replace("\n/proc\n", "\n/proc\n/proc\n");
    }
    assert_eq!(strip_pid(&templated.stdout), expected);
    assert_eq!(templated.isolation, own_root.isolation);
}

/// A fresh sandbox each time: a file one call writes in its `/tmp` is gone for the next.
async fn assert_each_call_starts_afresh(
    supervisor: &airlock::Supervisor,
    profile: &Arc<airlock_policy::CompiledProfile>,
) {
    let _ = supervisor
        .run(run(profile, "echo left > /tmp/marker"), None)
        .await;
    let next = supervisor
        .run(
            run(profile, "cat /tmp/marker 2>/dev/null || echo fresh"),
            None,
        )
        .await;
    assert_eq!(next.stdout, "fresh\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_workers_are_single_use_and_as_confined_as_cold_ones() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let profile = default_profile();
    let cold = airlock_tests::own_root_supervisor();
    let cold_result = cold.run(run(&profile, INSIDE), None).await;
    assert!(cold_result.ok, "{cold_result:?}");
    assert_eq!(cold.pool_stats().templates_built, 0);

    let pooled = Arc::new(airlock_tests::supervisor());
    pooled.keep_warm(Arc::clone(&profile), 2);
    wait_for(&pooled, "the pool is filled", |s| s.idle >= 2).await;
    let first = pooled.run(run(&profile, INSIDE), None).await;
    let second = pooled.run(run(&profile, INSIDE), None).await;
    assert!(first.ok && second.ok, "{first:?} {second:?}");
    assert_eq!(pooled.pool_stats().hits, 2);
    // As root, pooled workers of the default profile are cloned from its root template.
    assert_one_template_as_root(&pooled);
    assert_same_view(&first, &cold_result);
    assert_each_call_starts_afresh(&pooled, &profile).await;
    // The pool refills off the critical path.
    wait_for(&pooled, "the pool is refilled", |s| s.idle >= 2).await;
    pooled.close().await;
    assert_eq!(pooled.pool_stats().idle, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemons_cold_calls_clone_their_roots_from_one_template_and_are_as_confined() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let profile = default_profile();
    let own_root = airlock_tests::own_root_supervisor();
    let own = own_root.run(run(&profile, INSIDE), None).await;
    assert!(own.ok, "{own:?}");

    // No pool: every call is cold. Eight at once on a fresh supervisor: one of them builds
    // the template, the others build their own roots meanwhile or use it once ready.
    let daemon = Arc::new(airlock_tests::supervisor());
    burst(&daemon, &profile, "true", 8).await;
    let cold = daemon.run(run(&profile, INSIDE), None).await;
    assert!(cold.ok, "{cold:?}");
    assert_each_call_starts_afresh(&daemon, &profile).await;
    assert_eq!(daemon.pool_stats().hits, 0);
    assert_one_template_as_root(&daemon);
    assert_same_view(&cold, &own);
    daemon.close().await;
    own_root.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_call_given_up_claims_no_template_and_one_cancelled_mid_build_leaves_nothing() {
    let _guard = airlock_tests::exclusive();
    if !sandbox_available() {
        return;
    }
    let profile = default_profile();
    let children_before = airlock_tests::our_children();
    let daemon = Arc::new(airlock_tests::supervisor());
    let parents: Vec<std::path::PathBuf> = daemon
        .cgroups()
        .map(|p| p.dirs().into_iter().map(std::path::PathBuf::from).collect())
        .unwrap_or_default();
    let cgroups_before = airlock_tests::our_cgroup_dirs(&parents);

    // A careless client: a call out of time before it starts. It must not claim the
    // template's build (which it would drop at once, leaving every later cold call to
    // build its own root until the claim expired).
    let mut late = run(&profile, "true");
    late.timeout = Duration::ZERO;
    let late = daemon.run(late, None).await;
    assert_eq!(
        late.error.as_ref().map(|e| e.kind),
        Some(airlock::ErrorKind::Timeout),
        "{late:?}"
    );
    let next = daemon.run(run(&profile, "true"), None).await;
    assert!(next.ok, "{next:?}");
    assert_one_template_as_root(&daemon);

    // A cancellation whenever it lands: during a template's build (the first cold call of
    // a fresh supervisor builds it) or after. The call ends cancelled either way, and
    // nothing of it — holder, worker, cgroup — outlives the supervisor's close.
    let fresh = Arc::new(airlock_tests::supervisor());
    let cancel = airlock::CancelSignal::new();
    let call = {
        let (fresh, profile, cancel) = (Arc::clone(&fresh), Arc::clone(&profile), cancel.clone());
        tokio::spawn(async move {
            let marker = airlock_tests::sleep_marker();
            fresh
                .run(run(&profile, &format!("sleep {marker}")), Some(&cancel))
                .await
        })
    };
    tokio::task::yield_now().await;
    cancel.cancel();
    let cancelled = call.await.unwrap();
    assert_eq!(
        cancelled.error.as_ref().map(|e| e.kind),
        Some(airlock::ErrorKind::Cancelled),
        "{cancelled:?}"
    );
    let after = fresh.run(run(&profile, "true"), None).await;
    assert!(after.ok, "{after:?}");

    fresh.close().await;
    daemon.close().await;
    airlock_tests::wait_until_async("the supervisors' workers are reaped", || {
        airlock_tests::added_since(&children_before, airlock_tests::our_children()).is_empty()
    })
    .await;
    assert_eq!(
        airlock_tests::added_since(&cgroups_before, airlock_tests::our_cgroup_dirs(&parents)),
        Vec::<String>::new()
    );
}

/// What a sandbox shows of its cgroups and of its procfs's host-identifying entries.
const HOST_VIEW: &str = "cut -d: -f3 /proc/self/cgroup | sort -u; wc -c < /proc/cmdline; \
     wc -c < /proc/sys/kernel/random/boot_id; ls -A /proc/pressure 2>/dev/null | wc -l";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_workers_see_their_own_cgroup_root_and_a_masked_proc_like_cold_ones() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let profile = default_profile();
    let cold = airlock_tests::own_root_supervisor();
    let cold_result = cold.run(run(&profile, HOST_VIEW), None).await;
    assert_eq!(cold_result.stdout, "/\n0\n0\n0\n", "{cold_result:?}");
    cold.close().await;
    // Pooled workers are cloned from the profile's template as root (whose own procfs is
    // not masked: each worker masks the procfs it mounts over it).
    let pooled = Arc::new(airlock_tests::supervisor());
    pooled.keep_warm(Arc::clone(&profile), 1);
    wait_for(&pooled, "the pool is filled", |s| s.idle >= 1).await;
    let warm = pooled.run(run(&profile, HOST_VIEW), None).await;
    assert_eq!(pooled.pool_stats().hits, 1);
    assert_eq!(warm.stdout, cold_result.stdout, "{warm:?}");
    pooled.close().await;
}

/// The kernel's (major, minor) version.
fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(['.', '-']);
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_cgroup_starts_clean_and_one_that_hit_a_limit_is_not_reused() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let policy = load_policy_str(
        r#"version = 1
[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/sbin", "/lib", "/lib64", "/etc/ld.so.cache"]
limits = { memory = "96MiB", pids = 64, timeout = "20s" }
"#,
        "reuse.toml",
    )
    .unwrap()
    .policy;
    let profile = Arc::clone(&policy.profiles["default"]);
    // Its cold calls build their own roots: no template holder's cgroup joins the count.
    let supervisor = airlock_tests::own_root_supervisor();
    // Each call's cgroup is released (recycled or removed) after its answer.
    let settled = || {
        wait_until_async("the call finished cleaning up", || {
            supervisor.calls_in_flight() == 0
        })
    };
    let peak = |r: &airlock::ToolResult| r.usage.peak_memory_bytes.unwrap_or(0);

    // 1. Holds ~24 MiB, well within the limit.
    let hog = supervisor
        .run(
            run(
                &profile,
                "a=$(head -c 24000000 /dev/zero | tr '\\0' x); echo ${#a}",
            ),
            None,
        )
        .await;
    assert!(hog.ok, "{hog:?}");
    assert!(peak(&hog) >= 24_000_000, "{hog:?}");
    settled().await;
    let v1 = hog.isolation.as_ref().unwrap().cgroup.as_deref() == Some("v1");
    // memory.peak is reset per open file from Linux 6.12 on; before that a v2 cgroup is
    // never handed to a second worker, and after the first failed reset none is kept.
    let reusable = v1 || kernel_version() >= (6, 12);
    assert_eq!(
        supervisor.pool_stats().cgroups_kept,
        1,
        "{:?}",
        supervisor.pool_stats()
    );

    // 2. The next worker may get that cgroup, but its peak is its own.
    let small = supervisor.run(run(&profile, "true"), None).await;
    assert!(small.ok, "{small:?}");
    assert!(
        peak(&small) < 16 << 20,
        "the last call's peak leaked in: {small:?}"
    );
    settled().await;
    let stats = supervisor.pool_stats();
    assert_eq!(stats.cgroups_reused, u64::from(reusable), "{stats:?}");
    assert_eq!(stats.cgroups_kept, usize::from(reusable), "{stats:?}");

    // 3. An OOM kill: that cgroup is removed, not kept.
    let bomb = supervisor
        .run(
            run(&profile, "a=xxxxxxxxxxxxxxxx; while :; do a=$a$a; done"),
            None,
        )
        .await;
    assert_eq!(
        bomb.error.as_ref().map(|e| e.kind),
        Some(airlock::ErrorKind::OutOfMemory),
        "{bomb:?}"
    );
    settled().await;
    let stats = supervisor.pool_stats();
    assert_eq!(
        stats.cgroups_kept, 0,
        "a cgroup with an OOM kill was kept: {stats:?}"
    );
    assert_eq!(stats.cgroups_reused, 2 * u64::from(reusable), "{stats:?}");

    // 4. And the call after it is clean: no OOM verdict, a small peak.
    let after = supervisor.run(run(&profile, "true"), None).await;
    assert!(after.ok, "{after:?}");
    assert!(peak(&after) < 16 << 20, "{after:?}");
    settled().await;
    supervisor.close().await;
    assert_eq!(
        supervisor.pool_stats().cgroups_kept,
        0,
        "close keeps nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_is_built_again_when_a_bound_file_is_replaced_and_later_workers_see_it() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() || !is_root() {
        // Unprivileged supervisors have no templates (the fallback is the cold path).
        return;
    }
    let scratch = airlock_tests::Scratch::under(std::path::Path::new("/var/tmp"), "template-stale");
    let file = scratch.write("motd", "old\n");
    let text = format!(
        r#"version = 1
[profiles.t]
read = ["/usr", {file:?}]
read_optional = ["/bin", "/sbin", "/lib", "/lib64", "/etc/ld.so.cache"]
tmpfs = {{ "/tmp" = "1MiB" }}
network = "none"
env = {{ PATH = "/usr/bin:/bin" }}
"#,
        file = file.display().to_string()
    );
    let policy = load_policy_str(&text, "stale.toml").unwrap().policy;
    let profile = Arc::clone(&policy.profiles["t"]);
    let pooled = Arc::new(airlock_tests::supervisor());
    pooled.keep_warm(Arc::clone(&profile), 1);
    let wait_idle = || wait_for(&pooled, "the pool is filled", |s| s.idle >= 1);
    let cat = format!("cat {}", file.display());
    wait_idle().await;
    let first = pooled.run(run(&profile, &cat), None).await;
    assert_eq!(first.stdout, "old\n", "{first:?}");
    assert_eq!(pooled.pool_stats().templates_built, 1);

    // Replaced the way package managers replace files: a new inode renamed over the old.
    let next = scratch.write("motd.new", "new\n");
    std::fs::rename(&next, &file).unwrap();
    // The worker idle since before the change may keep the old view (as pooled workers
    // always did); the one made after it must not.
    wait_idle().await;
    let second = pooled.run(run(&profile, &cat), None).await;
    assert!(second.ok, "{second:?}");
    wait_idle().await;
    let third = pooled.run(run(&profile, &cat), None).await;
    assert_eq!(third.stdout, "new\n", "{third:?}");
    let stats = pooled.pool_stats();
    assert_eq!((stats.templates_built, stats.misses), (2, 0), "{stats:?}");
    pooled.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_exactly_stops_the_pools_it_is_not_given_and_keeps_the_unchanged_ones() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let root = is_root();
    // What a daemon's reload gives it: profile `a` changed, `b` the same content in a new
    // `Arc` (a policy compiled again).
    let policy = |a_tmp: &str| {
        let profile = |name: &str, tmp: &str| {
            format!(
                "[profiles.{name}]\nread = [\"/usr\"]\nread_optional = [\"/bin\", \"/lib\", \"/lib64\", \"/etc/ld.so.cache\"]\ntmpfs = {{ \"/tmp\" = \"{tmp}\" }}\nnetwork = \"none\"\n"
            )
        };
        let text = format!(
            "version = 1\n{}{}",
            profile("a", a_tmp),
            profile("b", "1MiB")
        );
        let policy = load_policy_str(&text, "warm.toml").unwrap().policy;
        (
            Arc::clone(&policy.profiles["a"]),
            Arc::clone(&policy.profiles["b"]),
        )
    };
    let supervisor = Arc::new(airlock_tests::supervisor());

    let (a, b) = policy("1MiB");
    supervisor
        .warm_exactly(&[Arc::clone(&a), Arc::clone(&b)], PoolSize::fixed(1))
        .await;
    wait_for(&supervisor, "both pools are warm", |s| s.idle == 2).await;
    assert_eq!(supervisor.warm_pools(), 2);
    if root {
        assert_eq!(supervisor.pool_stats().templates_ready, 2);
    }

    let (a2, b2) = policy("2MiB");
    supervisor
        .warm_exactly(&[Arc::clone(&a2), Arc::clone(&b2)], PoolSize::fixed(1))
        .await;
    assert_eq!(supervisor.warm_pools(), 2);
    wait_for(&supervisor, "the new pool is warm", |s| s.idle == 2).await;
    // And stays at two: `a`'s idle worker was killed, not left beside `a2`'s and `b`'s.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = supervisor.pool_stats();
    assert_eq!(stats.idle, 2, "{stats:?}");
    if root {
        // a, b, then a2 — never b again: its pool and template stayed.
        assert_eq!(
            (stats.templates_built, stats.templates_ready),
            (3, 2),
            "{stats:?}"
        );
    }
    let (hits, misses) = (stats.hits, stats.misses);
    for profile in [&b2, &a2] {
        let result = supervisor.run(run(profile, "true"), None).await;
        assert!(result.ok, "{result:?}");
    }
    // The old `a` has no pool any more: its call is cold (and, as root, builds a template
    // of its own, which a reload that no longer uses `a` forgets).
    let old = supervisor.run(run(&a, "true"), None).await;
    assert!(old.ok, "{old:?}");
    let stats = supervisor.pool_stats();
    assert_eq!(
        (stats.hits, stats.misses),
        (hits + 2, misses + 1),
        "{stats:?}"
    );
    if root {
        assert_eq!(
            (stats.templates_built, stats.templates_ready),
            (4, 3),
            "{stats:?}"
        );
    }
    supervisor.forget_unused_templates(&[Arc::clone(&a2), Arc::clone(&b2)]);

    // Stopping one, by a profile of the same content: only the other's worker is left,
    // however the stop met its replenisher (idle, or refilling after the call above).
    supervisor.stop_warm(&b).await;
    assert_eq!(supervisor.warm_pools(), 1);
    wait_for(&supervisor, "only a2's worker idles", |s| s.idle == 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = supervisor.pool_stats();
    assert_eq!(stats.idle, 1, "a stopped pool was refilled: {stats:?}");
    if root {
        assert_eq!(stats.templates_ready, 1, "{stats:?}");
    }
    supervisor.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_grows_while_calls_find_it_empty_and_shrinks_back_when_they_stop() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let profile = default_profile();
    // The test moves the pool's time itself: a refill under emulation can outlast any
    // real shrink period, which then undoes the growth before it can be seen.
    let clock = ManualClock::new();
    let supervisor = Arc::new(
        airlock::Supervisor::start(airlock::SupervisorOptions {
            worker_program: Some((airlock_tests::airlock_bin(), Vec::new())),
            pool_clock: Some(Arc::clone(&clock) as Arc<dyn airlock::pool::PoolClock>),
            ..Default::default()
        })
        .unwrap(),
    );
    let quiet = Duration::from_secs(10);
    supervisor.keep_warm_sized(
        Arc::clone(&profile),
        PoolSize::between(1, 4, quiet).unwrap(),
    );
    wait_for(&supervisor, "the minimum is idle", |s| s.idle == 1).await;
    assert_eq!(supervisor.pool_stats().idle_target, 1);

    // A burst of four calls at once: one pooled, the others cold, and each miss doubles
    // the aim, up to the maximum.
    burst(&supervisor, &profile, "sleep 0.3", 4).await;
    let stats = supervisor.pool_stats();
    assert!(stats.misses >= 1, "{stats:?}");
    assert_eq!(stats.idle_target, 4, "{stats:?}");
    wait_for(&supervisor, "the grown pool is idle", |s| s.idle == 4).await;

    // The next burst of the same size finds a worker for every call.
    let misses = supervisor.pool_stats().misses;
    burst(&supervisor, &profile, "true", 4).await;
    assert_eq!(
        supervisor.pool_stats().misses,
        misses,
        "{:?}",
        supervisor.pool_stats()
    );
    wait_for(&supervisor, "the pool is refilled", |s| s.idle == 4).await;

    // Short of a quiet period nothing shrinks.
    clock.advance(quiet - Duration::from_millis(1));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(supervisor.pool_stats().idle_target, 4);

    // Quiet: the aim halves once per period, 4 -> 2 -> 1, and the idle workers above it
    // are killed.
    clock.advance(Duration::from_millis(1));
    wait_for(&supervisor, "the pool halved", |s| {
        s.idle_target == 2 && s.idle == 2
    })
    .await;
    clock.advance(quiet);
    wait_for(&supervisor, "the pool is back at its minimum", |s| {
        s.idle_target == 1 && s.idle == 1
    })
    .await;
    clock.advance(quiet);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        supervisor.pool_stats(),
        airlock::pool::PoolStats {
            idle: 1,
            idle_target: 1,
            ..supervisor.pool_stats()
        }
    );
    supervisor.close().await;
}
