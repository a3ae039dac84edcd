//! Sessions: a call in a session (its worker pre-confined with the session's workspace)
//! against a pooled call without one, interleaved in one run, and `session_open` from a
//! small project's base (and without one).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::{CallOptions, Gate, Sessions, Supervisor, SupervisorOptions, ToolCall};
use serde::Serialize;

use super::scratch::ScratchDir;

/// Files in the bench's base: a small project (sources in a few directories).
const BASE_FILES: usize = 40;

/// The figures, milliseconds (medians unless said).
#[derive(Debug, Clone, Serialize)]
pub struct SessionBench {
    /// A pooled `/bin/true` call without a session.
    pub pooled_call_ms: f64,
    /// The same call in a session, on the session's pooled worker.
    pub session_call_ms: f64,
    /// Session call over pooled call (target: at most 1.3).
    pub ratio: f64,
    pub pooled_call_p99_ms: f64,
    pub session_call_p99_ms: f64,
    /// Session calls that found the session's worker ready, of all.
    pub session_calls_pooled: u64,
    pub session_calls: usize,
    /// `session_open` with the small base, and without a base.
    pub open_with_base_ms: f64,
    pub open_with_base_p99_ms: f64,
    pub open_empty_ms: f64,
    /// The base: files and bytes.
    pub base_files: usize,
    pub base_bytes: u64,
    /// How the base was taken in (`overlay` or `copy`).
    pub isolation: String,
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

fn p99(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    let i = ((samples.len().saturating_sub(1)) as f64 * 0.99).round() as usize;
    samples.get(i).copied().unwrap_or(f64::NAN)
}

fn policy_text(bases: &Path) -> String {
    let root = r#"read = ["/usr"]
read_optional = ["/bin", "/sbin", "/lib", "/lib64", "/etc/ld.so.cache"]
tmpfs = { "/tmp" = "16MiB" }
limits = { memory = "256MiB", pids = 64, timeout = "30s" }"#;
    format!(
        r#"version = 1
[sessions]
bases = ["{bases}"]
max_sessions = 8

[profiles.default]
{root}

[profiles.work]
{root}
workspace = "/workspace"
workspace_size = "16MiB"
cwd = "/workspace"

[tools.true]
description = "does nothing"
command = ["/bin/true"]
side_effect = "read"
concurrency_safe = true
input = {{ type = "object" }}

[tools.wtrue]
description = "does nothing, in a session"
profile = "work"
command = ["/bin/true"]
side_effect = "read"
concurrency_safe = true
input = {{ type = "object" }}
"#,
        bases = bases.display()
    )
}

/// A small project: `BASE_FILES` files of 0.5–8 KiB in five directories.
fn make_base(base: &Path) -> std::io::Result<u64> {
    let mut bytes = 0u64;
    for i in 0..BASE_FILES {
        let dir = base.join(format!("src/mod{}", i % 5));
        std::fs::create_dir_all(&dir)?;
        let size = 512 + (i * 197) % (8 << 10);
        std::fs::write(dir.join(format!("file{i}.rs")), vec![b'x'; size])?;
        bytes += size as u64;
    }
    Ok(bytes)
}

/// Waits until no call is in flight and `idle` workers are pooled.
async fn settle(supervisor: &Supervisor, idle: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while (supervisor.pool_stats().idle < idle || supervisor.calls_in_flight() > 0)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Measures `rounds` of each, interleaved (the order alternating each round).
pub async fn measure(rounds: usize, options: SupervisorOptions) -> anyhow::Result<SessionBench> {
    // Traversable: each session's workspace beneath is bound into its workers.
    let dir = ScratchDir::new("airlock-bench-session", 0o711)?;
    let bases = dir.path().join("bases");
    let base = bases.join("project");
    std::fs::create_dir_all(&base)?;
    // Returns once the sessions are closed (their workspaces unmounted), before the
    // directory beneath which they were mounted goes.
    measure_in(rounds, options, dir.path(), &bases, &base).await
}

async fn measure_in(
    rounds: usize,
    options: SupervisorOptions,
    dir: &Path,
    bases: &Path,
    base: &Path,
) -> anyhow::Result<SessionBench> {
    let base_bytes = make_base(base)?;
    let policy = airlock_policy::load_policy_str(&policy_text(bases), "bench.toml")?.policy;
    let bounds = policy.sessions.clone();
    let supervisor = Arc::new(Supervisor::start(options)?);
    supervisor.keep_warm(Arc::clone(&policy.profiles["default"]), 1);
    let sessions = Arc::new(
        Sessions::new(
            &dir.join("sessions"),
            supervisor.sandbox_ids(),
            Arc::new(airlock::gate::SystemClock),
        )?
        .keep_workers(Arc::clone(&supervisor), 4),
    );
    let gate =
        Arc::new(Gate::new(Arc::clone(&supervisor), policy).with_sessions(Arc::clone(&sessions)));
    let opened = sessions.open(&bounds, None, None, 16 << 20)?;
    let in_session = CallOptions {
        session: Some(opened.session.clone()),
        ..CallOptions::default()
    };
    let call = |tool: &str| ToolCall {
        call_id: "bench-session".into(),
        tool: tool.into(),
        arguments: "{}".into(),
    };
    // The session's first call is cold; its worker is kept from then on.
    if !gate.call(&call("wtrue"), &in_session).await.ok {
        anyhow::bail!("a call in a session failed");
    }
    let (mut pooled, mut in_sessions) = (Vec::new(), Vec::new());
    let (mut with_base, mut empty) = (Vec::new(), Vec::new());
    let mut isolation = String::new();
    let base_text = base.display().to_string();
    let hits_before = supervisor.pool_stats().hits;
    for round in 0..rounds {
        for step in 0..4 {
            let which = (step + round) % 4;
            // Quiet: both pools full (the sessionless one and the session's), nothing
            // being reaped.
            settle(&supervisor, 2).await;
            match which {
                0 | 1 => {
                    let (tool, options) = if which == 0 {
                        ("true", CallOptions::default())
                    } else {
                        ("wtrue", in_session.clone())
                    };
                    let gate = Arc::clone(&gate);
                    let call = call(tool);
                    // On a runtime worker thread, where a gateway's calls are made.
                    let sample = tokio::spawn(async move {
                        let started = Instant::now();
                        let ok = gate.call(&call, &options).await.ok;
                        ok.then(|| started.elapsed().as_secs_f64() * 1e3)
                    })
                    .await
                    .ok()
                    .flatten();
                    if let Some(ms) = sample {
                        if which == 0 {
                            pooled.push(ms);
                        } else {
                            in_sessions.push(ms);
                        }
                    }
                }
                _ => {
                    let (sessions, bounds) = (Arc::clone(&sessions), bounds.clone());
                    let with = (which == 2).then(|| base_text.clone());
                    let opened = tokio::task::spawn_blocking(move || {
                        let started = Instant::now();
                        let opened = sessions.open(&bounds, with.as_deref(), None, 16 << 20);
                        let ms = started.elapsed().as_secs_f64() * 1e3;
                        if let Ok(opened) = &opened {
                            let _ = sessions.close(&opened.session);
                        }
                        opened.map(|o| (ms, o.isolation))
                    })
                    .await?;
                    let (ms, how) = opened?;
                    if which == 2 {
                        with_base.push(ms);
                        isolation = how.to_string();
                    } else {
                        empty.push(ms);
                    }
                }
            }
        }
    }
    // Hits counted both pools; the sessionless calls all found theirs ready.
    let hits = supervisor.pool_stats().hits - hits_before;
    let session_calls_pooled = hits.saturating_sub(pooled.len() as u64);
    drop(gate);
    sessions.close_all();
    supervisor.close().await;
    let (pooled_ms, session_ms) = (median(&mut pooled), median(&mut in_sessions));
    Ok(SessionBench {
        pooled_call_ms: pooled_ms,
        session_call_ms: session_ms,
        ratio: session_ms / pooled_ms,
        pooled_call_p99_ms: p99(&mut pooled),
        session_call_p99_ms: p99(&mut in_sessions),
        session_calls_pooled,
        session_calls: in_sessions.len(),
        open_with_base_ms: median(&mut with_base),
        open_with_base_p99_ms: p99(&mut with_base),
        open_empty_ms: median(&mut empty),
        base_files: BASE_FILES,
        base_bytes,
        isolation,
    })
}

/// Prints the section.
pub fn print(bench: &SessionBench) {
    println!("\nsessions (medians, interleaved)");
    println!(
        "  pooled call, no session      {:>8.3} ms (p99 {:.3})",
        bench.pooled_call_ms, bench.pooled_call_p99_ms
    );
    println!(
        "  call in a session            {:>8.3} ms (p99 {:.3}); {:.2}× the pooled call (target ≤ 1.3); {} of {} on the session's pooled worker",
        bench.session_call_ms,
        bench.session_call_p99_ms,
        bench.ratio,
        bench.session_calls_pooled,
        bench.session_calls
    );
    println!(
        "  session_open, base of {} files ({} KiB, {}) {:>6.3} ms (p99 {:.3}); without a base {:.3} ms",
        bench.base_files,
        bench.base_bytes / 1024,
        bench.isolation,
        bench.open_with_base_ms,
        bench.open_with_base_p99_ms,
        bench.open_empty_ms
    );
}
