//! Step 2 of 3: checks a parsed [`PolicyFile`] and produces a [`ValidatedPolicy`] of plain,
//! typed values — reporting every error at once, plus warnings for risky grants.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::LazyLock;
use std::time::Duration;

use airlock_protocol::Requirement;
use regex::Regex;
use serde_json::Value;
use toml::Spanned;

use crate::builtin::Builtin;
use crate::diagnostic::{Diagnostic, Severity, Source};
use crate::model::{LimitsFile, NetworkFile, PolicyFile, ProfileFile, RequireFile, SyscallsFile};
use crate::rules::{GatePolicy, RateLimit};
use crate::seccomp::{DEFAULT_ALLOW, SocketFamilies, SyscallPolicy, is_never_allowed};
use crate::syscalls::syscall_number;
use crate::units::{parse_duration, parse_size};

mod gate;
mod permissions;
mod tool;

use gate::check_gate;
use tool::{ToolOptions, check_tool};

/// Defaults of every limit, documented in docs/policy.md.
pub mod defaults {
    use std::time::Duration;

    /// cgroup memory limit.
    pub const MEMORY_BYTES: u64 = 256 << 20;
    /// cgroup pids limit.
    pub const PIDS: u64 = 64;
    /// Wall-clock deadline.
    pub const TIMEOUT: Duration = Duration::from_secs(30);
    /// Bytes kept of each output stream.
    pub const OUTPUT_BYTES: u64 = 64 << 10;
    /// RLIMIT_NOFILE.
    pub const OPEN_FILES: u64 = 256;
    /// RLIMIT_FSIZE.
    pub const FILE_SIZE_BYTES: u64 = 64 << 20;
    /// Hostname inside the sandbox.
    pub const HOSTNAME: &str = "airlock";
    /// The profile a tool uses when it names none.
    pub const PROFILE: &str = "default";
    /// PATH when a profile sets no environment.
    pub const PATH: &str = "/usr/local/bin:/usr/bin:/bin";
}

/// Sane bounds; values outside them are errors, not clamps.
mod bounds {
    use std::time::Duration;
    pub const MEMORY_BYTES: (u64, u64) = (8 << 20, 64 << 30);
    pub const PIDS: (i64, i64) = (1, 65_536);
    pub const TIMEOUT_MAX: Duration = Duration::from_secs(24 * 3600);
    pub const OUTPUT_BYTES: (u64, u64) = (1, 64 << 20);
    pub const OPEN_FILES: (i64, i64) = (8, 65_536);
    pub const FILE_SIZE_BYTES: (u64, u64) = (1, 1 << 40);
    pub const TMPFS_BYTES: (u64, u64) = (4 << 10, 64 << 30);
    pub const RETRIES: (i64, i64) = (0, 10);
}

static TOOL_NAME: LazyLock<Result<Regex, regex::Error>> =
    LazyLock::new(|| Regex::new(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$"));

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
    /// The host network, TCP narrowed to these ports by Landlock.
    Tcp {
        /// Ports the sandbox may connect to.
        connect: Vec<u16>,
        /// Ports the sandbox may bind.
        bind: Vec<u16>,
    },
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// The policy decides alone.
    Auto,
    /// A human approves each call (two-phase).
    Human,
}

/// Whether a tool can be listed and called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
}

/// Collects diagnostics while validating.
struct Checker<'a> {
    source: Source<'a>,
    diagnostics: Vec<Diagnostic>,
}

