//! The daemon's open-file limit: what its limits and its policy can use, and raising the
//! soft limit to it.
//!
//! Every call in flight holds descriptors in the daemon (its client's socket, the worker's
//! socket, pidfd, seccomp listener and network namespace, its cgroup's counter files) and,
//! when its profile may go out, those of its egress proxy (both ends of every tunnel), so
//! `--max-concurrent` is bounded by `RLIMIT_NOFILE` as much as by the flag. So are the
//! descriptors held whatever the daemon serves (its runtime, the spawner threads' reserved
//! low numbers), those kept between calls for reuse (idle network namespaces, kept
//! cgroups' counters) and those of idle pooled workers and root templates, which depend on
//! the policy in force. The soft limit many shells and service managers give is 1,024: well
//! under a hundred calls. The daemon raises its soft limit to the hard limit at start; when
//! even that is short, a call waits until the descriptors its profile may hold are free,
//! beside what the pools of the policy in force (counted again at each reload) may hold.
//! Workers never see the raised limit: each sets the open-file limit its profile gives
//! before the tool starts.

use std::sync::{Arc, Mutex, PoisonError};

use airlock_policy::compile::CompiledPolicy;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore, watch};

use super::DaemonConfig;
use crate::egress::EgressLimits;
use crate::pool::PoolSize;

/// Descriptors one call in flight may hold beside its egress proxy's (eleven measured under
/// cgroup v1 with the memory and pids controllers).
const PER_CALL: u64 = 16;

/// Descriptors an idle pooled worker holds (nine measured under cgroup v1: its socket,
/// pidfd, seccomp listener, network namespace and cgroup counters; one more, its proxy's
/// listener, when it may go out), or a root template's holder (fewer).
const PER_IDLE_WORKER: u64 = 10;

/// Descriptors the supervisor keeps between calls at most, for reuse.
const KEPT: u64 = crate::spawn::IDLE_NAMESPACES as u64 + crate::cgroup::SPARE_CGROUP_FILES as u64;

/// Descriptors assumed held at start when `/proc/self/fd` cannot be read (about what a
/// daemon with a pool holds: runtime, spawner threads' reserved numbers, pooled workers).
const HELD_UNCOUNTED: u64 = 128;

/// What a policy asks of the daemon's descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Demand {
    /// Descriptors its idle pooled workers and root templates may hold.
    pub idle: u64,
    /// Descriptors its costliest call may hold.
    pub per_call: u64,
}

impl Demand {
    /// A daemon's demand before it knows its policy: no pool, calls that do not go out.
    const ORDINARY: Demand = Demand {
        idle: 0,
        per_call: PER_CALL,
    };
}

/// What `policy` asks of the descriptors with pools of `pool` and proxies within `egress`:
/// every pooled profile's idle workers, the root template each profile's calls clone their
/// roots from (cold calls build one too, pool or not), as many sessions' workers as one
/// pool's most; and its costliest call.
pub(crate) fn demand(
    policy: &CompiledPolicy,
    pool: Option<PoolSize>,
    egress: &EgressLimits,
) -> Demand {
    let used: std::collections::BTreeSet<&String> =
        policy.tools.values().map(|t| &t.tool.profile).collect();
    let templates = u64::try_from(used.len()).unwrap_or(u64::MAX);
    let workers = pool.map_or(0, |size| {
        let most = u64::try_from(size.max_idle()).unwrap_or(u64::MAX);
        u64::try_from(crate::pool::profiles_to_pool(policy).len())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
            .saturating_mul(most)
    });
    let per_call = policy
        .tools
        .keys()
        .map(|tool| call_cost(policy, tool, egress))
        .max()
        .unwrap_or(PER_CALL);
    Demand {
        idle: templates
            .saturating_add(workers)
            .saturating_mul(PER_IDLE_WORKER),
        per_call,
    }
}

/// Descriptors a call of `tool` may hold in the daemon: a call's own, and its proxy's when
/// the tool's profile may go out. A tool the policy does not name is refused before it
/// holds any beyond its connection.
pub(crate) fn call_cost(policy: &CompiledPolicy, tool: &str, egress: &EgressLimits) -> u64 {
    let goes_out = policy
        .tools
        .get(tool)
        .and_then(|t| policy.profiles.get(&t.tool.profile))
        .is_some_and(|profile| profile.egress.is_some());
    if goes_out {
        PER_CALL.saturating_add(egress.descriptors_at_most())
    } else {
        PER_CALL
    }
}

