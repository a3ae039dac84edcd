//! Backends a gateway can plug in: the [`Sandbox`] trait, implemented by the airlock
//! [`Gate`] and by [`UnsafeLocal`] — a separate, explicitly named backend that runs command
//! tools directly on the host and marks every result as unisolated. There is no silent
//! fallback from one to the other.

use std::future::Future;
use std::pin::Pin;
use std::process::Stdio;
use std::time::Instant;

use airlock_policy::CompiledPolicy;
use airlock_policy::rules::{Decision, decide};
use airlock_policy::schema::InputLimits;
use airlock_policy::validate::{Approval, ToolState};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::call::ToolCall;
use crate::gate::{CallOptions, Gate, ToolListing};
use crate::result::{ErrorKind, LandlockLevel, ToolError, ToolResult};
use crate::serial::Lanes;

/// A boxed future returned by [`Sandbox::call`].
pub type CallFuture<'a> = Pin<Box<dyn Future<Output = ToolResult> + Send + 'a>>;

/// What a gateway needs from a sandbox backend.
pub trait Sandbox: Send + Sync {
    /// `airlock` or `unsafe_local`.
    fn backend(&self) -> &'static str;
    /// Every tool with its state and the schemas enforced; offer a model the active ones.
    fn tools(&self) -> Vec<ToolListing>;
    /// Runs one call to its terminal result.
    fn call<'a>(&'a self, call: &'a ToolCall, opts: &'a CallOptions) -> CallFuture<'a>;
}

impl Sandbox for Gate {
    fn backend(&self) -> &'static str {
        "airlock"
    }

    fn tools(&self) -> Vec<ToolListing> {
        Gate::tools(self)
    }

    fn call<'a>(&'a self, call: &'a ToolCall, opts: &'a CallOptions) -> CallFuture<'a> {
        Box::pin(Gate::call(self, call, opts))
    }
}

/// The acknowledgement [`UnsafeLocal::new`] requires, so nobody builds it by accident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acknowledgement {
    /// Tools run as the caller's own user, on the host, with the host's filesystem and
    /// network, and no limit but the deadline and the output bound.
    ToolsRunOnTheHostWithoutIsolation,
}

/// Runs command tools directly on the host. Only for development and trusted tools; every
/// result says `isolation.backend = "unsafe_local"` with no namespaces, Landlock, seccomp or
/// cgroup.
#[derive(Debug)]
pub struct UnsafeLocal {
    policy: CompiledPolicy,
    lanes: Lanes,
}

impl UnsafeLocal {
    /// Builds the backend; the acknowledgement must be spelled out by the caller.
    pub fn new(policy: CompiledPolicy, acknowledgement: Acknowledgement) -> Self {
        let Acknowledgement::ToolsRunOnTheHostWithoutIsolation = acknowledgement;
        tracing::warn!("unsafe_local backend: tool calls run on the host without isolation");
        Self {
            policy,
            lanes: Lanes::default(),
        }
    }

