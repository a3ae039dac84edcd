//! Session workspaces: one set of files an agent works on across many calls.
//!
//! A session is opened (optionally from a copy of a host `base` directory under one of
//! the policy's `[sessions] bases`), filled and read through `put_file`/`get_file`,
//! compared with its base by `changes`, and closed; every call naming it whose profile
//! has a `workspace` sees its files there, read-write, and nothing of any other session.
//! Its id is a capability: 128 bits from the OS random source, never derived from
//! anything a client or a tool can see (its directory has a name of its own).
//!
//! A pooled worker is confined before a call says which session it belongs to, and a
//! mount cannot be added to a confined worker: so each session keeps workers of its own,
//! confined with its workspace ([`workers`], when the sessions are given a supervisor with
//! [`Sessions::keep_workers`]); otherwise its calls take the cold path. A session's profile
//! is built once per (session, profile) and reused by its calls.

mod base;
mod changes;
mod overlay;
mod reserve;
mod storage;
#[cfg(test)]
mod tests;
mod tree;
mod workers;

use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use airlock_policy::CompiledProfile;
use airlock_policy::validate::{SessionPolicy, ToolState};
use serde::Serialize;

use base::{Base, allowed_base};
pub use changes::{Change, ChangeKind};
use storage::{StateDir, Storage};
use workers::SessionWorkers;

use crate::clock::Clock;
use crate::result::{ErrorKind, ToolError, ToolResult};