/// The daemon's open-file limit after [`provide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpenFiles {
    /// Descriptors open when the daemon started serving.
    pub held: u64,
    /// The soft limit now.
    pub limit: u64,
}

impl OpenFiles {
    /// Descriptors left for calls and the pools: the limit less what is held, what may be
    /// kept and one per connection `config` allows; at least one call's worth, so that
    /// calls run one at a time rather than never.
    pub fn for_calls(&self, config: &DaemonConfig) -> u64 {
        self.limit
            .saturating_sub(self.held)
            .saturating_sub(KEPT)
            .saturating_sub(count(config.max_connections))
            .max(PER_CALL)
    }

    /// Descriptors `config`'s limits can use with `demand`: what is held, what may be kept
    /// for reuse, one per connection, the pools', and the costliest call's for each call
    /// in flight. Queued calls hold only their connection.
    pub fn needed(&self, config: &DaemonConfig, demand: Demand) -> u64 {
        needed(config, self.held, demand)
    }

    /// The ordinary calls that may run at once with `demand`: `max_concurrent`, or fewer
    /// when the room left beside the pools has room for fewer calls, at least one.
    pub fn calls_at_once(&self, config: &DaemonConfig, demand: Demand) -> usize {
        let room = self
            .for_calls(config)
            .saturating_sub(withheld(self.for_calls(config), demand))
            / PER_CALL;
        let room = usize::try_from(room).unwrap_or(usize::MAX);
        config.max_concurrent.max(1).min(room.max(1))
    }
}

/// Descriptors held back from calls for the pools with `demand`, out of `for_calls`: all
/// the pools may hold, but never the last call's worth.
fn withheld(for_calls: u64, demand: Demand) -> u64 {
    demand.idle.min(for_calls.saturating_sub(PER_CALL))
}

fn needed(config: &DaemonConfig, held: u64, demand: Demand) -> u64 {
    held.saturating_add(KEPT)
        .saturating_add(count(config.max_connections))
        .saturating_add(demand.idle)
        .saturating_add(count(config.max_concurrent).saturating_mul(demand.per_call))
}

/// A count (at least one, as the daemon takes its flags), saturating.
fn count(n: usize) -> u64 {
    u64::try_from(n.max(1)).unwrap_or(u64::MAX)
}

/// Raises the soft open-file limit to the hard limit and counts the descriptors open now.
/// A failure to raise it leaves the limit as it was (logged, not fatal: the daemon then
/// runs as many calls at once as that limit has room for).
pub(crate) fn provide() -> OpenFiles {
    OpenFiles {
        held: held_now(),
        limit: raise_open_file_limit(),
    }
}

/// The descriptors a daemon's calls may take, shared out by what each may hold.
///
/// One semaphore of a permit per descriptor: a call takes as many as its profile may hold
/// before it runs and gives them back when it ends. What the pools of the policy in force
/// may hold is taken out of it by a task of its own ([`Room::keep_withholding`]), again
/// whenever a reload changes it, so calls never count on descriptors idle workers hold.
#[derive(Debug)]
pub(crate) struct Room {
    open: OpenFiles,
    pool: Option<PoolSize>,
    egress: EgressLimits,
    /// Permits: [`OpenFiles::for_calls`].
    descriptors: Arc<Semaphore>,
    for_calls: u64,
    seen: Mutex<Seen>,
    withhold: watch::Sender<u64>,
}

/// The policy a [`Room`] last counted, and what it asked.
#[derive(Debug)]
struct Seen {
    policy: Arc<CompiledPolicy>,
    demand: Demand,
}

/// A call's share of the descriptors, given back when dropped.
#[derive(Debug)]
pub(crate) struct Share {
    _permits: OwnedSemaphorePermit,
}

