//! The check that decides the exit status: a real sandbox in the default profile.

use std::sync::Arc;
use std::time::Duration;

use airlock::cgroup::CgroupParent;
use airlock::{SandboxRun, Supervisor, SupervisorOptions, ToolResult};
use airlock_policy::{load_policy_str, presets, units};
use serde_json::json;

use super::{Check, Status};

/// Starts a real sandbox in the embedded default profile running `/bin/true`.
pub(super) fn check_default_sandbox(parent: Option<CgroupParent>) -> Check {
    const TITLE: &str = "default profile sandbox";
    let breaks = "`airlock exec` and `airlock run` with the default policy";
    let result = run_true_in_default_profile(parent, false);
    let result = match result {
        Ok(result) => result,
        Err(error) => {
            return Check::problem(
                "sandbox.default",
                TITLE,
                Status::Fail,
                format!("cannot start the supervisor: {error:#}"),
                breaks,
                "fix the failed checks above; RUST_LOG=airlock=debug shows each step",
            );
        }
    };
    // An ok result always ran in a worker; the default only spares an unwrap.
    let isolation = &result.isolation.clone().unwrap_or_default();
    let facts = json!({
        "ok": result.ok,
        "duration_ms": result.duration_ms,
        "error": result.error,
        "isolation": isolation,
    });
    if result.ok {
        let seccomp = isolation
            .seccomp
            .as_deref()
            .map_or("none".to_string(), |d| {
                format!("filter {}", d.get(..12).unwrap_or(d))
            });
        Check::ok(
            "sandbox.default",
            TITLE,
            format!(
                "ran /bin/true in {} ms: namespaces {}; Landlock ABI {} ({}); seccomp {}; \
                 cgroup {}; memory {}, {} processes",
                result.duration_ms,
                isolation.namespaces.join(", "),
                isolation.landlock_abi,
                serde_json::to_value(isolation.landlock)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                seccomp,
                isolation.cgroup.as_deref().unwrap_or("none"),
                units::format_size(isolation.limits.memory_bytes),
                isolation.limits.pids,
            ),
        )
        .with_facts(facts)
    } else {
        let what = match &result.error {
            Some(error) => format!(
                "{}{}: {}",
                serde_json::to_value(error.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                error
                    .step
                    .as_deref()
                    .map(|s| format!(" at step {s}"))
                    .unwrap_or_default(),
                error.message
            ),
            None => "failed without an error".into(),
        };
        Check::problem(
            "sandbox.default",
            TITLE,
            Status::Fail,
            format!("/bin/true failed: {what}"),
            breaks,
            "fix the failed checks above; RUST_LOG=airlock=debug shows each step",
        )
        .with_facts(facts)
    }
}

/// Runs `/bin/true` in the default profile given an (empty) egress allowlist: whether this
/// kernel and these privileges can run profiles with `network = { allow = [...] }` (a
/// namespace of the worker's own with loopback up, and its listener handed over).
pub(super) fn check_egress_sandbox(parent: Option<CgroupParent>) -> Check {
    const TITLE: &str = "egress proxy";
    let breaks = "profiles with network = { allow = [...] }";
    let (status, detail) = match run_true_in_default_profile(parent, true) {
        Ok(result) if result.ok && result.network.is_some() => {
            return Check::ok(
                "sandbox.egress",
                TITLE,
                "a worker with its own network namespace passed its listener to the proxy",
            );
        }
        Ok(result) => (
            Status::Warn,
            match &result.error {
                Some(error) => format!("/bin/true failed: {}", error.message),
                None => "the call ran without its proxy".to_string(),
            },
        ),
        Err(error) => (
            Status::Warn,
            format!("cannot start the supervisor: {error:#}"),
        ),
    };
    Check::problem(
        "sandbox.egress",
        TITLE,
        status,
        detail,
        breaks,
        "network namespaces with loopback up are needed; RUST_LOG=airlock=debug shows each step",
    )
}

fn run_true_in_default_profile(
    parent: Option<CgroupParent>,
    egress: bool,
) -> anyhow::Result<ToolResult> {
    let text = presets::preset_text(presets::DEFAULT_PRESET)
        .ok_or_else(|| anyhow::anyhow!("the default preset is not embedded"))?;
    let text = if egress {
        text.replace("network = \"none\"", "network = { allow = [] }")
    } else {
        text.to_string()
    };
    let loaded = load_policy_str(&text, &format!("preset:{}", presets::DEFAULT_PRESET))?;
    let profile = loaded
        .policy
        .profiles
        .get(airlock_policy::validate::defaults::PROFILE)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("the default preset has no default profile"))?;
    // A healthy sandbox runs /bin/true in well under a second; do not wait 30 s for a
    // broken one.
    let timeout = profile.limits.timeout.min(Duration::from_secs(10));
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let supervisor = Supervisor::start(SupervisorOptions {
            cgroup_parent: parent,
            ..crate::supervisor_options()
        })?;
        let run = SandboxRun {
            call_id: "doctor".into(),
            tool: "exec".into(),
            profile: Arc::clone(&profile),
            argv: vec!["/bin/true".into()],
            stdin: Vec::new(),
            arguments_json: "{}".into(),
            timeout,
            inherit_stdio: None,
            builtin: None,
        };
        let result = supervisor.run(run, None).await;
        supervisor.close().await;
        anyhow::Ok(result)
    })
}
