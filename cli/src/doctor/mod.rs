//! `airlock doctor`: checks, one by one, the kernel features a sandbox needs — user
//! namespaces (and the sysctls and AppArmor switch that restrict them), Landlock, seccomp,
//! cgroups — says for each missing piece what it breaks and how to fix it, and ends with a
//! real sandbox in the default profile, whose success alone decides the exit status.
//! Inside a container it also names the container's settings that keep sandboxes from
//! working (`container`).
//!
//! Probes that change the calling process (unshare, a seccomp filter) run in a forked child
//! that exits right after, so the doctor itself stays unconfined.

mod cgroup;
mod container;
mod host;
mod landlock;
mod probe;
mod sandbox;
mod seccomp;
mod userns;

use std::process::ExitCode;

use serde::Serialize;
use serde_json::Value;

use cgroup::check_cgroups;
use host::{check_kernel, check_open_files, check_privileges, check_worker_image};
use landlock::check_landlock;
use sandbox::{check_default_sandbox, check_egress_sandbox};
use seccomp::check_seccomp;
use userns::check_user_namespaces;

/// Options of `airlock doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print the report as one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    /// Works.
    Ok,
    /// Works, with a limitation worth knowing.
    Warn,
    /// Missing: something airlock needs does not work.
    Fail,
}

/// One check of the report.
#[derive(Debug, Serialize)]
struct Check {
    /// Stable identifier (`userns.probe`).
    id: &'static str,
    /// What was checked, in words.
    title: &'static str,
    status: Status,
    /// What was found.
    detail: String,
    /// What does not work because of it (warn and fail only).
    #[serde(skip_serializing_if = "Option::is_none")]
    breaks: Option<String>,
    /// How to fix it (warn and fail only).
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
    /// Machine-readable findings.
    #[serde(skip_serializing_if = "Value::is_null")]
    facts: Value,
}

impl Check {
    fn ok(id: &'static str, title: &'static str, detail: impl Into<String>) -> Self {
        Self {
            id,
            title,
            status: Status::Ok,
            detail: detail.into(),
            breaks: None,
            fix: None,
            facts: Value::Null,
        }
    }

    fn problem(
        id: &'static str,
        title: &'static str,
        status: Status,
        detail: impl Into<String>,
        breaks: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            id,
            title,
            status,
            detail: detail.into(),
            breaks: Some(breaks.into()),
            fix: Some(fix.into()),
            facts: Value::Null,
        }
    }

    fn with_facts(mut self, facts: Value) -> Self {
        self.facts = facts;
        self
    }
}

/// The whole report, as `doctor --json` prints it.
#[derive(Debug, Serialize)]
struct Report {
    /// The default profile ran a command in a real sandbox.
    ok: bool,
    /// One sentence.
    summary: String,
    checks: Vec<Check>,
}

/// Runs every check, prints the report, and exits 0 only if the default profile works.
pub fn run_doctor(args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let mut checks = vec![
        check_kernel(),
        check_privileges(),
        check_open_files(),
        check_worker_image(),
    ];
    checks.extend(check_user_namespaces());
    checks.extend(check_landlock());
    checks.extend(check_seccomp());
    let (cgroup_checks, parent) = check_cgroups();
    checks.extend(cgroup_checks);
    checks.extend(container::classify(&container::gather()));
    let sandbox = check_default_sandbox(parent.clone());
    let ok = sandbox.status == Status::Ok;
    checks.push(sandbox);
    if ok {
        checks.push(check_egress_sandbox(parent));
    }

    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| c.id)
        .collect();
    let warned = checks.iter().filter(|c| c.status == Status::Warn).count();
    let summary = match (ok, failed.as_slice(), warned) {
        (true, [], 0) => {
            "airlock works here: the default profile ran a command in a sandbox".into()
        }
        (true, _, _) => format!(
            "airlock works here: the default profile ran a command in a sandbox ({} failed \
             and {warned} warning check(s) limit other profiles; see above)",
            failed.len()
        ),
        (false, _, _) => format!(
            "airlock cannot run the default profile here; fix the failed checks: {}",
            failed.join(", ")
        ),
    };
    let summary = summary + &container_settings(&checks);
    let report = Report {
        ok,
        summary,
        checks,
    };
    if args.json {
        crate::write_stdout(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else {
        crate::write_stdout(&render_report(&report))?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The runtime settings the failed container checks name, as one sentence to append to
/// the summary (empty when none failed): the first thing to change in a container.
fn container_settings(checks: &[Check]) -> String {
    let fixes: Vec<&str> = checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .filter(|c| c.id.starts_with("container.") || c.id == "proc.visible")
        .filter_map(|c| c.fix.as_deref())
        .collect();
    if fixes.is_empty() {
        String::new()
    } else {
        format!(
            "\nmissing container settings:\n  - {}",
            fixes.join("\n  - ")
        )
    }
}

/// One line per check; the breaks and fix hints of a problem indented beneath it.
fn render_report(report: &Report) -> String {
    let mut out = String::new();
    for check in &report.checks {
        let label = match check.status {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        out.push_str(&format!(
            "{label:<5} {:<28} {}\n",
            check.title, check.detail
        ));
        if let Some(breaks) = &check.breaks {
            out.push_str(&format!("        breaks: {breaks}\n"));
        }
        if let Some(fix) = &check.fix {
            out.push_str(&format!("        fix:    {fix}\n"));
        }
    }
    out.push_str(&format!("\n{}\n", report.summary));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_report_indents_breaks_and_fix_under_the_check() {
        let report = Report {
            ok: false,
            summary: "no".into(),
            checks: vec![
                Check::ok("a", "first", "fine"),
                Check::problem("b", "second", Status::Fail, "bad", "it", "do this"),
            ],
        };
        let text = render_report(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("ok    first"), "{text}");
        assert!(lines[1].starts_with("FAIL  second"), "{text}");
        assert_eq!(lines[2], "        breaks: it");
        assert_eq!(lines[3], "        fix:    do this");
    }
}
