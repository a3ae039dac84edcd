//! The daemon's Prometheus metrics (`airlock serve --metrics ADDR`): what it counts as
//! calls go by, and what it samples when scraped.
//!
//! Every label value is bounded: tools are named only when the policy in force has them
//! (a client may send any tool name), outcomes are result kinds, and denial layers are
//! capped. Nothing a client writes freely becomes a label.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use airlock_policy::CompiledPolicy;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::Shared;
use crate::pool::PoolStats;
use crate::result::ToolResult;
use crate::sandbox::SpawnObserver;

/// The tool label of a call whose tool the policy in force does not have.
pub(super) const UNKNOWN_TOOL: &str = "(unknown)";

/// The denial layer label past [`MAX_DENIAL_LAYERS`] distinct ones, or of a name that is not
/// a short lower-case word.
const OTHER_LAYER: &str = "other";

/// Distinct denial layers named before the rest count as [`OTHER_LAYER`].
const MAX_DENIAL_LAYERS: usize = 16;

type Labels2 = [(&'static str, String); 2];
type Labels1 = [(&'static str, String); 1];

fn seconds_histogram(start: f64, length: u16) -> Histogram {
    Histogram::new(exponential_buckets(start, 2.0, length))
}

/// Queue and spawn waits: 0.5 ms to about 16 s.
fn short_histogram() -> Histogram {
    seconds_histogram(0.000_5, 16)
}

/// Whole calls: 1 ms to about 131 s.
fn run_histogram() -> Histogram {
    seconds_histogram(0.001, 18)
}

/// What a scrape reads from the running daemon, put in place just before encoding.
#[derive(Debug, Default, Clone)]
struct Sample {
    pool: PoolStats,
    warm_pools: usize,
    sandbox_calls: usize,
    connections_open: usize,
    connections_accepted: u64,
    refused_peers: u64,
    overloaded: u64,
    in_flight: usize,
    queued: usize,
    rss_bytes: Option<u64>,
    ready: bool,
}

/// Encodes the latest [`Sample`] (a collector of the registry, so the sampled and the
/// counted metrics come out in one exposition).
#[derive(Debug, Default)]
struct Sampled(Arc<Mutex<Sample>>);

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn signed(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Collector for Sampled {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let e = &mut encoder;
        gauge(
            e,
            "airlock_ready",
            "1 when the daemon is ready (policy loaded, pools warm)",
            i64::from(s.ready),
        )?;
        gauge(
            e,
            "airlock_pool_idle_workers",
            "pre-confined idle workers, all pools",
            signed(s.pool.idle),
        )?;
        gauge(
            e,
            "airlock_pool_idle_target",
            "idle workers the pools aim for now",
            signed(s.pool.idle_target),
        )?;
        gauge(
            e,
            "airlock_pools_warm",
            "profiles whose pools are kept warm",
            signed(s.warm_pools),
        )?;
        counter(
            e,
            "airlock_pool_hits",
            "calls that took a pooled worker",
            s.pool.hits,
        )?;
        counter(
            e,
            "airlock_pool_misses",
            "calls that found their pool empty",
            s.pool.misses,
        )?;
        {
            let metric = encoder.encode_descriptor(
                "airlock_workers_alive",
                "workers alive: idle in a pool, or busy with a call (from spawn to reap)",
                None,
                ConstGauge::new(0i64).metric_type(),
            );
            let mut metric = metric?;
            for (state, n) in [("idle", s.pool.idle), ("busy", s.sandbox_calls)] {
                let labels = [("state", state)];
                ConstGauge::new(signed(n)).encode(metric.encode_family(&labels)?)?;
            }
        }
        let e = &mut encoder;
        gauge(
            e,
            "airlock_calls_in_flight",
            "calls holding a concurrency slot",
            signed(s.in_flight),
        )?;
        gauge(
            e,
            "airlock_calls_queued",
            "calls waiting for a concurrency slot",
            signed(s.queued),
        )?;
        gauge(
            e,
            "airlock_connections_open",
            "client connections open",
            signed(s.connections_open),
        )?;
        counter(
            e,
            "airlock_connections",
            "client connections accepted",
            s.connections_accepted,
        )?;
        counter(
            e,
            "airlock_refused_peers",
            "connections refused by the peer check",
            s.refused_peers,
        )?;
        counter(
            e,
            "airlock_overloaded",
            "calls and connections turned away as overloaded",
            s.overloaded,
        )?;
        if let Some(rss) = s.rss_bytes {
            let rss = i64::try_from(rss).unwrap_or(i64::MAX);
            gauge(
                e,
                "airlock_daemon_resident_bytes",
                "the daemon's resident memory (VmRSS)",
                rss,
            )?;
        }
        Ok(())
    }
}

/// The daemon's metrics.
#[derive(Debug)]
pub(super) struct Metrics {
    registry: Registry,
    sample: Arc<Mutex<Sample>>,
    calls: Family<Labels2, Counter>,
    queue: Histogram,
    spawn: Family<Labels1, Histogram>,
    run: Family<Labels1, Histogram>,
    denials: Family<Labels1, Counter>,
    /// Denial layers given a label of their own so far.
    denial_layers: Mutex<Vec<String>>,
}

impl Metrics {
    pub(super) fn new() -> Self {
        let mut registry = Registry::default();
        let calls = Family::<Labels2, Counter>::default();
        registry.register(
            "airlock_calls",
            "calls answered with a result record, by tool and outcome (ok or the error kind)",
            calls.clone(),
        );
        let queue = short_histogram();
        registry.register(
            "airlock_queue_seconds",
            "how long admitted calls waited for a concurrency slot",
            queue.clone(),
        );
        let spawn = Family::<Labels1, Histogram>::new_with_constructor(
            short_histogram as fn() -> Histogram,
        );
        registry.register(
            "airlock_spawn_seconds",
            "how long a call waited for its worker, by pool (hit or miss)",
            spawn.clone(),
        );
        let run =
            Family::<Labels1, Histogram>::new_with_constructor(run_histogram as fn() -> Histogram);
        registry.register(
            "airlock_run_seconds",
            "calls from their slot to their result (gate, worker and tool), by tool",
            run.clone(),
        );
        let denials = Family::<Labels1, Counter>::default();
        registry.register(
            "airlock_denials",
            "operations a confinement layer refused inside calls, by layer",
            denials.clone(),
        );
        let sample = Arc::new(Mutex::new(Sample::default()));
        registry.register_collector(Box::new(Sampled(Arc::clone(&sample))));
        Self {
            registry,
            sample,
            calls,
            queue,
            spawn,
            run,
            denials,
            denial_layers: Mutex::new(Vec::new()),
        }
    }

    /// Counts one result record answered to a client.
    pub(super) fn record_result(&self, policy: &CompiledPolicy, result: &ToolResult) {
        let outcome = match &result.error {
            None => "ok".to_string(),
            Some(error) => serde_json::to_value(error.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| "unknown".into()),
        };
        let labels = [
            ("tool", tool_label(policy, &result.tool)),
            ("outcome", outcome),
        ];
        self.calls.get_or_create(&labels).inc();
        self.record_denials(result.denials.iter().map(|d| (d.layer.as_str(), d.count)));
    }

    /// A call's wait for a concurrency slot.
    pub(super) fn observe_queue(&self, waited: Duration) {
        self.queue.observe(waited.as_secs_f64());
    }

    /// A call's run, from its slot to its result.
    pub(super) fn observe_run(&self, policy: &CompiledPolicy, tool: &str, took: Duration) {
        let labels = [("tool", tool_label(policy, tool))];
        self.run.get_or_create(&labels).observe(took.as_secs_f64());
    }

    /// What the supervisor tells of each call's wait for its worker, taken from a pool
    /// (`hit`) or made for the call (`miss`).
    pub(super) fn spawn_observer(&self) -> SpawnObserver {
        let spawn = self.spawn.clone();
        Arc::new(move |pooled: bool, took: Duration| {
            let labels = [("pool", if pooled { "hit" } else { "miss" }.to_string())];
            spawn.get_or_create(&labels).observe(took.as_secs_f64());
        })
    }

    /// Counts the denials of one call: each line's layer name (`landlock`, `seccomp`, ...)
    /// and count. Layer names come from the supervisor, never from a client; still, a name
    /// that is not a short lower-case word, or one past the first [`MAX_DENIAL_LAYERS`],
    /// counts as `other`, so the series stay bounded whatever a caller passes.
    pub(super) fn record_denials<'a>(&self, layers: impl IntoIterator<Item = (&'a str, u64)>) {
        for (layer, count) in layers {
            let label = self.denial_layer(layer);
            self.denials
                .get_or_create(&[("layer", label)])
                .inc_by(count);
        }
    }

    fn denial_layer(&self, layer: &str) -> String {
        let plain = !layer.is_empty()
            && layer.len() <= 32
            && layer.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
        if !plain {
            return OTHER_LAYER.into();
        }
        let mut known = self
            .denial_layers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if known.iter().any(|k| k == layer) {
            return layer.into();
        }
        if known.len() < MAX_DENIAL_LAYERS {
            known.push(layer.into());
            return layer.into();
        }
        OTHER_LAYER.into()
    }

    /// The exposition text of every metric, sampled from `shared` now.
    pub(super) fn render(&self, shared: &Shared) -> Result<String, std::fmt::Error> {
        let sample = sample_of(shared);
        *self.sample.lock().unwrap_or_else(PoisonError::into_inner) = sample;
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// A call's tool label: its name when the policy in force has that tool, else
/// [`UNKNOWN_TOOL`] (the tool names a client may send are unbounded).
fn tool_label(policy: &CompiledPolicy, tool: &str) -> String {
    if policy.tools.contains_key(tool) {
        tool.to_string()
    } else {
        UNKNOWN_TOOL.to_string()
    }
}

fn sample_of(shared: &Shared) -> Sample {
    let supervisor = shared.gate.supervisor();
    let s = &shared.stats;
    Sample {
        pool: supervisor.pool_stats(),
        warm_pools: supervisor.warm_pools(),
        sandbox_calls: supervisor.calls_in_flight(),
        connections_open: super::connections_open(shared),
        connections_accepted: s.connections.load(Ordering::Relaxed),
        refused_peers: s.refused_peers.load(Ordering::Relaxed),
        overloaded: s.overloaded.load(Ordering::Relaxed),
        in_flight: s.in_flight.load(Ordering::Relaxed),
        queued: s.queued.load(Ordering::Relaxed),
        rss_bytes: resident_bytes(),
        ready: super::readiness(shared).is_ok(),
    }
}

/// The daemon's resident memory, from `/proc/self/status` (`None` where it cannot be read:
/// the metric is left out rather than reported as zero).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denial_layers_stay_bounded_whatever_they_are_called() {
        let metrics = Metrics::new();
        assert_eq!(metrics.denial_layer("landlock"), "landlock");
        assert_eq!(metrics.denial_layer("Land\nlock"), OTHER_LAYER);
        assert_eq!(metrics.denial_layer(""), OTHER_LAYER);
        for n in 0..100 {
            let name: String = std::iter::repeat_n('a', n % 30 + 1).collect();
            metrics.record_denials([(name.as_str(), 1)]);
        }
        let named = metrics.denial_layers.lock().unwrap().len();
        assert_eq!(named, MAX_DENIAL_LAYERS);
        assert_eq!(metrics.denial_layer("latecomer"), OTHER_LAYER);
        assert_eq!(metrics.denial_layer("landlock"), "landlock");
    }

    #[test]
    fn a_results_denials_are_counted_by_layer_and_count() {
        use crate::result::{Denial, DenialLayer, ErrorKind, ToolError};
        let metrics = Metrics::new();
        let policy = airlock_policy::load_policy_str("version = 1\n", "m.toml")
            .map(|loaded| loaded.policy)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut result = ToolResult::rejected("c", "t", ToolError::new(ErrorKind::Timeout, ""));
        let line = |layer, count| Denial {
            layer,
            object: "x".into(),
            errno: None,
            rule: None,
            count,
        };
        result.denials = vec![
            line(DenialLayer::Seccomp, 3),
            line(DenialLayer::Seccomp, 2),
            line(DenialLayer::Limit, 1),
        ];
        metrics.record_result(&policy, &result);
        let count = |layer: &str| {
            metrics
                .denials
                .get_or_create(&[("layer", layer.to_string())])
                .get()
        };
        assert_eq!(count("seccomp"), 5);
        assert_eq!(count("limit"), 1);
    }

    #[test]
    fn resident_memory_is_read() {
        assert!(resident_bytes().is_some_and(|b| b > 0));
    }
}
