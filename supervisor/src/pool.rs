//! Pools of pre-confined, idle, single-use workers, one per sandbox profile.
//!
//! A worker is taken out exactly once, for exactly one call; taking one wakes the profile's
//! replenisher, which confines a replacement off the critical path. Generic over the worker
//! type so the bookkeeping is testable without sandboxes.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{Notify, oneshot};

/// The profiles a daemon keeps pools of for `policy`: every profile some tool uses, but
/// those with a workspace, which are pooled per session (each session's own workers, with
/// its workspace mounted: a pool of the bare profile would never be taken from).
pub fn profiles_to_pool(
    policy: &airlock_policy::compile::CompiledPolicy,
) -> Vec<Arc<airlock_policy::compile::CompiledProfile>> {
    let used: std::collections::BTreeSet<&String> =
        policy.tools.values().map(|t| &t.tool.profile).collect();
    used.into_iter()
        .filter_map(|name| policy.profiles.get(name))
        .filter(|p| p.workspace.is_none())
        .cloned()
        .collect()
}

/// Pool counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    /// Calls served by a pre-confined worker.
    pub hits: u64,
    /// Captured calls that found the pool empty and spawned cold.
    pub misses: u64,
    /// Idle workers now, over all profiles.
    pub idle: usize,
    /// Workers that got an empty cgroup of an earlier worker instead of a new one.
    pub cgroups_reused: u64,
    /// Empty worker cgroups kept for reuse now.
    pub cgroups_kept: usize,
    /// Root templates built (a profile's read-only root, built once for its pooled
    /// workers; again when a source changed).
    pub templates_built: u64,
    /// Root templates ready now.
    pub templates_ready: usize,
    /// Idle workers the pools aim for now, over all profiles: their minimum at rest,
    /// more after calls found a pool empty (see [`PoolSize`]).
    pub idle_target: usize,
}

/// How many idle workers a profile's pool keeps: `min_idle` at rest; each call that finds
/// it empty doubles the aim, up to `max_idle`, and after `shrink_after` without such a miss
/// the aim halves again (the idle workers beyond it are killed), down to `min_idle`. So a
/// gateway whose agent fans out ten calls at once pays cold starts for the first burst
/// only, and a quiet one keeps only its minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSize {
    min_idle: usize,
    max_idle: usize,
    shrink_after: Duration,
}

/// Why a [`PoolSize`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolSizeError {
    /// The maximum is below the minimum.
    #[error("the pool's maximum ({max}) is below its minimum ({min})")]
    MaxBelowMin {
        /// The minimum asked for.
        min: usize,
        /// The maximum asked for.
        max: usize,
    },
    /// More idle workers than [`PoolSize::LIMIT`].
    #[error("at most {limit} idle workers per profile (asked for {0})", limit = PoolSize::LIMIT)]
    TooLarge(usize),
    /// A shrink period of zero would undo every growth at once.
    #[error("the pool's shrink period must be longer than zero")]
    ZeroShrinkPeriod,
}

impl PoolSize {
    /// The most idle workers a profile's pool may keep (each holds a few namespaces, a
    /// cgroup and some memory of its own).
    pub const LIMIT: usize = 1024;
    /// How long a grown pool waits without a miss before it halves.
    pub const DEFAULT_SHRINK_AFTER: Duration = Duration::from_secs(10);

    /// Always `idle` workers (no growth), at most [`PoolSize::LIMIT`].
    pub fn fixed(idle: usize) -> Self {
        let idle = idle.min(Self::LIMIT);
        Self {
            min_idle: idle,
            max_idle: idle,
            shrink_after: Self::DEFAULT_SHRINK_AFTER,
        }
    }

    /// `min_idle` at rest, up to `max_idle` under bursts.
    pub fn between(
        min_idle: usize,
        max_idle: usize,
        shrink_after: Duration,
    ) -> Result<Self, PoolSizeError> {
        if max_idle < min_idle {
            return Err(PoolSizeError::MaxBelowMin {
                min: min_idle,
                max: max_idle,
            });
        }
        if max_idle > Self::LIMIT {
            return Err(PoolSizeError::TooLarge(max_idle));
        }
        if shrink_after.is_zero() {
            return Err(PoolSizeError::ZeroShrinkPeriod);
        }
        Ok(Self {
            min_idle,
            max_idle,
            shrink_after,
        })
    }

