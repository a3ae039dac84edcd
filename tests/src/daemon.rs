//! `airlock serve` for the daemon tests: started on a scratch socket, its log kept.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::{Scratch, airlock_bin, wait_until};

/// The daemon tests' policy: `echo`, `sleep` (until cancelled) and `guarded` (needs a
/// human). `echo` and `sleep` are concurrency-safe: the tests run several at once.
pub const DAEMON_POLICY: &str = r#"version = 1
[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = { "/tmp" = "16MiB" }
# airlock_tests::HANG_GUARD: calls end by their own event (a cancel, a hang-up), however
# slow the machine.
limits = { timeout = "300s" }

[tools.echo]
description = "echo a text"
command = ["/bin/echo", "{text}"]
side_effect = "read"
concurrency_safe = true
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }

[tools.sleep]
description = "sleep a while"
command = ["/bin/sleep", "{seconds}"]
side_effect = "read"
concurrency_safe = true
input = { type = "object", properties = { seconds = { type = "string", pattern = "^[0-9.]+$" } }, required = ["seconds"] }

[tools.guarded]
description = "needs a human"
command = ["/bin/echo", "{text}"]
side_effect = "write"
approval = "human"
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }
"#;

/// An `airlock serve` of this build on a socket in a scratch directory, killed on drop.
#[derive(Debug)]
pub struct Daemon {
    /// The daemon process.
    pub child: Child,
    /// Its socket.
    pub socket: PathBuf,
    /// Its policy file (rewrite it and send SIGHUP to reload).
    pub policy: PathBuf,
    /// What it has logged so far (its stderr, passed on to ours as well).
    log: Arc<Mutex<String>>,
    _scratch: Scratch,
}

impl Daemon {
    /// Serves [`DAEMON_POLICY`] with `extra` flags.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_with(DAEMON_POLICY, extra)
    }

    /// Serves `policy_text` with `extra` flags, once its socket exists.
    pub fn start_with(policy_text: &str, extra: &[&str]) -> Self {
        let scratch = Scratch::new("daemon");
        let policy = scratch.write("policy.toml", policy_text);
        Self::start_from(scratch, policy, extra)
    }

    /// Serves the policy file at `policy` (anywhere, a symlink say) with `extra` flags, its
    /// socket in `scratch`, which it keeps until dropped.
    pub fn start_from(scratch: Scratch, policy: PathBuf, extra: &[&str]) -> Self {
        let socket = scratch.0.join("airlock.sock");
        let mut child = Command::new(airlock_bin())
            .args(["serve", "--policy"])
            .arg(&policy)
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let kept = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                eprintln!("{line}");
                let mut log = kept.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        wait_until("the daemon creates its socket", || {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the daemon exited ({status}) without creating its socket");
            }
            socket.exists()
        });
        Self {
            child,
            socket,
            policy,
            log,
            _scratch: scratch,
        }
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }

    /// How many times the daemon has logged `text` so far.
    pub fn logged(&self, text: &str) -> usize {
        self.log.lock().unwrap().matches(text).count()
    }

    /// Waits until the daemon has logged a line containing `text`.
    pub fn wait_for_log(&self, text: &str) {
        wait_until(&format!("the daemon logs {text:?}"), || {
            self.log.lock().unwrap().contains(text)
        });
    }
}

impl Daemon {
    /// A line of the daemon's `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`), in KiB.
    pub fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

impl Drop for Daemon {
    /// SIGTERM first: the daemon then closes its sessions, whose workspaces (tmpfs mounts on
    /// the host, as root) a SIGKILL would leave mounted below a scratch directory nobody
    /// reuses. SIGKILL if it has not ended by the hang guard.
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill has no memory preconditions; the pid is our own child's, which
            // has not been waited for, so it cannot have been reused.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + crate::HANG_GUARD;
            while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
