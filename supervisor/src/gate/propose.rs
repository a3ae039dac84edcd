//! Phase one of the two-phase approval flow: a call that needs a human is checked and
//! decided like any other, then kept, with what it would run, until it is executed,
//! rejected or expires.

use super::*;

impl Gate {
    /// Phase one: validates and decides, and stores an approval for a call that needs one.
    pub fn propose(&self, call: &ToolCall, opts: &CallOptions) -> Result<Approval, ToolResult> {
        let prepared = self
            .prepare(call, opts.session.as_deref())
            .map_err(|e| self.refuse(call, opts, e))?;
        let verdict = self.decide(call, opts, &prepared)?;
        let now = self.clock.now();
        let gate = &prepared.policy.gate;
        let tool = &prepared.tool.tool;
        let unavailable = |message: &str| {
            rejected(
                call,
                ToolError::new(ErrorKind::Overloaded, message.to_string()),
            )
        };
        // Never a guessable id: without the OS random source there is no approval.
        let approval_id =
            random_id().ok_or_else(|| unavailable("no random source for an approval id"))?;
        let (rule, reason) = if verdict.decision == Decision::Review {
            let reason = format!("rule {} asks a human to review this call", verdict.rule);
            (verdict.rule.clone(), reason)
        } else if tool.approval == airlock_policy::validate::Approval::Human {
            let reason = if tool.approval_implied {
                format!(
                    "tool {} is destructive: every call needs a human's approval",
                    tool.name
                )
            } else {
                format!("tool {} asks a human to approve every call", tool.name)
            };
            ("approval".to_string(), reason)
        } else {
            let reason = format!("proposed by the caller; rule {} allows it", verdict.rule);
            (verdict.rule.clone(), reason)
        };
        let approval = Approval {
            approval_id,
            tool: call.tool.clone(),
            arguments: prepared.input.clone(),
            input_digest: prepared.digest.clone(),
            argv_preview: prepared.argv.clone(),
            builtin: tool.builtin.map(|b| b.name().to_string()),
            profile: tool.profile.clone(),
            timeout_ms: u64::try_from(tool.timeout.as_millis()).unwrap_or(u64::MAX),
            session: opts.session.clone(),
            rule,
            reason,
            policy_version: prepared.policy.version.clone(),
            tool_version: tool_version(
                &prepared.tool,
                prepared
                    .policy
                    .profiles
                    .get(&tool.profile)
                    .map(AsRef::as_ref),
            ),
            expires_at_ms: millis(now + gate.approval_ttl),
        };
        // Made and measured before the store's lock is taken.
        let pending = Pending::new(
            approval.clone(),
            call.call_id.clone(),
            canonical_json(&prepared.input),
        );
        let Ok(mut store) = self.approvals.lock() else {
            return Err(unavailable("approval store unavailable"));
        };
        let max_bytes = store.max_bytes;
        match store.admit(pending, gate.max_pending_approvals, millis(now)) {
            Ok(()) => drop(store),
            Err(Refused::TooMany(n)) => {
                return Err(unavailable(&format!(
                    "{n} approvals are pending; reject or execute some first"
                )));
            }
            Err(Refused::Full(held)) => {
                return Err(unavailable(&format!(
                    "the pending approvals hold {held} bytes of arguments, the most this gate keeps ({max_bytes}); reject or execute some first"
                )));
            }
            Err(Refused::NeverFits(bytes)) => {
                let error = ToolError::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "the arguments take about {bytes} bytes to keep for approval, more than this gate keeps for all pending approvals ({max_bytes})"
                    ),
                );
                return Err(self.refuse(call, opts, error));
            }
        }
        let mut event = Event::new(
            EventKind::ApprovalRequired,
            &call.call_id,
            opts.session.as_deref(),
            &call.tool,
        );
        event.decision = Some(verdict.decision);
        event.rule = Some(verdict.rule);
        event.input_digest = Some(prepared.digest);
        event.approval_id = Some(approval.approval_id.clone());
        self.emit(event);
        Ok(approval)
    }
}
