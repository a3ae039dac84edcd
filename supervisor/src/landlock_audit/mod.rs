//! Landlock's refusals, read from the kernel's audit and attributed to the calls whose tools
//! caused them (opt-in: `SupervisorOptions::landlock_audit`).
//!
//! Landlock (ABI 7, Linux 6.15) logs a denial as an `AUDIT_LANDLOCK_ACCESS` record naming
//! the domain that refused it, followed, the first time that domain refuses anything, by an
//! `AUDIT_LANDLOCK_DOMAIN` record naming the host pid of the process that created it. A
//! worker restricts itself with `LOG_NEW_EXEC_ON` (its tool is a new exec) and
//! `LOG_SUBDOMAINS_OFF` (domains a tool nests log nothing), so every logged domain among
//! a worker's processes is the worker's own, created by the worker: its pid, which the
//! supervisor knows from the spawn, names the call.
//!
//! One reader thread per supervisor joins the audit's read-log multicast group and reads
//! every record in the kernel's queue order. A call's records are complete once the reader
//! sees a marker the supervisor logged after the call's tool was gone: a denied syscall
//! queues its records before it returns, so they are ahead of the marker in the queue.
//!
//! Attribution, against a tool that chooses its paths, floods refusals, or races pid reuse:
//! - a worker's slot takes the first domain whose creator is its pid, nothing else;
//! - a slot closes only at its marker, logged once its worker's processes are gone, so
//!   every record of that worker is ahead of it; a later worker given the same pid while an
//!   older slot for it is still open reports `unavailable` (its records could land either
//!   way) rather than guess;
//! - everything is bounded: pending records, domains, slots' lists; whatever is dropped
//!   makes the calls it could belong to `unavailable`, and so does any record the kernel
//!   itself dropped (its `lost` counter).

mod record;

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use record::Record;

use crate::result::{Denial, DenialLayer};
use crate::sys::audit as netlink;

/// Most distinct refusals one call lists; past it they are counted as `other`.
const MAX_ENTRIES: usize = 64;
/// Refusals whose domain is not known yet (its domain record follows within the same
/// syscall, so only a handful wait at a time).
const MAX_PENDING: usize = 256;
/// Domains remembered, ours and others' (whose records are dropped on sight).
const MAX_DOMAINS: usize = 4096;
/// The generous bound on the wait for a marker: reached only when the audit stopped
/// delivering (disabled meanwhile, records dropped); then the reader gives up for good.
const MARKER_WAIT: Duration = Duration::from_secs(5);

/// Why Landlock's refusals cannot be read from the audit.
#[derive(Debug, thiserror::Error)]
pub enum LandlockAuditError {
    /// The kernel has no Landlock, or an ABI without audit logging of a new exec.
    #[error("Landlock ABI {0} cannot log a tool's refusals (needs ABI 7, Linux 6.15)")]
    AbiTooOld(i64),
    /// Querying the audit's status failed (no `CONFIG_AUDIT`, not in the initial user and
    /// pid namespaces, or no `CAP_AUDIT_CONTROL`).
    #[error("cannot query the kernel's audit: {0}")]
    Status(io::Error),
    /// Audit is off (`audit=0`, or `auditctl -e 0`).
    #[error("the kernel's audit is disabled (auditctl -e 1 enables it)")]
    Disabled,
    /// Joining the read-log group failed (needs `CAP_AUDIT_READ`).
    #[error("cannot join the audit's read-log group (needs CAP_AUDIT_READ): {0}")]
    ReadLog(io::Error),
    /// Logging a marker failed (needs `CAP_AUDIT_WRITE`).
    #[error("cannot log an audit record (needs CAP_AUDIT_WRITE): {0}")]
    Marker(io::Error),
    /// The reader thread could not start.
    #[error("cannot start the audit reader: {0}")]
    Reader(io::Error),
    /// The reader did not see the probe record the supervisor logged at start.
    #[error("the audit reader did not see its own probe record")]
    ProbeUnseen,
}

/// The distinct refusals of one call, counted and bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Refusals {
    counts: HashMap<(String, String), u64>,
    other: u64,
}

impl Refusals {
    fn record(&mut self, object: String, blockers: String) {
        let key = (object, blockers);
        if let Some(count) = self.counts.get_mut(&key) {
            *count = count.saturating_add(1);
        } else if self.counts.len() < MAX_ENTRIES {
            self.counts.insert(key, 1);
        } else {
            self.other = self.other.saturating_add(1);
        }
    }

