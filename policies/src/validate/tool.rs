//! Tools: command templates, built-ins, schemas (with `strict_objects` applied), side
//! effects, approvals and the rest of a tool's metadata.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use toml::Spanned;

use super::permissions::check_permissions;
use super::{
    Approval, ArgTemplate, Checker, PERMISSIONS, Profile, SideEffect, StdinSource, TOOL_NAME, Tool,
    ToolState, bounds, defaults,
};
use crate::builtin::Builtin;
use crate::diagnostic::Severity;
use crate::model::ToolFile;
use crate::rules::RateLimit;
use crate::schema::{compile_schema, dialect};
use crate::strict::close_objects;

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

/// Converts, applies `strict_objects` (reporting where that changes the schema's meaning)
/// and compiles a schema. Returns the document the gate enforces and publishes.
fn check_schema(
    c: &mut Checker<'_>,
    schema: &Spanned<toml::Value>,
    what: &str,
    strict_objects: bool,
) -> Option<Value> {
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
    if let Err(e) = compile_schema(&json) {
        c.error(schema.span(), format!("{what}: {e}"));
        return None;
    }
    Some(json)
}

/// Policy-wide settings that shape each tool.
#[derive(Debug, Clone, Copy)]
pub(super) struct ToolOptions {
    /// `strict_objects`.
    pub strict_objects: bool,
    /// `destructive_requires_approval` (default true).
    pub destructive_requires_approval: bool,
}

const SCALAR_TYPES: &[&str] = &["string", "integer", "number", "boolean"];

