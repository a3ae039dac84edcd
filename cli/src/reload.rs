//! The signals of `airlock serve` and `airlock mcp`: SIGHUP reloads the policy, SIGTERM and
//! SIGINT stop.

use std::path::Path;
use std::sync::Arc;

use airlock::pool::PoolSize;
use airlock::{CancelSignal, Gate, Supervisor};
use airlock_policy::PolicyError;

/// Reloads the policy file into `gate`; an invalid file is refused (logged) and the old
/// policy kept. Unchanged profiles keep their pooled workers; changed and removed ones'
/// idle workers are killed and new ones warmed. True when the new policy is in force.
pub(crate) async fn reload_policy(
    path: &Path,
    gate: &Gate,
    supervisor: &Arc<Supervisor>,
    pool: Option<PoolSize>,
) -> bool {
    match airlock_policy::load_policy_file(path) {
        Ok(loaded) => {
            let in_use = crate::profiles_in_use(&loaded.policy);
            gate.reload(loaded.policy);
            tracing::info!(policy = %path.display(), "policy reloaded; pending approvals invalidated");
            if let Some(size) = pool {
                supervisor.warm_exactly(&in_use, size).await;
            }
            true
        }
        Err(e) => {
            let detail = match &e {
                PolicyError::Invalid { diagnostics, .. } => diagnostics
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
                other => other.to_string(),
            };
            tracing::error!(policy = %path.display(), error = %detail, "policy reload refused; keeping the old policy");
            false
        }
    }
}

/// Watches the signals until SIGTERM or SIGINT, which trigger `stop`. Each SIGHUP reloads
/// the policy at `path` into `gate`; the receiver counts the reloads that took effect.
pub(crate) fn watch_signals(
    path: &Path,
    gate: &Arc<Gate>,
    supervisor: &Arc<Supervisor>,
    pool: Option<PoolSize>,
    stop: &CancelSignal,
) -> std::io::Result<(
    tokio::task::JoinHandle<()>,
    tokio::sync::watch::Receiver<u64>,
)> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let (reloaded, reloads) = tokio::sync::watch::channel(0u64);
    let (path, gate, supervisor, stop) = (
        path.to_path_buf(),
        Arc::clone(gate),
        Arc::clone(supervisor),
        stop.clone(),
    );
    let watcher = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = interrupt.recv() => break,
                _ = hangup.recv() => {
                    if reload_policy(&path, &gate, &supervisor, pool).await {
                        reloaded.send_modify(|n| *n += 1);
                    }
                }
            }
        }
        stop.cancel();
    });
    Ok((watcher, reloads))
}
