//! Every wait of a call — spawn, exec, handshake, the run itself — ends at the call's
//! deadline, its cancellation or the supervisor's close, whichever comes first.

use std::time::Duration;

use super::Supervisor;
use super::outcome::Conversation;
use crate::cancel::CancelSignal;
use crate::sys;

/// When a call's waits are given up: its deadline, or its cancellation (the supervisor's
/// close always counts too).
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds<'a> {
    pub deadline: tokio::time::Instant,
    pub cancel: Option<&'a CancelSignal>,
}

impl Supervisor {
    /// How a call whose deadline has passed, or that was cancelled, ends before it starts.
    pub(super) fn given_up_already(&self, bounds: Bounds<'_>) -> Option<Conversation> {
        if tokio::time::Instant::now() >= bounds.deadline {
            Some(Conversation::TimedOut {
                applied: None,
                partial: None,
            })
        } else if bounds.cancel.is_some_and(CancelSignal::is_cancelled)
            || self.closing.is_cancelled()
        {
            Some(Conversation::Cancelled {
                applied: None,
                partial: None,
            })
        } else {
            None
        }
    }

    /// Runs `work` unless the deadline passes, the caller cancels or the supervisor closes
    /// first (then `TimedOut` or `Cancelled`, before any isolation was applied).
    pub(super) async fn unless_given_up<T>(
        &self,
        work: impl std::future::Future<Output = T>,
        bounds: Bounds<'_>,
    ) -> Result<T, Conversation> {
        tokio::select! {
            outcome = work => Ok(outcome),
            () = sleep_until_precise(bounds.deadline) => Err(Conversation::TimedOut {
                applied: None,
                partial: None,
            }),
            () = wait_cancel(bounds.cancel) => Err(Conversation::Cancelled {
                applied: None,
                partial: None,
            }),
            () = self.closing.cancelled() => Err(Conversation::Cancelled {
                applied: None,
                partial: None,
            }),
        }
    }
}

/// How long before a deadline [`sleep_until_precise`] switches to a timerfd.
const PRECISE_TAIL: Duration = Duration::from_millis(5);

/// Sleeps until `deadline` to the microsecond: tokio's timer rounds deadlines up to whole
/// milliseconds, which showed as up to a millisecond of "deadline → reaped". Falls back to
/// tokio's timer if no timerfd can be had.
pub(super) async fn sleep_until_precise(deadline: tokio::time::Instant) {
    // tokio's timer (whole milliseconds, may fire up to one late) until close to the
    // deadline, and a timerfd only for the last stretch: most calls end long before their
    // deadline and never pay the timerfd's five syscalls (create, arm, register, deregister,
    // close) on their critical path.
    let coarse = deadline.checked_sub(PRECISE_TAIL);
    if let Some(coarse) = coarse
        && coarse > tokio::time::Instant::now()
    {
        tokio::time::sleep_until(coarse).await;
    }
    let after = deadline.saturating_duration_since(tokio::time::Instant::now());
    match sys::oneshot_timerfd(after).and_then(sys::register_async_fd) {
        Ok(timer) => {
            let _ = timer.readable().await;
        }
        Err(_) => tokio::time::sleep_until(deadline).await,
    }
}

pub(super) async fn wait_cancel(cancel: Option<&CancelSignal>) {
    match cancel {
        Some(signal) => signal.cancelled().await,
        None => std::future::pending().await,
    }
}
