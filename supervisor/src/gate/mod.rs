//! The tool gate: every call goes validate → decide → `tool.called` → run (deadline and
//! cancellation inside) → `tool.failed` per failed attempt → retry eligible failures → one
//! terminal result — with plan mode, two-phase approvals, rate limits, run-time tool states,
//! events and the audit log.
// A refused call's `ToolResult` *is* the answer the caller gets, returned once per call;
// boxing it only to shrink the `Err` variant would add an allocation and nothing else.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use airlock_policy::rules::{Decision, Verdict, decide};
use airlock_policy::schema::{InputError, InputLimits};
use airlock_policy::validate::{SideEffect, ToolState};
use airlock_policy::{CompiledPolicy, CompiledProfile, CompiledTool};
use serde_json::Value;
use tokio::sync::broadcast;

pub use crate::approvals::{Approval, canonical_json};
use crate::approvals::{
    ApprovalStore, DigestKey, Pending, Refused, TakeRefused, random_id, tool_version,
};
use crate::audit::{AuditSink, Event, EventKind, sanitize};
use crate::call::ToolCall;
use crate::cancel::CancelSignal;
pub use crate::listing::ToolListing;
use crate::rate::RateState;
use crate::result::{ErrorKind, InputViolation, ToolError, ToolResult};
use crate::sandbox::{SandboxRun, Supervisor};
use crate::serial::Lanes;
use crate::session::{SessionCall, Sessions};
pub use dry_run::DryRun;

mod dry_run;
mod propose;
mod readmit;
mod session_settings;

use crate::heap::json_heap_bytes;

pub use crate::clock::{Clock, SystemClock};

/// Decides approvals synchronously instead of the two-phase flow (library users).
pub trait ApprovalCallback: Send + Sync + std::fmt::Debug {
    /// Returns true to let the call run.
    fn approve(&self, request: &ApprovalRequest<'_>) -> bool;
}

/// What an approval callback sees (no raw arguments beyond what the caller already has).
#[derive(Debug)]
pub struct ApprovalRequest<'a> {
    /// Tool name.
    pub tool: &'a str,
    /// The verdict that asked for review (or `approval = "human"`).
    pub verdict: &'a Verdict,
    /// The argv the call would run.
    pub argv_preview: &'a [String],
    /// Digest of the canonical input.
    pub input_digest: &'a str,
}

/// Per-call options.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// Session id (rate limits, audit).
    pub session: Option<String>,
    /// Refuse every tool that is not read-only.
    pub plan_mode: bool,
    /// Caller cancellation.
    pub cancel: Option<CancelSignal>,
    /// A deadline shorter than the tool's own (a longer one is cut to the tool's).
    pub timeout: Option<std::time::Duration>,
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The gate in front of a [`Supervisor`].
#[derive(Debug)]
pub struct Gate {
    supervisor: Arc<Supervisor>,
    policy: RwLock<Arc<CompiledPolicy>>,
    states: Mutex<HashMap<String, ToolState>>,
    approvals: Mutex<ApprovalStore>,
    /// The secret of input digests; none when the OS had no random source, and then every
    /// call is refused rather than digested guessably.
    digest_key: Option<DigestKey>,
    rates: Mutex<RateState>,
    /// Calls of tools that are not `concurrency_safe`, one at a time per session.
    lanes: Lanes,
    clock: Arc<dyn Clock>,
    callback: Option<Arc<dyn ApprovalCallback>>,
    events: broadcast::Sender<Event>,
    audit: Option<AuditSink>,
    /// Session workspaces; without them a profile with a workspace refuses every call.
    sessions: Option<Arc<Sessions>>,
}

/// The version of `tool` under `policy` (see [`tool_version`]); none when it is gone.
fn current_tool_version(policy: &CompiledPolicy, tool: &str) -> Option<String> {
    let tool = policy.tools.get(tool)?;
    let profile = policy.profiles.get(&tool.tool.profile);
    Some(tool_version(tool, profile.map(AsRef::as_ref)))
}

fn rejected(call: &ToolCall, error: ToolError) -> ToolResult {
    ToolResult::rejected(&call.call_id, &call.tool, error)
}

