//! `airlock serve` for the daemon tests: started on a scratch socket, its log kept.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
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
        let scratch = Scratch::trusted("daemon");
        let policy = scratch.write("policy.toml", policy_text);
        Self::start_from(scratch, policy, extra)
    }

    /// Serves the policy file at `policy` (anywhere, a symlink say) with `extra` flags, its
    /// socket in `scratch`, which it keeps until dropped.
    pub fn start_from(scratch: Scratch, policy: PathBuf, extra: &[&str]) -> Self {
        Self::start_command(scratch, policy, extra, |_| {})
    }

    /// Serves [`DAEMON_POLICY`] with `extra` flags, started with the open-file limits
    /// `soft` and `hard` (as a shell's `ulimit -Sn`/`-Hn` or a unit's `LimitNOFILE=`).
    pub fn start_with_open_files(extra: &[&str], soft: u64, hard: u64) -> Self {
        Self::start_with_policy_and_open_files(DAEMON_POLICY, extra, soft, hard)
    }

    /// Serves `policy_text` with `extra` flags, started with the open-file limits `soft`
    /// and `hard`.
    pub fn start_with_policy_and_open_files(
        policy_text: &str,
        extra: &[&str],
        soft: u64,
        hard: u64,
    ) -> Self {
        let scratch = Scratch::trusted("daemon");
        let policy = scratch.write("policy.toml", policy_text);
        Self::start_command(scratch, policy, extra, |command| {
            crate::with_open_file_limit(command, soft, hard);
        })
    }

    fn start_command(
        scratch: Scratch,
        policy: PathBuf,
        extra: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> Self {
        let socket = scratch.0.join("airlock.sock");
        let mut command = Command::new(airlock_bin());
        command
            .args(["serve", "--policy"])
            .arg(&policy)
            .arg("--socket")
            .arg(&socket);
        // A test's large request must never race the read timeout on a slow machine: the
        // hang guard, unless the test is about that timeout.
        if !extra.contains(&"--read-timeout") {
            command.arg(format!("--read-timeout={}s", crate::HANG_GUARD.as_secs()));
        }
        command.args(extra).stderr(Stdio::piped());
        configure(&mut command);
        let mut child = command.spawn().unwrap();
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

    /// The daemon's child processes (pids, sorted), from every thread's `children` list.
    pub fn children(&self) -> Vec<String> {
        let mut found = Vec::new();
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.child.id()));
        for task in tasks.into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            found.extend(text.split_whitespace().map(str::to_string));
        }
        found.sort();
        found
    }

    /// The daemon's open descriptors counted by kind: the target with what differs
    /// between two equal states taken out (the inodes of sockets, pipes and namespaces,
    /// the names of the daemon's cgroups), so two measures compare as counts of the same
    /// things.
    pub fn descriptors(&self) -> std::collections::BTreeMap<String, usize> {
        let dir = format!("/proc/{}/fd", self.child.id());
        let mut found = std::collections::BTreeMap::new();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            // Gone between listing and reading: it was closed, so it is not counted.
            let Ok(target) = std::fs::read_link(entry.path()) else {
                continue;
            };
            *found.entry(descriptor_kind(&target)).or_default() += 1;
        }
        found
    }

    /// The cgroup directories the daemon made (`airlock-<its pid>-…`, see the supervisor's
    /// naming) anywhere beneath its own cgroup, in every mounted hierarchy, sorted. Under
    /// cgroup v1 one cgroup is a directory in each controller's hierarchy: see
    /// [`Daemon::cgroups`].
    pub fn cgroup_dirs(&self) -> Vec<String> {
        self.cgroup_scope().dirs()
    }

    /// The cgroups the daemon made, by name: one entry however many hierarchies hold it.
    pub fn cgroups(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .cgroup_dirs()
            .iter()
            .filter_map(|dir| Some(Path::new(dir).file_name()?.to_string_lossy().into_owned()))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Where the daemon's cgroups are, to look there after it has exited.
    pub fn cgroup_scope(&self) -> CgroupScope {
        let pid = self.child.id();
        let own: Vec<String> = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.splitn(3, ':').nth(2))
            .map(|path| path.trim_start_matches('/'))
            // Under cgroup v2 a daemon may have moved itself into an `airlock-supervisor`
            // leaf of its cgroup; its workers' cgroups are then beside that leaf.
            .map(|path| match path.rsplit_once('/') {
                Some((parent, "airlock-supervisor")) => parent.to_string(),
                None if path == "airlock-supervisor" => String::new(),
                _ => path.to_string(),
            })
            .collect();
        let mut roots = Vec::new();
        for mount in cgroup_mounts() {
            roots.extend(own.iter().map(|path| mount.join(path)));
        }
        CgroupScope {
            roots,
            prefix: format!("airlock-{pid}-"),
        }
    }
}

/// The cgroups one daemon may make: its own cgroup in every mounted hierarchy, and the
/// names it gives what it makes beneath them.
#[derive(Debug)]
pub struct CgroupScope {
    roots: Vec<PathBuf>,
    prefix: String,
}

impl CgroupScope {
    /// The directories of the daemon's cgroups that exist now, sorted.
    pub fn dirs(&self) -> Vec<String> {
        let mut found = Vec::new();
        for root in &self.roots {
            collect_named(root, &self.prefix, 4, &mut found);
        }
        found.sort();
        found.dedup();
        found
    }
}

/// What a descriptor's target is, without the parts that name one instance of it.
fn descriptor_kind(target: &Path) -> String {
    let text = target.display().to_string();
    // `socket:[4026…]`, `pipe:[…]`, `net:[…]` (a namespace): one kind whatever the inode.
    if let Some((kind, inode)) = text.split_once(":[")
        && inode
            .trim_end_matches(']')
            .bytes()
            .all(|b| b.is_ascii_digit())
    {
        return format!("{kind}:");
    }
    let parts: Vec<&str> = text
        .split('/')
        .map(|part| {
            if part.starts_with("airlock-") {
                "airlock-*"
            } else {
                part
            }
        })
        .collect();
    parts.join("/")
}

/// Mount points of cgroup (v1) and cgroup2 hierarchies, from `/proc/self/mountinfo`.
fn cgroup_mounts() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fstype = after.split_whitespace().next()?;
            let point = before.split_whitespace().nth(4)?;
            matches!(fstype, "cgroup" | "cgroup2").then(|| PathBuf::from(point))
        })
        .collect()
}

/// Directories below `dir` (down to `depth` levels) whose names start with `prefix`.
fn collect_named(dir: &std::path::Path, prefix: &str, depth: usize, found: &mut Vec<String>) {
    if depth == 0 {
        return;
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name().to_string_lossy().starts_with(prefix) {
            found.push(entry.path().display().to_string());
        }
        collect_named(&entry.path(), prefix, depth - 1, found);
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

/// One JSON-lines request to the daemon on `socket`, and its answer.
pub fn ask(socket: &Path, request: serde_json::Value) -> serde_json::Value {
    use std::io::Write;
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream.set_read_timeout(Some(crate::HANG_GUARD)).unwrap();
    stream.write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}