pub(super) fn check_tool(
    c: &mut Checker<'_>,
    name: &Spanned<String>,
    file: &ToolFile,
    profiles: &BTreeMap<String, Option<Profile>>,
    options: ToolOptions,
) -> Option<Tool> {
    let strict_objects = options.strict_objects;
    let before = c
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    let tool_name = name.get_ref().clone();
    if tool_name.len() > 64 || !TOOL_NAME.as_ref().is_ok_and(|re| re.is_match(&tool_name)) {
        c.error(
            name.span(),
            format!("tool name {tool_name:?} must match ^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$ (at most 64 characters)"),
        );
    }
    if file.description.get_ref().trim().is_empty() {
        c.error(
            file.description.span(),
            format!("tool {tool_name}: description must not be blank"),
        );
    }

    let profile_name = file
        .profile
        .as_ref()
        .map_or(defaults::PROFILE.to_string(), |p| p.get_ref().clone());
    let profile = match profiles.get(&profile_name) {
        Some(p) => p.as_ref(),
        None => {
            let span = file.profile.as_ref().map_or(name.span(), Spanned::span);
            c.error(
                span,
                format!("tool {tool_name}: profile {profile_name:?} is not defined"),
            );
            None
        }
    };

    let builtin = match (&file.command, &file.builtin) {
        (Some(_), Some(b)) => {
            c.error(
                b.span(),
                format!("tool {tool_name}: give either command or builtin, not both"),
            );
            None
        }
        (None, None) => {
            c.error(
                name.span(),
                format!("tool {tool_name}: needs a command or a builtin"),
            );
            None
        }
        (None, Some(b)) => {
            let found = Builtin::from_name(b.get_ref());
            if found.is_none() {
                let known: Vec<&str> = Builtin::ALL.iter().map(|b| b.name()).collect();
                c.error(
                    b.span(),
                    format!(
                        "tool {tool_name}: unknown builtin {:?}; known: {}",
                        b.get_ref(),
                        known.join(", ")
                    ),
                );
            }
            found
        }
        (Some(_), None) => None,
    };
    let input_schema = match (&file.input, builtin) {
        (Some(input), _) => check_schema(
            c,
            input,
            &format!("tool {tool_name}: input schema"),
            strict_objects,
        ),
        (None, Some(b)) => Some(b.input_schema()),
        (None, None) => {
            if file.command.is_some() {
                c.error(
                    name.span(),
                    format!("tool {tool_name}: command tools need an input schema"),
                );
            }
            None
        }
    };
    if let (Some(schema), Some(input)) = (&input_schema, &file.input)
        && schema.get("type").and_then(Value::as_str) != Some("object")
    {
        c.error(
            input.span(),
            format!("tool {tool_name}: input schema must have type = \"object\""),
        );
    }
    let output_schema = file.output.as_ref().and_then(|o| {
        check_schema(
            c,
            o,
            &format!("tool {tool_name}: output schema"),
            strict_objects,
        )
    });

    let properties = input_schema
        .as_ref()
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object);
    let required: BTreeSet<&str> = input_schema
        .as_ref()
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

    let allow_dash_values = check_dash_values(c, &tool_name, file, &command);

    let stdin = match &file.stdin {
        None => StdinSource::Empty,
        Some(s) if s.get_ref() == "$input" => StdinSource::WholeInput,
        Some(s) => {
            if input_schema.is_some() && properties.and_then(|p| p.get(s.get_ref())).is_none() {
                c.error(s.span(), format!("tool {tool_name}: stdin field {:?} is not a property of the input schema (or use \"$input\")", s.get_ref()));
            }
            StdinSource::Field(s.get_ref().clone())
        }
    };

    let side_effect = match file
        .side_effect
        .as_ref()
        .map(|s| (s.get_ref().as_str(), s.span()))
    {
        // Undeclared: built-ins know what they do; commands are assumed destructive.
        None => match builtin {
            Some(b) if b.is_read_only() => SideEffect::Read,
            Some(Builtin::WriteFile | Builtin::Edit) => SideEffect::Write,
            _ => SideEffect::Destructive,
        },
        Some(("read", _)) => SideEffect::Read,
        Some(("write", _)) => SideEffect::Write,
        Some(("destructive", _)) => SideEffect::Destructive,
        Some((other, span)) => {
            c.error(span, format!("tool {tool_name}: side_effect must be read, write or destructive, not {other:?}"));
            SideEffect::Destructive
        }
    };
    let declared_approval = match file
        .approval
        .as_ref()
        .map(|s| (s.get_ref().as_str(), s.span()))
    {
        None => None,
        Some(("auto", _)) => Some(Approval::Auto),
        Some(("human", _)) => Some(Approval::Human),
        Some((other, span)) => {
            c.error(
                span,
                format!("tool {tool_name}: approval must be auto or human, not {other:?}"),
            );
            Some(Approval::Auto)
        }
    };
    // Undeclared: a destructive tool waits for a human unless the policy turned that off.
    let approval_implied = declared_approval.is_none()
        && side_effect == SideEffect::Destructive
        && options.destructive_requires_approval;
    let approval = match declared_approval {
        Some(approval) => approval,
        None if approval_implied => Approval::Human,
        None => Approval::Auto,
    };
    if approval_implied && file.side_effect.is_none() && builtin.is_none() {
        c.warning(
            name.span(),
            format!(
                "tool {tool_name} declares no side_effect, so it is taken as destructive and \
                 every call needs a human approval (declare side_effect, or approval = \"auto\")"
            ),
        );
    }
    let retries = file
        .retries
        .as_ref()
        .and_then(|r| c.integer(r, &format!("tool {tool_name}: retries"), bounds::RETRIES))
        .and_then(|r| u32::try_from(r).ok())
        .unwrap_or(0);
    let timeout = file
        .timeout
        .as_ref()
        .and_then(|t| c.duration(t, &format!("tool {tool_name}: timeout")))
        .or(profile.map(|p| p.limits.timeout))
        .unwrap_or(defaults::TIMEOUT);

    if let (Some(profile), SideEffect::Read) = (profile, side_effect)
        && !profile.write.is_empty()
    {
        c.warning(
            name.span(),
            format!(
                "tool {tool_name} is declared read-only but profile {} has write paths",
                profile.name
            ),
        );
    }

    // Undeclared: a built-in that only reads cannot disturb another call; anything else might.
    let concurrency_safe = file
        .concurrency_safe
        .as_ref()
        .map_or(builtin.is_some_and(Builtin::is_read_only), |v| *v.get_ref());
    let permissions = file.permissions.as_ref().map(|list| {
        list.get_ref()
            .iter()
            .filter_map(|p| {
                if PERMISSIONS.contains(&p.get_ref().as_str()) {
                    Some(p.get_ref().clone())
                } else {
                    c.error(
                        p.span(),
                        format!(
                            "tool {tool_name}: unknown permission {:?}; use {}",
                            p.get_ref(),
                            PERMISSIONS.join(", ")
                        ),
                    );
                    None
                }
            })
            .collect::<Vec<_>>()
    });
    if let (Some(declared), Some(profile), Some(list)) = (&permissions, profile, &file.permissions)
    {
        check_permissions(c, &tool_name, declared, profile, list.span());
    }
    let state = match &file.state {
        None => ToolState::Active,
        Some(s) => ToolState::from_name(s.get_ref()).unwrap_or_else(|| {
            c.error(
                s.span(),
                format!(
                    "tool {tool_name}: state must be active, deferred or suspended, not {:?}",
                    s.get_ref()
                ),
            );
            ToolState::Active
        }),
    };
    let rate_limit = file
        .rate_limit
        .as_ref()
        .and_then(|r| match RateLimit::parse(r.get_ref()) {
            Ok(limit) => Some(limit),
            Err(e) => {
                c.error(r.span(), format!("tool {tool_name}: {e}"));
                None
            }
        });

    let after = c
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    if after != before {
        return None;
    }
    Some(Tool {
        concurrency_safe,
        approval_implied,
        allow_dash_values,
        permissions,
        state,
        rate_limit,
        name: tool_name,
        description: file.description.get_ref().clone(),
        profile: profile_name,
        command,
        builtin,
        stdin,
        side_effect,
        category: file.category.as_ref().map(|c| c.get_ref().clone()),
        approval,
        retries,
        timeout,
        input_schema: input_schema?,
        output_schema,
    })
}

/// `allow_dash_values`: every name must be a `{field}` of the command. A field that may start
/// with `-` and has no `--` before it is warned about: most programs would read it as an
/// option (`echo_text` given `--version`).
fn check_dash_values(
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
