//! One sandboxed run, start to finish: cgroup, spawn, handshake, confine, run, deadline,
//! kill, reap, account, clean up — and the single [`ToolResult`] that says what happened.
//!
//! The supervisor trusts its own clock (deadline), the cgroup counters (OOM, pids, peak
//! memory) and the wait status of the worker; the worker only reports what the tool
//! printed and how it exited.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use airlock_policy::CompiledProfile;
use airlock_protocol::{
    AppliedIsolation, ExitStatus, PROTOCOL_VERSION, RunRequest, SetupFailure, StdioMode,
    SupervisorMessage, ToolExit, WorkerMessage,
};

use crate::cancel::CancelSignal;
use crate::cgroup::{CgroupLimits, CgroupParent, CgroupRecycler, CgroupStats, WorkerCgroup};
use crate::channel::{ChannelError, WorkerChannel};
use crate::pool::{IdleTarget, Pool, PoolClock, PoolSize, PoolStats, SystemPoolClock};
use crate::result::{AppliedLimits, ErrorKind, Isolation, LandlockLevel, ToolError, ToolResult};
use crate::spawn::{
    IdMapping, PendingSpawn, SpawnError, SpawnRequest, Spawned, Spawner, WorkerImage, WorkerNetwork,
};
use crate::sys;
use crate::template::{
    Lookup, RootTemplate, TemplateError, Templates, source_identities, split_plan,
};

/// Why a supervisor could not start.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// Building the worker image or the spawner failed.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
}

/// Options of a [`Supervisor`].
#[derive(Debug, Clone, Default)]
pub struct SupervisorOptions {
    /// Host uid (and gid) of the sandbox's root when running as host root (default 65534).
    pub sandbox_host_id: Option<u32>,
    /// A delegated cgroup parent instead of detecting our own cgroup.
    pub cgroup_parent: Option<CgroupParent>,
    /// Run this program as the worker instead of the current executable, with these extra
    /// arguments (tests use it to play a hostile worker).
    pub worker_program: Option<(std::path::PathBuf, Vec<String>)>,
    /// Without `worker_program`: the bytes of a dedicated worker program (built from the
    /// `airlock-worker` crate's binary, as the `airlock` CLI embeds it) to run instead of
    /// the current executable. Empty means none. It must come from the same build as this
    /// library: the protocol has no compatibility across versions.
    pub worker_image: Option<&'static [u8]>,
    /// How `network = "none"` workers get their network namespace.
    pub network_namespaces: NetworkNamespaces,
    /// The clock of the pools' grow and shrink decisions (default: the real one).
    pub pool_clock: Option<Arc<dyn PoolClock>>,
}

/// The network namespace strategy for `network = "none"` profiles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NetworkNamespaces {
    /// One empty network namespace, made by the supervisor and shared by those workers,
    /// where that connects nobody: the supervisor may create it (root), the kernel scopes
    /// abstract unix sockets per Landlock domain (ABI 6, Linux 6.12), and the profile
    /// requires Landlock and seccomp (AF_UNIX only). Everything else gets a fresh one.
    /// Creating and destroying a network namespace is most of a cold spawn's kernel work.
    #[default]
    SharedWhenSafe,
    /// A fresh one per worker, always.
    PerWorker,
}

/// Starts sandboxes. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Supervisor {
    spawner: Spawner,
    cgroups: Result<CgroupParent, String>,
    /// Triggered by `close`: every running call is cancelled, new ones refused.
    closing: CancelSignal,
    /// Calls between start and cleanup.
    active: Arc<std::sync::atomic::AtomicUsize>,
    /// Pre-confined idle workers by profile.
    pool: Pool<ReadyWorker>,
    /// Which pool serves a profile.
    pool_keys: PoolKeys,
    /// The pools kept warm, by pool key, each with its replenisher's controls.
    warm: std::sync::Mutex<std::collections::HashMap<String, WarmPool>>,
    /// Empty worker cgroups kept for the next workers.
    cgroup_spares: Arc<CgroupRecycler>,
    /// /dev/null, opened once: a worker's stdio when the caller gives none is copies of it
    /// (a dup instead of a path walk and a device open, three times per worker). `None`
    /// when it could not be opened at start; each worker then tries to open its own.
    null: Option<OwnedFd>,
    /// Each profile's Hello and Setup frames, encoded once.
    setup_frames: SetupFrames,
    /// Profiles' root templates, for their pooled workers.
    templates: Templates,
    templates_built: AtomicU64,
    /// Time as the pools' grow and shrink decisions see it.
    pool_clock: Arc<dyn PoolClock>,
}

/// The Hello and Setup frames a profile's workers get, per network namespace kind,
/// encoded at the first worker and sent as they are to every later one: a deep copy of the
/// spec (its seccomp program, mount plan, Landlock rules) and its encoding per worker were
/// about 1.5 % of a pooled call's CPU in a throughput profile. By identity and bounded, as
/// [`PoolKeys`]: each entry holds its `Arc`, so the address is not reused and the content
/// does not change.
#[derive(Debug, Default)]
struct SetupFrames(std::sync::Mutex<Vec<EncodedSetup>>);

/// A profile, the network namespace kind, and the frames for its workers.
type EncodedSetup = (Arc<CompiledProfile>, WorkerNetwork, Arc<[u8]>);

impl SetupFrames {
    const MAX: usize = 64;

    fn get(
        &self,
        profile: &Arc<CompiledProfile>,
        network: WorkerNetwork,
    ) -> Result<Arc<[u8]>, airlock_protocol::FrameError> {
        let mut known = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((.., frames)) = known
            .iter()
            .find(|(p, kind, _)| Arc::ptr_eq(p, profile) && *kind == network)
        {
            return Ok(Arc::clone(frames));
        }
        let frames = encode_setup(spec_for(profile, network))?;
        if known.len() >= Self::MAX {
            known.clear();
        }
        known.push((Arc::clone(profile), network, Arc::clone(&frames)));
        Ok(frames)
    }
}

/// The Hello and Setup frames for a worker confined by `spec`, as one buffer.
fn encode_setup(
    spec: airlock_protocol::SandboxSpec,
) -> Result<Arc<[u8]>, airlock_protocol::FrameError> {
    let mut frames = airlock_protocol::frame::encode_frame(&SupervisorMessage::Hello {
        version: PROTOCOL_VERSION,
    })?;
    frames.extend(airlock_protocol::frame::encode_frame(
        &SupervisorMessage::Setup(Box::new(spec)),
    )?);
    Ok(frames.into())
}

/// A pool kept warm by [`Supervisor::keep_warm_sized`]: the profile its replenisher
/// confines workers for, how many it keeps idle now, and what stops it.
#[derive(Debug)]
struct WarmPool {
    profile: Arc<CompiledProfile>,
    target: Arc<IdleTarget>,
    stop: CancelSignal,
}

/// A confined worker waiting for its one call.
#[derive(Debug)]
struct ReadyWorker {
    lease: WorkerLease,
    channel: WorkerChannel,
    applied: AppliedIsolation,
    /// The call's `Run` went out with the `Setup` already (cold calls; see `run`).
    run_sent: bool,
}

/// Why no worker could be made ready.
enum PrepareError {
    /// Refused before anything was spawned.
    Rejected(Box<ToolError>),
    /// Spawned but the handshake or confinement failed; the lease still needs cleanup.
    Failed(Conversation, Box<WorkerLease>),
}

/// A spawned worker that will not become ready (abandoned or failed); the lease cleans up.
fn failed(conversation: Conversation, lease: WorkerLease) -> PrepareError {
    PrepareError::Failed(conversation, Box::new(lease))
}

