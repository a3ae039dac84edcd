//! What a dry run reports: the call as it would run, and the sandbox it would run in.

use serde::Serialize;
use serde_json::Value;

use airlock_policy::rules::Decision;

/// What a dry run reports.
#[derive(Debug, Clone, Serialize)]
pub struct DryRun {
    /// Tool name.
    pub tool: String,
    /// Decision.
    pub decision: Decision,
    /// Rule that fired.
    pub rule: String,
    /// Whether a human approval is needed before it runs.
    pub approval_required: bool,
    /// argv.
    pub argv: Vec<String>,
    /// Built-in, if any.
    pub builtin: Option<String>,
    /// Bytes that would go to stdin.
    pub stdin_bytes: usize,
    /// Environment.
    pub env: Vec<(String, String)>,
    /// Profile.
    pub profile: String,
    /// The sandbox spec the worker would build.
    pub sandbox: Value,
    /// Deadline, milliseconds.
    pub timeout_ms: u64,
    /// Input digest.
    pub input_digest: String,
}

/// The parts of a sandbox spec worth showing (not the BPF program itself), as plain JSON a
/// reviewer's tooling can read: mounts are objects tagged by their kind.
pub(crate) fn sandbox_summary(profile: &airlock_policy::CompiledProfile) -> Value {
    use airlock_protocol::{NetworkMode, Requirement};
    let network = match profile.spec.network {
        NetworkMode::None | NetworkMode::NoneShared => "none",
        NetworkMode::Loopback => "loopback",
        NetworkMode::Host => "host",
    };
    let landlock = match profile.spec.landlock.requirement {
        Requirement::Required => "required",
        Requirement::BestEffort => "best_effort",
    };
    let mounts: Vec<Value> = profile
        .spec
        .mounts
        .iter()
        .map(|mount| serde_json::to_value(mount).unwrap_or(Value::Null))
        .collect();
    serde_json::json!({
        "mounts": mounts,
        "network": network,
        "landlock": {"read": profile.spec.landlock.read, "write": profile.spec.landlock.write, "requirement": landlock},
        "seccomp_digest": profile.spec.seccomp.digest,
        "memory_bytes": profile.limits.memory_bytes,
        "pids": profile.limits.pids,
        "cwd": profile.spec.cwd,
        "hostname": profile.spec.hostname,
    })
}
