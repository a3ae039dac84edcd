//! Token buckets of the gate's rate limits, per session and per tool.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use airlock_policy::rules::RateLimit;

/// A token bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: SystemTime,
}

/// Most distinct sessions tracked for rate limiting (oldest forgotten first).
const MAX_SESSIONS: usize = 10_000;

#[derive(Debug, Default)]
pub(crate) struct RateState {
    buckets: HashMap<String, Bucket>,
    order: VecDeque<String>,
}

impl RateState {
    /// Takes one token from `key`'s bucket; false when empty.
    pub(crate) fn take(&mut self, key: &str, limit: RateLimit, now: SystemTime) -> bool {
        if !self.buckets.contains_key(key) {
            if self.order.len() >= MAX_SESSIONS
                && let Some(old) = self.order.pop_front()
            {
                self.buckets.remove(&old);
            }
            self.order.push_back(key.to_string());
            self.buckets.insert(
                key.to_string(),
                Bucket {
                    tokens: f64::from(limit.calls),
                    updated: now,
                },
            );
        }
        let Some(bucket) = self.buckets.get_mut(key) else {
            return false;
        };
        let elapsed = now.duration_since(bucket.updated).unwrap_or(Duration::ZERO);
        let refill = elapsed.as_secs_f64() / limit.period.as_secs_f64() * f64::from(limit.calls);
        bucket.tokens = (bucket.tokens + refill).min(f64::from(limit.calls));
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}