/// Which pool serves a profile: a digest of everything a pooled worker was confined with
/// (the spec it built, the limits of its cgroup), so a worker only ever serves a call whose
/// profile is identical; profiles with identical specs and limits share a pool. Two
/// independently keyed SipHashes (128 bits, random keys per process), not steerable.
fn pool_key(profile: &CompiledProfile) -> String {
    use std::hash::BuildHasher;
    static KEYS: std::sync::OnceLock<[std::collections::hash_map::RandomState; 2]> =
        std::sync::OnceLock::new();
    let keys = KEYS.get_or_init(Default::default);
    let content = (&profile.name, &profile.spec, &profile.limits);
    format!(
        "{:016x}{:016x}",
        keys[0].hash_one(content),
        keys[1].hash_one(content)
    )
}

/// Pool keys of the profiles seen, by identity. Hashing a whole spec, BPF program
/// included, field by field took ~20 µs of every call's critical path; a gateway passes the
/// same `Arc` of its compiled policy for every call of a profile. Each entry holds its
/// `Arc`, so the address cannot be reused by another profile and the content cannot change
/// (no `&mut` reaches a shared `Arc`). Bounded: emptied when full (policies reloaded many
/// times), and the next call of each profile hashes again.
#[derive(Debug, Default)]
struct PoolKeys(std::sync::Mutex<Vec<(Arc<CompiledProfile>, String)>>);

impl PoolKeys {
    const MAX: usize = 64;

    fn of(&self, profile: &Arc<CompiledProfile>) -> String {
        let mut known = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, key)) = known.iter().find(|(p, _)| Arc::ptr_eq(p, profile)) {
            return key.clone();
        }
        let key = pool_key(profile);
        if known.len() >= Self::MAX {
            known.clear();
        }
        known.push((Arc::clone(profile), key.clone()));
        key
    }
}

/// Wakes a pool's replenisher when dropped: at the end of the call that took a worker.
struct ReplenishOnDrop<'a> {
    pool: &'a Pool<ReadyWorker>,
    key: &'a str,
}

impl Drop for ReplenishOnDrop<'_> {
    fn drop(&mut self) {
        self.pool.replenish(self.key);
    }
}

/// Counts a call as active until dropped (however the call ends).
struct ActiveCall(Arc<std::sync::atomic::AtomicUsize>);

impl ActiveCall {
    fn enter(counter: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(counter))
    }
}

impl Drop for ActiveCall {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
        crate::spawn::SETTLED.notify_waiters();
    }
}

/// One run to perform.
#[derive(Debug)]
pub struct SandboxRun {
    /// Call id for the result.
    pub call_id: String,
    /// Tool name for the result (`exec` for commands).
    pub tool: String,
    /// The compiled profile.
    pub profile: Arc<CompiledProfile>,
    /// argv (absolute, or resolved in the sandbox PATH).
    pub argv: Vec<String>,
    /// stdin bytes (captured mode).
    pub stdin: Vec<u8>,
    /// Validated arguments as JSON text.
    pub arguments_json: String,
    /// Deadline of the run.
    pub timeout: Duration,
    /// `Some` passes these descriptors through as the tool's stdin, stdout, stderr.
    pub inherit_stdio: Option<[OwnedFd; 3]>,
    /// A built-in tool to run instead of `argv` (its input is `arguments_json`).
    pub builtin: Option<String>,
}

/// What the worker conversation produced.
enum Conversation {
    Finished {
        applied: AppliedIsolation,
        report: WorkerMessage,
    },
    SetupFailed {
        failure: SetupFailure,
    },
    Broken(ChannelError),
    TimedOut {
        applied: Option<AppliedIsolation>,
    },
    Cancelled {
        applied: Option<AppliedIsolation>,
    },
}

/// Owns a worker's pidfd and cgroup until they are cleaned up. If the call is dropped
/// midway (cancellation by drop), `Drop` kills the tree at once and a short-lived thread
/// reaps the worker and removes its cgroup, so nothing is left behind either way.
#[derive(Debug)]
struct WorkerLease {
    pidfd: Option<OwnedFd>,
    /// The spawn of the worker while the spawner has not answered; a lease given up then
    /// leaves its clean-up to [`PendingSpawn::abandon`], which waits for that worker.
    spawning: Option<PendingSpawn>,
    cgroup: Option<WorkerCgroup>,
    /// Where the cgroup goes once the worker is reaped (it decides whether to keep it).
    recycler: Arc<CgroupRecycler>,
    /// The template the worker was cloned from: its spawner thread must outlive the
    /// worker, whose parent-death signal follows that thread.
    _template: Option<Arc<RootTemplate>>,
}

impl WorkerLease {
    /// SIGKILL to the worker alone, by pidfd: as PID 1 of its pid namespace, its death ends
    /// every process in the namespace, and so in its cgroup. Leaves out `cgroup.kill`,
    /// after which Linux 6.12 (Debian's backport, at least) SIGKILLs every process later
    /// cloned into that cgroup with CLONE_INTO_CGROUP: the cgroup could not serve another
    /// worker (seen in the VM matrix: each reused cgroup's worker died at birth).
    fn kill_worker_only(&self) {
        if let Some(pidfd) = &self.pidfd {
            let _ = sys::signal_pidfd(pidfd, libc::SIGKILL);
        }
    }

    /// Kills the worker and, on v2, everything in its cgroup (which is then not reused).
    fn kill(&self) {
        if let Some(cgroup) = &self.cgroup {
            let _ = cgroup.kill_all();
        }
        if let Some(pidfd) = &self.pidfd {
            let _ = sys::signal_pidfd(pidfd, libc::SIGKILL);
        }
    }

    /// Recycles or removes the (empty) cgroup; the worker must have been killed. Should it
    /// still not be reaped (it did not end within the wait of [`wait_for_exit`]), both are
    /// handed to a background clean-up rather than leaving a zombie.
    fn release(&mut self) {
        if let Some(spawning) = self.spawning.take() {
            let (cgroup, recycler) = (self.cgroup.take(), Arc::clone(&self.recycler));
            spawning.abandon(move || recycle_or_remove(&recycler, cgroup));
            return;
        }
        if let Some(pidfd) = self.pidfd.take()
            && matches!(sys::try_reap_pidfd(&pidfd), Ok(None))
        {
            tracing::warn!("worker still not reaped after SIGKILL; reaping in the background");
            let cgroup = self.cgroup.take();
            crate::spawn::clean_up_in_background(Some(pidfd), move || remove_cgroup(cgroup));
            return;
        }
        recycle_or_remove(&self.recycler, self.cgroup.take());
    }

    /// Waits for the spawner's answer, which the lease holds meanwhile: a caller that
    /// gives up (or drops this future) leaves the spawn to the lease's clean-up.
    async fn spawned(&mut self) -> Result<Spawned, SpawnError> {
        let Some(spawning) = self.spawning.as_mut() else {
            return Err(SpawnError::SpawnerGone);
        };
        let spawned = spawning.await;
        self.spawning = None;
        spawned
    }
}

fn recycle_or_remove(recycler: &CgroupRecycler, cgroup: Option<WorkerCgroup>) {
    if let Some(Err(e)) = cgroup.map(|cgroup| recycler.recycle_or_remove(cgroup)) {
        tracing::warn!(error = %error_chain(&e), "cgroup left behind");
    }
}

fn remove_cgroup(cgroup: Option<WorkerCgroup>) {
    if let Some(Err(e)) = cgroup.map(WorkerCgroup::remove) {
        tracing::warn!(error = %error_chain(&e), "cgroup left behind");
    }
}

impl Drop for WorkerLease {
    fn drop(&mut self) {
        if self.pidfd.is_none() && self.cgroup.is_none() && self.spawning.is_none() {
            return;
        }
        self.kill();
        let cgroup = self.cgroup.take();
        match self.spawning.take() {
            Some(spawning) => spawning.abandon(move || remove_cgroup(cgroup)),
            None => crate::spawn::clean_up_in_background(self.pidfd.take(), move || {
                remove_cgroup(cgroup)
            }),
        }
    }
}

/// A new descriptor of each of `fds`.
fn copies(fds: [&OwnedFd; 3]) -> std::io::Result<[OwnedFd; 3]> {
    let [a, b, c] = fds;
    Ok([a.try_clone()?, b.try_clone()?, c.try_clone()?])
}

