//! `airlock selftest`: the escape battery (`airlock-battery`) on this host with this build.
//! The `airlock` binary itself is the hostile program: the battery policy binds it read-only
//! into every sandbox and runs its hidden probe entry ([`PROBE_ARG`]) there, so the proof
//! needs nothing but the binary an embedder already ships.

use std::process::ExitCode;
use std::sync::Arc;

use airlock::{SandboxRun, Supervisor, SupervisorOptions};
use airlock_battery::{Fixture, Report, Runner};
use airlock_policy::CompiledPolicy;

/// The hidden first argument that turns `airlock` into the battery's probe.
pub const PROBE_ARG: &str = "__airlock_probe";

/// Arguments of `airlock selftest`.
#[derive(Debug, clap::Args)]
pub struct SelftestArgs {
    /// Print `{"ok": BOOL, "cases": [{name, layer, expected, observed, ok}, ...]}`.
    #[arg(long)]
    json: bool,
    /// Host uid of the sandbox's root when running as root (default 65534).
    #[arg(long)]
    sandbox_uid: Option<u32>,
}

/// Runs the cases one after another in a single supervisor.
struct LibraryRunner<'a> {
    runtime: &'a tokio::runtime::Runtime,
    supervisor: &'a Supervisor,
    policy: &'a CompiledPolicy,
    calls: u64,
}

impl Runner for LibraryRunner<'_> {
    fn run(&mut self, profile: &str, argv: Vec<String>) -> Result<serde_json::Value, String> {
        let profile = self
            .policy
            .profiles
            .get(profile)
            .cloned()
            .ok_or_else(|| format!("the battery policy has no profile {profile:?}"))?;
        self.calls += 1;
        let run = SandboxRun {
            call_id: format!("selftest-{}", self.calls),
            tool: "selftest".into(),
            timeout: profile.limits.timeout,
            profile: Arc::new((*profile).clone()),
            argv,
            stdin: Vec::new(),
            arguments_json: "{}".into(),
            inherit_stdio: None,
            builtin: None,
        };
        let result = self.runtime.block_on(self.supervisor.run(run, None));
        serde_json::to_value(&result).map_err(|e| e.to_string())
    }
}

/// `airlock selftest`: exit 0 only if every case ended the way the battery expects.
pub fn run_selftest(args: &SelftestArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot find this program's path: {e}"))?;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // The workspace must be writable by the sandbox's root: as root, the host uid it maps to.
    let owner = if root {
        Some(args.sandbox_uid.unwrap_or(65534))
    } else {
        None
    };
    let fixture = Fixture::new(&std::env::temp_dir(), owner)
        .map_err(|e| anyhow::anyhow!("cannot set up the battery's fixture: {e}"))?;
    // Bound from the fixture: the sandbox's root may not reach where this program lies.
    let exe = fixture
        .stage_probe(&exe)
        .map_err(|e| anyhow::anyhow!("cannot stage {} as the probe: {e}", exe.display()))?;
    let text = fixture.policy_toml(&exe);
    let loaded = airlock_policy::load_policy_str(&text, "selftest")
        .map_err(|e| anyhow::anyhow!("the battery policy does not load: {e}"))?;
    let runtime = crate::runtime()?;
    let supervisor = runtime.block_on(async {
        Supervisor::start(SupervisorOptions {
            sandbox_host_id: args.sandbox_uid,
            ..crate::supervisor_options()
        })
    })?;
    let mut runner = LibraryRunner {
        runtime: &runtime,
        supervisor: &supervisor,
        policy: &loaded.policy,
        calls: 0,
    };
    let probe = vec![exe.display().to_string(), PROBE_ARG.to_string()];
    let reports = airlock_battery::run(&mut runner, &probe, &fixture);
    runtime.block_on(supervisor.close());
    print_reports(&reports, args.json)?;
    Ok(if reports.iter().all(|r| r.ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn print_reports(reports: &[Report], json: bool) -> anyhow::Result<()> {
    let ok = reports.iter().all(|r| r.ok);
    let text = if json {
        let doc = serde_json::json!({ "ok": ok, "cases": reports });
        format!("{}\n", serde_json::to_string_pretty(&doc)?)
    } else {
        let failed = reports.iter().filter(|r| !r.ok).count();
        format!(
            "{}\n{} cases, {} blocked as expected, {failed} failed: {}\n",
            airlock_battery::table(reports),
            reports.len(),
            reports.len() - failed,
            if ok { "PASS" } else { "FAIL" }
        )
    };
    crate::write_stdout(&text)
}
