//! A tool call end to end: validate the input against the tool's schema, build the argv
//! and stdin, run it in a fresh sandbox, validate the output. (Decisions, approvals and
//! retries join this flow with the gate.)

use std::sync::Arc;

use airlock_policy::schema::{InputError, InputLimits};
use airlock_policy::{CompiledPolicy, CompiledTool};

use crate::cancel::CancelSignal;
use crate::result::{ErrorKind, InputViolation, ToolError, ToolResult};
use crate::sandbox::{SandboxRun, Supervisor};

/// A tool call as a gateway hands it over.
#[derive(Debug, Clone)]
pub struct ToolCall {
    /// Caller-chosen id, echoed in the result.
    pub call_id: String,
    /// Tool name.
    pub tool: String,
    /// Arguments as JSON text (untrusted).
    pub arguments: String,
}

fn invalid_input(error: InputError) -> ToolError {
    let violations = match &error {
        InputError::Schema { violations } => Some(
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

/// Runs one tool call under `policy`.
pub async fn call_tool(
    supervisor: &Supervisor,
    policy: &CompiledPolicy,
    call: &ToolCall,
    cancel: Option<&CancelSignal>,
) -> ToolResult {
    let Some(tool) = policy.tools.get(&call.tool) else {
        return ToolResult::rejected(
            &call.call_id,
            &call.tool,
            ToolError::new(
                ErrorKind::UnknownTool,
                format!("no tool named {:?}", call.tool),
            ),
        );
    };
    let input = match tool
        .input
        .check_text(&call.arguments, InputLimits::default())
    {
        Ok(value) => value,
        Err(e) => return ToolResult::rejected(&call.call_id, &call.tool, invalid_input(e)),
    };
    let argv = match tool.render_argv(&input) {
        Ok(argv) => argv,
        Err(e) => {
            return ToolResult::rejected(
                &call.call_id,
                &call.tool,
                ToolError::new(ErrorKind::InvalidInput, e.to_string()),
            );
        }
    };
    let Some(profile) = policy.profiles.get(&tool.tool.profile) else {
        return ToolResult::rejected(
            &call.call_id,
            &call.tool,
            ToolError::new(
                ErrorKind::SandboxUnavailable,
                "the tool's profile is missing",
            ),
        );
    };
    let run = SandboxRun {
        call_id: call.call_id.clone(),
        tool: call.tool.clone(),
        profile: Arc::clone(profile),
        argv,
        stdin: tool.render_stdin(&input),
        arguments_json: input.to_string(),
        timeout: tool.tool.timeout,
        inherit_stdio: None,
        builtin: tool.tool.builtin.map(|b| b.name().to_string()),
    };
    let mut result = supervisor.run(run, cancel).await;
    check_output(tool, &mut result);
    result
}

/// Validates a successful result's stdout against the tool's output schema (parsed JSON
/// becomes `output`); a mismatch turns the result into `output_invalid`.
pub fn check_output(tool: &CompiledTool, result: &mut ToolResult) {
    let (true, Some(output_schema)) = (result.ok, &tool.output) else {
        return;
    };
    let limits = InputLimits {
        max_bytes: usize::MAX,
        ..InputLimits::default()
    };
    match output_schema.check_text(&result.stdout, limits) {
        Ok(value) => result.output = Some(value),
        Err(e) => {
            result.ok = false;
            result.output = None;
            result.error = Some(ToolError::new(
                ErrorKind::OutputInvalid,
                format!("output {}", e.to_string().trim_start_matches("input ")),
            ));
        }
    }
}