    /// Most frequent first, then by object; `other` last.
    fn listed(self) -> Vec<Denial> {
        let mut listed: Vec<Denial> = self
            .counts
            .into_iter()
            .map(|((object, blockers), count)| Denial {
                layer: DenialLayer::Landlock,
                object,
                errno: None,
                rule: Some(blockers),
                count,
            })
            .collect();
        listed.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.object.cmp(&b.object)));
        if self.other > 0 {
            listed.push(Denial {
                layer: DenialLayer::Landlock,
                object: "other".into(),
                errno: None,
                rule: None,
                count: self.other,
            });
        }
        listed
    }
}

/// What a closed slot hands its call: the refusals, and whether they are all of them.
#[derive(Debug)]
struct Closed {
    refusals: Refusals,
    complete: bool,
}

/// One worker's records, open until its marker.
#[derive(Debug)]
struct Slot {
    pid: i32,
    domain: Option<u64>,
    refusals: Refusals,
    /// Nothing that could be this worker's was dropped, and no older slot had its pid.
    complete: bool,
    /// Its call's answer; `None` for a worker given up (its marker only closes it).
    done: Option<tokio::sync::oneshot::Sender<Closed>>,
}

/// What a marker closes.
#[derive(Debug)]
enum Waiter {
    Probe(std::sync::mpsc::Sender<()>),
    Slot(u64),
}

/// A set that forgets its oldest members past a bound.
#[derive(Debug, Default)]
struct Bounded {
    order: VecDeque<u64>,
    members: HashSet<u64>,
}

impl Bounded {
    /// Adds `value`; true when an older member had to be forgotten.
    fn insert(&mut self, value: u64) -> bool {
        if !self.members.insert(value) {
            return false;
        }
        self.order.push_back(value);
        if self.order.len() > MAX_DOMAINS {
            if let Some(old) = self.order.pop_front() {
                self.members.remove(&old);
            }
            return true;
        }
        false
    }

    fn contains(&self, value: u64) -> bool {
        self.members.contains(&value)
    }

    fn remove(&mut self, value: u64) {
        if self.members.remove(&value) {
            self.order.retain(|v| *v != value);
        }
    }
}

/// Who gets which record: the reader's state, shared with the calls.
#[derive(Debug, Default)]
struct Registry {
    next_slot: u64,
    slots: HashMap<u64, Slot>,
    /// Open slots by worker pid, oldest first.
    by_pid: HashMap<i32, VecDeque<u64>>,
    /// Domains attributed, to their slot.
    domains: HashMap<u64, u64>,
    /// Domains that are not ours: their records are dropped on sight.
    foreign: Bounded,
    /// Refusals by domains not known yet.
    pending: VecDeque<(u64, String, String)>,
    /// Domains a pending refusal of which was dropped.
    evicted: Bounded,
    marks: HashMap<u64, Waiter>,
    /// This process, the only sender whose markers count.
    our_pid: i32,
}

impl Registry {
    fn register(&mut self, pid: i32, done: tokio::sync::oneshot::Sender<Closed>) -> u64 {
        let id = self.next_slot;
        self.next_slot += 1;
        let queue = self.by_pid.entry(pid).or_default();
        // A worker with the pid of one whose records are still being read: either could
        // own a record naming that pid, so neither says it knows.
        let complete = queue.is_empty();
        for older in queue.iter() {
            if let Some(slot) = self.slots.get_mut(older) {
                slot.complete = false;
            }
        }
        queue.push_back(id);
        self.slots.insert(
            id,
            Slot {
                pid,
                domain: None,
                refusals: Refusals::default(),
                complete,
                done: Some(done),
            },
        );
        id
    }

    /// Something that may have been any open slot's was dropped.
    fn lost(&mut self) {
        for slot in self.slots.values_mut() {
            slot.complete = false;
        }
    }

    fn apply(&mut self, record: Record) {
        match record {
            Record::Access {
                domain,
                blockers,
                object,
            } => {
                if let Some(slot) = self.domains.get(&domain) {
                    if let Some(slot) = self.slots.get_mut(slot) {
                        slot.refusals.record(object, blockers);
                    }
                } else if !self.foreign.contains(domain) {
                    self.pending.push_back((domain, blockers, object));
                    if self.pending.len() > MAX_PENDING
                        && let Some((dropped, ..)) = self.pending.pop_front()
                        && self.evicted.insert(dropped)
                    {
                        self.lost();
                    }
                }
            }
            Record::Allocated { domain, pid } => self.allocated(domain, pid),
            Record::Deallocated { domain } => {
                self.foreign.remove(domain);
                self.evicted.remove(domain);
                self.domains.remove(&domain);
            }
            Record::Marker { pid, mark } if pid == self.our_pid => self.marked(mark),
            Record::Marker { .. } => {}
        }
    }

