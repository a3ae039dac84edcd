//! A tool in facts: how it is run, its input, and what the gate does with its calls.

use airlock_policy::rules::{Decision, GatePolicy, RateLimit, RuleMatch};
use airlock_policy::units::format_duration;
use airlock_policy::validate::{
    Approval, ArgTemplate, SideEffect, StdinSource, Tool, ValidatedPolicy,
};
use serde_json::Value;

use super::facts::{FieldFacts, GateFacts, InputFacts, RuleFacts, ToolFacts};

pub(super) fn describe_tool(tool: &Tool, policy: &ValidatedPolicy) -> ToolFacts {
    let input = describe_input(&tool.input_schema);
    let command = tool
        .command
        .iter()
        .map(|a| match a {
            ArgTemplate::Literal(text) => text.clone(),
            ArgTemplate::Field(field) => format!("{{{field}}}"),
        })
        .collect();
    let stdin = match &tool.stdin {
        StdinSource::Empty => "empty".to_string(),
        StdinSource::Field(field) => format!("the input field {field:?}"),
        StdinSource::WholeInput => "the whole input, as JSON".to_string(),
    };
    ToolFacts {
        name: tool.name.clone(),
        description: tool.description.clone(),
        profile: tool.profile.clone(),
        command,
        builtin: tool.builtin.map(|b| b.name().to_string()),
        stdin,
        side_effect: tool.side_effect,
        category: tool.category.clone(),
        approval: tool.approval,
        retries: tool.retries,
        timeout_ms: u64::try_from(tool.timeout.as_millis()).unwrap_or(u64::MAX),
        timeout: format_duration(tool.timeout),
        gate: describe_gate(&policy.gate, tool, &input),
        input,
        output_schema: tool.output_schema.is_some(),
    }
}

fn rate_text(limit: RateLimit) -> String {
    format!(
        "{} calls per {}",
        limit.calls,
        format_duration(limit.period)
    )
}

/// Which rules can decide this tool's calls (as `rules::decide` evaluates them: in order,
/// the first match wins), what is decided when no input-dependent rule fires, and when a
/// human must approve (a `review` decision or the tool's `approval = "human"`, as the gate
/// does).
fn describe_gate(gate: &GatePolicy, tool: &Tool, input: &InputFacts) -> GateFacts {
    let mut rules = Vec::new();
    let mut decision = (gate.default_decision, "default".to_string());
    for rule in &gate.rules {
        let (applies, conditional, matches) = match &rule.matches {
            RuleMatch::ReadOnly => (
                tool.side_effect == SideEffect::Read,
                false,
                "read-only tools".to_string(),
            ),
            RuleMatch::SideEffects(effects) => (
                effects.contains(&tool.side_effect),
                false,
                format!(
                    "side effects {}",
                    effects
                        .iter()
                        .map(|e| format!("{e:?}").to_lowercase())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            RuleMatch::Tools(names) => (
                names.contains(&tool.name),
                false,
                format!("tools {}", names.join(", ")),
            ),
            RuleMatch::Categories(categories) => (
                tool.category
                    .as_ref()
                    .is_some_and(|c| categories.contains(c)),
                false,
                format!("categories {}", categories.join(", ")),
            ),
            RuleMatch::Pattern {
                tools,
                field,
                patterns,
            } => {
                let may_have_field =
                    input.fields.iter().any(|f| &f.name == field) || !input.other_fields_refused;
                (
                    tools.contains(&tool.name) || (tools.is_empty() && may_have_field),
                    true,
                    format!(
                        "input field {field:?} matching one of {} pattern(s)",
                        patterns.len()
                    ),
                )
            }
        };
        if !applies {
            continue;
        }
        rules.push(RuleFacts {
            name: rule.name.clone(),
            matches,
            decision: rule.decision,
            conditional,
        });
        if !conditional {
            decision = (rule.decision, rule.name.clone());
            break;
        }
    }
    let human_approval = if tool.approval_implied {
        "every call (a destructive tool that declares no approval, under destructive_requires_approval)".to_string()
    } else if tool.approval == Approval::Human {
        "every call (the tool sets approval = \"human\")".to_string()
    } else {
        let mut when: Vec<String> = rules
            .iter()
            .filter(|r| r.conditional && r.decision == Decision::Review)
            .map(|r| format!("when rule {} fires", r.name))
            .collect();
        if decision.0 == Decision::Review {
            let by = if decision.1 == "default" {
                "the default decision".to_string()
            } else {
                format!("rule {}", decision.1)
            };
            when.push(if when.is_empty() {
                format!("every call ({by})")
            } else {
                format!("otherwise every call ({by})")
            });
        }
        if when.is_empty() {
            "never".to_string()
        } else {
            when.join("; ")
        }
    };
    let mut rate_limits = Vec::new();
    match (tool.rate_limit, gate.tool_rate) {
        (Some(own), _) => rate_limits.push(format!("{} for this tool", rate_text(own))),
        (None, Some(shared)) => rate_limits.push(format!(
            "{} for this tool (the policy's per-tool limit)",
            rate_text(shared)
        )),
        (None, None) => {}
    }
    if let Some(session) = gate.session_rate {
        rate_limits.push(format!("{} per session", rate_text(session)));
    }
    GateFacts {
        state: tool.state,
        rules,
        decision: decision.0,
        decision_rule: decision.1,
        human_approval,
        plan_mode: tool.side_effect == SideEffect::Read,
        rate_limits,
        permissions: tool.permissions.clone(),
        concurrency_safe: tool.concurrency_safe,
    }
}

/// The top level of an input schema: its fields, which are required, their constraints.
/// `schema` is the enforced document (`strict_objects` already applied).
fn describe_input(schema: &Value) -> InputFacts {
    let required: Vec<String> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let fields = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|properties| {
            properties
                .iter()
                .map(|(name, field)| FieldFacts {
                    name: name.clone(),
                    kind: field_kind(field),
                    required: required.contains(name),
                    constraints: field_constraints(field),
                })
                .collect()
        })
        .unwrap_or_default();
    let other_fields_refused = ["additionalProperties", "unevaluatedProperties"]
        .iter()
        .any(|k| schema.get(*k) == Some(&Value::Bool(false)));
    InputFacts {
        required,
        fields,
        other_fields_refused,
    }
}

fn field_kind(field: &Value) -> String {
    match field.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ if field.get("enum").is_some() => "enum".into(),
        _ => "any".into(),
    }
}

fn field_constraints(field: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let number = |key: &str| field.get(key).filter(|v| v.is_number());
    if let Some(n) = number("minLength") {
        out.push(format!("at least {n} characters"));
    }
    if let Some(n) = number("maxLength") {
        out.push(format!("at most {n} characters"));
    }
    if let Some(n) = number("minimum") {
        out.push(format!(">= {n}"));
    }
    if let Some(n) = number("maximum") {
        out.push(format!("<= {n}"));
    }
    if let Some(n) = number("maxItems") {
        out.push(format!("at most {n} items"));
    }
    if let Some(Value::String(pattern)) = field.get("pattern") {
        out.push(format!("matching /{pattern}/"));
    }
    if let Some(Value::String(format)) = field.get("format") {
        out.push(format!("format {format}"));
    }
    if let Some(Value::Array(values)) = field.get("enum") {
        let values: Vec<String> = values.iter().map(Value::to_string).collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    out
}
