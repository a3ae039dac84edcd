//! What validation produces: plain, typed values with every reference resolved.
//!
//! The types live apart from the checks that build them so that the gate's rule evaluation
//! ([`crate::rules`]) and compilation ([`crate::compile`]) can use them without depending on
//! the validator, and the validator ([`crate::validate`]) depends on them, never the other
//! way round.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use airlock_protocol::Requirement;
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::builtin::Builtin;
use crate::egress::EgressPolicy;
use crate::seccomp::SyscallPolicy;

/// A validated policy: plain values, every reference resolved.
#[derive(Debug, Clone)]
pub struct ValidatedPolicy {
    /// Decision rules, rate limits, approval and audit settings.
    pub gate: GatePolicy,
    /// Close plain object schemas.
    pub strict_objects: bool,
    /// Profiles by name.
    pub profiles: BTreeMap<String, Profile>,
    /// Tools by name.
    pub tools: BTreeMap<String, Tool>,
    /// Session workspace bounds.
    pub sessions: SessionPolicy,
}

/// Where session workspaces may start from, and how large and long-lived they may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPolicy {
    /// Host directories (absolute, normalised) under which a session's base must lie.
    pub bases: Vec<String>,
    /// Most sessions open at once.
    pub max_sessions: usize,
    /// A session unused this long is closed.
    pub idle_timeout: Duration,
    /// A session this old takes no more operations and is closed once its calls end,
    /// however busy: its id, a bearer token, and its files live no longer.
    pub max_lifetime: Duration,
    /// Largest workspace, bytes.
    pub max_size_bytes: u64,
    /// Most inodes in one workspace.
    pub max_inodes: u64,
}

impl Default for SessionPolicy {
    fn default() -> Self {
        Self {
            bases: Vec::new(),
            max_sessions: 64,
            idle_timeout: Duration::from_secs(30 * 60),
            max_lifetime: Duration::from_secs(24 * 3600),
            max_size_bytes: 1 << 30,
            max_inodes: 65_536,
        }
    }
}

/// Where a session's files appear in a profile's sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Size of a workspace opened without one, bytes (at most the sessions' `max_size`).
    pub size_bytes: u64,
}

/// A host path bound into the sandbox at the same place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathGrant {
    /// Absolute, normalised path.
    pub path: String,
    /// Skip instead of failing when the host path is missing.
    pub optional: bool,
}

/// What network a profile gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// A fresh empty network namespace.
    None,
    /// A fresh network namespace with loopback up.
    Loopback,
    /// The host's own network (`"host"`, or `{ mode = "host", ... }`).
    Host {
        /// TCP narrowed by Landlock to these ports; `None` leaves TCP as the host has it.
        tcp: Option<TcpPorts>,
        /// UDP sockets allowed (refused by the seccomp filter otherwise).
        udp: bool,
    },
    /// A fresh network namespace with loopback up, whose only way out is the supervisor's
    /// egress proxy, deciding every connection by this policy.
    Egress(EgressPolicy),
}

/// TCP ports Landlock lets a host-network sandbox use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpPorts {
    /// Ports the sandbox may connect to.
    pub connect: Vec<u16>,
    /// Ports the sandbox may bind.
    pub bind: Vec<u16>,
}

/// How much of its fresh `/proc` a sandbox sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProcView {
    /// Host-identifying and host-wide entries are covered with empty ones (the default).
    Masked,
    /// Everything procfs shows (the profile opted in with `proc = "full"`).
    Full,
}

/// Resource limits of a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// cgroup memory limit, bytes.
    pub memory_bytes: u64,
    /// cgroup pids limit.
    pub pids: u64,
    /// Wall-clock deadline.
    pub timeout: Duration,
    /// CPU time limit.
    pub cpu: Option<Duration>,
    /// CPU bandwidth in percent of one core (cgroup quota over a 100 ms period).
    pub cpu_quota_percent: Option<u32>,
    /// Bytes kept of each output stream.
    pub output_bytes: u64,
    /// RLIMIT_NOFILE.
    pub open_files: u64,
    /// RLIMIT_FSIZE, bytes.
    pub file_size_bytes: u64,
}

/// How hard each layer is required.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirements {
    /// Landlock.
    pub landlock: Requirement,
    /// seccomp.
    pub seccomp: Requirement,
    /// cgroup limits.
    pub cgroup: Requirement,
}