impl Checker<'_> {
    fn error(&mut self, span: Range<usize>, message: impl Into<String>) {
        self.diagnostics.push(self.source.error(span, message));
    }

    fn warning(&mut self, span: Range<usize>, message: impl Into<String>) {
        self.diagnostics.push(self.source.warning(span, message));
    }

    /// A path inside the sandbox or on the host: absolute, normalised, no `..`.
    fn path(&mut self, path: &Spanned<String>, what: &str) -> Option<String> {
        let text = path.get_ref();
        let problem = if !text.starts_with('/') {
            Some("must be absolute")
        } else if text.contains('\0') {
            Some("must not contain NUL")
        } else if text.split('/').any(|c| c == "..") {
            Some("must not contain `..`")
        } else if text.split('/').any(|c| c == ".") {
            Some("must be normalised (no `.` components)")
        } else if text.contains("//") || (text.len() > 1 && text.ends_with('/')) {
            Some("must be normalised (no repeated or trailing `/`)")
        } else {
            None
        };
        match problem {
            Some(problem) => {
                self.error(path.span(), format!("{what} {text:?} {problem}"));
                None
            }
            None => Some(text.clone()),
        }
    }

    fn size(&mut self, value: &Spanned<String>, what: &str, range: (u64, u64)) -> Option<u64> {
        match parse_size(value.get_ref()) {
            Ok(bytes) if bytes < range.0 || bytes > range.1 => {
                self.error(
                    value.span(),
                    format!(
                        "{what} must be between {} and {}",
                        crate::units::format_size(range.0),
                        crate::units::format_size(range.1)
                    ),
                );
                None
            }
            Ok(bytes) => Some(bytes),
            Err(e) => {
                self.error(value.span(), format!("{what}: {e}"));
                None
            }
        }
    }

    fn duration(&mut self, value: &Spanned<String>, what: &str) -> Option<Duration> {
        match parse_duration(value.get_ref()) {
            Ok(d) if d > bounds::TIMEOUT_MAX => {
                self.error(value.span(), format!("{what} must be at most 24h"));
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                self.error(value.span(), format!("{what}: {e}"));
                None
            }
        }
    }

    fn integer(&mut self, value: &Spanned<i64>, what: &str, range: (i64, i64)) -> Option<u64> {
        let v = *value.get_ref();
        if v < range.0 || v > range.1 {
            self.error(
                value.span(),
                format!("{what} must be between {} and {}", range.0, range.1),
            );
            None
        } else {
            u64::try_from(v).ok()
        }
    }

    fn requirement(&mut self, value: Option<&Spanned<String>>, layer: &str) -> Requirement {
        let Some(value) = value else {
            return Requirement::Required;
        };
        match value.get_ref().as_str() {
            "required" => Requirement::Required,
            "best_effort" => {
                self.warning(
                    value.span(),
                    format!(
                        "{layer} is best_effort: calls run even when the kernel cannot enforce it"
                    ),
                );
                Requirement::BestEffort
            }
            other => {
                self.error(
                    value.span(),
                    format!("{layer} must be \"required\" or \"best_effort\", not {other:?}"),
                );
                Requirement::Required
            }
        }
    }
}

/// Paths airlock mounts itself; a profile may not bind over them.
const RESERVED_MOUNTS: &[&str] = &["/proc", "/dev"];
/// Paths whose writable grant is risky enough to warn about.
const RISKY_WRITABLE: &[&str] = &[
    "/", "/proc", "/sys", "/dev", "/etc", "/usr", "/boot", "/root",
];

