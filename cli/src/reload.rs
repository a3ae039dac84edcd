//! SIGHUP's policy reload, shared by `airlock serve` and `airlock mcp`.

use std::path::Path;
use std::sync::Arc;

use airlock::pool::PoolSize;
use airlock::{Gate, Supervisor};
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
