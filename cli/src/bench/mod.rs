//! `airlock bench`: start-up latency, throughput, kill latency and memory, measured in one
//! run on this machine with the contenders interleaved round by round, so ratios between
//! them hold even on a noisy shared machine.

mod burst;
mod denials;
mod egress;
mod memory;
mod oneshot;
mod scratch;
mod session;
mod shell_daemon;
mod table;

use memory::{
    DaemonMemory, measure_daemon_memory, pooled_workers_of, pss_kib, rss_kib, status_kib,
};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::{
    CallOptions, Gate, NetworkNamespaces, SandboxRun, Supervisor, SupervisorOptions, ToolCall,
};
use airlock_policy::{CompiledPolicy, load_policy_str};
use serde::Serialize;

/// Options of `airlock bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Rounds of the latency measurements.
    #[arg(long, default_value_t = 100)]
    rounds: usize,
    /// Seconds of each throughput measurement (per contender and client count).
    #[arg(long, default_value_t = 2.0)]
    throughput_seconds: f64,
    /// Slices each throughput measurement is cut into, airlock's and bwrap's alternating
    /// (ABBA...), so a machine that speeds up or slows down during the run moves both alike.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    throughput_slices: u32,
    /// Idle pooled workers for the memory measurement.
    #[arg(long, default_value_t = 8)]
    pool_workers: usize,
    /// Idle pooled workers kept for the throughput runs (the latency rounds keep 2, the
    /// daemon's default). With 2, half the two-client calls found the pool empty and ran
    /// cold: the refill cannot run ahead of two clients with only two workers in hand.
    #[arg(long, default_value_t = 8)]
    throughput_pool: usize,
    /// Rounds of the one-shot (whole process) section; 0 skips it.
    #[arg(long, default_value_t = 60)]
    oneshot_rounds: usize,
    /// Another airlock binary to measure in the one-shot section beside this one, as
    /// LABEL=PATH (one built with `AIRLOCK_WORKER_TARGET=x86_64-unknown-linux-gnu`, say, to
    /// compare the glibc worker with the musl one in the same run). Repeatable.
    #[arg(long, value_name = "LABEL=PATH")]
    also: Vec<String>,
    /// Burst sizes, comma-separated: that many concurrent sleeping calls through `airlock
    /// serve`, against as many concurrent bwraps.
    #[arg(long, value_delimiter = ',', default_value = "64,1024")]
    burst: Vec<usize>,
    /// Leave the burst section out.
    #[arg(long)]
    no_burst: bool,
    /// Seconds each call of a burst sleeps.
    #[arg(long, default_value_t = 2.0)]
    burst_sleep_seconds: f64,
    /// Seconds of quiet after the last burst before the daemon's memory is read again.
    #[arg(long, default_value_t = 10.0)]
    burst_settle_seconds: f64,
    /// The airlock binary whose `serve` the bursts go through (default: this one), to
    /// compare two builds' daemons with the same client.
    #[arg(long)]
    burst_daemon: Option<PathBuf>,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
}

const BENCH_POLICY: &str = r#"version = 1
[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/sbin", "/lib", "/lib64", "/etc/ld.so.cache"]
tmpfs = { "/tmp" = "16MiB" }
limits = { memory = "256MiB", pids = 64, timeout = "30s" }

[profiles.loopback]
read = ["/usr"]
read_optional = ["/bin", "/sbin", "/lib", "/lib64", "/etc/ld.so.cache"]
tmpfs = { "/tmp" = "16MiB" }
network = "loopback"
limits = { memory = "256MiB", pids = 64, timeout = "30s" }

[profiles.egress]
read = ["/usr"]
read_optional = ["/bin", "/sbin", "/lib", "/lib64", "/etc/ld.so.cache"]
tmpfs = { "/tmp" = "16MiB" }
network = { allow = ["127.0.0.1"] }
limits = { memory = "256MiB", pids = 64, timeout = "30s" }

[tools.true]
description = "does nothing"
command = ["/bin/true"]
side_effect = "read"
concurrency_safe = true
input = { type = "object" }

[tools.read]
description = "reads a file (built-in)"
builtin = "read_file"

[tools.nap]
description = "sleeps as long as asked"
command = ["/bin/sleep", "{seconds}"]
side_effect = "read"
concurrency_safe = true
input = { type = "object", properties = { seconds = { type = "string", pattern = "^[0-9]{1,3}(\\.[0-9]{1,3})?$" } }, required = ["seconds"] }

[tools.sleep]
description = "sleeps"
command = ["/bin/sleep", "100"]
side_effect = "read"
concurrency_safe = true
timeout = "100ms"
input = { type = "object" }
"#;

/// Latency statistics of one contender, milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    name: String,
    median_ms: f64,
    p99_ms: f64,
    samples: usize,
    vs_floor: f64,
    vs_bwrap: Option<f64>,
}

