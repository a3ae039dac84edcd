//! Making a worker ready for its one call: its cgroup, its spawn (or clone from a root
//! template), the handshake and its confinement, each step bounded by the call's deadline
//! and cancellation.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use airlock_policy::CompiledProfile;
use airlock_protocol::{
    AppliedIsolation, PROTOCOL_VERSION, RunRequest, SupervisorMessage, WorkerMessage,
};

use super::deadline::Bounds;
use super::lease::WorkerLease;
use super::outcome::Conversation;
use super::{Supervisor, error_chain};
use crate::cgroup::{CgroupLimits, WorkerCgroup};
use crate::channel::{ChannelError, WorkerChannel};
use crate::result::{ErrorKind, ToolError};
use crate::spawn::{SpawnError, SpawnRequest, WorkerNetwork};
use crate::template::RootTemplate;

/// The Hello and Setup frames a profile's workers get, per network namespace kind,
/// encoded at the first worker and sent as they are to every later one: a deep copy of the
/// spec (its seccomp program, mount plan, Landlock rules) and its encoding per worker showed
/// in a throughput profile of pooled calls. By identity and bounded, as
/// `PoolKeys`: each entry holds its `Arc`, so the address is not reused and the content
/// does not change.
#[derive(Debug, Default)]
pub(super) struct SetupFrames(std::sync::Mutex<Vec<EncodedSetup>>);

/// A profile, the network namespace kind, and the frames for its workers.
type EncodedSetup = (Arc<CompiledProfile>, WorkerNetwork, Arc<[u8]>);

impl SetupFrames {
    const MAX: usize = 64;

    pub(super) fn get(
        &self,
        profile: &Arc<CompiledProfile>,
        network: WorkerNetwork,
        log_landlock: bool,
    ) -> Result<Arc<[u8]>, airlock_protocol::FrameError> {
        // A session's profile (with its workspace) serves one session's cold calls: encoded
        // each time rather than crowding the pooled profiles out of this bounded cache.
        if profile.workspace.is_some() {
            return encode_setup(spec_for(profile, network, log_landlock));
        }
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
        let frames = encode_setup(spec_for(profile, network, log_landlock))?;
        if known.len() >= Self::MAX {
            known.clear();
        }
        known.push((Arc::clone(profile), network, Arc::clone(&frames)));
        Ok(frames)
    }
}

/// The Hello and Setup frames for a worker confined by `spec`, as one buffer.
pub(super) fn encode_setup(
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

/// A confined worker waiting for its one call.
#[derive(Debug)]
pub(super) struct ReadyWorker {
    pub(super) lease: WorkerLease,
    pub(super) channel: WorkerChannel,
    pub(super) applied: AppliedIsolation,
    /// The call's `Run` went out with the `Setup` already (cold calls; see `run`).
    pub(super) run_sent: bool,
    /// The worker's seccomp listener, answered while its call runs.
    pub(super) seccomp: Option<OwnedFd>,
    /// The listener in the worker's network namespace its egress proxy accepts on.
    pub(super) egress: Option<std::net::TcpListener>,
}

/// What a worker is made for.
pub(super) struct WorkerOrder<'a> {
    pub(super) profile: &'a Arc<CompiledProfile>,
    /// The tool's stdin, stdout and stderr, when the caller passes its own through.
    pub(super) inherit_stdio: Option<&'a [OwnedFd; 3]>,
    /// The call, sent right behind the setup (cold calls).
    pub(super) run_now: Option<RunRequest>,
    /// The root template to clone the worker from.
    pub(super) template: Option<&'a Arc<RootTemplate>>,
}

/// Why no worker could be made ready.
pub(super) enum PrepareError {
    /// Refused before anything was spawned.
    Rejected(Box<ToolError>),
    /// Spawned but the handshake or confinement failed; the lease still needs cleanup.
    Failed(Conversation, Box<WorkerLease>),
}

/// A spawned worker that will not become ready (abandoned or failed); the lease cleans up.
fn failed(conversation: Conversation, lease: WorkerLease) -> PrepareError {
    PrepareError::Failed(conversation, Box::new(lease))
}

/// A new descriptor of each of `fds`.
fn copies(fds: [&OwnedFd; 3]) -> std::io::Result<[OwnedFd; 3]> {
    let [a, b, c] = fds;
    Ok([a.try_clone()?, b.try_clone()?, c.try_clone()?])
}

pub(super) fn open_null() -> std::io::Result<OwnedFd> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map(OwnedFd::from)
}