    fn allocated(&mut self, domain: u64, pid: i32) {
        if self.domains.contains_key(&domain) || self.foreign.contains(domain) {
            return;
        }
        let front = self
            .by_pid
            .get(&pid)
            .and_then(|queue| queue.front().copied());
        let slot = front.and_then(|id| self.slots.get_mut(&id).map(|slot| (id, slot)));
        let waiting = std::mem::take(&mut self.pending);
        let (mine, others): (VecDeque<_>, VecDeque<_>) =
            waiting.into_iter().partition(|(d, ..)| *d == domain);
        self.pending = others;
        match slot {
            // A worker creates one domain; anything else naming its pid is not its tool's.
            Some((id, slot)) if slot.domain.is_none() && self.domains.len() < MAX_DOMAINS => {
                slot.domain = Some(domain);
                if self.evicted.contains(domain) {
                    slot.complete = false;
                }
                for (_, blockers, object) in mine {
                    slot.refusals.record(object, blockers);
                }
                self.domains.insert(domain, id);
            }
            Some((_, slot)) => {
                if self.domains.len() >= MAX_DOMAINS {
                    slot.complete = false;
                }
                self.foreign.insert(domain);
            }
            None => {
                self.foreign.insert(domain);
            }
        }
    }

    fn marked(&mut self, mark: u64) {
        match self.marks.remove(&mark) {
            Some(Waiter::Probe(seen)) => {
                let _ = seen.send(());
            }
            Some(Waiter::Slot(id)) => {
                let Some(mut slot) = self.slots.remove(&id) else {
                    return;
                };
                if let Some(queue) = self.by_pid.get_mut(&slot.pid) {
                    queue.retain(|s| *s != id);
                    if queue.is_empty() {
                        self.by_pid.remove(&slot.pid);
                    }
                }
                // Its worker is gone: a stray record of its domain is dropped, never
                // attributed to a later worker.
                if let Some(domain) = slot.domain {
                    self.domains.remove(&domain);
                    self.foreign.insert(domain);
                }
                if let Some(done) = slot.done.take() {
                    let _ = done.send(Closed {
                        refusals: slot.refusals,
                        complete: slot.complete,
                    });
                }
            }
            None => {}
        }
    }
}

/// The supervisor's audit reader and the sockets it logs and asks on.
#[derive(Debug)]
pub(crate) struct LandlockAudit {
    registry: Arc<Mutex<Registry>>,
    /// Unicast requests: the status, markers.
    control: Mutex<OwnedFd>,
    next_seq: AtomicU32,
    next_mark: AtomicU64,
    /// Cleared when the reader stopped or a marker never came: every call after says
    /// `unavailable`.
    alive: Arc<AtomicBool>,
    /// The kernel's lost-record count when it was last asked.
    last_lost: AtomicU32,
    /// Closed when this is dropped: the reader thread ends.
    _stop: OwnedFd,
}

