//! Unknown keywords inside a tool's `input` and `output` JSON Schemas.
//!
//! JSON Schema ignores keywords it does not know, so `patern` or `maxlength` in a tool's
//! schema silently drops the constraint the author wrote. The walk goes through every place
//! that holds a schema, as the schema's dialect defines them, and reports each key there
//! that is not one of the dialect's keywords. Keys in other places are names (under
//! `properties`, `$defs`, ...) or data (`enum`, `const`, `default`, `examples`, ...) and may
//! be anything. Keys starting with `x-` are extensions, left to the tools that read them.
//!
//! Draft-07 also ignores every keyword beside a `$ref` (2020-12 applies them), so
//! `{"$ref": ..., "maxLength": 8}` checks no length there: such a keyword is reported too,
//! unless it only annotates or holds definitions a `$ref` may point into.

use std::ops::Range;

use toml::de::{DeTable, DeValue};

use super::{printable, suggestion};

/// The schema dialects a tool schema may use (`$schema`; 2020-12 when absent).
#[derive(Debug, Clone, Copy)]
enum Dialect {
    Draft7,
    Draft202012,
}

impl Dialect {
    fn name(self) -> &'static str {
        match self {
            Dialect::Draft7 => "draft-07",
            Dialect::Draft202012 => "2020-12",
        }
    }

    fn keywords(self) -> &'static [&'static str] {
        match self {
            Dialect::Draft7 => DRAFT_07,
            Dialect::Draft202012 => DRAFT_2020_12,
        }
    }
}

/// Draft-07: core, validation (with format and content) and the meta-data keywords. `$defs`
/// is kept: a `$ref` reaches it by its JSON pointer like any location, and schemas written
/// for newer drafts keep their definitions there.
const DRAFT_07: &[&str] = &[
    "$schema",
    "$id",
    "$ref",
    "$comment",
    "definitions",
    "$defs",
    "title",
    "description",
    "default",
    "readOnly",
    "writeOnly",
    "examples",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "additionalItems",
    "items",
    "maxItems",
    "minItems",
    "uniqueItems",
    "contains",
    "maxProperties",
    "minProperties",
    "required",
    "additionalProperties",
    "properties",
    "patternProperties",
    "dependencies",
    "propertyNames",
    "const",
    "enum",
    "type",
    "format",
    "contentMediaType",
    "contentEncoding",
    "if",
    "then",
    "else",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
];

/// 2020-12: the core, applicator, unevaluated, validation, meta-data, format-annotation and
/// content vocabularies. `definitions` is kept: a `$ref` reaches it by its JSON pointer like
/// any location, and schemas written for older drafts keep their definitions there.
const DRAFT_2020_12: &[&str] = &[
    "$schema",
    "$id",
    "$ref",
    "$anchor",
    "$dynamicRef",
    "$dynamicAnchor",
    "$vocabulary",
    "$comment",
    "$defs",
    "definitions",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "prefixItems",
    "items",
    "contains",
    "properties",
    "patternProperties",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "type",
    "enum",
    "const",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "maxContains",
    "minContains",
    "maxProperties",
    "minProperties",
    "required",
    "dependentRequired",
    "title",
    "description",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
    "examples",
    "format",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
];

/// Draft-07 keywords that may stand beside a `$ref` although draft-07 ignores them there:
/// they constrain nothing, and `definitions` beside a root `$ref` is where it points.
const BESIDE_REF_07: &[&str] = &[
    "$ref",
    "$schema",
    "$id",
    "$comment",
    "definitions",
    "$defs",
    "title",
    "description",
    "default",
    "examples",
    "readOnly",
    "writeOnly",
];

/// Keywords whose value is one schema (`items` may also be an array of them, in draft-07).
const ONE_SCHEMA: &[&str] = &[
    "additionalItems",
    "items",
    "contains",
    "additionalProperties",
    "propertyNames",
    "if",
    "then",
    "else",
    "not",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
];

/// Keywords whose value is an array of schemas.
const SCHEMA_ARRAYS: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems", "items"];

/// Keywords whose value maps names to schemas (`dependencies` values may also be arrays of
/// names, which are data).
const SCHEMA_MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

/// Nesting deeper than this is not walked: the document's own depth must not drive the
/// recursion unbounded, and no real tool schema comes near it.
const MAX_DEPTH: usize = 64;

/// Every key of the schema `root` (the value of `input` or `output` at `path`) that sits
/// where a keyword goes but is not one, or that the dialect ignores where it stands:
/// (message, key span). Nothing when the dialect is
/// not one airlock supports; compiling the schema reports that.
pub(super) fn unknown_keywords(root: &DeValue<'_>, path: &str) -> Vec<(String, Range<usize>)> {
    let DeValue::Table(table) = root else {
        return Vec::new();
    };
    let dialect = match table.get("$schema").map(|v| v.get_ref()) {
        None => Dialect::Draft202012,
        Some(DeValue::String(uri)) => match uri.trim_end_matches('#') {
            "http://json-schema.org/draft-07/schema"
            | "https://json-schema.org/draft-07/schema" => Dialect::Draft7,
            "https://json-schema.org/draft/2020-12/schema" => Dialect::Draft202012,
            _ => return Vec::new(),
        },
        Some(_) => return Vec::new(),
    };
    let mut found = Vec::new();
    schema(table, dialect, path, 0, &mut found);
    found
}

fn schema(
    table: &DeTable<'_>,
    dialect: Dialect,
    path: &str,
    depth: usize,
    found: &mut Vec<(String, Range<usize>)>,
) {
    if depth > MAX_DEPTH {
        return;
    }
    let keywords = dialect.keywords();
    let ignores_siblings = matches!(dialect, Dialect::Draft7) && table.contains_key("$ref");
    for (key, value) in table {
        let name: &str = key.get_ref();
        if ignores_siblings && keywords.contains(&name) && !BESIDE_REF_07.contains(&name) {
            found.push((
                format!(
                    "`{}` in `{path}` stands beside a `$ref`, where JSON Schema draft-07 ignores it: \
                     it checks nothing there; put the `$ref` and it in an `allOf`, or use 2020-12",
                    printable(name)
                ),
                key.span(),
            ));
            continue;
        }
        if !keywords.contains(&name) {
            if !name.starts_with("x-") {
                let mut message = format!(
                    "unknown key `{}` in `{path}`: not a keyword of JSON Schema {}",
                    printable(name),
                    dialect.name()
                );
                if let Some(close) = suggestion(name, keywords.iter().copied()) {
                    message.push_str(&format!("; did you mean `{close}`?"));
                }
                found.push((message, key.span()));
            }
            continue;
        }
        let here = format!("{path}.{}", printable(name));
        match value.get_ref() {
            DeValue::Table(sub) if ONE_SCHEMA.contains(&name) => {
                schema(sub, dialect, &here, depth + 1, found);
            }
            DeValue::Array(items) if SCHEMA_ARRAYS.contains(&name) => {
                for (index, item) in items.iter().enumerate() {
                    if let DeValue::Table(sub) = item.get_ref() {
                        schema(sub, dialect, &format!("{here}[{index}]"), depth + 1, found);
                    }
                }
            }
            DeValue::Table(named) if SCHEMA_MAPS.contains(&name) => {
                for (child, sub) in named {
                    if let DeValue::Table(sub) = sub.get_ref() {
                        let at = format!("{here}.{}", printable(child.get_ref()));
                        schema(sub, dialect, &at, depth + 1, found);
                    }
                }
            }
            _ => {}
        }
    }
}
