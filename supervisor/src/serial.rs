//! One call at a time per (session, tool) for tools that are not `concurrency_safe`.
//!
//! Each such pair gets a lane, an async mutex a call holds for its whole run (every attempt).
//! A lane exists only while some call holds or waits for it: the last one out removes it,
//! so the table is bounded by the calls in flight, whatever sessions and tools clients name.
//! Calls without a session share one lane per tool: leaving the session out must not be a
//! way around the rule.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use crate::cancel::CancelSignal;
use crate::result::{ErrorKind, ToolError};

type Key = (Option<String>, String);

/// The lanes of the tools that must not run concurrently.
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    lanes: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>,
}

/// Why a call did not get its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoTurn {
    /// The caller cancelled while waiting.
    Cancelled,
    /// The call's deadline passed while an earlier call ran.
    TimedOut,
}

/// A call's turn in its lane (or its place in the queue, while waiting): dropping it lets
/// the next call run and removes the lane when nobody else holds it.
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    lanes: &'a Lanes,
    key: Key,
    lane: Option<Arc<tokio::sync::Mutex<()>>>,
    guard: Option<OwnedMutexGuard<()>>,
    /// How long the call waited for an earlier one (zero when the lane was free).
    pub(crate) waited: Duration,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.guard = None;
        let mut lanes = self
            .lanes
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Every turn gives its reference back under the table's lock, where every turn took
        // it: the table's own reference alone means nobody holds or waits for the lane.
        self.lane = None;
        if lanes
            .get(&self.key)
            .is_some_and(|lane| Arc::strong_count(lane) == 1)
        {
            lanes.remove(&self.key);
        }
    }
}

impl Lanes {
    /// Waits for the turn of a call of `tool` in `session`, at most `limit`.
    pub(crate) async fn turn(
        &self,
        session: Option<&str>,
        tool: &str,
        cancel: Option<&CancelSignal>,
        limit: Duration,
    ) -> Result<Turn<'_>, NoTurn> {
        let key = (session.map(str::to_string), tool.to_string());
        // Taken under the table's lock, like every turn's, and a turn made at once, so a
        // call dropped while queued still gives it back.
        let (lane, mut turn) = {
            let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
            let lane = Arc::clone(lanes.entry(key.clone()).or_default());
            let turn = Turn {
                lanes: self,
                key,
                lane: Some(Arc::clone(&lane)),
                guard: None,
                waited: Duration::ZERO,
            };
            (lane, turn)
        };
        if let Ok(guard) = Arc::clone(&lane).try_lock_owned() {
            turn.guard = Some(guard);
            return Ok(turn);
        }
        let started = std::time::Instant::now();
        let cancelled = async {
            match cancel {
                Some(signal) => signal.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            guard = tokio::time::timeout(limit, lane.lock_owned()) => match guard {
                Ok(guard) => turn.guard = Some(guard),
                Err(_) => return Err(NoTurn::TimedOut),
            },
            () = cancelled => return Err(NoTurn::Cancelled),
        }
        turn.waited = started.elapsed();
        Ok(turn)
    }

    /// The turn a call of `tool` must hold to run (none for a `concurrency_safe` tool), or
    /// the error that ends the call: cancelled, or out of its `deadline` while waiting.
    pub(crate) async fn turn_for(
        &self,
        tool: &airlock_policy::validate::Tool,
        session: Option<&str>,
        cancel: Option<&CancelSignal>,
        deadline: Duration,
    ) -> Result<Option<Turn<'_>>, ToolError> {
        if tool.concurrency_safe {
            return Ok(None);
        }
        let waiting =
            "waiting for an earlier call of this tool in this session (it is not concurrency_safe)";
        match self.turn(session, &tool.name, cancel, deadline).await {
            Ok(turn) => Ok(Some(turn)),
            Err(NoTurn::Cancelled) => Err(ToolError::new(
                ErrorKind::Cancelled,
                format!("cancelled {waiting}"),
            )),
            Err(NoTurn::TimedOut) => Err(ToolError {
                timeout_ms: Some(u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX)),
                ..ToolError::new(ErrorKind::Timeout, format!("the deadline passed {waiting}"))
            }),
        }
    }

    /// Lanes held or waited for (for tests of the bound).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(300);

    #[tokio::test]
    async fn one_call_per_session_and_tool_runs_and_idle_lanes_are_removed() {
        let lanes = Lanes::default();
        let first = lanes.turn(Some("s"), "t", None, LONG).await.unwrap();
        assert_eq!(
            first.waited,
            Duration::ZERO,
            "a free lane costs no deadline"
        );
        // Another session, another tool: not held up.
        let other_session = lanes.turn(Some("s2"), "t", None, LONG).await.unwrap();
        let other_tool = lanes.turn(Some("s"), "u", None, LONG).await.unwrap();
        assert_eq!(lanes.len(), 3);
        // The same pair waits until the first is done.
        let waited = lanes
            .turn(Some("s"), "t", None, Duration::from_millis(20))
            .await
            .unwrap_err();
        assert_eq!(waited, NoTurn::TimedOut);
        drop((other_session, other_tool));
        assert_eq!(lanes.len(), 1);
        let signal = CancelSignal::new();
        signal.cancel();
        assert_eq!(
            lanes
                .turn(Some("s"), "t", Some(&signal), LONG)
                .await
                .unwrap_err(),
            NoTurn::Cancelled
        );
        drop(first);
        assert_eq!(lanes.len(), 0);
        let again = lanes.turn(Some("s"), "t", None, LONG).await.unwrap();
        drop(again);
        assert_eq!(lanes.len(), 0);
    }

    #[tokio::test]
    async fn calls_without_a_session_share_one_lane() {
        let lanes = Lanes::default();
        let first = lanes.turn(None, "t", None, LONG).await.unwrap();
        let second = lanes.turn(None, "t", None, Duration::from_millis(20)).await;
        assert_eq!(second.unwrap_err(), NoTurn::TimedOut);
        drop(first);
        assert_eq!(lanes.len(), 0);
    }

    #[tokio::test]
    async fn a_waiter_dropped_in_the_queue_leaves_no_lane_behind() {
        let lanes = Lanes::default();
        let first = lanes.turn(Some("s"), "t", None, LONG).await.unwrap();
        {
            let waiting = lanes.turn(Some("s"), "t", None, LONG);
            tokio::pin!(waiting);
            // Poll once so it is queued, then drop it.
            assert!(futures_poll_once(waiting.as_mut()).await.is_none());
        }
        drop(first);
        assert_eq!(lanes.len(), 0);
    }

    /// Polls a future once; `Some` if it finished.
    async fn futures_poll_once<F: std::future::Future + Unpin>(mut future: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut future).poll(cx) {
                std::task::Poll::Ready(output) => Some(output),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}
