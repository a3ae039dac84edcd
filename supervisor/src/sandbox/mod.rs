//! One sandboxed run, start to finish: cgroup, spawn, handshake, confine, run, deadline,
//! kill, reap, account, clean up — and the single [`ToolResult`](crate::ToolResult) that says what happened.
//!
//! The supervisor trusts its own clock (deadline), the cgroup counters (OOM, pids, peak
//! memory) and the wait status of the worker; the worker only reports what the tool
//! printed and how it exited.
//!
//! The parts, by what each does: `call` runs one call on a worker; `worker` makes a worker
//! ready (cgroup, spawn, handshake, confinement); `lease` owns a worker until it is
//! reaped and its cgroup gone; `warm` keeps pools of confined workers; `deadline` bounds
//! every wait by the deadline, a cancellation and close; `outcome` turns how a run ended
//! into its result record, as one pure function.

mod call;
mod deadline;
mod egress;
mod hints;
mod lease;
mod outcome;
mod session_workers;
mod warm;
mod worker;

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use airlock_policy::CompiledProfile;

use crate::cancel::CancelSignal;
use crate::cgroup::{CgroupParent, CgroupRecycler};
use crate::egress::{EgressLimits, Resolve, SystemResolver};
use crate::landlock_audit::LandlockAudit;
use crate::pool::{Pool, PoolClock, SystemPoolClock};
use crate::spawn::{IdMapping, SpawnError, Spawner, WorkerImage, WorkerNetwork};
use crate::sys;
use crate::template::Templates;

use lease::finish_worker;
use warm::{PoolKeys, WarmPool};
use worker::{ReadyWorker, SetupFrames, open_null};

/// Why a supervisor could not start.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// Building the worker image or the spawner failed.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
}

/// Seals the worker image and starts the spawner threads.
fn start_spawner(options: &SupervisorOptions, mapping: IdMapping) -> Result<Spawner, SpawnError> {
    let began = std::time::Instant::now();
    let (image, extra_args) = match &options.worker_program {
        Some((path, args)) => (WorkerImage::seal_from(path)?, args.clone()),
        None => match options.worker_image {
            Some(bytes) if !bytes.is_empty() => (WorkerImage::seal_bytes(bytes)?, Vec::new()),
            _ => (WorkerImage::seal_current_executable()?, Vec::new()),
        },
    };
    let sealed = began.elapsed();
    // Scoping is the kernel's (worker-side Landlock), so it is checked on the host; the
    // worker checks it again for itself and refuses a shared namespace without it.
    let share_network = options.network_namespaces == NetworkNamespaces::SharedWhenSafe
        && sys::landlock_abi_version().is_ok_and(|abi| abi >= 6);
    let spawner = Spawner::start(image, mapping, extra_args, share_network, options.one_shot)?;
    tracing::debug!(
        seal_us = sealed.as_micros(),
        spawner_us = began.elapsed().saturating_sub(sealed).as_micros(),
        "worker image sealed, spawner started"
    );
    Ok(spawner)
}

/// The configured cgroup parent or our own cgroup's, with stale worker cgroups removed.
fn find_cgroups(configured: Option<CgroupParent>) -> Result<CgroupParent, String> {
    let began = std::time::Instant::now();
    let cgroups = match configured {
        Some(parent) => Ok(parent),
        None => CgroupParent::detect().map_err(|e| e.to_string()),
    };
    let detected = began.elapsed();
    if let Ok(parent) = &cgroups {
        parent.remove_stale_worker_cgroups();
    }
    tracing::debug!(
        detect_us = detected.as_micros(),
        stale_scan_us = began.elapsed().saturating_sub(detected).as_micros(),
        "cgroups found"
    );
    cgroups
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
    /// How the egress proxy resolves names (default: the host's resolver).
    pub egress_resolver: Option<Arc<dyn Resolve>>,
    /// The egress proxy's per-call limits.
    pub egress_limits: EgressLimits,
    /// How long a worker told to stop its tool (deadline, cancellation) has to report what
    /// the tool wrote before it is killed without (default [`DEFAULT_STOP_GRACE`]).
    pub stop_grace: Option<std::time::Duration>,
    /// Read Landlock's refusals from the kernel's audit and list them in each call's
    /// `denials` (Landlock ABI 7, audit enabled, `CAP_AUDIT_READ`, `CAP_AUDIT_WRITE` and
    /// `CAP_AUDIT_CONTROL` in the initial namespaces).
    /// Where the host cannot, the supervisor starts without and says so
    /// ([`Supervisor::landlock_audit`]); results then say `landlock: unavailable`.
    pub landlock_audit: bool,
    /// A supervisor for a single call that then closes (`airlock exec` and `run`): it
    /// keeps no pool and builds no root template for its cold calls (each builds its own
    /// root), so it reserves no descriptor slots for template spawner threads, and it
    /// removes a finished worker's cgroup on its runtime's thread.
    pub one_shot: bool,
}

