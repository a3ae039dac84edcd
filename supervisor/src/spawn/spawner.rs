//! The spawner threads, and the clone of one worker: fresh namespaces, uid/gid maps, the
//! release that lets it exec.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc;

use super::netns::{LentNamespace, NamespaceShelf};
use super::{
    ChildProcess, IdMapping, NamespaceCounts, PendingSpawn, Reply, SpawnError, SpawnInFlight,
    SpawnRequest, Spawned, WorkerImage, WorkerNetwork,
};
use crate::sys::{self, ChildMemory, ChildSlots, ChildStack, InFlightChild};

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
    shelf: std::sync::Arc<NamespaceShelf>,
    /// Slots for template threads, reserved with the others.
    spare_slots: std::sync::Arc<SpareSlots>,
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
        shelf: std::sync::Arc<NamespaceShelf>,
        spares: Option<std::sync::Arc<SpareSlots>>,
    ) -> Result<Self, SpawnError> {
        let (requests, receiver) = mpsc::channel::<(SpawnRequest, Reply, SpawnInFlight)>();
        let (started, is_started) = mpsc::sync_channel::<io::Result<()>>(1);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // The host's /proc, opened before any namespace is entered: in a template's
                // mount namespace `/proc` is the template's, where the workers' pids are not.
                // The slots too (their placeholder is the host's /dev/null), as early as
                // possible, while the numbers are low.
                let reserved = match spares.as_ref().and_then(|spares| spares.take()) {
                    Some(slots) => Ok(slots),
                    None => ChildSlots::reserve(),
                };
                let mut slots = match reserved {
                    Ok(slots) => slots,
                    Err(error) => {
                        let _ = started.send(Err(error));
                        return;
                    }
                };
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
                let mut network = ThreadNetwork {
                    // Without it the thread cannot come back from a recycled namespace, so
                    // it never enters one.
                    home: sys::open_thread_network_namespace(&proc_dir).ok(),
                    away: false,
                    shelf,
                };
                network.make_one_ahead(&proc_dir);
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
                            let program = Program {
                                image: &image,
                                mapping,
                                extra_args: &extra_args,
                            };
                            let spawned = spawn_worker(
                                &program,
                                &proc_dir,
                                request,
                                &mut children,
                                &mut slots,
                                &mut network,
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
                if let Some(spares) = spares {
                    spares.give_back(slots);
                }
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
    /// supervisor) there is none and [`Spawner::shares_network_namespace`] says so. A
    /// `one_shot` spawner (one call, no pool) reserves no slots for template threads.
    pub fn start(
        image: WorkerImage,
        mapping: IdMapping,
        extra_args: Vec<String>,
        share_network_namespace: bool,
        one_shot: bool,
    ) -> Result<Self, SpawnError> {
        let image = std::sync::Arc::new(image);
        let extra_args = std::sync::Arc::new(extra_args);
        let shelf = std::sync::Arc::new(if one_shot {
            NamespaceShelf::making_one_ahead()
        } else {
            NamespaceShelf::default()
        });
        let own = SpawnerThread::start(
            "airlock-spawner",
            std::sync::Arc::clone(&image),
            mapping,
            std::sync::Arc::clone(&extra_args),
            ThreadNamespaces::Own,
            std::sync::Arc::clone(&shelf),
            None,
        )?;
        let shared_network = if share_network_namespace {
            match SpawnerThread::start(
                "airlock-spawner-net",
                std::sync::Arc::clone(&image),
                mapping,
                std::sync::Arc::clone(&extra_args),
                ThreadNamespaces::NewNetwork,
                std::sync::Arc::clone(&shelf),
                None,
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
        // Template threads start later, when a busy daemon may hold thousands of
        // descriptors: their slots are reserved now, while the numbers are low.
        let spare_slots = std::sync::Arc::new(if one_shot {
            SpareSlots::none()
        } else {
            SpareSlots::reserve()
        });
        Ok(Self {
            inner: std::sync::Arc::new(SpawnerThreads {
                own,
                shared_network,
                image,
                shelf,
                spare_slots,
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
            std::sync::Arc::clone(&inner.shelf),
            Some(std::sync::Arc::clone(&inner.spare_slots)),
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
            WorkerNetwork::Fresh | WorkerNetwork::Recycled | WorkerNetwork::Host => {
                self.inner.own.submit(request)
            }
        }
    }

    /// What the shelf of recycled network namespaces did so far.
    pub fn network_namespace_counts(&self) -> NamespaceCounts {
        self.inner.shelf.counts()
    }
}

/// Slot sets reserved when the supervisor starts, for the template threads started later
/// (one per profile with a root template; a thread whose set is gone reserves its own).
#[derive(Debug)]
struct SpareSlots(std::sync::Mutex<Vec<ChildSlots>>);

/// Template threads that get low slots; more are rare (a policy of many pooled profiles).
const SPARE_SLOT_SETS: usize = 4;

impl SpareSlots {
    fn reserve() -> Self {
        Self(std::sync::Mutex::new(
            (0..SPARE_SLOT_SETS)
                .map_while(|_| ChildSlots::reserve().ok())
                .collect(),
        ))
    }

    fn none() -> Self {
        Self(std::sync::Mutex::new(Vec::new()))
    }

    fn take(&self) -> Option<ChildSlots> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop()
    }

    /// Keeps an ended thread's set for the next template thread. Only an empty one: a set
    /// still holding a lent descriptor is dropped with it.
    fn give_back(&self, slots: ChildSlots) {
        if slots.is_empty() {
            let mut spares = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if spares.len() < SPARE_SLOT_SETS {
                spares.push(slots);
            }
        }
    }
}

/// The network namespace a spawner thread is in, between clones.
#[derive(Debug)]
struct ThreadNetwork {
    /// The one it started in (the supervisor's, or a template's shared one).
    home: Option<OwnedFd>,
    /// Whether it may have left `home` (for a recycled namespace).
    away: bool,
    shelf: std::sync::Arc<NamespaceShelf>,
}

impl ThreadNetwork {
    /// Puts the thread where a worker of `network` must be cloned from. Returns whether
    /// clone must make a fresh namespace, and the recycled namespace lent to the worker.
    fn prepare(
        &mut self,
        network: WorkerNetwork,
        proc_dir: &OwnedFd,
    ) -> Result<(bool, Option<LentNamespace>), SpawnError> {
        match network {
            WorkerNetwork::Fresh => Ok((true, None)),
            WorkerNetwork::Recycled if self.home.is_some() => {
                // Cloned without CLONE_NEWNET only into a namespace entered just now for
                // this worker; on any failure a fresh one. Where nothing moved the thread
                // (an unprivileged supervisor), it has no way back to ask for, nor needs one.
                let mut moved = false;
                let entered = self.shelf.enter_one(proc_dir, &mut moved);
                self.away |= moved;
                Ok(match entered {
                    Some(lent) => (false, Some(lent)),
                    None => (true, None),
                })
            }
            WorkerNetwork::Recycled => Ok((true, None)),
            WorkerNetwork::Host | WorkerNetwork::Shared => {
                self.go_home()?;
                Ok((false, None))
            }
        }
    }

    /// Makes an idle namespace for the shelf now if it asks for one ahead (a one-shot
    /// supervisor: its worker then finds it ready), and comes back home.
    fn make_one_ahead(&mut self, proc_dir: &OwnedFd) {
        if self.home.is_none() || !self.shelf.take_one_ahead() {
            return;
        }
        match sys::unshare_network_namespace() {
            Ok(()) => {
                self.away = true;
                if let Ok(namespace) = sys::open_thread_network_namespace(proc_dir) {
                    self.shelf.put_fresh(namespace);
                }
            }
            Err(error) => self.shelf.note_unavailable(&error),
        }
        // A failure leaves `away` set: the next worker that needs home fails to spawn
        // rather than being cloned from a namespace it was not meant for.
        if let Err(error) = self.go_home() {
            tracing::debug!(%error, "a spawner thread could not come back to its namespace");
        }
    }

    /// Back to the namespace the thread started in, where it makes the sockets and pipes
    /// of the next worker (a socket belongs to the namespace it was made in: one made in
    /// a recycled namespace would be listed there, and stop its reuse).
    fn go_home(&mut self) -> Result<(), SpawnError> {
        if self.away {
            let home = self.home.as_ref().ok_or(SpawnError::Parent {
                operation: "return to the spawner thread's network namespace",
                source: io::Error::from(io::ErrorKind::NotFound),
            })?;
            sys::enter_network_namespace(home).map_err(|source| SpawnError::Parent {
                operation: "return to the spawner thread's network namespace",
                source,
            })?;
            self.away = false;
        }
        Ok(())
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

/// What every worker of a spawner thread runs, and as whom.
struct Program<'a> {
    image: &'a WorkerImage,
    mapping: IdMapping,
    extra_args: &'a [String],
}

/// Runs on the spawner thread: clone, map ids, release the child, learn whether it exec'd.
fn spawn_worker(
    &Program {
        image,
        mapping,
        extra_args,
    }: &Program<'_>,
    proc_dir: &OwnedFd,
    request: SpawnRequest,
    children: &mut ChildrenInFlight,
    slots: &mut ChildSlots,
    network: &mut ThreadNetwork,
) -> Result<Spawned, SpawnError> {
    let parent = |operation| move |source| SpawnError::Parent { operation, source };
    network.go_home()?;
    let (supervisor_end, worker_end) =
        sys::stream_socketpair().map_err(parent("create the protocol socketpair"))?;
    let (maps_read, maps_write) =
        sys::cloexec_pipe().map_err(parent("create the handshake pipe"))?;
    let (report_read, report_write) =
        sys::cloexec_pipe().map_err(parent("create the report pipe"))?;
    let (unshared_read, unshared_write) =
        sys::cloexec_pipe().map_err(parent("create the unshare pipe"))?;

    // Every descriptor the child needs goes into a slot; until the child has its own table
    // the slots hold them, so from here on every path empties the slots only after the
    // child is done with the shared table.
    let cloned = lend_to_slots(
        slots,
        image,
        &request,
        [&worker_end, &maps_read, &report_write, &unshared_write],
        extra_args,
    )
    .and_then(|memory| {
        let stack = children
            .stack()
            .map_err(parent("map a stack for the worker's child"))?;
        let clone_started = std::time::Instant::now();
        let (new_network, lent_network) = network.prepare(request.network, proc_dir)?;
        let cloned = sys::clone_worker(
            memory,
            stack,
            slots,
            request.cgroup_dir.as_ref().map(AsRawFd::as_raw_fd),
            new_network,
        );
        // Checked again before the next spawn makes anything.
        let _ = network.go_home();
        cloned
            .map(|cloned| (cloned, clone_started, lent_network))
            .map_err(|source| SpawnError::Clone { source })
    });
    let ((cloned, in_flight), clone_started, lent_network) = match cloned {
        Ok(cloned) => cloned,
        Err(error) => {
            // No child: nobody shares the table.
            slots.clear();
            return Err(error);
        }
    };
    children.running.push(in_flight);
    let pid = cloned.pid;
    // The slots hold what the child needs; the supervisor's own copies go now.
    drop((worker_end, maps_read, report_write, unshared_write));

    // Parent-side half of the handshake: sandbox root is an unprivileged host id; setgroups
    // is denied so the sandbox cannot drop supplementary groups to dodge group-deny ACLs.
    // The child unshares its descriptor table meanwhile.
    let write = |file, contents: &str| write_proc_file(proc_dir, pid, file, contents);
    let maps = write("setgroups", "deny")
        .and_then(|()| write("uid_map", &format!("0 {} 1\n", mapping.host_uid)))
        .and_then(|()| write("gid_map", &format!("0 {} 1\n", mapping.host_gid)));
    let unshared = sys::await_unshared(&unshared_read, &cloned.pidfd);
    if unshared.is_ok() {
        slots.clear();
    }
    let child = ChildProcess {
        pidfd: Some(cloned.pidfd),
        pid: cloned.pid,
    };
    // On failure, dropping `child` kills and reaps the child (still waiting for release,
    // which never comes: it cannot exec).
    maps?;
    unshared.map_err(parent("wait for the worker's own descriptor table"))?;
    let cloned_us = clone_started.elapsed().as_micros() as u64;
    let mut release = File::from(maps_write);
    let _ = release.write_all(&[1]);
    drop(release);

    tracing::debug!(clone_and_maps_us = cloned_us, pid, "worker cloned");
    Ok(Spawned {
        child,
        socket: supervisor_end,
        exec_report: report_read,
        network: lent_network,
    })
}

/// Lends the image, the request's descriptors and `[socket, maps_read, report, unshared]`
/// to slots, and prepares the child's memory with their numbers (the worker is told its
/// socket's).
fn lend_to_slots(
    slots: &mut ChildSlots,
    image: &WorkerImage,
    request: &SpawnRequest,
    [socket, maps_read, report, unshared]: [&OwnedFd; 4],
    extra_args: &[String],
) -> Result<Box<ChildMemory>, SpawnError> {
    let mut lend = |fd: &dyn AsRawFd| {
        slots
            .lend(fd.as_raw_fd())
            .map_err(|source| SpawnError::Parent {
                operation: "lend a descriptor to the worker's child",
                source,
            })
    };
    let image = lend(&image.raw())?;
    let join_cgroups = request
        .join_cgroups
        .iter()
        .map(|fd| lend(fd))
        .collect::<Result<Vec<_>, _>>()?;
    let stdio = [
        lend(&request.stdio[0])?,
        lend(&request.stdio[1])?,
        lend(&request.stdio[2])?,
    ];
    let socket = lend(socket)?;
    let maps_written = lend(maps_read)?;
    let report = lend(report)?;
    let unshared = lend(unshared)?;
    let argv = [
        CString::new("airlock-worker"),
        CString::new(WORKER_SOCKET_ARG_NAME),
        CString::new(socket.to_string()),
    ]
    .into_iter()
    .chain(extra_args.iter().map(|a| CString::new(a.as_str())))
    .collect::<Result<Vec<_>, _>>()
    .map_err(|e| SpawnError::Parent {
        operation: "build the worker argv",
        source: io::Error::other(e),
    })?;
    Ok(ChildMemory::new(
        image,
        argv,
        join_cgroups,
        maps_written,
        stdio,
        socket,
        report,
        unshared,
    ))
}
