//! Byte budgets shared by every connection: what clients can make the daemon hold, summed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A number of bytes that holders take from and give back; never more than `total` taken.
#[derive(Debug)]
pub struct ByteBudget {
    total: usize,
    taken: AtomicUsize,
    /// Woken whenever bytes are given back, for holders waiting for room.
    freed: tokio::sync::Notify,
}

impl ByteBudget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> Arc<Self> {
        Arc::new(Self {
            total,
            taken: AtomicUsize::new(0),
            freed: tokio::sync::Notify::new(),
        })
    }

    /// The whole budget.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Bytes taken now.
    pub fn taken(&self) -> usize {
        self.taken.load(Ordering::Relaxed)
    }

    fn try_take(&self, bytes: usize) -> bool {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |taken| {
                taken
                    .checked_add(bytes)
                    .filter(|after| *after <= self.total)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        if bytes > 0 {
            self.taken.fetch_sub(bytes, Ordering::AcqRel);
            self.freed.notify_waiters();
        }
    }

    /// A holder of nothing yet.
    pub fn holder(self: &Arc<Self>) -> Held {
        Held {
            budget: Arc::clone(self),
            bytes: 0,
        }
    }

    /// Takes `bytes` at once, if that many are free.
    pub fn try_hold(self: &Arc<Self>, bytes: usize) -> Option<Held> {
        let mut held = self.holder();
        held.resize(bytes).then_some(held)
    }
}

/// Bytes taken from a [`ByteBudget`], given back when dropped.
#[derive(Debug)]
pub struct Held {
    budget: Arc<ByteBudget>,
    bytes: usize,
}

impl Held {
    /// Holds exactly `bytes` from now on; false (holding what it held) when the budget
    /// cannot give the difference.
    pub fn resize(&mut self, bytes: usize) -> bool {
        if bytes > self.bytes {
            if !self.budget.try_take(bytes - self.bytes) {
                return false;
            }
        } else {
            self.budget.give_back(self.bytes - bytes);
        }
        self.bytes = bytes;
        true
    }
}

impl Held {
    /// [`Held::resize`], waiting for room as long as it takes: bound the wait from outside.
    pub async fn resize_when_room(&mut self, bytes: usize) {
        let budget = Arc::clone(&self.budget);
        loop {
            // Registered before the attempt, so that room given back in between still
            // wakes this holder.
            let freed = budget.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.resize(bytes) {
                return;
            }
            freed.await;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_never_take_more_than_the_budget_together_and_give_it_back_when_dropped() {
        let budget = ByteBudget::new(100);
        let mut a = budget.holder();
        assert!(a.resize(60));
        let mut b = budget.holder();
        assert!(!b.resize(41), "60 + 41 is over 100");
        assert!(b.resize(40));
        assert_eq!(budget.taken(), 100);
        assert!(budget.try_hold(1).is_none());
        assert!(a.resize(10));
        assert_eq!(budget.taken(), 50);
        let c = budget.try_hold(50);
        assert!(c.is_some());
        drop((a, b, c));
        assert_eq!(budget.taken(), 0);
    }

    #[tokio::test]
    async fn a_holder_waiting_for_room_gets_it_when_another_gives_bytes_back() {
        let budget = ByteBudget::new(10);
        let mut full = budget.holder();
        assert!(full.resize(10));
        let mut waiting = budget.holder();
        let wait = tokio::spawn(async move {
            waiting.resize_when_room(6).await;
            waiting
        });
        tokio::task::yield_now().await;
        assert!(!wait.is_finished());
        assert!(full.resize(4));
        let waiting = wait.await.unwrap();
        assert_eq!(budget.taken(), 10);
        drop((full, waiting));
        assert_eq!(budget.taken(), 0);
    }

    #[test]
    fn a_refused_resize_keeps_what_was_held() {
        let budget = ByteBudget::new(10);
        let mut a = budget.holder();
        assert!(a.resize(8));
        assert!(!a.resize(11));
        assert_eq!(budget.taken(), 8);
        drop(a);
        assert_eq!(budget.taken(), 0);
    }
}