impl Room {
    /// The room `config`'s limits leave under `open`, for `policy`; and the task that
    /// keeps the pools' share out of it, to be run for as long as the room is used.
    pub fn new(
        config: &DaemonConfig,
        open: OpenFiles,
        policy: Arc<CompiledPolicy>,
        egress: EgressLimits,
    ) -> (
        Arc<Self>,
        impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        // A semaphore's permits are bounded; an acquisition takes at most u32::MAX.
        let for_calls = open.for_calls(config).min(u64::from(u32::MAX));
        let descriptors = Arc::new(Semaphore::new(
            usize::try_from(for_calls).unwrap_or(usize::MAX),
        ));
        let demand = demand(&policy, config.pool, &egress);
        let first = withheld(for_calls, demand);
        // Taken now, before any call can: nothing else holds a permit yet.
        let held = u32::try_from(first)
            .ok()
            .and_then(|n| Arc::clone(&descriptors).try_acquire_many_owned(n).ok());
        let (withhold, target) = watch::channel(first);
        let room = Arc::new(Self {
            open,
            pool: config.pool,
            egress,
            descriptors: Arc::clone(&descriptors),
            for_calls,
            seen: Mutex::new(Seen { policy, demand }),
            withhold,
        });
        (room, Self::keep_withholding(descriptors, held, target))
    }

    /// What the policy in force asks, counted again (and the pools' share changed) when
    /// `policy` is not the one counted last.
    pub fn refresh(&self, config: &DaemonConfig, policy: &Arc<CompiledPolicy>) -> Demand {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if Arc::ptr_eq(&seen.policy, policy) {
            return seen.demand;
        }
        let demand = demand(policy, self.pool, &self.egress);
        *seen = Seen {
            policy: Arc::clone(policy),
            demand,
        };
        drop(seen);
        self.withhold.send_replace(withheld(self.for_calls, demand));
        self.warn_if_short(config, demand);
        demand
    }

    /// Logs, when the limit is below what `config` and `demand` can use, that calls will
    /// wait for descriptors.
    pub fn warn_if_short(&self, config: &DaemonConfig, demand: Demand) {
        let needed = self.open.needed(config, demand);
        if self.open.limit >= needed {
            tracing::debug!(
                limit = self.open.limit,
                held = self.open.held,
                needed,
                "open-file limit"
            );
            return;
        }
        tracing::warn!(
            limit = self.open.limit,
            held = self.open.held,
            needed,
            max_concurrent = config.max_concurrent,
            calls_at_once = self.open.calls_at_once(config, demand),
            "the open-file limit is below what the daemon can hold with its flags \
             (--max-concurrent, --max-connections, --pool) and its policy's pools and egress: \
             fewer calls run at once, the rest wait in the queue; raise the hard limit \
             (LimitNOFILE=, ulimit -Hn)"
        );
    }

    /// The ordinary calls that may run at once under the policy counted last (`stats`).
    pub fn calls_at_once(&self, config: &DaemonConfig) -> usize {
        self.open.calls_at_once(config, self.demand())
    }

    /// Descriptors the limits and the policy counted last can use (`stats`).
    pub fn needed(&self, config: &DaemonConfig) -> u64 {
        self.open.needed(config, self.demand())
    }

    fn demand(&self) -> Demand {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .demand
    }

    /// Descriptors a call of `tool` takes under `policy`: what it may hold, or all there
    /// is beside the pools when that is less (so it runs alone rather than never).
    pub fn cost(&self, policy: &CompiledPolicy, tool: &str) -> u32 {
        let room = self.for_calls.saturating_sub(*self.withhold.borrow());
        let cost = call_cost(policy, tool, &self.egress).min(room.max(1));
        u32::try_from(cost).unwrap_or(u32::MAX)
    }

    /// Waits for `cost` descriptors (see [`Room::cost`]), in the order calls asked.
    pub async fn take(&self, cost: u32) -> Result<Share, AcquireError> {
        Arc::clone(&self.descriptors)
            .acquire_many_owned(cost)
            .await
            .map(|permits| Share { _permits: permits })
    }

