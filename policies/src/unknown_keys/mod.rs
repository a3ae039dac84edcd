//! Unknown keys in a policy file, all of them, each at its position.
//!
//! serde's `deny_unknown_fields` stops at the first unknown key, which hides every other
//! mistake in the file. This walk compares a parsed TOML document with the published JSON
//! schema ([`crate::presets::POLICY_FILE_SCHEMA`]), table by table, reports every key the
//! schema does not know, and removes it so that the rest of the file can still be parsed
//! and validated. The schema is the one list of keys: the walk cannot drift from what
//! editors are told, and a unit test compares it with the serde model (which keeps
//! `deny_unknown_fields` as a second line).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde_json::Value;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::diagnostic::{Diagnostic, Source};
use crate::presets::POLICY_FILE_SCHEMA;

mod schema_keywords;

/// Where the published schema describes a tool's own JSON Schemas: their keys are checked
/// against the JSON Schema dialect's keywords instead (`schema_keywords`).
const TOOL_SCHEMAS: [&str; 2] = [
    "/$defs/tool/properties/input",
    "/$defs/tool/properties/output",
];

/// The published schema, parsed once. `None` only if the embedded text is broken, which
/// a unit test rules out; [`remove_unknown_keys`] then refuses every policy.
static SCHEMA: LazyLock<Option<Value>> =
    LazyLock::new(|| serde_json::from_str(POLICY_FILE_SCHEMA).ok());

/// `$ref`s followed in a row, and `oneOf`/`anyOf`/`allOf` levels merged, before giving up:
/// the schema is ours and shallow, but a cycle must not hang the check.
const MAX_SCHEMA_HOPS: usize = 8;

/// Keys longer than this get no suggestion: distances cost length × length.
const MAX_SUGGESTED_KEY_CHARS: usize = 64;

/// What a table may hold besides its named keys.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Extra<'s> {
    /// Nothing (`additionalProperties = false`): any other key is a mistake.
    Refused,
    /// Any key, with a value the schema does not describe (a tool's JSON Schema).
    Anything,
    /// Any key, each value described by this schema (profiles by name, `env`, `tmpfs`).
    Each(&'s Value),
}

/// The keys a table may hold, as the schema says.
#[derive(Debug)]
pub(crate) struct TableKeys<'s> {
    /// Named keys and the schema of each value.
    pub(crate) known: BTreeMap<&'s str, &'s Value>,
    /// What other keys may be there.
    pub(crate) extra: Extra<'s>,
}

/// Follows `#/$defs/...` references (the only kind the policy schema uses).
fn resolve<'s>(root: &'s Value, mut node: &'s Value) -> &'s Value {
    for _ in 0..MAX_SCHEMA_HOPS {
        let Some(target) = node.get("$ref").and_then(Value::as_str) else {
            break;
        };
        let Some(found) = target
            .strip_prefix('#')
            .and_then(|pointer| root.pointer(pointer))
        else {
            break;
        };
        node = found;
    }
    node
}

/// The keys a table described by `node` may hold. Alternatives (`oneOf`, `anyOf`, `allOf`)
/// are merged: `network` is one of two closed tables, and a key either of them names is
/// not a typo (mixing them is a validation error). A table is closed when the schema or
/// one of its alternatives says `additionalProperties = false`.
pub(crate) fn table_keys<'s>(root: &'s Value, node: &'s Value) -> TableKeys<'s> {
    let mut keys = TableKeys {
        known: BTreeMap::new(),
        extra: Extra::Anything,
    };
    merge(root, node, &mut keys, 0);
    keys
}

fn merge<'s>(root: &'s Value, node: &'s Value, keys: &mut TableKeys<'s>, depth: usize) {
    if depth > MAX_SCHEMA_HOPS {
        return;
    }
    let node = resolve(root, node);
    if let Some(properties) = node.get("properties").and_then(Value::as_object) {
        for (name, schema) in properties {
            keys.known.entry(name.as_str()).or_insert(schema);
        }
    }
    match node.get("additionalProperties") {
        Some(Value::Bool(false)) => keys.extra = Extra::Refused,
        Some(each @ Value::Object(_)) if depth == 0 => keys.extra = Extra::Each(each),
        _ => {}
    }
    for combinator in ["oneOf", "anyOf", "allOf"] {
        for alternative in node
            .get(combinator)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            merge(root, alternative, keys, depth + 1);
        }
    }
}

