//! One call on one worker: take a pooled worker or make one, send the call, wait for the
//! report, the deadline or a cancellation, end the worker, and build the result.

use std::sync::Arc;
use std::time::Instant;

use airlock_policy::seccomp::Form;
use airlock_protocol::{RunRequest, StdioMode, SupervisorMessage, ToolExit, WorkerMessage};

use super::deadline::{Bounds, sleep_until_precise, wait_cancel};
use super::lease::{WorkerLease, reap_worker, release_later, wait_for_exit};
use super::outcome::{Conversation, Outcome, RunFacts, result_of};
use super::warm::ReplenishOnDrop;
use super::worker::{PrepareError, ReadyWorker, WorkerOrder};
use super::{ActiveCall, SandboxRun, Supervisor, duration_ms};
use crate::cancel::CancelSignal;
use crate::channel::{ChannelError, WorkerChannel};
use crate::denials::{SeccompWatch, SyscallDenials};
use crate::egress::{EgressSummary, EventSink};
use crate::observe::{ObservationLog, RecordProxied, Watching};
use crate::result::{AppliedLimits, ErrorKind, ToolError, ToolResult};

impl Supervisor {
    /// Runs `run` in a fresh sandbox and returns its result. `cancel` ends it early. A
    /// pre-confined idle worker of the same profile is used when the pool has one.
    pub async fn run(&self, run: SandboxRun, cancel: Option<&CancelSignal>) -> ToolResult {
        self.run_observed(run, cancel, None).await
    }

    /// As [`Supervisor::run`], giving each of the call's egress connections to
    /// `network_events` as it ends (the result's `network` keeps only the first ones).
    pub async fn run_observed(
        &self,
        run: SandboxRun,
        cancel: Option<&CancelSignal>,
        network_events: Option<Arc<dyn EventSink>>,
    ) -> ToolResult {
        // Boxed: a call's state is large (more so unoptimised), and a caller that blocks on
        // it keeps the future on its own stack, a test thread's 2 MiB among them.
        Box::pin(self.run_with(run, cancel, network_events, Watching::Refusals)).await
    }

    /// Runs `run` to learn a profile for it (`airlock learn`): its profile's seccomp program
    /// is the learning form (`airlock_policy::seccomp::Form::Learning`), whose observed
    /// syscalls are recorded into `log` and let run. Always in a fresh worker, never a
    /// pooled one.
    pub async fn run_learning(&self, run: SandboxRun, log: ObservationLog) -> ToolResult {
        // Its proxy (the learner gives it a recording policy) records every destination
        // asked for into the same log.
        let proxied: Arc<dyn EventSink> = Arc::new(RecordProxied(Arc::clone(&log)));
        Box::pin(self.run_with(run, None, Some(proxied), Watching::Learn(log))).await
    }