fn check_profile(
    c: &mut Checker<'_>,
    name: &Spanned<String>,
    file: &ProfileFile,
) -> Option<Profile> {
    let before = c
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    let profile_name = name.get_ref().clone();
    if !TOOL_NAME
        .as_ref()
        .is_ok_and(|re| re.is_match(&profile_name))
    {
        c.error(
            name.span(),
            format!("profile name {profile_name:?} must match ^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$"),
        );
    }

    let mut seen: BTreeMap<String, Range<usize>> = BTreeMap::new();
    let mut grant = |c: &mut Checker<'_>, path: &Spanned<String>, what: &str| -> Option<String> {
        let checked = c.path(path, what)?;
        if RESERVED_MOUNTS
            .iter()
            .any(|r| checked == *r || checked.starts_with(&format!("{r}/")))
        {
            c.error(
                path.span(),
                format!(
                    "{what} {checked:?} is mounted by airlock itself (fresh /proc, minimal /dev)"
                ),
            );
            return None;
        }
        if seen.insert(checked.clone(), path.span()).is_some() {
            c.error(
                path.span(),
                format!("path {checked:?} is listed more than once"),
            );
            return None;
        }
        Some(checked)
    };

    let mut read = Vec::new();
    for path in &file.read {
        if let Some(p) = grant(c, path, "read path") {
            if p == "/sys" || p.starts_with("/sys/") {
                c.warning(
                    path.span(),
                    format!("read path {p:?} exposes host kernel state"),
                );
            }
            read.push(PathGrant {
                path: p,
                optional: false,
            });
        }
    }
    for path in &file.read_optional {
        if let Some(p) = grant(c, path, "read_optional path") {
            read.push(PathGrant {
                path: p,
                optional: true,
            });
        }
    }
    let mut write = Vec::new();
    for path in &file.write {
        if let Some(p) = grant(c, path, "write path") {
            if RISKY_WRITABLE.contains(&p.as_str()) || p.starts_with("/sys/") {
                c.warning(
                    path.span(),
                    format!("write path {p:?} lets tools change the host system"),
                );
            }
            write.push(PathGrant {
                path: p,
                optional: false,
            });
        }
    }
    let mut tmpfs = Vec::new();
    for (path, size) in &file.tmpfs {
        let checked = grant(c, path, "tmpfs path");
        let bytes = c.size(size, "tmpfs size", bounds::TMPFS_BYTES);
        if let (Some(p), Some(b)) = (checked, bytes) {
            tmpfs.push((p, b));
        }
    }
    // A mount below a writable bind: a tool may replace a directory on its path with a
    // symlink, and the worker then refuses to build later sandboxes (escape battery FS-05).
    let spans = file
        .read
        .iter()
        .chain(&file.read_optional)
        .chain(&file.write)
        .map(|p| (p.span(), p.get_ref().trim_end_matches('/').to_string()))
        .chain(
            file.tmpfs
                .keys()
                .map(|p| (p.span(), p.get_ref().trim_end_matches('/').to_string())),
        );
    for (span, path) in spans {
        if let Some(outer) = write
            .iter()
            .find(|w| path.starts_with(&format!("{}/", w.path.trim_end_matches('/'))))
        {
            c.warning(
                span,
                format!(
                    "{path:?} is mounted inside writable path {:?}: a tool there can put a \
                     symlink on its path, and later calls then fail with sandbox_unavailable \
                     until it is removed",
                    outer.path
                ),
            );
        }
    }

    let network = match &file.network {
        None => Network::None,
        Some(spanned) => match spanned.get_ref() {
            NetworkFile::Mode(mode) if mode == "none" => Network::None,
            NetworkFile::Mode(mode) if mode == "loopback" => Network::Loopback,
            NetworkFile::Mode(other) => {
                c.error(
                    spanned.span(),
                    format!("network must be \"none\", \"loopback\" or a table {{ connect = [...], bind = [...] }}, not {other:?}"),
                );
                Network::None
            }
            NetworkFile::Rules(rules) => {
                let ports = |entries: &[String], c: &mut Checker<'_>| -> Vec<u16> {
                    let mut out = Vec::new();
                    for entry in entries {
                        match entry.strip_prefix("tcp:").map(str::parse::<u16>) {
                            Some(Ok(port)) if port > 0 => out.push(port),
                            _ => c.error(
                                spanned.span(),
                                format!("network rule {entry:?} must look like \"tcp:443\" (port 1-65535)"),
                            ),
                        }
                    }
                    out
                };
                let connect = ports(&rules.connect, c);
                let bind = ports(&rules.bind, c);
                if rules.connect.is_empty() && rules.bind.is_empty() {
                    c.warning(
                        spanned.span(),
                        "network is enabled with no rules: the host network is shared and only TCP is filtered",
                    );
                }
                Network::Tcp { connect, bind }
            }
        },
    };

    let default_syscalls = SyscallsFile::default();
    let syscalls_file = file.syscalls.as_ref().unwrap_or(&default_syscalls);
    let mut allow: BTreeSet<String> = BTreeSet::new();
    match &syscalls_file.base {
        Some(base) if base.get_ref() != "default" => {
            c.error(
                base.span(),
                format!(
                    "syscalls.base must be \"default\", not {:?}",
                    base.get_ref()
                ),
            );
        }
        _ => allow.extend(DEFAULT_ALLOW.iter().map(|s| s.to_string())),
    }
    for name in &syscalls_file.allow {
        let n = name.get_ref();
        if syscall_number(n).is_none() {
            c.error(name.span(), format!("unknown syscall {n:?}"));
        } else if is_never_allowed(n) {
            c.error(
                name.span(),
                format!("syscall {n:?} can never be allowed: it defeats the sandbox (see docs/policy.md, Seccomp)"),
            );
        } else {
            allow.insert(n.clone());
        }
    }
    let mut deny = BTreeSet::new();
    for name in &syscalls_file.deny {
        let n = name.get_ref();
        if syscall_number(n).is_none() {
            c.error(name.span(), format!("unknown syscall {n:?}"));
        } else {
            deny.insert(n.clone());
        }
    }
    let families = match network {
        Network::None => SocketFamilies::UnixOnly,
        Network::Loopback | Network::Tcp { .. } => SocketFamilies::UnixAndInet,
    };
    let syscalls = SyscallPolicy {
        allow,
        deny,
        families,
    };

    let default_limits = LimitsFile::default();
    let l = file.limits.as_ref().unwrap_or(&default_limits);
    let limits = Limits {
        memory_bytes: l
            .memory
            .as_ref()
            .and_then(|v| c.size(v, "limits.memory", bounds::MEMORY_BYTES))
            .unwrap_or(defaults::MEMORY_BYTES),
        pids: l
            .pids
            .as_ref()
            .and_then(|v| c.integer(v, "limits.pids", bounds::PIDS))
            .unwrap_or(defaults::PIDS),
        timeout: l
            .timeout
            .as_ref()
            .and_then(|v| c.duration(v, "limits.timeout"))
            .unwrap_or(defaults::TIMEOUT),
        cpu: l.cpu.as_ref().and_then(|v| {
            let d = c.duration(v, "limits.cpu")?;
            if d < Duration::from_secs(1) || d.subsec_nanos() != 0 {
                c.error(
                    v.span(),
                    "limits.cpu is enforced with RLIMIT_CPU: use whole seconds",
                );
                return None;
            }
            Some(d)
        }),
        cpu_quota_percent: l.cpu_quota.as_ref().and_then(|v| {
            let parsed = v.get_ref().trim().strip_suffix('%').and_then(|n| n.trim().parse::<u32>().ok());
            match parsed {
                Some(p) if (1..=25_600).contains(&p) => Some(p),
                _ => {
                    c.error(v.span(), "limits.cpu_quota must be a percentage of one core between 1% and 25600%, like \"50%\"");
                    None
                }
            }
        }),
        output_bytes: l
            .output
            .as_ref()
            .and_then(|v| c.size(v, "limits.output", bounds::OUTPUT_BYTES))
            .unwrap_or(defaults::OUTPUT_BYTES),
        open_files: l
            .open_files
            .as_ref()
            .and_then(|v| c.integer(v, "limits.open_files", bounds::OPEN_FILES))
            .unwrap_or(defaults::OPEN_FILES),
        file_size_bytes: l
            .file_size
            .as_ref()
            .and_then(|v| c.size(v, "limits.file_size", bounds::FILE_SIZE_BYTES))
            .unwrap_or(defaults::FILE_SIZE_BYTES),
    };

    let mut env = Vec::new();
    if file.env.is_empty() {
        env.push(("PATH".to_string(), defaults::PATH.to_string()));
    }
    for (key, value) in &file.env {
        let k = key.get_ref();
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            c.error(
                key.span(),
                format!("environment name {k:?} must be non-empty, without `=` or NUL"),
            );
            continue;
        }
        if value.get_ref().contains('\0') {
            c.error(
                value.span(),
                format!("environment value of {k} must not contain NUL"),
            );
            continue;
        }
        if k.starts_with("LD_") {
            c.warning(
                key.span(),
                format!("{k} changes which code the dynamic linker loads"),
            );
        }
        env.push((k.clone(), value.get_ref().clone()));
    }

    let default_require = RequireFile::default();
    let r = file.require.as_ref().unwrap_or(&default_require);
    let require = Requirements {
        landlock: c.requirement(r.landlock.as_ref(), "landlock"),
        seccomp: c.requirement(r.seccomp.as_ref(), "seccomp"),
        cgroup: c.requirement(r.cgroup.as_ref(), "cgroup"),
    };

    let hostname = match &file.hostname {
        None => defaults::HOSTNAME.to_string(),
        Some(h) => {
            let text = h.get_ref();
            let ok = !text.is_empty()
                && text.len() <= 64
                && text
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '.');
            if !ok {
                c.error(
                    h.span(),
                    "hostname must be 1-64 characters of letters, digits, `-` and `.`",
                );
            }
            text.clone()
        }
    };

    let cwd = match &file.cwd {
        Some(cwd) => c.path(cwd, "cwd").unwrap_or_default(),
        None if tmpfs.iter().any(|(p, _)| p == "/tmp") => "/tmp".to_string(),
        None => "/".to_string(),
    };

    let proc = match file.proc.as_ref().map(|v| (v, v.get_ref().as_str())) {
        None | Some((_, "masked")) => ProcView::Masked,
        Some((_, "full")) => ProcView::Full,
        Some((value, other)) => {
            c.error(
                value.span(),
                format!("proc must be \"masked\" or \"full\", not {other:?}"),
            );
            ProcView::Masked
        }
    };

    let after = c
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    (after == before).then_some(Profile {
        name: profile_name,
        read,
        write,
        tmpfs,
        network,
        syscalls,
        limits,
        env,
        require,
        hostname,
        cwd,
        proc,
    })
}

