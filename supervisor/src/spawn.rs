//! Starting workers: the sealed worker image, and the long-lived spawner thread that clones
//! workers into fresh namespaces and writes their uid/gid maps (the parent-side half of the
//! handshake).
//!
//! The spawner is a dedicated thread because a worker's parent-death signal fires when the
//! *thread* that created it exits: tokio's blocking threads come and go, this one lives as
//! long as the supervisor.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::mpsc;

use crate::sys::{self, CHILD_STEPS, ChildMemory, ChildStack, InFlightChild};

/// Why a worker could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// Building the sealed image failed.
    #[error("cannot build the sealed worker image from {path}")]
    Image {
        /// Source binary.
        path: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A set-up syscall in the parent failed.
    #[error("cannot {operation}")]
    Parent {
        /// What failed.
        operation: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// clone3 into new namespaces failed (user namespaces restricted, for example).
    #[error("cannot create the worker's namespaces (clone3): {source}; see `airlock doctor`")]
    Clone {
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Writing the uid/gid maps failed.
    #[error("cannot write {file} of worker {pid}")]
    IdMap {
        /// Which file.
        file: &'static str,
        /// Worker pid.
        pid: i32,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The child failed between clone and exec.
    #[error("worker set-up failed at step '{step}' before exec")]
    Child {
        /// The step.
        step: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// The spawner thread is gone.
    #[error("the spawner thread has stopped")]
    SpawnerGone,
}

impl SpawnError {
    /// Whether retrying on a fresh worker could help (transient resource shortage).
    pub fn is_transient(&self) -> bool {
        let errno = match self {
            SpawnError::Clone { source }
            | SpawnError::Parent { source, .. }
            | SpawnError::Child { source, .. } => source.raw_os_error(),
            _ => None,
        };
        matches!(errno, Some(libc::EAGAIN) | Some(libc::ENOMEM))
    }
}

/// The worker program, copied once into a sealed memfd: nothing a sandbox does can change
/// what the next worker executes (runc CVE-2019-5736 class), and no per-spawn copy is made.
#[derive(Debug)]
pub struct WorkerImage {
    fd: OwnedFd,
}

impl WorkerImage {
    /// Copies `binary` (normally /proc/self/exe) into a sealed memfd.
    pub fn seal_from(binary: &Path) -> Result<Self, SpawnError> {
        let fail = |source| SpawnError::Image {
            path: binary.display().to_string(),
            source,
        };
        let fd = sys::create_executable_memfd(c"airlock-worker").map_err(fail)?;
        let mut source = File::open(binary).map_err(fail)?;
        let mut target = File::from(fd);
        io::copy(&mut source, &mut target).map_err(fail)?;
        let fd = OwnedFd::from(target);
        sys::seal_memfd(&fd).map_err(fail)?;
        Ok(Self { fd })
    }

    /// A worker program given as bytes (a dedicated worker binary, such as the one the
    /// `airlock` CLI embeds), sealed.
    pub fn seal_bytes(image: &[u8]) -> Result<Self, SpawnError> {
        let fail = |source| SpawnError::Image {
            path: format!("{} embedded bytes", image.len()),
            source,
        };
        let fd = sys::create_executable_memfd(c"airlock-worker").map_err(fail)?;
        let mut target = File::from(fd);
        // An image embedded in our own executable is copied file to file inside the kernel:
        // writing it from memory first faulted its 0.5 MiB in page by page (with readahead),
        // 1.3 ms, the largest single cost of a one-shot `airlock exec`.
        if copy_from_own_executable(image, &mut target).is_err() {
            target.set_len(0).map_err(fail)?;
            target.write_all(image).map_err(fail)?;
        }
        // Read once, if at all: it need not stay resident (1.2 MiB beside a supervisor's
        // ~10 MiB). Even untouched, the kernel maps pages of it around faults on the
        // read-only data next to it.
        sys::page_out(image);
        let fd = OwnedFd::from(target);
        sys::seal_memfd(&fd).map_err(fail)?;
        Ok(Self { fd })
    }

    /// The current process's own binary, sealed.
    pub fn seal_current_executable() -> Result<Self, SpawnError> {
        Self::seal_from(Path::new("/proc/self/exe"))
    }

    /// The seals on the image (for tests and `doctor`).
    pub fn seals(&self) -> io::Result<i32> {
        sys::memfd_seals(&self.fd)
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Copies `image`, which must lie in a file mapping of this process's own executable, from
/// that file into `target` with `copy_file_range`/`sendfile` (std's `io::copy` uses them),
/// without touching its pages. Fails, leaving `target` to be rewritten, when the bytes are
/// not such a mapping (a library caller's heap copy, say) or the copy comes up short.
fn copy_from_own_executable(image: &[u8], target: &mut File) -> io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::MetadataExt;
    let not_mapped = || io::Error::new(io::ErrorKind::NotFound, "not in the executable's mapping");
    let start = image.as_ptr() as u64;
    let end = start + image.len() as u64;
    let mut exe = File::open("/proc/self/exe")?;
    let inode = exe.metadata()?.ino();
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let offset = maps
        .lines()
        .find_map(|line| executable_offset(line, start, end, inode))
        .ok_or_else(not_mapped)?;
    exe.seek(SeekFrom::Start(offset))?;
    let copied = io::copy(&mut exe.take(image.len() as u64), target)?;
    if copied != image.len() as u64 {
        return Err(not_mapped());
    }
    Ok(())
}

/// For one /proc/self/maps line (`start-end perms offset dev inode path`): the file offset
/// of `[start, end)` if the line maps all of it from the file with inode `inode`.
fn executable_offset(line: &str, start: u64, end: u64, inode: u64) -> Option<u64> {
    let mut fields = line.split_whitespace();
    let (from, to) = fields.next()?.split_once('-')?;
    let from = u64::from_str_radix(from, 16).ok()?;
    let to = u64::from_str_radix(to, 16).ok()?;
    let file_offset = u64::from_str_radix(fields.nth(1)?, 16).ok()?;
    let line_inode: u64 = fields.nth(1)?.parse().ok()?;
    (line_inode == inode && from <= start && end <= to).then(|| file_offset + (start - from))
}

/// Who the sandbox's uid 0 is on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMapping {
    /// Host uid of the sandbox's uid 0.
    pub host_uid: u32,
    /// Host gid of the sandbox's gid 0.
    pub host_gid: u32,
}

/// Default host uid/gid for the sandbox root when the supervisor runs as host root.
pub const DEFAULT_SANDBOX_HOST_ID: u32 = 65534;

impl IdMapping {
    /// Root supervisors map sandbox root to `DEFAULT_SANDBOX_HOST_ID` (or a configured
    /// uid); unprivileged ones can only map their own ids.
    pub fn for_this_process(configured: Option<u32>) -> Self {
        let (uid, gid) = sys::effective_ids();
        if uid == 0 {
            let id = configured.unwrap_or(DEFAULT_SANDBOX_HOST_ID);
            Self {
                host_uid: id,
                host_gid: id,
            }
        } else {
            Self {
                host_uid: uid,
                host_gid: gid,
            }
        }
    }
}

/// What the caller hands to the spawner for one worker.
#[derive(Debug)]
pub struct SpawnRequest {
    /// Descriptors that become the worker's 0, 1, 2.
    pub stdio: [OwnedFd; 3],
    /// Files the child writes "0" into to join its cgroups (v1 `tasks`; see
    /// [`crate::cgroup::WorkerCgroup::open_join_files`]).
    pub join_cgroups: Vec<OwnedFd>,
    /// v2 cgroup directory for CLONE_INTO_CGROUP.
    pub cgroup_dir: Option<OwnedFd>,
    /// Which network namespace the worker gets.
    pub network: WorkerNetwork,
}

/// Which network namespace a worker gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerNetwork {
    /// A fresh one of its own (about 0.8 ms to create here, more to tear down).
    Fresh,
    /// The one empty namespace the supervisor shares between workers, if it made one
    /// ([`Spawner::shares_network_namespace`]).
    Shared,
    /// The host's.
    Host,
}

/// A started worker.
#[derive(Debug)]
pub struct Spawned {
    /// Host pid.
    pub pid: i32,
    /// The process; killed and reaped if dropped before its owner takes the pidfd.
    pub child: ChildProcess,
    /// The supervisor's end of the protocol socket.
    pub socket: OwnedFd,
    /// Closes when the child execs the worker, or carries the step that failed before:
    /// pass it to [`await_exec`]. Waiting for it is the caller's, not the spawner thread's,
    /// so the next clone need not wait for this child's cgroup join (on v1 an RCU grace
    /// period of 10–15 ms) and exec.
    pub exec_report: OwnedFd,
}

/// A worker process of ours that nobody has taken charge of yet. If it is dropped while it
/// still holds the pidfd (a caller that gave up on the spawn, a reply nobody read), the
/// process is killed and reaped in the background: no path leaves a worker running or a
/// zombie behind.
#[derive(Debug)]
pub struct ChildProcess {
    pidfd: Option<OwnedFd>,
}

impl ChildProcess {
    /// Hands the pidfd (and with it the duty to kill and reap) to the caller.
    pub fn into_pidfd(mut self) -> Option<OwnedFd> {
        self.pidfd.take()
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Some(pidfd) = self.pidfd.take() {
            let _ = sys::signal_pidfd(&pidfd, libc::SIGKILL);
            clean_up_in_background(Some(pidfd), || {});
        }
    }
}

/// Woken whenever a call or a background clean-up finishes, so that
/// [`crate::Supervisor::close`] waits for the last one without polling (a 5 ms poll was a
/// third of a one-shot `airlock exec`).
pub(crate) static SETTLED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Clean-ups still running in the background, in this process (see [`background_cleanups`]).
static BACKGROUND_CLEANUPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// On a short-lived thread, waits for the process behind `pidfd` (already sent SIGKILL) to
/// end and reaps it — without a time limit, since giving up would leave a zombie — and then
/// runs `then` (removing its cgroup, which must be empty first).
pub(crate) fn clean_up_in_background(pidfd: Option<OwnedFd>, then: impl FnOnce() + Send + 'static) {
    in_background(move || {
        if let Some(pidfd) = &pidfd {
            sys::reap_pidfd_blocking(pidfd);
        }
        then();
    });
}

/// Runs `job` on a short-lived thread, counted among the background clean-ups that
/// [`crate::Supervisor::close`] waits for.
fn in_background(job: impl FnOnce() + Send + 'static) {
    use std::sync::atomic::Ordering;
    BACKGROUND_CLEANUPS.fetch_add(1, Ordering::SeqCst);
    let job = move || {
        job();
        BACKGROUND_CLEANUPS.fetch_sub(1, Ordering::SeqCst);
        SETTLED.notify_waiters();
    };
    if std::thread::Builder::new()
        .name("airlock-reaper".into())
        .spawn(job)
        .is_err()
    {
        BACKGROUND_CLEANUPS.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!("cannot start a reaper thread; a worker may stay a zombie");
    }
}

/// How many background clean-ups (of workers dropped midway, and spawn requests the
/// spawner has not answered yet) are still running in this process;
/// [`crate::Supervisor::close`] waits for them.
pub(crate) fn background_cleanups() -> usize {
    BACKGROUND_CLEANUPS.load(std::sync::atomic::Ordering::SeqCst)
}

/// Waits (asynchronously) until a spawned child has exec'd the worker, or returns the step
/// that failed before exec. On failure the child is exiting; its owner reaps it.
pub async fn await_exec(report: OwnedFd) -> Result<(), SpawnError> {
    use tokio::io::AsyncReadExt;
    let parent = |source| SpawnError::Parent {
        operation: "wait for the worker's exec",
        source,
    };
    let mut reader = tokio::net::unix::pipe::Receiver::from_owned_fd(report).map_err(parent)?;
    let mut report = [0u8; 5];
    let mut got = 0;
    while got < report.len() {
        match reader.read(&mut report[got..]).await {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(parent(e)),
        }
    }
    if got < report.len() {
        // EOF: the close-on-exec write end closed at exec.
        return Ok(());
    }
    let step = CHILD_STEPS
        .get(usize::from(report[0]))
        .copied()
        .unwrap_or("unknown");
    let errno = i32::from_ne_bytes([report[1], report[2], report[3], report[4]]);
    Err(SpawnError::Child {
        step,
        source: io::Error::from_raw_os_error(errno),
    })
}

type Reply = tokio::sync::oneshot::Sender<Result<Spawned, SpawnError>>;

/// A spawn request the spawner thread has been given: await it for the worker, or give it
/// up with [`PendingSpawn::abandon`]. The worker may be cloned into its cgroup after the
/// caller stopped waiting, so whatever the caller set up for it (the cgroup) must outlive
/// that worker: `abandon` runs the caller's clean-up only once the worker, if one was
/// made, is killed and reaped. (Removing the cgroup at once raced the clone: under qemu's
/// emulation a worker cloned 100 ms later kept its cgroup busy past rmdir's retries.)
#[derive(Debug)]
pub struct PendingSpawn {
    answer: tokio::sync::oneshot::Receiver<Result<Spawned, SpawnError>>,
    abandoned: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl std::future::Future for PendingSpawn {
    type Output = Result<Spawned, SpawnError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.answer)
            .poll(cx)
            .map(|answer| answer.unwrap_or(Err(SpawnError::SpawnerGone)))
    }
}

impl PendingSpawn {
    /// Gives the spawn up: the spawner skips it if it has not started it yet (so calls
    /// given up in a burst do not each cost a worker's clone and hold its descriptors
    /// meanwhile); on a background thread, waits for the spawner's answer, kills and reaps
    /// the worker it made (if any), then runs `then`.
    pub fn abandon(self, then: impl FnOnce() + Send + 'static) {
        self.abandoned
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let answer = self.answer;
        in_background(move || {
            if let Ok(Ok(spawned)) = answer.blocking_recv()
                && let Some(pidfd) = spawned.child.into_pidfd()
            {
                let _ = sys::signal_pidfd(&pidfd, libc::SIGKILL);
                sys::reap_pidfd_blocking(&pidfd);
            }
            then();
        });
    }
}

/// A spawn request on its way through the spawner, counted among the background clean-ups
/// until its reply has been sent or dropped. A caller that gives up on a call while the
/// spawner is still cloning its worker no longer counts as an active call; without this,
/// `close` could return before that worker exists, and so before its unread reply's
/// [`ChildProcess`] is dropped, which kills and reaps it (seen once in the 6.12 VM: one
/// process left after `close` in the abandon test).
#[derive(Debug)]
struct SpawnInFlight {
    /// Set by [`PendingSpawn::abandon`]: a request given up before its turn is not cloned.
    abandoned: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SpawnInFlight {
    fn enter(abandoned: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Self {
        BACKGROUND_CLEANUPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self { abandoned }
    }

    fn is_abandoned(&self) -> bool {
        self.abandoned.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for SpawnInFlight {
    fn drop(&mut self) {
        BACKGROUND_CLEANUPS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        SETTLED.notify_waiters();
    }
}

/// Handle to the spawner threads. Clones share them; when the last clone is dropped the
/// threads are told to stop and joined, so the sealed worker image they hold is closed by
/// the time the supervisor is gone (the soak test counts our descriptors).
#[derive(Debug, Clone)]
pub struct Spawner {
    inner: std::sync::Arc<SpawnerThreads>,
}

/// One thread in the supervisor's network namespace (fresh-namespace and host-network
/// workers), and optionally one that moved itself into a new, empty network namespace whose
/// workers, cloned without CLONE_NEWNET, all share it. Two threads rather than one that
/// switches with setns: a thread that failed to switch back would clone workers into the
/// wrong namespace; a thread that never switches cannot.
#[derive(Debug)]
struct SpawnerThreads {
    own: SpawnerThread,
    shared_network: Option<SpawnerThread>,
    /// What a template's spawner thread needs too.
    image: std::sync::Arc<WorkerImage>,
    mapping: IdMapping,
    extra_args: std::sync::Arc<Vec<String>>,
}

/// The namespaces a spawner thread moves itself into when it starts, and never leaves.
#[derive(Debug)]
enum ThreadNamespaces {
    /// The supervisor's own.
    Own,
    /// A new, empty network namespace (needs CAP_SYS_ADMIN).
    NewNetwork,
    /// The mount namespace (with `network`, also the network namespace) of the process
    /// behind this pidfd: a root template's holder (see [`Spawner::start_template`]).
    Template { holder: OwnedFd, network: bool },
}

/// A spawner thread that lives in a root template's mount namespace: every worker it
/// clones gets a copy of that namespace, whose root is the template's. Dropped with the
/// last worker it started (each keeps an `Arc` of it), since a worker's parent-death signal
/// follows the thread that cloned it.
#[derive(Debug)]
pub struct TemplateSpawner {
    thread: SpawnerThread,
}

impl TemplateSpawner {
    /// Starts one worker in a copy of the template's mount namespace.
    pub fn submit(&self, request: SpawnRequest) -> Result<PendingSpawn, SpawnError> {
        self.thread.submit(request)
    }
}

#[derive(Debug)]
struct SpawnerThread {
    requests: Option<mpsc::Sender<(SpawnRequest, Reply, SpawnInFlight)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for SpawnerThread {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop after the spawn in progress, if any.
        self.requests = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::warn!("a spawner thread panicked");
        }
    }
}

/// The fd number the worker's socket gets in the child: above stdio, predictable.
const WORKER_SOCKET_ARG_NAME: &str = "__airlock_worker";

impl SpawnerThread {
    /// Starts a spawner thread, which first moves itself into `namespaces` and fails if it
    /// cannot.
    fn start(
        name: &str,
        image: std::sync::Arc<WorkerImage>,
        mapping: IdMapping,
        extra_args: std::sync::Arc<Vec<String>>,
        namespaces: ThreadNamespaces,
    ) -> Result<Self, SpawnError> {
        let (requests, receiver) = mpsc::channel::<(SpawnRequest, Reply, SpawnInFlight)>();
        let (started, is_started) = mpsc::sync_channel::<io::Result<()>>(1);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // The host's /proc, opened before any namespace is entered: in a template's
                // mount namespace `/proc` is the template's, where the workers' pids are not.
                let entered = sys::block_all_signals_in_this_thread()
                    .and_then(|()| sys::open_proc_dir())
                    .and_then(|proc_dir| {
                        match namespaces {
                            ThreadNamespaces::Own => Ok(()),
                            ThreadNamespaces::NewNetwork => sys::unshare_network_namespace(),
                            ThreadNamespaces::Template { holder, network } => {
                                sys::enter_mount_namespace_of(&holder, network)
                            }
                        }
                        .map(|()| proc_dir)
                    });
                let proc_dir = match entered {
                    Ok(proc_dir) => {
                        let _ = started.send(Ok(()));
                        proc_dir
                    }
                    Err(error) => {
                        let _ = started.send(Err(error));
                        return;
                    }
                };
                let mut children = ChildrenInFlight::default();
                loop {
                    // While children are between clone and exec, wake up now and then to
                    // take back the memory of those that are done.
                    let next = if children.running.is_empty() {
                        receiver
                            .recv()
                            .map_err(|_| mpsc::RecvTimeoutError::Disconnected)
                    } else {
                        receiver.recv_timeout(std::time::Duration::from_millis(1))
                    };
                    match next {
                        Ok((request, reply, in_flight)) if in_flight.is_abandoned() => {
                            // Given up before its turn: nothing to clone. The dropped reply
                            // tells the waiting clean-up so; the request's descriptors close.
                            drop((request, reply, in_flight));
                        }
                        Ok((request, reply, in_flight)) => {
                            let spawned = spawn_worker(
                                &image,
                                mapping,
                                &extra_args,
                                &proc_dir,
                                request,
                                &mut children,
                            );
                            // If the caller gave up while we were spawning, the reply is
                            // dropped here and its ChildProcess kills and reaps the worker
                            // (counted as a clean-up of its own before `in_flight` ends).
                            drop(reply.send(spawned));
                            drop(in_flight);
                        }
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                    children.collect();
                }
                children.finish_all();
            })
            .map_err(|source| SpawnError::Parent {
                operation: "start a spawner thread",
                source,
            })?;
        let mut handle = Self {
            requests: Some(requests),
            thread: Some(thread),
        };
        match is_started.recv() {
            Ok(Ok(())) => Ok(handle),
            Ok(Err(source)) => {
                drop(handle);
                Err(SpawnError::Parent {
                    operation: "enter the spawner thread's namespaces",
                    source,
                })
            }
            Err(_) => {
                handle.requests = None;
                Err(SpawnError::SpawnerGone)
            }
        }
    }

    fn submit(&self, request: SpawnRequest) -> Result<PendingSpawn, SpawnError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let abandoned = std::sync::Arc::default();
        self.requests
            .as_ref()
            .ok_or(SpawnError::SpawnerGone)?
            .send((
                request,
                reply,
                SpawnInFlight::enter(std::sync::Arc::clone(&abandoned)),
            ))
            .map_err(|_| SpawnError::SpawnerGone)?;
        Ok(PendingSpawn { answer, abandoned })
    }
}

impl Spawner {
    /// Starts the spawner thread(s). `extra_args` are appended to every worker's argv. With
    /// `share_network_namespace`, a second thread makes the empty network namespace that
    /// [`WorkerNetwork::Shared`] workers share; where that is not permitted (an unprivileged
    /// supervisor) there is none and [`Spawner::shares_network_namespace`] says so.
    pub fn start(
        image: WorkerImage,
        mapping: IdMapping,
        extra_args: Vec<String>,
        share_network_namespace: bool,
    ) -> Result<Self, SpawnError> {
        let image = std::sync::Arc::new(image);
        let extra_args = std::sync::Arc::new(extra_args);
        let own = SpawnerThread::start(
            "airlock-spawner",
            std::sync::Arc::clone(&image),
            mapping,
            std::sync::Arc::clone(&extra_args),
            ThreadNamespaces::Own,
        )?;
        let shared_network = if share_network_namespace {
            match SpawnerThread::start(
                "airlock-spawner-net",
                std::sync::Arc::clone(&image),
                mapping,
                std::sync::Arc::clone(&extra_args),
                ThreadNamespaces::NewNetwork,
            ) {
                Ok(thread) => Some(thread),
                Err(error) => {
                    tracing::debug!(%error, "no shared network namespace: every worker gets its own");
                    None
                }
            }
        } else {
            None
        };
        Ok(Self {
            inner: std::sync::Arc::new(SpawnerThreads {
                own,
                shared_network,
                image,
                mapping,
                extra_args,
            }),
        })
    }

    /// Starts a spawner thread in the mount namespace of `holder` (a pidfd), a worker that
    /// built a profile's read-only root and waits; with [`WorkerNetwork::Shared`] also in
    /// its network namespace (the holder was spawned into the shared one). The thread
    /// enters both for good before it returns, so the holder may then be killed: the
    /// thread keeps the namespace. Needs CAP_SYS_ADMIN and CAP_SYS_CHROOT in the
    /// supervisor's user namespace (`setns` on a pidfd, Linux 5.8): an unprivileged
    /// supervisor gets an error here and builds every worker's root.
    pub fn start_template(
        &self,
        holder: &OwnedFd,
        network: WorkerNetwork,
    ) -> Result<TemplateSpawner, SpawnError> {
        let holder = holder.try_clone().map_err(|source| SpawnError::Parent {
            operation: "copy the template holder's pidfd",
            source,
        })?;
        let inner = &self.inner;
        let thread = SpawnerThread::start(
            "airlock-spawner-tpl",
            std::sync::Arc::clone(&inner.image),
            inner.mapping,
            std::sync::Arc::clone(&inner.extra_args),
            ThreadNamespaces::Template {
                holder,
                network: network == WorkerNetwork::Shared,
            },
        )?;
        Ok(TemplateSpawner { thread })
    }

    /// Whether [`WorkerNetwork::Shared`] is available.
    pub fn shares_network_namespace(&self) -> bool {
        self.inner.shared_network.is_some()
    }

    /// Hands the spawner thread one worker to start.
    pub fn submit(&self, request: SpawnRequest) -> Result<PendingSpawn, SpawnError> {
        match request.network {
            WorkerNetwork::Shared => match &self.inner.shared_network {
                Some(thread) => thread.submit(request),
                None => Err(SpawnError::Parent {
                    operation: "use the shared network namespace",
                    source: io::Error::from(io::ErrorKind::Unsupported),
                }),
            },
            WorkerNetwork::Fresh | WorkerNetwork::Host => self.inner.own.submit(request),
        }
    }
}

/// Children of one spawner thread that may still run on memory it lent them (CLONE_VM), and
/// stacks to lend the next ones.
#[derive(Debug, Default)]
struct ChildrenInFlight {
    running: Vec<InFlightChild>,
    spare_stacks: Vec<ChildStack>,
}

/// Stacks kept for reuse: unmapping one in a multi-threaded process costs a TLB shootdown.
const SPARE_STACKS: usize = 8;

impl ChildrenInFlight {
    fn stack(&mut self) -> io::Result<ChildStack> {
        match self.spare_stacks.pop() {
            Some(stack) => Ok(stack),
            None => ChildStack::new(),
        }
    }

    /// Takes back the memory of every child that has exec'd or exited.
    fn collect(&mut self) {
        let (gone, running): (Vec<_>, Vec<_>) =
            self.running.drain(..).partition(InFlightChild::is_gone);
        self.running = running;
        for child in gone {
            if let Some(stack) = child.finish()
                && self.spare_stacks.len() < SPARE_STACKS
            {
                self.spare_stacks.push(stack);
            }
        }
    }

    /// Waits for every child to exec or exit (each is past its uid-map handshake or was told
    /// to give up by the closed pipe, so this is short).
    fn finish_all(self) {
        for child in self.running {
            drop(child.finish());
        }
    }
}

fn write_proc_file(
    proc_dir: &OwnedFd,
    pid: i32,
    file: &'static str,
    contents: &str,
) -> Result<(), SpawnError> {
    sys::open_for_writing_at(proc_dir, &format!("{pid}/{file}"))
        .map(File::from)
        .and_then(|mut f| f.write_all(contents.as_bytes()))
        .map_err(|source| SpawnError::IdMap { file, pid, source })
}

/// Runs on the spawner thread: clone, map ids, release the child, learn whether it exec'd.
fn spawn_worker(
    image: &WorkerImage,
    mapping: IdMapping,
    extra_args: &[String],
    proc_dir: &OwnedFd,
    request: SpawnRequest,
    children: &mut ChildrenInFlight,
) -> Result<Spawned, SpawnError> {
    let parent = |operation| move |source| SpawnError::Parent { operation, source };
    let (supervisor_end, worker_end) =
        sys::stream_socketpair().map_err(parent("create the protocol socketpair"))?;
    let (maps_read, maps_write) =
        sys::cloexec_pipe().map_err(parent("create the handshake pipe"))?;
    let (report_read, report_write) =
        sys::cloexec_pipe().map_err(parent("create the report pipe"))?;

    let argv = [
        CString::new("airlock-worker"),
        CString::new(WORKER_SOCKET_ARG_NAME),
        CString::new(worker_end.as_raw_fd().to_string()),
    ]
    .into_iter()
    .chain(extra_args.iter().map(|a| CString::new(a.as_str())))
    .collect::<Result<Vec<_>, _>>()
    .map_err(|e| SpawnError::Parent {
        operation: "build the worker argv",
        source: io::Error::other(e),
    })?;
    let memory = ChildMemory::new(
        image.raw(),
        argv,
        request
            .join_cgroups
            .iter()
            .map(AsRawFd::as_raw_fd)
            .collect(),
        (maps_read.as_raw_fd(), maps_write.as_raw_fd()),
        [
            request.stdio[0].as_raw_fd(),
            request.stdio[1].as_raw_fd(),
            request.stdio[2].as_raw_fd(),
        ],
        worker_end.as_raw_fd(),
        report_write.as_raw_fd(),
    );
    let stack = children
        .stack()
        .map_err(parent("map a stack for the worker's child"))?;
    let clone_started = std::time::Instant::now();
    let (cloned, in_flight) = sys::clone_worker(
        memory,
        stack,
        request.cgroup_dir.as_ref().map(AsRawFd::as_raw_fd),
        request.network == WorkerNetwork::Fresh,
    )
    .map_err(|source| SpawnError::Clone { source })?;
    children.running.push(in_flight);
    let pid = cloned.pid;
    let child = ChildProcess {
        pidfd: Some(cloned.pidfd),
    };
    drop(worker_end);
    drop(maps_read);
    drop(report_write);

    // Parent-side half of the handshake: sandbox root is an unprivileged host id; setgroups
    // is denied so the sandbox cannot drop supplementary groups to dodge group-deny ACLs.
    let write = |file, contents: &str| write_proc_file(proc_dir, pid, file, contents);
    let maps = write("setgroups", "deny")
        .and_then(|()| write("uid_map", &format!("0 {} 1\n", mapping.host_uid)))
        .and_then(|()| write("gid_map", &format!("0 {} 1\n", mapping.host_gid)));
    // On failure, dropping `child` kills and reaps the child (still waiting for release).
    maps?;
    let cloned_us = clone_started.elapsed().as_micros() as u64;
    let mut release = File::from(maps_write);
    let _ = release.write_all(&[1]);
    drop(release);

    tracing::debug!(clone_and_maps_us = cloned_us, pid, "worker cloned");
    Ok(Spawned {
        pid,
        child,
        socket: supervisor_end,
        exec_report: report_read,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::io::{Read, Seek, SeekFrom};

    /// How long a test waits for the clean-up before it calls it a hang: a hang guard, not
    /// a speed budget (the suite also runs under qemu's emulation, many times slower).
    const HANG_GUARD: std::time::Duration = std::time::Duration::from_secs(300);

    /// A spawn the caller gave up while a stand-in for the spawner thread has not
    /// answered yet; `/bin/sleep` plays the worker.
    // Reaped through a pidfd (by the clean-up or by the test), not through `Child`.
    #[allow(clippy::zombie_processes)]
    fn abandoned_spawn() -> (Reply, mpsc::Receiver<bool>, i32) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let worker = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(worker.id()).unwrap();
        let (cleaned, cleaned_up) = mpsc::channel();
        PendingSpawn {
            answer,
            abandoned: std::sync::Arc::default(),
        }
        .abandon(move || {
            // Still in /proc: not reaped yet (a zombie is listed until it is).
            let _ = cleaned.send(Path::new(&format!("/proc/{pid}")).exists());
        });
        (reply, cleaned_up, pid)
    }

    #[test]
    fn an_abandoned_spawn_is_cleaned_up_only_once_its_worker_is_killed_and_reaped() {
        let (reply, cleaned_up, pid) = abandoned_spawn();
        // The worker may still be cloned into its cgroup: nothing is removed before then.
        assert!(
            cleaned_up
                .recv_timeout(std::time::Duration::from_millis(300))
                .is_err()
        );
        let (socket, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let (exec_report, _write) = nix::unistd::pipe().unwrap();
        let spawned = Spawned {
            pid,
            child: ChildProcess {
                pidfd: Some(sys::pidfd_open(pid).unwrap()),
            },
            socket: socket.into(),
            exec_report,
        };
        assert!(reply.send(Ok(spawned)).is_ok());
        let worker_still_there = cleaned_up.recv_timeout(HANG_GUARD).unwrap();
        assert!(
            !worker_still_there,
            "cleaned up before the worker was reaped"
        );
    }

    #[test]
    fn an_abandoned_spawn_the_spawner_never_answers_is_cleaned_up_when_the_reply_is_dropped() {
        let (reply, cleaned_up, pid) = abandoned_spawn();
        drop(reply);
        // No worker was handed over, so the stand-in is not the clean-up's to end.
        assert!(cleaned_up.recv_timeout(HANG_GUARD).unwrap());
        let pidfd = sys::pidfd_open(pid).unwrap();
        sys::signal_pidfd(&pidfd, libc::SIGKILL).unwrap();
        sys::reap_pidfd_blocking(&pidfd);
    }

    /// Lives in the test binary's read-only data, like the CLI's embedded worker.
    static EMBEDDED: &[u8] = include_bytes!("spawn.rs");

    #[test]
    fn an_image_in_the_executable_is_copied_from_the_file_byte_for_byte() {
        let mut target = File::from(sys::create_executable_memfd(c"test").unwrap());
        copy_from_own_executable(EMBEDDED, &mut target).unwrap();
        target.seek(SeekFrom::Start(0)).unwrap();
        let mut copied = Vec::new();
        target.read_to_end(&mut copied).unwrap();
        assert_eq!(copied, EMBEDDED);
    }

    #[test]
    fn bytes_outside_the_executable_are_refused_for_a_plain_write() {
        let heap = EMBEDDED.to_vec();
        let mut target = File::from(sys::create_executable_memfd(c"test").unwrap());
        assert!(copy_from_own_executable(&heap, &mut target).is_err());
    }

    #[test]
    fn a_maps_line_gives_the_offset_only_for_the_right_inode_and_range() {
        let line = "5000-9000 r--p 00002000 fe:00 42    /usr/bin/airlock";
        assert_eq!(executable_offset(line, 0x6000, 0x7000, 42), Some(0x3000));
        assert_eq!(executable_offset(line, 0x6000, 0x7000, 43), None);
        assert_eq!(executable_offset(line, 0x8000, 0x9001, 42), None);
        assert_eq!(executable_offset("garbage", 0, 1, 42), None);
    }
}
