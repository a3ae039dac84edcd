//! What the egress proxy costs: an HTTP GET and a bulk transfer to a loopback upstream,
//! direct and through the proxy, and a call of an egress profile against the same call of
//! a loopback profile, cold and pooled. Every pair is measured interleaved, in one run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::egress::{EgressLimits, EgressPolicy, HostRule, SystemResolver, proxy::DiscardEvents};
use airlock::{CancelSignal, SandboxRun, Supervisor};
use airlock_policy::CompiledPolicy;
use airlock_policy::egress::Cidr;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Bytes of the bulk transfer.
const BULK_BYTES: usize = 100 << 20;

/// The egress figures of one run, milliseconds unless named otherwise.
#[derive(Debug, Clone, Serialize)]
pub struct EgressBench {
    /// HTTP GET of a small page from a loopback upstream: medians.
    pub get_direct_ms: f64,
    pub get_proxied_ms: f64,
    pub get_added_ms: f64,
    /// 100 MiB from a loopback upstream, best of the rounds, MiB/s.
    pub transfer_direct_mib_s: f64,
    pub transfer_proxied_mib_s: f64,
    /// Proxied over direct throughput.
    pub transfer_ratio: f64,
    /// `/bin/true` on a cold worker: a loopback profile and the same with an allowlist.
    pub cold_loopback_ms: f64,
    pub cold_egress_ms: f64,
    pub cold_added_ms: f64,
    /// `/bin/true` on a pooled worker, the same two profiles.
    pub warm_loopback_ms: f64,
    pub warm_egress_ms: f64,
    pub warm_added_ms: f64,
    pub samples: usize,
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// An HTTP upstream: `/bulk` answers `BULK_BYTES`, anything else a short page.
async fn upstream() -> std::io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16 << 10 {
                    match stream.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let bulk = head.windows(5).any(|w| w == b"/bulk");
                let length = if bulk { BULK_BYTES } else { 2 };
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
                );
                if stream.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                if bulk {
                    let chunk = vec![b'x'; 1 << 20];
                    for _ in 0..BULK_BYTES / chunk.len() {
                        if stream.write_all(&chunk).await.is_err() {
                            return;
                        }
                    }
                } else {
                    let _ = stream.write_all(b"ok").await;
                }
            });
        }
    });
    Ok(port)
}

/// Sends `request` on a new connection to `port` and reads the answer to its end; the
/// bytes read.
async fn fetch(port: u16, request: &str, tunnel_to: Option<u16>) -> std::io::Result<usize> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream.set_nodelay(true)?;
    if let Some(target) = tunnel_to {
        let connect =
            format!("CONNECT 127.0.0.1:{target} HTTP/1.1\r\nHost: 127.0.0.1:{target}\r\n\r\n");
        stream.write_all(connect.as_bytes()).await?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            head.push(byte[0]);
        }
    }
    stream.write_all(request.as_bytes()).await?;
    let mut buffer = vec![0u8; 256 << 10];
    let mut total = 0;
    loop {
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            return Ok(total);
        }
        total += n;
    }
}

/// A call of `/bin/true` under `profile` of `policy`.
fn true_run(policy: &CompiledPolicy, profile: &str) -> SandboxRun {
    SandboxRun {
        call_id: "bench-egress".into(),
        tool: "true".into(),
        profile: Arc::clone(&policy.profiles[profile]),
        argv: vec!["/bin/true".into()],
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout: Duration::from_secs(30),
        inherit_stdio: None,
        builtin: None,
    }
}

/// Times one call; `None` if it failed.
async fn call_ms(supervisor: &Supervisor, run: SandboxRun) -> Option<f64> {
    let started = Instant::now();
    let result = supervisor.run(run, None).await;
    result.ok.then(|| ms(started))
}