fn open_null() -> std::io::Result<OwnedFd> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map(OwnedFd::from)
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Supervisor {
    /// Seals the worker image, starts the spawner, detects cgroups.
    ///
    /// The process is deliberately not made a child subreaper: every worker is PID 1 of its
    /// own pid namespace, so nothing a tool starts can be orphaned out of it, and a
    /// subreaper would adopt every orphan of the embedding process (a gateway's own
    /// double-forked helpers; bwrap's, in `airlock bench`) and, never reaping them, keep
    /// them as zombies: thousands during a bench run, each one more task for every
    /// `pivot_root` on the machine to visit.
    pub fn start(options: SupervisorOptions) -> Result<Self, SupervisorError> {
        let (image, extra_args) = match &options.worker_program {
            Some((path, args)) => (WorkerImage::seal_from(path)?, args.clone()),
            None => match options.worker_image {
                Some(bytes) if !bytes.is_empty() => (WorkerImage::seal_bytes(bytes)?, Vec::new()),
                _ => (WorkerImage::seal_current_executable()?, Vec::new()),
            },
        };
        let mapping = IdMapping::for_this_process(options.sandbox_host_id);
        // Scoping is the kernel's (worker-side Landlock), so it is checked on the host; the
        // worker checks it again for itself and refuses a shared namespace without it.
        let share_network = options.network_namespaces == NetworkNamespaces::SharedWhenSafe
            && sys::landlock_abi_version().is_ok_and(|abi| abi >= 6);
        let spawner = Spawner::start(image, mapping, extra_args, share_network)?;
        let cgroups = match options.cgroup_parent {
            Some(parent) => Ok(parent),
            None => CgroupParent::detect().map_err(|e| e.to_string()),
        };
        if let Ok(parent) = &cgroups {
            parent.remove_stale_worker_cgroups();
        }
        Ok(Self {
            spawner,
            cgroups,
            closing: CancelSignal::new(),
            active: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            pool: Pool::default(),
            pool_keys: PoolKeys::default(),
            warm: std::sync::Mutex::default(),
            cgroup_spares: Arc::default(),
            null: open_null().ok(),
            setup_frames: SetupFrames::default(),
            templates: Templates::default(),
            templates_built: AtomicU64::new(0),
            pool_clock: options
                .pool_clock
                .unwrap_or_else(|| Arc::new(SystemPoolClock)),
        })
    }

    /// Cancels every running call, refuses new ones, and returns once every worker is
    /// reaped and its cgroup removed.
    pub async fn close(&self) {
        {
            // Under the lock `put_if_warm` holds: no replenisher adds a worker after the
            // drain below.
            let _warm = self
                .warm
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.closing.cancel();
        }
        for mut worker in self.pool.drain() {
            let _ = finish_worker(&mut worker.lease).await;
        }
        // Calls still cleaning up, and workers dropped midway whose reaping runs in the
        // background (process-wide, so another supervisor's can delay this one's close).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            // Registered before the check, so a finish in between still wakes it.
            let settled = crate::spawn::SETTLED.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if self.active.load(Ordering::SeqCst) == 0 && crate::spawn::background_cleanups() == 0 {
                break;
            }
            tokio::select! {
                () = &mut settled => {}
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        // After the wait: every released cgroup has come back by now.
        self.cgroup_spares.clear();
        // No worker of theirs is left: their spawner threads end here.
        self.templates.clear();
    }

    /// The cgroup parent, or why there is none.
    pub fn cgroups(&self) -> Result<&CgroupParent, &str> {
        self.cgroups.as_ref().map_err(String::as_str)
    }

    /// Runs `run` in a fresh sandbox and returns its result. `cancel` ends it early. A
    /// pre-confined idle worker of the same profile is used when the pool has one.
    pub async fn run(&self, run: SandboxRun, cancel: Option<&CancelSignal>) -> ToolResult {
        let _active = ActiveCall::enter(&self.active);
        if self.closing.is_cancelled() {
            return ToolResult::rejected(
                &run.call_id,
                &run.tool,
                ToolError::new(ErrorKind::Cancelled, "the supervisor is closing"),
            );
        }
        let started = Instant::now();
        let profile = Arc::clone(&run.profile);
        let mut result = ToolResult::rejected(
            &run.call_id,
            &run.tool,
            ToolError::new(ErrorKind::SandboxUnavailable, ""),
        );
        result.attempts = 1;
        let limits = AppliedLimits {
            memory_bytes: profile.limits.memory_bytes,
            pids: profile.limits.pids,
            timeout_ms: duration_ms(run.timeout),
            output_bytes: profile.limits.output_bytes,
        };
        let deadline = tokio::time::Instant::from_std(started + run.timeout);

        // Pooled workers have /dev/null stdio, so only captured runs can use them.
        let key = self.pool_keys.of(&profile);
        let pooled = if run.inherit_stdio.is_none() {
            self.pool.take(&key)
        } else {
            None
        };
        // Replenish once this call has answered (however it ends).
        let _replenish = pooled.is_some().then(|| ReplenishOnDrop {
            pool: &self.pool,
            key: &key,
        });
        let worker = match pooled {
            Some(worker) => Ok(worker),
            None => {
                if run.inherit_stdio.is_none() {
                    self.pool.note_miss();
                    self.grow_pool(&key);
                }
                // A cold call sends its Run right behind the Setup: the worker finds it
                // waiting when it is ready, one wake-up round trip sooner. Not under a CPU
                // quota, which is written between Ready and Run (see `enforce_cpu_quota`).
                let run_now = profile
                    .limits
                    .cpu_quota_percent
                    .is_none()
                    .then(|| run_request(&run));
                self.prepare_worker(
                    &profile,
                    run.inherit_stdio.as_ref(),
                    deadline,
                    cancel,
                    run_now,
                    None,
                )
                .await
            }
        };
        tracing::debug!(
            elapsed_us = started.elapsed().as_micros() as u64,
            "worker ready"
        );
        let (conversation, lease, channel) = match worker {
            Ok(worker) => {
                result.isolation = Some(Isolation {
                    limits,
                    cgroup: worker
                        .lease
                        .cgroup
                        .as_ref()
                        .map(|c| c.version().to_string()),
                    ..Isolation::default()
                });
                let (conversation, lease, channel) =
                    self.run_on_worker(worker, &run, deadline, cancel).await;
                (conversation, lease, Some(channel))
            }
            Err(PrepareError::Rejected(error)) => {
                result.error = Some(*error);
                result.duration_ms = duration_ms(started.elapsed());
                return result;
            }
            Err(PrepareError::Failed(conversation, lease)) => {
                result.isolation = Some(Isolation {
                    limits,
                    cgroup: lease.cgroup.as_ref().map(|c| c.version().to_string()),
                    ..Isolation::default()
                });
                (conversation, *lease, None)
            }
        };
        tracing::debug!(
            elapsed_us = started.elapsed().as_micros() as u64,
            "conversation over"
        );

        // Single-use worker: whatever happened, it and everything it started die now.
        let stats = if matches!(conversation, Conversation::Finished { .. }) {
            // The tool has exited and reported, and the worker killed whatever the tool
            // left: the counters are final. Answer now; kill, reap and remove the cgroup
            // off the critical path (still counted as active, so `close` waits for it).
            let stats = lease.cgroup.as_ref().and_then(|c| c.read_stats().ok());
            let cleanup = ActiveCall::enter(&self.active);
            tokio::spawn(async move {
                // The orderly end of the conversation, off the critical path; the worker
                // is killed right after in any case.
                if let Some(mut channel) = channel {
                    let _ = channel.send(&SupervisorMessage::Shutdown).await;
                }
                // A finished worker is PID 1 of its pid namespace and every process in its
                // cgroup is in that namespace: killing it ends them all, and the cgroup,
                // never written a `cgroup.kill`, stays fit for reuse (see `kill_worker_only`).
                lease.kill_worker_only();
                if let Some(pidfd) = &lease.pidfd {
                    wait_for_exit(pidfd).await;
                }
                release_later(lease, cleanup);
            });
            stats
        } else {
            // Timeouts, cancellations and failures answer only once everything is reaped:
            // the worker is PID 1 of its namespace, so once it is reaped every process of
            // the tool is gone. Removing the then-empty cgroup happens after the answer.
            let stats = reap_worker(&lease).await;
            release_later(lease, ActiveCall::enter(&self.active));
            stats
        };
        tracing::debug!(
            elapsed_us = started.elapsed().as_micros() as u64,
            "result ready"
        );
        result.duration_ms = duration_ms(started.elapsed());
        finish_result(&mut result, conversation, stats.as_ref(), &profile, &run);
        result
    }

    /// Keeps `idle` pre-confined workers of `profile` ready (at most [`PoolSize::LIMIT`]),
    /// replenishing off the critical path until the supervisor closes or
    /// [`Supervisor::stop_warm`]. Every call still gets a fresh, single-use worker.
    pub fn keep_warm(self: &Arc<Self>, profile: Arc<CompiledProfile>, idle: usize) {
        self.keep_warm_sized(profile, PoolSize::fixed(idle));
    }

    /// As [`Supervisor::keep_warm`], with a pool that grows under bursts of calls and
    /// shrinks back when they stop (see [`PoolSize`]). For a profile whose pool is already
    /// kept warm (the same content: see `pool_key`) this only sets its size.
    pub fn keep_warm_sized(self: &Arc<Self>, profile: Arc<CompiledProfile>, size: PoolSize) {
        let key = self.pool_keys.of(&profile);
        let (target, stop) = {
            let mut warm = self
                .warm
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(pool) = warm.get(&key) {
                pool.target.resize(size);
                self.pool.replenish(&key);
                return;
            }
            let pool = WarmPool {
                profile: Arc::clone(&profile),
                target: Arc::new(IdleTarget::new(size, self.pool_clock.now())),
                stop: CancelSignal::new(),
            };
            let controls = (Arc::clone(&pool.target), pool.stop.clone());
            warm.insert(key.clone(), pool);
            controls
        };
        let weak = Arc::downgrade(self);
        let notify = self.pool.notify_for(&key);
        let clock = Arc::clone(&self.pool_clock);
        tokio::spawn(async move {
            loop {
                let Some(supervisor) = weak.upgrade() else {
                    return;
                };
                if target.shrink_if_due(clock.now()) {
                    // Quiet for a while after a burst: back towards the minimum.
                    while supervisor.pool.idle_count(&key) > target.get() {
                        let Some(mut spare) = supervisor.pool.evict(&key) else {
                            break;
                        };
                        let _ = finish_worker(&mut spare.lease).await;
                    }
                }
                let ended = || supervisor.closing.is_cancelled() || stop.is_cancelled();
                while !ended() && supervisor.pool.idle_count(&key) < target.get() {
                    // Confine the missing workers concurrently: clone is serialised in the
                    // spawner, but each worker's set-up runs in parallel in its own process.
                    let missing = target
                        .get()
                        .saturating_sub(supervisor.pool.idle_count(&key));
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                    let template = supervisor.root_template(&profile).await;
                    let mut batch = tokio::task::JoinSet::new();
                    for _ in 0..missing {
                        let supervisor = Arc::clone(&supervisor);
                        let profile = Arc::clone(&profile);
                        let template = template.clone();
                        batch.spawn(async move {
                            let outcome = supervisor
                                .prepare_worker(
                                    &profile,
                                    None,
                                    deadline,
                                    None,
                                    None,
                                    template.as_ref(),
                                )
                                .await;
                            (supervisor, outcome)
                        });
                    }
                    let mut failed = false;
                    while let Some(joined) = batch.join_next().await {
                        let Ok((supervisor, outcome)) = joined else {
                            continue;
                        };
                        match outcome {
                            Ok(worker) => {
                                if let Some(mut unwanted) =
                                    supervisor.put_if_warm(&key, &stop, worker)
                                {
                                    let _ = finish_worker(&mut unwanted.lease).await;
                                }
                            }
                            Err(PrepareError::Failed(_, mut lease)) => {
                                let _ = finish_worker(&mut lease).await;
                                failed = true;
                            }
                            Err(PrepareError::Rejected(e)) => {
                                tracing::warn!(profile = %profile.name, error = %e.message, "could not pre-confine a pooled worker");
                                failed = true;
                            }
                        }
                    }
                    if failed {
                        if template.is_some() {
                            // Whatever failed, the next workers build their own roots for
                            // a while rather than retry a template that may be the cause.
                            supervisor
                                .templates
                                .set_aside(&profile, supervisor.worker_network(&profile));
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                if supervisor.closing.is_cancelled() {
                    return;
                }
                if stop.is_cancelled() {
                    // `stop_warm` forgot the template too; this drops one a batch running
                    // meanwhile may have built.
                    supervisor.templates.forget(&profile);
                    return;
                }
                drop(supervisor);
                let shrink_due = target.shrink_due();
                let shrink = async {
                    match shrink_due {
                        Some(due) => Arc::clone(&clock).sleep_until(due).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = notify.notified() => {}
                    () = stop.cancelled() => {}
                    () = shrink => {}
                }
            }
        });
    }

    /// A call found `key`'s pool empty: if it is kept warm, it aims higher (up to its
    /// maximum) and its replenisher starts on the difference now.
    fn grow_pool(&self, key: &str) {
        let warm = self
            .warm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(pool) = warm.get(key)
            && pool.target.missed(self.pool_clock.now())
        {
            self.pool.replenish(key);
        }
    }

    /// Adds `worker` to the pool of `key` if that pool is still kept warm by the
    /// replenisher `stop` belongs to; else hands it back. One lock with `stop_warm`, so no
    /// worker lands in a pool after it was emptied for good.
    fn put_if_warm(
        &self,
        key: &str,
        stop: &CancelSignal,
        worker: ReadyWorker,
    ) -> Option<ReadyWorker> {
        let warm = self
            .warm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if stop.is_cancelled() || self.closing.is_cancelled() || !warm.contains_key(key) {
            return Some(worker);
        }
        self.pool.put(key, worker);
        None
    }

    /// Stops keeping `profile`'s workers warm: its replenisher ends, its idle workers are
    /// killed and reaped before this returns, and its root template is dropped (its spawner
    /// thread ends with the last worker using it). Calls of the profile spawn cold from
    /// then on; a worker already taken by a call finishes that call.
    pub async fn stop_warm(&self, profile: &Arc<CompiledProfile>) {
        let key = self.pool_keys.of(profile);
        self.stop_warm_key(&key).await;
    }

    async fn stop_warm_key(&self, key: &str) {
        let (idle, pool) = {
            let mut warm = self
                .warm
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some(pool) = warm.remove(key) else {
                return;
            };
            pool.stop.cancel();
            (self.pool.remove(key), pool)
        };
        self.templates.forget(&pool.profile);
        for mut worker in idle {
            let _ = finish_worker(&mut worker.lease).await;
        }
    }

    /// Keeps exactly `profiles` warm, each pool of `size`: the pools of every other profile
    /// are stopped as by [`Supervisor::stop_warm`], the missing ones started. What a daemon
    /// does when it reloads its policy: a profile whose content did not change keeps its
    /// pool and its template; a changed or removed one no longer has idle workers waiting
    /// for calls that cannot come (a changed profile's calls never take them: pools are by
    /// content).
    pub async fn warm_exactly(self: &Arc<Self>, profiles: &[Arc<CompiledProfile>], size: PoolSize) {
        let wanted: Vec<String> = profiles.iter().map(|p| self.pool_keys.of(p)).collect();
        let stale: Vec<String> = {
            let warm = self
                .warm
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            warm.keys()
                .filter(|key| !wanted.contains(key))
                .cloned()
                .collect()
        };
        for key in stale {
            self.stop_warm_key(&key).await;
        }
        for profile in profiles {
            self.keep_warm_sized(Arc::clone(profile), size);
        }
    }

    /// How many profiles' pools are kept warm now.
    pub fn warm_pools(&self) -> usize {
        self.warm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Pool counters.
    pub fn pool_stats(&self) -> PoolStats {
        PoolStats {
            cgroups_reused: self.cgroup_spares.reused(),
            cgroups_kept: self.cgroup_spares.len(),
            templates_built: self.templates_built.load(Ordering::Relaxed),
            templates_ready: self.templates.ready(),
            idle_target: self
                .warm
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .values()
                .map(|pool| pool.target.get())
                .sum(),
            ..self.pool.stats()
        }
    }

    /// Calls in progress plus finished calls whose worker is still being reaped and removed
    /// (what [`Supervisor::close`] waits for). Zero means no sandbox work is going on.
    pub fn calls_in_flight(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// The network namespace a worker of `profile` gets (see [`NetworkNamespaces`]).
    fn worker_network(&self, profile: &CompiledProfile) -> WorkerNetwork {
        use airlock_protocol::{NetworkMode, Requirement};
        let spec = &profile.spec;
        match spec.network {
            NetworkMode::Host => WorkerNetwork::Host,
            // Compiled from `network = "none"`, so the filter allows AF_UNIX sockets only.
            NetworkMode::None
                if self.spawner.shares_network_namespace()
                    && spec.landlock.requirement == Requirement::Required
                    && spec.seccomp.requirement == Requirement::Required =>
            {
                WorkerNetwork::Shared
            }
            NetworkMode::None | NetworkMode::Loopback | NetworkMode::NoneShared => {
                WorkerNetwork::Fresh
            }
        }
    }

    /// The root template for `profile`'s pooled workers: the current one, or one built
    /// now; `None` where the profile's workers build their own roots (see
    /// [`crate::template`]).
    async fn root_template(&self, profile: &Arc<CompiledProfile>) -> Option<Arc<RootTemplate>> {
        let network = self.worker_network(profile);
        match self.templates.find(profile, network) {
            Lookup::Ready(template) => return Some(template),
            Lookup::Unavailable => return None,
            Lookup::Missing => {}
        }
        let built = self.build_template(profile, network).await;
        let template = match built {
            Ok(template) => {
                self.templates_built.fetch_add(1, Ordering::Relaxed);
                Some(Arc::new(template))
            }
            Err(why) => {
                let why = error_chain(&why);
                tracing::debug!(profile = %profile.name, %why, "no root template: each worker builds its root");
                None
            }
        };
        self.templates.record(profile, network, template.clone());
        template
    }

    /// Spawns a holder that builds the shared part of `profile`'s root, starts a spawner
    /// thread in its mount namespace, and kills it.
    async fn build_template(
        &self,
        profile: &Arc<CompiledProfile>,
        network: WorkerNetwork,
    ) -> Result<RootTemplate, TemplateError> {
        if sys::effective_ids().0 != 0 {
            // Entering the holder's mount namespace needs CAP_SYS_ADMIN here: no holder
            // worker is spent to learn that.
            return Err(TemplateError::Unprivileged);
        }
        let split = split_plan(&profile.spec.mounts).ok_or(TemplateError::PlanNotSplittable)?;
        // Before the holder looks at them: a change from here on shows as stale.
        let sources = source_identities(&profile.spec.mounts);
        let mut holder_profile = CompiledProfile::clone(profile);
        holder_profile.spec.mounts = split.template;
        let holder_profile = Arc::new(holder_profile);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let holder = self
            .prepare_worker(&holder_profile, None, deadline, None, None, None)
            .await;
        // The whole worker is kept until the thread has entered its namespace: with its
        // channel closed, it would exit (and take the namespace with it) at once.
        let holder = match holder {
            Ok(worker) => worker,
            Err(PrepareError::Failed(conversation, mut lease)) => {
                let _ = finish_worker(&mut lease).await;
                let why = match conversation {
                    Conversation::SetupFailed { failure } => {
                        format!("{} failed: {}", failure.step, failure.message)
                    }
                    Conversation::Broken(e) => error_chain(&e),
                    Conversation::TimedOut { .. } => "timed out".into(),
                    Conversation::Cancelled { .. } => "cancelled".into(),
                    Conversation::Finished { .. } => "ran a call".into(),
                };
                return Err(TemplateError::Holder(why));
            }
            Err(PrepareError::Rejected(e)) => return Err(TemplateError::Holder(e.message)),
        };
        let spawner = match &holder.lease.pidfd {
            Some(pidfd) => self
                .spawner
                .start_template(pidfd, network)
                .map_err(TemplateError::from),
            None => Err(TemplateError::Holder("it has no pidfd".into())),
        };
        // The thread holds the namespace now; the holder has done its part.
        let ReadyWorker { mut lease, .. } = holder;
        let _ = finish_worker(&mut lease).await;
        let spawner = spawner?;
        let mut spec = spec_for(profile, network);
        spec.root = airlock_protocol::RootSource::Template;
        spec.mounts = split.per_worker;
        let frames = encode_setup(spec)?;
        Ok(RootTemplate::new(spawner, frames, sources))
    }

    /// cgroup, spawn, handshake and confinement: a worker waiting for its one call; cloned
    /// from `template` when there is one.
    async fn prepare_worker(
        &self,
        profile: &Arc<CompiledProfile>,
        inherit_stdio: Option<&[OwnedFd; 3]>,
        deadline: tokio::time::Instant,
        cancel: Option<&CancelSignal>,
        run_now: Option<RunRequest>,
        template: Option<&Arc<RootTemplate>>,
    ) -> Result<ReadyWorker, PrepareError> {
        let unavailable = |step: &str, message: String| {
            Box::new(ToolError {
                step: Some(step.to_string()),
                ..ToolError::new(ErrorKind::SandboxUnavailable, message)
            })
        };
        let network = self.worker_network(profile);
        let mut lease = WorkerLease {
            pidfd: None,
            spawning: None,
            cgroup: None,
            recycler: Arc::clone(&self.cgroup_spares),
            _template: template.cloned(),
        };
        // A call given up already (a deadline of 0, a cancellation before the start) makes
        // nothing: no cgroup, no worker for the spawner to clone and kill again.
        if let Some(gave_up) = self.given_up_already(deadline, cancel) {
            return Err(failed(gave_up, lease));
        }
        // cgroup first: the worker joins it before it does anything.
        lease.cgroup = self
            .create_cgroup(profile)
            .map_err(PrepareError::Rejected)?;
        let stdio = match (inherit_stdio, &self.null) {
            (Some([a, b, c]), _) => copies([a, b, c]),
            (None, Some(null)) => copies([null; 3]),
            (None, None) => open_null().and_then(|a| Ok([a, open_null()?, open_null()?])),
        };
        let stdio = match stdio {
            Ok(fds) => fds,
            Err(_) => {
                return Err(PrepareError::Rejected(unavailable(
                    "stdio",
                    "cannot prepare the worker's stdio".into(),
                )));
            }
        };
        let (join_cgroups, cgroup_dir) = match &lease.cgroup {
            Some(cg) => {
                let dir = cg
                    .open_dir_v2()
                    .map_err(|e| PrepareError::Rejected(unavailable("cgroup", error_chain(&e))))?;
                let procs = if dir.is_some() {
                    Vec::new()
                } else {
                    cg.open_join_files().map_err(|e| {
                        PrepareError::Rejected(unavailable("cgroup", error_chain(&e)))
                    })?
                };
                (procs, dir)
            }
            None => (Vec::new(), None),
        };
        let request = SpawnRequest {
            stdio,
            join_cgroups,
            cgroup_dir,
            network,
        };
        // The deadline, a cancellation and close bound the spawn and the exec too: on a
        // loaded machine either can stall, and the call must still end on time. A spawn
        // abandoned here is killed and reaped once the spawner answers, and only then is
        // its cgroup removed (see `PendingSpawn`); an abandoned exec through the lease.
        let spawn_failed = |e: SpawnError| {
            let mut error = unavailable("spawn", error_chain(&e));
            error.transient = e.is_transient();
            PrepareError::Rejected(error)
        };
        // A template's workers come from its thread and get its frames, never the others:
        // a worker told its root is a template's must be in a copy of that namespace.
        let submitted = match template {
            Some(template) => template.spawner.submit(request),
            None => self.spawner.submit(request),
        };
        lease.spawning = Some(submitted.map_err(spawn_failed)?);
        // Pinned in place: moved by value, these large futures overflowed a debug build's
        // 2 MiB runtime thread stack.
        let spawned = {
            let spawn = lease.spawned();
            tokio::pin!(spawn);
            self.unless_given_up(spawn, deadline, cancel).await
        };
        let spawned = match spawned {
            Ok(spawned) => spawned.map_err(spawn_failed)?,
            Err(gave_up) => return Err(failed(gave_up, lease)),
        };
        // From here the lease owns the worker: dropping this future kills and reaps it.
        lease.pidfd = spawned.child.into_pidfd();
        let spawn_started = Instant::now();
        let exec = crate::spawn::await_exec(spawned.exec_report);
        tokio::pin!(exec);
        match self.unless_given_up(exec, deadline, cancel).await {
            // The lease kills and reaps the exiting child and removes its cgroup.
            Ok(exec) => exec.map_err(spawn_failed)?,
            Err(gave_up) => return Err(failed(gave_up, lease)),
        }
        tracing::debug!(
            until_exec_us = spawn_started.elapsed().as_micros() as u64,
            "worker exec'd"
        );
        let std_stream = std::os::unix::net::UnixStream::from(spawned.socket);
        let stream = std_stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixStream::from_std(std_stream));
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                return Err(failed(Conversation::Broken(ChannelError::Io(e)), lease));
            }
        };
        // Worker reports carry at most two bounded outputs plus small fields.
        let max_frame = usize::try_from(profile.limits.output_bytes)
            .unwrap_or(usize::MAX)
            .saturating_mul(2)
            .saturating_add(64 << 10);
        let mut channel = WorkerChannel::new(stream, max_frame);
        let run_sent = run_now.is_some();
        let handshake = {
            let frames = match template {
                Some(template) => Ok(Arc::clone(&template.frames)),
                None => self.setup_frames.get(profile, network),
            };
            let frames = frames.map_err(|e| {
                Conversation::Broken(ChannelError::Violation(format!(
                    "cannot encode the worker's setup: {e}"
                )))
            });
            let channel = &mut channel;
            let talk = async move { confine_over(channel, &frames?, run_now).await };
            tokio::pin!(talk);
            self.unless_given_up(talk, deadline, cancel)
                .await
                .and_then(|outcome| outcome)
        };
        // Confined and idle: now the CPU quota may bind (see `enforce_cpu_quota`).
        if handshake.is_ok()
            && let Some(Err(e)) = lease.cgroup.as_ref().map(WorkerCgroup::enforce_cpu_quota)
        {
            // The lease's drop kills and reaps the worker and removes its cgroup.
            return Err(PrepareError::Rejected(unavailable(
                "cgroup",
                error_chain(&e),
            )));
        }
        match handshake {
            Ok(applied) => Ok(ReadyWorker {
                lease,
                channel,
                applied,
                run_sent,
            }),
            Err(conversation) => Err(failed(conversation, lease)),
        }
    }

    /// How a call whose deadline has passed, or that was cancelled, ends before it starts.
    fn given_up_already(
        &self,
        deadline: tokio::time::Instant,
        cancel: Option<&CancelSignal>,
    ) -> Option<Conversation> {
        if tokio::time::Instant::now() >= deadline {
            Some(Conversation::TimedOut { applied: None })
        } else if cancel.is_some_and(CancelSignal::is_cancelled) || self.closing.is_cancelled() {
            Some(Conversation::Cancelled { applied: None })
        } else {
            None
        }
    }

    /// Runs `work` unless the deadline passes, the caller cancels or the supervisor closes
    /// first (then `TimedOut` or `Cancelled`, before any isolation was applied).
    async fn unless_given_up<T>(
        &self,
        work: impl std::future::Future<Output = T>,
        deadline: tokio::time::Instant,
        cancel: Option<&CancelSignal>,
    ) -> Result<T, Conversation> {
        tokio::select! {
            outcome = work => Ok(outcome),
            () = sleep_until_precise(deadline) => Err(Conversation::TimedOut { applied: None }),
            () = wait_cancel(cancel) => Err(Conversation::Cancelled { applied: None }),
            () = self.closing.cancelled() => Err(Conversation::Cancelled { applied: None }),
        }
    }

    /// Sends the one call to a ready worker and waits for its report, the deadline or a
    /// cancellation.
    async fn run_on_worker(
        &self,
        worker: ReadyWorker,
        run: &SandboxRun,
        deadline: tokio::time::Instant,
        cancel: Option<&CancelSignal>,
    ) -> (Conversation, WorkerLease, WorkerChannel) {
        let ReadyWorker {
            lease,
            mut channel,
            applied,
            run_sent,
        } = worker;
        let request = (!run_sent).then(|| run_request(run));
        let conversation = {
            let talk = run_over(&mut channel, request);
            tokio::pin!(talk);
            tokio::select! {
                outcome = &mut talk => match outcome {
                    Ok(report) => Conversation::Finished { applied: applied.clone(), report },
                    Err(broken) => broken,
                },
                () = sleep_until_precise(deadline) => Conversation::TimedOut { applied: Some(applied.clone()) },
                () = wait_cancel(cancel) => Conversation::Cancelled { applied: Some(applied.clone()) },
                () = self.closing.cancelled() => Conversation::Cancelled { applied: Some(applied.clone()) },
            }
        };
        (conversation, lease, channel)
    }

    fn create_cgroup(
        &self,
        profile: &CompiledProfile,
    ) -> Result<Option<WorkerCgroup>, Box<ToolError>> {
        let required = profile.require.cgroup == airlock_protocol::Requirement::Required;
        let parent = match &self.cgroups {
            Ok(parent) => parent,
            Err(why) if required => {
                return Err(Box::new(ToolError {
                    step: Some("cgroup".into()),
                    ..ToolError::new(
                        ErrorKind::SandboxUnavailable,
                        format!(
                            "cgroup limits are required but unavailable: {why}; run `airlock doctor`, or set require.cgroup = \"best_effort\""
                        ),
                    )
                }));
            }
            Err(_) => return Ok(None),
        };
        // Process-wide, so several supervisors in one process never pick the same name.
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = crate::cgroup::worker_cgroup_name(n);
        let limits = CgroupLimits {
            memory_bytes: profile.limits.memory_bytes,
            pids: profile.limits.pids,
            // A percentage of one core over a 100 ms period (cgroup cpu.max / CFS quota).
            cpu_quota: profile
                .limits
                .cpu_quota_percent
                .map(|p| (u64::from(p) * 1000, 100_000)),
        };
        if let Some(cgroup) = self.cgroup_spares.take(&limits) {
            return Ok(Some(cgroup));
        }
        match parent.create_worker_cgroup(&name, &limits) {
            Ok(cgroup) => Ok(Some(cgroup)),
            Err(e) if required => Err(Box::new(ToolError {
                step: Some("cgroup".into()),
                ..ToolError::new(
                    ErrorKind::SandboxUnavailable,
                    format!("cannot create the worker's cgroup: {}", error_chain(&e)),
                )
            })),
            Err(_) => Ok(None),
        }
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// The first half of the protocol: hello, setup, ready. Returns what the worker applied.
async fn confine_over(
    channel: &mut WorkerChannel,
    setup_frames: &[u8],
    run_now: Option<RunRequest>,
) -> Result<AppliedIsolation, Conversation> {
    let violation = |what: String| Conversation::Broken(ChannelError::Violation(what));
    // Our Hello and the Setup (`SetupFrames`) go out at once, without waiting for the
    // worker's Hello: the worker reads them in order after sending its own, and a worker
    // speaking another version is refused below all the same. One wake-up round trip less
    // per spawn.
    channel
        .send_encoded(setup_frames)
        .await
        .map_err(Conversation::Broken)?;
    // The worker reads a Run only after it has confined itself and said Ready; a worker
    // that fails its set-up exits without reading it — and may have exited already, so
    // that this write fails (EPIPE) while its SetupFailed waits unread in our socket. That
    // report decides the outcome; the failed write matters only if the worker said Ready.
    // (Seen as `protocol_violation: Broken pipe` for a refused planted symlink once the
    // worker's start-up got faster.)
    let mut run_not_sent = None;
    if let Some(request) = run_now
        && let Err(error) = channel.send(&SupervisorMessage::Run(request)).await
    {
        run_not_sent = Some(error);
    }
    let started = Instant::now();
    match channel.receive().await {
        Ok(WorkerMessage::Hello { version }) if version == PROTOCOL_VERSION => {
            tracing::debug!(
                waited_us = started.elapsed().as_micros() as u64,
                "worker said hello"
            );
        }
        Ok(WorkerMessage::Hello { version }) => {
            return Err(violation(format!(
                "worker speaks protocol {version}, we speak {PROTOCOL_VERSION}"
            )));
        }
        Ok(other) => return Err(violation(format!("expected Hello, got {}", other.name()))),
        Err(e) => return Err(Conversation::Broken(e)),
    }
    match (channel.receive().await, run_not_sent) {
        (Ok(WorkerMessage::Ready(applied)), None) => Ok(applied),
        (Ok(WorkerMessage::Ready(_)), Some(error)) => Err(Conversation::Broken(error)),
        (Ok(WorkerMessage::SetupFailed(failure)), _) => Err(Conversation::SetupFailed { failure }),
        (Ok(other), _) => Err(violation(format!("expected Ready, got {}", other.name()))),
        (Err(e), _) => Err(Conversation::Broken(e)),
    }
}

/// The spec the worker confines itself by: the profile's, told when its network namespace
/// is the shared one (so it holds the namespace to the conditions that make sharing safe).
fn spec_for(profile: &CompiledProfile, network: WorkerNetwork) -> airlock_protocol::SandboxSpec {
    let mut spec = profile.spec.clone();
    if network == WorkerNetwork::Shared {
        spec.network = airlock_protocol::NetworkMode::NoneShared;
    }
    spec
}

/// What the worker is told to run for `run`.
fn run_request(run: &SandboxRun) -> RunRequest {
    RunRequest {
        call_id: run.call_id.clone(),
        tool: run.tool.clone(),
        argv: run.argv.clone(),
        stdin: run.stdin.clone(),
        arguments_json: run.arguments_json.clone(),
        output_limit_bytes: run.profile.limits.output_bytes,
        stdio: if run.inherit_stdio.is_some() {
            StdioMode::Inherit
        } else {
            StdioMode::Capture
        },
        builtin: run.builtin.clone(),
    }
}

/// The second half: run (unless the Run went out with the Setup), report.
async fn run_over(
    channel: &mut WorkerChannel,
    request: Option<RunRequest>,
) -> Result<WorkerMessage, Conversation> {
    if let Some(request) = request {
        channel
            .send(&SupervisorMessage::Run(request))
            .await
            .map_err(Conversation::Broken)?;
    }
    match channel.receive().await {
        Ok(report @ (WorkerMessage::Exited(_) | WorkerMessage::RunFailed { .. })) => Ok(report),
        Ok(other) => Err(Conversation::Broken(ChannelError::Violation(format!(
            "expected Exited, got {}",
            other.name()
        )))),
        Err(e) => Err(Conversation::Broken(e)),
    }
}

/// Sleeps until `deadline` to the microsecond: tokio's timer rounds deadlines up to whole
/// milliseconds, which showed as up to a millisecond of "deadline → reaped". Falls back to
/// tokio's timer if no timerfd can be had.
/// How long before a deadline [`sleep_until_precise`] switches to a timerfd.
const PRECISE_TAIL: Duration = Duration::from_millis(5);

async fn sleep_until_precise(deadline: tokio::time::Instant) {
    // tokio's timer (whole milliseconds, may fire up to one late) until close to the
    // deadline, and a timerfd only for the last stretch: most calls end long before their
    // deadline and never pay the timerfd's five syscalls (create, arm, register, deregister,
    // close) on their critical path.
    let coarse = deadline.checked_sub(PRECISE_TAIL);
    if let Some(coarse) = coarse
        && coarse > tokio::time::Instant::now()
    {
        tokio::time::sleep_until(coarse).await;
    }
    let after = deadline.saturating_duration_since(tokio::time::Instant::now());
    match sys::oneshot_timerfd(after).and_then(sys::register_async_fd) {
        Ok(timer) => {
            let _ = timer.readable().await;
        }
        Err(_) => tokio::time::sleep_until(deadline).await,
    }
}

async fn wait_cancel(cancel: Option<&CancelSignal>) {
    match cancel {
        Some(signal) => signal.cancelled().await,
        None => std::future::pending().await,
    }
}

/// Kills the worker tree, waits for the worker to be reaped, reads the cgroup counters and
/// removes the cgroup.
async fn finish_worker(lease: &mut WorkerLease) -> Option<CgroupStats> {
    let stats = reap_worker(lease).await;
    lease.release();
    stats
}

/// Removes a reaped worker's cgroup off the async threads (rmdir may retry with short
/// sleeps, and is slow on v1), still counted as active so `close` waits for it.
fn release_later(mut lease: WorkerLease, active: ActiveCall) {
    tokio::task::spawn_blocking(move || {
        lease.release();
        drop(active);
    });
}

/// Kills the worker tree, waits until the worker is reaped, and reads the cgroup counters
/// (final by then); the cgroup itself stays until [`WorkerLease::release`].
async fn reap_worker(lease: &WorkerLease) -> Option<CgroupStats> {
    lease.kill();
    if let Some(pidfd) = &lease.pidfd {
        wait_for_exit(pidfd).await;
    }
    lease.cgroup.as_ref().and_then(|c| c.read_stats().ok())
}

/// Waits until the worker (already sent SIGKILL) has exited and is reaped.
async fn wait_for_exit(pidfd: &OwnedFd) {
    // A pidfd becomes readable when the process exits.
    let registered = pidfd
        .try_clone()
        .ok()
        .and_then(|fd| sys::register_async_fd(fd).ok());
    if let Some(async_fd) = &registered {
        let _ = tokio::time::timeout(Duration::from_secs(5), async_fd.readable()).await;
    }
    for _ in 0..5000 {
        match sys::try_reap_pidfd(pidfd) {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
    tracing::warn!("worker did not exit within 5 s of SIGKILL");
}

fn apply_isolation(
    isolation: &mut Isolation,
    applied: &AppliedIsolation,
    profile: &CompiledProfile,
) {
    isolation.namespaces = applied.namespaces.clone();
    isolation.landlock_abi = applied.landlock_abi;
    isolation.landlock = match (applied.landlock_abi, applied.landlock_fully_enforced) {
        (0, _) => LandlockLevel::None,
        (_, true) => LandlockLevel::Full,
        (_, false) => LandlockLevel::Partial,
    };
    isolation.seccomp = applied
        .seccomp_installed
        .then(|| profile.spec.seccomp.digest.clone());
}

fn finish_result(
    result: &mut ToolResult,
    conversation: Conversation,
    stats: Option<&CgroupStats>,
    profile: &CompiledProfile,
    run: &SandboxRun,
) {
    result.usage.peak_memory_bytes = stats.and_then(|s| s.peak_memory_bytes);
    let oom = stats.is_some_and(|s| s.oom_kills > 0);
    let pids_hit = stats.is_some_and(|s| s.pids_limit_hits > 0);
    let oom_error = || {
        ToolError::new(
            ErrorKind::OutOfMemory,
            format!(
                "the memory limit of {} bytes was reached",
                profile.limits.memory_bytes
            ),
        )
    };
    match conversation {
        Conversation::Finished { applied, report } => {
            apply_isolation(result.isolation_mut(), &applied, profile);
            match report {
                WorkerMessage::Exited(exit) => finish_exit(result, exit, oom, pids_hit, profile),
                WorkerMessage::RunFailed { message, .. } => {
                    result.error = Some(ToolError::new(ErrorKind::ToolFailed, message));
                }
                _ => {}
            }
        }
        Conversation::SetupFailed { failure, .. } => {
            let kind = ErrorKind::SandboxUnavailable;
            result.error = Some(ToolError {
                step: Some(failure.step.clone()),
                ..ToolError::new(
                    kind,
                    format!(
                        "sandbox set-up failed at {}: {}",
                        failure.step, failure.message
                    ),
                )
            });
        }
        Conversation::Broken(ChannelError::Closed) if oom => result.error = Some(oom_error()),
        Conversation::Broken(error) => {
            result.error = Some(ToolError::new(
                ErrorKind::ProtocolViolation,
                format!("worker killed: {error}"),
            ));
        }
        Conversation::TimedOut { applied } => {
            if let Some(applied) = applied {
                apply_isolation(result.isolation_mut(), &applied, profile);
            }
            if pids_hit {
                // A fork bomb spins until the deadline; the cause worth reporting is the cap.
                result.error = Some(ToolError {
                    timeout_ms: Some(duration_ms(run.timeout)),
                    ..ToolError::new(
                        ErrorKind::PidsLimit,
                        format!(
                            "the process limit of {} was reached and the deadline passed; every process was killed",
                            profile.limits.pids
                        ),
                    )
                });
                result.ok = false;
                return;
            }
            result.error = Some(ToolError {
                timeout_ms: Some(duration_ms(run.timeout)),
                ..ToolError::new(
                    ErrorKind::Timeout,
                    format!(
                        "deadline of {} ms passed; every process was killed",
                        duration_ms(run.timeout)
                    ),
                )
            });
        }
        Conversation::Cancelled { applied } => {
            if let Some(applied) = applied {
                apply_isolation(result.isolation_mut(), &applied, profile);
            }
            result.error = Some(ToolError::new(
                ErrorKind::Cancelled,
                "cancelled by the caller; every process was killed",
            ));
        }
    }
    result.ok = result.error.is_none();
}

fn finish_exit(
    result: &mut ToolResult,
    exit: ToolExit,
    oom: bool,
    pids_hit: bool,
    profile: &CompiledProfile,
) {
    result.stdout = String::from_utf8_lossy(&exit.stdout).into_owned();
    result.stderr = String::from_utf8_lossy(&exit.stderr).into_owned();
    result.stdout_truncated = exit.stdout_truncated;
    result.stderr_truncated = exit.stderr_truncated;
    result.usage.cpu_ms = (exit.user_cpu_us.saturating_add(exit.system_cpu_us)) / 1000;
    result.error = None;
    match exit.status {
        ExitStatus::Code(code) => {
            result.exit_code = Some(code);
            if oom {
                result.error = Some(ToolError::new(
                    ErrorKind::OutOfMemory,
                    format!(
                        "the memory limit of {} bytes was reached",
                        profile.limits.memory_bytes
                    ),
                ));
            } else if code != 0 {
                let kind = if pids_hit {
                    ErrorKind::PidsLimit
                } else {
                    ErrorKind::ToolFailed
                };
                let message = if pids_hit {
                    format!(
                        "the process limit of {} was reached; the tool exited with code {code}",
                        profile.limits.pids
                    )
                } else {
                    format!("the tool exited with code {code}")
                };
                result.error = Some(ToolError::new(kind, message));
            }
        }
        ExitStatus::Signal(signal) => {
            result.signal = Some(signal);
            result.error = Some(if oom {
                ToolError::new(
                    ErrorKind::OutOfMemory,
                    format!(
                        "the memory limit of {} bytes was reached",
                        profile.limits.memory_bytes
                    ),
                )
            } else if signal == libc::SIGSYS {
                ToolError {
                    syscall: Some("a syscall from a non-native architecture or the x32 ABI".into()),
                    ..ToolError::new(
                        ErrorKind::SeccompViolation,
                        "the seccomp filter killed the tool (SIGSYS)",
                    )
                }
            } else if pids_hit {
                ToolError::new(
                    ErrorKind::PidsLimit,
                    format!("the process limit of {} was reached", profile.limits.pids),
                )
            } else {
                ToolError::new(
                    ErrorKind::ToolFailed,
                    format!("the tool was killed by signal {signal}"),
                )
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn default_profile() -> Arc<CompiledProfile> {
        let text = airlock_policy::presets::preset_text("default").unwrap();
        let policy = airlock_policy::load_policy_str(text, "default")
            .unwrap()
            .policy;
        Arc::clone(&policy.profiles["default"])
    }

    #[test]
    fn pool_keys_follow_the_profile_content_not_the_arc() {
        let keys = PoolKeys::default();
        let profile = default_profile();
        let first = keys.of(&profile);
        assert_eq!(keys.of(&profile), first, "same Arc, cached");
        let copy = Arc::new(CompiledProfile::clone(&profile));
        assert_eq!(keys.of(&copy), first, "identical content shares a pool");
        let mut changed = CompiledProfile::clone(&profile);
        changed.limits.memory_bytes += 4096;
        assert_ne!(
            keys.of(&Arc::new(changed)),
            first,
            "other limits, other pool"
        );
        let mut changed = CompiledProfile::clone(&profile);
        changed.spec.hostname.push('x');
        assert_ne!(keys.of(&Arc::new(changed)), first, "other spec, other pool");
    }

    #[test]
    fn setup_frames_are_encoded_once_per_profile_and_network() {
        let frames = SetupFrames::default();
        let profile = default_profile();
        let fresh = frames.get(&profile, WorkerNetwork::Fresh).unwrap();
        assert!(Arc::ptr_eq(
            &frames.get(&profile, WorkerNetwork::Fresh).unwrap(),
            &fresh
        ));
        let shared = frames.get(&profile, WorkerNetwork::Shared).unwrap();
        assert!(!Arc::ptr_eq(&shared, &fresh));
        // What is sent is the Hello, then the Setup of this profile's spec for that network.
        let decode = |bytes: &[u8]| {
            let mut decoder = airlock_protocol::FrameDecoder::new();
            let mut input = bytes;
            let hello: SupervisorMessage = decoder.decode_message(&mut input).unwrap().unwrap();
            let setup: SupervisorMessage = decoder.decode_message(&mut input).unwrap().unwrap();
            assert!(input.is_empty());
            (hello, setup)
        };
        let (hello, setup) = decode(&shared);
        assert!(
            matches!(hello, SupervisorMessage::Hello { version } if version == PROTOCOL_VERSION)
        );
        let SupervisorMessage::Setup(spec) = setup else {
            panic!("not a setup: {setup:?}");
        };
        assert_eq!(*spec, spec_for(&profile, WorkerNetwork::Shared));
        // Another profile (even with the same content) is encoded for itself.
        let mut changed = CompiledProfile::clone(&profile);
        changed.spec.hostname = "other".into();
        let changed = Arc::new(changed);
        let (_, setup) = decode(&frames.get(&changed, WorkerNetwork::Fresh).unwrap());
        assert!(matches!(setup, SupervisorMessage::Setup(spec) if spec.hostname == "other"));
    }

    #[test]
    fn pool_keys_stay_bounded() {
        let keys = PoolKeys::default();
        let profile = default_profile();
        let expected = keys.of(&profile);
        for _ in 0..(PoolKeys::MAX * 3) {
            let copy = Arc::new(CompiledProfile::clone(&profile));
            assert_eq!(keys.of(&copy), expected);
        }
        assert!(keys.0.lock().unwrap().len() <= PoolKeys::MAX);
    }
}
