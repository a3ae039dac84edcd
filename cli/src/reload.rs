//! The signals of `airlock serve` and `airlock mcp`: SIGHUP reloads the policy, and so does
//! a change of its file; SIGTERM and SIGINT stop.

use std::path::Path;
use std::sync::Arc;

use airlock::pool::PoolSize;
use airlock::{CancelSignal, Gate, Supervisor};
use airlock_policy::{LoadedPolicy, PolicyError};

use crate::watch::{PolicyWatch, SETTLE, Settled, Snapshot, WatchError, read_settled};

/// Reloads the policy file into `gate`; an invalid file is refused (logged) and the old
/// policy kept. Unchanged profiles keep their pooled workers; changed and removed ones'
/// idle workers are killed and new ones warmed. True when the new policy is in force.
pub(crate) async fn reload_policy(
    path: &Path,
    gate: &Gate,
    supervisor: &Arc<Supervisor>,
    pool: Option<PoolSize>,
) -> bool {
    if !path_trusted(path) {
        return false;
    }
    let loaded = airlock_policy::load_policy_file(path);
    apply(path, loaded, gate, supervisor, pool).await
}

/// Whether a reload may read the policy at `path`: its file and directories may have
/// changed hands since the daemon started. Refusals are logged.
fn path_trusted(path: &Path) -> bool {
    match crate::trust::trusted_policy(path) {
        Ok(()) => true,
        Err(e) => {
            refused(path, &format!("{:#}", anyhow::Error::from(e)));
            false
        }
    }
}

/// [`reload_policy`] from the text the watch read, settled: the file is not read again,
/// so what was checked for stillness is what is loaded.
async fn reload_text(
    path: &Path,
    text: Vec<u8>,
    gate: &Gate,
    supervisor: &Arc<Supervisor>,
    pool: Option<PoolSize>,
) -> bool {
    if !path_trusted(path) {
        return false;
    }
    let name = path.display().to_string();
    let loaded = match String::from_utf8(text) {
        Ok(text) => airlock_policy::load_policy_str(&text, &name),
        Err(e) => Err(PolicyError::Read {
            path: name,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
        }),
    };
    apply(path, loaded, gate, supervisor, pool).await
}

/// Puts `loaded` in force, or logs why not.
async fn apply(
    path: &Path,
    loaded: Result<LoadedPolicy, PolicyError>,
    gate: &Gate,
    supervisor: &Arc<Supervisor>,
    pool: Option<PoolSize>,
) -> bool {
    match loaded {
        Ok(loaded) => {
            let in_use = airlock::pool::profiles_to_pool(&loaded.policy);
            gate.reload(loaded.policy);
            tracing::info!(policy = %path.display(), "policy reloaded; pending approvals invalidated");
            if let Some(size) = pool {
                supervisor.warm_exactly(&in_use, size).await;
            }
            supervisor.forget_unused_templates(&in_use);
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
            refused(path, &detail);
            false
        }
    }
}

fn refused(path: &Path, detail: &str) {
    tracing::error!(policy = %path.display(), error = %detail, "policy reload refused; keeping the old policy");
}

/// What the file watch last saw of the policy file.
#[derive(Debug, Default)]
struct Seen {
    /// The SHA-256 of a text that was refused (its refusal is logged once, not at every
    /// later change in the directory).
    refused: Option<String>,
}

impl Seen {
    /// The digest of `text` when it differs from the policy in force and from the text
    /// last refused.
    fn differs(&self, text: &[u8], gate: &Gate) -> Option<String> {
        let digest = airlock_policy::compile::sha256_hex(text);
        let known = digest == gate.policy().version || self.refused.as_ref() == Some(&digest);
        (!known).then_some(digest)
    }
}

/// The next settled change of the watched directory; never, without a watch.
async fn next_change(watch: &mut Option<PolicyWatch>) -> Result<(), WatchError> {
    match watch {
        Some(watch) => watch.changed().await,
        None => std::future::pending().await,
    }
}

/// Watches the signals until SIGTERM or SIGINT, which trigger `stop`. Each SIGHUP reloads
/// the policy at `path` into `gate`, and so does a change of the file's text (watched
/// through its directory; see `watch`); the receiver counts the reloads that took effect.
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
    // Without a watch (no inotify descriptors left, say) SIGHUP still reloads: worth an
    // error in the log, not a refusal to serve.
    let mut watch = PolicyWatch::new(path)
        .map_err(|e| tracing::error!(error = %anyhow::Error::from(e), "policy file changes will not be noticed; send SIGHUP to reload"))
        .ok();
    let mut seen = Seen::default();
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
                    seen = Seen::default();
                    if reload_policy(&path, &gate, &supervisor, pool).await {
                        reloaded.send_modify(|n| *n += 1);
                    }
                }
                changed = next_change(&mut watch) => match changed {
                    Ok(()) => match read_settled(|| Snapshot::read(&path), || tokio::time::sleep(SETTLE)).await {
                        Settled::Text(text) => {
                            if let Some(digest) = seen.differs(&text, &gate) {
                                tracing::info!(policy = %path.display(), "policy file changed");
                                if reload_text(&path, text, &gate, &supervisor, pool).await {
                                    seen.refused = None;
                                    reloaded.send_modify(|n| *n += 1);
                                } else {
                                    seen.refused = Some(digest);
                                }
                            }
                        }
                        // Its writer's next change brings the watch back here.
                        Settled::Changing => tracing::warn!(policy = %path.display(), "policy file still being written; not reloaded until it holds still (replace it by renaming a complete file over it)"),
                        Settled::Unreadable(e) => {
                            let digest = format!("unreadable: {}", e.kind());
                            if seen.refused.as_ref() != Some(&digest) {
                                refused(&path, &format!("cannot read {}: {e}", path.display()));
                                seen.refused = Some(digest);
                            }
                        }
                    },
                    Err(e) => {
                        tracing::error!(error = %anyhow::Error::from(e), "policy file changes will not be noticed; send SIGHUP to reload");
                        watch = None;
                    }
                },
            }
        }
        stop.cancel();
    });
    Ok((watcher, reloads))
}