    async fn run_with(
        &self,
        run: SandboxRun,
        cancel: Option<&CancelSignal>,
        network_events: Option<Arc<dyn EventSink>>,
        watching: Watching,
    ) -> ToolResult {
        // A profile compiled in the observing form is diagnosed: its program hands over
        // observed syscalls, which the listener must look at and let run.
        let watching = match watching {
            Watching::Refusals if run.profile.seccomp_form == Form::Observing => Watching::Diagnose,
            other => other,
        };
        let _active = ActiveCall::enter(&self.active);
        if self.closing.is_cancelled() {
            return ToolResult::rejected(
                &run.call_id,
                &run.tool,
                ToolError::new(ErrorKind::Cancelled, "the supervisor is closing"),
            );
        }
        let started = Instant::now();
        let profile = Arc::clone(&run.profile);
        let bounds = Bounds {
            deadline: tokio::time::Instant::from_std(started + run.timeout),
            cancel,
        };

        // Pooled workers have /dev/null stdio, so only captured runs can use them. A
        // session's profile (with its workspace) is pooled only in that session's own pool
        // (`keep_session_worker`): its key digests a spec naming the session's directory.
        let poolable = run.inherit_stdio.is_none() && matches!(watching, Watching::Refusals);
        let key = if poolable {
            self.pool_keys.of(&profile)
        } else {
            String::new()
        };
        let pooled = if poolable {
            self.take_pooled(&key, bounds).await
        } else {
            None
        };
        // Replenish once this call has answered (however it ends).
        let _replenish = pooled.is_some().then(|| ReplenishOnDrop {
            pool: &self.pool,
            key: &key,
        });
        let hit = pooled.is_some();
        let worker = match pooled {
            Some(worker) => Ok(worker),
            None => {
                if poolable {
                    self.pool.note_miss();
                    self.grow_pool(&key);
                }
                // A cold call sends its Run right behind the Setup: the worker finds it
                // waiting when it is ready, one wake-up round trip sooner. Not under a CPU
                // quota, which is written between Ready and Run (see `enforce_cpu_quota`).
                let run_now = profile
                    .limits
                    .cpu_quota_percent
                    .is_none()
                    .then(|| run_request(&run));
                let template = if matches!(watching, Watching::Refusals) {
                    self.cold_template(&profile, bounds).await
                } else {
                    // Learning and diagnosing calls: their profiles are compiled for the
                    // one run, so a template would serve no other call.
                    None
                };
                let order = WorkerOrder {
                    profile: &profile,
                    inherit_stdio: run.inherit_stdio.as_ref(),
                    run_now,
                    template: template.as_ref(),
                };
                let prepared = self.prepare_worker(order, bounds).await;
                if let (Some(_), Err(PrepareError::Failed(failed, _))) = (&template, &prepared)
                    && matches!(
                        failed,
                        Conversation::SetupFailed { .. } | Conversation::Broken(_)
                    )
                {
                    // As the pool does: the next workers build their own roots for a
                    // while rather than retry a template that may be the cause.
                    self.templates
                        .set_aside(&profile, self.worker_network(&profile));
                }
                prepared
            }
        };
        tracing::debug!(
            elapsed_us = started.elapsed().as_micros() as u64,
            "worker ready"
        );
        if let (Ok(_), Some(observe)) = (&worker, self.spawn_observer.0.get()) {
            observe(hit, started.elapsed());
        }
        let (conversation, mut lease, channel, evidence) = match worker {
            Ok(worker) => {
                let (conversation, lease, channel, evidence) = self
                    .run_on_worker(worker, &run, bounds, network_events, watching)
                    .await;
                (conversation, lease, Some(channel), evidence)
            }
            Err(PrepareError::Rejected(error)) => {
                let facts = facts_of(&run, duration_ms(started.elapsed()));
                return result_of(&facts, Outcome::Refused(*error));
            }
            Err(PrepareError::Failed(conversation, lease)) => {
                (conversation, *lease, None, Evidence::default())
            }
        };
        tracing::debug!(
            elapsed_us = started.elapsed().as_micros() as u64,
            "conversation over"
        );
        let cgroup = lease.cgroup.as_ref().map(|c| c.version().to_string());
        let mut audit = lease.audit.take();

        // Single-use worker: whatever happened, it and everything it started die now.
        let stats = if matches!(conversation, Conversation::Finished { .. }) {
            // The tool and everything it started are gone (the worker reaped them before
            // it reported) and the worker refuses nothing itself: every record of theirs
            // is queued, ahead of this marker.
            if let Some(audit) = &mut audit {
                audit.mark(&run.call_id);
            }
            // The tool has exited and reported, and the worker killed whatever the tool
            // left: the counters are final. Answer now; kill, reap and remove the cgroup
            // off the critical path (still counted as active, so `close` waits for it).
            let stats = lease.cgroup.as_ref().and_then(|c| c.read_stats().ok());
            let cleanup = ActiveCall::enter(&self.active);
            let one_shot = self.one_shot;
            tokio::spawn(async move {
                // The orderly end of the conversation, off the critical path; the worker
                // is killed right after in any case.
                if let Some(mut channel) = channel {
                    let _ = channel.send(&SupervisorMessage::Shutdown).await;
                }
                // A finished worker is PID 1 of its pid namespace and every process in its
                // cgroup is in that namespace: killing it ends them all, and the cgroup,
                // never written a `cgroup.kill`, stays fit for reuse (see `kill_worker_only`).
                lease.kill_worker_only();
                if let Some(pidfd) = &lease.pidfd {
                    wait_for_exit(pidfd).await;
                }
                release_later(lease, cleanup, one_shot);
            });
            stats
        } else {
            // Timeouts, cancellations and failures answer only once everything is reaped:
            // the worker is PID 1 of its namespace, so once it is reaped every process of
            // the tool is gone. Removing the then-empty cgroup happens after the answer.
            let stats = reap_worker(&lease).await;
            // Reaped, with every process of its namespace: its records are all queued.
            if let Some(audit) = &mut audit {
                audit.mark(&run.call_id);
            }
            release_later(lease, ActiveCall::enter(&self.active), self.one_shot);
            stats
        };
        let landlock = match audit {
            Some(audit) => audit.refusals(&run.call_id).await,
            None => None,
        };
        tracing::debug!(
            elapsed_us = started.elapsed().as_micros() as u64,
            "result ready"
        );
        let facts = facts_of(&run, duration_ms(started.elapsed()));
        let outcome = Outcome::Worker {
            conversation,
            cgroup,
            stats,
            network: evidence.network,
            seccomp: evidence.seccomp,
            landlock,
        };
        result_of(&facts, outcome)
    }

