//! The gate's tools and result records in MCP's shapes: `tools/list` entries and
//! `tools/call` results.

use airlock_policy::validate::{Approval, SideEffect, ToolState};
use serde_json::{Map, Value, json};

use crate::listing::ToolListing;
use crate::result::ToolResult;

/// The `_meta` key holding a call's whole result record (less what `content` and
/// `structuredContent` already carry).
pub const RESULT_META: &str = "airlock/result";

/// Whether MCP can carry `schema` as an `outputSchema`: MCP's structured content is a JSON
/// object, so only an output schema whose top level is `type: "object"` is published; a
/// tool with another output schema still has its output checked by the gate, and returns
/// it as text.
pub fn structured_output(schema: Option<&Value>) -> Option<&Value> {
    schema.filter(|s| s.get("type").and_then(Value::as_str) == Some("object"))
}

/// The `tools/list` entry of an active tool: its schemas exactly as the gate enforces them.
pub fn mcp_tool(listing: &ToolListing) -> Value {
    let mut tool = Map::new();
    tool.insert("name".into(), listing.name.clone().into());
    tool.insert("description".into(), listing.description.clone().into());
    tool.insert("inputSchema".into(), listing.input_schema.clone());
    if let Some(output) = structured_output(listing.output_schema.as_ref()) {
        tool.insert("outputSchema".into(), output.clone());
    }
    tool.insert(
        "annotations".into(),
        json!({
            "readOnlyHint": listing.side_effect == SideEffect::Read,
            "destructiveHint": listing.side_effect == SideEffect::Destructive,
        }),
    );
    tool.insert(
        "_meta".into(),
        json!({"airlock/tool": {
            "side_effect": listing.side_effect,
            "approval": listing.approval,
            "concurrency_safe": listing.concurrency_safe,
            "timeout_ms": listing.timeout_ms,
            "retries": listing.retries,
            "needs_approval": listing.approval == Approval::Human,
        }}),
    );
    Value::Object(tool)
}

/// The `tools/list` answer: the active tools only, in name order (the others would answer
/// `tool_unavailable`).
pub fn tool_list(listings: &[ToolListing]) -> Value {
    let mut active: Vec<&ToolListing> = listings
        .iter()
        .filter(|t| t.state == ToolState::Active)
        .collect();
    active.sort_by(|a, b| a.name.cmp(&b.name));
    json!({"tools": active.into_iter().map(mcp_tool).collect::<Vec<_>>()})
}

fn text(text: impl Into<String>) -> Value {
    json!({"type": "text", "text": text.into()})
}

/// The `tools/call` result of `result`. `structured`: the tool published an
/// `outputSchema`, so its checked output goes in `structuredContent` (and, serialized, in
/// a text block for clients that do not read it). A failure is `isError: true` with the
/// error's kind and message first; the gate's messages never hold raw arguments.
pub fn call_result(result: &ToolResult, structured: bool) -> Value {
    let mut answer = Map::new();
    let mut content = Vec::new();
    match (&result.error, &result.output) {
        (None, Some(output)) => {
            content.push(text(output.to_string()));
            if structured && output.is_object() {
                answer.insert("structuredContent".into(), output.clone());
            }
        }
        (None, None) => content.push(text(result.stdout.clone())),
        (Some(error), _) => {
            let kind = serde_json::to_value(error.kind)
                .ok()
                .and_then(|k| k.as_str().map(str::to_string))
                .unwrap_or_default();
            content.push(text(format!("{kind}: {}", error.message)));
            // What a failed tool printed is what a model needs to correct its call.
            if !result.stdout.is_empty() {
                content.push(text(format!("stdout:\n{}", result.stdout)));
            }
            if !result.stderr.is_empty() {
                content.push(text(format!("stderr:\n{}", result.stderr)));
            }
            answer.insert("isError".into(), true.into());
        }
    }
    answer.insert("content".into(), Value::Array(content));
    let mut record = serde_json::to_value(result).unwrap_or(Value::Null);
    if let Value::Object(fields) = &mut record {
        // Already in `content` and `structuredContent`; not twice in one answer.
        fields.remove("stdout");
        fields.remove("output");
    }
    answer.insert("_meta".into(), json!({ RESULT_META: record }));
    Value::Object(answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::{ErrorKind, ToolError};

    fn ran(stdout: &str, output: Option<Value>) -> ToolResult {
        ToolResult {
            ok: true,
            output,
            error: None,
            stdout: stdout.into(),
            exit_code: Some(0),
            ..ToolResult::rejected("c1", "t", ToolError::new(ErrorKind::Denied, ""))
        }
    }

    #[test]
    fn plain_output_is_text_and_structured_output_is_structured_content() {
        let plain = call_result(&ran("hi\n", None), false);
        assert_eq!(plain["content"], json!([{"type": "text", "text": "hi\n"}]));
        assert!(plain.get("isError").is_none());
        assert!(plain.get("structuredContent").is_none());
        assert_eq!(plain["_meta"][RESULT_META]["exit_code"], 0);
        assert!(plain["_meta"][RESULT_META].get("stdout").is_none());

        let output = json!({"a": "x"});
        let structured = call_result(&ran("", Some(output.clone())), true);
        assert_eq!(structured["structuredContent"], output);
        assert_eq!(structured["content"][0]["text"], output.to_string());
    }

    #[test]
    fn a_failure_is_an_error_result_with_its_kind_and_message() {
        let result = ToolResult::rejected(
            "c1",
            "t",
            ToolError::new(ErrorKind::InvalidInput, "input does not match"),
        );
        let answer = call_result(&result, true);
        assert_eq!(answer["isError"], true);
        assert_eq!(
            answer["content"][0]["text"],
            "invalid_input: input does not match"
        );
        assert!(answer.get("structuredContent").is_none());
        assert_eq!(
            answer["_meta"][RESULT_META]["error"]["kind"],
            "invalid_input"
        );
    }

    #[test]
    fn only_object_output_schemas_are_published() {
        let object = json!({"type": "object"});
        assert_eq!(structured_output(Some(&object)), Some(&object));
        assert_eq!(structured_output(Some(&json!({"type": "array"}))), None);
        assert_eq!(structured_output(None), None);
    }
}
