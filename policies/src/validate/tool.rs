//! Tools: one check per rule family — name and description, the profile it runs in, command
//! or built-in, schemas ([`super::schemas`]), the argv template ([`super::argv`]), stdin,
//! side effect and approval, retries and timeout, and the metadata the gate reads
//! (concurrency, permissions, state, rate limit).
//!
//! [`check_tool`] calls the families in this order, which is also the order diagnostics at one
//! position come out in.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use toml::Spanned;

use super::argv::{check_command, check_dash_values, input_properties};
use super::permissions::check_permissions;
use super::schemas::{Schemas, check_schemas};
use super::{
    Approval, Checker, PERMISSIONS, Profile, SideEffect, StdinSource, TOOL_NAME, Tool, ToolState,
    bounds, defaults,
};
use crate::builtin::Builtin;
use crate::model::ToolFile;
use crate::validated::{CompiledSchemas, RateLimit};

/// Policy-wide settings that shape each tool.
#[derive(Debug, Clone, Copy)]
pub(super) struct ToolOptions {
    /// `strict_objects`.
    pub strict_objects: bool,
    /// `destructive_requires_approval` (default true).
    pub destructive_requires_approval: bool,
}

/// Validates one tool against the already checked `profiles`; `None` when it has errors (they
/// are in `c`).
pub(super) fn check_tool(
    c: &mut Checker<'_>,
    name: &Spanned<String>,
    file: &ToolFile,
    profiles: &BTreeMap<String, Option<Profile>>,
    options: ToolOptions,
) -> Option<Tool> {
    let before = c.error_count();
    let tool_name = check_name_and_description(c, name, file);
    let (profile_name, profile) = check_profile_ref(c, name, &tool_name, file, profiles);
    let builtin = check_implementation(c, name, &tool_name, file);
    let Schemas {
        input: input_schema,
        output: output_schema,
        input_compiled,
        output_compiled,
    } = check_schemas(c, name, &tool_name, file, builtin, options.strict_objects);
    let command = check_command(c, &tool_name, file, input_schema.as_ref());
    let allow_dash_values = check_dash_values(c, &tool_name, file, &command);
    let stdin = check_stdin(c, &tool_name, file, input_schema.as_ref());
    let side_effect = check_side_effect(c, &tool_name, file, builtin);
    let (approval, approval_implied) =
        check_approval(c, name, &tool_name, file, builtin, side_effect, options);
    let (retries, timeout) = check_retries_and_timeout(c, &tool_name, file, profile);
    if let (Some(profile), SideEffect::Read) = (profile, side_effect)
        && let Some(writes) = profile.lasting_writes()
    {
        c.warning(
            name.span(),
            format!(
                "tool {tool_name} is declared read-only but profile {} {writes}",
                profile.name
            ),
        );
    }
    // Undeclared: a built-in that only reads cannot disturb another call; anything else might.
    let concurrency_safe = file
        .concurrency_safe
        .as_ref()
        .map_or(builtin.is_some_and(Builtin::is_read_only), |v| *v.get_ref());
    let permissions = check_permission_names(c, &tool_name, file);
    if let (Some(declared), Some(profile), Some(list)) = (&permissions, profile, &file.permissions)
    {
        check_permissions(c, &tool_name, declared, profile, list.span());
    }
    let state = check_state(c, &tool_name, file);
    let rate_limit = check_rate_limit(c, &tool_name, file);

    if c.error_count() != before {
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
        compiled_schemas: CompiledSchemas {
            input: input_compiled,
            output: output_compiled,
        },
    })
}

/// The tool's name (returned) and its description, which must say something.
fn check_name_and_description(
    c: &mut Checker<'_>,
    name: &Spanned<String>,
    file: &ToolFile,
) -> String {
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
    tool_name
}