/// Pool hits and misses during one throughput run.
#[derive(Debug, Clone, Serialize)]
pub struct PoolUse {
    clients: usize,
    hits: u64,
    misses: u64,
    /// Seconds, summed over the slices and counted in them, from the clients' last call
    /// until the pool was refilled and every used worker reaped.
    refill_seconds: f64,
    /// Workers made during the slices in an earlier worker's emptied cgroup rather than a
    /// new one.
    cgroups_reused: u64,
}

/// One- or two-client throughput against bwrap's, from the interleaved slices.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputRatio {
    clients: usize,
    /// airlock's calls per second over all its slices, divided by bwrap's.
    ratio: f64,
    /// The lowest and highest ratio of one airlock slice to the bwrap slice beside it.
    slice_ratio_min: f64,
    slice_ratio_max: f64,
    slices: u32,
}

/// The latency of the throughput runs' calls, with `clients` clients calling back to back:
/// airlock's (pooled, unless the pool ran empty: see `pool_during_throughput`) or bwrap's
/// whole runs.
#[derive(Debug, Clone, Serialize)]
pub struct TailLatency {
    clients: usize,
    p50_ms: f64,
    p99_ms: f64,
    p99_over_p50: f64,
    samples: usize,
}

impl TailLatency {
    fn of(clients: usize, latencies: Vec<f64>) -> Self {
        let (_, p50, p99, samples) = summarize("", latencies);
        Self {
            clients,
            p50_ms: p50,
            p99_ms: p99,
            p99_over_p50: p99 / p50,
            samples,
        }
    }
}

/// Everything `bench` reports.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    rounds: usize,
    latency: Vec<Latency>,
    throughput_calls_per_s: Vec<(String, f64)>,
    bwrap_throughput_calls_per_s: Vec<(String, f64)>,
    /// airlock's throughput over bwrap's, measured in alternating slices.
    throughput_vs_bwrap: Vec<ThroughputRatio>,
    /// How the throughput runs' calls were served: by a pooled worker, or cold because the
    /// pool was empty.
    pool_during_throughput: Vec<PoolUse>,
    /// The throughput runs' call latencies, at full load.
    latency_under_load: Vec<TailLatency>,
    /// bwrap's run times in its throughput slices, at full load beside the same number of
    /// clients: the tail of starting a sandbox per call on this machine.
    bwrap_latency_under_load: Vec<TailLatency>,
    /// Idle pooled workers kept during the throughput runs.
    throughput_pool: usize,
    deadline_to_reaped_ms: Latency,
    supervisor_rss_idle_kib: u64,
    supervisor_rss_with_pool_kib: u64,
    worker_rss_per_idle_pooled_kib: u64,
    /// Proportional set size per idle pooled worker: pages shared by all workers (the sealed
    /// image, libc) count once across them, so this is what each extra worker costs.
    worker_pss_per_idle_pooled_kib: u64,
    /// Anonymous (private) memory per idle pooled worker.
    worker_anon_per_idle_pooled_kib: u64,
    /// Supervisor RSS split: file-backed (its own executable's text, shared) and anonymous.
    supervisor_rss_file_kib: u64,
    supervisor_rss_anon_kib: u64,
    pool_workers: usize,
    /// A real `airlock serve` process (the `supervisor_rss_*` figures above are this bench
    /// process's own, after it ran everything: an upper bound); `None` if it failed (noted).
    daemon_memory: Option<DaemonMemory>,
    /// The egress proxy's cost; `None` if it could not be measured (noted).
    egress: Option<egress::EgressBench>,
    /// What reporting refusals costs a call refused nothing; `None` if not measured (noted).
    denial_reporting: Option<denials::ReportingCost>,
    /// What reading Landlock's refusals from the audit costs; `None` where the host cannot
    /// (noted).
    landlock_audit: Option<denials::LandlockAuditCost>,
    /// Concurrent sleeping calls through the daemon against concurrent bwraps; `None` if
    /// skipped or not measured (noted).
    burst: Option<burst::BurstBench>,
    /// Whole `airlock exec` and `airlock run` processes against bwrap; `None` if skipped
    /// or not measured (noted).
    oneshot: Option<oneshot::OneshotBench>,
    /// A call in a session against a pooled call, and `session_open`; `None` if not
    /// measured (noted).
    session: Option<session::SessionBench>,
    notes: Vec<String>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn summarize(name: &str, mut samples: Vec<f64>) -> (String, f64, f64, usize) {
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    (
        name.to_string(),
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        samples.len(),
    )
}