/// A validated sandbox profile.
#[derive(Debug, Clone)]
pub struct Profile {
    /// Name.
    pub name: String,
    /// Read-only binds.
    pub read: Vec<PathGrant>,
    /// Read-write binds.
    pub write: Vec<PathGrant>,
    /// tmpfs mounts: (path, size in bytes).
    pub tmpfs: Vec<(String, u64)>,
    /// Network.
    pub network: Network,
    /// seccomp policy.
    pub syscalls: SyscallPolicy,
    /// Limits.
    pub limits: Limits,
    /// The whole environment of tools.
    pub env: Vec<(String, String)>,
    /// Layer requirements.
    pub require: Requirements,
    /// Hostname.
    pub hostname: String,
    /// Working directory of tools.
    pub cwd: String,
    /// What of `/proc` the sandbox sees.
    pub proc: ProcView,
    /// A session's files appear here, read-write, in calls naming that session.
    pub workspace: Option<Workspace>,
}

impl Profile {
    /// What lets its tools change files that outlive the call, as a diagnostic says it:
    /// `write` paths, or a session workspace, which Landlock lets them write and which
    /// the session keeps from one call to the next. `None` when only tmpfs is writable.
    pub fn lasting_writes(&self) -> Option<&'static str> {
        if !self.write.is_empty() {
            Some("has write paths")
        } else if self.workspace.is_some() {
            Some("has a workspace (writable, kept across a session's calls)")
        } else {
            None
        }
    }
}

/// One element of a tool's argv template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgTemplate {
    /// Used as written.
    Literal(String),
    /// Replaced by the named input field, as one whole argument.
    Field(String),
}

/// What a tool reads on stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StdinSource {
    /// Nothing (stdin is empty).
    Empty,
    /// One input field (strings as their text, other values as JSON).
    Field(String),
    /// The whole validated input as JSON.
    WholeInput,
}

/// What a tool does to the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SideEffect {
    /// Only reads.
    Read,
    /// Changes state.
    Write,
    /// Changes state irreversibly.
    Destructive,
}

impl SideEffect {
    /// Parses `read`, `write`, `destructive`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "read" => Some(SideEffect::Read),
            "write" => Some(SideEffect::Write),
            "destructive" => Some(SideEffect::Destructive),
            _ => None,
        }
    }
}

/// Who approves a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// The policy decides alone.
    Auto,
    /// A human approves each call (two-phase).
    Human,
}

/// Whether a tool can be listed and called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolState {
    /// Listed and callable.
    Active,
    /// Known but not offered yet.
    Deferred,
    /// Taken out of service.
    Suspended,
}

impl ToolState {
    /// Parses `active`, `deferred`, `suspended`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "active" => Some(ToolState::Active),
            "deferred" => Some(ToolState::Deferred),
            "suspended" => Some(ToolState::Suspended),
            _ => None,
        }
    }
}

/// Permissions a tool may declare.
pub const PERMISSIONS: [&str; 4] = ["fs:read", "fs:write", "network", "subprocess"];

/// A validated tool.
#[derive(Debug, Clone)]
pub struct Tool {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Profile name (exists).
    pub profile: String,
    /// argv template; the first element is an absolute literal path (empty for built-ins).
    pub command: Vec<ArgTemplate>,
    /// The built-in this tool runs instead of a command.
    pub builtin: Option<Builtin>,
    /// stdin source.
    pub stdin: StdinSource,
    /// Side effect.
    pub side_effect: SideEffect,
    /// Category.
    pub category: Option<String>,
    /// Approval mode: as declared, else `human` for a destructive tool under
    /// `destructive_requires_approval`, else `auto`.
    pub approval: Approval,
    /// `approval` is `human` only because the tool is destructive (it declared none).
    pub approval_implied: bool,
    /// Command fields whose values may start with `-`.
    pub allow_dash_values: BTreeSet<String>,
    /// Extra attempts after eligible failures.
    pub retries: u32,
    /// Deadline of one attempt (the tool's own, or its profile's).
    pub timeout: Duration,
    /// Safe to run concurrently with other calls of the same tool in one session; when
    /// false the gate runs them one at a time.
    pub concurrency_safe: bool,
    /// Declared permissions (`fs:read`, `fs:write`, `network`, `subprocess`), if declared.
    pub permissions: Option<Vec<String>>,
    /// Availability at load time.
    pub state: ToolState,
    /// This tool's own rate limit.
    pub rate_limit: Option<RateLimit>,
    /// Input JSON Schema.
    pub input_schema: Value,
    /// Output JSON Schema.
    pub output_schema: Option<Value>,
    /// The schemas above as validating them compiled them, for compiling the policy
    /// without compiling them again.
    pub compiled_schemas: CompiledSchemas,
}

