//! The daemon's open-file limit: what its limits can use, and raising the soft limit to it.
//!
//! Every call in flight holds descriptors in the daemon (its client's socket, the worker's
//! socket, pidfd, seccomp listener and network namespace, its cgroup's event and counter
//! files), so `--max-concurrent` is bounded by `RLIMIT_NOFILE` as much as by the flag. The
//! soft limit many shells and service managers give is 1,024: well under a hundred calls.
//! The daemon raises its soft limit to the hard limit at start, and runs fewer calls at once
//! when even that is short. Workers never see the raised limit: each sets the open-file
//! limit its profile gives before the tool starts.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

use super::DaemonConfig;

/// Descriptors the daemon holds whatever it serves: its socket, runtime, logs, pools.
const BASE: u64 = 64;
/// Descriptors one call in flight may hold (eleven measured under cgroup v1 with the memory
/// and pids controllers; an egress proxy's connections come on top).
const PER_CALL: u64 = 16;

/// The daemon's open-file limit after [`provide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpenFiles {
    /// What `config`'s limits can use at most (see [`needed`]).
    pub needed: u64,
    /// The soft limit now.
    pub limit: u64,
}

impl OpenFiles {
    /// Whether the limit leaves room for everything the configured limits admit.
    pub fn suffices(&self) -> bool {
        self.limit >= self.needed
    }

    /// The calls that may run at once: `max_concurrent`, or fewer when the limit leaves
    /// room (beside every connection `max_connections` allows) for fewer calls' worth of
    /// descriptors, at least one. A call beyond the room would fail for want of a
    /// descriptor; held back, it waits in the queue like any call over the limit.
    pub fn calls_at_once(&self, config: &DaemonConfig) -> usize {
        let room = self
            .limit
            .saturating_sub(BASE)
            .saturating_sub(count(config.max_connections))
            / PER_CALL;
        let room = usize::try_from(room).unwrap_or(usize::MAX);
        config.max_concurrent.max(1).min(room.max(1))
    }
}

/// Descriptors the daemon can hold with `config`'s limits: one per connection, and a
/// call's worth for each call in flight. Queued calls hold only their connection.
pub(crate) fn needed(config: &DaemonConfig) -> u64 {
    BASE.saturating_add(count(config.max_connections))
        .saturating_add(count(config.max_concurrent).saturating_mul(PER_CALL))
}

/// A flag's count (at least one, as the daemon takes it), saturating.
fn count(flag: usize) -> u64 {
    u64::try_from(flag.max(1)).unwrap_or(u64::MAX)
}

/// Raises the soft open-file limit to the hard limit and measures it against what `config`
/// can use. A failure to raise it leaves the limit as it was (logged, not fatal: the daemon
/// then runs as many calls at once as that limit has room for).
pub(crate) fn provide(config: &DaemonConfig) -> OpenFiles {
    OpenFiles {
        needed: needed(config),
        limit: raise_open_file_limit(),
    }
}

/// Raises this process's soft open-file limit to its hard limit (logging why not when it
/// cannot) and returns the soft limit then, 0 if it cannot be read. For programs that hold
/// a descriptor per concurrent call: the daemon, and the bench's clients of it.
pub fn raise_open_file_limit() -> u64 {
    match getrlimit(Resource::RLIMIT_NOFILE) {
        // The kernel keeps soft <= hard: only ever raised.
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(error) => {
                tracing::warn!(%error, soft, hard, "cannot raise the open-file limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(error) => {
            tracing::warn!(%error, "cannot read the open-file limit");
            0
        }
    }
}

/// The soft open-file limit now (0 if it cannot be read).
pub(crate) fn limit_now() -> u64 {
    getrlimit(Resource::RLIMIT_NOFILE).map_or(0, |(soft, _)| soft)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_concurrent: usize, max_connections: usize) -> DaemonConfig {
        let mut config = DaemonConfig::new("/nonexistent/airlock.sock".into());
        config.max_concurrent = max_concurrent;
        config.max_connections = max_connections;
        config
    }

    #[test]
    fn the_defaults_fit_the_common_soft_limit() {
        assert!(needed(&config(8, 128)) <= 1024);
    }

    #[test]
    fn a_thousand_concurrent_calls_need_more_than_the_common_soft_limit() {
        let needed = needed(&config(1024, 2048));
        assert_eq!(needed, 64 + 2048 + 1024 * 16);
        let open = OpenFiles {
            needed,
            limit: 1024,
        };
        assert!(!open.suffices());
    }

    #[test]
    fn calls_beyond_the_descriptors_room_wait_instead_of_running() {
        let config = config(64, 64);
        let short = |limit| OpenFiles {
            needed: needed(&config),
            limit,
        };
        assert_eq!(short(256).calls_at_once(&config), (256 - 64 - 64) / 16);
        // No room at all still runs one call at a time rather than none.
        assert_eq!(short(100).calls_at_once(&config), 1);
        assert_eq!(short(0).calls_at_once(&config), 1);
        // Room for more than asked: the flag holds.
        assert_eq!(short(1 << 20).calls_at_once(&config), 64);
    }

    #[test]
    fn flags_at_their_largest_saturate_instead_of_overflowing() {
        assert_eq!(needed(&config(usize::MAX, usize::MAX)), u64::MAX);
    }
}
