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
    #[arg(long, env = "AIRLOCK_POLICY")]
    policy: PathBuf,
    /// Append audit records (JSON lines) to this file; `-` for stderr.
    #[arg(long, env = "AIRLOCK_AUDIT")]
    audit: Option<PathBuf>,
    /// Calls running at once.
    #[arg(long, default_value_t = 8, env = "AIRLOCK_MAX_CONCURRENT")]
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
    /// List Landlock's refusals in each result's `denials`, read from the kernel's audit
    /// (root, Landlock ABI 7, audit enabled; logs one audit record per call).
    #[arg(long, env = "AIRLOCK_LANDLOCK_AUDIT")]
    landlock_audit: bool,
}

pub(crate) fn run_mcp(args: &McpArgs) -> anyhow::Result<ExitCode> {
    crate::trust::trusted_policy(&args.policy)?;
    let loaded = crate::load_policy(Some(&args.policy), None, presets::DEFAULT_PRESET)?;
    for warning in &loaded.warnings {
        eprintln!("{warning}");
    }
    if args.max_concurrent == 0 {
        anyhow::bail!("--max-concurrent (or AIRLOCK_MAX_CONCURRENT): at least 1");
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
        let supervisor = Arc::new(Supervisor::start(SupervisorOptions {
            sandbox_host_id: args.sandbox_uid,
            landlock_audit: args.landlock_audit,
            ..crate::supervisor_options()
        })?);
        if let Some(size) = pool {
            supervisor
                .warm_exactly(&airlock::pool::profiles_to_pool(&loaded.policy), size)
                .await;
        }
        let mut gate = Gate::new(Arc::clone(&supervisor), loaded.policy);
        if let Some(audit) = audit {
            gate = gate.with_audit(audit);
        }
        let gate = Arc::new(gate);
        let stop = CancelSignal::new();
        let (signals, reloads) =
            crate::reload::watch_signals(&args.policy, &gate, &supervisor, pool, &stop)?;
        tracing::info!(policy = %args.policy.display(), "airlock MCP server on stdio");
        let (input, output) = stdio();
        // On a worker thread, as the daemon's connections are: run by `block_on`, the
        // server would be woken on this thread from a worker's event loop for every message
        // (a futex wake and a thread switch each way).
        let served = tokio::spawn(airlock::mcp::serve(
            gate, config, input, output, reloads, stop,
        ))
        .await
        .unwrap_or_else(|e| Err(airlock::mcp::McpError::Task(e.to_string())));
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

type Input = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
type Output = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;

/// Standard input and output for the protocol, read and written by the runtime's own event
/// loop when they are pipes or sockets (what MCP clients give their servers): tokio's
/// `stdin`/`stdout` hand every read and write to a blocking thread and back, which cost each
/// call two thread wake-ups. Anything else (a file, a terminal) falls back to those.
fn stdio() -> (Input, Output) {
    use std::os::fd::AsFd;
    let input = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| event_driven(fd, Direction::Read));
    let output = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| event_driven(fd, Direction::Write));
    let input = match input {
        Some(Stream::Pipe(Pipe::Read(pipe))) => Box::new(pipe) as Input,
        Some(Stream::Socket(socket)) => Box::new(socket),
        _ => Box::new(tokio::io::stdin()),
    };
    let output = match output {
        Some(Stream::Pipe(Pipe::Write(pipe))) => Box::new(pipe) as Output,
        Some(Stream::Socket(socket)) => Box::new(socket),
        _ => Box::new(tokio::io::stdout()),
    };
    (input, output)
}

#[derive(Clone, Copy)]
enum Direction {
    Read,
    Write,
}

enum Pipe {
    Read(tokio::net::unix::pipe::Receiver),
    Write(tokio::net::unix::pipe::Sender),
}

enum Stream {
    Pipe(Pipe),
    Socket(tokio::net::UnixStream),
}

/// `fd` registered with the event loop, if it is a pipe or a unix socket.
fn event_driven(fd: std::os::fd::OwnedFd, direction: Direction) -> Option<Stream> {
    use std::os::unix::fs::FileTypeExt;
    let kind = std::fs::File::from(fd.try_clone().ok()?)
        .metadata()
        .ok()?
        .file_type();
    if kind.is_fifo() {
        let pipe = match direction {
            Direction::Read => {
                Pipe::Read(tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok()?)
            }
            Direction::Write => {
                Pipe::Write(tokio::net::unix::pipe::Sender::from_owned_fd(fd).ok()?)
            }
        };
        Some(Stream::Pipe(pipe))
    } else if kind.is_socket() {
        let socket = std::os::unix::net::UnixStream::from(fd);
        socket.set_nonblocking(true).ok()?;
        tokio::net::UnixStream::from_std(socket)
            .ok()
            .map(Stream::Socket)
    } else {
        None
    }
}
