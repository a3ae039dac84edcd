//! `strict_objects`: closes object schemas so that a model cannot pass properties nobody
//! declared, without changing what `allOf`, `anyOf`, `oneOf`, `$ref` or `if` mean.
//!
//! Giving every object-shaped subschema `additionalProperties: false` is wrong under
//! composition: that keyword sees only the `properties` beside it, so `allOf: [{properties:
//! {a}}, {properties: {b}}]` would refuse every input that has both. Instead each object is
//! closed once, where its value is described: at the root and at each child position
//! (`properties/*`, `items`, ...). A plain schema there gets `additionalProperties: false`;
//! one whose properties come from subschemas applied in place (`allOf`, `anyOf`, `oneOf`,
//! `$ref`, `if`/`then`/`else`, `dependentSchemas`) gets `unevaluatedProperties: false`
//! (2020-12), which accepts every property a passing subschema declared. draft-07 has no
//! such keyword, so there those objects stay open. Subschemas applied in place are never
//! closed themselves, except a `$ref` target whose every use is a bare `{"$ref": ...}`.
//!
//! Nothing used under `not`, `if`, `contains` or `propertyNames` is rewritten: those are
//! conditions, and a stricter condition lets *more* input through (`not` of a closed object
//! accepts what `not` of the open one refused). A schema with a `$ref` that cannot be
//! followed here (by `$id`, `$dynamicRef`, ...) is left as written. Every place where the
//! rewrite is not plain `additionalProperties: false` comes back as a [`StrictNote`], which
//! `airlock check` reports as a warning.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

use crate::schema::Dialect;

/// Where strictness changes a schema's meaning, or could not be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StrictNote {
    /// Closed with `unevaluatedProperties: false`: its properties come from composition.
    ClosedAcrossComposition {
        /// JSON pointer of the closed schema.
        at: String,
    },
    /// Closed although it declares no properties: only an empty object passes now.
    ClosedEmpty {
        /// JSON pointer of the closed schema.
        at: String,
    },
    /// Closed inside a `oneOf` branch: an input that matched several branches (and was
    /// refused) may now match exactly one (and be accepted).
    ClosedInOneOf {
        /// JSON pointer of the closed schema.
        at: String,
    },
    /// Left open, and why.
    LeftOpen {
        /// JSON pointer of the schema left open.
        at: String,
        /// Why closing it would be wrong.
        reason: OpenReason,
    },
}

/// Why an object schema was left open under `strict_objects`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenReason {
    /// draft-07 cannot close an object whose properties come from composition.
    Draft7Composition,
    /// A `$ref` uses it beside other keywords or inside a composition.
    SharedRefTarget,
    /// A `$ref` uses it under `not`, `if`, `contains` or `propertyNames`.
    UsedInCondition,
    /// This `$ref` cannot be followed here, so nothing in the schema was rewritten.
    UnresolvedRef(String),
    /// A nested `$id` changes what the document's `$ref`s name, so nothing was rewritten.
    NestedId,
}

fn place(at: &str) -> String {
    if at.is_empty() {
        "the schema root".to_string()
    } else {
        format!("`{at}`")
    }
}

