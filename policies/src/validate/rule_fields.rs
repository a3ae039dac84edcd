//! A pattern rule's `field` against the input schemas of the tools it applies to.
//!
//! The gate looks the field up in the call's input and takes a missing field for "no
//! match", so a rule over a field its tools never receive is dead: a `deny` written against
//! `cmd` for the `bash` built-in (whose field is `command`) lets every call through to the
//! default decision. Such a rule is refused where the schemas say the field cannot be sent,
//! and warned about where they leave it open.

use std::collections::BTreeMap;

use serde_json::Value;
use toml::Spanned;

use super::{Checker, Tool};

/// What a tool's input schema says about one top-level field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presence {
    /// A property of that name, or a `patternProperties` pattern it matches.
    Declared,
    /// Not named, but the schema lets other fields through.
    Possible,
    /// Not named, and `additionalProperties = false` refuses it.
    Refused,
}

fn presence(schema: &Value, field: &str) -> Presence {
    if schema
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| p.contains_key(field))
    {
        return Presence::Declared;
    }
    // A pattern the regex crate cannot read is taken as matching: better a rule kept than
    // a valid one refused.
    let by_pattern = schema
        .get("patternProperties")
        .and_then(Value::as_object)
        .is_some_and(|patterns| {
            patterns
                .keys()
                .any(|p| regex::Regex::new(p).map_or(true, |re| re.is_match(field)))
        });
    if by_pattern {
        return Presence::Declared;
    }
    // Only `additionalProperties` beside the properties closes the object for certain;
    // `unevaluatedProperties` and composed schemas may admit the field, so they count as
    // open.
    match schema.get("additionalProperties") {
        Some(Value::Bool(false)) => Presence::Refused,
        _ => Presence::Possible,
    }
}

/// The declared property names of a schema, for the error message.
fn declared(schema: &Value) -> String {
    let names: Vec<&str> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    if names.is_empty() {
        "its input schema declares no property".to_string()
    } else {
        format!("its input schema allows only: {}", names.join(", "))
    }
}

/// Checks `field` of rule `name` against the tools it names (`scoped`), or against every
/// tool when it names none. Tools that are missing or invalid have their own errors.
pub(super) fn check_pattern_field(
    c: &mut Checker<'_>,
    name: &str,
    field: &Spanned<String>,
    scoped: &[String],
    tools: &BTreeMap<String, Option<Tool>>,
) {
    let span = c.key_span(field.span());
    let field = field.get_ref();
    if scoped.is_empty() {
        // A rule for every tool fires for those that have the field; it is dead only when
        // none may have it. With an invalid tool nobody knows, and it has its errors.
        if tools.is_empty() || tools.values().any(Option::is_none) {
            return;
        }
        let found: Vec<Presence> = tools
            .values()
            .flatten()
            .map(|t| presence(&t.input_schema, field))
            .collect();
        if found.contains(&Presence::Declared) {
            return;
        }
        if found.contains(&Presence::Possible) {
            c.warning(
                span,
                format!(
                    "rule {name}: no tool's input schema declares {field:?}; the rule matches only calls that send it to a tool whose schema lets other fields through"
                ),
            );
        } else {
            c.error(
                span,
                format!(
                    "rule {name}: no tool has an input field {field:?}, so the rule could never match"
                ),
            );
        }
        return;
    }
    let mut seen = Vec::new();
    for tool_name in scoped {
        if seen.contains(&tool_name) {
            continue;
        }
        seen.push(tool_name);
        let Some(Some(tool)) = tools.get(tool_name) else {
            continue;
        };
        match presence(&tool.input_schema, field) {
            Presence::Declared => {}
            Presence::Possible => c.warning(
                span.clone(),
                format!(
                    "rule {name}: tool {tool_name}'s input schema does not declare {field:?}; the rule matches only calls that send it anyway"
                ),
            ),
            Presence::Refused => c.error(
                span.clone(),
                format!(
                    "rule {name}: tool {tool_name} has no input field {field:?} ({}), so the rule could never match it",
                    declared(&tool.input_schema)
                ),
            ),
        }
    }
}
