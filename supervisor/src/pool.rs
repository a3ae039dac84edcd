//! Pools of pre-confined, idle, single-use workers, one per sandbox profile.
//!
//! A worker is taken out exactly once, for exactly one call; taking one wakes the profile's
//! replenisher, which confines a replacement off the critical path. Generic over the worker
//! type so the bookkeeping is testable without sandboxes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use tokio::sync::Notify;

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
}

#[derive(Debug)]
struct Slot<W> {
    /// Oldest first: a call takes the worker that has idled longest, which has surely
    /// finished its set-up and its rehearsal (see the worker's `rehearse_while_idle`);
    /// the newest may still be at it, or not have begun. Taking the newest (a stack)
    /// gave the bench's warm calls a worker made 0-2 ms before, never rehearsed.
    idle: VecDeque<W>,
    notify: Arc<Notify>,
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
        let slot = slots.entry(key.to_string()).or_insert_with(|| Slot {
            idle: VecDeque::new(),
            notify: Arc::new(Notify::new()),
        });
        Arc::clone(&slot.notify)
    }

    /// Takes an idle worker for `key`, if any. Wakes the replenisher only if that emptied
    /// the pool; otherwise the caller does, with [`Pool::replenish`], once its call has
    /// answered, so that making the next worker (a few ms of CPU) does not compete with the
    /// call for the cores.
    pub fn take(&self, key: &str) -> Option<W> {
        let Ok(mut slots) = self.slots.lock() else {
            return None;
        };
        let slot = slots.get_mut(key)?;
        let worker = slot.idle.pop_front();
        if worker.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
            if slot.idle.is_empty() {
                slot.notify.notify_one();
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

    /// Adds an idle worker for `key`.
    pub fn put(&self, key: &str, worker: W) {
        if let Ok(mut slots) = self.slots.lock() {
            slots
                .entry(key.to_string())
                .or_insert_with(|| Slot {
                    idle: VecDeque::new(),
                    notify: Arc::new(Notify::new()),
                })
                .idle
                .push_back(worker);
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
