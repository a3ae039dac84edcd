//! Settings of one open session: its own tool states and its plan mode, over the gate's;
//! and the session a call runs in.

use std::sync::Arc;

use airlock_policy::validate::ToolState;
use airlock_policy::{CompiledProfile, CompiledTool};

use super::{Gate, Prepared};
use crate::listing::ToolListing;
use crate::result::{ErrorKind, ToolError, ToolResult};
use crate::session::{SessionCall, SessionError};
use crate::{CallOptions, ToolCall};

impl Gate {
    /// Refuses a call naming a session that ended after setting a plan mode or tool
    /// states: given the daemon-wide settings instead, it could do what its session had
    /// ruled out. A call naming an open session keeps it from expiring.
    pub(super) fn session_in_force(
        &self,
        call: &ToolCall,
        opts: &CallOptions,
    ) -> Result<(), ToolResult> {
        let (Some(id), Some(sessions)) = (opts.session.as_deref(), &self.sessions) else {
            return Ok(());
        };
        if sessions.ended_with_settings(id) {
            return Err(self.refuse(
                call,
                opts,
                ToolError::new(
                    ErrorKind::SessionUnknown,
                    "the session has ended; the plan mode and tool states it set no longer \
                     apply, and its calls do not run without them",
                ),
            ));
        }
        sessions.touch(id);
        Ok(())
    }

    /// The profile a call runs under and the session it runs in, looked up before the
    /// call takes a rate-limit token or is announced `tool.called`: a workspace tool naming
    /// no open session is refused and audited as such, never a call that started and
    /// never ended.
    pub(super) fn enter_session(
        &self,
        call: &ToolCall,
        opts: &CallOptions,
        prepared: &Prepared,
    ) -> Result<(Arc<CompiledProfile>, Option<SessionCall>), ToolResult> {
        let Some(profile) = prepared.policy.profiles.get(&prepared.tool.tool.profile) else {
            return Err(self.refuse(
                call,
                opts,
                ToolError::new(
                    ErrorKind::SandboxUnavailable,
                    "the tool's profile is missing",
                ),
            ));
        };
        let entered = match &self.sessions {
            Some(sessions) => {
                sessions.enter(&prepared.policy.sessions, opts.session.as_deref(), profile)
            }
            None => crate::session::without_sessions(profile),
        };
        match entered {
            Ok(in_session) => Ok((Arc::clone(profile), in_session)),
            Err(error) => Err(self.refuse(call, opts, *error)),
        }
    }

    /// `tool`'s state and the plan mode for a call in `session`: an open session's own
    /// state of the tool wins over the gate's, and plan mode holds when the session or the
    /// call asks for it, so a call cannot lift its session's.
    pub(super) fn settings_in(
        &self,
        tool: &CompiledTool,
        session: Option<&str>,
        plan_mode: bool,
    ) -> (ToolState, bool) {
        let (state, session_plan) = match (session, &self.sessions) {
            (Some(id), Some(sessions)) => sessions.overrides(id, &tool.tool.name),
            _ => (None, false),
        };
        (
            state.unwrap_or_else(|| self.state_of(tool)),
            plan_mode || session_plan,
        )
    }

    /// Changes a tool's availability for calls in one open session only; `Ok(false)` if
    /// there is no such tool. The session's setting goes when it closes.
    pub fn set_session_state(
        &self,
        session: &str,
        tool: &str,
        state: ToolState,
    ) -> Result<bool, SessionError> {
        if !self.policy().tools.contains_key(tool) {
            return Ok(false);
        }
        let Some(sessions) = &self.sessions else {
            return Err(SessionError::Unknown { op: "set_state" });
        };
        sessions.set_state(&self.policy().sessions, session, tool, state)?;
        Ok(true)
    }

    /// [`Gate::tools`] with the states calls in `session` see: its own where it set one.
    /// An id that is no open session sees the gate's states, as its calls do.
    pub fn tools_in(&self, session: &str) -> Vec<ToolListing> {
        self.policy()
            .tools
            .values()
            .map(|t| ToolListing::of(t, self.settings_in(t, Some(session), false).0))
            .collect()
    }
}
