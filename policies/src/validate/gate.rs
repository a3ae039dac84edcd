//! The gate's settings: decision rules, the default decision, rate limits, approval and
//! audit settings.

use std::collections::{BTreeMap, BTreeSet};

use toml::Spanned;

use super::{Checker, SideEffect, Tool};
use crate::model::PolicyFile;
use crate::rules::{Decision, GatePolicy, RateLimit, Rule, RuleMatch, preset_patterns};

/// Validates the gate: rules (every tool and category they name must exist), the default
/// decision, rate limits, approval and audit settings.
pub(super) fn check_gate(
    c: &mut Checker<'_>,
    file: &PolicyFile,
    tools: &BTreeMap<String, Option<Tool>>,
) -> GatePolicy {
    let mut gate = GatePolicy::default();
    if let Some(d) = &file.default_decision {
        match Decision::from_name(d.get_ref()) {
            Some(decision) => gate.default_decision = decision,
            None => c.error(
                d.span(),
                format!(
                    "default_decision must be allow, deny or review, not {:?}",
                    d.get_ref()
                ),
            ),
        }
    }
    let categories: BTreeSet<&str> = tools
        .values()
        .flatten()
        .filter_map(|t| t.category.as_deref())
        .collect();
    for (index, rule) in file.rules.iter().enumerate() {
        let name = rule
            .name
            .as_ref()
            .map_or(format!("rules[{index}]"), |n| n.get_ref().clone());
        let decision = Decision::from_name(rule.decision.get_ref()).unwrap_or_else(|| {
            c.error(
                rule.decision.span(),
                format!(
                    "rule {name}: decision must be allow, deny or review, not {:?}",
                    rule.decision.get_ref()
                ),
            );
            Decision::Deny
        });
        let known_tools = |c: &mut Checker<'_>| -> Vec<String> {
            rule.tools
                .iter()
                .map(|t| {
                    if !tools.contains_key(t.get_ref()) {
                        c.error(
                            t.span(),
                            format!("rule {name}: no tool named {:?}", t.get_ref()),
                        );
                    }
                    t.get_ref().clone()
                })
                .collect()
        };
        let matches = match rule.matches.get_ref().as_str() {
            "read_only" => Some(RuleMatch::ReadOnly),
            "side_effect" => {
                if rule.side_effects.is_empty() {
                    c.error(
                        rule.matches.span(),
                        format!("rule {name}: match = \"side_effect\" needs side_effects = [...]"),
                    );
                }
                let effects = rule
                    .side_effects
                    .iter()
                    .filter_map(|effect| {
                        let parsed = SideEffect::from_name(effect.get_ref());
                        if parsed.is_none() {
                            c.error(
                                effect.span(),
                                format!(
                                    "rule {name}: side effect must be read, write or destructive, not {:?}",
                                    effect.get_ref()
                                ),
                            );
                        }
                        parsed
                    })
                    .collect();
                Some(RuleMatch::SideEffects(effects))
            }
            "tool" => {
                if rule.tools.is_empty() {
                    c.error(
                        rule.matches.span(),
                        format!("rule {name}: match = \"tool\" needs tools = [...]"),
                    );
                }
                Some(RuleMatch::Tools(known_tools(c)))
            }
            "category" => {
                if rule.categories.is_empty() {
                    c.error(
                        rule.matches.span(),
                        format!("rule {name}: match = \"category\" needs categories = [...]"),
                    );
                }
                for category in &rule.categories {
                    if !categories.contains(category.get_ref().as_str()) {
                        c.warning(
                            category.span(),
                            format!("rule {name}: no tool has category {:?}", category.get_ref()),
                        );
                    }
                }
                Some(RuleMatch::Categories(
                    rule.categories
                        .iter()
                        .map(|c| c.get_ref().clone())
                        .collect(),
                ))
            }
            "pattern" => {
                let scoped = known_tools(c);
                let mut patterns = Vec::new();
                for pattern in &rule.patterns {
                    match regex::Regex::new(pattern.get_ref()) {
                        Ok(re) => patterns.push(re),
                        Err(e) => c.error(pattern.span(), format!("rule {name}: bad pattern: {e}")),
                    }
                }
                if let Some(preset) = &rule.preset {
                    match preset_patterns(preset.get_ref()) {
                        Some(Ok(set)) => patterns.extend(set),
                        Some(Err(e)) => c.error(
                            preset.span(),
                            format!("rule {name}: preset does not compile: {e}"),
                        ),
                        None => c.error(
                            preset.span(),
                            format!(
                                "rule {name}: unknown pattern preset {:?}; known: dangerous_shell",
                                preset.get_ref()
                            ),
                        ),
                    }
                }
                if rule.patterns.is_empty() && rule.preset.is_none() {
                    c.error(
                        rule.matches.span(),
                        format!(
                            "rule {name}: match = \"pattern\" needs patterns = [...] or preset"
                        ),
                    );
                }
                match &rule.field {
                    Some(field) => Some(RuleMatch::Pattern {
                        tools: scoped,
                        field: field.get_ref().clone(),
                        patterns,
                    }),
                    None => {
                        c.error(
                            rule.matches.span(),
                            format!("rule {name}: match = \"pattern\" needs field = \"...\""),
                        );
                        None
                    }
                }
            }
            other => {
                c.error(rule.matches.span(), format!("rule {name}: match must be read_only, side_effect, tool, category or pattern, not {other:?}"));
                None
            }
        };
        if let Some(matches) = matches {
            gate.rules.push(Rule {
                name,
                matches,
                decision,
            });
        }
    }
    if let Some(rates) = &file.rate_limits {
        let mut parse = |value: &Option<Spanned<String>>| {
            value
                .as_ref()
                .and_then(|v| match RateLimit::parse(v.get_ref()) {
                    Ok(limit) => Some(limit),
                    Err(e) => {
                        c.error(v.span(), format!("rate_limits: {e}"));
                        None
                    }
                })
        };
        gate.session_rate = parse(&rates.session);
        gate.tool_rate = parse(&rates.tool);
    }
    if let Some(audit) = &file.audit {
        gate.audit_include_input = audit.include_input.as_ref().is_some_and(|v| *v.get_ref());
        if gate.audit_include_input
            && let Some(v) = &audit.include_input
        {
            c.warning(
                v.span(),
                "audit.include_input puts tool arguments (which may hold secrets) in audit records",
            );
        }
    }
    if let Some(approvals) = &file.approvals {
        if let Some(ttl) = approvals
            .ttl
            .as_ref()
            .and_then(|t| c.duration(t, "approvals.ttl"))
        {
            gate.approval_ttl = ttl;
        }
        if let Some(max) = approvals
            .max_pending
            .as_ref()
            .and_then(|m| c.integer(m, "approvals.max_pending", (1, 1_000_000)))
        {
            gate.max_pending_approvals = usize::try_from(max).unwrap_or(1_000_000);
        }
    }
    gate
}