/// Validates a parsed policy. On success returns the policy and its warnings; on failure
/// every error and warning found, in file order.
pub fn validate_policy(
    file: &PolicyFile,
    source: Source<'_>,
) -> Result<(ValidatedPolicy, Vec<Diagnostic>), Vec<Diagnostic>> {
    let mut c = Checker {
        source,
        diagnostics: Vec::new(),
    };
    if *file.version.get_ref() != 1 {
        c.error(
            file.version.span(),
            format!("version must be 1, not {}", file.version.get_ref()),
        );
    }
    let strict_objects = file.strict_objects.as_ref().is_some_and(|s| *s.get_ref());
    let options = ToolOptions {
        strict_objects,
        destructive_requires_approval: file
            .destructive_requires_approval
            .as_ref()
            .is_none_or(|v| *v.get_ref()),
    };

    let profiles: BTreeMap<String, Option<Profile>> = file
        .profiles
        .iter()
        .map(|(name, p)| (name.get_ref().clone(), check_profile(&mut c, name, p)))
        .collect();
    let tools: BTreeMap<String, Option<Tool>> = file
        .tools
        .iter()
        .map(|(name, t)| {
            (
                name.get_ref().clone(),
                check_tool(&mut c, name, t, &profiles, options),
            )
        })
        .collect();

    let gate = check_gate(&mut c, file, &tools);

    let mut diagnostics = c.diagnostics;
    diagnostics.sort_by_key(|d| (d.line, d.column));
    if diagnostics.iter().any(|d| d.severity == Severity::Error) {
        return Err(diagnostics);
    }
    let policy = ValidatedPolicy {
        gate,
        strict_objects,
        profiles: profiles
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect(),
        tools: tools
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect(),
    };
    Ok((policy, diagnostics))
}