impl Supervisor {
    /// cgroup, spawn, handshake and confinement: a worker waiting for its one call; cloned
    /// from the order's template when there is one.
    pub(super) async fn prepare_worker(
        &self,
        order: WorkerOrder<'_>,
        bounds: Bounds<'_>,
    ) -> Result<ReadyWorker, PrepareError> {
        let WorkerOrder {
            profile,
            inherit_stdio,
            run_now,
            template,
        } = order;
        let network = self.worker_network(profile);
        let mut lease = WorkerLease {
            pidfd: None,
            spawning: None,
            cgroup: None,
            recycler: Arc::clone(&self.cgroup_spares),
            network: None,
            _template: template.cloned(),
            audit: None,
        };
        // A call given up already (a deadline of 0, a cancellation before the start) makes
        // nothing: no cgroup, no worker for the spawner to clone and kill again.
        if let Some(gave_up) = self.given_up_already(bounds) {
            return Err(failed(gave_up, lease));
        }
        // cgroup first: the worker joins it before it does anything.
        lease.cgroup = self
            .create_cgroup(profile)
            .map_err(PrepareError::Rejected)?;
        let request = self.spawn_request(&lease, inherit_stdio, network)?;
        let socket = match self.spawn(&mut lease, request, template, bounds).await? {
            Ok(socket) => socket,
            Err(gave_up) => return Err(failed(gave_up, lease)),
        };
        let std_stream = std::os::unix::net::UnixStream::from(socket);
        let stream = std_stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixStream::from_std(std_stream));
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                return Err(failed(Conversation::Broken(ChannelError::from(e)), lease));
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
                None => self
                    .setup_frames
                    .get(profile, network, self.landlock_audit.is_some()),
            };
            let frames = frames.map_err(|e| {
                Conversation::Broken(ChannelError::Violation(format!(
                    "cannot encode the worker's setup: {e}"
                )))
            });
            let channel = &mut channel;
            let talk = async move { confine_over(channel, &frames?, run_now).await };
            tokio::pin!(talk);
            self.unless_given_up(talk, bounds)
                .await
                .and_then(|outcome| outcome)
        };
        let handshake = handshake.and_then(|applied| {
            let broken = |what| Conversation::Broken(ChannelError::Violation(what));
            // In the order the worker passes them: the seccomp listener first.
            let seccomp =
                seccomp_listener(&mut channel, applied.seccomp_listener).map_err(broken)?;
            let egress = egress_listener(&mut channel, profile.spec.egress_port).map_err(broken)?;
            Ok((applied, seccomp, egress))
        });
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
            Ok((applied, seccomp, egress)) => Ok(ReadyWorker {
                lease,
                channel,
                applied,
                run_sent,
                seccomp,
                egress,
            }),
            Err(conversation) => Err(failed(conversation, lease)),
        }
    }

    /// What the spawner needs for a worker of `lease`: its stdio and how it joins its
    /// cgroup (a directory to clone into on v2, the `cgroup.procs` files on v1).
    fn spawn_request(
        &self,
        lease: &WorkerLease,
        inherit_stdio: Option<&[OwnedFd; 3]>,
        network: WorkerNetwork,
    ) -> Result<SpawnRequest, PrepareError> {
        let stdio = match (inherit_stdio, &self.null) {
            (Some([a, b, c]), _) => copies([a, b, c]),
            (None, Some(null)) => copies([null; 3]),
            (None, None) => open_null().and_then(|a| Ok([a, open_null()?, open_null()?])),
        };
        let stdio = stdio.map_err(|e| {
            PrepareError::Rejected(unavailable(
                "stdio",
                format!("cannot prepare the worker's stdio: {e}"),
            ))
        })?;
        let cgroup_failed = |e: crate::cgroup::CgroupError| {
            PrepareError::Rejected(unavailable("cgroup", error_chain(&e)))
        };
        let (join_cgroups, cgroup_dir) = match &lease.cgroup {
            Some(cg) => {
                let dir = cg.open_dir_v2().map_err(cgroup_failed)?;
                let procs = if dir.is_some() {
                    Vec::new()
                } else {
                    cg.open_join_files().map_err(cgroup_failed)?
                };
                (procs, dir)
            }
            None => (Vec::new(), None),
        };
        Ok(SpawnRequest {
            stdio,
            join_cgroups,
            cgroup_dir,
            network,
        })
    }

    /// Spawns the worker (cloned from `template` when there is one) and waits until it has
    /// exec'd; its socket, or how the call was given up meanwhile. The deadline, a
    /// cancellation and close bound the spawn and the exec too: on a loaded machine either
    /// can stall, and the call must still end on time. A spawn abandoned here is killed and
    /// reaped once the spawner answers, and only then is its cgroup removed (see
    /// `PendingSpawn`); an abandoned exec through the lease.
    async fn spawn(
        &self,
        lease: &mut WorkerLease,
        request: SpawnRequest,
        template: Option<&Arc<RootTemplate>>,
        bounds: Bounds<'_>,
    ) -> Result<Result<OwnedFd, Conversation>, PrepareError> {
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
            self.unless_given_up(spawn, bounds).await
        };
        let spawned = match spawned {
            Ok(spawned) => spawned.map_err(spawn_failed)?,
            Err(gave_up) => return Ok(Err(gave_up)),
        };
        // Before the worker can confine itself (its Setup is not sent yet), so before its
        // domain can refuse anything.
        if let Some(audit) = &self.landlock_audit {
            lease.audit = Some(audit.register(spawned.child.pid()));
        }
        // From here the lease owns the worker: dropping this future kills and reaps it.
        lease.pidfd = spawned.child.into_pidfd();
        lease.network = spawned.network;
        let spawn_started = Instant::now();
        let exec = crate::spawn::await_exec(spawned.exec_report);
        tokio::pin!(exec);
        match self.unless_given_up(exec, bounds).await {
            // The lease kills and reaps the exiting child and removes its cgroup.
            Ok(exec) => exec.map_err(spawn_failed)?,
            Err(gave_up) => return Ok(Err(gave_up)),
        }
        tracing::debug!(
            until_exec_us = spawn_started.elapsed().as_micros() as u64,
            "worker exec'd"
        );
        Ok(Ok(spawned.socket))
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

