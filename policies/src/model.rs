//! Step 1 of 3: the policy file exactly as written (serde model, unknown keys rejected).
//!
//! Unknown keys are first reported all at once, against the published schema, by
//! `crate::unknown_keys`; `deny_unknown_fields` stays on every table as a second line.
//!
//! Every value keeps its byte span so validation can point at it. Fields whose allowed
//! values are a closed set are kept as strings here, so that validation can report every
//! bad one at once instead of stopping at the first.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// A whole policy file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// Format version; only `1` exists.
    pub version: Spanned<i64>,
    /// Close every plain object schema (`additionalProperties = false` unless stated).
    #[serde(default)]
    pub strict_objects: Option<Spanned<bool>>,
    /// Tools whose side effect is `destructive` need a human approval unless they declare
    /// `approval` themselves (default true).
    #[serde(default)]
    pub destructive_requires_approval: Option<Spanned<bool>>,
    /// Sandbox profiles by name.
    #[serde(default)]
    pub profiles: BTreeMap<Spanned<String>, ProfileFile>,
    /// Tools by name.
    #[serde(default)]
    pub tools: BTreeMap<Spanned<String>, ToolFile>,
    /// Decision when no rule matches: `allow` (default), `deny` or `review`.
    #[serde(default)]
    pub default_decision: Option<Spanned<String>>,
    /// Ordered decision rules; the first that matches decides.
    #[serde(default)]
    pub rules: Vec<RuleFile>,
    /// Rate limits across all tools.
    #[serde(default)]
    pub rate_limits: Option<RateLimitsFile>,
    /// Audit settings.
    #[serde(default)]
    pub audit: Option<AuditFile>,
    /// Two-phase approval settings.
    #[serde(default)]
    pub approvals: Option<ApprovalsFile>,
    /// Session workspaces: where their bases may come from, and their bounds.
    #[serde(default)]
    pub sessions: Option<SessionsFile>,
}

/// The `[sessions]` table; every value is optional and has a documented default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsFile {
    /// Host directories under which a session's `base` must lie.
    #[serde(default)]
    pub bases: Vec<Spanned<String>>,
    /// Most sessions open at once.
    #[serde(default)]
    pub max_sessions: Option<Spanned<i64>>,
    /// A session unused this long is closed (duration).
    #[serde(default)]
    pub idle_timeout: Option<Spanned<String>>,
    /// A session this old is closed once its calls end, however busy (duration).
    #[serde(default)]
    pub max_lifetime: Option<Spanned<String>>,
    /// Largest workspace a session may ask for (size).
    #[serde(default)]
    pub max_size: Option<Spanned<String>>,
    /// Most files and directories in one workspace.
    #[serde(default)]
    pub max_inodes: Option<Spanned<i64>>,
}

/// One decision rule. The keys that only some kinds of rule use are optional and keep their
/// spans, so that validation can refuse one a rule's kind would ignore.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    /// Name reported when the rule fires (default `rules[INDEX]`).
    #[serde(default)]
    pub name: Option<Spanned<String>>,
    /// What it matches: `read_only`, `side_effect`, `tool`, `category` or `pattern`.
    #[serde(rename = "match")]
    pub matches: Spanned<String>,
    /// `allow`, `deny` or `review`.
    pub decision: Spanned<String>,
    /// `tool`: these tools; `pattern`: only these tools (all when absent).
    #[serde(default)]
    pub tools: Option<Spanned<Vec<Spanned<String>>>>,
    /// `category`: these categories.
    #[serde(default)]
    pub categories: Option<Spanned<Vec<Spanned<String>>>>,
    /// `side_effect`: these side effects (`read`, `write`, `destructive`).
    #[serde(default)]
    pub side_effects: Option<Spanned<Vec<Spanned<String>>>>,
    /// `pattern`: the input field the patterns look at.
    #[serde(default)]
    pub field: Option<Spanned<String>>,
    /// `pattern`: regular expressions (any match fires the rule).
    #[serde(default)]
    pub patterns: Option<Spanned<Vec<Spanned<String>>>>,
    /// `pattern`: a shipped pattern set (`dangerous_shell`).
    #[serde(default)]
    pub preset: Option<Spanned<String>>,
}

/// Policy-wide rate limits.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitsFile {
    /// Calls per session, like `"60/1m"`.
    #[serde(default)]
    pub session: Option<Spanned<String>>,
    /// Calls per tool (each tool its own bucket) unless the tool sets its own.
    #[serde(default)]
    pub tool: Option<Spanned<String>>,
}

