//! Memory figures: RSS, PSS and anonymous memory of processes read from /proc, and a real
//! `airlock serve` measured idle and with pooled workers.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::BENCH_POLICY;
use super::scratch::ScratchDir;

pub(super) fn rss_kib(pid: &str) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// A `Key:  N kB` line of /proc/PID/status.
pub(super) fn status_kib(pid: &str, key: &str) -> u64 {
    kib_field(&format!("/proc/{pid}/status"), key)
}

/// Proportional set size (pages shared by n processes count 1/n).
pub(super) fn pss_kib(pid: &str) -> u64 {
    kib_field(&format!("/proc/{pid}/smaps_rollup"), "Pss:")
}

fn kib_field(path: &str, key: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Our child processes (workers), from /proc/self/task/*/children.
fn children(pid: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                out.extend(text.split_whitespace().map(str::to_string));
            }
        }
    }
    out
}

/// The children of `pid` that are pooled workers (argv[0] "airlock-worker").
pub(super) fn pooled_workers_of(pid: &str) -> Vec<String> {
    children(pid)
        .into_iter()
        .filter(|child| {
            std::fs::read(format!("/proc/{child}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"airlock-worker\0"))
        })
        .collect()
}

/// Memory of a real `airlock serve` process: what a gateway's supervisor costs, without
/// the bench's own code, samples and client threads.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DaemonMemory {
    /// Started, serving its socket, no call made yet.
    pub(super) rss_idle_kib: u64,
    pub(super) rss_idle_file_kib: u64,
    pub(super) rss_idle_anon_kib: u64,
    /// After one call, with `pool_workers` idle pooled workers.
    pub(super) rss_with_pool_kib: u64,
    /// Per idle pooled worker of the daemon.
    pub(super) worker_pss_kib: u64,
}

/// Asks the daemon on `socket` one JSON-lines request and returns its answer.
pub(super) fn ask_daemon(socket: &Path, request: &str) -> Result<serde_json::Value, String> {
    use std::io::{BufRead, BufReader, Write};
    let mut stream =
        std::os::unix::net::UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| format!("socket timeout: {e}"))?;
    stream
        .write_all(format!("{request}\n").as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| format!("receive: {e}"))?;
    serde_json::from_str(&line).map_err(|e| format!("answer {line:?}: {e}"))
}

/// Starts `airlock serve` with the bench policy and `--pool pool_workers`, measures it idle
/// and then with its pool filled after one call, and stops it (SIGTERM, then reaped).
pub(super) fn measure_daemon_memory(
    me: &Path,
    pool_workers: usize,
) -> Result<DaemonMemory, String> {
    let dir =
        ScratchDir::new("airlock-bench", 0o700).map_err(|e| format!("a scratch directory: {e}"))?;
    let dir = dir.path();
    let policy = dir.join("bench.toml");
    let socket = dir.join("airlock.sock");
    std::fs::write(&policy, BENCH_POLICY).map_err(|e| format!("write policy: {e}"))?;
    let mut daemon = Command::new(me)
        .arg("serve")
        .arg("--policy")
        .arg(&policy)
        .arg("--socket")
        .arg(&socket)
        .arg("--pool")
        .arg(pool_workers.to_string())
        // Exactly that many: the call below may find the pool still filling.
        .arg("--pool-max")
        .arg(pool_workers.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start airlock serve: {e}"))?;
    let pid = daemon.id().to_string();
    let measured = (|| {
        let started = Instant::now();
        while ask_daemon(&socket, r#"{"id": 1, "op": "health"}"#).is_err() {
            if started.elapsed() > Duration::from_secs(20) {
                return Err("airlock serve did not answer within 20 s".to_string());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut memory = DaemonMemory {
            rss_idle_kib: rss_kib(&pid),
            rss_idle_file_kib: status_kib(&pid, "RssFile:"),
            rss_idle_anon_kib: status_kib(&pid, "RssAnon:"),
            ..DaemonMemory::default()
        };
        let call = ask_daemon(
            &socket,
            r#"{"id": 2, "op": "call", "tool": "true", "arguments": {}}"#,
        )?;
        if call.pointer("/result/ok") != Some(&serde_json::Value::Bool(true)) {
            return Err(format!("the daemon's call failed: {call}"));
        }
        let started = Instant::now();
        loop {
            let stats = ask_daemon(&socket, r#"{"id": 3, "op": "stats"}"#)?;
            let idle = stats.pointer("/result/pool/idle").and_then(|v| v.as_u64());
            if idle.is_some_and(|n| n as usize >= pool_workers) {
                break;
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err(format!("the daemon's pool did not fill: {stats}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        memory.rss_with_pool_kib = rss_kib(&pid);
        let workers = pooled_workers_of(&pid);
        let count = workers.len().max(1) as u64;
        memory.worker_pss_kib = workers.iter().map(|w| pss_kib(w)).sum::<u64>() / count;
        Ok(memory)
    })();
    super::shell_daemon::stop(&mut daemon);
    measured
}