fn time_command(command: &mut Command) -> Option<f64> {
    let started = Instant::now();
    let status = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?;
    status
        .success()
        .then(|| started.elapsed().as_secs_f64() * 1000.0)
}

fn bwrap_path() -> Option<PathBuf> {
    ["/usr/bin/bwrap", "/bin/bwrap"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// bwrap with a root comparable to the default profile's, running /bin/true.
fn bwrap_command(bwrap: &Path) -> Command {
    bwrap_command_running(bwrap, &["/bin/true"])
}

/// bwrap with a root comparable to the default profile's, running `argv`.
fn bwrap_command_running(bwrap: &Path, argv: &[&str]) -> Command {
    let mut command = Command::new(bwrap);
    command.args([
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        "/usr",
        "/usr",
    ]);
    for link in ["bin", "sbin", "lib", "lib64"] {
        if let Ok(target) = std::fs::read_link(format!("/{link}")) {
            command.arg("--symlink").arg(target).arg(format!("/{link}"));
        }
    }
    command.args(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
    command.args(argv);
    command
}

fn true_run(policy: &CompiledPolicy) -> SandboxRun {
    SandboxRun {
        call_id: "bench".into(),
        tool: "true".into(),
        profile: Arc::clone(&policy.profiles["default"]),
        argv: vec!["/bin/true".into()],
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout: Duration::from_secs(30),
        inherit_stdio: None,
        builtin: None,
    }
}

/// Takes one latency sample (milliseconds, `None` if the run failed) on a runtime worker
/// thread, where `airlock serve` and an async gateway make their calls. Awaited from
/// `block_on`'s thread instead, a call pays one more cross-thread wake-up (the runtime
/// handing the result over), which is not what a gateway pays; the blocking contenders
/// (the floor, bwrap, `airlock exec`) are timed on the same kind of thread, blocking it
/// for their run.
async fn sample_on_runtime<F>(measure: F) -> Option<f64>
where
    F: std::future::Future<Output = Option<f64>> + Send + 'static,
{
    tokio::spawn(measure).await.ok().flatten()
}

/// Calls completed by `clients` concurrent clients in about `seconds`, and the seconds taken.
/// Each client makes at least one call, so a machine slower than a short slice still gives
/// a rate.
/// Also each successful call's latency, milliseconds.
async fn throughput(gate: &Arc<Gate>, clients: usize, seconds: f64) -> (u64, f64, Vec<f64>) {
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let mut handles = Vec::new();
    for client in 0..clients {
        let gate = Arc::clone(gate);
        handles.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let call = ToolCall {
                    call_id: format!("t{client}-{}", latencies.len()),
                    tool: "true".into(),
                    arguments: "{}".into(),
                };
                let call_started = Instant::now();
                if gate.call(&call, &CallOptions::default()).await.ok {
                    latencies.push(call_started.elapsed().as_secs_f64() * 1e3);
                }
                if Instant::now() >= until {
                    break latencies;
                }
            }
        }));
    }
    let mut latencies = Vec::new();
    for handle in handles {
        latencies.extend(handle.await.unwrap_or_default());
    }
    (
        latencies.len() as u64,
        started.elapsed().as_secs_f64(),
        latencies,
    )
}

/// Calls and seconds summed over one contender's throughput slices.
#[derive(Debug, Default)]
struct SliceTotals {
    calls: u64,
    seconds: f64,
    hits: u64,
    misses: u64,
    /// Seconds after the clients stopped until the pool was back where it began.
    refill_seconds: f64,
    /// Workers cloned into an earlier worker's emptied cgroup during the slices.
    cgroups_reused: u64,
}

