//! Concurrency slots shared fairly between connections.
//!
//! A first-come queue lets one client that sends a hundred slow calls hold every slot and
//! every queued place until they end, and every other client is answered `overloaded`
//! meanwhile. Here a freed slot goes to the waiting connection that runs the fewest calls,
//! then to the one served least recently, and a connection that finds the queue full takes
//! the newest place of the connection queueing the most, if that one queues more than it
//! would. So a client's share of the slots and of the queue shrinks as others come, instead
//! of keeping them out.
//!
//! A tokio semaphore cannot choose whom it serves, so this is a small scheduler of its own
//! under one lock; it is never held across an await.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// A connection, as the scheduler tells them apart.
pub(super) type ConnId = u64;

/// A new connection's id, never given twice by this process.
pub(super) fn connection_id() -> ConnId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// What a waiting call is told.
#[derive(Debug)]
enum Grant {
    /// A slot is its own now.
    Slot,
    /// Its place went to a connection that had queued less.
    PushedOut,
}

/// One connection's share.
#[derive(Debug, Default)]
struct Share {
    running: usize,
    /// Its waiting calls, oldest first: (waiter id, where its grant goes).
    waiting: VecDeque<(u64, oneshot::Sender<Grant>)>,
    /// When it was last given a slot (a count of grants); 0: never.
    last_served: u64,
}

#[derive(Debug)]
struct State {
    free: usize,
    queued: usize,
    max_queued: usize,
    shares: HashMap<ConnId, Share>,
    /// Grants and waiters so far, for ordering.
    served: u64,
    next_waiter: u64,
}

/// The daemon's concurrency slots and its queue of calls waiting for one.
#[derive(Debug)]
pub(super) struct FairSlots {
    state: Mutex<State>,
}

/// Where a call stands when it asks for a slot.
#[derive(Debug)]
pub(super) enum Place {
    /// It runs now.
    Now(Slot),
    /// It waits.
    Queued(Waiting),
    /// The queue is full and its connection may take no other's place; `queued` wait.
    Full { queued: usize },
}

/// Why a queued call got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PushedOut;

/// A slot held; given back, to the next connection in fair order, when dropped.
#[derive(Debug)]
pub(super) struct Slot {
    slots: Arc<FairSlots>,
    conn: ConnId,
}

/// A place in the queue; leaving it (dropped while waiting) gives it up, and a slot granted
/// meanwhile goes to the next.
#[derive(Debug)]
pub(super) struct Waiting {
    slots: Arc<FairSlots>,
    conn: ConnId,
    id: u64,
    grant: Option<oneshot::Receiver<Grant>>,
}