    /// Holds back, out of `descriptors`, as many as `target` says the pools may hold:
    /// taken in turn with the calls waiting (never from under a running call), given back
    /// at once when a reload asks for less. Starts with `held` taken.
    async fn keep_withholding(
        descriptors: Arc<Semaphore>,
        mut held: Option<OwnedSemaphorePermit>,
        mut target: watch::Receiver<u64>,
    ) {
        loop {
            let want = *target.borrow_and_update();
            let have = held
                .as_ref()
                .map_or(0, |p| u64::try_from(p.num_permits()).unwrap_or(u64::MAX));
            if have > want {
                let extra = usize::try_from(have - want).unwrap_or(usize::MAX);
                drop(held.as_mut().and_then(|p| p.split(extra)));
            } else if have < want {
                let more = u32::try_from(want - have).unwrap_or(u32::MAX);
                tokio::select! {
                    taken = Arc::clone(&descriptors).acquire_many_owned(more) => {
                        let Ok(taken) = taken else { return };
                        match held.as_mut() {
                            Some(p) => p.merge(taken),
                            None => held = Some(taken),
                        }
                        continue;
                    }
                    // A newer target: what was being taken goes back untaken.
                    changed = target.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        continue;
                    }
                }
            }
            if target.changed().await.is_err() {
                return;
            }
        }
    }
}

