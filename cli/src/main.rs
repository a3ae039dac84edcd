//! The `airlock` binary: parses the command line and hands each subcommand to the library
//! that owns it (policy checks to `airlock-policy`, sandboxes to the supervisor).

use std::path::PathBuf;
use std::process::ExitCode;

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use airlock::audit::AuditSink;
use airlock::pool::PoolSize;
use airlock::{
    CallOptions, ErrorKind, Gate, SandboxRun, Supervisor, SupervisorOptions, ToolCall, ToolResult,
};
use airlock_policy::{
    CompiledPolicy, Diagnostic, LoadedPolicy, PolicyError, Severity, load_policy_file,
    load_policy_str, presets, units,
};

use args::{Command, LogFormat};

mod args;
mod bench;
mod doctor;
mod explain;
mod health;
mod input;
mod learn;
mod manual;
mod mcp;
mod reload;
mod remote;
mod selftest;
mod sys;
mod trust;
mod watch;

/// The dedicated worker program, built by `build.rs` from the `airlock-worker` crate; empty
/// if it could not be built, and then the supervisor execs this binary as its worker.
pub(crate) const WORKER_IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/airlock-worker"));

/// Supervisor options every subcommand starts from: the embedded worker program.
pub(crate) fn supervisor_options() -> SupervisorOptions {
    SupervisorOptions {
        worker_image: Some(WORKER_IMAGE),
        ..SupervisorOptions::default()
    }
}

/// `--socket-mode`: octal, at most 0660 (a world-reachable socket would leave only the peer
/// check between every local user and the gate).
fn socket_mode_of(text: &str) -> anyhow::Result<u32> {
    let mode = u32::from_str_radix(text, 8)
        .map_err(|_| anyhow::anyhow!("--socket-mode: {text:?} is not an octal mode like 0660"))?;
    if mode & !0o660 != 0 {
        anyhow::bail!("--socket-mode: {text} gives more than owner and group read-write (0660)");
    }
    Ok(mode)
}

/// `--metrics`: an IP address and port (a host name would be resolved to who knows what).
fn metrics_listen(
    text: &str,
    allow_remote: bool,
) -> anyhow::Result<airlock::daemon::MetricsListen> {
    let addr = text.parse().map_err(|_| {
        anyhow::anyhow!(
            "--metrics (or AIRLOCK_METRICS): {text:?} is not an IP address and port like 127.0.0.1:9464"
        )
    })?;
    Ok(airlock::daemon::MetricsListen { addr, allow_remote })
}

/// `--socket-group`: a group name, or a gid.
fn group_of(text: &str) -> anyhow::Result<u32> {
    if let Ok(gid) = text.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(text) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        Ok(None) => anyhow::bail!("--socket-group: no group named {text:?}"),
        Err(e) => anyhow::bail!("--socket-group: cannot look up {text:?}: {e}"),
    }
}

/// The outcome of checking one file, as `check --json` prints it.
#[derive(Debug, serde::Serialize)]
struct FileReport {
    file: String,
    valid: bool,
    diagnostics: Vec<Diagnostic>,
}

fn check_file(path: &std::path::Path) -> FileReport {
    let file = path.display().to_string();
    match load_policy_file(path) {
        Ok(loaded) => FileReport {
            file,
            valid: true,
            diagnostics: loaded.warnings,
        },
        Err(PolicyError::Invalid { diagnostics, .. }) => FileReport {
            file,
            valid: false,
            diagnostics,
        },
        Err(other) => {
            // Not a located mistake (unreadable file, compile failure): report at 1:1.
            let mut message = other.to_string();
            let mut source = std::error::Error::source(&other);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            FileReport {
                file: file.clone(),
                valid: false,
                diagnostics: vec![Diagnostic {
                    severity: Severity::Error,
                    file,
                    line: 1,
                    column: 1,
                    message,
                }],
            }
        }
    }
}

/// Writes to stdout; a closed pipe (`airlock schema | head`) is not an error worth a panic.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    write_stdout_bytes(text.as_bytes())
}