/// Audit settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditFile {
    /// Put the (sanitised) arguments in audit records. Off by default: they may be secret.
    #[serde(default)]
    pub include_input: Option<Spanned<bool>>,
}

/// Two-phase approval settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsFile {
    /// How long a proposal stays executable (default `15m`).
    #[serde(default)]
    pub ttl: Option<Spanned<String>>,
    /// Most pending proposals (default 1000).
    #[serde(default)]
    pub max_pending: Option<Spanned<i64>>,
}

/// A sandbox profile: what a worker may do.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    /// Host paths bound read-only (must exist).
    #[serde(default)]
    pub read: Vec<Spanned<String>>,
    /// Host paths bound read-only when they exist (for example `/lib64`).
    #[serde(default)]
    pub read_optional: Vec<Spanned<String>>,
    /// Host paths bound read-write.
    #[serde(default)]
    pub write: Vec<Spanned<String>>,
    /// Size-limited tmpfs mounts: path → size.
    #[serde(default)]
    pub tmpfs: BTreeMap<Spanned<String>, Spanned<String>>,
    /// `"none"`, `"loopback"`, or a table of TCP rules.
    #[serde(default)]
    pub network: Option<Spanned<NetworkFile>>,
    /// The seccomp allowlist.
    #[serde(default)]
    pub syscalls: Option<SyscallsFile>,
    /// Resource limits.
    #[serde(default)]
    pub limits: Option<LimitsFile>,
    /// The whole environment of tool processes.
    #[serde(default)]
    pub env: BTreeMap<Spanned<String>, Spanned<String>>,
    /// How hard each isolation layer is required.
    #[serde(default)]
    pub require: Option<RequireFile>,
    /// Hostname inside the sandbox.
    #[serde(default)]
    pub hostname: Option<Spanned<String>>,
    /// Working directory of tools, inside the sandbox.
    #[serde(default)]
    pub cwd: Option<Spanned<String>>,
    /// The sandbox's `/proc`: `"masked"` (default) or `"full"` (validated later).
    #[serde(default)]
    pub proc: Option<Spanned<String>>,
    /// Where a session's workspace appears inside the sandbox (absolute).
    #[serde(default)]
    pub workspace: Option<Spanned<String>>,
    /// Default size of a session workspace opened for this profile's calls (size).
    #[serde(default)]
    pub workspace_size: Option<Spanned<String>>,
}

/// The `network` key: a mode name or a table.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum NetworkFile {
    /// `"none"`, `"loopback"` or `"host"` (validated later).
    Mode(String),
    /// The egress allowlist, or the host network with its options.
    Rules(NetworkRulesFile),
}

/// The `network` table: `allow` (and `allow_addresses`) for the egress proxy, or
/// `mode = "host"` with its TCP ports and UDP switch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkRulesFile {
    /// `"host"`; the only mode a table may name (the egress proxy needs none).
    #[serde(default)]
    pub mode: Option<String>,
    /// `"host[:port]"` destinations the egress proxy lets through.
    #[serde(default)]
    pub allow: Option<Vec<String>>,
    /// Networks (CIDR) of non-public addresses the egress proxy may connect to.
    #[serde(default)]
    pub allow_addresses: Vec<String>,
    /// Host mode: `"tcp:PORT"` entries the sandbox may connect to. Given at all (even
    /// empty), it narrows TCP to the listed ports; left out with `bind`, TCP is the host's.
    #[serde(default)]
    pub connect: Option<Vec<String>>,
    /// Host mode: `"tcp:PORT"` entries the sandbox may bind (given or not, as `connect`).
    #[serde(default)]
    pub bind: Option<Vec<String>>,
    /// Host mode: allow UDP sockets (refused by default).
    #[serde(default)]
    pub udp: Option<bool>,
}

/// The `syscalls` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyscallsFile {
    /// Base allowlist: `"default"` (the only one so far).
    #[serde(default)]
    pub base: Option<Spanned<String>>,
    /// Extra syscall names or `@group`s to allow.
    #[serde(default)]
    pub allow: Vec<Spanned<String>>,
    /// Syscall names or `@group`s to remove from the allowlist.
    #[serde(default)]
    pub deny: Vec<Spanned<String>>,
}

