//! One-shot runs from the shell: whole `airlock exec -- /bin/true` and `airlock run` of a
//! command tool processes against `bwrap`, round-robin in one run, each with the CPU time
//! and context switches it and its descendants used; and, in the same rounds, `airlock run
//! --socket` of the same tool through an `airlock serve` with a pool, whose CPU adds the
//! daemon's share to the client's.
//!
//! Measured before anything else in the bench starts a supervisor in this process: the
//! CPU figures are the growth of this process's reaped-children usage across one child,
//! which would otherwise also count workers an in-process supervisor reaped meanwhile.
//! For the section, this process is a child subreaper and reaps every orphan after each
//! run: bwrap exits as soon as its sandbox's init reports the exit status, before that
//! init is reaped, and without this the init's CPU time (most of bwrap's) would count
//! nowhere. The wall time stops when the contender's own process exits, as a shell sees.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use nix::sys::resource::{UsageWho, getrusage};
use serde::Serialize;

use super::scratch::ScratchDir;
use super::shell_daemon::ShellDaemon;
use super::{BENCH_POLICY, bwrap_command, percentile};

/// Why the one-shot section could not run.
#[derive(Debug, thiserror::Error)]
pub enum OneshotError {
    /// Writing the bench policy to a file the child processes can read failed.
    #[error("cannot write the bench policy to {path}: {source}")]
    WritePolicy {
        /// The file.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Copying a contender's binary into the section's directory failed.
    #[error("cannot copy {from} to {to}: {source}")]
    CopyBinary {
        /// The binary.
        from: String,
        /// Its copy.
        to: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// One contender's whole-process figures.
#[derive(Debug, Clone, Serialize)]
pub struct OneshotFigures {
    name: String,
    median_ms: f64,
    p90_ms: f64,
    samples: usize,
    /// Mean user plus system CPU time per run, of the process and everything it reaped.
    cpu_ms_per_run: f64,
    /// Mean voluntary plus involuntary context switches per run, likewise.
    context_switches_per_run: f64,
    /// Median wall time over bwrap's.
    vs_bwrap: Option<f64>,
    /// The same ratio per round (this round's run over bwrap's in the same round): the
    /// 10th and 90th percentiles, so one figure's noise is visible.
    vs_bwrap_p10: Option<f64>,
    vs_bwrap_p90: Option<f64>,
    /// CPU time per run over bwrap's (for the daemon's client, its share of the
    /// daemon's CPU included).
    cpu_vs_bwrap: Option<f64>,
    /// The daemon's CPU per call of the `--socket` contender (its workers' included):
    /// all it used during the section over the calls it served; not in `cpu_ms_per_run`.
    #[serde(skip_serializing_if = "Option::is_none")]
    daemon_cpu_ms_per_run: Option<f64>,
}

/// The one-shot section of the report.
#[derive(Debug, Clone, Serialize)]
pub struct OneshotBench {
    rounds: usize,
    contenders: Vec<OneshotFigures>,
    /// Why the daemon's client was not measured, when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    daemon_not_measured: Option<String>,
}

/// One sample: wall milliseconds, CPU milliseconds, context switches.
type Sample = (f64, f64, f64);

fn children_usage() -> Option<(f64, f64)> {
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).ok()?;
    let ms = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e3 + t.tv_usec() as f64 / 1e3;
    let cpu = ms(usage.user_time()) + ms(usage.system_time());
    let switches =
        (usage.voluntary_context_switches() + usage.involuntary_context_switches()) as f64;
    Some((cpu, switches))
}

/// Runs `command` to completion, then reaps every orphan but `keep`; `None` unless it
/// exits 0.
fn sample(command: &mut Command, keep: Option<u32>) -> Option<Sample> {
    let (cpu_before, switches_before) = children_usage()?;
    let started = Instant::now();
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?;
    let wall = started.elapsed().as_secs_f64() * 1e3;
    reap_orphans(keep);
    let (cpu_after, switches_after) = children_usage()?;
    status.success().then_some((
        wall,
        cpu_after - cpu_before,
        switches_after - switches_before,
    ))
}

/// Waits for every remaining child (orphans adopted as subreaper) but `keep` until there is
/// none.
fn reap_orphans(keep: Option<u32>) {
    let Some(keep) = keep else {
        while nix::sys::wait::waitpid(None, None).is_ok() {}
        return;
    };
    // With a child that stays, waiting for any child would wait for it: wait for the
    // others by pid, as the kernel lists them, until none is left.
    loop {
        let others: Vec<u32> = children().into_iter().filter(|&c| c != keep).collect();
        if others.is_empty() {
            return;
        }
        for pid in others {
            if let Ok(raw) = i32::try_from(pid) {
                let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(raw), None);
            }
        }
    }
}

/// This process's children, from every thread's `children` list.
fn children() -> Vec<u32> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        found.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    found
}