/// [`write_stdout`] for bytes (completion scripts, man pages).
fn write_stdout_bytes(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn run_check(files: &[PathBuf], json: bool) -> anyhow::Result<ExitCode> {
    let reports: Vec<FileReport> = files.iter().map(|f| check_file(f)).collect();
    let all_valid = reports.iter().all(|r| r.valid);
    if json {
        write_stdout(&format!("{}\n", serde_json::to_string_pretty(&reports)?))?;
    } else {
        for report in &reports {
            for diagnostic in &report.diagnostics {
                eprintln!("{diagnostic}");
            }
        }
        let errors: usize = reports
            .iter()
            .flat_map(|r| &r.diagnostics)
            .filter(|d| d.severity == Severity::Error)
            .count();
        if errors > 0 {
            eprintln!(
                "{errors} error(s) in {} file(s)",
                reports.iter().filter(|r| !r.valid).count()
            );
        }
    }
    Ok(if all_valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Loads a policy file, or an embedded preset (`fallback` when neither is given).
fn load_policy(
    file: Option<&PathBuf>,
    preset: Option<&str>,
    fallback: &str,
) -> anyhow::Result<LoadedPolicy> {
    let began = std::time::Instant::now();
    let loaded = match file {
        Some(path) => load_policy_file(path),
        None => {
            let name = preset.unwrap_or(fallback);
            let text = presets::preset_text(name)
                .ok_or_else(|| anyhow::anyhow!("no preset named {name:?}; see `airlock preset`"))?;
            load_policy_str(text, &format!("preset:{name}"))
        }
    };
    tracing::debug!(elapsed_us = began.elapsed().as_micros(), "policy loaded");
    match loaded {
        Ok(loaded) => Ok(loaded),
        Err(PolicyError::Invalid { diagnostics, file }) => {
            for d in &diagnostics {
                eprintln!("{d}");
            }
            Err(anyhow::anyhow!("policy {file} is invalid"))
        }
        Err(other) => Err(other.into()),
    }
}

fn random_call_id() -> String {
    let mut bytes = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    format!(
        "call-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// Exit status of `airlock exec` for a result (documented on the subcommand).
fn exec_exit_code(result: &ToolResult) -> u8 {
    let clamp = |code: i32| u8::try_from(code.clamp(0, 255)).unwrap_or(255);
    match result.error.as_ref().map(|e| e.kind) {
        None => clamp(result.exit_code.unwrap_or(0)),
        Some(ErrorKind::ToolFailed) => match (result.exit_code, result.signal) {
            (Some(code), _) => clamp(code),
            (None, Some(signal)) => clamp(128 + signal),
            (None, None) => {
                let missing = result
                    .error
                    .as_ref()
                    .is_some_and(|e| e.message.contains("No such file"));
                if missing { 127 } else { 126 }
            }
        },
        Some(ErrorKind::Timeout) => 124,
        Some(ErrorKind::OutOfMemory) => 120,
        Some(ErrorKind::PidsLimit) => 121,
        Some(ErrorKind::SeccompViolation) => 122,
        Some(ErrorKind::ProtocolViolation | ErrorKind::Cancelled) => 123,
        Some(_) => 125,
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // A burst's clean-up starts blocking threads; each keeps the blocks it freed
        // cached until it exits, which the daemon waits for before giving memory back
        // (see the daemon's trim). 2 s rather than tokio's 10: a thread started again
        // after a quiet spell costs tens of microseconds.
        .thread_keep_alive(std::time::Duration::from_secs(2))
        .enable_all()
        .build()?)
}

/// A one-shot `exec` or `run`: its runtime, and its supervisor being started on another
/// thread while this one loads the policy. Sealing the worker image and finding the cgroups
/// take about as long as loading a policy and neither needs the other, so on two cores the
/// call starts that much sooner; the work done is the same.
struct OneShot {
    /// Taken with the supervisor by [`OneShot::started`].
    runtime: Option<tokio::runtime::Runtime>,
    /// Taken by [`OneShot::started`]; otherwise joined on drop, so that a run given up
    /// (an invalid policy) does not exit while the supervisor is still setting up.
    starting: Option<Starting>,
}

type Starting = std::thread::JoinHandle<Result<Supervisor, airlock::sandbox::SupervisorError>>;

impl Drop for OneShot {
    fn drop(&mut self) {
        if let Some(starting) = self.starting.take() {
            let _ = starting.join();
        }
    }
}

impl OneShot {
    fn start(sandbox_uid: Option<u32>, landlock_audit: bool) -> anyhow::Result<Self> {
        // One call has nothing to run in parallel: on the calling thread it needs no worker
        // threads started (two clones, their stacks) nor a cross-thread wake-up for each of
        // the call's events.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        // Unjoined: loading the policy waits for what it builds where it needs it, and
        // nothing else does.
        let _ = std::thread::Builder::new()
            .name("airlock-schemas".into())
            .spawn(airlock_policy::schema::warm_up);
        let starting = std::thread::Builder::new()
            .name("airlock-start".into())
            .spawn(move || {
                let _runtime = handle.enter();
                let began = std::time::Instant::now();
                let started = Supervisor::start(SupervisorOptions {
                    sandbox_host_id: sandbox_uid,
                    landlock_audit,
                    one_shot: true,
                    ..supervisor_options()
                });
                tracing::debug!(
                    elapsed_us = began.elapsed().as_micros(),
                    "supervisor started"
                );
                started
            })?;
        Ok(Self {
            runtime: Some(runtime),
            starting: Some(starting),
        })
    }

    /// Waits for the supervisor.
    fn started(mut self) -> anyhow::Result<(tokio::runtime::Runtime, Supervisor)> {
        let (Some(runtime), Some(starting)) = (self.runtime.take(), self.starting.take()) else {
            anyhow::bail!("the supervisor was already taken");
        };
        let supervisor = starting
            .join()
            .map_err(|_| anyhow::anyhow!("starting the supervisor panicked"))??;
        Ok((runtime, supervisor))
    }
}

/// Ends a one-shot run once its supervisor is closed (every worker reaped, every cgroup
/// removed) without waiting for threads: the process exits next. Dropping them would join
/// the spawner thread and the runtime's idle blocking thread, wall time after the result
/// with nothing left to clean up.
fn leave_behind(runtime: tokio::runtime::Runtime, supervisor: Arc<Supervisor>) {
    runtime.shutdown_background();
    std::mem::forget(supervisor);
}

#[allow(clippy::too_many_arguments)]
fn run_exec(
    policy: &CompiledPolicy,
    profile: &str,
    timeout: Option<&str>,
    memory: Option<&str>,
    json: bool,
    one_shot: OneShot,
    command: Vec<String>,
) -> anyhow::Result<ExitCode> {
    let mut profile = policy
        .profiles
        .get(profile)
        .map(|p| (**p).clone())
        .ok_or_else(|| anyhow::anyhow!("no profile named {profile:?} in the policy"))?;
    let timeout = match timeout {
        Some(t) => units::parse_duration(t).map_err(|e| anyhow::anyhow!("--timeout: {e}"))?,
        None => profile.limits.timeout,
    };
    if let Some(m) = memory {
        profile.limits.memory_bytes =
            units::parse_size(m).map_err(|e| anyhow::anyhow!("--memory: {e}"))?;
    }
    let inherit_stdio = if json {
        None
    } else {
        let dup = |fd: std::os::fd::BorrowedFd<'_>| fd.try_clone_to_owned();
        let stdio: [OwnedFd; 3] = [
            dup(std::io::stdin().as_fd())?,
            dup(std::io::stdout().as_fd())?,
            dup(std::io::stderr().as_fd())?,
        ];
        Some(stdio)
    };
    let (runtime, supervisor) = one_shot.started()?;
    let supervisor = Arc::new(supervisor);
    let result = runtime.block_on(async {
        let run = SandboxRun {
            call_id: random_call_id(),
            tool: "exec".into(),
            profile: Arc::new(profile),
            argv: command,
            stdin: Vec::new(),
            arguments_json: "{}".into(),
            timeout,
            inherit_stdio,
            builtin: None,
        };
        let result = supervisor.run(run, None).await;
        // The worker is reaped and its cgroup removed off the critical path: wait for it.
        supervisor.close().await;
        anyhow::Ok(result)
    })?;
    leave_behind(runtime, supervisor);
    if json {
        write_stdout(&format!("{}\n", serde_json::to_string_pretty(&result)?))?;
    } else if let Some(error) = result
        .error
        .as_ref()
        .filter(|e| e.kind != ErrorKind::ToolFailed || result.exit_code.is_none())
    {
        eprintln!(
            "airlock: {}: {}",
            serde_json::to_string(&error.kind)?.trim_matches('"'),
            error.message
        );
    }
    Ok(ExitCode::from(exec_exit_code(&result)))
}

/// What `airlock run` was asked to do, besides the call itself.
struct RunFlags {
    call_id: Option<String>,
    one_shot: OneShot,
    dry_run: bool,
    plan_mode: bool,
    session: Option<String>,
    audit: Option<PathBuf>,
}

fn run_tool(
    policy: CompiledPolicy,
    tool: String,
    input: &str,
    flags: RunFlags,
) -> anyhow::Result<ExitCode> {
    let arguments = input::arguments(input)?;
    let call = ToolCall {
        call_id: flags.call_id.unwrap_or_else(random_call_id),
        tool,
        arguments,
    };
    let options = CallOptions {
        session: flags.session,
        plan_mode: flags.plan_mode,
        ..CallOptions::default()
    };
    let audit = open_audit(flags.audit.as_ref())?;
    let (runtime, supervisor) = flags.one_shot.started()?;
    let supervisor = Arc::new(supervisor);
    let outcome = runtime.block_on(async {
        let mut gate = Gate::new(Arc::clone(&supervisor), policy);
        if let Some(audit) = audit {
            gate = gate.with_audit(audit);
        }
        if flags.dry_run {
            return anyhow::Ok(match gate.dry_run(&call, &options) {
                Ok(plan) => (serde_json::to_string_pretty(&plan)?, true),
                Err(result) => (serde_json::to_string_pretty(&result)?, false),
            });
        }
        let result = gate.call(&call, &options).await;
        supervisor.close().await;
        anyhow::Ok((serde_json::to_string_pretty(&result)?, result.ok))
    })?;
    leave_behind(runtime, supervisor);
    write_stdout(&format!("{}\n", outcome.0))?;
    Ok(if outcome.1 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Settings of `airlock serve`.
#[derive(Debug)]
struct ServeFlags {
    policy: PathBuf,
    audit: Option<PathBuf>,
    config: airlock::daemon::DaemonConfig,
    sandbox_uid: Option<u32>,
    /// `None`: no pool.
    pool: Option<PoolSize>,
    landlock_audit: bool,
}

fn open_audit(path: Option<&PathBuf>) -> anyhow::Result<Option<AuditSink>> {
    Ok(match path {
        None => None,
        Some(path) if path.as_os_str() == "-" => {
            Some(AuditSink::to_writer(Box::new(std::io::stderr())))
        }
        Some(path) => Some(
            AuditSink::open_file(path)
                .map_err(|e| anyhow::anyhow!("cannot open audit file {}: {e}", path.display()))?,
        ),
    })
}

fn run_serve(mut flags: ServeFlags) -> anyhow::Result<ExitCode> {
    trust::trusted_policy(&flags.policy)?;
    let loaded = load_policy(Some(&flags.policy), None, presets::DEFAULT_PRESET)?;
    for warning in &loaded.warnings {
        eprintln!("{warning}");
    }
    let audit = open_audit(flags.audit.as_ref())?;
    let runtime = runtime()?;
    runtime.block_on(async move {
        let supervisor = Arc::new(Supervisor::start(SupervisorOptions {
            sandbox_host_id: flags.sandbox_uid,
            landlock_audit: flags.landlock_audit,
            ..supervisor_options()
        })?);
        if let Some(size) = flags.pool {
            // Warm every profile some tool uses; each call still gets a fresh worker.
            supervisor
                .warm_exactly(&airlock::pool::profiles_to_pool(&loaded.policy), size)
                .await;
        }
        // The daemon counts the pools' descriptors against its open-file limit, for
        // this policy and each one reloaded.
        flags.config.pool = flags.pool;
        // Pending approvals keep their arguments for as long as they live, and any client
        // may propose: they get a budget of their own, as large as the requests'.
        let mut gate = Gate::new(Arc::clone(&supervisor), loaded.policy)
            .with_max_approval_bytes(flags.config.max_input_bytes);
        if let Some(audit) = audit {
            gate = gate.with_audit(audit);
        }
        // Session workspaces live beside the socket, one state directory per daemon.
        let mut state_dir = flags.config.socket.clone().into_os_string();
        state_dir.push(".sessions");
        // Sessions' pooled workers count against the pool's bound: at most --pool-max of
        // them, over all sessions (none without a pool).
        let session_workers = flags.pool.map_or(0, |size| size.max_idle());
        match airlock::Sessions::new(state_dir.as_ref(), supervisor.sandbox_ids(), Arc::new(airlock::gate::SystemClock)) {
            Ok(sessions) => {
                let sessions = sessions.keep_workers(Arc::clone(&supervisor), session_workers);
                gate = gate.with_sessions(Arc::new(sessions));
            }
            Err(e) => tracing::error!(error = %e, "session workspaces unavailable; session ops will be refused"),
        }
        let gate = Arc::new(gate);
        let stop = airlock::CancelSignal::new();
        let (signals, _reloads) =
            reload::watch_signals(&flags.policy, &gate, &supervisor, flags.pool, &stop)?;
        airlock::daemon::serve(gate, flags.config, stop).await?;
        signals.abort();
        supervisor.close().await;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Logs go to stderr, filtered by RUST_LOG (default: warnings only), as text or JSON lines.
fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // No colour codes inside JSON strings, whatever stderr is.
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
}

fn main() -> ExitCode {
    // The worker entry hook: the sealed image of this binary is exec'd with this argument
    // inside fresh namespaces. It must run before anything starts a thread.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(airlock_worker::WORKER_ARG) {
        let code = airlock_worker::worker_main(&args[2..]);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // `airlock selftest` runs this binary inside its sandboxes as the hostile program.
    if args.get(1).map(String::as_str) == Some(selftest::PROBE_ARG) {
        let code = airlock_battery::probe::main(&args[2..]);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let cli = match args::parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    // The long-lived commands keep musl's allocator, which returns memory after a burst.
    if !matches!(
        cli.command,
        Command::Serve { .. } | Command::Mcp(_) | Command::Bench(_)
    ) {
        sys::heap::switch_for_short_lived_command();
    }
    init_logs(cli.log_format);
    let result = match cli.command {
        Command::Check { files, json } => run_check(&files, json),
        Command::Exec {
            policy,
            preset,
            profile,
            timeout,
            memory,
            json,
            diagnose,
            landlock_audit,
            sandbox_uid,
            command,
        } => OneShot::start(sandbox_uid, landlock_audit).and_then(|one_shot| {
            let mut loaded =
                load_policy(policy.as_ref(), preset.as_deref(), presets::DEFAULT_PRESET)?;
            if diagnose {
                let observing =
                    learn::observing_profile(policy.as_ref(), preset.as_deref(), &profile)?;
                loaded
                    .policy
                    .profiles
                    .insert(profile.clone(), Arc::new(observing));
            }
            run_exec(
                &loaded.policy,
                &profile,
                timeout.as_deref(),
                memory.as_deref(),
                json,
                one_shot,
                command,
            )
        }),
        Command::Run {
            tool,
            input,
            call_id,
            dry_run,
            plan_mode,
            session,
            socket: Some(socket),
            ..
        } => input::arguments(&input)
            .map_err(anyhow::Error::from)
            .and_then(|arguments_json| {
                let call = remote::RemoteCall {
                    tool,
                    arguments_json,
                    call_id,
                    session,
                    plan_mode,
                    dry_run,
                };
                remote::run_remote(&socket, call)
            }),
        Command::Run {
            policy,
            preset,
            tool,
            input,
            call_id,
            sandbox_uid,
            dry_run,
            plan_mode,
            session,
            audit,
            landlock_audit,
            socket: None,
        } => OneShot::start(sandbox_uid, landlock_audit).and_then(|one_shot| {
            let flags = RunFlags {
                call_id,
                one_shot,
                dry_run,
                plan_mode,
                session,
                audit,
            };
            let loaded = load_policy(policy.as_ref(), preset.as_deref(), "examples")?;
            run_tool(loaded.policy, tool, &input, flags)
        }),
        Command::Schema { daemon } => write_stdout(if daemon {
            airlock::daemon::PROTOCOL_SCHEMA
        } else {
            presets::POLICY_FILE_SCHEMA
        })
        .map(|()| ExitCode::SUCCESS),
        Command::Preset { name: None } => {
            let names: String = presets::PRESETS
                .iter()
                .map(|(n, _)| format!("{n}\n"))
                .collect();
            write_stdout(&names).map(|()| ExitCode::SUCCESS)
        }
        Command::Preset { name: Some(name) } => match presets::preset_text(&name) {
            Some(text) => write_stdout(text).map(|()| ExitCode::SUCCESS),
            None => Err(anyhow::anyhow!(
                "no preset named {name:?}; see `airlock preset`"
            )),
        },
        Command::Serve {
            policy,
            socket,
            metrics,
            metrics_allow_remote,
            socket_mode,
            socket_group,
            audit,
            allow_uids,
            allow_gids,
            approver_uids,
            approver_gids,
            max_concurrent,
            max_queued,
            grace,
            limits,
            sandbox_uid,
            pool,
            pool_max,
            landlock_audit,
        } => units::parse_duration(&grace)
            .map_err(|e| anyhow::anyhow!("--grace: {e}"))
            .and_then(|grace| {
                // Default 4 × --pool within the limit; a --pool beyond it is refused below.
                let max = pool_max.unwrap_or(pool.saturating_mul(4).min(PoolSize::LIMIT).max(pool));
                let pool = (max > 0)
                    .then(|| PoolSize::between(pool, max, PoolSize::DEFAULT_SHRINK_AFTER))
                    .transpose()
                    .map_err(|e| anyhow::anyhow!("--pool/--pool-max: {e}"))?;
                let mut config = airlock::daemon::DaemonConfig::new(socket);
                config.socket_mode = socket_mode_of(&socket_mode)?;
                config.socket_group = socket_group.as_deref().map(group_of).transpose()?;
                config.allow_uids = allow_uids;
                config.allow_gids = allow_gids;
                config.approver_uids = approver_uids;
                config.approver_gids = approver_gids;
                config.metrics = metrics
                    .as_deref()
                    .map(|text| metrics_listen(text, metrics_allow_remote))
                    .transpose()?;
                // Before the pools warm: a refused address is said at once.
                if let Some(listen) = &config.metrics {
                    listen.check()?;
                }
                if max_concurrent == 0 {
                    // The daemon would run one at a time: say so rather than differ.
                    anyhow::bail!("--max-concurrent (or AIRLOCK_MAX_CONCURRENT): at least 1");
                }
                config.max_concurrent = max_concurrent;
                config.max_queued = max_queued;
                config.grace = grace;
                limits.apply(&mut config)?;
                run_serve(ServeFlags {
                    policy,
                    audit,
                    config,
                    sandbox_uid,
                    pool,
                    landlock_audit,
                })
            }),
        Command::Health {
            socket,
            live,
            timeout,
        } => units::parse_duration(&timeout)
            .map_err(|e| anyhow::anyhow!("--timeout: {e}"))
            .map(|timeout| health::run_health(&socket, live, timeout)),
        Command::Mcp(args) => mcp::run_mcp(&args),
        Command::Doctor(args) => doctor::run_doctor(&args),
        Command::Bench(args) => bench::run_bench(&args),
        Command::Explain(args) => Ok(explain::run_explain(&args)),
        Command::Learn(args) => Ok(learn::run_learn(&args)),
        Command::Selftest(args) => selftest::run_selftest(&args),
        Command::Completions { shell } => manual::completions(shell),
        Command::Man { subcommand } => manual::man_page(subcommand.as_deref()),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("airlock: error: {error:#}");
            ExitCode::from(125)
        }
    }
}
