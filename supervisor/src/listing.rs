//! Tools as a gateway lists them: everything the gate enforces about a tool, in the form the
//! daemon's `tools` op answers (its JSON field names are a contract).

use airlock_policy::CompiledTool;
use airlock_policy::validate::{Approval, SideEffect, ToolState};
use serde::Serialize;
use serde_json::Value;

/// A tool as listed to a gateway. Offer a model the `active` ones; the others answer
/// `tool_unavailable` until `set_state` makes them active.
#[derive(Debug, Clone, Serialize)]
pub struct ToolListing {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Input JSON Schema: exactly the document calls are checked against (with
    /// `strict_objects` applied).
    pub input_schema: Value,
    /// Output JSON Schema the tool's stdout must match, exactly as enforced.
    pub output_schema: Option<Value>,
    /// Side effect.
    pub side_effect: SideEffect,
    /// Category.
    pub category: Option<String>,
    /// Whether calls of this tool in one session may run at once (else one at a time).
    pub concurrency_safe: bool,
    /// `human`: every call needs an approval (declared, or implied by a destructive side
    /// effect).
    pub approval: Approval,
    /// Deadline of one attempt, milliseconds.
    pub timeout_ms: u64,
    /// Extra attempts after an eligible failure.
    pub retries: u32,
    /// `active`, `deferred` or `suspended`.
    pub state: ToolState,
}

impl ToolListing {
    /// The listing of `tool` in its current `state`.
    pub fn of(tool: &CompiledTool, state: ToolState) -> Self {
        let t = &tool.tool;
        Self {
            name: t.name.clone(),
            description: t.description.clone(),
            input_schema: t.input_schema.clone(),
            output_schema: t.output_schema.clone(),
            side_effect: t.side_effect,
            category: t.category.clone(),
            concurrency_safe: t.concurrency_safe,
            approval: t.approval,
            timeout_ms: u64::try_from(t.timeout.as_millis()).unwrap_or(u64::MAX),
            retries: t.retries,
            state,
        }
    }
}
