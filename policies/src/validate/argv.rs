//! A command tool's argv template: a literal executable path, then literals and whole-argument
//! `{field}`s that name required scalar input properties; and `allow_dash_values`.

use std::collections::BTreeSet;

use serde_json::{Map, Value};
use toml::Spanned;

use super::{ArgTemplate, Checker};
use crate::model::ToolFile;

/// JSON Schema types a `{field}` may have: each renders as exactly one argument.
const SCALAR_TYPES: &[&str] = &["string", "integer", "number", "boolean"];

/// The `properties` of an input schema.
pub(super) fn input_properties(input_schema: Option<&Value>) -> Option<&Map<String, Value>> {
    input_schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
}

/// `command`: its elements as a template. Fields are checked against the input schema when
/// there is a valid one.
pub(super) fn check_command(
    c: &mut Checker<'_>,
    tool_name: &str,
    file: &ToolFile,
    input_schema: Option<&Value>,
) -> Vec<ArgTemplate> {
    let properties = input_properties(input_schema);
    let required: BTreeSet<&str> = input_schema
        .and_then(|s| s.get("required"))
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();

    let mut command = Vec::new();
    let no_command = Spanned::new(0..0, Vec::new());
    let command_file = file.command.as_ref().unwrap_or(&no_command);
    if file.command.is_some() && command_file.get_ref().is_empty() {
        c.error(
            command_file.span(),
            format!("tool {tool_name}: command must name an executable"),
        );
    }
    for (index, element) in command_file.get_ref().iter().enumerate() {
        let text = element.get_ref();
        let field = text.strip_prefix('{').and_then(|t| t.strip_suffix('}'));
        match field {
            Some(field) if index == 0 => {
                c.error(element.span(), format!("tool {tool_name}: the executable must be a literal path, not the field {field:?}"));
            }
            Some(field) => {
                if input_schema.is_some() {
                    let property = properties.and_then(|p| p.get(field));
                    let scalar = property
                        .and_then(|p| p.get("type"))
                        .and_then(Value::as_str)
                        .is_some_and(|t| SCALAR_TYPES.contains(&t));
                    if property.is_none() {
                        c.error(element.span(), format!("tool {tool_name}: command field {field:?} is not a property of the input schema"));
                    } else if !scalar {
                        c.error(element.span(), format!("tool {tool_name}: command field {field:?} must have a scalar type (string, integer, number, boolean)"));
                    } else if !required.contains(field) {
                        c.error(element.span(), format!("tool {tool_name}: command field {field:?} must be listed in the input schema's required"));
                    }
                }
                command.push(ArgTemplate::Field(field.to_string()));
            }
            None if text.contains('{') || text.contains('}') => {
                c.error(element.span(), format!("tool {tool_name}: fields are substituted as whole arguments only: write \"{{field}}\" as its own element"));
            }
            None if text.contains('\0') => {
                c.error(
                    element.span(),
                    format!("tool {tool_name}: command elements must not contain NUL"),
                );
            }
            None if index == 0 => {
                if let Some(path) = c.path(element, &format!("tool {tool_name}: executable")) {
                    command.push(ArgTemplate::Literal(path));
                }
            }
            None => command.push(ArgTemplate::Literal(text.clone())),
        }
    }
    command
}

/// `allow_dash_values`: every name must be a `{field}` of the command. A field that may start
/// with `-` and has no `--` before it is warned about: most programs would read it as an
/// option (`echo_text` given `--version`).
pub(super) fn check_dash_values(
    c: &mut Checker<'_>,
    tool_name: &str,
    file: &ToolFile,
    command: &[ArgTemplate],
) -> BTreeSet<String> {
    let Some(list) = &file.allow_dash_values else {
        return BTreeSet::new();
    };
    let mut allowed = BTreeSet::new();
    for field in list.get_ref() {
        let position = command
            .iter()
            .position(|a| *a == ArgTemplate::Field(field.get_ref().clone()));
        let Some(position) = position else {
            c.error(
                field.span(),
                format!(
                    "tool {tool_name}: allow_dash_values names {:?}, which is not a {{field}} of the command",
                    field.get_ref()
                ),
            );
            continue;
        };
        let after_marker = command[..position]
            .iter()
            .any(|a| *a == ArgTemplate::Literal("--".to_string()));
        if !after_marker {
            c.warning(
                field.span(),
                format!(
                    "tool {tool_name}: command field {:?} may start with `-` (allow_dash_values) and no \
                     \"--\" comes before it, so the program may read it as an option",
                    field.get_ref()
                ),
            );
        }
        allowed.insert(field.get_ref().clone());
    }
    allowed
}
