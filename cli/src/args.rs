//! The command line: every subcommand and flag, as clap derives them. The parser, the shell
//! completions and the man page all come from these definitions, so they cannot disagree.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use airlock_policy::units;
use clap::{Parser, Subcommand, ValueEnum};

use crate::{bench, doctor, explain, learn, mcp, selftest};

/// What `airlock serve` holds for its clients, at most, summed over all of them.
#[derive(Debug, clap::Args)]
pub(crate) struct ClientLimits {
    /// Client connections open at once; more are answered `overloaded` and closed.
    #[arg(long, default_value_t = 128)]
    max_connections: usize,
    /// Bytes of unfinished request lines and of admitted calls' arguments.
    #[arg(long, default_value = "16MiB")]
    max_input: String,
    /// Bytes of answers not yet taken by their clients.
    #[arg(long, default_value = "16MiB")]
    max_output: String,
    /// A client that has not taken an answer whole this long after it was ready is
    /// disconnected and its calls cancelled.
    #[arg(long, default_value = "10s")]
    write_timeout: String,
    /// A request must arrive whole within this long of its first byte; one that does not
    /// is answered and dropped.
    #[arg(long, default_value = "10s")]
    read_timeout: String,
}

impl ClientLimits {
    pub(crate) fn apply(&self, config: &mut airlock::daemon::DaemonConfig) -> anyhow::Result<()> {
        let size = |flag: &str, text: &str| {
            units::parse_size(text)
                .map_err(|e| anyhow::anyhow!("{flag}: {e}"))
                .and_then(|bytes| {
                    usize::try_from(bytes).map_err(|_| anyhow::anyhow!("{flag}: too large"))
                })
        };
        if self.max_connections == 0 {
            anyhow::bail!("--max-connections: at least 1");
        }
        config.max_connections = self.max_connections;
        config.max_input_bytes = size("--max-input", &self.max_input)?;
        config.max_output_bytes = size("--max-output", &self.max_output)?;
        config.write_timeout = units::parse_duration(&self.write_timeout)
            .map_err(|e| anyhow::anyhow!("--write-timeout: {e}"))?;
        config.read_timeout = units::parse_duration(&self.read_timeout)
            .map_err(|e| anyhow::anyhow!("--read-timeout: {e}"))?;
        Ok(())
    }
}

