//! Pooled workers for sessions: each session keeps one pre-confined worker per profile it
//! calls, confined with its own workspace, so a call in a session takes a ready worker as a
//! sessionless call takes a pooled one. Made after a session's first call of a profile
//! (that call runs cold; not at open, which would let a client that opens and closes
//! sessions in a loop make the daemon spawn workers for nothing), replaced whenever a call
//! takes it, and killed when the session closes or expires. A worker confined for a session only ever serves that session: its
//! pool is keyed by a digest of a spec that names the session's own directory (see
//! [`crate::Supervisor::keep_session_worker`]).
//!
//! Bounded: at most `max` (session, profile) pools at once over all sessions, counted
//! against the daemon's pool limit (`--pool-max`); a session beyond it runs its calls cold.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use airlock_policy::CompiledProfile;

use crate::Supervisor;

/// The supervisor sessions' workers come from, and how many pools they may keep.
#[derive(Debug)]
pub(super) struct SessionWorkers {
    supervisor: Arc<Supervisor>,
    max: usize,
    /// (session, profile) pools kept now, over all sessions.
    kept: AtomicUsize,
}

impl SessionWorkers {
    pub(super) fn new(supervisor: Arc<Supervisor>, max: usize) -> Self {
        Self {
            supervisor,
            max,
            kept: AtomicUsize::new(0),
        }
    }

    /// After a call of `profile` in a session that is still open (`kept` its pools): keep
    /// (or refill) a worker of it ready, if the bound allows one more pool. Called under
    /// the session's state lock, so a close cannot slip in between the check and the start.
    pub(super) fn keep(
        &self,
        kept: &mut Vec<Arc<CompiledProfile>>,
        profile: &Arc<CompiledProfile>,
    ) {
        // A pool's replenisher is a task on the caller's runtime; a call always has one.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        if !kept.iter().any(|p| Arc::ptr_eq(p, profile)) {
            let claimed = self
                .kept
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    (n < self.max).then_some(n + 1)
                })
                .is_ok();
            if !claimed {
                return;
            }
            kept.push(Arc::clone(profile));
        }
        // Also for a kept one: a policy reload stops every pool it does not name, this one
        // included, and this starts it again.
        self.supervisor.keep_session_worker(Arc::clone(profile));
    }

    /// Ends the pools of `profiles` (a closed or expired session's, or profiles a reload
    /// left unused): their idle workers are killed now.
    pub(super) fn release(&self, profiles: Vec<Arc<CompiledProfile>>) {
        let count = profiles.len();
        for profile in &profiles {
            self.supervisor.drop_session_worker(profile);
        }
        let _ = self
            .kept
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_sub(count))
            });
    }

    /// Pools kept now.
    pub(super) fn kept(&self) -> usize {
        self.kept.load(Ordering::SeqCst)
    }
}
