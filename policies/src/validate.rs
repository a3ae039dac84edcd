//! Step 2 of 3: checks a parsed [`PolicyFile`] and produces a [`ValidatedPolicy`] of plain,
//! typed values — reporting every error at once, plus warnings for risky grants.
//!
//! The checks are split by what they look at: `profile` (one function per rule family:
//! filesystem, network, seccomp, limits, ...), `tool` (with `schemas`, `argv` and
//! `permissions`) and `gate` (decision rules, rate limits, approvals, audit). The types they
//! produce live in [`crate::validated`] and are re-exported here.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::LazyLock;
use std::time::Duration;

use airlock_protocol::Requirement;
use regex::Regex;
use toml::Spanned;

use crate::diagnostic::{Diagnostic, Severity, Source};
use crate::model::PolicyFile;
use crate::units::{parse_duration, parse_size};

mod argv;
mod gate;
mod permissions;
mod profile;
mod rule_fields;
mod schemas;
mod sessions;
mod tool;

// The validated types, under the paths callers have always used (`validate::Tool`, ...).
pub use crate::validated::{
    Approval, ArgTemplate, Limits, Network, PERMISSIONS, PathGrant, ProcView, Profile,
    Requirements, SessionPolicy, SideEffect, StdinSource, TcpPorts, Tool, ToolState,
    ValidatedPolicy, Workspace,
};
pub use sessions::DEFAULT_WORKSPACE_BYTES;

use gate::check_gate;
use profile::check_profile;
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
    /// Per stream. The worker reports both streams in one frame of at most 16 MiB, and a
    /// daemon's JSON answer can take six bytes for each byte of output: 4 MiB keeps both
    /// within what they carry.
    pub const OUTPUT_BYTES: (u64, u64) = (1, 4 << 20);
    pub const OPEN_FILES: (i64, i64) = (8, 65_536);
    pub const FILE_SIZE_BYTES: (u64, u64) = (1, 1 << 40);
    pub const TMPFS_BYTES: (u64, u64) = (4 << 10, 64 << 30);
    pub const RETRIES: (i64, i64) = (0, 10);
    pub const MAX_SESSIONS: (i64, i64) = (1, 100_000);
    pub const IDLE_TIMEOUT_MIN: Duration = Duration::from_secs(1);
    /// A session's whole life: 1 s to 30 days.
    pub const LIFETIME: (Duration, Duration) =
        (Duration::from_secs(1), Duration::from_secs(30 * 24 * 3600));
    pub const INODES: (i64, i64) = (16, 1 << 32);
}

static TOOL_NAME: LazyLock<Result<Regex, regex::Error>> =
    LazyLock::new(|| Regex::new(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$"));

/// Collects diagnostics while validating.
struct Checker<'a> {
    source: Source<'a>,
    diagnostics: Vec<Diagnostic>,
}

impl Checker<'_> {
    /// Errors reported so far; a check compares it before and after to know whether the
    /// thing it built is usable.
    fn error_count(&self) -> usize {
        self.diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .count()
    }

    fn error(&mut self, span: Range<usize>, message: impl Into<String>) {
        self.diagnostics.push(self.source.error(span, message));
    }

    fn warning(&mut self, span: Range<usize>, message: impl Into<String>) {
        self.diagnostics.push(self.source.warning(span, message));
    }

    /// The span of the key written before the value at `value` (`key = value`), so that a
    /// diagnostic about a key can point at it: serde keeps only the values' spans. Falls
    /// back to the value's span when the text before it is not `KEY =`.
    fn key_span(&self, value: Range<usize>) -> Range<usize> {
        let text = self.source.text;
        let Some(before) = text.get(..value.start) else {
            return value;
        };
        let Some(before) = before.trim_end_matches([' ', '\t']).strip_suffix('=') else {
            return value;
        };
        let key = before.trim_end_matches([' ', '\t']);
        let start = match key.chars().last() {
            Some(quote @ ('"' | '\'')) => key[..key.len() - 1].rfind(quote),
            Some(_) => Some(
                key.trim_end_matches(|ch: char| {
                    ch.is_ascii_alphanumeric() || ch == '_' || ch == '-'
                })
                .len(),
            ),
            None => None,
        };
        match start {
            Some(start) if start < key.len() => start..key.len(),
            _ => value,
        }
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

    let sessions = sessions::check_sessions(&mut c, file.sessions.as_ref());
    let profiles: BTreeMap<String, Option<Profile>> = file
        .profiles
        .iter()
        .map(|(name, p)| {
            (
                name.get_ref().clone(),
                check_profile(&mut c, name, p, &sessions),
            )
        })
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
        sessions,
    };
    Ok((policy, diagnostics))
}