/// About how many descriptors `airlock serve` with `config` can hold before it knows its
/// policy: [`needed`] with what a daemon typically holds at start, for a report made
/// outside the daemon (`airlock doctor`).
pub fn open_files_needed_by(config: &DaemonConfig) -> u64 {
    needed(config, HELD_UNCOUNTED, Demand::ORDINARY)
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

    /// A policy of `profiles` profiles, each with one tool; the first `out` of them may
    /// reach one host.
    fn policy(profiles: usize, out: usize) -> Arc<CompiledPolicy> {
        let mut text = String::from("version = 1\n");
        for i in 0..profiles {
            text.push_str(&format!("[profiles.p{i}]\nread = [\"/usr\"]\n"));
            if i < out {
                text.push_str("network = { allow = [\"example.com:443\"] }\n");
            }
            text.push_str(&format!(
                "[tools.t{i}]\ndescription = \"t\"\ncommand = [\"/bin/true\"]\n\
                 side_effect = \"read\"\nprofile = \"p{i}\"\ninput = {{ type = \"object\" }}\n"
            ));
        }
        Arc::new(
            airlock_policy::load_policy_str(&text, "p.toml")
                .unwrap()
                .policy,
        )
    }

    fn open(limit: u64) -> OpenFiles {
        OpenFiles { held: HELD, limit }
    }

    #[test]
    fn the_defaults_fit_the_common_soft_limit() {
        assert!(needed(&config(8, 128), HELD, Demand::ORDINARY) <= 1024);
        assert!(open_files_needed_by(&config(8, 128)) <= 1024);
    }

    #[test]
    fn a_thousand_concurrent_calls_need_more_than_the_common_soft_limit() {
        let config = config(1024, 2048);
        let needed = open(1024).needed(&config, Demand::ORDINARY);
        assert_eq!(needed, HELD + KEPT + 2048 + 1024 * 16);
        assert!(needed > 1024);
    }

    #[test]
    fn what_is_kept_for_reuse_counts_every_idle_namespace_and_kept_counter() {
        // 32 namespaces; 16 cgroups of five counter files (v1's memory and pids).
        assert_eq!(KEPT, 32 + 16 * 5);
    }

    #[test]
    fn calls_beyond_the_descriptors_room_wait_instead_of_running() {
        let config = config(64, 64);
        let ordinary = Demand::ORDINARY;
        assert_eq!(
            open(512).calls_at_once(&config, ordinary),
            usize::try_from((512 - HELD - KEPT - 64) / 16).unwrap()
        );
        // No room at all still runs one call at a time rather than none.
        assert_eq!(open(256).calls_at_once(&config, ordinary), 1);
        assert_eq!(open(0).calls_at_once(&config, ordinary), 1);
        assert_eq!(open(0).for_calls(&config), PER_CALL);
        // Room for more than asked: the flag holds.
        assert_eq!(open(1 << 20).calls_at_once(&config, ordinary), 64);
        // At exactly what is needed, every call asked for runs at once.
        let exact = open(open(0).needed(&config, ordinary));
        assert_eq!(exact.calls_at_once(&config, ordinary), 64);
    }

    #[test]
    fn every_pooled_profile_its_template_and_the_sessions_workers_take_room_from_calls() {
        let mut pooled = config(64, 64);
        pooled.pool = Some(PoolSize::fixed(4));
        let egress = EgressLimits::default();
        // Three profiles: three pools of four, three templates, four sessions' workers.
        let demand = demand(&policy(3, 0), pooled.pool, &egress);
        assert_eq!(demand.idle, (3 * 4 + 3 + 4) * PER_IDLE_WORKER);
        assert_eq!(demand.per_call, PER_CALL);
        assert_eq!(
            open(1024).calls_at_once(&pooled, demand),
            usize::try_from((1024 - HELD - KEPT - 64 - demand.idle) / 16).unwrap()
        );
        // Without a pool the templates remain.
        let cold = super::demand(&policy(3, 0), None, &egress);
        assert_eq!(cold.idle, 3 * PER_IDLE_WORKER);
    }

    #[test]
    fn a_call_that_may_go_out_counts_its_proxys_descriptors() {
        let egress = EgressLimits::default();
        let policy = policy(2, 1);
        assert_eq!(
            call_cost(&policy, "t0", &egress),
            PER_CALL + 2 * 64 + 16 + 1 + 2 * 4
        );
        assert_eq!(call_cost(&policy, "t1", &egress), PER_CALL);
        assert_eq!(call_cost(&policy, "no such tool", &egress), PER_CALL);
        let demand = demand(&policy, None, &egress);
        assert_eq!(demand.per_call, PER_CALL + egress.descriptors_at_most());
        // Needed counts the costliest call for every call in flight.
        assert_eq!(
            open(0).needed(&config(10, 1), demand),
            HELD + KEPT + 1 + demand.idle + 10 * demand.per_call
        );
    }

    #[test]
    fn a_pool_larger_than_the_room_still_leaves_one_call_its_share() {
        let for_calls = 200;
        let huge = Demand {
            idle: 10_000,
            per_call: PER_CALL,
        };
        assert_eq!(withheld(for_calls, huge), for_calls - PER_CALL);
        assert_eq!(withheld(0, huge), 0);
    }

    #[test]
    fn flags_at_their_largest_saturate_instead_of_overflowing() {
        let demand = Demand::ORDINARY;
        assert_eq!(
            needed(&config(usize::MAX, usize::MAX), HELD, demand),
            u64::MAX
        );
        let huge = Demand {
            idle: u64::MAX,
            per_call: u64::MAX,
        };
        assert_eq!(needed(&config(1, 1), HELD, huge), u64::MAX);
        assert_eq!(open(u64::MAX).calls_at_once(&config(3, 1), huge), 1);
    }

    #[tokio::test]
    async fn a_reload_takes_the_pools_share_from_calls_and_gives_it_back() {
        let mut pooled = config(64, 1);
        pooled.pool = Some(PoolSize::fixed(2));
        let open = OpenFiles {
            held: 0,
            limit: KEPT + 1 + 1000,
        };
        let small = policy(1, 0);
        let (room, withholding) =
            Room::new(&pooled, open, Arc::clone(&small), EgressLimits::default());
        let task = tokio::spawn(withholding);
        // One pool of two, one template, two sessions' workers.
        let first = (2 + 1 + 2) * PER_IDLE_WORKER;
        assert_eq!(room.descriptors.available_permits(), 1000 - 50);
        assert_eq!(first, 50);
        // Twelve pooled profiles: twelve pools of two, twelve templates, two sessions'.
        let large = policy(12, 0);
        room.refresh(&pooled, &large);
        let withheld = (12 * 2 + 12 + 2) * PER_IDLE_WORKER;
        wait_for(&room, 1000 - withheld).await;
        assert_eq!(
            room.calls_at_once(&pooled),
            usize::try_from((1000 - withheld) / 16).unwrap()
        );
        // A running call's share is never taken from under it: the pools' share waits.
        let share = room.take(600).await.unwrap();
        room.refresh(&pooled, &small);
        wait_for(&room, 1000 - 50 - 600).await;
        let other = room.take(300).await.unwrap();
        let again = policy(12, 0);
        room.refresh(&pooled, &again);
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        // What is free goes to the pools' share as it comes; the calls keep theirs.
        assert!(room.descriptors.available_permits() <= 50);
        drop(share);
        drop(other);
        wait_for(&room, 1000 - withheld).await;
        task.abort();
    }

    /// Waits (on the task's progress, not on time) until `room` has `free` permits.
    async fn wait_for(room: &Room, free: u64) {
        let free = usize::try_from(free).unwrap();
        while room.descriptors.available_permits() != free {
            tokio::task::yield_now().await;
        }
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