/// Contenders: bwrap (if any), then each airlock binary's `exec` and `run`.
fn contenders(
    bwrap: Option<&Path>,
    airlocks: &[(String, PathBuf)],
    policy: &Path,
) -> Vec<(String, Box<dyn Fn() -> Command>)> {
    let mut all: Vec<(String, Box<dyn Fn() -> Command>)> = Vec::new();
    if let Some(bwrap) = bwrap {
        let bwrap = bwrap.to_path_buf();
        all.push((
            "bwrap --unshare-all /bin/true".into(),
            Box::new(move || bwrap_command(&bwrap)),
        ));
    }
    for (label, binary) in airlocks {
        let (exec_binary, exec_policy) = (binary.clone(), policy.to_path_buf());
        all.push((
            format!("airlock exec -- /bin/true ({label})"),
            Box::new(move || {
                let mut command = Command::new(&exec_binary);
                command
                    .arg("exec")
                    .arg("--policy")
                    .arg(&exec_policy)
                    .args(["--", "/bin/true"]);
                command
            }),
        ));
        let (run_binary, run_policy) = (binary.clone(), policy.to_path_buf());
        all.push((
            format!("airlock run --tool true ({label})"),
            Box::new(move || {
                let mut command = Command::new(&run_binary);
                command
                    .arg("run")
                    .arg("--policy")
                    .arg(&run_policy)
                    .args(["--tool", "true", "--input", "{}"]);
                command
            }),
        ));
    }
    all
}

/// `airlock run --socket` of the bench's `true` tool, through the daemon on `socket`.
fn client_contender(
    label: &str,
    binary: &Path,
    socket: &Path,
) -> (String, Box<dyn Fn() -> Command>) {
    let (binary, socket) = (binary.to_path_buf(), socket.to_path_buf());
    (
        format!("airlock run --socket, pooled daemon ({label})"),
        Box::new(move || {
            let mut command = Command::new(&binary);
            command
                .arg("run")
                .arg("--socket")
                .arg(&socket)
                .args(["--tool", "true", "--input", "{}"]);
            command
        }),
    )
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 { f64::NAN } else { sum / n as f64 }
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    values
}

/// An airlock binary and the label its rows carry.
type Labelled = (String, PathBuf);

/// Copies every contender's binary into `dir`, all together just before the rounds. How
/// long ago a binary's file was written moves its one-shot figures by up to a sixth (its
/// pages' state in the page cache), so contenders run from files of different ages would
/// be compared unfairly; copies made together share one history. Mode 0700: only this
/// process runs them. A setuid or setgid bwrap is run where it is: its copy would lose
/// the bit it may need.
fn fresh_copies(
    dir: &Path,
    bwrap: Option<&Path>,
    airlocks: &[(String, PathBuf)],
) -> Result<(Option<PathBuf>, Vec<Labelled>), OneshotError> {
    let copy = |from: &Path, name: String| {
        let to = dir.join(name);
        let failed = |source| OneshotError::CopyBinary {
            from: from.display().to_string(),
            to: to.display().to_string(),
            source,
        };
        std::fs::copy(from, &to).map_err(failed)?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o700)).map_err(failed)?;
        Ok(to)
    };
    let bwrap = match bwrap {
        Some(b) if std::fs::metadata(b).is_ok_and(|m| m.mode() & 0o6000 == 0) => {
            Some(copy(b, "bwrap".into())?)
        }
        other => other.map(Path::to_path_buf),
    };
    let airlocks = airlocks
        .iter()
        .enumerate()
        .map(|(i, (label, binary))| Ok((label.clone(), copy(binary, format!("airlock-{i}"))?)))
        .collect::<Result<_, OneshotError>>()?;
    Ok((bwrap, airlocks))
}