pub(crate) fn invalid_input(error: InputError) -> ToolError {
    let violations = match &error {
        InputError::Schema { violations, .. } => Some(
            violations
                .iter()
                .map(|v| InputViolation {
                    path: v.path.clone(),
                    keyword: v.keyword.clone(),
                    message: v.message.clone(),
                })
                .collect(),
        ),
        _ => None,
    };
    ToolError {
        violations,
        ..ToolError::new(ErrorKind::InvalidInput, error.to_string())
    }
}

/// A known tool that is not active: its state, so the caller can tell "not yet" from "no".
fn unavailable(tool: &str, state: ToolState) -> ToolError {
    let why = match state {
        ToolState::Deferred => "deferred: not offered yet",
        _ => "suspended: taken out of service",
    };
    ToolError {
        state: Some(state),
        ..ToolError::new(ErrorKind::ToolUnavailable, format!("tool {tool} is {why}"))
    }
}

/// A validated call, ready to decide or run.
/// A call the gate decided may run (see [`Gate::admit`]).
#[derive(Debug)]
pub struct Admitted {
    call: ToolCall,
    prepared: Prepared,
    verdict: Verdict,
}

impl Admitted {
    /// About how many bytes of memory the call's parsed arguments take: a daemon counts
    /// them against its input budget, since they can be many times their text's size.
    pub fn arguments_heap_bytes(&self) -> usize {
        self.call.arguments.capacity() + json_heap_bytes(&self.prepared.input)
    }
}

#[derive(Debug)]
struct Prepared {
    tool: CompiledTool,
    input: Value,
    digest: String,
    argv: Vec<String>,
    policy: Arc<CompiledPolicy>,
}

impl Gate {
    /// A gate over `supervisor` serving `policy`.
    pub fn new(supervisor: Arc<Supervisor>, policy: CompiledPolicy) -> Self {
        Self {
            supervisor,
            policy: RwLock::new(Arc::new(policy)),
            states: Mutex::new(HashMap::new()),
            approvals: Mutex::new(ApprovalStore::default()),
            digest_key: DigestKey::random(),
            rates: Mutex::new(RateState::default()),
            lanes: Lanes::default(),
            clock: Arc::new(SystemClock),
            callback: None,
            events: broadcast::channel(1024).0,
            audit: None,
            sessions: None,
        }
    }

    /// Serves session workspaces from `sessions`.
    pub fn with_sessions(mut self, sessions: Arc<Sessions>) -> Self {
        self.sessions = Some(sessions);
        self
    }

    /// The session workspaces, when served.
    pub fn sessions(&self) -> Option<&Arc<Sessions>> {
        self.sessions.as_ref()
    }

    /// Uses `clock` for approvals and rate limits.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Decides approvals with `callback` instead of the two-phase flow.
    pub fn with_approval_callback(mut self, callback: Arc<dyn ApprovalCallback>) -> Self {
        self.callback = Some(callback);
        self
    }

    /// Keeps at most about `bytes` of memory in pending approvals (their arguments, parsed
    /// and as text); a proposal beyond it is answered `overloaded`.
    pub fn with_max_approval_bytes(self, bytes: usize) -> Self {
        if let Ok(mut store) = self.approvals.lock() {
            store.max_bytes = bytes;
        }
        self
    }

    /// Digests inputs under `key` instead of a random one of its own (digests in audit logs
    /// then stay comparable across restarts).
    pub fn with_digest_key(mut self, key: DigestKey) -> Self {
        self.digest_key = Some(key);
        self
    }

    /// Writes every event to `sink` too.
    pub fn with_audit(mut self, sink: AuditSink) -> Self {
        self.audit = Some(sink);
        self
    }

    /// The supervisor behind the gate.
    pub fn supervisor(&self) -> &Arc<Supervisor> {
        &self.supervisor
    }