/// Measures everything above; `rounds` samples of each latency.
pub async fn measure(
    policy: &CompiledPolicy,
    rounds: usize,
    options: airlock::SupervisorOptions,
) -> anyhow::Result<EgressBench> {
    let upstream = upstream().await?;
    let proxy_listener = TcpListener::bind("127.0.0.1:0").await?;
    let proxy = proxy_listener.local_addr()?.port();
    let allow = EgressPolicy::new(
        vec![HostRule::parse(&format!("127.0.0.1:{upstream}"))?],
        vec![Cidr::parse("127.0.0.1/32")?],
    );
    let stop = CancelSignal::new();
    let serving = tokio::spawn(airlock::egress::serve(
        proxy_listener,
        Arc::new(allow),
        EgressLimits {
            max_connections: u32::MAX,
            max_bytes: u64::MAX,
            ..EgressLimits::default()
        },
        Arc::new(SystemResolver),
        Arc::new(DiscardEvents),
        stop.clone(),
    ));
    let direct_get =
        format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{upstream}\r\nConnection: close\r\n\r\n");
    let proxied_get = format!(
        "GET http://127.0.0.1:{upstream}/ HTTP/1.1\r\nHost: 127.0.0.1:{upstream}\r\nConnection: close\r\n\r\n"
    );
    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    for _ in 0..rounds.max(20) * 5 {
        let started = Instant::now();
        fetch(upstream, &direct_get, None).await?;
        direct.push(ms(started));
        let started = Instant::now();
        fetch(proxy, &proxied_get, None).await?;
        proxied.push(ms(started));
    }
    let bulk =
        format!("GET /bulk HTTP/1.1\r\nHost: 127.0.0.1:{upstream}\r\nConnection: close\r\n\r\n");
    let (mut direct_rate, mut proxied_rate) = (0.0f64, 0.0f64);
    let mib = (BULK_BYTES >> 20) as f64;
    for _ in 0..3 {
        let started = Instant::now();
        fetch(upstream, &bulk, None).await?;
        direct_rate = direct_rate.max(mib / started.elapsed().as_secs_f64());
        let started = Instant::now();
        fetch(proxy, &bulk, Some(upstream)).await?;
        proxied_rate = proxied_rate.max(mib / started.elapsed().as_secs_f64());
    }
    stop.cancel();
    let _ = serving.await;

    let cold = Supervisor::start(options.clone())?;
    let warm = Arc::new(Supervisor::start(options)?);
    for profile in ["loopback", "egress"] {
        warm.keep_warm(Arc::clone(&policy.profiles[profile]), 1);
    }
    let (mut cold_loopback, mut cold_egress, mut warm_loopback, mut warm_egress) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (profile, samples) in [
            ("loopback", &mut cold_loopback),
            ("egress", &mut cold_egress),
        ] {
            samples.extend(call_ms(&cold, true_run(policy, profile)).await);
        }
        for (profile, samples) in [
            ("loopback", &mut warm_loopback),
            ("egress", &mut warm_egress),
        ] {
            // A pooled worker waiting: the call measures the pooled path only.
            let deadline = Instant::now() + Duration::from_secs(30);
            while warm.pool_stats().idle < 2 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            samples.extend(call_ms(&warm, true_run(policy, profile)).await);
        }
    }
    cold.close().await;
    warm.close().await;
    let (get_direct, get_proxied) = (median(direct), median(proxied));
    let (cold_l, cold_e) = (median(cold_loopback), median(cold_egress));
    let (warm_l, warm_e) = (median(warm_loopback), median(warm_egress));
    Ok(EgressBench {
        get_direct_ms: get_direct,
        get_proxied_ms: get_proxied,
        get_added_ms: get_proxied - get_direct,
        transfer_direct_mib_s: direct_rate,
        transfer_proxied_mib_s: proxied_rate,
        transfer_ratio: proxied_rate / direct_rate,
        cold_loopback_ms: cold_l,
        cold_egress_ms: cold_e,
        cold_added_ms: cold_e - cold_l,
        warm_loopback_ms: warm_l,
        warm_egress_ms: warm_e,
        warm_added_ms: warm_e - warm_l,
        samples: rounds,
    })
}

/// The table's egress section.
pub fn print(e: &EgressBench) {
    println!(
        "\negress proxy (medians of {} calls; transfer: best of 3)",
        e.samples
    );
    println!(
        "  HTTP GET, loopback upstream: direct / proxied   {:>7.3} / {:.3} ms (+{:.3} ms)",
        e.get_direct_ms, e.get_proxied_ms, e.get_added_ms
    );
    println!(
        "  100 MiB transfer: direct / through a tunnel     {:>7.0} / {:.0} MiB/s ({:.2}×)",
        e.transfer_direct_mib_s, e.transfer_proxied_mib_s, e.transfer_ratio
    );
    println!(
        "  cold call: loopback / with an allowlist          {:>7.3} / {:.3} ms (+{:.3} ms)",
        e.cold_loopback_ms, e.cold_egress_ms, e.cold_added_ms
    );
    println!(
        "  pooled call: loopback / with an allowlist        {:>7.3} / {:.3} ms (+{:.3} ms)",
        e.warm_loopback_ms, e.warm_egress_ms, e.warm_added_ms
    );
}