impl SliceTotals {
    /// Adds one slice's (calls, seconds) and returns that slice's rate.
    fn add(&mut self, (calls, seconds): (u64, f64)) -> f64 {
        self.calls += calls;
        self.seconds += seconds;
        calls as f64 / seconds.max(f64::MIN_POSITIVE)
    }

    fn rate(&self) -> f64 {
        self.calls as f64 / self.seconds.max(f64::MIN_POSITIVE)
    }
}

/// Waits until the supervisors are quiet: `pooled`'s pool holds `pool` idle workers again
/// and no supervisor (`pooled` and `others`) has a call in flight or a worker being reaped.
async fn settle(pooled: &Supervisor, pool: usize, others: &[Arc<Supervisor>]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while (pooled.pool_stats().idle < pool
        || pooled.calls_in_flight() > 0
        || others.iter().any(|s| s.calls_in_flight() > 0))
        && Instant::now() < deadline
    {
        // 1 ms, tokio's timer resolution: the throughput slices count this wait.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Like [`throughput`], for `bwrap` runs of /bin/true: calls, seconds, and each
/// successful run's wall time, milliseconds.
fn bwrap_throughput(bwrap: &Path, clients: usize, seconds: f64) -> (u64, f64, Vec<f64>) {
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let bwrap = bwrap.to_path_buf();
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                loop {
                    if let Some(ms) = time_command(&mut bwrap_command(&bwrap)) {
                        latencies.push(ms);
                    }
                    if Instant::now() >= until {
                        break latencies;
                    }
                }
            })
        })
        .collect();
    let latencies: Vec<f64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap_or_default())
        .collect();
    (
        latencies.len() as u64,
        started.elapsed().as_secs_f64(),
        latencies,
    )
}

