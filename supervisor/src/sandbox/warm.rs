//! Pools of pre-confined workers kept warm: which pool serves a profile, the replenisher
//! that keeps each pool at its size (growing under bursts, shrinking when quiet), and the
//! root templates pooled workers are cloned from.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use airlock_policy::CompiledProfile;

use super::Supervisor;
use super::deadline::{Bounds, wait_cancel};
use super::error_chain;
use super::lease::finish_worker;
use super::outcome::Conversation;
use super::worker::{PrepareError, ReadyWorker, WorkerOrder, encode_setup, spec_for};
use crate::cancel::CancelSignal;
use crate::pool::{IdleTarget, Pool, PoolSize, PoolStats, Take};
use crate::spawn::WorkerNetwork;
use crate::sys;
use crate::template::{Lookup, RootTemplate, TemplateError, source_identities, split_plan};

/// A pool kept warm by [`Supervisor::keep_warm_sized`]: the profile its replenisher
/// confines workers for, how many it keeps idle now, and what stops it.
#[derive(Debug)]
pub(super) struct WarmPool {
    profile: Arc<CompiledProfile>,
    target: Arc<IdleTarget>,
    pub(super) stop: CancelSignal,
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
/// included, field by field is a measurable part of a call's critical path (see
/// docs/performance-breakdown.md); a gateway passes the same `Arc` of its compiled policy
/// for every call of a profile. Each entry holds its `Arc`, so the address cannot be
/// reused by another profile and the content cannot change (no `&mut` reaches a shared
/// `Arc`). Bounded: emptied when full (policies reloaded many times), and the next call of
/// each profile hashes again.
#[derive(Debug, Default)]
pub(super) struct PoolKeys(std::sync::Mutex<Vec<(Arc<CompiledProfile>, String)>>);

impl PoolKeys {
    const MAX: usize = 64;

    pub(super) fn of(&self, profile: &Arc<CompiledProfile>) -> String {
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
pub(super) struct ReplenishOnDrop<'a> {
    pub(super) pool: &'a Pool<ReadyWorker>,
    pub(super) key: &'a str,
}

impl Drop for ReplenishOnDrop<'_> {
    fn drop(&mut self) {
        self.pool.replenish(self.key);
    }
}

impl Supervisor {
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
                    // Calls finding the pool empty meanwhile may wait for these.
                    supervisor.pool.confining(&key, missing);
                    let mut batch = tokio::task::JoinSet::new();
                    for _ in 0..missing {
                        let supervisor = Arc::clone(&supervisor);
                        let profile = Arc::clone(&profile);
                        let template = template.clone();
                        batch.spawn(async move {
                            let order = WorkerOrder {
                                profile: &profile,
                                inherit_stdio: None,
                                run_now: None,
                                template: template.as_ref(),
                            };
                            let bounds = Bounds {
                                deadline,
                                cancel: None,
                            };
                            let outcome = supervisor.prepare_worker(order, bounds).await;
                            (supervisor, outcome)
                        });
                    }
                    let mut failed = false;
                    while let Some(joined) = batch.join_next().await {
                        let Ok((supervisor, outcome)) = joined else {
                            supervisor.pool.confined(&key);
                            continue;
                        };
                        match outcome {
                            Ok(worker) => {
                                let unwanted = supervisor.put_if_warm(&key, &stop, worker);
                                supervisor.pool.confined(&key);
                                if let Some(mut unwanted) = unwanted {
                                    let _ = finish_worker(&mut unwanted.lease).await;
                                }
                            }
                            Err(PrepareError::Failed(_, mut lease)) => {
                                supervisor.pool.confined(&key);
                                let _ = finish_worker(&mut lease).await;
                                failed = true;
                            }
                            Err(PrepareError::Rejected(e)) => {
                                supervisor.pool.confined(&key);
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
    /// A pooled worker of `key` for a call: an idle one, or one being confined for the
    /// pool if one is not promised to another call yet, awaited within `bounds` (the
    /// pool's aim grows as for a miss). `None`: spawn cold.
    pub(super) async fn take_pooled(&self, key: &str, bounds: Bounds<'_>) -> Option<ReadyWorker> {
        let coming = match self.pool.take_or_wait(key) {
            Take::Now(worker) => return Some(worker),
            Take::Cold => return None,
            Take::Soon(coming) => coming,
        };
        self.grow_pool(key);
        tokio::select! {
            worker = coming => worker.ok(),
            () = tokio::time::sleep_until(bounds.deadline) => None,
            () = wait_cancel(bounds.cancel) => None,
        }
    }

    pub(super) fn grow_pool(&self, key: &str) {
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

    /// Forgets the root templates of profiles neither in `in_use` nor kept warm: after a
    /// policy reload, those its cold calls built for profiles no call can name any more
    /// (each holds a spawner thread and a mount namespace until its last worker is gone).
    pub fn forget_unused_templates(&self, in_use: &[Arc<CompiledProfile>]) {
        let mut kept = in_use.to_vec();
        kept.extend(
            self.warm
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .values()
                .map(|pool| Arc::clone(&pool.profile)),
        );
        self.templates.keep_only(&kept);
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

    /// The root template for a cold call of `profile`, within the call's `bounds`. A
    /// daemon's cold calls clone their roots from it as pooled workers do: under a burst
    /// of cold calls, building a root and copying the host's mount table in each worker,
    /// then `pivot_root` and the teardown of those mounts at exit, were half of every
    /// worker's CPU. The first cold call of a profile builds it (the others meanwhile
    /// build their own roots); a one-shot supervisor's single call would only pay for it.
    pub(super) async fn cold_template(
        &self,
        profile: &Arc<CompiledProfile>,
        bounds: Bounds<'_>,
    ) -> Option<Arc<RootTemplate>> {
        // A call given up already claims no build it would drop at once.
        if self.one_shot || self.given_up_already(bounds).is_some() {
            return None;
        }
        // Dropped at the call's deadline or cancellation, a build kills its holder (its
        // lease) and leaves its claim to expire: the call itself then ends as given up.
        tokio::select! {
            template = self.root_template(profile) => template,
            () = tokio::time::sleep_until(bounds.deadline) => None,
            () = wait_cancel(bounds.cancel) => None,
        }
    }

    /// The root template for `profile`'s workers, pooled or cold: the current one, or one
    /// built now; `None` where the profile's workers build their own roots (see
    /// [`crate::template`]), and while another caller builds it.
    async fn root_template(&self, profile: &Arc<CompiledProfile>) -> Option<Arc<RootTemplate>> {
        // A session's profile keeps one worker: a template (a holder spawned, a spawner
        // thread and a mount namespace kept) would cost more than it saves.
        if profile.workspace.is_some() {
            return None;
        }
        let network = self.worker_network(profile);
        match self.templates.find(profile, network) {
            Lookup::Ready(template) => return Some(template),
            Lookup::Unavailable | Lookup::Building => return None,
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
            .prepare_worker(
                WorkerOrder {
                    profile: &holder_profile,
                    inherit_stdio: None,
                    run_now: None,
                    template: None,
                },
                Bounds {
                    deadline,
                    cancel: None,
                },
            )
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
        let mut spec = spec_for(profile, network, self.landlock_audit.is_some());
        spec.root = airlock_protocol::RootSource::Template;
        spec.mounts = split.per_worker;
        let frames = encode_setup(spec)?;
        Ok(RootTemplate::new(spawner, frames, sources))
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
