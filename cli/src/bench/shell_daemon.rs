//! The daemon behind the one-shot section's `airlock run --socket` contender: `airlock
//! serve` with the bench policy and a pool of one worker per profile, a child of the bench
//! that is stopped (SIGTERM, then reaped) when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::memory::ask_daemon;

/// How long the daemon may take to answer `health` ready, and a refill to finish: far
/// more than either takes, so that only a daemon that is stuck runs out of it.
const READY_WITHIN: Duration = Duration::from_secs(120);

/// A running `airlock serve` for the shell client contender.
pub(super) struct ShellDaemon {
    child: Child,
    socket: PathBuf,
}

impl ShellDaemon {
    /// Starts `airlock serve` of `airlock` on `policy` with its socket in `dir`, and waits
    /// until it answers ready (its pools warm).
    pub(super) fn start(airlock: &Path, policy: &Path, dir: &Path) -> Result<Self, String> {
        let socket = dir.join("shell.sock");
        let child = Command::new(airlock)
            .arg("serve")
            .arg("--policy")
            .arg(policy)
            .arg("--socket")
            .arg(&socket)
            .args(["--pool", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start airlock serve: {e}"))?;
        let daemon = Self { child, socket };
        let started = Instant::now();
        loop {
            match ask_daemon(&daemon.socket, r#"{"id": 1, "op": "health"}"#) {
                Ok(answer) if answer["result"]["ready"] == true => return Ok(daemon),
                _ if started.elapsed() > READY_WITHIN => {
                    return Err(format!(
                        "airlock serve was not ready within {} s",
                        READY_WITHIN.as_secs()
                    ));
                }
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// The daemon's socket.
    pub(super) fn socket(&self) -> &Path {
        &self.socket
    }

    /// The daemon's pid.
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the pool has refilled after a call (at most [`READY_WITHIN`]), so that
    /// its refill does not run beside the next contender.
    pub(super) fn wait_for_refill(&self) {
        let started = Instant::now();
        while started.elapsed() < READY_WITHIN {
            let Ok(stats) = ask_daemon(&self.socket, r#"{"id": 1, "op": "stats"}"#) else {
                return;
            };
            let pool = &stats["result"]["pool"];
            match (pool["idle"].as_u64(), pool["idle_target"].as_u64()) {
                (Some(idle), Some(target)) if idle < target => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                _ => return,
            }
        }
    }

    /// CPU milliseconds the daemon and the workers it reaped have used so far
    /// (`/proc/<pid>/stat`: utime, stime, cutime, cstime, in clock ticks).
    pub(super) fn cpu_ms(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).ok()?;
        // The fields after the command name, which may hold spaces, ends at the last ')'.
        let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
        // utime is field 14 of stat(5); fields[0] here is field 3.
        let ticks: f64 = fields
            .get(11..15)?
            .iter()
            .map(|f| f.parse::<f64>().ok())
            .sum::<Option<f64>>()?;
        let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
        (per_second > 0).then(|| ticks * 1e3 / per_second as f64)
    }
}

impl Drop for ShellDaemon {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// Stops a daemon the bench started: SIGTERM, so that it removes its workers' cgroups and
/// its socket, then waits for it. Signalled by the pid held in `child`, our own child that
/// is not reaped until the wait below, so the pid cannot name another process.
pub(super) fn stop(child: &mut Child) {
    if let Ok(raw) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let _ = child.wait();
}
