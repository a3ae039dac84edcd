//! `airlock mcp`: the gate served to one MCP client over stdin and stdout.
//!
//! stdout carries protocol messages only: logs go to stderr (set up in `main`), and no
//! worker inherits our stdout (the gate captures tools' output).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use airlock::Gate;
use airlock::mcp::McpConfig;
use airlock::pool::PoolSize;
use airlock::{CancelSignal, Supervisor, SupervisorOptions};
use airlock_policy::presets;

/// The flags of `airlock mcp`.
#[derive(Debug, clap::Args)]
pub(crate) struct McpArgs {
    /// Policy file (reloaded on SIGHUP; a change of the active tools is announced with
    /// `notifications/tools/list_changed`).
    #[arg(long)]
    policy: PathBuf,
    /// Append audit records (JSON lines) to this file; `-` for stderr.
    #[arg(long)]
    audit: Option<PathBuf>,
    /// Calls running at once.
    #[arg(long, default_value_t = 8)]
    max_concurrent: usize,
    /// Calls waiting for a slot before new ones get an `overloaded` result.
    #[arg(long, default_value_t = 64)]
    max_queued: usize,
    /// Never ask for approvals with `elicitation/create`: every call needing one is
    /// answered `approval_required`, naming the pending approval.
    #[arg(long)]
    no_elicitation: bool,
    /// Host uid of the sandbox's root when running as root (default 65534).
    #[arg(long)]
    sandbox_uid: Option<u32>,
    /// Pre-confined idle workers kept per profile (0: no pool).
    #[arg(long, default_value_t = 0)]
    pool: usize,
}

pub(crate) fn run_mcp(args: &McpArgs) -> anyhow::Result<ExitCode> {
    let loaded = crate::load_policy(Some(&args.policy), None, presets::DEFAULT_PRESET)?;
    for warning in &loaded.warnings {
        eprintln!("{warning}");
    }
    if args.max_concurrent == 0 {
        anyhow::bail!("--max-concurrent: at least 1");
    }
    let pool = (args.pool > 0)
        .then(|| {
            let max = args
                .pool
                .saturating_mul(4)
                .min(PoolSize::LIMIT)
                .max(args.pool);
            PoolSize::between(args.pool, max, PoolSize::DEFAULT_SHRINK_AFTER)
        })
        .transpose()
        .map_err(|e| anyhow::anyhow!("--pool: {e}"))?;
    let audit = crate::open_audit(args.audit.as_ref())?;
    let config = McpConfig {
        max_concurrent: args.max_concurrent,
        max_queued: args.max_queued,
        elicitation: !args.no_elicitation,
        ..McpConfig::default()
    };
    let runtime = crate::runtime()?;
    let outcome = runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let supervisor = Arc::new(Supervisor::start(SupervisorOptions {
            sandbox_host_id: args.sandbox_uid,
            ..crate::supervisor_options()
        })?);
        if let Some(size) = pool {
            supervisor
                .warm_exactly(&crate::profiles_in_use(&loaded.policy), size)
                .await;
        }
        let mut gate = Gate::new(Arc::clone(&supervisor), loaded.policy);
        if let Some(audit) = audit {
            gate = gate.with_audit(audit);
        }
        let gate = Arc::new(gate);
        let stop = CancelSignal::new();
        let (reloaded, reloads) = tokio::sync::watch::channel(0u64);
        let mut term = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut hangup = signal(SignalKind::hangup())?;
        let signals = {
            let (stop, gate, supervisor) =
                (stop.clone(), Arc::clone(&gate), Arc::clone(&supervisor));
            let path = args.policy.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = term.recv() => break,
                        _ = interrupt.recv() => break,
                        _ = hangup.recv() => {
                            if crate::reload::reload_policy(&path, &gate, &supervisor, pool).await {
                                reloaded.send_modify(|n| *n += 1);
                            }
                        }
                    }
                }
                stop.cancel();
            })
        };
        tracing::info!(policy = %args.policy.display(), "airlock MCP server on stdio");
        let served = airlock::mcp::serve(
            gate,
            config,
            tokio::io::stdin(),
            tokio::io::stdout(),
            reloads,
            stop,
        )
        .await;
        signals.abort();
        supervisor.close().await;
        anyhow::Ok(served)
    })?;
    // tokio's stdin reads on a blocking thread that only returns with a line or the end of
    // input: after SIGTERM it may never, so it is not waited for.
    runtime.shutdown_timeout(Duration::from_millis(100));
    outcome?;
    Ok(ExitCode::SUCCESS)
}
