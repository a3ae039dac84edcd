//! What `explain` says about a tool and its profile, as `--json` prints it: the
//! descriptions fill these in and the text rendering reads them.

use std::collections::BTreeMap;

use airlock_policy::rules::Decision;
use airlock_policy::validate::{Approval, SideEffect, ToolState};
use serde::Serialize;

/// Everything `explain` says, as `--json` prints it.
#[derive(Debug, Serialize)]
pub(super) struct Explanation {
    /// The policy file or `preset:NAME`.
    pub(super) policy: String,
    /// SHA-256 of the policy text.
    pub(super) policy_version: String,
    /// The tool, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tool: Option<ToolFacts>,
    /// The profile (the tool's, when a tool was asked for).
    pub(super) profile: ProfileFacts,
    /// Warnings `airlock check` gives for the policy.
    pub(super) warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
pub(super) struct ToolFacts {
    pub(super) name: String,
    pub(super) description: String,
    pub(super) profile: String,
    /// argv template (`{field}` for input fields), empty for a built-in.
    pub(super) command: Vec<String>,
    /// The built-in run instead of a command.
    pub(super) builtin: Option<String>,
    pub(super) stdin: String,
    pub(super) side_effect: SideEffect,
    pub(super) category: Option<String>,
    pub(super) approval: Approval,
    pub(super) retries: u32,
    pub(super) timeout_ms: u64,
    pub(super) timeout: String,
    pub(super) input: InputFacts,
    /// The tool's stdout must be JSON matching an output schema.
    pub(super) output_schema: bool,
    /// What the gate does with its calls.
    pub(super) gate: GateFacts,
}

#[derive(Debug, Serialize)]
pub(super) struct GateFacts {
    /// active | deferred | suspended.
    pub(super) state: ToolState,
    /// Rules that can fire for this tool, in order, up to the first that always does.
    pub(super) rules: Vec<RuleFacts>,
    /// The decision when no conditional rule fires.
    pub(super) decision: Decision,
    /// The rule giving it, or `default`.
    pub(super) decision_rule: String,
    /// When a human must approve a call.
    pub(super) human_approval: String,
    /// Allowed in plan mode (read-only tools only).
    pub(super) plan_mode: bool,
    pub(super) rate_limits: Vec<String>,
    /// Declared permissions, when declared.
    pub(super) permissions: Option<Vec<String>>,
    pub(super) concurrency_safe: bool,
}

#[derive(Debug, Serialize)]
pub(super) struct RuleFacts {
    pub(super) name: String,
    /// What the rule matches, in words.
    pub(super) matches: String,
    pub(super) decision: Decision,
    /// Fires only for some inputs (a pattern rule).
    pub(super) conditional: bool,
}

#[derive(Debug, Serialize)]
pub(super) struct InputFacts {
    pub(super) required: Vec<String>,
    pub(super) fields: Vec<FieldFacts>,
    /// Fields not in `properties` are refused.
    pub(super) other_fields_refused: bool,
}

#[derive(Debug, Serialize)]
pub(super) struct FieldFacts {
    pub(super) name: String,
    pub(super) kind: String,
    pub(super) required: bool,
    pub(super) constraints: Vec<String>,
}

#[derive(Debug, Serialize)]
pub(super) struct PathFacts {
    pub(super) path: String,
    /// Bound only when it exists on the host.
    pub(super) optional: bool,
}

#[derive(Debug, Serialize)]
pub(super) struct TmpfsFacts {
    pub(super) path: String,
    pub(super) size_bytes: u64,
    pub(super) size: String,
}

#[derive(Debug, Serialize)]
pub(super) struct NetworkFacts {
    /// `none` | `loopback` | `egress` | `host`.
    pub(super) mode: &'static str,
    pub(super) summary: String,
    /// Host mode: TCP narrowed by Landlock to these ports (`None`: not narrowed).
    pub(super) tcp_connect: Option<Vec<u16>>,
    pub(super) tcp_bind: Option<Vec<u16>>,
    /// Host mode: UDP sockets allowed.
    pub(super) udp: bool,
    /// Egress mode: the destinations the proxy lets through.
    pub(super) allow: Vec<String>,
    /// Egress mode: the networks of non-public addresses it may connect to.
    pub(super) allow_addresses: Vec<String>,
}

#[derive(Debug, Serialize)]
pub(super) struct SyscallGroup {
    pub(super) name: &'static str,
    pub(super) allowed: usize,
    pub(super) of: usize,
}

#[derive(Debug, Serialize)]
pub(super) struct DenialGroup {
    pub(super) category: &'static str,
    pub(super) syscalls: Vec<String>,
}

#[derive(Debug, Serialize)]
pub(super) struct SyscallFacts {
    /// Syscalls that run normally.
    pub(super) allowed_count: usize,
    /// What every other syscall gets.
    pub(super) otherwise: &'static str,
    pub(super) groups: Vec<SyscallGroup>,
    /// Allowed beyond the default base (`syscalls.allow`).
    pub(super) added: Vec<String>,
    /// The profile's own `syscalls.deny` (EPERM).
    pub(super) denied_by_profile: Vec<String>,
    /// The fixed EPERM list, by category.
    pub(super) always_eperm: Vec<DenialGroup>,
    /// EPERM depending on arguments.
    pub(super) argument_rules: Vec<String>,
    /// Never allowed, answered with ENOSYS so runtimes fall back.
    pub(super) always_enosys: Vec<&'static str>,
    pub(super) socket_families: Vec<&'static str>,
}

#[derive(Debug, Serialize)]
pub(super) struct LimitFacts {
    pub(super) memory_bytes: u64,
    pub(super) memory: String,
    pub(super) pids: u64,
    pub(super) timeout_ms: u64,
    pub(super) timeout: String,
    pub(super) cpu_seconds: Option<u64>,
    pub(super) cpu: String,
    pub(super) output_bytes: u64,
    pub(super) output: String,
    pub(super) open_files: u64,
    pub(super) file_size_bytes: u64,
    pub(super) file_size: String,
}

#[derive(Debug, Serialize)]
pub(super) struct RequireFacts {
    pub(super) landlock: &'static str,
    pub(super) seccomp: &'static str,
    pub(super) cgroup: &'static str,
}

/// What the sandbox's `/proc` shows.
#[derive(Debug, Serialize)]
pub(super) struct ProcFacts {
    /// `masked` or `full` (the profile's `proc`).
    pub(super) view: &'static str,
    /// Entries covered with empty ones, relative to `/proc`.
    pub(super) hidden: Vec<&'static str>,
}

/// What a call's result can say was refused (`denials`), layer by layer: `reported` or
/// `unavailable` with why, as `isolation.denial_reporting` will say.
#[derive(Debug, Serialize)]
pub(super) struct DenialFacts {
    pub(super) seccomp: &'static str,
    pub(super) landlock: &'static str,
    pub(super) mounts: &'static str,
    pub(super) network: &'static str,
    pub(super) limits: &'static str,
}

#[derive(Debug, Serialize)]
pub(super) struct ProfileFacts {
    pub(super) name: String,
    pub(super) read_only: Vec<PathFacts>,
    pub(super) read_write: Vec<PathFacts>,
    pub(super) tmpfs: Vec<TmpfsFacts>,
    /// Where a session's files appear; null without a workspace.
    pub(super) workspace: Option<TmpfsFacts>,
    pub(super) network: NetworkFacts,
    pub(super) syscalls: SyscallFacts,
    pub(super) limits: LimitFacts,
    pub(super) denials: DenialFacts,
    pub(super) env: BTreeMap<String, String>,
    pub(super) hostname: String,
    pub(super) cwd: String,
    pub(super) proc: ProcFacts,
    pub(super) namespaces: Vec<&'static str>,
    pub(super) require: RequireFacts,
}