/// Largest file `get_file` returns, bytes (its answer carries it in base64).
pub const MAX_GET_BYTES: u64 = 1 << 20;

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No open session has this id (never opened, closed, or expired).
    #[error("{op}: no open session has this id")]
    Unknown {
        /// The operation.
        op: &'static str,
    },
    /// `max_sessions` are open.
    #[error("session_open: {max} sessions are open, the policy's max_sessions")]
    Limit {
        /// The policy's bound.
        max: usize,
    },
    /// The workspace is at its size or inode limit.
    #[error("{op}: the workspace is at its size or inode limit")]
    Full {
        /// The operation.
        op: &'static str,
    },
    /// The workspace (or its base) is past what the supervisor walks: more entries, a
    /// longer path or more bytes of paths than it collects in one walk.
    #[error("{op}: {reason}")]
    TooLarge {
        /// The operation.
        op: &'static str,
        /// Which bound it passed.
        reason: String,
    },
    /// A bad argument: a path, a base, a size; or a file that cannot be read as one.
    #[error("{op}: {reason}")]
    Invalid {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The storage failed.
    #[error("{op}: {source}")]
    Storage {
        /// The operation.
        op: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

impl SessionError {
    /// The error kind a client sees.
    pub fn kind(&self) -> &'static str {
        match self {
            SessionError::Unknown { .. } => "session_unknown",
            SessionError::Limit { .. } => "session_limit",
            SessionError::Full { .. } | SessionError::TooLarge { .. } => "workspace_full",
            SessionError::Invalid { .. } => "invalid_request",
            SessionError::Storage { .. } => "sandbox_unavailable",
        }
    }

    fn invalid(op: &'static str, reason: impl Into<String>) -> Self {
        SessionError::Invalid {
            op,
            reason: reason.into(),
        }
    }

    fn storage(op: &'static str) -> impl FnOnce(io::Error) -> Self {
        move |source| SessionError::Storage { op, source }
    }

    fn written(op: &'static str) -> impl FnOnce(tree::WriteError) -> Self {
        move |error| match error {
            tree::WriteError::Full => SessionError::Full { op },
            tree::WriteError::Refused(reason) => SessionError::invalid(op, reason),
            tree::WriteError::Io(source) => SessionError::Storage { op, source },
        }
    }
}

/// What `session_open` answers.
#[derive(Debug, Clone, Serialize)]
pub struct Opened {
    /// The session's id: the capability every later operation names.
    pub session: String,
    /// When it expires unless used before, milliseconds since the Unix epoch.
    pub expires_at: u64,
    /// `overlay`: the base is seen through an overlay (read-only beneath, writes kept in
    /// the session); `copy`: the base was copied into it; `empty`: it started empty.
    pub isolation: &'static str,
    /// Its size limit, bytes.
    pub size: u64,
}

/// The open sessions of one supervisor.
#[derive(Debug)]
pub struct Sessions {
    state: StateDir,
    clock: Arc<dyn Clock>,
    open: Mutex<HashMap<String, Arc<Session>>>,
    /// Opens making their storage now: counted against `max_sessions` with `open`.
    opening: std::sync::atomic::AtomicUsize,
    /// Closed sessions whose files could not all be removed yet (a call still writing in
    /// an unprivileged workspace): every sweep tries again.
    leftovers: Mutex<Vec<Arc<Session>>>,
    /// The id mappings of overlaid bases, kept for the next session.
    mappings: overlay::Mappings,
    /// Ids of ended sessions that had set a plan mode or tool states: a call still naming
    /// one is refused rather than quietly given the daemon-wide settings (which would lift
    /// its plan mode). Bounded: the oldest are forgotten first.
    ended: Mutex<EndedSessions>,
    /// Where sessions' pooled workers come from, if they have any.
    workers: Option<Arc<SessionWorkers>>,
}

/// Most ended sessions remembered (128-bit ids: a few MiB at most).
const MAX_ENDED: usize = 65_536;

#[derive(Debug, Default)]
struct EndedSessions {
    ids: std::collections::HashSet<String>,
    order: std::collections::VecDeque<String>,
}

#[derive(Debug)]
struct Session {
    storage: Storage,
    /// How its workspace holds its base: `overlay`, `copy` or `empty`.
    isolation: &'static str,
    /// The host directory it started from.
    base: Option<Base>,
    inodes: u64,
    /// When it opened: it lives at most the policy's `max_lifetime` from then.
    opened_at: SystemTime,
    state: Mutex<SessionState>,
}

#[derive(Debug)]
struct SessionState {
    last_used: SystemTime,
    /// Calls running in it: it does not expire under them.
    calls: usize,
    /// Each policy profile with this session's workspace added.
    profiles: Vec<(Arc<CompiledProfile>, Arc<CompiledProfile>)>,
    /// Tool states set for this session alone (`set_state` naming it): they win over the
    /// gate's own for calls in it, and go with it when it closes.
    states: HashMap<String, ToolState>,
    /// Every call in it is in plan mode, whatever the call asks.
    plan_mode: bool,
    /// Its profiles that keep a pooled worker of this session's.
    kept: Vec<Arc<CompiledProfile>>,
    /// Closed or expired: no worker is kept for it any more.
    ended: bool,
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Sessions {
    /// Sessions kept under `state_dir` (made 0700, or as root 0710 for the sandbox's
    /// group; whatever an earlier run left in it is removed). `sandbox_ids` are the host
    /// uid and gid the sandbox's root maps to ([`crate::Supervisor::sandbox_ids`]).
    pub fn new(
        state_dir: &Path,
        sandbox_ids: (u32, u32),
        clock: Arc<dyn Clock>,
    ) -> Result<Self, SessionError> {
        let state = StateDir::prepare(state_dir, sandbox_ids)
            .map_err(SessionError::storage("prepare the state directory"))?;
        Ok(Self {
            state,
            clock,
            open: Mutex::new(HashMap::new()),
            opening: std::sync::atomic::AtomicUsize::new(0),
            leftovers: Mutex::new(Vec::new()),
            mappings: overlay::Mappings::default(),
            ended: Mutex::new(EndedSessions::default()),
            workers: None,
        })
    }

    /// Keeps a pre-confined worker of `supervisor`'s for each (session, profile) a call
    /// used, at most `max` over all sessions (the daemon passes its `--pool-max`): a call
    /// in a session then takes a ready worker instead of a cold one. Without this, every
    /// call in a session is cold.
    #[must_use]
    pub fn keep_workers(mut self, supervisor: Arc<crate::Supervisor>, max: usize) -> Self {
        self.workers = (max > 0).then(|| Arc::new(SessionWorkers::new(supervisor, max)));
        self
    }

    /// (session, profile) pools of pre-confined workers kept now.
    pub fn workers_kept(&self) -> usize {
        self.workers.as_ref().map_or(0, |w| w.kept())
    }

    /// A session is gone (closed or expired): its pooled workers are killed now, and no
    /// call still running in it starts another.
    fn end(&self, session: &Session) {
        let kept = {
            let mut state = session.state();
            state.ended = true;
            std::mem::take(&mut state.kept)
        };
        if let Some(workers) = &self.workers {
            workers.release(kept);
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sessions open now.
    pub fn count(&self) -> usize {
        self.table().len()
    }

    /// Whether `id` names a session open now.
    pub fn is_open(&self, id: &str) -> bool {
        self.table().contains_key(id)
    }

    /// Opens a session of `size` bytes (default: the largest profile's `workspace_size`,
    /// passed as `default_size`), from a copy of `base` when given.
    pub fn open(
        &self,
        policy: &SessionPolicy,
        base: Option<&str>,
        size: Option<u64>,
        default_size: u64,
    ) -> Result<Opened, SessionError> {
        const OP: &str = "session_open";
        self.sweep(policy);
        let size = size.unwrap_or(default_size.min(policy.max_size_bytes));
        if size < 4096 || size > policy.max_size_bytes {
            return Err(SessionError::invalid(
                OP,
                format!(
                    "size must be between 4KiB and the policy's max_size of {}",
                    airlock_policy::units::format_size(policy.max_size_bytes)
                ),
            ));
        }
        let base = base.map(|b| allowed_base(policy, b)).transpose()?;
        let Some(id) = crate::approvals::random_id() else {
            return Err(SessionError::Storage {
                op: OP,
                source: io::Error::other("the OS random source is unavailable"),
            });
        };
        let Some(name) = crate::approvals::random_id() else {
            return Err(SessionError::Storage {
                op: OP,
                source: io::Error::other("the OS random source is unavailable"),
            });
        };
        // A place is held before the (slow) storage is made, so concurrent opens cannot
        // pass the limit together; it is given back however this returns.
        let _reservation = {
            let table = self.table();
            reserve::Reservation::take(&self.opening, table.len(), policy.max_sessions).ok_or(
                SessionError::Limit {
                    max: policy.max_sessions,
                },
            )?
        };
        let (storage, isolation) = self.make_storage(&name, base.as_ref(), policy, size)?;
        let now = self.clock.now();
        let session = Arc::new(Session {
            storage,
            isolation,
            base,
            inodes: policy.max_inodes,
            opened_at: now,
            state: Mutex::new(SessionState {
                last_used: now,
                calls: 0,
                profiles: Vec::new(),
                states: HashMap::new(),
                plan_mode: false,
                kept: Vec::new(),
                ended: false,
            }),
        });
        {
            let mut table = self.table();
            if table.len() >= policy.max_sessions {
                drop(table);
                let _ = session.storage.remove();
                return Err(SessionError::Limit {
                    max: policy.max_sessions,
                });
            }
            table.insert(id.clone(), session);
        }
        tracing::info!(isolation, size, "session opened");
        Ok(Opened {
            session: id,
            expires_at: millis(now + policy.idle_timeout.min(policy.max_lifetime)),
            isolation,
            size,
        })
    }

    /// A session's directory, holding its base: under an overlay where the supervisor can
    /// make one (as root, on a kernel and filesystem that allow it), else a copy.
    fn make_storage(
        &self,
        name: &str,
        base: Option<&Base>,
        policy: &SessionPolicy,
        size: u64,
    ) -> Result<(Storage, &'static str), SessionError> {
        const OP: &str = "session_open";
        let create = || {
            self.state
                .create(name, size, policy.max_inodes)
                .map_err(SessionError::storage(OP))
        };
        let mut storage = create()?;
        // Whatever error this returns from, the mount and directory made go with it.
        let mut removal = storage.removal();
        let Some(base) = base else {
            removal.disarm();
            return Ok((storage, "empty"));
        };
        if let Some(owner) = self.state.owner {
            let base_fd = base.open().map_err(SessionError::storage(OP))?;
            match overlay::mount(&storage.path, &base_fd, owner, &self.mappings) {
                Ok(merged) => {
                    storage.workspace = merged;
                    removal.disarm();
                    return Ok((storage, "overlay"));
                }
                Err(error) => {
                    tracing::info!(%error, "the base is copied: no overlay over it");
                    removal.remove_now().map_err(SessionError::storage(OP))?;
                    storage = create()?;
                    removal = storage.removal();
                }
            }
        }
        self.copy_base(&storage, base, policy, size)?;
        removal.disarm();
        Ok((storage, "copy"))
    }

    fn copy_base(
        &self,
        storage: &Storage,
        base: &Base,
        policy: &SessionPolicy,
        size: u64,
    ) -> Result<(), SessionError> {
        const OP: &str = "session_open";
        let base_fd = base.open().map_err(SessionError::storage(OP))?;
        let root = tree::open_root(&storage.workspace).map_err(SessionError::storage(OP))?;
        changes::copy_base(
            base_fd.as_fd(),
            root.as_fd(),
            self.state.owner,
            policy.max_inodes,
            size,
        )
        .map_err(|e| match e {
            changes::CopyError::Workspace(tree::WriteError::Full) => SessionError::Full { op: OP },
            other => SessionError::invalid(OP, other.to_string()),
        })?;
        if storage.usage().map_err(SessionError::storage(OP))?.bytes > size {
            return Err(SessionError::Full { op: OP });
        }
        Ok(())
    }

    /// The session `id`, marked as used now.
    fn get(
        &self,
        policy: &SessionPolicy,
        op: &'static str,
        id: &str,
    ) -> Result<Arc<Session>, SessionError> {
        self.sweep(policy);
        self.find(policy, op, id)
    }

    /// The open session `id`, marked as used now, without a sweep: a call looks its
    /// session up on an async runtime thread, where removing files would block it. One
    /// expired and not swept yet is as good as gone.
    fn find(
        &self,
        policy: &SessionPolicy,
        op: &'static str,
        id: &str,
    ) -> Result<Arc<Session>, SessionError> {
        let session = self
            .table()
            .get(id)
            .cloned()
            .ok_or(SessionError::Unknown { op })?;
        let now = self.clock.now();
        // Past its lifetime it takes nothing more, even while calls keep it open.
        if session.expired(now, policy) || session.outlived(now, policy.max_lifetime) {
            return Err(SessionError::Unknown { op });
        }
        session.touch(now);
        Ok(session)
    }

    /// Puts every call in the session `id` in plan mode (`on`), or leaves it to each call
    /// (`op` names the operation in an error). Calls decided from then on see it; one
    /// already running finishes. Who may lift a plan mode is the caller's to decide.
    pub fn set_plan_mode(
        &self,
        policy: &SessionPolicy,
        op: &'static str,
        id: &str,
        on: bool,
    ) -> Result<(), SessionError> {
        self.get(policy, op, id)?.state().plan_mode = on;
        Ok(())
    }

    /// Sets `tool`'s state for calls in the session `id` only.
    pub fn set_state(
        &self,
        policy: &SessionPolicy,
        id: &str,
        tool: &str,
        state: ToolState,
    ) -> Result<(), SessionError> {
        let session = self.get(policy, "set_state", id)?;
        session.state().states.insert(tool.to_string(), state);
        Ok(())
    }

    /// Whether `id` names a session that has ended (closed or expired) after setting a plan
    /// mode or tool states: its calls must not run with the daemon-wide settings instead.
    pub fn ended_with_settings(&self, id: &str) -> bool {
        self.ended
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .ids
            .contains(id)
    }

    /// A call names the open session `id`: it is in use, and does not expire meanwhile.
    pub fn touch(&self, id: &str) {
        let session = self.table().get(id).cloned();
        if let Some(session) = session {
            session.touch(self.clock.now());
        }
    }

    /// Remembers that `session` (`id`) ended, if it had settings of its own.
    fn note_ended(&self, id: &str, session: &Session) {
        let had_settings = {
            let state = session.state();
            state.plan_mode || !state.states.is_empty()
        };
        if !had_settings {
            return;
        }
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        if ended.ids.insert(id.to_string()) {
            ended.order.push_back(id.to_string());
        }
        while ended.order.len() > MAX_ENDED {
            if let Some(oldest) = ended.order.pop_front() {
                ended.ids.remove(&oldest);
            }
        }
    }

    /// What the session `id` sets for a call of `tool`: its own state of the tool, if it
    /// set one, and whether it is in plan mode. Nothing for an id that is no open session
    /// (a call may name a session only to be counted by it). A lookup: not a use.
    pub fn overrides(&self, id: &str, tool: &str) -> (Option<ToolState>, bool) {
        let Some(session) = self.table().get(id).cloned() else {
            return (None, false);
        };
        let state = session.state();
        (state.states.get(tool).copied(), state.plan_mode)
    }

    /// Writes `content` to `path` (relative) in the session's workspace.
    pub fn put_file(
        &self,
        policy: &SessionPolicy,
        id: &str,
        path: &str,
        content: &[u8],
    ) -> Result<(), SessionError> {
        const OP: &str = "put_file";
        tree::check_relative(path).map_err(|r| SessionError::invalid(OP, r))?;
        let session = self.get(policy, OP, id)?;
        let more = u64::try_from(content.len()).unwrap_or(u64::MAX);
        if !session
            .storage
            .fits(more)
            .map_err(SessionError::storage(OP))?
        {
            return Err(SessionError::Full { op: OP });
        }
        let root =
            tree::open_root(&session.storage.workspace).map_err(SessionError::storage(OP))?;
        tree::write_file(root.as_fd(), path, content, 0o644, self.state.owner)
            .map_err(SessionError::written(OP))
    }

    /// The content of the regular file `path` (relative) in the session's workspace.
    pub fn get_file(
        &self,
        policy: &SessionPolicy,
        id: &str,
        path: &str,
    ) -> Result<Vec<u8>, SessionError> {
        const OP: &str = "get_file";
        tree::check_relative(path).map_err(|r| SessionError::invalid(OP, r))?;
        let session = self.get(policy, OP, id)?;
        let root =
            tree::open_root(&session.storage.workspace).map_err(SessionError::storage(OP))?;
        tree::read_file(root.as_fd(), path, MAX_GET_BYTES).map_err(|e| match e {
            tree::ReadError::Io(source) => SessionError::Storage { op: OP, source },
            other => SessionError::invalid(OP, other.to_string()),
        })
    }

    /// What the workspace holds that its base does not (everything, without a base).
    pub fn changes(&self, policy: &SessionPolicy, id: &str) -> Result<Vec<Change>, SessionError> {
        const OP: &str = "changes";
        let session = self.get(policy, OP, id)?;
        let root =
            tree::open_root(&session.storage.workspace).map_err(SessionError::storage(OP))?;
        let base = session
            .base
            .as_ref()
            .map(Base::open)
            .transpose()
            .map_err(SessionError::storage(OP))?;
        changes::changes(
            root.as_fd(),
            base.as_ref().map(AsFd::as_fd),
            session.inodes.saturating_mul(2),
        )
        .map_err(|e| match e {
            tree::ReadError::TreeTooLarge(reason) => SessionError::TooLarge {
                op: OP,
                reason: format!("the workspace or its base is too large to list: {reason}"),
            },
            tree::ReadError::Io(source) => SessionError::Storage { op: OP, source },
            other => SessionError::Storage {
                op: OP,
                source: io::Error::other(other.to_string()),
            },
        })
    }

    /// Closes the session: its files, directory and mount are gone when this returns (a
    /// call still running in it keeps its detached view until it ends).
    pub fn close(&self, id: &str) -> Result<(), SessionError> {
        const OP: &str = "session_close";
        let session = self
            .table()
            .remove(id)
            .ok_or(SessionError::Unknown { op: OP })?;
        self.note_ended(id, &session);
        self.end(&session);
        self.remove_storage(session);
        Ok(())
    }

    /// Removes a closed session's files, or keeps it for the next sweep to try again.
    fn remove_storage(&self, session: Arc<Session>) {
        if let Err(error) = session.storage.remove() {
            tracing::warn!(%error, "a closed session's files are not all removed yet; retrying at the next sweep");
            self.leftovers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(session);
        }
    }

    /// Closes every session idle for the policy's `idle_timeout`, or older than its
    /// `max_lifetime`, with no call running; returns how many. Every operation sweeps first; the daemon also sweeps on a timer.
    pub fn sweep(&self, policy: &SessionPolicy) -> usize {
        let leftovers: Vec<Arc<Session>> = std::mem::take(
            &mut *self
                .leftovers
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for session in leftovers {
            self.remove_storage(session);
        }
        let now = self.clock.now();
        let expired: Vec<(String, Arc<Session>)> = {
            let mut table = self.table();
            let ids: Vec<String> = table
                .iter()
                .filter(|(_, s)| s.expired(now, policy))
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| table.remove(&id).map(|s| (id, s)))
                .collect()
        };
        let count = expired.len();
        if count > 0 {
            tracing::info!(count, "sessions expired");
        }
        for (id, session) in expired {
            self.note_ended(&id, &session);
            self.end(&session);
            self.remove_storage(session);
        }
        count
    }

    /// Closes every session (at shutdown).
    pub fn close_all(&self) {
        let mut all: Vec<Arc<Session>> = self.table().drain().map(|(_, s)| s).collect();
        all.append(
            &mut self
                .leftovers
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for session in all {
            self.end(&session);
            if let Err(error) = session.storage.remove() {
                tracing::error!(%error, "a session's files are left for the next start to remove");
            }
        }
    }

    /// The profile a call runs under. A profile without a workspace is returned as it is
    /// and the session is not looked at; one with a workspace needs an open session, and
    /// gets that session's files at its workspace path.
    pub fn enter(
        &self,
        policy: &SessionPolicy,
        id: Option<&str>,
        profile: &Arc<CompiledProfile>,
    ) -> Result<Option<SessionCall>, Box<ToolError>> {
        if profile.workspace.is_none() {
            return Ok(None);
        }
        let unknown = || {
            Box::new(ToolError::new(
                ErrorKind::SessionUnknown,
                "this tool works in a session workspace: name an open session",
            ))
        };
        let id = id.ok_or_else(unknown)?;
        let session = self.find(policy, "call", id).map_err(|_| unknown())?;
        let mut unused = Vec::new();
        let profile = {
            let mut state = session.state();
            state.calls += 1;
            let known = state
                .profiles
                .iter()
                .find(|(p, _)| Arc::ptr_eq(p, profile))
                .map(|(_, with)| Arc::clone(with));
            known.unwrap_or_else(|| {
                let source = session.storage.workspace.to_string_lossy();
                let with = Arc::new(airlock_policy::compile::with_workspace(profile, &source));
                // Bounded by the policy's profiles; a reloaded policy brings new ones, and
                // the workers kept for those it dropped go.
                let (live, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut state.profiles)
                    .into_iter()
                    .partition(|(p, _)| Arc::strong_count(p) > 1);
                state.profiles = live;
                for (_, dropped) in gone {
                    if let Some(i) = state.kept.iter().position(|k| Arc::ptr_eq(k, &dropped)) {
                        unused.push(state.kept.swap_remove(i));
                    }
                }
                state
                    .profiles
                    .push((Arc::clone(profile), Arc::clone(&with)));
                with
            })
        };
        if let Some(workers) = &self.workers
            && !unused.is_empty()
        {
            workers.release(unused);
        }
        Ok(Some(SessionCall {
            session,
            profile,
            clock: Arc::clone(&self.clock),
            workers: self.workers.clone(),
        }))
    }
}

/// A holder that drops the last handle without closing (a library caller giving up early
/// on an error, a test) must not leave workspaces mounted or on disk behind it.
impl Drop for Sessions {
    fn drop(&mut self) {
        self.close_all();
    }
}

/// A gate serving no sessions: a call of a profile with a workspace is refused.
pub fn without_sessions(profile: &CompiledProfile) -> Result<Option<SessionCall>, Box<ToolError>> {
    match profile.workspace {
        None => Ok(None),
        Some(_) => Err(Box::new(ToolError::new(
            ErrorKind::SessionUnknown,
            "this tool works in a session workspace, and this gate serves no sessions",
        ))),
    }
}

impl Session {
    fn state(&self) -> std::sync::MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn touch(&self, now: SystemTime) {
        let mut state = self.state();
        state.last_used = state.last_used.max(now);
    }

    /// Unused for the policy's `idle_timeout`, or older than its `max_lifetime`, with no
    /// call running: to be closed.
    fn expired(&self, now: SystemTime, policy: &SessionPolicy) -> bool {
        let state = self.state();
        state.calls == 0
            && (now
                .duration_since(state.last_used)
                .is_ok_and(|d| d >= policy.idle_timeout)
                || self.outlived(now, policy.max_lifetime))
    }

    /// Older than `lifetime`, whatever it is doing.
    fn outlived(&self, now: SystemTime, lifetime: Duration) -> bool {
        now.duration_since(self.opened_at)
            .is_ok_and(|age| age >= lifetime)
    }
}

/// A call running in a session: the session does not expire while it lives.
#[derive(Debug)]
pub struct SessionCall {
    session: Arc<Session>,
    /// The call's profile, with the session's workspace.
    pub profile: Arc<CompiledProfile>,
    clock: Arc<dyn Clock>,
    workers: Option<Arc<SessionWorkers>>,
}

impl SessionCall {
    /// Makes a call that ran out of room in the workspace a typed `workspace_full`.
    pub async fn finish(&self, result: &mut ToolResult) {
        if let Some(isolation) = &mut result.isolation {
            isolation.workspace = Some(self.session.isolation.to_string());
        }
        // Only a tool's own failure (or success) is explained by a full workspace: a
        // timeout, a kill or a refusal keeps its kind.
        let tool_outcome = result.ok
            || result
                .error
                .as_ref()
                .is_some_and(|e| e.kind == ErrorKind::ToolFailed);
        if !tool_outcome {
            return;
        }
        // Unprivileged, the usage is a walk of the whole workspace: not on a runtime thread.
        let session = Arc::clone(&self.session);
        let Ok(Ok(usage)) = tokio::task::spawn_blocking(move || session.storage.usage()).await
        else {
            return;
        };
        let over = usage.full && !result.ok
            || usage.inodes > self.session.inodes
            || usage.bytes > self.session.storage.size();
        if over {
            result.ok = false;
            result.error = Some(ToolError::new(
                ErrorKind::WorkspaceFull,
                "the session's workspace is at its size or inode limit",
            ));
        }
    }
}

impl Drop for SessionCall {
    fn drop(&mut self) {
        let now = self.clock.now();
        let mut state = self.session.state();
        state.calls = state.calls.saturating_sub(1);
        state.last_used = state.last_used.max(now);
        // The next call of this profile in this session finds a worker ready. Not for a
        // session that ended meanwhile: its workers are gone and stay gone.
        if let Some(workers) = &self.workers
            && !state.ended
        {
            workers.keep(&mut state.kept, &self.profile);
        }
    }
}
