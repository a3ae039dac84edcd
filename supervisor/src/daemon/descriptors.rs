//! The daemon's open-file limit: what its limits can use, and raising the soft limit to it.
//!
//! Every call in flight holds descriptors in the daemon (its client's socket, the worker's
//! socket, pidfd, seccomp listener and network namespace, its cgroup's counter files), so
//! `--max-concurrent` is bounded by `RLIMIT_NOFILE` as much as by the flag. So are the
//! descriptors held whatever the daemon serves (its runtime, the spawner threads' reserved
//! low numbers), those kept between calls for reuse (idle network namespaces, kept
//! cgroups' counters) and idle pooled workers'. The soft limit many shells and service
//! managers give is 1,024: well under a hundred calls. The daemon raises its soft limit
//! to the hard limit at start, and runs fewer calls at once when even that is short.
//! Workers never see the raised limit: each sets the open-file limit its profile gives
//! before the tool starts.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

use super::DaemonConfig;

/// Descriptors one call in flight may hold (eleven measured under cgroup v1 with the memory
/// and pids controllers; an egress proxy's connections come on top).
const PER_CALL: u64 = 16;

/// Descriptors an idle pooled worker holds (nine measured under cgroup v1: its socket,
/// pidfd, seccomp listener, network namespace and cgroup counters), or a root template's
/// holder (fewer).
const PER_IDLE_WORKER: u64 = 10;

/// Descriptors the supervisor keeps between calls at most, for reuse.
const KEPT: u64 = crate::spawn::IDLE_NAMESPACES as u64 + crate::cgroup::SPARE_CGROUP_FILES as u64;

/// Descriptors assumed held at start when `/proc/self/fd` cannot be read (about what a
/// daemon with a pool holds: runtime, spawner threads' reserved numbers, pooled workers).
const HELD_UNCOUNTED: u64 = 128;

/// The daemon's open-file limit after [`provide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpenFiles {
    /// Descriptors open when the daemon started serving.
    pub held: u64,
    /// What `config`'s limits can use at most beside them (see [`needed`]).
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
    /// room (beside what is held, what may be kept, every connection `max_connections`
    /// allows and every idle pooled worker) for fewer calls' worth of descriptors, at
    /// least one. A call beyond the room would fail for want of a descriptor; held back,
    /// it waits in the queue like any call over the limit.
    pub fn calls_at_once(&self, config: &DaemonConfig) -> usize {
        let room = self
            .limit
            .saturating_sub(self.held)
            .saturating_sub(KEPT)
            .saturating_sub(count(config.max_connections))
            .saturating_sub(idle(config))
            / PER_CALL;
        let room = usize::try_from(room).unwrap_or(usize::MAX);
        config.max_concurrent.max(1).min(room.max(1))
    }
}

/// Descriptors the daemon can hold with `config`'s limits when it holds `held` at start:
/// what may be kept for reuse, one per connection, and a call's worth for each call in
/// flight and each idle pooled worker. Queued calls hold only their connection.
pub(crate) fn needed(config: &DaemonConfig, held: u64) -> u64 {
    held.saturating_add(KEPT)
        .saturating_add(count(config.max_connections))
        .saturating_add(idle(config))
        .saturating_add(count(config.max_concurrent).saturating_mul(PER_CALL))
}

/// Descriptors the idle pooled workers may hold. Those warm at start are counted in what
/// is held then as well: a few dozen descriptors too many, never too few.
fn idle(config: &DaemonConfig) -> u64 {
    u64::try_from(config.idle_workers)
        .unwrap_or(u64::MAX)
        .saturating_mul(PER_IDLE_WORKER)
}

/// A flag's count (at least one, as the daemon takes it), saturating.
fn count(flag: usize) -> u64 {
    u64::try_from(flag.max(1)).unwrap_or(u64::MAX)
}

/// Raises the soft open-file limit to the hard limit, counts the descriptors open now and
/// measures the limit against what `config` can use beside them. A failure to raise it
/// leaves the limit as it was (logged, not fatal: the daemon then runs as many calls at
/// once as that limit has room for).
pub(crate) fn provide(config: &DaemonConfig) -> OpenFiles {
    let held = held_now();
    OpenFiles {
        held,
        needed: needed(config, held),
        limit: raise_open_file_limit(),
    }
}

/// About how many descriptors `airlock serve` with `config` can hold: [`needed`] with
/// what a daemon typically holds at start, for a report made outside the daemon
/// (`airlock doctor`).
pub fn open_files_needed_by(config: &DaemonConfig) -> u64 {
    needed(config, HELD_UNCOUNTED)
}