/// A tool's schemas as validation compiled them; `None` where it did not (a built-in's
/// input schema, or a tool made by hand), and compiling the policy compiles those.
#[derive(Debug, Clone, Default)]
pub struct CompiledSchemas {
    /// The input schema.
    pub input: Option<crate::schema::CompiledSchema>,
    /// The output schema.
    pub output: Option<crate::schema::CompiledSchema>,
}

/// What the gate decides for a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Run it.
    Allow,
    /// Refuse it.
    Deny,
    /// A human must approve it first (two-phase approval).
    Review,
}

impl Decision {
    /// Parses `allow`, `deny` or `review`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "allow" => Some(Decision::Allow),
            "deny" => Some(Decision::Deny),
            "review" => Some(Decision::Review),
            _ => None,
        }
    }
}

/// What a rule matches.
#[derive(Debug, Clone)]
pub enum RuleMatch {
    /// Tools whose side effect is `read`.
    ReadOnly,
    /// Tools whose side effect is one of these.
    SideEffects(Vec<SideEffect>),
    /// Tools by name.
    Tools(Vec<String>),
    /// Tools by category.
    Categories(Vec<String>),
    /// A regex over one input field (of the listed tools, or of every tool having it).
    Pattern {
        /// Only these tools (all when empty).
        tools: Vec<String>,
        /// The input field.
        field: String,
        /// Any match fires.
        patterns: Vec<Regex>,
    },
}

/// One validated rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Name reported when it fires.
    pub name: String,
    /// What it matches.
    pub matches: RuleMatch,
    /// What it decides.
    pub decision: Decision,
}

/// A token bucket's shape: `calls` per `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Bucket size and refill amount.
    pub calls: u32,
    /// Refill period.
    pub period: Duration,
}

impl RateLimit {
    /// Parses `"60/1m"`, `"10/s"`, `"100/1h"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (calls, period) = text
            .split_once('/')
            .ok_or_else(|| format!("rate limit {text:?} must look like \"60/1m\""))?;
        let calls: u32 = calls
            .trim()
            .parse()
            .ok()
            .filter(|c| *c > 0)
            .ok_or_else(|| format!("rate limit {text:?}: calls must be a positive integer"))?;
        let period = period.trim();
        let period = if period.starts_with(|c: char| c.is_ascii_digit()) {
            period.to_string()
        } else {
            format!("1{period}")
        };
        let period = crate::units::parse_duration(&period)
            .map_err(|e| format!("rate limit {text:?}: {e}"))?;
        Ok(Self { calls, period })
    }
}

/// Everything the gate needs from the policy.
#[derive(Debug, Clone)]
pub struct GatePolicy {
    /// Ordered rules.
    pub rules: Vec<Rule>,
    /// Decision when no rule matches.
    pub default_decision: Decision,
    /// Per-session bucket.
    pub session_rate: Option<RateLimit>,
    /// Per-tool bucket for tools without their own.
    pub tool_rate: Option<RateLimit>,
    /// Put sanitised arguments in audit records.
    pub audit_include_input: bool,
    /// Approval lifetime.
    pub approval_ttl: Duration,
    /// Most pending approvals.
    pub max_pending_approvals: usize,
}

impl Default for GatePolicy {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            default_decision: Decision::Allow,
            session_rate: None,
            tool_rate: None,
            audit_include_input: false,
            approval_ttl: Duration::from_secs(15 * 60),
            max_pending_approvals: 1000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_parse_with_and_without_a_count_of_periods() {
        assert_eq!(
            RateLimit::parse("60/1m"),
            Ok(RateLimit {
                calls: 60,
                period: Duration::from_secs(60)
            })
        );
        assert_eq!(
            RateLimit::parse("10/s"),
            Ok(RateLimit {
                calls: 10,
                period: Duration::from_secs(1)
            })
        );
        assert!(RateLimit::parse("0/s").is_err());
        assert!(RateLimit::parse("ten/s").is_err());
        assert!(RateLimit::parse("10").is_err());
        assert!(RateLimit::parse("10/fortnight").is_err());
    }
}