impl LandlockAudit {
    /// Checks the host can do it (Landlock ABI 7, audit on, the read-log group and
    /// markers allowed), starts the reader, and sees a probe record through it.
    pub(crate) fn start() -> Result<Arc<Self>, LandlockAuditError> {
        let abi = crate::sys::landlock_abi_version().unwrap_or(0);
        if abi < 7 {
            return Err(LandlockAuditError::AbiTooOld(abi));
        }
        let control = netlink::audit_socket(false).map_err(LandlockAuditError::Status)?;
        let status = netlink::audit_status(&control, 1).map_err(LandlockAuditError::Status)?;
        if status.enabled == 0 {
            return Err(LandlockAuditError::Disabled);
        }
        let socket = netlink::audit_socket(true).map_err(LandlockAuditError::ReadLog)?;
        let (stop_read, stop_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| LandlockAuditError::Reader(io::Error::from_raw_os_error(e as i32)))?;
        let registry = Arc::new(Mutex::new(Registry {
            our_pid: i32::try_from(std::process::id()).unwrap_or(0),
            ..Registry::default()
        }));
        let alive = Arc::new(AtomicBool::new(true));
        {
            let (registry, alive) = (Arc::clone(&registry), Arc::clone(&alive));
            std::thread::Builder::new()
                .name("airlock-audit".into())
                .spawn(move || read_records(&registry, &socket, &stop_read, &alive))
                .map_err(LandlockAuditError::Reader)?;
        }
        let audit = Arc::new(Self {
            registry,
            control: Mutex::new(control),
            next_seq: AtomicU32::new(2),
            next_mark: AtomicU64::new(1),
            alive,
            last_lost: AtomicU32::new(status.lost),
            _stop: stop_write,
        });
        let (seen, probe) = std::sync::mpsc::channel();
        let mark = audit.next_mark.fetch_add(1, Ordering::Relaxed);
        lock(&audit.registry)
            .marks
            .insert(mark, Waiter::Probe(seen));
        audit
            .log_marker(mark, "probe", true)
            .map_err(LandlockAuditError::Marker)?;
        probe
            .recv_timeout(MARKER_WAIT)
            .map_err(|_| LandlockAuditError::ProbeUnseen)?;
        Ok(audit)
    }

    /// Starts reading the records of the worker `pid`, just spawned (before it is told to
    /// confine itself, so before its domain exists).
    pub(crate) fn register(self: &Arc<Self>, pid: i32) -> AuditRegistration {
        let (done, closed) = tokio::sync::oneshot::channel();
        let slot = lock(&self.registry).register(pid, done);
        AuditRegistration {
            audit: Arc::clone(self),
            slot,
            closed: Some(closed),
            lost_before: self.last_lost.load(Ordering::Relaxed),
            mark: None,
        }
    }

    fn seq(&self) -> u32 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    fn log_marker(&self, mark: u64, call_id: &str, ack: bool) -> io::Result<()> {
        // The call id is the caller's text: only characters that cannot end the record's
        // message or a line of the host's log, and not too many of them.
        let call: String = call_id
            .chars()
            .take(128)
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let text = format!("{}{mark} call={call}", record::MARKER_PREFIX);
        let control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        netlink::log_user_record(&control, self.seq(), &text, ack)
    }

    fn status(&self) -> io::Result<netlink::AuditStatus> {
        let control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        netlink::audit_status(&control, self.seq())
    }

    /// Gives up reading: a marker never came, so which record is whose is no longer known.
    fn give_up(&self, why: &str) {
        if self.alive.swap(false, Ordering::SeqCst) {
            tracing::warn!(
                why,
                "landlock audit: no longer reading; every call's landlock refusals are unavailable"
            );
        }
        let mut registry = lock(&self.registry);
        registry.lost();
        registry.slots.clear();
        registry.by_pid.clear();
        registry.domains.clear();
        registry.marks.clear();
        registry.pending.clear();
    }
}

/// The kernel's Landlock ABI, 0 without Landlock: 7 and later can log a tool's refusals.
pub fn host_landlock_abi() -> i64 {
    crate::sys::landlock_abi_version().unwrap_or(0)
}

/// Whether the kernel's audit is enabled (`airlock doctor`, tests).
pub fn host_audit_enabled() -> io::Result<bool> {
    let control = netlink::audit_socket(false)?;
    Ok(netlink::audit_status(&control, 1)?.enabled != 0)
}

/// Turns the kernel's audit on or off (`CAP_AUDIT_CONTROL`): for tests that need it on for
/// their duration, and put it back as they found it.
pub fn set_host_audit_enabled(enabled: bool) -> io::Result<()> {
    let control = netlink::audit_socket(false)?;
    netlink::set_audit_enabled(&control, 1, u32::from(enabled))
}