/// Descriptors this process holds now, or [`HELD_UNCOUNTED`] if they cannot be listed.
fn held_now() -> u64 {
    match std::fs::read_dir("/proc/self/fd") {
        // The listing's own descriptor is among the entries.
        Ok(entries) => u64::try_from(entries.count())
            .unwrap_or(u64::MAX)
            .saturating_sub(1),
        Err(error) => {
            tracing::debug!(%error, "cannot count open descriptors");
            HELD_UNCOUNTED
        }
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

    /// What a daemon without a pool holds when it starts serving (measured: 87 with
    /// `--max-concurrent 64`, most of them the spawner threads' reserved numbers).
    const HELD: u64 = 90;

    #[test]
    fn the_defaults_fit_the_common_soft_limit() {
        assert!(needed(&config(8, 128), HELD) <= 1024);
        assert!(needed(&config(8, 128), HELD_UNCOUNTED) <= 1024);
    }

    #[test]
    fn a_thousand_concurrent_calls_need_more_than_the_common_soft_limit() {
        let needed = needed(&config(1024, 2048), HELD);
        assert_eq!(needed, HELD + KEPT + 2048 + 1024 * 16);
        let open = OpenFiles {
            held: HELD,
            needed,
            limit: 1024,
        };
        assert!(!open.suffices());
    }

    #[test]
    fn what_is_kept_for_reuse_counts_every_idle_namespace_and_kept_counter() {
        // 32 namespaces; 16 cgroups of five counter files (v1's memory and pids).
        assert_eq!(KEPT, 32 + 16 * 5);
    }

    #[test]
    fn calls_beyond_the_descriptors_room_wait_instead_of_running() {
        let config = config(64, 64);
        let short = |limit| OpenFiles {
            held: HELD,
            needed: needed(&config, HELD),
            limit,
        };
        assert_eq!(
            short(512).calls_at_once(&config),
            usize::try_from((512 - HELD - KEPT - 64) / 16).unwrap()
        );
        // No room at all still runs one call at a time rather than none.
        assert_eq!(short(256).calls_at_once(&config), 1);
        assert_eq!(short(0).calls_at_once(&config), 1);
        // Room for more than asked: the flag holds.
        assert_eq!(short(1 << 20).calls_at_once(&config), 64);
        // At exactly what is needed, every call asked for runs at once.
        let exact = short(needed(&config, HELD));
        assert!(exact.suffices());
        assert_eq!(exact.calls_at_once(&config), 64);
    }

    #[test]
    fn idle_pooled_workers_take_room_from_calls() {
        let mut pooled = config(64, 64);
        pooled.idle_workers = 8;
        let open = OpenFiles {
            held: HELD,
            needed: needed(&pooled, HELD),
            limit: 1024,
        };
        assert_eq!(
            needed(&pooled, HELD),
            needed(&config(64, 64), HELD) + 8 * 10
        );
        assert_eq!(
            open.calls_at_once(&pooled),
            usize::try_from((1024 - HELD - KEPT - 64 - 8 * 10) / 16).unwrap()
        );
    }

    #[test]
    fn a_pooled_daemon_with_the_defaults_fits_the_common_soft_limit() {
        // --pool 4 (at most 16 idle) for a profile, its template's holder, and as many
        // sessions' workers; the four warm at start are in what is held then, too.
        let mut pooled = config(8, 128);
        pooled.idle_workers = (16 + 1) + 16;
        let open = OpenFiles {
            held: HELD + 4 * 10,
            needed: needed(&pooled, HELD + 4 * 10),
            limit: 1024,
        };
        assert!(open.suffices(), "{open:?}");
        assert_eq!(open.calls_at_once(&pooled), 8);
    }

    #[test]
    fn flags_at_their_largest_saturate_instead_of_overflowing() {
        assert_eq!(needed(&config(usize::MAX, usize::MAX), HELD), u64::MAX);
        let mut pooled = config(1, 1);
        pooled.idle_workers = usize::MAX;
        assert_eq!(needed(&pooled, HELD), u64::MAX);
    }

    #[test]
    fn the_descriptors_held_are_counted_from_the_process() {
        let extra: Vec<std::fs::File> = (0..64)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        // Other tests' threads may open or close theirs meanwhile: at least these and stdio.
        let held = held_now();
        assert!((64 + 3..HELD_UNCOUNTED * 8).contains(&held), "{held}");
        drop(extra);
    }
}