    /// Events as they happen (slow receivers miss the oldest).
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// The current policy.
    pub fn policy(&self) -> Arc<CompiledPolicy> {
        match self.policy.read() {
            Ok(p) => Arc::clone(&p),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Replaces the policy atomically. Pending approvals stay valid only where their tool and
    /// its profile are unchanged.
    pub fn reload(&self, policy: CompiledPolicy) {
        let policy = Arc::new(policy);
        match self.policy.write() {
            Ok(mut p) => *p = Arc::clone(&policy),
            Err(poisoned) => *poisoned.into_inner() = Arc::clone(&policy),
        }
        if let Ok(mut store) = self.approvals.lock() {
            store.retain(|approval| {
                current_tool_version(&policy, &approval.tool).as_deref()
                    == Some(approval.tool_version.as_str())
            });
        }
    }

    /// Turns `call` away before it runs with `error`, and says so in the audit log and the
    /// events (`tool.refused`, the error kind as outcome): every refusal is audited, not
    /// only the calls that ran. Denials by a rule have their own `denied` event.
    pub fn refuse(&self, call: &ToolCall, opts: &CallOptions, error: ToolError) -> ToolResult {
        self.refused(opts, rejected(call, error))
    }

    fn refused(&self, opts: &CallOptions, result: ToolResult) -> ToolResult {
        let mut event = Event::new(
            EventKind::Refused,
            &result.call_id,
            opts.session.as_deref(),
            &result.tool,
        );
        event.outcome = result
            .error
            .as_ref()
            .map(|e| crate::audit::outcome_name(e.kind));
        self.emit(event);
        result
    }

    fn emit(&self, event: Event) {
        if let Some(audit) = &self.audit {
            audit.record(&event);
        }
        let _ = self.events.send(event);
    }

    fn state_of(&self, tool: &CompiledTool) -> ToolState {
        self.states
            .lock()
            .ok()
            .and_then(|s| s.get(&tool.tool.name).copied())
            .unwrap_or(tool.tool.state)
    }

    /// Changes a tool's availability at run time; false if there is no such tool.
    pub fn set_state(&self, tool: &str, state: ToolState) -> bool {
        if !self.policy().tools.contains_key(tool) {
            return false;
        }
        if let Ok(mut states) = self.states.lock() {
            states.insert(tool.to_string(), state);
        }
        true
    }

    /// Every tool with its current state and exactly the schemas the gate enforces. Offer a
    /// model the `active` ones; the others answer `tool_unavailable`.
    pub fn tools(&self) -> Vec<ToolListing> {
        self.policy()
            .tools
            .values()
            .map(|t| ToolListing::of(t, self.state_of(t)))
            .collect()
    }

    /// Validation: known active tool, input within limits and schema, argv renders.
    fn prepare(&self, call: &ToolCall, session: Option<&str>) -> Result<Prepared, ToolError> {
        let policy = self.policy();
        let tool = match policy.tools.get(&call.tool) {
            Some(tool) => {
                self.available_in(tool, session)?;
                tool.clone()
            }
            None => {
                return Err(ToolError::new(
                    ErrorKind::UnknownTool,
                    format!("no tool named {:?}", sanitize(&call.tool)),
                ));
            }
        };
        let input = tool
            .input
            .check_text(&call.arguments, InputLimits::default())
            .map_err(invalid_input)?;
        let argv = tool
            .render_argv(&input)
            .map_err(|e| ToolError::new(ErrorKind::InvalidInput, e.to_string()))?;
        let Some(key) = &self.digest_key else {
            return Err(ToolError::new(
                ErrorKind::SandboxUnavailable,
                "the OS random source failed at start: no key to digest inputs with",
            ));
        };
        let digest = key.input_digest(&tool.tool.name, &input);
        Ok(Prepared {
            tool,
            input,
            digest,
            argv,
            policy,
        })
    }

    fn denied(
        &self,
        call: &ToolCall,
        opts: &CallOptions,
        digest: Option<&str>,
        rule: &str,
        message: String,
    ) -> ToolResult {
        let mut event = Event::new(
            EventKind::Denied,
            &call.call_id,
            opts.session.as_deref(),
            &call.tool,
        );
        event.decision = Some(Decision::Deny);
        event.rule = Some(rule.to_string());
        event.input_digest = digest.map(str::to_string);
        self.emit(event);
        rejected(
            call,
            ToolError {
                rule: Some(rule.to_string()),
                ..ToolError::new(ErrorKind::Denied, message)
            },
        )
    }

    /// Plan mode, rules and rate limits; `Ok(verdict)` when the call may proceed (perhaps
    /// pending approval), `Err(result)` when it is refused.
    fn decide(
        &self,
        call: &ToolCall,
        opts: &CallOptions,
        prepared: &Prepared,
    ) -> Result<Verdict, ToolResult> {
        let tool = &prepared.tool.tool;
        self.session_in_force(call, opts)?;
        let (_, plan_mode) =
            self.settings_in(&prepared.tool, opts.session.as_deref(), opts.plan_mode);
        if plan_mode && tool.side_effect != SideEffect::Read {
            return Err(self.denied(
                call,
                opts,
                Some(&prepared.digest),
                "plan_mode",
                format!(
                    "plan mode allows only read-only tools; {} is {:?}",
                    tool.name, tool.side_effect
                )
                .to_lowercase(),
            ));
        }
        let verdict = decide(&prepared.policy.gate, tool, &prepared.input);
        if verdict.decision == Decision::Deny {
            let message = format!("denied by rule {}", verdict.rule);
            return Err(self.denied(call, opts, Some(&prepared.digest), &verdict.rule, message));
        }
        Ok(verdict)
    }

    fn check_rates(
        &self,
        call: &ToolCall,
        opts: &CallOptions,
        prepared: &Prepared,
    ) -> Result<(), ToolResult> {
        let gate = &prepared.policy.gate;
        let now = self.clock.now();
        // A poisoned lock still holds valid buckets: never skip the limits because of it.
        let mut rates = self
            .rates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let is_open = |id: &str| self.sessions.as_ref().is_some_and(|s| s.is_open(id));
        if let (Some(limit), Some(session)) = (gate.session_rate, &opts.session)
            && !rates.take_session(session, limit, now, is_open)
        {
            return Err(rejected(
                call,
                ToolError::new(
                    ErrorKind::RateLimited,
                    format!(
                        "session rate limit of {} calls per {:?} reached",
                        limit.calls, limit.period
                    ),
                ),
            ));
        }
        if let Some(limit) = prepared.tool.tool.rate_limit.or(gate.tool_rate)
            && !rates.take_tool(&prepared.tool.tool.name, limit, now)
        {
            return Err(rejected(
                call,
                ToolError::new(
                    ErrorKind::RateLimited,
                    format!(
                        "rate limit of {} calls per {:?} for {} reached",
                        limit.calls, limit.period, prepared.tool.tool.name
                    ),
                ),
            ));
        }
        Ok(())
    }

    /// Runs one call through the whole gate.
    pub async fn call(&self, call: &ToolCall, opts: &CallOptions) -> ToolResult {
        match self.admit(call, opts) {
            Ok(admitted) => self.run_decided(admitted, opts).await,
            Err(result) => result,
        }
    }

    /// The gate's decision on `call` before anything runs — validation, rules, plan mode,
    /// approval — without taking a rate limit's token or a worker: a daemon asks this first,
    /// so that a call the gate refuses never waits for, or holds, a concurrency slot.
    pub fn admit(&self, call: &ToolCall, opts: &CallOptions) -> Result<Admitted, ToolResult> {
        let prepared = match self.prepare(call, opts.session.as_deref()) {
            Ok(p) => p,
            Err(error) => return Err(self.refuse(call, opts, error)),
        };
        let verdict = self.decide(call, opts, &prepared)?;
        let needs_approval = verdict.decision == Decision::Review
            || prepared.tool.tool.approval == airlock_policy::validate::Approval::Human;
        if needs_approval {
            let rule = if verdict.decision == Decision::Review {
                verdict.rule.clone()
            } else {
                "approval".to_string()
            };
            let approved = self.callback.as_ref().map(|cb| {
                cb.approve(&ApprovalRequest {
                    tool: &call.tool,
                    verdict: &verdict,
                    argv_preview: &prepared.argv,
                    input_digest: &prepared.digest,
                })
            });
            match approved {
                Some(true) => {
                    let mut event = Event::new(
                        EventKind::ApprovalGranted,
                        &call.call_id,
                        opts.session.as_deref(),
                        &call.tool,
                    );
                    event.rule = Some(rule);
                    event.input_digest = Some(prepared.digest.clone());
                    self.emit(event);
                }
                Some(false) => {
                    return Err(self.denied(
                        call,
                        opts,
                        Some(&prepared.digest),
                        "approval_callback",
                        "the approval callback refused the call".into(),
                    ));
                }
                None => {
                    let mut event = Event::new(
                        EventKind::ApprovalRequired,
                        &call.call_id,
                        opts.session.as_deref(),
                        &call.tool,
                    );
                    event.decision = Some(verdict.decision);
                    event.rule = Some(rule.clone());
                    event.input_digest = Some(prepared.digest.clone());
                    self.emit(event);
                    return Err(rejected(
                        call,
                        ToolError {
                            rule: Some(rule),
                            ..ToolError::new(
                                ErrorKind::ApprovalRequired,
                                "this call needs a human approval: propose it, then execute the approval",
                            )
                        },
                    ));
                }
            }
        }
        Ok(Admitted {
            call: call.clone(),
            prepared,
            verdict,
        })
    }

    /// Runs a call [`Gate::admit`] let through, perhaps a while ago (a daemon's call that
    /// waited for a slot): decided again under the policy, tool states and plan mode in
    /// force now, then its rate limits, then the sandbox.
    pub async fn run_admitted(&self, admitted: Admitted, opts: &CallOptions) -> ToolResult {
        match self.readmit(admitted, opts) {
            Ok(admitted) => self.run_decided(admitted, opts).await,
            Err(result) => result,
        }
    }

    /// Runs a call decided just now: its rate limits, then the sandbox.
    async fn run_decided(&self, admitted: Admitted, opts: &CallOptions) -> ToolResult {
        let Admitted {
            call,
            prepared,
            verdict,
        } = admitted;
        let entered = match self.enter_session(&call, opts, &prepared) {
            Ok(entered) => entered,
            Err(result) => return result,
        };
        if let Err(result) = self.check_rates(&call, opts, &prepared) {
            return self.refused(opts, result);
        }
        self.execute_prepared(&call, opts, prepared, verdict, entered)
            .await
    }

    async fn execute_prepared(
        &self,
        call: &ToolCall,
        opts: &CallOptions,
        prepared: Prepared,
        verdict: Verdict,
        (profile, in_session): (Arc<CompiledProfile>, Option<SessionCall>),
    ) -> ToolResult {
        let tool = &prepared.tool;
        let timeout = opts
            .timeout
            .map_or(tool.tool.timeout, |t| t.min(tool.tool.timeout));
        // Held for every attempt: a tool that is not concurrency_safe runs one call at a
        // time per session, and a wait for an earlier call counts against the deadline.
        let turn = match self
            .lanes
            .turn_for(
                &tool.tool,
                opts.session.as_deref(),
                opts.cancel.as_ref(),
                timeout,
            )
            .await
        {
            Ok(turn) => turn,
            Err(error) => return self.refuse(call, opts, error),
        };
        let timeout = timeout.saturating_sub(turn.as_ref().map_or(Duration::ZERO, |t| t.waited));
        let mut called = Event::new(
            EventKind::Called,
            &call.call_id,
            opts.session.as_deref(),
            &call.tool,
        );
        called.decision = Some(verdict.decision);
        called.rule = Some(verdict.rule.clone());
        called.input_digest = Some(prepared.digest.clone());
        if prepared.policy.gate.audit_include_input {
            called.input = Some(sanitize(&prepared.input.to_string()));
        }
        self.emit(called);

        let profile = in_session.as_ref().map_or(&profile, |s| &s.profile);
        let max_attempts = tool.tool.retries.saturating_add(1);
        let mut attempts = 0;
        let started = std::time::Instant::now();
        let result = loop {
            attempts += 1;
            let run = SandboxRun {
                call_id: call.call_id.clone(),
                tool: call.tool.clone(),
                profile: Arc::clone(profile),
                argv: prepared.argv.clone(),
                stdin: tool.render_stdin(&prepared.input),
                arguments_json: prepared.input.to_string(),
                timeout,
                inherit_stdio: None,
                builtin: tool.tool.builtin.map(|b| b.name().to_string()),
            };
            let mut result = crate::egress_audit::run_audited(
                &self.supervisor,
                run,
                opts.cancel.as_ref(),
                opts.session.as_deref(),
                |event| self.emit(event),
            )
            .await;
            result.attempts = attempts;
            if let Some(in_session) = &in_session {
                in_session.finish(&mut result).await;
            }
            crate::call::check_output(tool, &mut result);
            match &result.error {
                Some(error) if error.is_retryable() && attempts < max_attempts => {
                    self.emit(
                        Event::new(
                            EventKind::Failed,
                            &call.call_id,
                            opts.session.as_deref(),
                            &call.tool,
                        )
                        .with_result(&result),
                    );
                }
                _ => break result,
            }
        };
        let mut result = result;
        result.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let kind = if result.ok {
            EventKind::Completed
        } else {
            EventKind::Failed
        };
        let mut event = Event::new(kind, &call.call_id, opts.session.as_deref(), &call.tool)
            .with_result(&result);
        event.input_digest = Some(prepared.digest.clone());
        self.emit(event);
        result
    }

    /// Phase two: consumes the approval atomically (exactly one of several concurrent
    /// executes gets it), re-validates under the current policy, and runs the call.
    pub async fn execute(&self, approval_id: &str, opts: &CallOptions) -> ToolResult {
        let pending = match self.approvals.lock() {
            Ok(mut store) => store.take_for(approval_id, opts.session.as_deref()),
            Err(_) => Err(TakeRefused::Unknown),
        };
        let invalid = |reason: &str| {
            ToolResult::rejected(
                "",
                "",
                ToolError {
                    rule: None,
                    ..ToolError::new(
                        ErrorKind::ApprovalInvalid,
                        format!("approval {}: {reason}", sanitize(approval_id)),
                    )
                },
            )
        };
        let pending = match pending {
            Ok(pending) => pending,
            // The proposer's session is the one the call counts against: an executor
            // cannot move it to a session with budget left.
            Err(TakeRefused::OtherSession) => return invalid("it belongs to another session"),
            Err(TakeRefused::Unknown) => {
                return invalid(
                    "unknown, already used, rejected, or its tool changed in a policy reload",
                );
            }
        };
        let call = ToolCall {
            call_id: pending.call_id.clone(),
            tool: pending.approval.tool.clone(),
            arguments: pending.arguments.clone(),
        };
        let with_ids = |mut r: ToolResult| {
            r.call_id = call.call_id.clone();
            r.tool = call.tool.clone();
            r
        };
        if millis(self.clock.now()) >= pending.approval.expires_at_ms {
            return with_ids(invalid("expired"));
        }
        let policy = self.policy();
        if current_tool_version(&policy, &call.tool).as_deref()
            != Some(pending.approval.tool_version.as_str())
        {
            return with_ids(invalid(
                "the tool or its profile changed since it was proposed",
            ));
        }
        let prepared = match self.prepare(&call, pending.approval.session.as_deref()) {
            Ok(p) => p,
            Err(e) => return self.refuse(&call, opts, e),
        };
        if prepared.digest != pending.approval.input_digest {
            return with_ids(invalid("the input digest does not match"));
        }
        let opts = CallOptions {
            session: pending.approval.session.clone(),
            ..opts.clone()
        };
        let verdict = match self.decide(&call, &opts, &prepared) {
            Ok(v) => v,
            Err(result) => return result,
        };
        let mut event = Event::new(
            EventKind::ApprovalGranted,
            &call.call_id,
            opts.session.as_deref(),
            &call.tool,
        );
        event.approval_id = Some(pending.approval.approval_id.clone());
        event.input_digest = Some(prepared.digest.clone());
        self.emit(event);
        let entered = match self.enter_session(&call, &opts, &prepared) {
            Ok(entered) => entered,
            Err(result) => return result,
        };
        if let Err(result) = self.check_rates(&call, &opts, &prepared) {
            return self.refused(&opts, result);
        }
        self.execute_prepared(&call, &opts, prepared, verdict, entered)
            .await
    }

    /// Deletes a pending approval; says whether it existed.
    pub fn reject(&self, approval_id: &str) -> bool {
        let removed = self
            .approvals
            .lock()
            .ok()
            .and_then(|mut store| store.take(approval_id));
        if let Some(pending) = &removed {
            let mut event = Event::new(
                EventKind::ApprovalRejected,
                &pending.call_id,
                pending.approval.session.as_deref(),
                &pending.approval.tool,
            );
            event.approval_id = Some(pending.approval.approval_id.clone());
            self.emit(event);
        }
        removed.is_some()
    }

    /// Number of pending approvals (after reclaiming expired ones).
    pub fn pending_approvals(&self) -> usize {
        let now = millis(self.clock.now());
        self.approvals
            .lock()
            .map(|mut store| store.expire(now))
            .unwrap_or(0)
    }
}
