//! A call admitted a while ago (one that waited for a daemon's concurrency slot) is decided
//! again before it runs: what an approver or a reload changed while it waited binds it.
// See mod.rs: a refusal's `ToolResult` is the caller's answer.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use airlock_policy::CompiledTool;
use airlock_policy::validate::ToolState;

use super::{Admitted, Gate, unavailable};
use crate::CallOptions;
use crate::result::{ToolError, ToolResult};

impl Gate {
    /// Refuses a call of `tool` in `session` unless the tool is active for it.
    pub(super) fn available_in(
        &self,
        tool: &CompiledTool,
        session: Option<&str>,
    ) -> Result<(), ToolError> {
        match self.settings_in(tool, session, false).0 {
            ToolState::Active => Ok(()),
            state => Err(unavailable(&tool.tool.name, state)),
        }
    }

    /// [`Gate::admit`]'s decision on `admitted` made again under the policy, tool states,
    /// plan mode and session in force now, refused (and audited) as admission would refuse
    /// it. Under the same policy only what can change without a reload is checked again —
    /// the tool's state and the decision (plan mode, the session, the rules) — so the
    /// input is not validated twice; after a reload the whole admission runs again.
    pub(super) fn readmit(
        &self,
        admitted: Admitted,
        opts: &CallOptions,
    ) -> Result<Admitted, ToolResult> {
        if !Arc::ptr_eq(&self.policy(), &admitted.prepared.policy) {
            return self.admit(&admitted.call, opts);
        }
        let Admitted { call, prepared, .. } = admitted;
        if let Err(error) = self.available_in(&prepared.tool, opts.session.as_deref()) {
            return Err(self.refuse(&call, opts, error));
        }
        let verdict = self.decide(&call, opts, &prepared)?;
        Ok(Admitted {
            call,
            prepared,
            verdict,
        })
    }
}