    async fn run(&self, call: &ToolCall, opts: &CallOptions) -> ToolResult {
        let started = Instant::now();
        let reject = |kind, message: String| {
            ToolResult::rejected(&call.call_id, &call.tool, ToolError::new(kind, message))
        };
        let Some(tool) = self.policy.tools.get(&call.tool) else {
            return reject(
                ErrorKind::UnknownTool,
                format!("no tool named {:?}", call.tool),
            );
        };
        if tool.tool.state != ToolState::Active {
            return ToolResult::rejected(
                &call.call_id,
                &call.tool,
                ToolError {
                    state: Some(tool.tool.state),
                    ..ToolError::new(
                        ErrorKind::ToolUnavailable,
                        format!("tool {} is not active", tool.tool.name),
                    )
                },
            );
        }
        if opts.plan_mode && tool.tool.side_effect != airlock_policy::validate::SideEffect::Read {
            return reject(
                ErrorKind::Denied,
                "plan mode allows only read-only tools".into(),
            );
        }
        let input = match tool
            .input
            .check_text(&call.arguments, InputLimits::default())
        {
            Ok(input) => input,
            Err(e) => {
                return ToolResult::rejected(
                    &call.call_id,
                    &call.tool,
                    crate::gate::invalid_input(e),
                );
            }
        };
        // No approval flow here: what would wait for a human is refused, as are denials.
        let verdict = decide(&self.policy.gate, &tool.tool, &input);
        let needs_human =
            verdict.decision == Decision::Review || tool.tool.approval == Approval::Human;
        if verdict.decision == Decision::Deny || needs_human {
            let (kind, message) = if verdict.decision == Decision::Deny {
                (
                    ErrorKind::Denied,
                    format!("denied by rule {}", verdict.rule),
                )
            } else {
                (
                    ErrorKind::ApprovalRequired,
                    "this call needs a human approval, which the unsafe_local backend cannot ask for".to_string(),
                )
            };
            return ToolResult::rejected(
                &call.call_id,
                &call.tool,
                ToolError {
                    rule: Some(verdict.rule),
                    ..ToolError::new(kind, message)
                },
            );
        }
        if tool.tool.builtin.is_some() {
            return reject(
                ErrorKind::SandboxUnavailable,
                "built-in tools need the airlock backend".into(),
            );
        }
        let argv = match tool.render_argv(&input) {
            Ok(argv) => argv,
            Err(e) => return reject(ErrorKind::InvalidInput, e.to_string()),
        };
        let Some(profile) = self.policy.profiles.get(&tool.tool.profile) else {
            return reject(
                ErrorKind::SandboxUnavailable,
                "the tool's profile is missing".into(),
            );
        };
        // As in the gate: a tool that is not concurrency_safe runs one call at a time per
        // session, for at most its deadline.
        let _turn = match self
            .lanes
            .turn_for(
                &tool.tool,
                opts.session.as_deref(),
                opts.cancel.as_ref(),
                tool.tool.timeout,
            )
            .await
        {
            Ok(turn) => turn,
            Err(error) => return ToolResult::rejected(&call.call_id, &call.tool, error),
        };
        let limit = usize::try_from(profile.limits.output_bytes).unwrap_or(usize::MAX);
        let mut command = tokio::process::Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .env_clear()
            .envs(profile.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                return reject(
                    ErrorKind::ToolFailed,
                    format!("cannot execute {}: {e}", argv[0]),
                );
            }
        };
        let stdin_bytes = tool.render_stdin(&input);
        let mut stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let work = async {
            if let Some(mut pipe) = stdin.take() {
                let _ = pipe.write_all(&stdin_bytes).await;
            }
            let (out, err, status) = tokio::join!(
                read_bounded(stdout, limit),
                read_bounded(stderr, limit),
                child.wait()
            );
            (out, err, status)
        };
        let cancelled = async {
            match &opts.cancel {
                Some(signal) => signal.cancelled().await,
                None => std::future::pending().await,
            }
        };
        let outcome = tokio::select! {
            done = tokio::time::timeout(tool.tool.timeout, work) => done.ok(),
            () = cancelled => None,
        };
        let mut result = ToolResult::rejected(
            &call.call_id,
            &call.tool,
            ToolError::new(
                ErrorKind::Timeout,
                "deadline passed; the process was killed",
            ),
        );
        result.attempts = 1;
        let isolation = result.isolation_mut();
        isolation.backend = "unsafe_local".into();
        isolation.landlock = LandlockLevel::None;
        if let Some(((stdout, stdout_truncated), (stderr, stderr_truncated), status)) = outcome {
            result.stdout = String::from_utf8_lossy(&stdout).into_owned();
            result.stderr = String::from_utf8_lossy(&stderr).into_owned();
            result.stdout_truncated = stdout_truncated;
            result.stderr_truncated = stderr_truncated;
            use std::os::unix::process::ExitStatusExt;
            match status {
                Ok(status) if status.success() => {
                    result.error = None;
                    result.exit_code = Some(0);
                }
                Ok(status) => {
                    result.exit_code = status.code();
                    result.signal = status.signal();
                    result.error = Some(ToolError::new(
                        ErrorKind::ToolFailed,
                        format!("the tool exited with {status}"),
                    ));
                }
                Err(e) => result.error = Some(ToolError::new(ErrorKind::ToolFailed, e.to_string())),
            }
        } else if opts.cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
            result.error = Some(ToolError::new(
                ErrorKind::Cancelled,
                "cancelled by the caller",
            ));
        }
        result.ok = result.error.is_none();
        result.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        crate::call::check_output(tool, &mut result);
        result
    }
}

/// Reads a whole stream, keeping at most `limit` bytes (the rest is drained, so a flooding
/// tool never blocks on a full pipe).
async fn read_bounded<R: AsyncRead + Unpin>(stream: Option<R>, limit: usize) -> (Vec<u8>, bool) {
    let Some(mut stream) = stream else {
        return (Vec::new(), false);
    };
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = limit.saturating_sub(kept.len());
                kept.extend_from_slice(&chunk[..n.min(room)]);
                truncated |= n > room;
            }
        }
    }
    (kept, truncated)
}

impl Sandbox for UnsafeLocal {
    fn backend(&self) -> &'static str {
        "unsafe_local"
    }

    fn tools(&self) -> Vec<ToolListing> {
        self.policy
            .tools
            .values()
            .map(|t| ToolListing::of(t, t.tool.state))
            .collect()
    }

    fn call<'a>(&'a self, call: &'a ToolCall, opts: &'a CallOptions) -> CallFuture<'a> {
        Box::pin(self.run(call, opts))
    }
}
