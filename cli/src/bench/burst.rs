//! Bursts: N concurrent sleeping calls through a real `airlock serve` against N concurrent
//! bwraps of the same sleep, the time each took beyond the sleep, and the daemon's memory
//! during the burst and a while after it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::memory::{ask_daemon, status_kib};
use super::scratch::ScratchDir;
use super::{BENCH_POLICY, bwrap_command_running};

/// Why the burst section could not run.
#[derive(Debug, thiserror::Error)]
pub enum BurstError {
    /// Writing the bench policy failed.
    #[error("cannot write the bench policy to {path}: {source}")]
    WritePolicy {
        /// The file.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Starting `airlock serve` failed.
    #[error("cannot start airlock serve: {0}")]
    StartDaemon(std::io::Error),
    /// The daemon did not answer its health check.
    #[error("airlock serve did not answer within 20 s")]
    DaemonSilent,
    /// The client runtime could not be built.
    #[error("cannot build the client runtime: {0}")]
    Runtime(std::io::Error),
}

/// One burst of `calls` concurrent calls.
#[derive(Debug, Clone, Serialize)]
pub struct Burst {
    calls: usize,
    /// Seconds from the first call sent to the last answer, minus the sleep.
    airlock_overhead_s: f64,
    /// The same for `calls` concurrent bwraps; `None` without bwrap.
    bwrap_overhead_s: Option<f64>,
    /// airlock's overhead over bwrap's.
    overhead_vs_bwrap: Option<f64>,
    /// Overhead divided by the number of calls, milliseconds.
    airlock_overhead_per_call_ms: f64,
    bwrap_overhead_per_call_ms: Option<f64>,
    /// Calls that did not succeed (refused, overloaded, failed).
    airlock_failed: usize,
    /// Why, by error kind (or the client's own failure), with counts.
    airlock_failures: std::collections::BTreeMap<String, usize>,
    bwrap_failed: usize,
    /// The most calls the daemon reported in flight at once.
    peak_in_flight: u64,
    /// Daemon RSS at that moment, and its growth over idle per call in flight then.
    rss_at_peak_kib: u64,
    rss_per_in_flight_call_kib: f64,
}

/// The burst section of the report.
#[derive(Debug, Clone, Serialize)]
pub struct BurstBench {
    sleep_s: f64,
    bursts: Vec<Burst>,
    /// Overhead per call at the largest burst over that at the smallest.
    per_call_growth: Option<f64>,
    daemon_rss_idle_kib: u64,
    /// After the last burst and `settle_s` seconds of quiet.
    daemon_rss_after_kib: u64,
    settle_s: f64,
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct BurstPlan {
    pub counts: Vec<usize>,
    pub sleep: Duration,
    pub settle: Duration,
}

/// Runs `calls` concurrent bwraps of the sleep; (seconds, failures).
fn bwrap_burst(bwrap: &Path, calls: usize, sleep: &str) -> (f64, usize) {
    let started = Instant::now();
    let mut children = Vec::with_capacity(calls);
    let mut failed = 0;
    for _ in 0..calls {
        match bwrap_command_running(bwrap, &["/bin/sleep", sleep])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(child) => children.push(child),
            Err(_) => failed += 1,
        }
    }
    for mut child in children {
        if !child.wait().is_ok_and(|s| s.success()) {
            failed += 1;
        }
    }
    (started.elapsed().as_secs_f64(), failed)
}

/// Samples the daemon's RSS and calls in flight until `stop`; returns the sample with the
/// most calls in flight as (in flight, RSS KiB).
fn sample_daemon(pid: &str, socket: &Path, stop: &AtomicBool) -> (u64, u64) {
    let mut best = (0, 0);
    while !stop.load(Ordering::SeqCst) {
        let rss = status_kib(pid, "VmRSS:");
        if let Ok(stats) = ask_daemon(socket, r#"{"id": 1, "op": "stats"}"#) {
            let in_flight = stats
                .pointer("/result/in_flight")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
            if in_flight > best.0 {
                best = (in_flight, rss);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    best
}

/// `calls` concurrent clients, one connection and one call each; (seconds, failures by
/// why).
async fn airlock_burst(
    socket: &Path,
    calls: usize,
    arguments: &str,
) -> (f64, std::collections::BTreeMap<String, usize>) {
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(calls);
    for _ in 0..calls {
        let socket = socket.to_path_buf();
        let arguments = arguments.to_string();
        tasks.push(tokio::spawn(async move {
            let mut client = airlock::daemon::DaemonClient::connect(&socket)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let result = client
                .call("nap", &arguments)
                .await
                .map_err(|e| format!("call: {e}"))?;
            if result.0.get("ok") == Some(&serde_json::Value::Bool(true)) {
                return Ok(());
            }
            let kind = result
                .0
                .pointer("/error/kind")
                .or_else(|| result.0.pointer("/code"))
                .map_or_else(|| "unknown".to_string(), |k| k.to_string());
            Err(kind)
        }));
    }
    let mut failures = std::collections::BTreeMap::new();
    for task in tasks {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(why)) => *failures.entry(why).or_insert(0) += 1,
            Err(_) => *failures.entry("client task".to_string()).or_insert(0) += 1,
        }
    }
    (started.elapsed().as_secs_f64(), failures)
}

/// Measures each burst size through `airlock`'s `serve` and with bwrap, in turn (the
/// order alternating).
pub fn measure(
    airlock: &Path,
    bwrap: Option<&Path>,
    plan: &BurstPlan,
) -> Result<BurstBench, BurstError> {
    let dir =
        ScratchDir::new("airlock-burst", 0o700).map_err(|source| BurstError::WritePolicy {
            path: std::env::temp_dir().display().to_string(),
            source,
        })?;
    let dir = dir.path();
    let policy = dir.join("bench.toml");
    let socket = dir.join("airlock.sock");
    let write_failed = |source| BurstError::WritePolicy {
        path: policy.display().to_string(),
        source,
    };
    std::fs::write(&policy, BENCH_POLICY).map_err(write_failed)?;
    let most = plan.counts.iter().copied().max().unwrap_or(1).max(1);
    // One connection per client here, as many bwraps' pipes: more than the common soft
    // limit of 1,024 allows at the largest burst. (The daemon raises its own.)
    airlock::daemon::raise_open_file_limit();
    // Limits above the largest burst: none of its calls may be refused.
    let limit = (most + 16).to_string();
    let mut daemon = Command::new(airlock)
        .arg("serve")
        .arg("--policy")
        .arg(&policy)
        .arg("--socket")
        .arg(&socket)
        .args([
            "--pool",
            "0",
            "--max-concurrent",
            &limit,
            "--max-queued",
            &limit,
        ])
        .args(["--max-connections", &(most * 2 + 16).to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(BurstError::StartDaemon)?;
    let pid = daemon.id().to_string();
    let measured = measure_with_daemon(&pid, &socket, bwrap, plan);
    super::shell_daemon::stop(&mut daemon);
    measured
}

fn measure_with_daemon(
    pid: &str,
    socket: &Path,
    bwrap: Option<&Path>,
    plan: &BurstPlan,
) -> Result<BurstBench, BurstError> {
    let started = Instant::now();
    while ask_daemon(socket, r#"{"id": 1, "op": "health"}"#).is_err() {
        if started.elapsed() > Duration::from_secs(20) {
            return Err(BurstError::DaemonSilent);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(BurstError::Runtime)?;
    let sleep_s = plan.sleep.as_secs_f64();
    let sleep_text = format!("{sleep_s}");
    let arguments = serde_json::json!({ "seconds": sleep_text }).to_string();
    // One call first: the daemon's first worker pays for things made once.
    let _ = runtime.block_on(airlock_burst(socket, 1, &arguments));
    let idle = status_kib(pid, "VmRSS:");
    let mut bursts = Vec::new();
    for (index, &calls) in plan.counts.iter().enumerate() {
        let bwrap_first = index % 2 == 1;
        let run_bwrap = || bwrap.map(|b| bwrap_burst(b, calls, &sleep_text));
        let mut bwrap_run = if bwrap_first { run_bwrap() } else { None };
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (pid, socket, stop) = (pid.to_string(), socket.to_path_buf(), Arc::clone(&stop));
            std::thread::spawn(move || sample_daemon(&pid, &socket, &stop))
        };
        let (seconds, failures) = runtime.block_on(airlock_burst(socket, calls, &arguments));
        stop.store(true, Ordering::SeqCst);
        let (peak_in_flight, rss_at_peak) = sampler.join().unwrap_or((0, 0));
        if !bwrap_first {
            bwrap_run = run_bwrap();
        }
        let overhead = (seconds - sleep_s).max(0.0);
        let bwrap_overhead = bwrap_run.map(|(s, _)| (s - sleep_s).max(0.0));
        bursts.push(Burst {
            calls,
            airlock_overhead_s: overhead,
            bwrap_overhead_s: bwrap_overhead,
            overhead_vs_bwrap: bwrap_overhead.filter(|b| *b > 0.0).map(|b| overhead / b),
            airlock_overhead_per_call_ms: overhead * 1e3 / calls as f64,
            bwrap_overhead_per_call_ms: bwrap_overhead.map(|b| b * 1e3 / calls as f64),
            airlock_failed: failures.values().sum(),
            airlock_failures: failures,
            bwrap_failed: bwrap_run.map_or(0, |(_, f)| f),
            peak_in_flight,
            rss_at_peak_kib: rss_at_peak,
            rss_per_in_flight_call_kib: if peak_in_flight > 0 {
                rss_at_peak.saturating_sub(idle) as f64 / peak_in_flight as f64
            } else {
                f64::NAN
            },
        });
    }
    std::thread::sleep(plan.settle);
    let after = status_kib(pid, "VmRSS:");
    let per_call_growth = match (bursts.first(), bursts.last()) {
        (Some(small), Some(large))
            if bursts.len() > 1 && small.airlock_overhead_per_call_ms > 0.0 =>
        {
            Some(large.airlock_overhead_per_call_ms / small.airlock_overhead_per_call_ms)
        }
        _ => None,
    };
    Ok(BurstBench {
        sleep_s,
        bursts,
        per_call_growth,
        daemon_rss_idle_kib: idle,
        daemon_rss_after_kib: after,
        settle_s: plan.settle.as_secs_f64(),
    })
}

/// Prints the section as a table.
pub fn print(bench: &BurstBench) {
    println!(
        "\nbursts through airlock serve: concurrent calls sleeping {:.1} s, against as many bwraps",
        bench.sleep_s
    );
    println!(
        "{:>6} {:>13} {:>11} {:>9} {:>12} {:>12} {:>7} {:>10} {:>12}",
        "calls",
        "airlock over s",
        "bwrap over s",
        "× bwrap",
        "ms/call (a)",
        "ms/call (b)",
        "failed",
        "in flight",
        "KiB/in-flight"
    );
    let opt =
        |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    for b in &bench.bursts {
        println!(
            "{:>6} {:>13.3} {:>11} {:>9} {:>12.3} {:>12} {:>7} {:>10} {:>12.1}",
            b.calls,
            b.airlock_overhead_s,
            opt(b.bwrap_overhead_s, 3),
            opt(b.overhead_vs_bwrap, 2),
            b.airlock_overhead_per_call_ms,
            opt(b.bwrap_overhead_per_call_ms, 3),
            format!("{}/{}", b.airlock_failed, b.bwrap_failed),
            b.peak_in_flight,
            b.rss_per_in_flight_call_kib,
        );
    }
    for b in bench
        .bursts
        .iter()
        .filter(|b| !b.airlock_failures.is_empty())
    {
        println!(
            "  {} calls: airlock failures {:?}",
            b.calls, b.airlock_failures
        );
    }
    println!(
        "  overhead per call, largest burst over smallest: {}",
        opt(bench.per_call_growth, 2)
    );
    println!(
        "  daemon RSS idle {} KiB, {:.0} s after the last burst {} KiB",
        bench.daemon_rss_idle_kib, bench.settle_s, bench.daemon_rss_after_kib
    );
}