    /// Sends the one call to a ready worker and waits for its report, the deadline or a
    /// cancellation.
    async fn run_on_worker(
        &self,
        worker: ReadyWorker,
        run: &SandboxRun,
        bounds: Bounds<'_>,
        network_events: Option<Arc<dyn EventSink>>,
        watching: Watching,
    ) -> (Conversation, WorkerLease, WorkerChannel, Evidence) {
        let ReadyWorker {
            lease,
            mut channel,
            applied,
            run_sent,
            seccomp,
            egress,
        } = worker;
        // Before the call goes out: the tool's first connection finds the proxy serving,
        // and its first refused syscall an answer.
        let proxy =
            egress.and_then(|listener| self.start_egress(listener, &run.profile, network_events));
        let watch = seccomp
            .and_then(|listener| SeccompWatch::start(listener, Arc::clone(&run.profile), watching));
        let request = (!run_sent).then(|| run_request(run));
        // Whether the whole Run is out: only then may a Stop follow it on the stream.
        let run_out = std::sync::atomic::AtomicBool::new(request.is_none());
        let ended = {
            let talk = run_over(&mut channel, request, &run_out);
            tokio::pin!(talk);
            tokio::select! {
                outcome = &mut talk => Err(match outcome {
                    Ok(report) => Conversation::Finished {
                        applied: applied.clone(),
                        report: Box::new(report),
                    },
                    Err(broken) => broken,
                }),
                () = sleep_until_precise(bounds.deadline) => Ok(Ended::Deadline),
                () = wait_cancel(bounds.cancel) => Ok(Ended::Cancelled),
                () = self.closing.cancelled() => Ok(Ended::Closing),
            }
        };
        let conversation = match ended {
            Err(conversation) => conversation,
            Ok(ended) => {
                // The worker stops the tool and reports what it wrote so far; one that does
                // not within the grace is killed without (and so is the tool, with it). A
                // closing supervisor does not wait.
                let partial = if run_out.load(std::sync::atomic::Ordering::Relaxed)
                    && ended != Ended::Closing
                {
                    stop_and_collect(&mut channel, self.stop_grace).await
                } else {
                    Stopped::Nothing
                };
                let finished = applied.clone();
                let applied = Some(applied.clone());
                match (ended, partial) {
                    // The tool ended on its own as the stop went out: its real outcome.
                    (_, Stopped::Finished(report)) => Conversation::Finished {
                        applied: finished,
                        report: Box::new(report),
                    },
                    (Ended::Deadline, Stopped::Partial(exit)) => Conversation::TimedOut {
                        applied,
                        partial: Some(Box::new(exit)),
                    },
                    (Ended::Deadline, Stopped::Nothing) => Conversation::TimedOut {
                        applied,
                        partial: None,
                    },
                    (_, Stopped::Partial(exit)) => Conversation::Cancelled {
                        applied,
                        partial: Some(Box::new(exit)),
                    },
                    (_, Stopped::Nothing) => Conversation::Cancelled {
                        applied,
                        partial: None,
                    },
                }
            }
        };
        // The conversation is over (the tool reported, or the deadline, a cancellation or
        // close ended it): so are its tunnels.
        let network = match proxy {
            Some(proxy) => proxy.finish().await,
            None => None,
        };
        let evidence = Evidence {
            network,
            seccomp: watch.map(SeccompWatch::finish),
        };
        (conversation, lease, channel, evidence)
    }
}

