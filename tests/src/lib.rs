//! Shared helpers for airlock's integration tests: find the real binaries, write policies,
//! run sandboxes, and skip loudly (or fail, under `AIRLOCK_MUST_WORK=1`) when the kernel
//! lacks a feature.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod daemon;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// Taken by every test of the suite (`tests/tests/suite`) before anything else: one test
/// binary, so tests of different files run at the same time, and some observe what every
/// other test disturbs — this process's children, its worker cgroups, its descriptors, its
/// environment. Those take it alone ([`exclusive`]); all others share it ([`shared`]).
static SUITE: RwLock<()> = RwLock::new(());

/// Held for the whole of a test: shared with other tests, or alone. A test's body holds it
/// across `.await`s, which is sound here: only the test's own thread (the one its runtime
/// blocks on) ever takes the lock, never a task on that runtime, so no task waits for it
/// while another on the same thread holds it. (Clippy's `await_holding_lock` does not look
/// inside this type, and for the reason above need not.)
#[derive(Debug)]
pub struct SuiteGuard {
    _held: Held,
}

#[derive(Debug)]
enum Held {
    Shared {
        _read: RwLockReadGuard<'static, ()>,
    },
    Exclusive {
        _write: RwLockWriteGuard<'static, ()>,
    },
}

/// For a test that only disturbs what others may share: it runs beside any other test but
/// an [`exclusive`] one. The first statement of every such test.
pub fn shared() -> SuiteGuard {
    // A test that panicked while holding the lock alone poisons it; that failure is its
    // own and reported as such, not a reason to fail every test after it.
    let held = SUITE.read().unwrap_or_else(PoisonError::into_inner);
    SuiteGuard {
        _held: Held::Shared { _read: held },
    }
}

/// For a test that observes process-wide state other tests change (our children, our
/// cgroups, our descriptors) or changes what they rely on (the environment): it runs
/// alone. std's RwLock on Linux lets a waiting writer in before new readers; were it not
/// to, such a test would only wait longer (until the shared ones ran out), never forever.
pub fn exclusive() -> SuiteGuard {
    let held = SUITE.write().unwrap_or_else(PoisonError::into_inner);
    SuiteGuard {
        _held: Held::Exclusive { _write: held },
    }
}

/// How long a test waits for something that must happen before it calls it a hang. Only
/// a hang guard, never a speed budget: the suite also runs under qemu's emulation, 10-50
/// times slower and uneven, so nothing a test asserts may depend on beating it. Tests
/// also give calls that must finish this as their deadline.
pub const HANG_GUARD: Duration = Duration::from_secs(300);

/// [`HANG_GUARD`] as a policy duration (`"300s"`).
pub fn hang_guard_toml() -> String {
    format!("\"{}s\"", HANG_GUARD.as_secs())
}