    /// The idle workers kept at rest.
    pub fn min_idle(&self) -> usize {
        self.min_idle
    }

    /// The most idle workers kept.
    pub fn max_idle(&self) -> usize {
        self.max_idle
    }
}

/// The time source of the pools' grow and shrink decisions. Injectable so that a test
/// of those decisions moves time itself instead of racing a machine whose speed it cannot
/// know (under emulation a refill can outlast any shrink period chosen in advance).
pub trait PoolClock: Send + Sync + std::fmt::Debug {
    /// Now.
    fn now(&self) -> Instant;
    /// Resolves once [`PoolClock::now`] has reached `due`.
    fn sleep_until(self: Arc<Self>, due: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemPoolClock;

impl PoolClock for SystemPoolClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(self: Arc<Self>, due: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep_until(due.into()))
    }
}

/// A clock that stands still until [`ManualClock::advance`] moves it (for tests).
#[derive(Debug)]
pub struct ManualClock {
    start: Instant,
    elapsed: Mutex<Duration>,
    moved: tokio::sync::Notify,
}

impl ManualClock {
    /// Standing at the real now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            elapsed: Mutex::new(Duration::ZERO),
            moved: tokio::sync::Notify::new(),
        })
    }

    /// Moves the clock forward by `by` and wakes whatever sleeps on it.
    pub fn advance(&self, by: Duration) {
        *self.elapsed.lock().unwrap_or_else(PoisonError::into_inner) += by;
        self.moved.notify_waiters();
    }
}

impl PoolClock for ManualClock {
    fn now(&self) -> Instant {
        self.start + *self.elapsed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sleep_until(self: Arc<Self>, due: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            loop {
                // Registered before the time is read, so an advance in between is not lost.
                let moved = self.moved.notified();
                tokio::pin!(moved);
                moved.as_mut().enable();
                if self.now() >= due {
                    return;
                }
                moved.await;
            }
        })
    }
}

/// A pool's current aim between its [`PoolSize`] bounds, moved by misses and by quiet.
#[derive(Debug)]
pub struct IdleTarget {
    state: Mutex<TargetState>,
}

#[derive(Debug)]
struct TargetState {
    size: PoolSize,
    target: usize,
    /// The last miss, or the last shrink step: the next step is due `shrink_after` later.
    since: Instant,
}

