use std::collections::{BTreeMap, BTreeSet};

use serde::de::DeserializeOwned;

use super::*;
use crate::model;

fn schema() -> &'static Value {
    SCHEMA.as_ref().unwrap()
}

/// Every closed table the schema describes, by a path like `profiles.*.limits` or
/// `rules[]`, with its known keys: what the walk will hold a document to.
fn closed_tables() -> BTreeMap<String, BTreeSet<String>> {
    fn visit(node: &Value, path: String, out: &mut BTreeMap<String, BTreeSet<String>>) {
        let root = schema();
        let keys = table_keys(root, node);
        if let Extra::Refused = keys.extra {
            let known = keys.known.keys().map(|k| (*k).to_string()).collect();
            out.insert(path.clone(), known);
        }
        let join = |name: &str| {
            if path.is_empty() {
                name.to_string()
            } else {
                format!("{path}.{name}")
            }
        };
        for (name, child) in &keys.known {
            visit(child, join(name), out);
            if let Some(items) = resolve(root, child).get("items") {
                visit(items, format!("{}[]", join(name)), out);
            }
        }
        if let Extra::Each(child) = keys.extra {
            visit(child, join("*"), out);
        }
    }
    let mut out = BTreeMap::new();
    visit(schema(), String::new(), &mut out);
    out
}

/// The fields serde accepts for `T`, read from its `deny_unknown_fields` error.
fn serde_fields<T: DeserializeOwned + std::fmt::Debug>() -> BTreeSet<String> {
    let err = toml::from_str::<T>("zz_not_a_key = 1").unwrap_err();
    let message = err.message();
    assert!(
        message.starts_with("unknown field `zz_not_a_key`"),
        "{message}"
    );
    message
        .split('`')
        .skip(3)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_schema_and_the_serde_model_know_the_same_keys_in_every_table() {
    let model: BTreeMap<&str, BTreeSet<String>> = BTreeMap::from([
        ("", serde_fields::<model::PolicyFile>()),
        ("profiles.*", serde_fields::<model::ProfileFile>()),
        (
            "profiles.*.network",
            serde_fields::<model::NetworkRulesFile>(),
        ),
        ("profiles.*.syscalls", serde_fields::<model::SyscallsFile>()),
        ("profiles.*.limits", serde_fields::<model::LimitsFile>()),
        ("profiles.*.require", serde_fields::<model::RequireFile>()),
        ("tools.*", serde_fields::<model::ToolFile>()),
        ("rules[]", serde_fields::<model::RuleFile>()),
        ("rate_limits", serde_fields::<model::RateLimitsFile>()),
        ("audit", serde_fields::<model::AuditFile>()),
        ("approvals", serde_fields::<model::ApprovalsFile>()),
        ("sessions", serde_fields::<model::SessionsFile>()),
    ]);
    let schema = closed_tables();
    let schema_paths: BTreeSet<&str> = schema.keys().map(String::as_str).collect();
    let model_paths: BTreeSet<&str> = model.keys().copied().collect();
    assert_eq!(schema_paths, model_paths, "closed tables differ");
    for (path, keys) in &model {
        assert_eq!(&schema[*path], keys, "keys of `{path}` differ");
    }
}

#[test]
fn the_embedded_schema_parses() {
    assert!(SCHEMA.is_some());
}

#[test]
fn edit_distance_counts_a_swap_as_one_edit() {
    assert_eq!(edit_distance("memroy", "memory"), 1);
    assert_eq!(edit_distance("", "abc"), 3);
    assert_eq!(edit_distance("abc", ""), 3);
    assert_eq!(edit_distance("timout", "timeout"), 1);
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("é", "e"), 1);
}

#[test]
fn suggestions_pick_the_nearest_close_key_only() {
    let known = ["memory", "pids", "timeout", "cpu", "cpu_quota"];
    assert_eq!(suggestion("memroy", known.into_iter()), Some("memory"));
    assert_eq!(suggestion("pid", known.into_iter()), Some("pids"));
    assert_eq!(
        suggestion("cpu_qouta", known.into_iter()),
        Some("cpu_quota")
    );
    assert_eq!(suggestion("frobnicate", known.into_iter()), None);
    assert_eq!(suggestion("xyz", known.into_iter()), None);
    let long = "m".repeat(10_000);
    assert_eq!(suggestion(&long, known.into_iter()), None);
}

#[test]
fn a_document_nested_deeper_than_the_schema_is_walked_without_trouble() {
    let deep_table = (0..30)
        .map(|i| format!("k{i}"))
        .collect::<Vec<_>>()
        .join(".");
    let text = format!(
        "version = 1\n[profiles.p]\nread = {}{}\n[profiles.p.env.{deep_table}]\n",
        "[".repeat(30),
        "]".repeat(30)
    );
    let mut root = DeTable::parse(&text).unwrap();
    let found = remove_unknown_keys(&mut root, Source::new("p.toml", &text));
    assert!(found.is_empty(), "{found:?}");
}