/// The seccomp listener the worker passed with `Ready` when it says it installed its filter
/// with one, checked to be one: the supervisor answers its syscalls, and answers nothing
/// else.
fn seccomp_listener(channel: &mut WorkerChannel, said: bool) -> Result<Option<OwnedFd>, String> {
    if !said {
        return Ok(None);
    }
    match channel.take_passed_descriptor() {
        Some(fd) if crate::sys::is_seccomp_listener(fd.as_fd()) => Ok(Some(fd)),
        Some(_) => Err("the worker's seccomp listener is not one".into()),
        None => Err("the worker passed no seccomp listener".into()),
    }
}

/// The egress listener the worker passed with `Ready`, checked to be what the spec asked
/// for: a listening TCP socket on `127.0.0.1:<port>`. A worker passing anything else, or
/// anything at all when no port was asked for, broke the protocol.
fn egress_listener(
    channel: &mut WorkerChannel,
    port: Option<u16>,
) -> Result<Option<std::net::TcpListener>, String> {
    use nix::sys::socket::{getsockopt, sockopt};
    let passed = channel.take_passed_descriptor();
    let (port, fd) = match (port, passed) {
        (None, None) => return Ok(None),
        (None, Some(_)) => return Err("the worker passed a descriptor nobody asked for".into()),
        (Some(_), None) => return Err("the worker passed no egress listener".into()),
        (Some(port), Some(fd)) => (port, fd),
    };
    let listening = getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false);
    let stream =
        getsockopt(&fd, sockopt::SockType).ok() == Some(nix::sys::socket::SockType::Stream);
    let listener = std::net::TcpListener::from(fd);
    let expected = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    match listener.local_addr() {
        Ok(address) if listening && stream && address == expected => {
            listener
                .set_nonblocking(true)
                .map_err(|e| format!("cannot use the egress listener: {e}"))?;
            Ok(Some(listener))
        }
        _ => Err(format!(
            "the worker's egress listener is not a TCP socket listening on {expected}"
        )),
    }
}

/// A `sandbox_unavailable` error at `step`.
fn unavailable(step: &str, message: String) -> Box<ToolError> {
    Box::new(ToolError {
        step: Some(step.to_string()),
        ..ToolError::new(ErrorKind::SandboxUnavailable, message)
    })
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
/// is the shared one (so it holds the namespace to the conditions that make sharing safe),
/// and whether its Landlock domain logs refusals (a supervisor reading them: the same for
/// every worker it makes).
pub(super) fn spec_for(
    profile: &CompiledProfile,
    network: WorkerNetwork,
    log_landlock: bool,
) -> airlock_protocol::SandboxSpec {
    let mut spec = profile.spec.clone();
    spec.landlock.log_denials = log_landlock;
    if network == WorkerNetwork::Shared {
        spec.network = airlock_protocol::NetworkMode::NoneShared;
    }
    spec
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
    fn setup_frames_are_encoded_once_per_profile_and_network() {
        let frames = SetupFrames::default();
        let profile = default_profile();
        let fresh = frames.get(&profile, WorkerNetwork::Fresh, false).unwrap();
        assert!(Arc::ptr_eq(
            &frames.get(&profile, WorkerNetwork::Fresh, false).unwrap(),
            &fresh
        ));
        let shared = frames.get(&profile, WorkerNetwork::Shared, false).unwrap();
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
        assert_eq!(*spec, spec_for(&profile, WorkerNetwork::Shared, false));
        // Another profile (even with the same content) is encoded for itself.
        let mut changed = CompiledProfile::clone(&profile);
        changed.spec.hostname = "other".into();
        let changed = Arc::new(changed);
        let (_, setup) = decode(&frames.get(&changed, WorkerNetwork::Fresh, false).unwrap());
        assert!(matches!(setup, SupervisorMessage::Setup(spec) if spec.hostname == "other"));
    }
}