impl IdleTarget {
    /// At `size`'s minimum.
    pub fn new(size: PoolSize, now: Instant) -> Self {
        Self {
            state: Mutex::new(TargetState {
                size,
                target: size.min_idle,
                since: now,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, TargetState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many idle workers to keep now.
    pub fn get(&self) -> usize {
        self.state().target
    }

    /// New bounds (the aim is clamped into them).
    pub fn resize(&self, size: PoolSize) {
        let mut state = self.state();
        state.size = size;
        state.target = state.target.clamp(size.min_idle, size.max_idle);
    }

    /// A call found the pool empty: aim for twice as many (at least one more), up to the
    /// maximum. Whether the aim grew.
    pub fn missed(&self, now: Instant) -> bool {
        let mut state = self.state();
        state.since = now;
        let grown = (state.target.saturating_mul(2))
            .max(state.target + 1)
            .min(state.size.max_idle);
        let grew = grown > state.target;
        state.target = grown;
        grew
    }

    /// When the next shrink step is due, if the aim is above the minimum.
    pub fn shrink_due(&self) -> Option<Instant> {
        let state = self.state();
        (state.target > state.size.min_idle).then(|| state.since + state.size.shrink_after)
    }

    /// Halves the aim (down to the minimum) if a shrink step is due at `now`. Whether it
    /// shrank.
    pub fn shrink_if_due(&self, now: Instant) -> bool {
        let mut state = self.state();
        if state.target <= state.size.min_idle || now < state.since + state.size.shrink_after {
            return false;
        }
        state.target = (state.target / 2).max(state.size.min_idle);
        state.since = now;
        true
    }
}

#[derive(Debug)]
struct Slot<W> {
    /// Oldest first: a call takes the worker that has idled longest, which has surely
    /// finished its set-up and its rehearsal (see the worker's `rehearse_while_idle`);
    /// the newest may still be at it, or not have begun. Taking the newest (a stack)
    /// gave the bench's warm calls workers made moments before, never rehearsed.
    idle: VecDeque<W>,
    notify: Arc<Notify>,
    /// The most workers idle at once since the pool last ran low (see [`Pool::take`]).
    high_water: usize,
    /// Workers the replenisher is confining now.
    confining: usize,
    /// Calls that found no idle worker, each promised one of those being confined, oldest
    /// first; never more than `confining`.
    waiters: VecDeque<oneshot::Sender<W>>,
}

impl<W> Slot<W> {
    fn new() -> Self {
        Self {
            idle: VecDeque::new(),
            notify: Arc::new(Notify::new()),
            high_water: 0,
            confining: 0,
            waiters: VecDeque::new(),
        }
    }
}

/// What a call gets from [`Pool::take_or_wait`].
#[derive(Debug)]
pub enum Take<W> {
    /// An idle worker.
    Now(W),
    /// None idle, but one the replenisher is confining is this call's when ready. An
    /// error instead means it failed, or the pool ended: spawn cold then.
    Soon(oneshot::Receiver<W>),
    /// None idle and none coming that is not promised already: spawn cold.
    Cold,
}

/// Idle workers by pool key.
#[derive(Debug)]
pub struct Pool<W> {
    slots: Mutex<HashMap<String, Slot<W>>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<W> Default for Pool<W> {
    fn default() -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }
}

impl<W> Pool<W> {
    /// Registers a pooled key; the returned notify fires whenever a worker is taken.
    pub fn notify_for(&self, key: &str) -> Arc<Notify> {
        let Ok(mut slots) = self.slots.lock() else {
            return Arc::new(Notify::new());
        };
        let slot = slots.entry(key.to_string()).or_insert_with(Slot::new);
        Arc::clone(&slot.notify)
    }

    /// Takes an idle worker for `key`, if any. Wakes the replenisher at once only if that
    /// left the pool at half or less of what it last held (it is draining faster than
    /// calls end: two clients at full load found it empty and ran cold); otherwise the
    /// caller does, with [`Pool::replenish`], once its call has answered, so that making
    /// the next worker (a few ms of CPU) does not compete with the call for the cores.
    pub fn take(&self, key: &str) -> Option<W> {
        let Ok(mut slots) = self.slots.lock() else {
            return None;
        };
        let slot = slots.get_mut(key)?;
        self.take_idle(slot)
    }

    /// As [`Pool::take`]; with no idle worker, a call is promised one the replenisher is
    /// confining if one is not promised yet. Waiting for it costs the rest of a set-up
    /// already under way, on the pool's template, where a cold spawn would cost a whole one
    /// (building its own root) while competing with the replenisher for the cores: under
    /// two clients at full load those cold spawns were the calls' p99.
    pub fn take_or_wait(&self, key: &str) -> Take<W> {
        let Ok(mut slots) = self.slots.lock() else {
            return Take::Cold;
        };
        let Some(slot) = slots.get_mut(key) else {
            return Take::Cold;
        };
        if let Some(worker) = self.take_idle(slot) {
            return Take::Now(worker);
        }
        // Calls that stopped waiting (deadline, cancellation) keep no promise.
        slot.waiters.retain(|waiter| !waiter.is_closed());
        if slot.waiters.len() >= slot.confining {
            return Take::Cold;
        }
        let (promise, coming) = oneshot::channel();
        slot.waiters.push_back(promise);
        Take::Soon(coming)
    }

    fn take_idle(&self, slot: &mut Slot<W>) -> Option<W> {
        let worker = slot.idle.pop_front();
        if worker.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
            if slot.idle.len() * 2 <= slot.high_water {
                slot.notify.notify_one();
                // Measured again from here, so a pool that stays this low is not woken by
                // every take.
                slot.high_water = slot.idle.len();
            }
        }
        worker
    }

    /// Wakes the replenisher of `key` (if it is pooled).
    pub fn replenish(&self, key: &str) {
        if let Ok(slots) = self.slots.lock()
            && let Some(slot) = slots.get(key)
        {
            slot.notify.notify_one();
        }
    }

    /// Adds a worker for `key`: to the call waiting longest for one, else idle.
    pub fn put(&self, key: &str, worker: W) {
        if let Ok(mut slots) = self.slots.lock() {
            let slot = slots.entry(key.to_string()).or_insert_with(Slot::new);
            let mut worker = worker;
            while let Some(waiter) = slot.waiters.pop_front() {
                match waiter.send(worker) {
                    Ok(()) => {
                        self.hits.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    // That call stopped waiting: the next one, or the idle list.
                    Err(back) => worker = back,
                }
            }
            slot.idle.push_back(worker);
            slot.high_water = slot.high_water.max(slot.idle.len());
        }
    }

    /// The replenisher of `key` starts confining `count` workers.
    pub fn confining(&self, key: &str, count: usize) {
        if let Ok(mut slots) = self.slots.lock()
            && let Some(slot) = slots.get_mut(key)
        {
            slot.confining = slot.confining.saturating_add(count);
        }
    }

    /// The replenisher of `key` is done with one of those workers (put it in, or failed).
    /// Calls promised more workers than are still coming are released to spawn cold, the
    /// latest first.
    pub fn confined(&self, key: &str) {
        if let Ok(mut slots) = self.slots.lock()
            && let Some(slot) = slots.get_mut(key)
        {
            slot.confining = slot.confining.saturating_sub(1);
            while slot.waiters.len() > slot.confining {
                slot.waiters.pop_back();
            }
        }
    }

    /// Idle workers for `key`.
    pub fn idle_count(&self, key: &str) -> usize {
        self.slots
            .lock()
            .ok()
            .and_then(|s| s.get(key).map(|slot| slot.idle.len()))
            .unwrap_or(0)
    }

    /// Counts a cold spawn of a call that could have used the pool.
    pub fn note_miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes the newest idle worker of `key` out (not for a call: a pool that shrinks
    /// kills it), without counting a hit or waking the replenisher.
    pub fn evict(&self, key: &str) -> Option<W> {
        self.slots.lock().ok()?.get_mut(key)?.idle.pop_back()
    }

    /// Unregisters `key`: its idle workers, removed from the pool, and its replenisher
    /// woken. Calls of it find nothing pooled from now on.
    pub fn remove(&self, key: &str) -> Vec<W> {
        let Ok(mut slots) = self.slots.lock() else {
            return Vec::new();
        };
        let Some(slot) = slots.remove(key) else {
            return Vec::new();
        };
        slot.notify.notify_one();
        slot.idle.into_iter().collect()
    }

    /// Every idle worker, removed from the pool (for shutdown); wakes every replenisher.
    pub fn drain(&self) -> Vec<W> {
        let Ok(mut slots) = self.slots.lock() else {
            return Vec::new();
        };
        let mut all = Vec::new();
        for slot in slots.values_mut() {
            all.extend(slot.idle.drain(..));
            // Their calls spawn cold (and find the supervisor closing).
            slot.waiters.clear();
            slot.notify.notify_one();
        }
        all
    }

    /// Counters.
    pub fn stats(&self) -> PoolStats {
        let idle = self
            .slots
            .lock()
            .map(|s| s.values().map(|slot| slot.idle.len()).sum())
            .unwrap_or(0);
        PoolStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            idle,
            ..PoolStats::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(sleep: &mut Pin<Box<dyn Future<Output = ()> + Send>>) -> bool {
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        sleep.as_mut().poll(&mut context).is_ready()
    }

    #[test]
    fn a_manual_clock_wakes_a_sleeper_only_once_moved_to_its_time() {
        let clock = ManualClock::new();
        let due = clock.now() + Duration::from_secs(10);
        let mut sleep = Arc::clone(&clock).sleep_until(due);
        assert!(!ready(&mut sleep));
        clock.advance(Duration::from_secs(9));
        assert!(!ready(&mut sleep));
        clock.advance(Duration::from_secs(1));
        assert!(ready(&mut sleep));
        assert_eq!(clock.now(), due);
    }

    #[test]
    fn workers_are_handed_out_once_and_counted() {
        let pool: Pool<u32> = Pool::default();
        let _ = pool.notify_for("p");
        pool.put("p", 1);
        pool.put("p", 2);
        assert_eq!(pool.idle_count("p"), 2);
        let a = pool.take("p").unwrap();
        let b = pool.take("p").unwrap();
        assert_ne!(a, b);
        assert_eq!(pool.take("p"), None);
        assert_eq!(pool.take("other"), None);
        pool.note_miss();
        assert_eq!(
            pool.stats(),
            PoolStats {
                hits: 2,
                misses: 1,
                idle: 0,
                ..PoolStats::default()
            }
        );
    }

    #[test]
    fn a_call_finding_the_pool_empty_is_promised_a_worker_being_confined() {
        let pool: Pool<u32> = Pool::default();
        pool.notify_for("p");
        // Nothing idle and nothing coming: cold.
        assert!(matches!(pool.take_or_wait("p"), Take::Cold));
        pool.confining("p", 2);
        let Take::Soon(mut first) = pool.take_or_wait("p") else {
            panic!("not promised")
        };
        let Take::Soon(mut second) = pool.take_or_wait("p") else {
            panic!("not promised")
        };
        // Two coming, two promised: a third call spawns cold.
        assert!(matches!(pool.take_or_wait("p"), Take::Cold));
        // The oldest promise is kept first; nothing goes idle while a call waits.
        pool.put("p", 7);
        pool.confined("p");
        assert_eq!(first.try_recv(), Ok(7));
        assert!(second.try_recv().is_err());
        pool.put("p", 8);
        pool.confined("p");
        assert_eq!(second.try_recv(), Ok(8));
        assert_eq!(pool.idle_count("p"), 0);
        assert_eq!(pool.stats().hits, 2);
        // With nobody waiting, a new worker is idle again.
        pool.confining("p", 1);
        pool.put("p", 9);
        pool.confined("p");
        assert!(matches!(pool.take_or_wait("p"), Take::Now(9)));
    }

    #[test]
    fn a_call_that_stopped_waiting_leaves_its_worker_to_the_next() {
        let pool: Pool<u32> = Pool::default();
        pool.notify_for("p");
        pool.confining("p", 1);
        let Take::Soon(gone) = pool.take_or_wait("p") else {
            panic!("not promised")
        };
        drop(gone);
        // Its promise is released, so the next call may wait for that worker.
        let Take::Soon(mut next) = pool.take_or_wait("p") else {
            panic!("not promised")
        };
        pool.put("p", 5);
        assert_eq!(next.try_recv(), Ok(5));
        // A worker whose waiter left between the promise and the put goes idle.
        pool.confining("p", 1);
        let Take::Soon(left) = pool.take_or_wait("p") else {
            panic!("not promised")
        };
        drop(left);
        pool.put("p", 6);
        assert_eq!(pool.take("p"), Some(6));
    }

    #[test]
    fn a_failed_confinement_or_an_ended_pool_sends_its_waiters_to_spawn_cold() {
        let pool: Pool<u32> = Pool::default();
        pool.notify_for("p");
        pool.confining("p", 2);
        let Take::Soon(mut first) = pool.take_or_wait("p") else {
            panic!("not promised")
        };
        let Take::Soon(mut second) = pool.take_or_wait("p") else {
            panic!("not promised")
        };
        // One confinement failed: one worker is still coming, for the oldest promise.
        pool.confined("p");
        assert_eq!(second.try_recv(), Err(oneshot::error::TryRecvError::Closed));
        assert_eq!(first.try_recv(), Err(oneshot::error::TryRecvError::Empty));
        // The pool ends: its waiter is released too.
        assert!(pool.remove("p").is_empty());
        assert_eq!(first.try_recv(), Err(oneshot::error::TryRecvError::Closed));
        pool.confining("q", 1);
        assert!(matches!(pool.take_or_wait("q"), Take::Cold));
    }

    #[test]
    fn the_worker_idle_longest_is_handed_out_first() {
        let pool: Pool<u32> = Pool::default();
        for worker in [1, 2, 3] {
            pool.put("p", worker);
        }
        assert_eq!(pool.take("p"), Some(1));
        pool.put("p", 4);
        assert_eq!(pool.take("p"), Some(2));
        assert_eq!(pool.take("p"), Some(3));
        assert_eq!(pool.take("p"), Some(4));
    }

    #[tokio::test]
    async fn a_take_wakes_the_replenisher_once_the_pool_is_half_drained_not_before() {
        let pool: Pool<u32> = Pool::default();
        let notify = pool.notify_for("p");
        for worker in 0..4 {
            pool.put("p", worker);
        }
        // A stored wake-up completes `notified` at its first poll; none leaves it pending.
        let woken = || {
            let notify = Arc::clone(&notify);
            async move {
                tokio::time::timeout(std::time::Duration::ZERO, notify.notified())
                    .await
                    .is_ok()
            }
        };
        assert_eq!(pool.take("p"), Some(0));
        assert!(!woken().await, "woken with three of four idle");
        assert_eq!(pool.take("p"), Some(1));
        assert!(woken().await, "not woken with two of four idle");
        // Measured from two now: one left is half of that again.
        assert_eq!(pool.take("p"), Some(2));
        assert!(woken().await, "not woken with one of two idle");
    }

    #[tokio::test]
    async fn taking_a_worker_wakes_the_replenisher() {
        let pool: Pool<u32> = Pool::default();
        let notify = pool.notify_for("p");
        pool.put("p", 7);
        let waiter = tokio::spawn(async move { notify.notified().await });
        tokio::task::yield_now().await;
        assert_eq!(pool.take("p"), Some(7));
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn removing_a_key_hands_back_its_workers_wakes_its_replenisher_and_spares_the_rest() {
        let pool: Pool<u32> = Pool::default();
        let notify = pool.notify_for("a");
        pool.put("a", 1);
        pool.put("a", 2);
        pool.put("b", 3);
        assert_eq!(pool.remove("a"), vec![1, 2]);
        tokio::time::timeout(std::time::Duration::from_secs(5), notify.notified())
            .await
            .unwrap();
        assert_eq!((pool.idle_count("a"), pool.idle_count("b")), (0, 1));
        assert_eq!(pool.take("a"), None);
        assert!(pool.remove("a").is_empty());
    }

    #[test]
    fn a_pool_size_refuses_a_maximum_below_its_minimum_too_many_workers_and_a_zero_period() {
        let second = Duration::from_secs(1);
        assert_eq!(
            PoolSize::between(4, 2, second),
            Err(PoolSizeError::MaxBelowMin { min: 4, max: 2 })
        );
        assert_eq!(
            PoolSize::between(1, PoolSize::LIMIT + 1, second),
            Err(PoolSizeError::TooLarge(PoolSize::LIMIT + 1))
        );
        assert_eq!(PoolSize::fixed(usize::MAX).max_idle(), PoolSize::LIMIT);
        assert_eq!(
            PoolSize::between(1, 2, Duration::ZERO),
            Err(PoolSizeError::ZeroShrinkPeriod)
        );
        let size = PoolSize::between(0, 3, second).unwrap();
        assert_eq!((size.min_idle(), size.max_idle()), (0, 3));
    }

    #[test]
    fn misses_double_the_aim_up_to_the_maximum_and_quiet_halves_it_back_to_the_minimum() {
        let period = Duration::from_secs(10);
        let start = Instant::now();
        let target = IdleTarget::new(PoolSize::between(2, 10, period).unwrap(), start);
        assert_eq!((target.get(), target.shrink_due()), (2, None));
        assert!(target.missed(start));
        assert_eq!(target.get(), 4);
        assert!(target.missed(start));
        assert!(target.missed(start));
        assert_eq!(target.get(), 10, "capped at the maximum");
        assert!(!target.missed(start), "no growth past the maximum");
        assert_eq!(target.shrink_due(), Some(start + period));
        // Not before the period is over; then one halving per period.
        assert!(!target.shrink_if_due(start + period / 2));
        assert!(target.shrink_if_due(start + period));
        assert_eq!(target.get(), 5);
        assert!(!target.shrink_if_due(start + period + period / 2));
        assert!(target.shrink_if_due(start + 2 * period));
        assert_eq!(target.get(), 2, "5 halves to 2: never below the minimum");
        assert_eq!(target.shrink_due(), None);
        assert!(!target.shrink_if_due(start + 9 * period));
        // A miss restarts the period; zero grows to one.
        let empty = IdleTarget::new(PoolSize::between(0, 1, period).unwrap(), start);
        assert!(empty.missed(start));
        assert_eq!(empty.get(), 1);
        // Resizing clamps the aim.
        target.resize(PoolSize::fixed(1));
        assert_eq!(target.get(), 1);
    }

    #[test]
    fn evicting_takes_the_newest_without_counting_a_hit() {
        let pool: Pool<u32> = Pool::default();
        pool.put("p", 1);
        pool.put("p", 2);
        assert_eq!(pool.evict("p"), Some(2));
        assert_eq!(pool.evict("q"), None);
        assert_eq!((pool.idle_count("p"), pool.stats().hits), (1, 0));
    }

    #[test]
    fn drain_empties_every_profile() {
        let pool: Pool<u32> = Pool::default();
        pool.put("a", 1);
        pool.put("b", 2);
        let mut all = pool.drain();
        all.sort_unstable();
        assert_eq!(all, vec![1, 2]);
        assert_eq!(pool.stats().idle, 0);
    }
}