/// Polls `done` until it holds; panics, naming `what`, only after [`HANG_GUARD`].
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !done() {
        assert!(Instant::now() < deadline, "hung waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`wait_until`] for async tests: sleeps on the runtime between polls.
pub async fn wait_until_async(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !done() {
        assert!(Instant::now() < deadline, "hung waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whether skips must be failures (set by `.ci/run`).
pub fn must_work() -> bool {
    std::env::var("AIRLOCK_MUST_WORK").is_ok_and(|v| v == "1")
}

/// The directory holding the workspace's built binaries (target/debug or target/release).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test-binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// The `airlock` binary under test.
pub fn airlock_bin() -> PathBuf {
    if let Ok(path) = std::env::var("AIRLOCK_BIN") {
        return PathBuf::from(path);
    }
    let path = bin_dir().join("airlock");
    assert!(
        path.exists(),
        "{} is missing: run `cargo test --workspace` (it builds the airlock binary)",
        path.display()
    );
    path
}

/// A fixture program of this package (`airlock-probe`, `airlock-hostile-worker`, ...):
/// cargo builds them next to the `airlock` binary, and `ci/rootless-test` and `ci/vm-test`
/// keep that layout when they copy the suite elsewhere, so it is found beside the test
/// binary rather than at the path compiled in by `env!("CARGO_BIN_EXE_…")`.
pub fn fixture_bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(path.exists(), "{} is missing", path.display());
    path
}

/// Skips (or fails under `AIRLOCK_MUST_WORK=1`) when the sandbox cannot start here.
/// Returns true when the test may proceed.
pub fn sandbox_available() -> bool {
    static STATE: OnceLock<Result<(), String>> = OnceLock::new();
    let state = STATE.get_or_init(|| {
        let out = Command::new(airlock_bin())
            .args(["exec", "--json", "--", "/bin/true"])
            .output();
        match out {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(format!(
                "`airlock exec -- /bin/true` failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )),
            Err(e) => Err(format!("cannot run airlock: {e}")),
        }
    });
    match state {
        Ok(()) => true,
        Err(reason) if must_work() => {
            panic!("sandbox unavailable and AIRLOCK_MUST_WORK=1: {reason}")
        }
        Err(reason) => {
            eprintln!("SKIP: sandbox unavailable on this machine: {reason}");
            false
        }
    }
}

/// A scratch directory removed on drop.
#[derive(Debug)]
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A fresh directory under the system temp dir.
    pub fn new(tag: &str) -> Self {
        Self::under(&std::env::temp_dir(), tag)
    }

    /// A fresh directory for a policy that `airlock serve` or `airlock mcp` loads. Run as
    /// root, those refuse a policy that anyone else could change through its path, and the
    /// system temp directory is writable by everyone: the directory goes under
    /// `/run/airlock-tests` instead, made 0755 and root's. Otherwise, as [`Scratch::new`].
    /// Each test's directory is removed with its `Scratch`; `/run/airlock-tests` itself is
    /// left in place, empty, as tests running at once share it (it is gone at reboot).
    pub fn trusted(tag: &str) -> Self {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Self::new(tag);
        }
        let parent = Path::new("/run/airlock-tests");
        std::fs::create_dir_all(parent).unwrap();
        let meta = std::fs::symlink_metadata(parent).unwrap();
        assert!(
            meta.is_dir() && meta.uid() == 0,
            "{} is not root's",
            parent.display()
        );
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
        let scratch = Self::under(parent, tag);
        std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(0o755)).unwrap();
        scratch
    }

    /// A fresh directory under `parent` (created if missing).
    pub fn under(parent: &Path, tag: &str) -> Self {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = parent.join(format!("airlock-test-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// The fixture program `name` staged in its `bin` directory, for a policy to bind: the
    /// sandbox's root is another uid (65534 when the tests run as root), which may not reach
    /// the build directory (a checkout below a 0700 directory, as `mktemp -d` makes).
    pub fn stage(&self, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let bin = self.0.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        airlock_battery::stage_program(&fixture_bin(name), &bin).unwrap()
    }

    /// Writes a file in it and returns its path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A policy whose `default` profile reads the system dirs plus `extra_read`, with the given
/// `limits` table body (e.g. `memory = "64MiB", pids = 16`) and network mode.
pub fn test_policy(extra_read: &[&Path], limits: &str, network: &str) -> String {
    let extra: Vec<String> = extra_read
        .iter()
        .map(|p| format!("{:?}", p.display().to_string()))
        .collect();
    let mut read = vec!["\"/usr\"".to_string()];
    read.extend(extra);
    format!(
        r#"version = 1
[profiles.default]
read = [{}]
read_optional = ["/bin", "/sbin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = {{ "/tmp" = "16MiB" }}
network = "{network}"
limits = {{ {limits} }}
env = {{ PATH = "/usr/bin:/bin", LANG = "C.UTF-8" }}
"#,
        read.join(", ")
    )
}

/// Makes `command` start with the open-file limits `soft` and `hard` (RLIMIT_NOFILE).
pub fn with_open_file_limit(command: &mut Command, soft: u64, hard: u64) -> &mut Command {
    use std::os::unix::process::CommandExt;
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: the hook runs in the forked child before exec and only calls setrlimit,
    // which is async-signal-safe, on a struct it owns.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        })
    }
}

/// Runs `airlock exec --json [--policy FILE] -- cmd...` and returns the result record.
pub fn exec_json(
    policy: Option<&Path>,
    extra_args: &[&str],
    command: &[&str],
) -> serde_json::Value {
    let mut cmd = Command::new(airlock_bin());
    cmd.arg("exec").arg("--json");
    if let Some(policy) = policy {
        cmd.arg("--policy").arg(policy);
    }
    cmd.args(extra_args).arg("--").args(command);
    let out = cmd.output().expect("run airlock");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "airlock exec --json printed no result record ({e}); status {}; stdout {}; stderr {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Runs `airlock exec` with stdio passed through and returns the output.
pub fn exec_plain(policy: Option<&Path>, extra_args: &[&str], command: &[&str]) -> Output {
    let mut cmd = Command::new(airlock_bin());
    cmd.arg("exec");
    if let Some(policy) = policy {
        cmd.arg("--policy").arg(policy);
    }
    cmd.args(extra_args).arg("--").args(command);
    cmd.output().expect("run airlock")
}

/// stdout of a result record.
pub fn stdout_of(result: &serde_json::Value) -> String {
    result["stdout"].as_str().unwrap_or_default().to_string()
}

/// Host processes whose command line contains `marker` (excluding this test process).
pub fn host_processes_with(marker: &str) -> Vec<u32> {
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) && !text.contains("airlock exec") && !text.contains("cargo") {
                found.push(pid);
            }
        }
    }
    found
}

/// Seconds for a `sleep` that a test finds among the host's processes by its command line
/// (`sleep <seconds>`, [`host_processes_with`]): unique to this call, since every test of
/// the suite shares this process's pid, and each one is at least 10,000 s, far past
/// [`HANG_GUARD`], so that only the test's own doing ends the sleep. This process's pid
/// followed by a four-digit count (a run takes a dozen or so) and `.5`: no two are equal,
/// here or in another process made so, and none is the start of another.
pub fn sleep_marker() -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}{n:04}.5", std::process::id())
}

/// A supervisor with default options whose workers are this build's `airlock` binary.
pub fn supervisor() -> airlock::Supervisor {
    airlock::Supervisor::start(airlock::SupervisorOptions {
        worker_program: Some((airlock_bin(), Vec::new())),
        ..Default::default()
    })
    .unwrap()
}

/// A supervisor like [`supervisor`] whose cold calls build their own roots, as `airlock
/// exec`'s does (a one-shot supervisor makes no root template).
pub fn own_root_supervisor() -> airlock::Supervisor {
    airlock::Supervisor::start(airlock::SupervisorOptions {
        worker_program: Some((airlock_bin(), Vec::new())),
        one_shot: true,
        ..Default::default()
    })
    .unwrap()
}

/// A supervisor whose workers are `airlock-hostile-worker` breaking the protocol in `mode`.
pub fn supervisor_with_hostile_worker(mode: &str) -> airlock::Supervisor {
    airlock::Supervisor::start(airlock::SupervisorOptions {
        worker_program: Some((
            fixture_bin("airlock-hostile-worker"),
            vec![mode.to_string()],
        )),
        ..Default::default()
    })
    .unwrap()
}

/// Worker cgroup directories of this test process (`airlock-<pid>-<start>-<n>`) under
/// `parents`.
pub fn our_cgroup_dirs<P: AsRef<Path>>(parents: &[P]) -> Vec<String> {
    let prefix = format!("airlock-{}-", std::process::id());
    parents
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|name| name.starts_with(&prefix))
        .collect()
}

/// The pids of this process's children, from every thread's `children` list.
pub fn our_children() -> Vec<String> {
    let mut children = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        children.extend(text.split_whitespace().map(str::to_string));
    }
    children
}

/// The entries of `now` missing from `before`: what a test added to a list of this
/// process's ([`our_children`], [`our_cgroup_dirs`], its descriptors), without what earlier
/// tests of the suite — the same process — had left there when it began (a supervisor they
/// dropped may still be reaping its workers).
pub fn added_since(before: &[String], now: Vec<String>) -> Vec<String> {
    now.into_iter()
        .filter(|entry| !before.contains(entry))
        .collect()
}
