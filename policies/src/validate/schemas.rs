//! A tool's input and output JSON Schemas: converted from TOML, closed under
//! `strict_objects` (reporting where that changes their meaning) and compiled.

use serde_json::Value;
use toml::Spanned;

use super::Checker;
use crate::builtin::Builtin;
use crate::model::ToolFile;
use crate::schema::{CompiledSchema, compile_schema, dialect};
use crate::strict::close_objects;

/// The schemas a tool ends up with, with what checking them compiled (a built-in's input
/// schema is compiled later).
pub(super) struct Schemas {
    /// The input schema: declared, or the built-in's; `None` when missing or invalid.
    pub input: Option<Value>,
    /// The output schema, when declared and valid.
    pub output: Option<Value>,
    /// The declared input schema, compiled.
    pub input_compiled: Option<CompiledSchema>,
    /// The output schema, compiled.
    pub output_compiled: Option<CompiledSchema>,
}

/// `input` (required of command tools, an object schema) and `output`.
pub(super) fn check_schemas(
    c: &mut Checker<'_>,
    name: &Spanned<String>,
    tool_name: &str,
    file: &ToolFile,
    builtin: Option<Builtin>,
    strict_objects: bool,
) -> Schemas {
    let (input, input_compiled) = match (&file.input, builtin) {
        (Some(input), _) => check_schema(
            c,
            input,
            &format!("tool {tool_name}: input schema"),
            strict_objects,
        )
        .map_or((None, None), |(json, compiled)| {
            (Some(json), Some(compiled))
        }),
        (None, Some(b)) => (Some(b.input_schema()), None),
        (None, None) => {
            if file.command.is_some() {
                c.error(
                    name.span(),
                    format!("tool {tool_name}: command tools need an input schema"),
                );
            }
            (None, None)
        }
    };
    if let (Some(schema), Some(declared)) = (&input, &file.input)
        && schema.get("type").and_then(Value::as_str) != Some("object")
    {
        c.error(
            declared.span(),
            format!("tool {tool_name}: input schema must have type = \"object\""),
        );
    }
    let (output, output_compiled) = file
        .output
        .as_ref()
        .and_then(|o| {
            check_schema(
                c,
                o,
                &format!("tool {tool_name}: output schema"),
                strict_objects,
            )
        })
        .map_or((None, None), |(json, compiled)| {
            (Some(json), Some(compiled))
        });
    Schemas {
        input,
        output,
        input_compiled,
        output_compiled,
    }
}

/// Converts, applies `strict_objects` (reporting where that changes the schema's meaning)
/// and compiles a schema. Returns the document the gate enforces and publishes, compiled.
fn check_schema(
    c: &mut Checker<'_>,
    schema: &Spanned<toml::Value>,
    what: &str,
    strict_objects: bool,
) -> Option<(Value, CompiledSchema)> {
    let json = match toml_to_json(schema.get_ref()) {
        Ok(json) => json,
        Err(e) => {
            c.error(schema.span(), format!("{what}: {e}"));
            return None;
        }
    };
    let json = match (strict_objects, dialect(&json)) {
        (true, Ok(dialect)) => {
            let (closed, notes) = close_objects(&json, dialect);
            for note in notes {
                c.warning(schema.span(), format!("{what}: {note}"));
            }
            closed
        }
        _ => json,
    };
    match compile_schema(&json) {
        Ok(compiled) => Some((json, compiled)),
        Err(e) => {
            c.error(schema.span(), format!("{what}: {e}"));
            None
        }
    }
}

/// Converts a TOML value to JSON; TOML datetimes have no JSON equivalent.
fn toml_to_json(value: &toml::Value) -> Result<Value, &'static str> {
    Ok(match value {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::from(*i),
        toml::Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(Value::Number)
            .ok_or("schemas cannot hold NaN or infinite numbers")?,
        toml::Value::Boolean(b) => Value::Bool(*b),
        toml::Value::Datetime(_) => return Err("schemas cannot hold TOML datetimes"),
        toml::Value::Array(items) => {
            Value::Array(items.iter().map(toml_to_json).collect::<Result<_, _>>()?)
        }
        toml::Value::Table(table) => Value::Object(
            table
                .iter()
                .map(|(k, v)| Ok((k.clone(), toml_to_json(v)?)))
                .collect::<Result<_, &'static str>>()?,
        ),
    })
}
