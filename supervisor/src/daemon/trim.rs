//! Giving the allocator's free memory back after a burst of calls.
//!
//! After a burst, freed blocks stay resident in glibc's arenas until `malloc_trim` returns
//! their whole pages; blocks a thread freed into its own cache go back to the arena only
//! when that thread exits. A burst's clean-up runs on blocking threads that linger for the
//! runtime's keep-alive after it, so one trim at the moment the last call answers returned
//! little of it: one taken once those threads had exited took a settled daemon from 23 to
//! 14.6 MiB. So the daemon trims when it goes idle after calls, and again each time it is
//! still idle and has fewer threads than at its last trim.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Shared;

/// How often the daemon checks whether it went idle after calls.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// When to trim: only after calls, so an idle daemon does no work.
#[derive(Debug, Default)]
pub(super) struct Trimmer {
    calls_seen: u64,
    /// Calls came since the daemon was last idle.
    active: bool,
    /// Threads at the last trim since the daemon went idle.
    threads_at_trim: Option<usize>,
}

impl Trimmer {
    pub(super) fn new(calls: u64) -> Self {
        Self {
            calls_seen: calls,
            ..Self::default()
        }
    }

    /// Whether to trim now: `calls` the daemon has taken since it started, `busy` while
    /// calls or their workers' clean-up go on, and the process's `threads`, counted only
    /// when that decides (an idle or busy daemon reads no procfs).
    pub(super) fn tick(&mut self, calls: u64, busy: bool, threads: impl FnOnce() -> usize) -> bool {
        if calls != self.calls_seen {
            self.calls_seen = calls;
            self.active = true;
            self.threads_at_trim = None;
        }
        if busy || !self.active {
            return false;
        }
        let threads = threads();
        match self.threads_at_trim {
            Some(at_trim) if threads >= at_trim => false,
            _ => {
                self.threads_at_trim = Some(threads);
                true
            }
        }
    }
}

/// The process's threads, from procfs (`None` where it cannot be read: then only the trim
/// on going idle is made).
fn threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task")
        .ok()
        .map(|entries| entries.count())
}

/// Trims (off the async threads) whenever [`Trimmer`] says so.
pub(super) async fn give_back_memory_when_idle(shared: Arc<Shared>) {
    let mut trimmer = Trimmer::new(shared.stats.calls.load(Ordering::Relaxed));
    loop {
        tokio::time::sleep(IDLE_CHECK).await;
        let calls = shared.stats.calls.load(Ordering::Relaxed);
        let busy = shared.stats.in_flight.load(Ordering::SeqCst) > 0
            || shared.gate.supervisor().calls_in_flight() > 0;
        if trimmer.tick(calls, busy, || threads().unwrap_or(usize::MAX)) {
            let _ = tokio::task::spawn_blocking(crate::sys::give_back_free_heap).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One look: calls so far, busy or not, and the thread count if it is asked for.
    fn look(trimmer: &mut Trimmer, calls: u64, busy: bool, threads: usize) -> bool {
        trimmer.tick(calls, busy, || threads)
    }

    #[test]
    fn an_idle_daemon_that_took_no_call_never_trims_nor_counts_its_threads() {
        let mut trimmer = Trimmer::new(5);
        for _ in 0..5 {
            assert!(!trimmer.tick(5, false, || panic!("counted threads while idle")));
        }
        assert!(!trimmer.tick(6, true, || panic!("counted threads while busy")));
    }

    #[test]
    fn it_trims_once_calls_and_their_clean_up_are_over_and_again_as_threads_exit() {
        let mut trimmer = Trimmer::new(0);
        // Calls, then their clean-up still running.
        assert!(!look(&mut trimmer, 100, true, 120));
        assert!(!look(&mut trimmer, 1024, true, 120));
        assert!(!look(&mut trimmer, 1024, true, 121));
        // Idle: trim; no more while nothing changes.
        assert!(look(&mut trimmer, 1024, false, 121));
        assert!(!look(&mut trimmer, 1024, false, 121));
        assert!(!look(&mut trimmer, 1024, false, 125));
        // The clean-up threads exit: trim again, each time there are fewer.
        assert!(look(&mut trimmer, 1024, false, 16));
        assert!(!look(&mut trimmer, 1024, false, 16));
        assert!(look(&mut trimmer, 1024, false, 14));
        // Unreadable thread counts give only the trim on going idle.
        assert!(!look(&mut trimmer, 1024, false, usize::MAX));
    }

    #[test]
    fn new_calls_start_over() {
        let mut trimmer = Trimmer::new(0);
        assert!(!look(&mut trimmer, 3, true, 20));
        assert!(look(&mut trimmer, 3, false, 20));
        // More calls, answered between two looks: trim again once idle, at any count.
        assert!(look(&mut trimmer, 4, false, 30));
        assert!(!look(&mut trimmer, 4, false, 30));
        // A call in flight holds every trim back.
        assert!(!look(&mut trimmer, 5, true, 10));
        assert!(look(&mut trimmer, 5, false, 10));
    }
}