/// airlock: a sandbox driver and supervisor for AI agents' tool calls.
#[derive(Debug, Parser)]
#[command(name = "airlock", version, about)]
pub(crate) struct Cli {
    /// Log lines on stderr as `text` for people or `json` (one object a line) for log
    /// shippers; RUST_LOG selects which (default: warnings).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

/// The shells `airlock completions` writes scripts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CompletionShell {
    /// Bash.
    Bash,
    /// Zsh.
    Zsh,
    /// Fish.
    Fish,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Validate policy files: exit 0 when valid (warnings on stderr), 1 with diagnostics.
    Check {
        /// Policy files to check.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print diagnostics as one JSON document on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of the policy file format (for editors), or with --daemon
    /// that of the daemon's requests and answers.
    Schema {
        /// The daemon protocol's schema instead of the policy file's.
        #[arg(long)]
        daemon: bool,
    },
    /// Run a command in a sandbox profile; stdio passes through, its exit code is ours.
    ///
    /// Exit codes: the command's own; 128+N if it died of signal N; 124 timeout; 125 sandbox
    /// set-up failure or bad usage; 126 cannot execute; 127 not found; 120 out of memory;
    /// 121 process limit; 122 seccomp violation; 123 protocol violation or cancelled.
    Exec {
        /// Policy file (default: the embedded default policy).
        #[arg(long, conflicts_with = "preset")]
        policy: Option<PathBuf>,
        /// Embedded preset to use instead of a file.
        #[arg(long)]
        preset: Option<String>,
        /// Profile name.
        #[arg(long, default_value = "default")]
        profile: String,
        /// Override the profile's deadline (e.g. 10s).
        #[arg(long)]
        timeout: Option<String>,
        /// Override the profile's memory limit (e.g. 128MiB).
        #[arg(long)]
        memory: Option<String>,
        /// Capture output and print the result record as JSON.
        #[arg(long)]
        json: bool,
        /// Diagnose the run: list in `denials` too each path the command named that the
        /// sandbox lacks (while the host has it) or holds read-only, and each connection its
        /// network cannot make. Slower; never less confined.
        #[arg(long)]
        diagnose: bool,
        /// List Landlock's refusals in the result's `denials`, read from the kernel's audit
        /// (root, Landlock ABI 7, audit enabled; logs one audit record per call). Without
        /// them, `denial_reporting.landlock` says `unavailable`.
        #[arg(long)]
        landlock_audit: bool,
        /// Host uid of the sandbox's root when running as root (default 65534).
        #[arg(long)]
        sandbox_uid: Option<u32>,
        /// The command and its arguments.
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
    /// Run one tool call and print its result record.
    ///
    /// Exit codes: 0 the call succeeded; 1 it did not (the record says why); 125 bad usage
    /// or airlock itself failed (an invalid policy, an unreadable --input).
    Run {
        /// Policy file (default: the embedded `examples` preset).
        #[arg(long, conflicts_with = "preset")]
        policy: Option<PathBuf>,
        /// Embedded preset to use instead of a file.
        #[arg(long)]
        preset: Option<String>,
        /// Tool name.
        #[arg(long)]
        tool: String,
        /// Arguments as JSON text; @FILE reads them from a file, @- from standard input
        /// (at most 1 MiB, the gate's input limit).
        #[arg(long)]
        input: String,
        /// Call id echoed in the result (default: a random one).
        #[arg(long)]
        call_id: Option<String>,
        /// Host uid of the sandbox's root when running as root (default 65534).
        #[arg(long)]
        sandbox_uid: Option<u32>,
        /// Validate and decide, print what would run, execute nothing.
        #[arg(long)]
        dry_run: bool,
        /// Refuse every tool that is not read-only.
        #[arg(long)]
        plan_mode: bool,
        /// Session id (rate limits, audit).
        #[arg(long)]
        session: Option<String>,
        /// Append audit records (JSON lines) to this file; `-` for stderr.
        #[arg(long)]
        audit: Option<PathBuf>,
        /// List Landlock's refusals in the result's `denials`, read from the kernel's audit
        /// (root, Landlock ABI 7, audit enabled; logs one audit record per call). Without
        /// them, `denial_reporting.landlock` says `unavailable`.
        #[arg(long)]
        landlock_audit: bool,
        /// Make the call through the `airlock serve` listening on this socket instead of a
        /// sandbox of this process: the daemon's policy, pooled workers, limits and audit
        /// apply (faster from a shell loop; see docs/daemon.md).
        #[arg(
            long,
            conflicts_with_all = ["policy", "preset", "sandbox_uid", "audit", "landlock_audit"]
        )]
        socket: Option<PathBuf>,
    },
    /// Serve the gate on a Unix socket (JSON lines, or bincode frames for Rust clients).
    ///
    /// SIGTERM/SIGINT: stop accepting, let in-flight calls finish within --grace, kill the
    /// rest, remove the socket. SIGHUP: reload the policy file (an invalid one is refused
    /// and the old one kept; unchanged profiles keep their pooled workers, the others'
    /// are killed and new ones warmed).
    Serve {
        /// Policy file (reloaded on SIGHUP and when its text changes; an invalid one is
        /// refused and the old policy kept).
        #[arg(long, env = "AIRLOCK_POLICY")]
        policy: PathBuf,
        /// Socket path (created with --socket-mode, default 0600).
        #[arg(long, env = "AIRLOCK_SOCKET")]
        socket: PathBuf,
        /// Serve Prometheus metrics (`GET /metrics`) on this TCP address, such as
        /// 127.0.0.1:9464. Loopback only, unless --metrics-allow-remote.
        #[arg(long, env = "AIRLOCK_METRICS")]
        metrics: Option<String>,
        /// Let --metrics listen on an address other hosts reach. The metrics have no
        /// authentication: whoever reaches the port sees the tool names and the traffic.
        #[arg(long, requires = "metrics")]
        metrics_allow_remote: bool,
        /// The socket's mode, octal: 0600 (only this uid reaches it) or 0660 (with
        /// --socket-group, so an --allow-gid group can connect). Wider is refused.
        #[arg(long, default_value = "0600")]
        socket_mode: String,
        /// The socket's group (a name or a gid).
        #[arg(long)]
        socket_group: Option<String>,
        /// Append audit records (JSON lines) to this file; `-` for stderr.
        #[arg(long, env = "AIRLOCK_AUDIT")]
        audit: Option<PathBuf>,
        /// Also allow peers with this uid (our own uid is always allowed).
        #[arg(long = "allow-uid")]
        allow_uids: Vec<u32>,
        /// Also allow peers with this gid.
        #[arg(long = "allow-gid")]
        allow_gids: Vec<u32>,
        /// Only peers with this uid (or an --approver-gid) may execute and reject approvals
        /// and set tools' states; without either, every allowed peer may.
        #[arg(long = "approver-uid")]
        approver_uids: Vec<u32>,
        /// See --approver-uid.
        #[arg(long = "approver-gid")]
        approver_gids: Vec<u32>,
        /// Calls running at once.
        #[arg(long, default_value_t = 8, env = "AIRLOCK_MAX_CONCURRENT")]
        max_concurrent: usize,
        /// Calls waiting for a slot before new ones get `overloaded`.
        #[arg(long, default_value_t = 64)]
        max_queued: usize,
        /// Time in-flight calls get to finish after SIGTERM.
        #[arg(long, default_value = "10s")]
        grace: String,
        #[command(flatten)]
        // Boxed: the Serve variant is the largest of Command by far.
        limits: Box<ClientLimits>,
        /// Host uid of the sandbox's root when running as root (default 65534).
        #[arg(long)]
        sandbox_uid: Option<u32>,
        /// Pre-confined idle workers kept per profile at rest (0 with no --pool-max
        /// disables the pool).
        #[arg(long, default_value_t = 2)]
        pool: usize,
        /// The most idle workers a profile's pool grows to while calls find it empty
        /// (default 4 × --pool); it halves back towards --pool after 10 s without one.
        #[arg(long)]
        pool_max: Option<usize>,
        /// List Landlock's refusals in each result's `denials`, read from the kernel's
        /// audit (root, Landlock ABI 7, audit enabled; logs one audit record per call).
        /// Where the host cannot, the daemon says why at start and results say
        /// `denial_reporting.landlock: unavailable`.
        #[arg(long, env = "AIRLOCK_LANDLOCK_AUDIT")]
        landlock_audit: bool,
    },
    /// Probe a running `airlock serve`: exit 0 when it answers and is ready (policy loaded,
    /// pools warm), 1 otherwise with the reason on stderr.
    Health {
        /// The daemon's socket.
        #[arg(long, env = "AIRLOCK_SOCKET")]
        socket: PathBuf,
        /// Liveness only: exit 0 when the daemon answers at all, ready or not.
        #[arg(long)]
        live: bool,
        /// How long to wait for the answer.
        #[arg(long, default_value = "5s")]
        timeout: String,
    },
    /// Serve the gate to one MCP client over stdin and stdout (JSON-RPC lines): the active
    /// tools with the schemas the gate enforces, every call through the gate and a sandbox.
    ///
    /// SIGHUP reloads the policy (and announces a changed tool list); SIGTERM/SIGINT or the
    /// end of stdin cancels the calls in flight and exits. See docs/mcp.md.
    Mcp(mcp::McpArgs),
    /// Measure start-up latency, throughput, kill latency and memory against a bare
    /// fork+exec and bubblewrap, interleaved in one run.
    Bench(bench::BenchArgs),
    /// Print an embedded preset policy (`default`, `examples`).
    Preset {
        /// Preset name; omit to list them.
        name: Option<String>,
    },
    /// Check the kernel features sandboxes need and run one in the default profile; exit 0
    /// only if it works.
    Doctor(doctor::DoctorArgs),
    /// Explain the effective sandbox of a tool or profile in plain words.
    Explain(explain::ExplainArgs),
    /// Run a command once, watched, and write the profile that is just enough for it (or,
    /// with --policy, what its profile would need added, with the evidence for each line).
    Learn(learn::LearnArgs),
    /// Run the escape battery on this host with this build; exit 0 only if every attack is
    /// stopped the expected way.
    Selftest(selftest::SelftestArgs),
    /// Print a completion script for bash, zsh or fish (e.g. `airlock completions bash >
    /// /etc/bash_completion.d/airlock`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: CompletionShell,
    },
    /// Print a man page (roff) on stdout: airlock(1), or with a subcommand's name that
    /// subcommand's page (e.g. `airlock man exec | man -l -`).
    Man {
        /// A subcommand; omit for the page of airlock itself.
        subcommand: Option<String>,
    },
}