impl fmt::Display for StrictNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StrictNote::ClosedAcrossComposition { at } => write!(
                f,
                "strict_objects closes {} with unevaluatedProperties = false, because its \
                 properties come from allOf/anyOf/oneOf/$ref/if: a property that no passing \
                 subschema declares is refused",
                place(at)
            ),
            StrictNote::ClosedEmpty { at } => write!(
                f,
                "strict_objects closes {}, which declares no properties: only an empty object \
                 passes (set additionalProperties = true to keep it open, or properties = {{}} \
                 if that is the point)",
                place(at)
            ),
            StrictNote::ClosedInOneOf { at } => write!(
                f,
                "strict_objects closes {} inside a oneOf branch: an input that matched several \
                 branches (and was refused) may now match exactly one (and be accepted)",
                place(at)
            ),
            StrictNote::LeftOpen { at, reason } => {
                let why = match reason {
                    OpenReason::Draft7Composition => {
                        "draft-07 has no unevaluatedProperties, and closing each subschema of \
                         its allOf/anyOf/oneOf/$ref/if would refuse valid input (use 2020-12, \
                         or set additionalProperties yourself)"
                            .to_string()
                    }
                    OpenReason::SharedRefTarget => {
                        "a $ref uses it beside other keywords or inside allOf/anyOf/oneOf, where \
                         closing it would refuse properties declared next to that $ref"
                            .to_string()
                    }
                    OpenReason::UsedInCondition => {
                        "a $ref uses it under not/if/contains/propertyNames, where a stricter \
                         schema lets more input through"
                            .to_string()
                    }
                    OpenReason::NestedId => "a nested $id changes what its $refs name, so no \
                                             object in this schema is closed"
                        .to_string(),
                    OpenReason::UnresolvedRef(reference) => format!(
                        "$ref {reference:?} cannot be followed here, so no object in this schema \
                         is closed"
                    ),
                };
                write!(f, "strict_objects leaves {} open: {why}", place(at))
            }
        }
    }
}

/// How a subschema is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Describes a value of its own: the root, `properties/*`, `items`, ...
    Instance,
    /// Applied in place to its parent's value: `allOf/*`, `then`, ...
    InPlace,
    /// A definition, applied only where a `$ref` names it.
    Def,
    /// Part of a condition (`not`, `if`, `contains`, `propertyNames`): never rewritten.
    Inert,
}

/// One schema object of the document.
#[derive(Debug)]
struct Node<'a> {
    at: String,
    schema: &'a Map<String, Value>,
    role: Role,
    in_one_of: bool,
}

/// Keywords through which other subschemas add properties to a schema's own value.
const IN_PLACE: &[&str] = &[
    "allOf",
    "anyOf",
    "oneOf",
    "$ref",
    "$dynamicRef",
    "$recursiveRef",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependencies",
];

/// Keywords that name another schema.
const REFERENCES: [&str; 3] = ["$ref", "$dynamicRef", "$recursiveRef"];

/// Keywords that declare or evaluate properties of a schema's own value.
const PROPERTY_KEYWORDS: &[&str] = &[
    "properties",
    "patternProperties",
    "additionalProperties",
    "unevaluatedProperties",
];

fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

fn collect<'a>(value: &'a Value, at: String, role: Role, in_one_of: bool, out: &mut Vec<Node<'a>>) {
    let Value::Object(schema) = value else {
        return;
    };
    let child = |wanted: Role| {
        if role == Role::Inert {
            Role::Inert
        } else {
            wanted
        }
    };
    for (key, sub) in schema {
        let here = format!("{at}/{}", escape(key));
        let each = |out: &mut Vec<Node<'a>>, role: Role, one_of: bool| match sub {
            Value::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    collect(item, format!("{here}/{index}"), role, one_of, out);
                }
            }
            Value::Object(map) => {
                for (name, item) in map {
                    collect(item, format!("{here}/{}", escape(name)), role, one_of, out);
                }
            }
            _ => {}
        };
        match key.as_str() {
            "properties" | "patternProperties" | "prefixItems" => {
                each(out, child(Role::Instance), in_one_of);
            }
            "items" if sub.is_array() => each(out, child(Role::Instance), in_one_of),
            "items"
            | "additionalProperties"
            | "unevaluatedProperties"
            | "additionalItems"
            | "unevaluatedItems" => collect(sub, here, child(Role::Instance), in_one_of, out),
            "allOf" | "anyOf" | "dependentSchemas" | "dependencies" => {
                each(out, child(Role::InPlace), in_one_of);
            }
            "oneOf" => each(out, child(Role::InPlace), true),
            "then" | "else" => collect(sub, here, child(Role::InPlace), in_one_of, out),
            "$defs" | "definitions" => each(out, Role::Def, false),
            "not" | "if" | "contains" | "propertyNames" => {
                collect(sub, here, Role::Inert, in_one_of, out);
            }
            _ => {}
        }
    }
    out.push(Node {
        at,
        schema,
        role,
        in_one_of,
    });
}