fn lock(registry: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    registry.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A worker's place in the reader: dropped before [`AuditRegistration::refusals`], it still
/// logs its marker, so the slot closes in order (drop it only once the worker is gone).
#[derive(Debug)]
pub(crate) struct AuditRegistration {
    audit: Arc<LandlockAudit>,
    slot: u64,
    closed: Option<tokio::sync::oneshot::Receiver<Closed>>,
    lost_before: u32,
    /// The marker logged, when it was.
    mark: Option<u64>,
}

impl AuditRegistration {
    /// Logs the marker that closes this worker's records: call it once every process of
    /// the call's tool is gone (the worker reported, or was killed).
    pub(crate) fn mark(&mut self, call_id: &str) {
        if self.mark.is_some() || !self.audit.alive.load(Ordering::SeqCst) {
            return;
        }
        let mark = self.audit.next_mark.fetch_add(1, Ordering::Relaxed);
        lock(&self.audit.registry)
            .marks
            .insert(mark, Waiter::Slot(self.slot));
        self.mark = Some(mark);
        if let Err(error) = self.audit.log_marker(mark, call_id, false) {
            self.audit.give_up(&format!("cannot log a marker: {error}"));
        }
    }

    /// The call's Landlock refusals, once the reader has read its marker; `None` when they
    /// cannot all be known (then the record says `unavailable`, never a partial list).
    pub(crate) async fn refusals(mut self, call_id: &str) -> Option<Vec<Denial>> {
        self.mark(call_id);
        let closed = self.closed.take()?;
        if !self.audit.alive.load(Ordering::SeqCst) {
            return None;
        }
        // Records the kernel dropped since this worker was registered could be its own.
        let status = self.audit.status();
        let kept_all = match status {
            Ok(status) => {
                self.audit.last_lost.store(status.lost, Ordering::Relaxed);
                status.enabled != 0 && status.lost == self.lost_before
            }
            Err(_) => false,
        };
        match tokio::time::timeout(MARKER_WAIT, closed).await {
            Ok(Ok(closed)) => (kept_all && closed.complete).then(|| closed.refusals.listed()),
            Ok(Err(_)) => None,
            Err(_) => {
                self.audit.give_up("a marker was not read back in time");
                None
            }
        }
    }
}

impl Drop for AuditRegistration {
    fn drop(&mut self) {
        if self.closed.is_some() {
            // Given up (the call was dropped, or this is a pool's or template's holder):
            // its marker still closes the slot in order.
            if let Some(slot) = lock(&self.audit.registry).slots.get_mut(&self.slot) {
                slot.done = None;
            }
            self.mark("-");
        }
    }
}

/// The reader thread: every record of the read-log group, until `stop` closes.
fn read_records(registry: &Mutex<Registry>, socket: &OwnedFd, stop: &OwnedFd, alive: &AtomicBool) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut buf = vec![0u8; netlink::MAX_MESSAGE];
    loop {
        let mut fds = [
            PollFd::new(socket.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return;
        }
        match netlink::receive(socket, &mut buf) {
            Ok((_, true)) => lock(registry).lost(),
            Ok((n, false)) => {
                let mut registry = lock(registry);
                for message in netlink::messages(&buf[..n]) {
                    if let Some(record) = record::parse(message.kind, message.payload) {
                        registry.apply(record);
                    }
                }
            }
            // The socket's buffer overflowed: some records were dropped.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => lock(registry).lost(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    alive.store(false, Ordering::SeqCst);
    lock(registry).lost();
    tracing::warn!("landlock audit: the reader stopped");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn access(domain: u64, object: &str) -> Record {
        Record::Access {
            domain,
            blockers: "fs.write_file".into(),
            object: object.into(),
        }
    }

    fn registry() -> Registry {
        Registry {
            our_pid: 10,
            ..Registry::default()
        }
    }

    fn close(registry: &mut Registry, slot: u64, mark: u64) {
        registry.marks.insert(mark, Waiter::Slot(slot));
        registry.apply(Record::Marker { pid: 10, mark });
    }

    type Receiver = tokio::sync::oneshot::Receiver<Closed>;

    fn open(registry: &mut Registry, pid: i32) -> (u64, Receiver) {
        let (done, closed) = tokio::sync::oneshot::channel();
        (registry.register(pid, done), closed)
    }

    #[test]
    fn a_refusal_goes_to_the_worker_that_created_its_domain_and_no_other() {
        let mut registry = registry();
        let (a, mut a_closed) = open(&mut registry, 100);
        let (b, mut b_closed) = open(&mut registry, 200);
        // The kernel writes the refusal first, then its domain.
        registry.apply(access(0xa, "/etc/x"));
        registry.apply(Record::Allocated {
            domain: 0xa,
            pid: 100,
        });
        registry.apply(access(0xa, "/etc/x"));
        registry.apply(access(0xa, "/etc/y"));
        // A domain of some other process on the host.
        registry.apply(access(0xf, "/secret"));
        registry.apply(Record::Allocated {
            domain: 0xf,
            pid: 999,
        });
        registry.apply(access(0xf, "/secret"));
        close(&mut registry, a, 1);
        close(&mut registry, b, 2);
        let a = a_closed.try_recv().unwrap();
        assert!(a.complete);
        let listed = a.refusals.listed();
        assert_eq!(listed.len(), 2);
        assert_eq!((listed[0].object.as_str(), listed[0].count), ("/etc/x", 2));
        assert_eq!(listed[0].rule.as_deref(), Some("fs.write_file"));
        assert_eq!(listed[0].layer, DenialLayer::Landlock);
        let b = b_closed.try_recv().unwrap();
        assert!(b.complete);
        assert!(b.refusals.listed().is_empty());
        assert!(registry.pending.is_empty());
        assert!(registry.slots.is_empty() && registry.by_pid.is_empty());
    }

    #[test]
    fn a_second_domain_naming_a_workers_pid_is_not_its_tools() {
        let mut registry = registry();
        let (a, mut closed) = open(&mut registry, 100);
        registry.apply(Record::Allocated {
            domain: 1,
            pid: 100,
        });
        registry.apply(Record::Allocated {
            domain: 2,
            pid: 100,
        });
        registry.apply(access(2, "/elsewhere"));
        registry.apply(access(1, "/mine"));
        close(&mut registry, a, 1);
        let listed = closed.try_recv().unwrap().refusals.listed();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].object, "/mine");
    }

    #[test]
    fn a_reused_pid_waits_behind_the_older_slot_and_says_it_cannot_know() {
        let mut registry = registry();
        let (old, mut old_closed) = open(&mut registry, 100);
        // The old worker was reaped and its pid given to a new one before its marker was
        // read: the old worker's late records still go to the old slot.
        let (new, mut new_closed) = open(&mut registry, 100);
        registry.apply(Record::Allocated {
            domain: 1,
            pid: 100,
        });
        registry.apply(access(1, "/old"));
        close(&mut registry, old, 1);
        registry.apply(Record::Allocated {
            domain: 2,
            pid: 100,
        });
        registry.apply(access(2, "/new"));
        // A stray record of the old worker's domain after its marker: dropped.
        registry.apply(access(1, "/old"));
        close(&mut registry, new, 2);
        let old = old_closed.try_recv().unwrap();
        assert!(!old.complete);
        assert_eq!(old.refusals.listed()[0].object, "/old");
        let new = new_closed.try_recv().unwrap();
        assert!(!new.complete);
        let listed = new.refusals.listed();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].object.as_str(), listed[0].count), ("/new", 1));
    }

    #[test]
    fn a_flood_is_bounded_and_what_is_dropped_makes_the_call_incomplete() {
        let mut registry = registry();
        let (a, mut closed) = open(&mut registry, 100);
        // Refusals of a domain whose record has not come, past the pending bound.
        for i in 0..(MAX_PENDING as u64 + 10) {
            registry.apply(access(1000 + i, "/x"));
        }
        assert_eq!(registry.pending.len(), MAX_PENDING);
        registry.apply(Record::Allocated {
            domain: 1000,
            pid: 100,
        });
        // Many distinct objects: listed up to the bound, the rest counted.
        for i in 0..(MAX_ENTRIES + 5) {
            registry.apply(access(1000, &format!("/f{i}")));
        }
        close(&mut registry, a, 1);
        let closed = closed.try_recv().unwrap();
        assert!(!closed.complete);
        let listed = closed.refusals.listed();
        assert_eq!(listed.len(), MAX_ENTRIES + 1);
        assert_eq!(listed.last().unwrap().object, "other");
        assert_eq!(listed.last().unwrap().count, 5);
        // Foreign domains are remembered within their bound.
        for domain in 0..(MAX_DOMAINS as u64 * 2) {
            registry.apply(Record::Allocated {
                domain: 1 << 40 | domain,
                pid: 5,
            });
        }
        assert_eq!(registry.foreign.members.len(), MAX_DOMAINS);
        assert_eq!(registry.foreign.order.len(), MAX_DOMAINS);
    }

    #[test]
    fn markers_of_other_processes_and_unknown_marks_close_nothing() {
        let mut registry = registry();
        let (a, mut closed) = open(&mut registry, 100);
        registry.marks.insert(7, Waiter::Slot(a));
        registry.apply(Record::Marker { pid: 11, mark: 7 });
        registry.apply(Record::Marker { pid: 10, mark: 8 });
        assert!(closed.try_recv().is_err());
        registry.apply(Record::Marker { pid: 10, mark: 7 });
        assert!(closed.try_recv().unwrap().complete);
    }
}
