//! The gate's settings: one check per rule family — the default decision, decision rules
//! (one function per kind of match), rate limits, audit and approval settings.
//!
//! [`check_gate`] calls the families in the order of the file's keys, which is also the order
//! diagnostics at one position come out in.

use std::collections::{BTreeMap, BTreeSet};

use toml::Spanned;

use super::rule_fields::check_pattern_field;
use super::{Checker, SideEffect, Tool};
use crate::model::{ApprovalsFile, AuditFile, PolicyFile, RateLimitsFile, RuleFile};
use crate::rules::preset_patterns;
use crate::validated::{Decision, GatePolicy, RateLimit, Rule, RuleMatch};

/// Validates the gate: rules (every tool and category they name must exist), the default
/// decision, rate limits, approval and audit settings.
pub(super) fn check_gate(
    c: &mut Checker<'_>,
    file: &PolicyFile,
    tools: &BTreeMap<String, Option<Tool>>,
) -> GatePolicy {
    let mut gate = GatePolicy::default();
    if let Some(decision) = check_default_decision(c, file.default_decision.as_ref()) {
        gate.default_decision = decision;
    }
    let categories: BTreeSet<&str> = tools
        .values()
        .flatten()
        .filter_map(|t| t.category.as_deref())
        .collect();
    for (index, rule) in file.rules.iter().enumerate() {
        if let Some(rule) = check_rule(c, index, rule, tools, &categories) {
            gate.rules.push(rule);
        }
    }
    if let Some(rates) = &file.rate_limits {
        check_rate_limits(c, rates, &mut gate);
    }
    if let Some(audit) = &file.audit {
        check_audit(c, audit, &mut gate);
    }
    if let Some(approvals) = &file.approvals {
        check_approvals(c, approvals, &mut gate);
    }
    gate
}

fn check_default_decision(
    c: &mut Checker<'_>,
    default_decision: Option<&Spanned<String>>,
) -> Option<Decision> {
    let d = default_decision?;
    let decision = Decision::from_name(d.get_ref());
    if decision.is_none() {
        c.error(
            d.span(),
            format!(
                "default_decision must be allow, deny or review, not {:?}",
                d.get_ref()
            ),
        );
    }
    decision
}

/// One entry of `rules`; `None` when what it matches is unusable (its errors are in `c`).
fn check_rule(
    c: &mut Checker<'_>,
    index: usize,
    rule: &RuleFile,
    tools: &BTreeMap<String, Option<Tool>>,
    categories: &BTreeSet<&str>,
) -> Option<Rule> {
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
    check_kind_keys(c, &name, rule);
    let matches = match rule.matches.get_ref().as_str() {
        "read_only" => Some(RuleMatch::ReadOnly),
        "side_effect" => Some(side_effect_match(c, &name, rule)),
        "tool" => Some(tool_match(c, &name, rule, tools)),
        "category" => Some(category_match(c, &name, rule, categories)),
        "pattern" => pattern_match(c, &name, rule, tools),
        other => {
            c.error(rule.matches.span(), format!("rule {name}: match must be read_only, side_effect, tool, category or pattern, not {other:?}"));
            None
        }
    }?;
    Some(Rule {
        name,
        matches,
        decision,
    })
}

/// The strings of an optional list key: none when the key is absent.
fn items(list: &Option<Spanned<Vec<Spanned<String>>>>) -> &[Spanned<String>] {
    list.as_ref().map_or(&[], |l| l.get_ref().as_slice())
}

/// Each kind of rule reads only its own keys; the rest are refused rather than ignored,
/// since an ignored key widens the rule: `match = "tool"` with `field` and `patterns` reads
/// as "this tool, for these inputs" but decides every call of the tool.
fn check_kind_keys(c: &mut Checker<'_>, name: &str, rule: &RuleFile) {
    let kind = rule.matches.get_ref().as_str();
    let (used, uses): (&[&str], &str) = match kind {
        "read_only" => (&[], "no key but name, match and decision"),
        "side_effect" => (&["side_effects"], "only side_effects"),
        "tool" => (&["tools"], "only tools"),
        "category" => (&["categories"], "only categories"),
        "pattern" => (
            &["tools", "field", "patterns", "preset"],
            "only tools, field, patterns and preset",
        ),
        // An unknown kind has its own error; which keys it would use is anyone's guess.
        _ => return,
    };
    let present = [
        ("tools", rule.tools.as_ref().map(Spanned::span)),
        ("categories", rule.categories.as_ref().map(Spanned::span)),
        (
            "side_effects",
            rule.side_effects.as_ref().map(Spanned::span),
        ),
        ("field", rule.field.as_ref().map(Spanned::span)),
        ("patterns", rule.patterns.as_ref().map(Spanned::span)),
        ("preset", rule.preset.as_ref().map(Spanned::span)),
    ];
    for (key, span) in present {
        if let Some(span) = span
            && !used.contains(&key)
        {
            let span = c.key_span(span);
            c.error(
                span,
                format!(
                    "rule {name}: {key} does not belong to a match = \"{kind}\" rule, which uses {uses}; it would be ignored"
                ),
            );
        }
    }
}

