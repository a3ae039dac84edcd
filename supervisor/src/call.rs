//! A tool call as a gateway hands it over, and the output check every backend applies.
//! (The whole flow — validation, decision, sandbox, retries — is the gate's.)

use airlock_policy::CompiledTool;
use airlock_policy::schema::InputLimits;

use crate::result::{ErrorKind, ToolError, ToolResult};

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

/// Validates a successful result's stdout against the tool's output schema: the parsed JSON
/// becomes `output` and leaves `stdout` (a result never carries the same bytes twice); a
/// mismatch turns the result into `output_invalid`, with stdout kept to show why.
pub fn check_output(tool: &CompiledTool, result: &mut ToolResult) {
    let (true, Some(output_schema)) = (result.ok, &tool.output) else {
        return;
    };
    let limits = InputLimits {
        max_bytes: usize::MAX,
        ..InputLimits::default()
    };
    match output_schema.check_text(&result.stdout, limits) {
        Ok(value) => {
            result.output = Some(value);
            result.stdout = String::new();
        }
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