/// `%XX` escapes of a URI fragment decoded; `None` when they do not decode to UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = text.get(index + 1..index + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The JSON pointer a local `$ref` names: `#`, `#/json/pointer` or `#anchor`.
fn resolve(reference: &str, root: &Value, nodes: &[Node<'_>]) -> Option<String> {
    let fragment = percent_decode(reference.strip_prefix('#')?)?;
    if fragment.is_empty() || fragment.starts_with('/') {
        return root.pointer(&fragment).map(|_| fragment);
    }
    nodes
        .iter()
        .find(|n| n.schema.get("$anchor").and_then(Value::as_str) == Some(fragment.as_str()))
        .map(|n| n.at.clone())
}

fn is_under(at: &str, base: &str) -> bool {
    base.is_empty() || at == base || at.starts_with(&format!("{base}/"))
}

/// What a schema and the subschemas applied in place to its value say about objects.
#[derive(Debug, Default)]
struct Shape {
    /// Some part describes an object (`properties`, or `type` naming `object`).
    object: bool,
    /// Some part declares properties (or, with an empty `properties`, declares none on
    /// purpose) or opens them.
    declares: bool,
}

fn shape(
    schema: &Map<String, Value>,
    root: &Value,
    refs: &BTreeMap<String, String>,
    at: &str,
    seen: &mut BTreeSet<String>,
    into: &mut Shape,
) {
    if !seen.insert(at.to_string()) {
        return;
    }
    let names_object = match schema.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(types)) => types.iter().any(|t| t == "object"),
        _ => false,
    };
    into.object |= names_object || schema.contains_key("properties");
    // An explicit `properties = {}` says "no properties" on purpose.
    into.declares |= schema.contains_key("properties")
        || PROPERTY_KEYWORDS[1..].iter().any(|k| match schema.get(*k) {
            Some(Value::Object(map)) => !map.is_empty(),
            Some(Value::Bool(false)) | None => false,
            Some(_) => true,
        });
    let mut visit = |sub: &Value, sub_at: String, into: &mut Shape| {
        if let Value::Object(map) = sub {
            shape(map, root, refs, &sub_at, seen, into);
        }
    };
    for key in [
        "allOf",
        "anyOf",
        "oneOf",
        "if",
        "then",
        "else",
        "dependentSchemas",
        "dependencies",
    ] {
        match schema.get(key) {
            Some(Value::Array(items)) => {
                for (index, item) in items.iter().enumerate() {
                    visit(item, format!("{at}/{key}/{index}"), into);
                }
            }
            Some(Value::Object(map)) if matches!(key, "dependentSchemas" | "dependencies") => {
                for (name, item) in map {
                    visit(item, format!("{at}/{key}/{}", escape(name)), into);
                }
            }
            Some(sub @ Value::Object(_)) => visit(sub, format!("{at}/{key}"), into),
            _ => {}
        }
    }
    if let Some(target) = refs.get(at)
        && let Some(sub) = root.pointer(target)
    {
        visit(sub, target.clone(), into);
    }
}

/// A use of a `$ref` target.
#[derive(Debug)]
struct Use {
    /// The referring schema is at a child position and adds nothing about properties.
    bare: bool,
    in_one_of: bool,
}

