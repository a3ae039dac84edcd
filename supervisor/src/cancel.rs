//! Caller cancellation of a running call: trigger it and the worker tree is killed.

use std::sync::Arc;

use tokio::sync::watch;

/// Cancels the calls watching it when [`cancel`](Self::cancel) is called. Dropping a call's
/// future cancels it too (its worker is killed on drop).
#[derive(Debug, Clone)]
pub struct CancelSignal {
    sender: Arc<watch::Sender<bool>>,
}

impl Default for CancelSignal {
    fn default() -> Self {
        Self::new()
    }
}

impl CancelSignal {
    /// A fresh, untriggered signal.
    pub fn new() -> Self {
        Self {
            sender: Arc::new(watch::channel(false).0),
        }
    }

    /// Cancels every call watching this signal.
    pub fn cancel(&self) {
        self.sender.send_replace(true);
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        *self.sender.borrow()
    }

    /// Resolves once cancelled.
    pub async fn cancelled(&self) {
        let mut receiver = self.sender.subscribe();
        let _ = receiver.wait_for(|cancelled| *cancelled).await;
    }
}
