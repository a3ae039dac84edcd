//! The time source of approvals, rate limits and session expiry (injectable for tests).

use std::time::SystemTime;

/// The time source of approvals, rate limits and session expiry.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now.
    fn now(&self) -> SystemTime;
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}