/// Runs the benchmark and prints the report.
pub fn run_bench(args: &BenchArgs) -> anyhow::Result<std::process::ExitCode> {
    let policy = load_policy_str(BENCH_POLICY, "bench.toml")?.policy;
    let me = std::env::current_exe()?;
    let bwrap = bwrap_path();
    let mut notes = Vec::new();
    if bwrap.is_none() {
        notes.push(
            "bwrap is not installed (Debian package bubblewrap): no bwrap figures".to_string(),
        );
    } else if let Some(b) = &bwrap
        && time_command(&mut bwrap_command(b)).is_none()
    {
        notes.push("bwrap is installed but failed to run /bin/true here".to_string());
    }
    // First, while no supervisor of this process reaps workers (see `oneshot`).
    let oneshot = if args.oneshot_rounds == 0 {
        None
    } else {
        let worker = match env!("AIRLOCK_WORKER_TARGET") {
            "" => "self as worker".to_string(),
            target => format!("{target} worker"),
        };
        let mut airlocks = vec![(worker, me.clone())];
        for also in &args.also {
            let (label, path) = also
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--also: {also:?} is not LABEL=PATH"))?;
            airlocks.push((label.to_string(), PathBuf::from(path)));
        }
        match oneshot::measure(args.oneshot_rounds, bwrap.as_deref(), &airlocks) {
            Ok(measured) => Some(measured),
            Err(why) => {
                notes.push(format!("one-shot runs not measured: {why}"));
                None
            }
        }
    };
    let burst = if args.no_burst || args.burst.is_empty() {
        None
    } else {
        let plan = burst::BurstPlan {
            counts: args.burst.clone(),
            sleep: Duration::try_from_secs_f64(args.burst_sleep_seconds)
                .map_err(|e| anyhow::anyhow!("--burst-sleep-seconds: {e}"))?,
            settle: Duration::try_from_secs_f64(args.burst_settle_seconds)
                .map_err(|e| anyhow::anyhow!("--burst-settle-seconds: {e}"))?,
        };
        let daemon = args.burst_daemon.as_ref().unwrap_or(&me);
        match burst::measure(daemon, bwrap.as_deref(), &plan) {
            Ok(measured) => Some(measured),
            Err(why) => {
                notes.push(format!("bursts not measured: {why}"));
                None
            }
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = runtime.block_on(async {
        let cold = Arc::new(Supervisor::start(crate::supervisor_options())?);
        // The network namespace strategy, measured: the same cold call with one empty
        // network namespace shared by the workers, the weaker opt-in (the default gives
        // each worker its own).
        let cold_shared_net = Arc::new(Supervisor::start(SupervisorOptions {
            network_namespaces: NetworkNamespaces::SharedWhenSafe,
            ..crate::supervisor_options()
        })?);
        let pooled = Arc::new(Supervisor::start(crate::supervisor_options())?);
        let profile = Arc::clone(&policy.profiles["default"]);
        pooled.keep_warm(Arc::clone(&profile), 2);
        let gate = Arc::new(Gate::new(Arc::clone(&pooled), policy.clone()));
        // A latency sample starts on a quiet machine: every supervisor of the bench done
        // reaping its previous call's worker and removing (or keeping) its cgroup, and the
        // pool refilled. Otherwise the sample measures that background work competing for
        // this machine's two cores: the warm call, which followed a cold call, measured the
        // cold supervisor's clean-up too. Throughput below measures the loaded case.
        let quiet = |n: usize| {
            let others = [Arc::clone(&cold), Arc::clone(&cold_shared_net)];
            let pooled = Arc::clone(&pooled);
            async move { settle(&pooled, n, &others).await }
        };
        quiet(2).await;

        let names = [
            "floor: fork+exec /bin/true",
            "bwrap --unshare-all",
            "airlock exec (whole process)",
            "airlock cold call (in supervisor)",
            "airlock warm pooled call",
            "airlock built-in tool call (pooled)",
            "airlock cold call, shared netns (opt-in)",
        ];
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        let builtin_call = ToolCall {
            call_id: "b".into(),
            tool: "read".into(),
            arguments: r#"{"path": "/proc/self/stat", "max_bytes": 16}"#.into(),
        };
        let true_call = ToolCall {
            call_id: "w".into(),
            tool: "true".into(),
            arguments: "{}".into(),
        };
        for round in 0..args.rounds {
            // Interleave, rotating the order each round.
            for step in 0..names.len() {
                let which = (step + round) % names.len();
                quiet(2).await;
                let sample = match which {
                    0 => {
                        sample_on_runtime(async { time_command(&mut Command::new("/bin/true")) })
                            .await
                    }
                    1 => match &bwrap {
                        Some(b) => {
                            let b = b.clone();
                            sample_on_runtime(async move { time_command(&mut bwrap_command(&b)) })
                                .await
                        }
                        None => None,
                    },
                    2 => {
                        let me = me.clone();
                        sample_on_runtime(async move {
                            time_command(Command::new(&me).args(["exec", "--", "/bin/true"]))
                        })
                        .await
                    }
                    3 | 6 => {
                        let supervisor =
                            Arc::clone(if which == 3 { &cold } else { &cold_shared_net });
                        let run = true_run(&policy);
                        sample_on_runtime(async move {
                            let started = Instant::now();
                            let ok = supervisor.run(run, None).await.ok;
                            ok.then(|| started.elapsed().as_secs_f64() * 1000.0)
                        })
                        .await
                    }
                    _ => {
                        let gate = Arc::clone(&gate);
                        let call = if which == 4 {
                            true_call.clone()
                        } else {
                            builtin_call.clone()
                        };
                        sample_on_runtime(async move {
                            let started = Instant::now();
                            let ok = gate.call(&call, &CallOptions::default()).await.ok;
                            ok.then(|| started.elapsed().as_secs_f64() * 1000.0)
                        })
                        .await
                    }
                };
                samples[which].extend(sample);
            }
        }
        let summaries: Vec<_> = names
            .iter()
            .zip(samples)
            .map(|(n, s)| summarize(n, s))
            .collect();
        let floor = summaries[0].1;
        let bwrap_median = (summaries[1].3 > 0).then_some(summaries[1].1);
        let latency: Vec<Latency> = summaries
            .iter()
            .filter(|s| s.3 > 0)
            .map(|(name, median, p99, n)| Latency {
                name: name.clone(),
                median_ms: *median,
                p99_ms: *p99,
                samples: *n,
                vs_floor: median / floor,
                vs_bwrap: bwrap_median.map(|b| median / b),
            })
            .collect();

        // Deadline → everything reaped: how long past the deadline the result arrives.
        let sleep_call = ToolCall {
            call_id: "d".into(),
            tool: "sleep".into(),
            arguments: "{}".into(),
        };
        let mut overshoot = Vec::new();
        for _ in 0..20 {
            quiet(2).await;
            let started = Instant::now();
            let result = gate.call(&sleep_call, &CallOptions::default()).await;
            if result
                .error
                .as_ref()
                .is_some_and(|e| e.kind == airlock::ErrorKind::Timeout)
            {
                overshoot.push((started.elapsed().as_secs_f64() * 1000.0 - 100.0).max(0.0));
            }
        }
        let (name, median, p99, n) =
            summarize("deadline → reaped (past a 100 ms deadline)", overshoot);
        let deadline = Latency {
            name,
            median_ms: median,
            p99_ms: p99,
            samples: n,
            vs_floor: median / floor,
            vs_bwrap: None,
        };

        let mut airlock_tp = Vec::new();
        let mut bwrap_tp = Vec::new();
        let mut pool_during_tp = Vec::new();
        drop(gate);
        pooled.close().await;
        let pooled = Arc::new(Supervisor::start(crate::supervisor_options())?);
        pooled.keep_warm(Arc::clone(&profile), args.throughput_pool);
        let gate = Arc::new(Gate::new(Arc::clone(&pooled), policy.clone()));
        let mut ratios = Vec::new();
        let mut tail = Vec::new();
        let mut bwrap_tail = Vec::new();
        let slices = args.throughput_slices;
        let slice_seconds = args.throughput_seconds / f64::from(slices);
        for clients in [1usize, 2] {
            let mut airlock = SliceTotals::default();
            let mut bwrap_totals = SliceTotals::default();
            let mut slice_ratios = Vec::new();
            let mut call_latencies = Vec::new();
            let mut bwrap_latencies = Vec::new();
            for slice in 0..slices {
                // ABBA: airlock first in even slices, bwrap first in odd ones. Each slice
                // starts on a quiet supervisor (pool full, nothing being reaped), so neither
                // contender pays for the other's leftovers.
                let bwrap_first = slice % 2 == 1;
                let mut bwrap_rate = None;
                if let (Some(b), true) = (&bwrap, bwrap_first) {
                    settle(&pooled, args.throughput_pool, &[]).await;
                    let (calls, seconds, latencies) = bwrap_throughput(b, clients, slice_seconds);
                    bwrap_latencies.extend(latencies);
                    bwrap_rate = Some(bwrap_totals.add((calls, seconds)));
                }
                settle(&pooled, args.throughput_pool, &[]).await;
                let before = pooled.pool_stats();
                let started = Instant::now();
                let (calls, _, latencies) = throughput(&gate, clients, slice_seconds).await;
                call_latencies.extend(latencies);
                // The slice ends where it began: with the pool refilled to what it held
                // and every used worker reaped. So each call counted paid, on the clock, for
                // making a worker and for its clean-up, as in a steady state.
                let clients_done = Instant::now();
                settle(&pooled, before.idle, &[]).await;
                airlock.refill_seconds += clients_done.elapsed().as_secs_f64();
                let after = pooled.pool_stats();
                let rate = airlock.add((calls, started.elapsed().as_secs_f64()));
                airlock.hits += after.hits.saturating_sub(before.hits);
                airlock.misses += after.misses.saturating_sub(before.misses);
                airlock.cgroups_reused +=
                    after.cgroups_reused.saturating_sub(before.cgroups_reused);
                if let (Some(b), false) = (&bwrap, bwrap_first) {
                    settle(&pooled, args.throughput_pool, &[]).await;
                    let (calls, seconds, latencies) = bwrap_throughput(b, clients, slice_seconds);
                    bwrap_latencies.extend(latencies);
                    bwrap_rate = Some(bwrap_totals.add((calls, seconds)));
                }
                if let Some(bwrap_rate) = bwrap_rate.filter(|r| *r > 0.0) {
                    slice_ratios.push(rate / bwrap_rate);
                }
            }
            let rate = airlock.rate();
            tail.push(TailLatency::of(clients, call_latencies));
            if !bwrap_latencies.is_empty() {
                bwrap_tail.push(TailLatency::of(clients, bwrap_latencies));
            }
            airlock_tp.push((format!("{clients} client(s), warm pooled /bin/true"), rate));
            pool_during_tp.push(PoolUse {
                clients,
                hits: airlock.hits,
                misses: airlock.misses,
                refill_seconds: airlock.refill_seconds,
                cgroups_reused: airlock.cgroups_reused,
            });
            if bwrap.is_some() {
                let bwrap_rate = bwrap_totals.rate();
                bwrap_tp.push((format!("{clients} client(s)"), bwrap_rate));
                if bwrap_rate > 0.0 {
                    ratios.push(ThroughputRatio {
                        clients,
                        ratio: rate / bwrap_rate,
                        slice_ratio_min: slice_ratios.iter().copied().fold(f64::INFINITY, f64::min),
                        slice_ratio_max: slice_ratios.iter().copied().fold(0.0, f64::max),
                        slices,
                    });
                }
            }
        }

        let egress = match egress::measure(&policy, args.rounds, crate::supervisor_options()).await
        {
            Ok(measured) => Some(measured),
            Err(why) => {
                notes.push(format!("egress not measured: {why}"));
                None
            }
        };

        let denial_reporting =
            match denials::measure(BENCH_POLICY, args.rounds, crate::supervisor_options()).await {
                Ok(measured) => Some(measured),
                Err(why) => {
                    notes.push(format!("denial reporting not measured: {why}"));
                    None
                }
            };

        let landlock_audit = match denials::measure_landlock_audit(
            BENCH_POLICY,
            args.rounds,
            crate::supervisor_options,
        )
        .await
        {
            Ok(measured) => Some(measured),
            Err(why) => {
                notes.push(format!("landlock audit not measured: {why}"));
                None
            }
        };

        let session = match session::measure(args.rounds, crate::supervisor_options()).await {
            Ok(measured) => Some(measured),
            Err(why) => {
                notes.push(format!("sessions not measured: {why}"));
                None
            }
        };

        // Memory: the supervisor idle, then with N idle pooled workers.
        drop(gate);
        pooled.close().await;
        cold.close().await;
        cold_shared_net.close().await;
        let rss_idle = rss_kib("self");
        let rss_file = status_kib("self", "RssFile:");
        let rss_anon = status_kib("self", "RssAnon:");
        let memory = Arc::new(Supervisor::start(crate::supervisor_options())?);
        memory.keep_warm(Arc::clone(&profile), args.pool_workers);
        let deadline_fill = Instant::now() + Duration::from_secs(60);
        while memory.pool_stats().idle < args.pool_workers && Instant::now() < deadline_fill {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let rss_pool = rss_kib("self");
        // Our children that are pooled workers (argv[0] "airlock-worker").
        let workers = pooled_workers_of("self");
        if workers.len() != args.pool_workers {
            notes.push(format!(
                "found {} pooled worker processes, expected {}",
                workers.len(),
                args.pool_workers
            ));
        }
        let count = workers.len().max(1) as u64;
        let worker_rss: u64 = workers.iter().map(|pid| rss_kib(pid)).sum();
        let per_worker = worker_rss / count;
        let worker_pss: u64 = workers.iter().map(|pid| pss_kib(pid)).sum();
        let worker_anon: u64 = workers.iter().map(|pid| status_kib(pid, "RssAnon:")).sum();
        memory.close().await;
        let daemon_memory = match measure_daemon_memory(&me, args.pool_workers) {
            Ok(measured) => Some(measured),
            Err(why) => {
                notes.push(format!("daemon memory not measured: {why}"));
                None
            }
        };
        anyhow::Ok(Report {
            rounds: args.rounds,
            latency,
            throughput_calls_per_s: airlock_tp,
            bwrap_throughput_calls_per_s: bwrap_tp,
            throughput_vs_bwrap: ratios,
            pool_during_throughput: pool_during_tp,
            latency_under_load: tail,
            bwrap_latency_under_load: bwrap_tail,
            throughput_pool: args.throughput_pool,
            deadline_to_reaped_ms: deadline,
            supervisor_rss_idle_kib: rss_idle,
            supervisor_rss_with_pool_kib: rss_pool,
            worker_rss_per_idle_pooled_kib: per_worker,
            worker_pss_per_idle_pooled_kib: worker_pss / count,
            worker_anon_per_idle_pooled_kib: worker_anon / count,
            supervisor_rss_file_kib: rss_file,
            supervisor_rss_anon_kib: rss_anon,
            pool_workers: args.pool_workers,
            daemon_memory,
            egress,
            denial_reporting,
            landlock_audit,
            oneshot,
            burst,
            session,
            notes,
        })
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        table::print_table(&report);
    }
    Ok(std::process::ExitCode::SUCCESS)
}