/// The `limits` table; every value is optional and has a documented default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    /// cgroup memory limit (size).
    pub memory: Option<Spanned<String>>,
    /// cgroup pids limit.
    pub pids: Option<Spanned<i64>>,
    /// Wall-clock deadline of one call (duration).
    pub timeout: Option<Spanned<String>>,
    /// CPU time (duration; RLIMIT_CPU, whole seconds).
    pub cpu: Option<Spanned<String>>,
    /// CPU bandwidth as a share of one core, like `"50%"` or `"200%"` (cgroup cpu quota).
    pub cpu_quota: Option<Spanned<String>>,
    /// Bytes kept of each of stdout and stderr (size).
    pub output: Option<Spanned<String>>,
    /// RLIMIT_NOFILE.
    pub open_files: Option<Spanned<i64>>,
    /// RLIMIT_FSIZE (size).
    pub file_size: Option<Spanned<String>>,
}

/// The `require` table: `"required"` or `"best_effort"` per layer.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequireFile {
    /// Landlock.
    pub landlock: Option<Spanned<String>>,
    /// seccomp.
    pub seccomp: Option<Spanned<String>>,
    /// cgroup limits.
    pub cgroup: Option<Spanned<String>>,
}

/// A tool definition.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolFile {
    /// What the tool does, shown to the model.
    pub description: Spanned<String>,
    /// Sandbox profile name (default `"default"`).
    #[serde(default)]
    pub profile: Option<Spanned<String>>,
    /// argv template: literals, and `"{field}"` elements replaced by whole input fields.
    #[serde(default)]
    pub command: Option<Spanned<Vec<Spanned<String>>>>,
    /// A built-in tool instead of a command: `read_file`, `write_file`, `list_dir`, `edit`,
    /// `bash`.
    #[serde(default)]
    pub builtin: Option<Spanned<String>>,
    /// Which input field goes to stdin, or `"$input"` for the whole input as JSON.
    #[serde(default)]
    pub stdin: Option<Spanned<String>>,
    /// `read`, `write` or `destructive` (default `destructive`).
    #[serde(default)]
    pub side_effect: Option<Spanned<String>>,
    /// Free-form category used by decision rules.
    #[serde(default)]
    pub category: Option<Spanned<String>>,
    /// `auto` or `human` (default `human` for a destructive tool under
    /// `destructive_requires_approval`, else `auto`).
    #[serde(default)]
    pub approval: Option<Spanned<String>>,
    /// Extra attempts after an eligible failure (default 0).
    #[serde(default)]
    pub retries: Option<Spanned<i64>>,
    /// Overrides the profile's timeout.
    #[serde(default)]
    pub timeout: Option<Spanned<String>>,
    /// JSON Schema of the input (draft-07 or 2020-12); built-ins have a default.
    #[serde(default)]
    pub input: Option<Spanned<toml::Value>>,
    /// Optional JSON Schema of the output (stdout parsed as JSON).
    #[serde(default)]
    pub output: Option<Spanned<toml::Value>>,
    /// Calls of it in one session may run at once (default false, except for the read-only
    /// built-ins); when false the gate runs them one at a time.
    #[serde(default)]
    pub concurrency_safe: Option<Spanned<bool>>,
    /// Declared needs: `fs:read`, `fs:write`, `network`, `subprocess`.
    #[serde(default)]
    pub permissions: Option<Spanned<Vec<Spanned<String>>>>,
    /// `active` (default), `deferred` or `suspended`.
    #[serde(default)]
    pub state: Option<Spanned<String>>,
    /// This tool's own rate limit, like `"10/1m"`.
    #[serde(default)]
    pub rate_limit: Option<Spanned<String>>,
    /// Command fields whose values may start with `-` (refused by default: the program
    /// would read them as options).
    #[serde(default)]
    pub allow_dash_values: Option<Spanned<Vec<Spanned<String>>>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_rejected_with_their_position() {
        let text = "version = 1\n[profiles.p]\nmemroy = \"1MiB\"\n";
        let err = toml::from_str::<PolicyFile>(text).unwrap_err();
        assert!(err.message().contains("unknown field `memroy`"));
        assert_eq!(err.span().map(|s| s.start), Some(25));
    }

    #[test]
    fn map_keys_keep_their_spans() {
        let text = "version = 1\n[tools.Bad-Name]\ndescription = \"d\"\ncommand = [\"/bin/true\"]\ninput = { type = \"object\" }\n";
        let file: PolicyFile = toml::from_str(text).unwrap();
        let (name, _) = file.tools.iter().next().unwrap();
        assert_eq!(&text[name.span()], "Bad-Name");
    }
}