/// The schema `strict_objects` enforces and publishes for `schema`, and where it differs
/// from closing each object with `additionalProperties: false`.
pub fn close_objects(schema: &Value, dialect: Dialect) -> (Value, Vec<StrictNote>) {
    let mut nodes = Vec::new();
    collect(schema, String::new(), Role::Instance, false, &mut nodes);

    // Every `$ref` resolved to a pointer, or nothing is rewritten.
    let has_refs = nodes
        .iter()
        .any(|n| REFERENCES.iter().any(|k| n.schema.contains_key(*k)));
    if let Some(nested) = nodes
        .iter()
        .find(|n| !n.at.is_empty() && n.schema.contains_key("$id"))
        && has_refs
    {
        let note = StrictNote::LeftOpen {
            at: nested.at.clone(),
            reason: OpenReason::NestedId,
        };
        return (schema.clone(), vec![note]);
    }
    let mut refs: BTreeMap<String, String> = BTreeMap::new();
    for node in &nodes {
        for key in REFERENCES {
            let Some(reference) = node.schema.get(key) else {
                continue;
            };
            let reference = reference.as_str().unwrap_or_default();
            let target = (key == "$ref")
                .then(|| resolve(reference, schema, &nodes))
                .flatten();
            match target {
                Some(target) => {
                    refs.insert(node.at.clone(), target);
                }
                None => {
                    let note = StrictNote::LeftOpen {
                        at: node.at.clone(),
                        reason: OpenReason::UnresolvedRef(reference.to_string()),
                    };
                    return (schema.clone(), vec![note]);
                }
            }
        }
    }

    // Targets used in a condition are conditions too, and so is everything they refer to.
    let mut inert: BTreeSet<String> = BTreeSet::new();
    loop {
        let before = inert.len();
        for node in &nodes {
            let Some(target) = refs.get(&node.at) else {
                continue;
            };
            if node.role == Role::Inert || inert.iter().any(|base| is_under(&node.at, base)) {
                inert.insert(target.clone());
            }
        }
        if inert.len() == before {
            break;
        }
    }
    let role_of = |node: &Node<'_>| {
        if inert.iter().any(|base| is_under(&node.at, base)) {
            Role::Inert
        } else {
            node.role
        }
    };

    let mut uses: BTreeMap<&str, Vec<Use>> = BTreeMap::new();
    for node in &nodes {
        if let Some(target) = refs.get(&node.at) {
            let bare = role_of(node) == Role::Instance
                && !node.schema.keys().any(|k| {
                    k != "$ref"
                        && (IN_PLACE.contains(&k.as_str())
                            || PROPERTY_KEYWORDS.contains(&k.as_str()))
                });
            uses.entry(target.as_str()).or_default().push(Use {
                bare,
                in_one_of: node.in_one_of,
            });
        }
    }
    let closable_target = |at: &str| uses.get(at).is_some_and(|u| u.iter().all(|u| u.bare));

    let mut closed = schema.clone();
    let mut notes = Vec::new();
    for node in &nodes {
        let role = role_of(node);
        let target_uses = uses.get(node.at.as_str());
        let object_shape = || {
            let mut found = Shape::default();
            shape(
                node.schema,
                schema,
                &refs,
                &node.at,
                &mut BTreeSet::new(),
                &mut found,
            );
            found
        };
        let open = |reason| StrictNote::LeftOpen {
            at: node.at.clone(),
            reason,
        };
        match (role, target_uses) {
            (Role::Inert, Some(_)) if node.role == Role::Instance && object_shape().object => {
                notes.push(open(OpenReason::UsedInCondition));
                continue;
            }
            (Role::Instance | Role::Def, Some(_)) if !closable_target(&node.at) => {
                if node.role == Role::Instance && object_shape().object {
                    notes.push(open(OpenReason::SharedRefTarget));
                }
                continue;
            }
            (Role::Instance, _) | (Role::Def, Some(_)) => {}
            _ => continue,
        }
        if [
            "additionalProperties",
            "unevaluatedProperties",
            "patternProperties",
        ]
        .iter()
        .any(|k| node.schema.contains_key(*k))
        {
            continue;
        }
        // A bare `{"$ref": ...}` whose target is closed is closed by its target.
        if let Some(target) = refs.get(&node.at)
            && closable_target(target)
            && node.schema.keys().all(|k| {
                k == "$ref"
                    || !(IN_PLACE.contains(&k.as_str()) || PROPERTY_KEYWORDS.contains(&k.as_str()))
            })
        {
            continue;
        }
        let found = object_shape();
        if !found.object {
            continue;
        }
        let composed = node.schema.keys().any(|k| IN_PLACE.contains(&k.as_str()));
        let keyword = match (composed, dialect) {
            (false, _) => "additionalProperties",
            (true, Dialect::Draft202012) => {
                notes.push(StrictNote::ClosedAcrossComposition {
                    at: node.at.clone(),
                });
                "unevaluatedProperties"
            }
            (true, Dialect::Draft7) => {
                notes.push(open(OpenReason::Draft7Composition));
                continue;
            }
        };
        if let Some(Value::Object(map)) = closed.pointer_mut(&node.at) {
            map.insert(keyword.to_string(), Value::Bool(false));
        }
        if !found.declares {
            notes.push(StrictNote::ClosedEmpty {
                at: node.at.clone(),
            });
        }
        if node.in_one_of || target_uses.is_some_and(|u| u.iter().any(|u| u.in_one_of)) {
            notes.push(StrictNote::ClosedInOneOf {
                at: node.at.clone(),
            });
        }
    }
    notes.sort_by(|a, b| note_at(a).cmp(note_at(b)));
    (closed, notes)
}