/// What the layers that watch a call saw of it, for its record.
#[derive(Debug, Default)]
struct Evidence {
    /// The egress proxy's summary, for a profile with one.
    network: Option<EgressSummary>,
    /// The seccomp listener's counts, when the filter had one and it was answered.
    seccomp: Option<SyscallDenials>,
}

/// What the worker is told to run for `run`.
fn run_request(run: &SandboxRun) -> RunRequest {
    RunRequest {
        call_id: run.call_id.clone(),
        tool: run.tool.clone(),
        argv: run.argv.clone(),
        stdin: run.stdin.clone(),
        arguments_json: run.arguments_json.clone(),
        output_limit_bytes: run.profile.limits.output_bytes,
        stdio: if run.inherit_stdio.is_some() {
            StdioMode::Inherit
        } else {
            StdioMode::Capture
        },
        builtin: run.builtin.clone(),
    }
}

/// Why a call's wait for its report ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Deadline,
    Cancelled,
    Closing,
}

/// What a worker told to stop answered.
enum Stopped {
    /// The tool's output until it was stopped.
    Partial(ToolExit),
    /// A report of a tool that had ended on its own (or could not start) before the stop.
    Finished(WorkerMessage),
    /// Nothing in time, or nothing valid.
    Nothing,
}

/// Tells the worker to stop the tool and waits at most `grace` for its report.
async fn stop_and_collect(channel: &mut WorkerChannel, grace: std::time::Duration) -> Stopped {
    if channel.send(&SupervisorMessage::Stop).await.is_err() {
        return Stopped::Nothing;
    }
    match tokio::time::timeout(grace, channel.receive()).await {
        Ok(Ok(WorkerMessage::Exited(exit))) if exit.stopped => Stopped::Partial(exit),
        Ok(Ok(report @ (WorkerMessage::Exited(_) | WorkerMessage::RunFailed { .. }))) => {
            Stopped::Finished(report)
        }
        _ => Stopped::Nothing,
    }
}

/// The second half: run (unless the Run went out with the Setup), report. `run_out` is
/// set once the Run is wholly written.
async fn run_over(
    channel: &mut WorkerChannel,
    request: Option<RunRequest>,
    run_out: &std::sync::atomic::AtomicBool,
) -> Result<WorkerMessage, Conversation> {
    if let Some(request) = request {
        channel
            .send(&SupervisorMessage::Run(request))
            .await
            .map_err(Conversation::Broken)?;
        run_out.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    match channel.receive().await {
        Ok(report @ (WorkerMessage::Exited(_) | WorkerMessage::RunFailed { .. })) => Ok(report),
        Ok(other) => Err(Conversation::Broken(ChannelError::Violation(format!(
            "expected Exited, got {}",
            other.name()
        )))),
        Err(e) => Err(Conversation::Broken(e)),
    }
}

/// What the result record says about `run` whatever its outcome.
fn facts_of(run: &SandboxRun, duration_ms_taken: u64) -> RunFacts<'_> {
    let limits = &run.profile.limits;
    RunFacts {
        call_id: &run.call_id,
        tool: &run.tool,
        limits: AppliedLimits {
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
            timeout_ms: duration_ms(run.timeout),
            output_bytes: limits.output_bytes,
        },
        rlimits: run.profile.spec.rlimits,
        seccomp_digest: &run.profile.spec.seccomp.digest,
        duration_ms: duration_ms_taken,
    }
}
