//! The supervisor's side of sessions' pooled workers: a session keeps one pre-confined
//! worker per profile it calls, confined with that session's workspace, in a pool of its
//! own (its key is a digest of a spec naming the session's own directory, so no other
//! session's call and no sessionless call ever takes it). The session layer decides which
//! sessions keep one and for how long ([`crate::session`]); this only starts and ends the
//! pools.

use std::sync::Arc;

use airlock_policy::CompiledProfile;

use super::Supervisor;
use crate::pool::PoolSize;

impl Supervisor {
    /// Keeps one pre-confined worker of `profile` (a session's profile, with its
    /// workspace) ready until [`Supervisor::drop_session_worker`]; replenished off the
    /// critical path whenever a call takes it. Calling it again is cheap and changes
    /// nothing (it wakes the replenisher, which finds the pool full).
    pub fn keep_session_worker(self: &Arc<Self>, profile: Arc<CompiledProfile>) {
        self.keep_warm_sized(profile, PoolSize::fixed(1));
    }

    /// Ends `profile`'s pool now, without waiting: its replenisher stops, and its idle
    /// worker is killed at once (by SIGKILL to its pid namespace's init, reaped and its
    /// cgroup removed in the background, which [`Supervisor::close`] waits for). Under the
    /// lock that puts a new worker in, so none a replenisher was confining meanwhile is
    /// ever added: it is killed instead.
    pub fn drop_session_worker(&self, profile: &Arc<CompiledProfile>) {
        let key = self.pool_keys.of(profile);
        let idle = {
            let mut warm = self
                .warm
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some(pool) = warm.remove(&key) else {
                return;
            };
            pool.stop.cancel();
            self.pool.remove(&key)
        };
        // Each lease's drop kills its worker and cleans up in the background.
        drop(idle);
    }
}