fn note_at(note: &StrictNote) -> &str {
    match note {
        StrictNote::ClosedAcrossComposition { at }
        | StrictNote::ClosedEmpty { at }
        | StrictNote::ClosedInOneOf { at }
        | StrictNote::LeftOpen { at, .. } => at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{InputError, InputLimits, compile_schema};
    use serde_json::json;

    fn strict(schema: &Value) -> (Value, Vec<StrictNote>) {
        close_objects(schema, crate::schema::dialect(schema).unwrap())
    }

    /// Whether the strict form of `schema` accepts `input`.
    fn accepts(schema: &Value, input: Value) -> bool {
        compile_schema(&strict(schema).0)
            .unwrap()
            .check_value(&input)
            .is_ok()
    }

    #[test]
    fn plain_objects_are_closed_at_every_child_position_and_nothing_else_is_touched() {
        let schema = json!({
            "type": "object",
            "properties": {
                "inner": {"type": "object", "properties": {"a": {"type": "string"}}},
                "open": {"type": "object", "additionalProperties": true},
                "list": {"type": "array", "items": {"properties": {"b": {}}}},
                "c": {"const": {"properties": {}}},
                // A property *named* like keywords is a property, not a schema keyword.
                "properties": {"type": "object", "properties": {"type": {"const": "object"}}}
            }
        });
        let (closed, notes) = strict(&schema);
        assert_eq!(notes, vec![]);
        assert_eq!(closed["additionalProperties"], json!(false));
        let properties = &closed["properties"];
        assert_eq!(properties["inner"]["additionalProperties"], json!(false));
        assert_eq!(properties["open"]["additionalProperties"], json!(true));
        assert_eq!(
            properties["list"]["items"]["additionalProperties"],
            json!(false)
        );
        assert_eq!(properties["c"]["const"], json!({"properties": {}}));
        assert_eq!(
            properties["properties"]["properties"],
            json!({"type": {"const": "object"}})
        );
        assert!(properties.get("additionalProperties").is_none());

        let compiled = compile_schema(&closed).unwrap();
        let err = compiled
            .check_text(r#"{"extra_secret_key": 1}"#, InputLimits::default())
            .unwrap_err();
        let InputError::Schema { violations, .. } = err else {
            panic!()
        };
        assert_eq!(violations[0].keyword, "additionalProperties");
        assert_eq!(violations[0].message, "1 unexpected property");
    }

    #[test]
    fn all_of_stays_satisfiable_and_refuses_only_undeclared_properties() {
        let schema = json!({
            "type": "object",
            "allOf": [
                {"properties": {"a": {"type": "string"}}, "required": ["a"]},
                {"properties": {"b": {"type": "integer"}}, "required": ["b"]}
            ]
        });
        assert!(accepts(&schema, json!({"a": "x", "b": 1})));
        assert!(!accepts(&schema, json!({"a": "x", "b": 1, "c": true})));
        assert!(!accepts(&schema, json!({"a": "x"})));
        let (closed, notes) = strict(&schema);
        assert_eq!(closed["unevaluatedProperties"], json!(false));
        assert!(closed["allOf"][0].get("additionalProperties").is_none());
        assert_eq!(
            notes,
            vec![StrictNote::ClosedAcrossComposition { at: String::new() }]
        );
        assert!(notes[0].to_string().contains("the schema root"));
    }

    #[test]
    fn any_of_branches_stay_open_to_each_other_and_one_of_discriminates() {
        let schema = json!({
            "type": "object",
            "anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]
        });
        assert!(accepts(&schema, json!({"a": 1})));
        assert!(accepts(&schema, json!({"a": 1, "b": 2})));
        assert!(!accepts(&schema, json!({"a": 1, "z": 2})));

        let tagged = json!({
            "type": "object",
            "properties": {"kind": {"enum": ["x", "y"]}},
            "required": ["kind"],
            "oneOf": [
                {"properties": {"kind": {"const": "x"}, "x": {"type": "string"}}},
                {"properties": {"kind": {"const": "y"}, "y": {"type": "string"}}}
            ]
        });
        assert!(accepts(&tagged, json!({"kind": "x", "x": "1"})));
        // `y` belongs to the branch that did not pass.
        assert!(!accepts(&tagged, json!({"kind": "x", "y": "1"})));
    }

    #[test]
    fn a_ref_with_more_properties_beside_it_accepts_both() {
        let schema = json!({
            "$defs": {"base": {"type": "object", "properties": {"a": {"type": "string"}}}},
            "type": "object",
            "$ref": "#/$defs/base",
            "properties": {"b": {"type": "string"}}
        });
        assert!(accepts(&schema, json!({"a": "1", "b": "2"})));
        assert!(!accepts(&schema, json!({"a": "1", "c": "2"})));
        let (closed, _) = strict(&schema);
        assert!(
            closed["$defs"]["base"]
                .get("additionalProperties")
                .is_none()
        );
    }

    #[test]
    fn a_definition_used_only_by_bare_refs_is_closed_itself_even_in_draft_07() {
        let schema = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"point": {"type": "object", "properties": {"x": {}, "y": {}}}},
            "type": "object",
            "properties": {"from": {"$ref": "#/definitions/point"}, "to": {"$ref": "#/definitions/point"}}
        });
        let (closed, notes) = strict(&schema);
        assert_eq!(notes, vec![]);
        assert_eq!(
            closed["definitions"]["point"]["additionalProperties"],
            json!(false)
        );
        assert!(accepts(&schema, json!({"from": {"x": 1}, "to": {"y": 2}})));
        assert!(!accepts(&schema, json!({"from": {"x": 1, "z": 3}})));
        // Recursion through the root works the same way.
        let tree = json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}
        });
        assert_eq!(strict(&tree).1, vec![]);
        assert!(accepts(
            &tree,
            json!({"name": "a", "children": [{"name": "b"}]})
        ));
        assert!(!accepts(
            &tree,
            json!({"name": "a", "children": [{"nam": "b"}]})
        ));
    }

    #[test]
    fn draft_07_composition_is_left_open_and_said_so() {
        let schema = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]
        });
        assert!(accepts(&schema, json!({"a": 1, "b": 2})));
        let (closed, notes) = strict(&schema);
        assert_eq!(closed, schema);
        assert_eq!(
            notes,
            vec![StrictNote::LeftOpen {
                at: String::new(),
                reason: OpenReason::Draft7Composition
            }]
        );
    }

    #[test]
    fn conditions_are_never_made_stricter_so_not_lets_nothing_more_through() {
        // Un-strict, `not` refuses any `cfg` with x = 1; closing `cfg` inside the `not`
        // would let {x: 1, y: 2} through.
        let schema = json!({
            "type": "object",
            "properties": {"cfg": {"type": "object", "additionalProperties": true}},
            "not": {"properties": {"cfg": {"properties": {"x": {"const": 1}}, "required": ["x"]}}, "required": ["cfg"]}
        });
        assert!(!accepts(&schema, json!({"cfg": {"x": 1, "y": 2}})));
        assert!(accepts(&schema, json!({"cfg": {"x": 2, "y": 2}})));
        let through_ref = json!({
            "$defs": {"bad": {"type": "object", "properties": {"x": {"const": 1}}, "required": ["x"]}},
            "type": "object",
            "properties": {"cfg": {"type": "object", "additionalProperties": true}},
            "not": {"properties": {"cfg": {"$ref": "#/$defs/bad"}}, "required": ["cfg"]}
        });
        assert!(!accepts(&through_ref, json!({"cfg": {"x": 1, "y": 2}})));
        let (closed, _) = strict(&through_ref);
        assert!(closed["$defs"]["bad"].get("additionalProperties").is_none());
    }

    #[test]
    fn a_ref_target_used_beside_other_properties_is_left_open_where_it_stands() {
        let schema = json!({
            "type": "object",
            "properties": {
                "base": {"type": "object", "properties": {"a": {}}},
                "more": {"$ref": "#/properties/base", "properties": {"b": {}}}
            }
        });
        assert!(accepts(&schema, json!({"more": {"a": 1, "b": 2}})));
        assert!(!accepts(&schema, json!({"more": {"a": 1, "c": 2}})));
        let notes = strict(&schema).1;
        assert!(notes.contains(&StrictNote::LeftOpen {
            at: "/properties/base".into(),
            reason: OpenReason::SharedRefTarget
        }));
    }

    #[test]
    fn an_object_with_no_properties_is_closed_with_a_warning_unless_it_says_so() {
        let on_purpose = json!({"type": "object", "properties": {}});
        assert_eq!(strict(&on_purpose).1, vec![]);
        let schema = json!({"type": "object", "properties": {"meta": {"type": "object"}}});
        let notes = strict(&schema).1;
        assert_eq!(
            notes,
            vec![StrictNote::ClosedEmpty {
                at: "/properties/meta".into()
            }]
        );
        assert!(accepts(&schema, json!({"meta": {}})));
        assert!(!accepts(&schema, json!({"meta": {"k": 1}})));
    }

    #[test]
    fn a_ref_that_cannot_be_followed_leaves_the_schema_as_written() {
        let schema = json!({
            "type": "object",
            "properties": {"a": {"$ref": "item.json"}},
            "$defs": {"item": {"$id": "item.json", "type": "object", "properties": {"x": {}}}}
        });
        let (closed, notes) = strict(&schema);
        assert_eq!(closed, schema);
        assert!(matches!(notes.as_slice(), [StrictNote::LeftOpen { .. }]));
    }

    #[test]
    fn objects_nested_in_one_of_branches_are_closed_with_a_warning() {
        let schema = json!({
            "type": "object",
            "properties": {"k": {}},
            "oneOf": [{"properties": {"cfg": {"type": "object", "properties": {"x": {}}}}}]
        });
        let notes = strict(&schema).1;
        assert!(
            notes.contains(&StrictNote::ClosedInOneOf {
                at: "/oneOf/0/properties/cfg".into()
            }),
            "{notes:?}"
        );
    }
}
