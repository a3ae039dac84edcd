//! Dry runs: what the gate decides for a call and what would run, with nothing executed.

use airlock_policy::rules::{Decision, decide};
use airlock_policy::validate::SideEffect;
use serde::Serialize;
use serde_json::Value;

use super::{CallOptions, Gate, rejected};
use crate::call::ToolCall;
use crate::result::ToolResult;

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

impl Gate {
    /// Validates and decides, and says what would run — executing nothing.
    pub fn dry_run(&self, call: &ToolCall, opts: &CallOptions) -> Result<DryRun, ToolResult> {
        let prepared = self
            .prepare(call, opts.session.as_deref())
            .map_err(|e| rejected(call, e))?;
        let tool = &prepared.tool.tool;
        self.session_in_force(call, opts)?;
        let (_, plan_mode) =
            self.settings_in(&prepared.tool, opts.session.as_deref(), opts.plan_mode);
        let (decision, rule) = if plan_mode && tool.side_effect != SideEffect::Read {
            (Decision::Deny, "plan_mode".to_string())
        } else {
            let v = decide(&prepared.policy.gate, tool, &prepared.input);
            (v.decision, v.rule)
        };
        let profile = prepared.policy.profiles.get(&tool.profile);
        Ok(DryRun {
            tool: tool.name.clone(),
            decision,
            rule,
            approval_required: decision == Decision::Review
                || tool.approval == airlock_policy::validate::Approval::Human,
            argv: prepared.argv.clone(),
            builtin: tool.builtin.map(|b| b.name().to_string()),
            stdin_bytes: prepared.tool.render_stdin(&prepared.input).len(),
            env: profile.map(|p| p.spec.env.clone()).unwrap_or_default(),
            profile: tool.profile.clone(),
            sandbox: profile.map_or(Value::Null, |p| sandbox_summary(p)),
            timeout_ms: u64::try_from(tool.timeout.as_millis()).unwrap_or(u64::MAX),
            input_digest: prepared.digest,
        })
    }
}

/// The parts of a sandbox spec worth showing (not the BPF program itself), as plain JSON a
/// reviewer's tooling can read: mounts are objects tagged by their kind.
fn sandbox_summary(profile: &airlock_policy::CompiledProfile) -> Value {
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