/// Measures `rounds` rounds, each contender once per round in an order that rotates, after
/// one untimed warm-up round (page cache, the first cgroup of the parent).
pub fn measure(
    rounds: usize,
    bwrap: Option<&Path>,
    airlocks: &[(String, PathBuf)],
) -> Result<OneshotBench, OneshotError> {
    let dir =
        ScratchDir::new("airlock-bench", 0o700).map_err(|source| OneshotError::WritePolicy {
            path: std::env::temp_dir().display().to_string(),
            source,
        })?;
    let dir = dir.path();
    let policy = dir.join("bench.toml");
    let write_failed = |source| OneshotError::WritePolicy {
        path: policy.display().to_string(),
        source,
    };
    std::fs::write(&policy, BENCH_POLICY).map_err(write_failed)?;
    let (bwrap, airlocks) = fresh_copies(dir, bwrap, airlocks)?;
    let (bwrap, airlocks) = (bwrap.as_deref(), airlocks.as_slice());
    let mut all = contenders(bwrap, airlocks, &policy);
    // Started before this process becomes a subreaper: the daemon is a child that stays.
    let daemon = match airlocks.first() {
        Some((label, binary)) => match ShellDaemon::start(binary, &policy, dir) {
            Ok(daemon) => {
                all.push(client_contender(label, binary, daemon.socket()));
                Ok(daemon)
            }
            Err(why) => Err(why),
        },
        None => Err("no airlock binary".to_string()),
    };
    let client = daemon.as_ref().ok().map(|_| all.len() - 1);
    let keep = daemon.as_ref().ok().map(ShellDaemon::pid);
    // Undone below: outside this section a subreaper would keep bwrap's orphans as zombies
    // (see `Supervisor::start`).
    let subreaper = nix::sys::prctl::set_child_subreaper(true).is_ok();
    // samples[contender][round]: None where that run failed.
    let mut samples: Vec<Vec<Option<Sample>>> = vec![Vec::new(); all.len()];
    let mut daemon_cpu_before = None;
    for round in 0..=rounds {
        if round == 1 {
            daemon_cpu_before = daemon.as_ref().ok().and_then(ShellDaemon::cpu_ms);
        }
        for step in 0..all.len() {
            let which = (step + round) % all.len();
            let taken = sample(&mut (all[which].1)(), keep);
            if Some(which) == client
                && let Ok(daemon) = &daemon
            {
                daemon.wait_for_refill();
            }
            if round > 0 {
                samples[which].push(taken);
            }
        }
    }
    let daemon_cpu = daemon.as_ref().ok().and_then(ShellDaemon::cpu_ms);
    let daemon_not_measured = daemon.as_ref().err().cloned();
    // Stopped (and reaped) before the orphans are: waiting for any child waits for it too.
    drop(daemon);
    if subreaper {
        let _ = nix::sys::prctl::set_child_subreaper(false);
        reap_orphans(None);
    }
    let bwrap_samples = bwrap.map(|_| &samples[0]);
    let median_of =
        |s: &[Option<Sample>]| percentile(&sorted(s.iter().flatten().map(|x| x.0).collect()), 0.5);
    let cpu_of = |s: &[Option<Sample>]| mean(s.iter().flatten().map(|x| x.1));
    let contenders = all
        .iter()
        .zip(&samples)
        .enumerate()
        .map(|(index, ((name, _), mine))| {
            let walls = sorted(mine.iter().flatten().map(|x| x.0).collect());
            let per_round: Option<Vec<f64>> = bwrap_samples.map(|theirs| {
                sorted(
                    mine.iter()
                        .zip(theirs)
                        .filter_map(|(a, b)| Some(a.as_ref()?.0 / b.as_ref()?.0))
                        .collect(),
                )
            });
            let served = mine.iter().flatten().count();
            let daemon_cpu_ms_per_run = match (daemon_cpu_before, daemon_cpu) {
                (Some(before), Some(after)) if Some(index) == client && served > 0 => {
                    Some((after - before) / served as f64)
                }
                _ => None,
            };
            let cpu = cpu_of(mine);
            let cpu_in_all = cpu + daemon_cpu_ms_per_run.unwrap_or(0.0);
            OneshotFigures {
                name: name.clone(),
                median_ms: percentile(&walls, 0.5),
                p90_ms: percentile(&walls, 0.9),
                samples: walls.len(),
                cpu_ms_per_run: cpu,
                context_switches_per_run: mean(mine.iter().flatten().map(|x| x.2)),
                vs_bwrap: bwrap_samples.map(|b| percentile(&walls, 0.5) / median_of(b)),
                vs_bwrap_p10: per_round.as_ref().map(|r| percentile(r, 0.1)),
                vs_bwrap_p90: per_round.as_ref().map(|r| percentile(r, 0.9)),
                cpu_vs_bwrap: bwrap_samples.map(|b| cpu_in_all / cpu_of(b)),
                daemon_cpu_ms_per_run,
            }
        })
        .collect();
    Ok(OneshotBench {
        rounds,
        contenders,
        daemon_not_measured,
    })
}

/// Prints the section as a table.
pub fn print(bench: &OneshotBench) {
    println!(
        "\none-shot, whole process ({} rounds, round-robin)",
        bench.rounds
    );
    println!(
        "{:<46} {:>9} {:>8} {:>8} {:>7} {:>8} {:>13} {:>7}",
        "", "median ms", "p90 ms", "CPU ms", "ctxsw", "× bwrap", "rounds p10–p90", "CPU ×"
    );
    let ratio = |r: Option<f64>| r.map_or("-".to_string(), |v| format!("{v:.2}"));
    for c in &bench.contenders {
        println!(
            "{:<46} {:>9.3} {:>8.3} {:>8.3} {:>7.1} {:>8} {:>13} {:>7}",
            c.name,
            c.median_ms,
            c.p90_ms,
            c.cpu_ms_per_run,
            c.context_switches_per_run,
            ratio(c.vs_bwrap),
            format!("{}–{}", ratio(c.vs_bwrap_p10), ratio(c.vs_bwrap_p90)),
            ratio(c.cpu_vs_bwrap),
        );
        if let Some(daemon) = c.daemon_cpu_ms_per_run {
            println!(
                "  the daemon's CPU per call, its workers' included: {daemon:.3} ms (in CPU ×)"
            );
        }
    }
    if let Some(why) = &bench.daemon_not_measured {
        println!("  airlock run --socket not measured: {why}");
    }
}