/// A running worker answers a stop within a millisecond or so; one that does not (a
/// built-in still at work, a worker gone wrong) is killed after this, its output lost.
pub const DEFAULT_STOP_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// The network namespace strategy for `network = "none"` profiles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NetworkNamespaces {
    /// One of its own per worker, always: concurrent calls share no network state. For
    /// `"none"` profiles that require seccomp, a root supervisor lends each worker an
    /// empty namespace of an earlier, reaped worker in which nothing is left (see
    /// docs/policy.md#network); everything else gets a fresh one from clone.
    #[default]
    PerWorker,
    /// Weaker, for a faster cold path: one empty network namespace, made by the supervisor
    /// and shared by those workers, where that connects nobody: the supervisor may create
    /// it (root), the kernel scopes abstract unix sockets per Landlock domain (ABI 6, Linux
    /// 6.12), and the profile requires Landlock and seccomp (AF_UNIX only). Everything else
    /// gets a fresh one. Workers sharing it still see each other's abstract socket names
    /// (`/proc/net/unix`) and can take a name another call wants to bind first: a narrow
    /// channel between concurrent calls, which is why this is not the default. Creating
    /// and destroying a network namespace is most of a cold spawn's kernel work.
    SharedWhenSafe,
}

/// Starts sandboxes. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Supervisor {
    /// See [`SupervisorOptions::one_shot`].
    one_shot: bool,
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
    egress_resolver: Arc<dyn Resolve>,
    egress_limits: EgressLimits,
    stop_grace: std::time::Duration,
    /// The host uid and gid the sandbox's root maps to.
    sandbox_ids: (u32, u32),
    /// Told how long each call waited for its worker (`airlock serve`'s metrics).
    spawn_observer: ObserverSlot,
    /// The audit reader, when Landlock's refusals are read.
    landlock_audit: Option<Arc<LandlockAudit>>,
    /// Whether they were asked for, and why they are not read when they are not.
    landlock_audit_state: LandlockAuditState,
}

/// Whether a supervisor reads Landlock's refusals from the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LandlockAuditState {
    /// Not asked for (`SupervisorOptions::landlock_audit` off).
    Off,
    /// Read: results list them and say `landlock: reported`.
    Reading,
    /// Asked for, but the host cannot: why.
    Unavailable(String),
}

/// The supervisor's [`SpawnObserver`], once set (a closure has no `Debug` of its own).
#[derive(Default)]
struct ObserverSlot(std::sync::OnceLock<SpawnObserver>);

impl std::fmt::Debug for ObserverSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "ObserverSlot(set)"
        } else {
            "ObserverSlot(unset)"
        })
    }
}

/// Told, for each call that got a worker, whether the worker came from a pool and how long
/// the call waited for it: from the call's start to a worker ready for its request.
pub type SpawnObserver = Arc<dyn Fn(bool, std::time::Duration) + Send + Sync>;

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
        let mapping = IdMapping::for_this_process(options.sandbox_host_id);
        let sandbox_ids = (mapping.host_uid, mapping.host_gid);
        let spawner = start_spawner(&options, mapping)?;
        let cgroups = find_cgroups(options.cgroup_parent.clone());
        let (landlock_audit, landlock_audit_state) = if options.landlock_audit {
            match LandlockAudit::start() {
                Ok(audit) => (Some(audit), LandlockAuditState::Reading),
                Err(e) => {
                    // The CLI's flags and the daemon's start-up say it here, on stderr.
                    tracing::warn!(error = %e, "Landlock refusals will not be read from the audit");
                    (None, LandlockAuditState::Unavailable(e.to_string()))
                }
            }
        } else {
            (None, LandlockAuditState::Off)
        };
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
            egress_resolver: options
                .egress_resolver
                .unwrap_or_else(|| Arc::new(SystemResolver)),
            egress_limits: options.egress_limits,
            stop_grace: options.stop_grace.unwrap_or(DEFAULT_STOP_GRACE),
            sandbox_ids,
            spawn_observer: ObserverSlot::default(),
            landlock_audit,
            landlock_audit_state,
            one_shot: options.one_shot,
        })
    }

    /// Whether Landlock's refusals are read from the audit, and why not when asked for.
    pub fn landlock_audit(&self) -> &LandlockAuditState {
        &self.landlock_audit_state
    }

    /// Sets the one [`SpawnObserver`] of this supervisor; false when one was already set
    /// (it is kept).
    pub fn observe_spawns(&self, observer: SpawnObserver) -> bool {
        self.spawn_observer.0.set(observer).is_ok()
    }

    /// The limits each call's egress proxy works within.
    pub fn egress_limits(&self) -> EgressLimits {
        self.egress_limits
    }

    /// The host uid and gid the sandbox's root maps to (what owns a session's files).
    pub fn sandbox_ids(&self) -> (u32, u32) {
        self.sandbox_ids
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

    /// Calls in progress plus finished calls whose worker is still being reaped and removed
    /// (what [`Supervisor::close`] waits for). Zero means no sandbox work is going on.
    pub fn calls_in_flight(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// How many recycled network namespaces were made, reused, and dropped because
    /// something was left in them.
    pub fn network_namespace_counts(&self) -> crate::spawn::NamespaceCounts {
        self.spawner.network_namespace_counts()
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
            // The filter refuses every socket but AF_UNIX, so unix sockets are all such a
            // worker can leave in a namespace: one it may have after an earlier worker.
            NetworkMode::None if spec.seccomp.requirement == Requirement::Required => {
                WorkerNetwork::Recycled
            }
            NetworkMode::None | NetworkMode::Loopback | NetworkMode::NoneShared => {
                WorkerNetwork::Fresh
            }
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