/// The rule's `tools`, each of which must exist.
fn known_tools(
    c: &mut Checker<'_>,
    name: &str,
    rule: &RuleFile,
    tools: &BTreeMap<String, Option<Tool>>,
) -> Vec<String> {
    items(&rule.tools)
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
}

/// `match = "side_effect"`: a non-empty list of known side effects.
fn side_effect_match(c: &mut Checker<'_>, name: &str, rule: &RuleFile) -> RuleMatch {
    if items(&rule.side_effects).is_empty() {
        c.error(
            rule.matches.span(),
            format!("rule {name}: match = \"side_effect\" needs side_effects = [...]"),
        );
    }
    let effects = items(&rule.side_effects)
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
    RuleMatch::SideEffects(effects)
}

/// `match = "tool"`: a non-empty list of existing tools.
fn tool_match(
    c: &mut Checker<'_>,
    name: &str,
    rule: &RuleFile,
    tools: &BTreeMap<String, Option<Tool>>,
) -> RuleMatch {
    if items(&rule.tools).is_empty() {
        c.error(
            rule.matches.span(),
            format!("rule {name}: match = \"tool\" needs tools = [...]"),
        );
    }
    RuleMatch::Tools(known_tools(c, name, rule, tools))
}

/// `match = "category"`: a non-empty list; a category no tool has is only a warning.
fn category_match(
    c: &mut Checker<'_>,
    name: &str,
    rule: &RuleFile,
    categories: &BTreeSet<&str>,
) -> RuleMatch {
    if items(&rule.categories).is_empty() {
        c.error(
            rule.matches.span(),
            format!("rule {name}: match = \"category\" needs categories = [...]"),
        );
    }
    for category in items(&rule.categories) {
        if !categories.contains(category.get_ref().as_str()) {
            c.warning(
                category.span(),
                format!("rule {name}: no tool has category {:?}", category.get_ref()),
            );
        }
    }
    RuleMatch::Categories(
        items(&rule.categories)
            .iter()
            .map(|c| c.get_ref().clone())
            .collect(),
    )
}

/// `match = "pattern"`: regexes and/or a preset over one input `field`, optionally scoped to
/// existing tools.
fn pattern_match(
    c: &mut Checker<'_>,
    name: &str,
    rule: &RuleFile,
    tools: &BTreeMap<String, Option<Tool>>,
) -> Option<RuleMatch> {
    let scoped = known_tools(c, name, rule, tools);
    let mut patterns = Vec::new();
    for pattern in items(&rule.patterns) {
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
    if items(&rule.patterns).is_empty() && rule.preset.is_none() {
        c.error(
            rule.matches.span(),
            format!("rule {name}: match = \"pattern\" needs patterns = [...] or preset"),
        );
    }
    match &rule.field {
        Some(field) => {
            check_pattern_field(c, name, field, &scoped, tools);
            Some(RuleMatch::Pattern {
                tools: scoped,
                field: field.get_ref().clone(),
                patterns,
            })
        }
        None => {
            c.error(
                rule.matches.span(),
                format!("rule {name}: match = \"pattern\" needs field = \"...\""),
            );
            None
        }
    }
}

/// `rate_limits`: the per-session bucket and the per-tool default.
fn check_rate_limits(c: &mut Checker<'_>, rates: &RateLimitsFile, gate: &mut GatePolicy) {
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

/// `audit`: whether records carry tool arguments (a warning when they do).
fn check_audit(c: &mut Checker<'_>, audit: &AuditFile, gate: &mut GatePolicy) {
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

/// `approvals`: how long a proposal lives and how many may wait.
fn check_approvals(c: &mut Checker<'_>, approvals: &ApprovalsFile, gate: &mut GatePolicy) {
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