/// Parses the command line, or prints why it cannot and gives the exit status: `exec` and
/// `run` keep their low statuses for the command's or the call's own outcome and document
/// 125 for bad usage, so their usage errors exit 125; the other subcommands keep clap's 2.
/// `--help` and `--version` print on stdout and exit 0.
pub(crate) fn parse() -> Result<Cli, ExitCode> {
    let args: Vec<OsString> = std::env::args_os().collect();
    match Cli::try_parse_from(&args) {
        Ok(cli) => Ok(cli),
        Err(error) => {
            // Nothing left to tell if stderr itself is gone.
            let _ = error.print();
            if let Some(variable) = blamed_variable(&error, &args) {
                eprintln!("note: that value came from the environment variable {variable}");
            }
            let code = if error.use_stderr() && matches!(subcommand_of(&args), Some("exec" | "run"))
            {
                125
            } else {
                error.exit_code()
            };
            Err(ExitCode::from(u8::try_from(code).unwrap_or(2)))
        }
    }
}

/// The environment variable a refused value came from, if it did (clap's message names
/// only the flag, which the command line may not hold at all).
fn blamed_variable(error: &clap::Error, args: &[OsString]) -> Option<String> {
    use clap::CommandFactory;
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(refused)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    let command = Cli::command();
    let on_command_line = |long: &str| {
        let flag = format!("--{long}");
        args.iter()
            .filter_map(|a| a.to_str())
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    command
        .get_subcommands()
        .flat_map(clap::Command::get_arguments)
        .filter_map(|arg| Some((arg.get_long()?, arg.get_env()?)))
        .find(|(long, variable)| {
            refused.split(' ').next() == Some(&format!("--{long}"))
                && std::env::var_os(variable).is_some()
                && !on_command_line(long)
        })
        .map(|(_, variable)| variable.to_string_lossy().into_owned())
}

/// The subcommand named on a command line that clap refused: the first word that is not a
/// flag (or the value of the global `--log-format`).
fn subcommand_of(args: &[OsString]) -> Option<&str> {
    let mut words = args.iter().skip(1).filter_map(|a| a.to_str());
    while let Some(word) = words.next() {
        if word == "--log-format" {
            words.next();
        } else if !word.starts_with('-') {
            return Some(word);
        }
    }
    None
}
