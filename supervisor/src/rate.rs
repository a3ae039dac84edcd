//! Token buckets of the gate's rate limits, per session and per tool.
//!
//! Tool buckets are never forgotten: there are only as many as the policy has tools, and a
//! forgotten bucket would come back full, so forgetting one would lift its limit. An open
//! session's bucket is kept while the session is open, for the same reason: its id is a
//! capability the client cannot mint at will. A `session` that names no open session is
//! only a label the client chose; it could name a fresh one for every call anyway, so its
//! bucket binds only a client that keeps its label, and the oldest labels are forgotten
//! first to bound memory.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use airlock_policy::rules::RateLimit;

/// A token bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: SystemTime,
}

impl Bucket {
    fn full(limit: RateLimit, now: SystemTime) -> Self {
        Self {
            tokens: f64::from(limit.calls),
            updated: now,
        }
    }

    /// Refills for the time since the last take, then takes one token; false when empty.
    fn take(&mut self, limit: RateLimit, now: SystemTime) -> bool {
        let elapsed = now.duration_since(self.updated).unwrap_or(Duration::ZERO);
        let refill = elapsed.as_secs_f64() / limit.period.as_secs_f64() * f64::from(limit.calls);
        self.tokens = (self.tokens + refill).min(f64::from(limit.calls));
        self.updated = self.updated.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Most session labels (ids of no open session) tracked; the oldest are forgotten first.
const MAX_LABELS: usize = 10_000;

/// Open-session buckets kept before the ones of closed sessions are looked for and dropped.
const OPEN_SWEEP_FLOOR: usize = 1_024;

#[derive(Debug)]
pub(crate) struct RateState {
    tools: HashMap<String, Bucket>,
    open: HashMap<String, Bucket>,
    /// Size of `open` at which closed sessions' buckets are dropped next: twice what
    /// stayed after the last sweep, so sweeps cost O(1) per take amortised.
    open_sweep_at: usize,
    labels: HashMap<String, Bucket>,
    label_order: VecDeque<String>,
}

impl Default for RateState {
    fn default() -> Self {
        Self {
            tools: HashMap::new(),
            open: HashMap::new(),
            open_sweep_at: OPEN_SWEEP_FLOOR,
            labels: HashMap::new(),
            label_order: VecDeque::new(),
        }
    }
}

impl RateState {
    /// Takes one token from `tool`'s bucket; false when empty.
    pub(crate) fn take_tool(&mut self, tool: &str, limit: RateLimit, now: SystemTime) -> bool {
        if let Some(bucket) = self.tools.get_mut(tool) {
            return bucket.take(limit, now);
        }
        let mut bucket = Bucket::full(limit, now);
        let taken = bucket.take(limit, now);
        self.tools.insert(tool.to_string(), bucket);
        taken
    }

    /// Takes one token from session `id`'s bucket; false when empty. `is_open` says whether
    /// an id names a session open now.
    pub(crate) fn take_session(
        &mut self,
        id: &str,
        limit: RateLimit,
        now: SystemTime,
        is_open: impl Fn(&str) -> bool,
    ) -> bool {
        if let Some(bucket) = self.open.get_mut(id) {
            return bucket.take(limit, now);
        }
        if is_open(id) {
            if self.open.len() >= self.open_sweep_at {
                self.open.retain(|id, _| is_open(id));
                self.open_sweep_at = (self.open.len() * 2).max(OPEN_SWEEP_FLOOR);
            }
            let mut bucket = Bucket::full(limit, now);
            let taken = bucket.take(limit, now);
            self.open.insert(id.to_string(), bucket);
            return taken;
        }
        if let Some(bucket) = self.labels.get_mut(id) {
            return bucket.take(limit, now);
        }
        if self.label_order.len() >= MAX_LABELS
            && let Some(old) = self.label_order.pop_front()
        {
            self.labels.remove(&old);
        }
        let mut bucket = Bucket::full(limit, now);
        let taken = bucket.take(limit, now);
        self.label_order.push_back(id.to_string());
        self.labels.insert(id.to_string(), bucket);
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(calls: u32) -> RateLimit {
        RateLimit {
            calls,
            period: Duration::from_secs(60),
        }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn a_spent_tool_limit_survives_a_flood_of_new_session_names() {
        let mut rates = RateState::default();
        assert!(rates.take_tool("x", limit(1), at(1_000)));
        assert!(!rates.take_tool("x", limit(1), at(1_000)));
        for i in 0..MAX_LABELS + 10 {
            rates.take_session(&format!("s{i}"), limit(5), at(1_000), |_| false);
        }
        assert!(!rates.take_tool("x", limit(1), at(1_000)));
    }

    #[test]
    fn an_open_sessions_spent_limit_survives_a_flood_of_labels() {
        let mut rates = RateState::default();
        let open = |id: &str| id == "open";
        assert!(rates.take_session("open", limit(1), at(1_000), open));
        for i in 0..MAX_LABELS + 10 {
            rates.take_session(&format!("s{i}"), limit(5), at(1_000), open);
        }
        assert!(!rates.take_session("open", limit(1), at(1_000), open));
    }

    #[test]
    fn closed_sessions_buckets_are_dropped_once_enough_pile_up() {
        let mut rates = RateState::default();
        for i in 0..OPEN_SWEEP_FLOOR * 3 {
            let id = format!("s{i}");
            rates.take_session(&id, limit(5), at(1_000), |x| x == id);
        }
        assert!(rates.open.len() <= OPEN_SWEEP_FLOOR + 1);
    }

    #[test]
    fn a_bucket_refills_with_time() {
        let mut rates = RateState::default();
        assert!(rates.take_tool("x", limit(1), at(1_000)));
        assert!(!rates.take_tool("x", limit(1), at(1_030)));
        assert!(rates.take_tool("x", limit(1), at(1_061)));
    }
}