/// Reports every key of `root` the schema does not know and removes it, so that the rest
/// can be deserialized. The returned errors are in file order. Any error makes the policy
/// invalid: callers must never use the pruned document without them.
pub(crate) fn remove_unknown_keys(
    root: &mut Spanned<DeTable<'_>>,
    source: Source<'_>,
) -> Vec<Diagnostic> {
    let Some(schema) = SCHEMA.as_ref() else {
        return vec![source.error(0..0, "the built-in policy schema is unreadable")];
    };
    let mut walk = Walk {
        schema,
        source,
        diagnostics: Vec::new(),
    };
    walk.table(root.get_mut(), schema, "");
    let mut diagnostics = walk.diagnostics;
    diagnostics.sort_by_key(|d| (d.line, d.column));
    diagnostics
}

struct Walk<'s, 'a> {
    schema: &'s Value,
    source: Source<'a>,
    diagnostics: Vec<Diagnostic>,
}

impl<'s> Walk<'s, '_> {
    fn table(&mut self, table: &mut DeTable<'_>, node: &'s Value, path: &str) {
        let keys = table_keys(self.schema, node);
        if let Extra::Refused = keys.extra {
            let unknown: Vec<(String, std::ops::Range<usize>)> = table
                .keys()
                .filter(|key| !keys.known.contains_key(key.get_ref().as_ref()))
                .map(|key| (key.get_ref().to_string(), key.span()))
                .collect();
            for (name, span) in unknown {
                let message = unknown_key_message(&name, path, keys.known.keys().copied());
                self.diagnostics.push(self.source.error(span, message));
                table.remove(name.as_str());
            }
        }
        for (key, value) in table.iter_mut() {
            let name: &str = key.get_ref();
            let child = match (keys.known.get(name), keys.extra) {
                (Some(&child), _) | (None, Extra::Each(child)) => child,
                _ => continue,
            };
            let child_path = if path.is_empty() {
                printable(name)
            } else {
                format!("{path}.{}", printable(name))
            };
            if TOOL_SCHEMAS.iter().any(|at| {
                self.schema
                    .pointer(at)
                    .is_some_and(|s| std::ptr::eq(s, child))
            }) {
                for (message, span) in
                    schema_keywords::unknown_keywords(value.get_ref(), &child_path)
                {
                    self.diagnostics.push(self.source.error(span, message));
                }
                continue;
            }
            self.value(value.get_mut(), child, &child_path);
        }
    }

    /// Goes into tables and arrays of tables only where the schema describes them, so the
    /// depth of the walk is bounded by the schema's, whatever the document's nesting.
    fn value(&mut self, value: &mut DeValue<'_>, node: &'s Value, path: &str) {
        match value {
            DeValue::Table(table) => self.table(table, node, path),
            DeValue::Array(items) => {
                let Some(item) = resolve(self.schema, node).get("items") else {
                    return;
                };
                for (index, element) in items.iter_mut().enumerate() {
                    self.value(element.get_mut(), item, &format!("{path}[{index}]"));
                }
            }
            _ => {}
        }
    }
}

fn unknown_key_message<'k>(name: &str, path: &str, known: impl Iterator<Item = &'k str>) -> String {
    let place = if path.is_empty() {
        "at the top level".to_string()
    } else {
        format!("in `{path}`")
    };
    let mut message = format!("unknown key `{}` {place}", printable(name));
    if let Some(close) = suggestion(name, known) {
        message.push_str(&format!("; did you mean `{close}`?"));
    }
    message
}

/// A key as it can be shown on a terminal: control characters escaped.
fn printable(name: &str) -> String {
    if name.chars().any(char::is_control) {
        name.escape_debug().to_string()
    } else {
        name.to_string()
    }
}

/// The known key closest to `name`, if it is close enough to be the one meant: at most a
/// third of the longer key's characters edited (at least one), nearest first.
pub(crate) fn suggestion<'k>(name: &str, known: impl Iterator<Item = &'k str>) -> Option<&'k str> {
    if name.chars().count() > MAX_SUGGESTED_KEY_CHARS {
        return None;
    }
    known
        .filter_map(|candidate| {
            let longer = name.chars().count().max(candidate.chars().count());
            let distance = edit_distance(name, candidate);
            (distance <= (longer / 3).max(1)).then_some((distance, candidate))
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Edits (insert, delete, substitute, swap two neighbours) that turn `a` into `b`: the
/// optimal string alignment distance, so `memroy` is one edit from `memory`.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows of the table: two rows back (for swaps), the previous one, the current.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current: Vec<usize> = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        current[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (previous[j] + 1)
                .min(current[j - 1] + 1)
                .min(previous[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(before[j - 2] + 1);
            }
            current[j] = best;
        }
        std::mem::swap(&mut before, &mut previous);
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests;