impl FairSlots {
    /// `slots` calls at once, `max_queued` waiting.
    pub(super) fn new(slots: usize, max_queued: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                free: slots.max(1),
                queued: 0,
                max_queued,
                shares: HashMap::new(),
                served: 0,
                next_waiter: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change under the lock leaves the state whole before anything can panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Calls waiting now.
    pub(super) fn queued(&self) -> usize {
        self.lock().queued
    }

    /// A slot for a call of `conn` now, a place in the queue, or neither.
    pub(super) fn enter(self: &Arc<Self>, conn: ConnId) -> Place {
        let mut state = self.lock();
        if state.free > 0 && state.queued == 0 {
            state.free -= 1;
            state.served += 1;
            let served = state.served;
            let share = state.shares.entry(conn).or_default();
            share.running += 1;
            share.last_served = served;
            return Place::Now(Slot {
                slots: Arc::clone(self),
                conn,
            });
        }
        if state.queued >= state.max_queued && !push_out_for(&mut state, conn) {
            return Place::Full {
                queued: state.queued,
            };
        }
        state.next_waiter += 1;
        let id = state.next_waiter;
        let (sender, receiver) = oneshot::channel();
        state
            .shares
            .entry(conn)
            .or_default()
            .waiting
            .push_back((id, sender));
        state.queued += 1;
        Place::Queued(Waiting {
            slots: Arc::clone(self),
            conn,
            id,
            grant: Some(receiver),
        })
    }

    /// Gives `conn`'s slot back and hands free slots to waiters.
    fn release(&self, conn: ConnId) {
        let mut state = self.lock();
        if let Some(share) = state.shares.get_mut(&conn) {
            share.running = share.running.saturating_sub(1);
        }
        state.free += 1;
        hand_out(&mut state);
    }
}

/// Makes room in a full queue for `conn` by taking the newest place of the connection that
/// queues the most, if it queues at least two more than `conn` does: then `conn` would still
/// queue fewer after. True if a place was freed.
fn push_out_for(state: &mut State, conn: ConnId) -> bool {
    let mine = state
        .shares
        .get(&conn)
        .map_or(0, |share| share.waiting.len());
    let greediest = state
        .shares
        .iter()
        .filter(|(other, _)| **other != conn)
        .max_by_key(|(_, share)| share.waiting.len())
        .map(|(other, share)| (*other, share.waiting.len()));
    let Some((other, theirs)) = greediest else {
        return false;
    };
    if theirs < mine + 2 {
        return false;
    }
    let Some((_, sender)) = state
        .shares
        .get_mut(&other)
        .and_then(|share| share.waiting.pop_back())
    else {
        return false;
    };
    state.queued -= 1;
    // The waiter is in the queue, so its receiver is alive (see `Waiting`'s drop).
    let _ = sender.send(Grant::PushedOut);
    forget_if_idle(state, other);
    true
}

/// Gives every free slot to the waiting connection that runs the fewest calls, then to the
/// one served least recently.
fn hand_out(state: &mut State) {
    while state.free > 0 && state.queued > 0 {
        let Some(conn) = state
            .shares
            .iter()
            .filter(|(_, share)| !share.waiting.is_empty())
            .min_by_key(|(_, share)| (share.running, share.last_served))
            .map(|(conn, _)| *conn)
        else {
            return;
        };
        state.served += 1;
        let served = state.served;
        let Some(share) = state.shares.get_mut(&conn) else {
            return;
        };
        let Some((_, sender)) = share.waiting.pop_front() else {
            return;
        };
        share.running += 1;
        share.last_served = served;
        state.queued -= 1;
        state.free -= 1;
        // The waiter is in the queue, so its receiver is alive (see `Waiting`'s drop).
        let _ = sender.send(Grant::Slot);
    }
    state
        .shares
        .retain(|_, share| share.running > 0 || !share.waiting.is_empty());
}

/// Drops `conn`'s bookkeeping once it neither runs nor waits.
fn forget_if_idle(state: &mut State, conn: ConnId) {
    if state
        .shares
        .get(&conn)
        .is_some_and(|share| share.running == 0 && share.waiting.is_empty())
    {
        state.shares.remove(&conn);
    }
}

impl Waiting {
    /// Waits for a slot; `PushedOut` if the place went to another connection.
    pub(super) async fn slot(mut self) -> Result<Slot, PushedOut> {
        let Some(grant) = self.grant.as_mut() else {
            return Err(PushedOut);
        };
        let grant = grant.await;
        // Answered: nothing is left for drop to undo.
        self.grant = None;
        match grant {
            Ok(Grant::Slot) => Ok(Slot {
                slots: Arc::clone(&self.slots),
                conn: self.conn,
            }),
            Ok(Grant::PushedOut) | Err(_) => Err(PushedOut),
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(mut grant) = self.grant.take() else {
            return;
        };
        let mut state = self.slots.lock();
        let share = state.shares.get_mut(&self.conn);
        let place = share.and_then(|share| {
            let at = share.waiting.iter().position(|(id, _)| *id == self.id)?;
            share.waiting.remove(at)
        });
        if place.is_some() {
            state.queued -= 1;
            forget_if_idle(&mut state, self.conn);
            return;
        }
        // Not in the queue: answered under the lock before this drop took it. A slot that
        // was granted and never taken goes to the next waiter.
        if let Ok(Grant::Slot) = grant.try_recv() {
            if let Some(share) = state.shares.get_mut(&self.conn) {
                share.running = share.running.saturating_sub(1);
            }
            state.free += 1;
            hand_out(&mut state);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.release(self.conn);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn now(place: Place) -> Slot {
        match place {
            Place::Now(slot) => slot,
            other => panic!("expected a slot now, got {other:?}"),
        }
    }

    fn queued(place: Place) -> Waiting {
        match place {
            Place::Queued(waiting) => waiting,
            other => panic!("expected a place in the queue, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_connection_served_least_recently() {
        let slots = FairSlots::new(1, 16);
        let (greedy, polite) = (connection_id(), connection_id());
        let running = now(slots.enter(greedy));
        let greedy_next: Vec<Waiting> = (0..3).map(|_| queued(slots.enter(greedy))).collect();
        let polite_call = queued(slots.enter(polite));
        assert_eq!(slots.queued(), 4);
        drop(running);
        // The polite connection queued last but was never served: it goes first.
        let slot = polite_call.slot().await.unwrap();
        assert_eq!(slots.queued(), 3);
        drop(slot);
        // Then the greedy connection's calls, in their order.
        let mut greedy_next = greedy_next.into_iter();
        let first = greedy_next.next().unwrap().slot().await.unwrap();
        assert_eq!(slots.queued(), 2);
        drop(first);
        drop(greedy_next);
        assert_eq!(slots.queued(), 0);
        let _again = now(slots.enter(polite));
    }

    #[tokio::test]
    async fn a_connection_running_fewer_calls_is_served_first() {
        let slots = FairSlots::new(3, 16);
        let (a, b) = (connection_id(), connection_id());
        let a_running = [now(slots.enter(a)), now(slots.enter(a))];
        let b_running = now(slots.enter(b));
        let a_waiting = queued(slots.enter(a));
        let b_waiting = queued(slots.enter(b));
        // `a` was served last, but it runs two calls to `b`'s one.
        drop(a_running);
        let _b = b_waiting.slot().await.unwrap();
        let _a = a_waiting.slot().await.unwrap();
        drop(b_running);
    }

    #[tokio::test]
    async fn a_full_queue_gives_a_newcomer_the_newest_place_of_the_greediest() {
        let slots = FairSlots::new(1, 3);
        let (greedy, polite) = (connection_id(), connection_id());
        let _running = now(slots.enter(greedy));
        let mut greedy_waiting: Vec<Waiting> =
            (0..3).map(|_| queued(slots.enter(greedy))).collect();
        // The greedy connection itself finds the queue full.
        assert!(matches!(slots.enter(greedy), Place::Full { queued: 3 }));
        let polite_waiting = queued(slots.enter(polite));
        assert_eq!(slots.queued(), 3);
        let pushed = greedy_waiting.pop().unwrap();
        assert_eq!(pushed.slot().await.unwrap_err(), PushedOut);
        // Two to one: the polite connection may not push again.
        let other = connection_id();
        let other_waiting = queued(slots.enter(other));
        assert!(matches!(slots.enter(polite), Place::Full { .. }));
        drop((polite_waiting, other_waiting, greedy_waiting));
        assert_eq!(slots.queued(), 0);
    }

    #[tokio::test]
    async fn a_slot_granted_to_a_call_that_left_goes_to_the_next() {
        let slots = FairSlots::new(1, 16);
        let (a, b) = (connection_id(), connection_id());
        let running = now(slots.enter(a));
        let leaving = queued(slots.enter(b));
        let next = queued(slots.enter(a));
        // Granted under the lock as the slot is freed, then dropped untaken.
        drop(running);
        drop(leaving);
        let slot = next.slot().await.unwrap();
        drop(slot);
        assert_eq!(slots.queued(), 0);
        let _free_again = now(slots.enter(b));
    }
}