/// The profile the tool runs in (named, or `default`): its name, and the profile when it
/// exists and is valid.
fn check_profile_ref<'p>(
    c: &mut Checker<'_>,
    name: &Spanned<String>,
    tool_name: &str,
    file: &ToolFile,
    profiles: &'p BTreeMap<String, Option<Profile>>,
) -> (String, Option<&'p Profile>) {
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
    (profile_name, profile)
}

/// Exactly one of `command` and `builtin`; the built-in, when one is named and known.
fn check_implementation(
    c: &mut Checker<'_>,
    name: &Spanned<String>,
    tool_name: &str,
    file: &ToolFile,
) -> Option<Builtin> {
    match (&file.command, &file.builtin) {
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
    }
}

/// `stdin`: nothing, one input property, or the whole input (`"$input"`).
fn check_stdin(
    c: &mut Checker<'_>,
    tool_name: &str,
    file: &ToolFile,
    input_schema: Option<&Value>,
) -> StdinSource {
    match &file.stdin {
        None => StdinSource::Empty,
        Some(s) if s.get_ref() == "$input" => StdinSource::WholeInput,
        Some(s) => {
            let properties = input_properties(input_schema);
            if input_schema.is_some() && properties.and_then(|p| p.get(s.get_ref())).is_none() {
                c.error(s.span(), format!("tool {tool_name}: stdin field {:?} is not a property of the input schema (or use \"$input\")", s.get_ref()));
            }
            StdinSource::Field(s.get_ref().clone())
        }
    }
}

fn check_side_effect(
    c: &mut Checker<'_>,
    tool_name: &str,
    file: &ToolFile,
    builtin: Option<Builtin>,
) -> SideEffect {
    match file
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
        // Plan mode and `read_only` rules let a read tool run; a built-in that writes
        // (bash runs anything) would get through them by its word alone.
        Some(("read", span)) => match builtin {
            Some(b @ (Builtin::WriteFile | Builtin::Edit | Builtin::Bash)) => {
                c.error(
                    span,
                    format!(
                        "tool {tool_name}: the {} built-in can change files, so its side_effect cannot be \"read\" (plan mode and read_only rules would let it run)",
                        b.name()
                    ),
                );
                SideEffect::Destructive
            }
            _ => SideEffect::Read,
        },
        Some(("write", _)) => SideEffect::Write,
        Some(("destructive", _)) => SideEffect::Destructive,
        Some((other, span)) => {
            c.error(span, format!("tool {tool_name}: side_effect must be read, write or destructive, not {other:?}"));
            SideEffect::Destructive
        }
    }
}

/// `approval`, as declared or implied by the side effect; returns it and whether it is only
/// implied.
fn check_approval(
    c: &mut Checker<'_>,
    name: &Spanned<String>,
    tool_name: &str,
    file: &ToolFile,
    builtin: Option<Builtin>,
    side_effect: SideEffect,
    options: ToolOptions,
) -> (Approval, bool) {
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
    (approval, approval_implied)
}

/// `retries` (default 0) and `timeout` (default the profile's).
fn check_retries_and_timeout(
    c: &mut Checker<'_>,
    tool_name: &str,
    file: &ToolFile,
    profile: Option<&Profile>,
) -> (u32, Duration) {
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
    (retries, timeout)
}

/// The names in `permissions`, when declared; unknown ones are errors and left out.
fn check_permission_names(
    c: &mut Checker<'_>,
    tool_name: &str,
    file: &ToolFile,
) -> Option<Vec<String>> {
    file.permissions.as_ref().map(|list| {
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
    })
}

fn check_state(c: &mut Checker<'_>, tool_name: &str, file: &ToolFile) -> ToolState {
    match &file.state {
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
    }
}

fn check_rate_limit(c: &mut Checker<'_>, tool_name: &str, file: &ToolFile) -> Option<RateLimit> {
    file.rate_limit
        .as_ref()
        .and_then(|r| match RateLimit::parse(r.get_ref()) {
            Ok(limit) => Some(limit),
            Err(e) => {
                c.error(r.span(), format!("tool {tool_name}: {e}"));
                None
            }
        })
}
