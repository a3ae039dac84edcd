//! Tool input and output checks: size and depth limits, then JSON Schema (draft-07, 2020-12).
//!
//! Runs in the supervisor before anything is spawned. Errors carry the JSON pointer and the
//! keyword that failed, never the offending value: tool arguments are model-written and may
//! hold secrets. The `jsonschema` crate is built without default features, so a schema's
//! `$ref` can never fetch a URL or read a local file.

use serde::Serialize;
use serde_json::Value;

/// Default largest accepted input, in bytes of JSON text.
pub const DEFAULT_MAX_INPUT_BYTES: usize = 1 << 20;
/// Default deepest accepted nesting of arrays and objects.
pub const DEFAULT_MAX_DEPTH: usize = 64;

const DRAFT_07: &str = "http://json-schema.org/draft-07/schema";
const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";

/// Why a schema in a policy file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// `$schema` names a draft we do not support.
    #[error("unsupported $schema {0:?}; use draft-07 or 2020-12")]
    UnsupportedDraft(String),
    /// The schema does not compile.
    #[error("schema does not compile: {0}")]
    Invalid(String),
}

/// Limits checked before parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputLimits {
    /// Largest JSON text, bytes.
    pub max_bytes: usize,
    /// Deepest nesting of arrays and objects.
    pub max_depth: usize,
}

impl Default for InputLimits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_INPUT_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }
}

/// One schema violation, without the offending value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// JSON pointer to the offending place in the input (`""` is the whole input).
    pub path: String,
    /// The schema keyword that failed (`type`, `required`, `maxLength`, ...).
    pub keyword: String,
    /// A message built from the keyword and the schema's own operands only.
    pub message: String,
}

/// Why a tool input (or output) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum InputError {
    /// The text is larger than the limit.
    #[error("input is {size} bytes; the limit is {limit}")]
    TooLarge {
        /// Size of the text.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Arrays and objects nest deeper than the limit.
    #[error("input nests deeper than {limit} levels")]
    TooDeep {
        /// The limit.
        limit: usize,
    },
    /// The text is not JSON.
    #[error("input is not valid JSON (line {line}, column {column})")]
    NotJson {
        /// 1-based line of the syntax error.
        line: usize,
        /// 1-based column of the syntax error.
        column: usize,
    },
    /// The value does not match the schema.
    #[error("input does not match the schema: {}", summarize(.violations, *.omitted))]
    Schema {
        /// The first [`MAX_VIOLATIONS`] violations found.
        violations: Vec<Violation>,
        /// How many more there were.
        #[serde(skip_serializing_if = "is_zero")]
        omitted: usize,
    },
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Violations kept for one input. Each is answered to the client and written to the audit
/// log, and one input of a megabyte can break a schema hundreds of thousands of times: the
/// first few say what to fix.
pub const MAX_VIOLATIONS: usize = 32;

/// Longest JSON pointer kept in a violation: the pointer may name the input's own keys,
/// which can be as long as the input.
pub const MAX_POINTER_BYTES: usize = 256;

fn summarize(violations: &[Violation], omitted: usize) -> String {
    let mut text = violations
        .iter()
        .map(|v| {
            let at = if v.path.is_empty() { "/" } else { &v.path };
            format!("{at}: {}", v.message)
        })
        .collect::<Vec<_>>()
        .join("; ");
    if omitted > 0 {
        text.push_str(&format!("; and {omitted} more"));
    }
    text
}

/// A compiled schema, cheap to share between calls.
#[derive(Debug, Clone)]
pub struct CompiledSchema {
    validator: std::sync::Arc<jsonschema::Validator>,
}

/// The JSON Schema dialects policies may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// draft-07 (`$schema` = `http://json-schema.org/draft-07/schema#`).
    Draft7,
    /// 2020-12, the default when `$schema` is absent.
    Draft202012,
}

/// The dialect `$schema` names (2020-12 when absent).
pub fn dialect(schema: &Value) -> Result<Dialect, SchemaError> {
    match schema.get("$schema").and_then(Value::as_str) {
        None => Ok(Dialect::Draft202012),
        Some(uri) => {
            let uri = uri.trim_end_matches('#');
            if uri == DRAFT_07 || uri == "https://json-schema.org/draft-07/schema" {
                Ok(Dialect::Draft7)
            } else if uri == DRAFT_2020_12 {
                Ok(Dialect::Draft202012)
            } else {
                Err(SchemaError::UnsupportedDraft(uri.to_string()))
            }
        }
    }
}

/// Builds, once per process, what compiling the first schema needs besides the schema (the
/// crate's shared tables; the meta-schemas' validators are generated at build time). A
/// caller with a spare thread runs this while it reads the policy, so that it is ready when
/// the first schema is checked; loading works the same without it.
pub fn warm_up() {
    let _ = compile_schema(&serde_json::json!({ "type": "object" }));
}

/// Compiles a schema exactly as given (draft chosen by `$schema`, 2020-12 when absent).
/// `strict_objects` is applied before, by [`crate::strict::close_objects`], so that the
/// document enforced is the document published.
pub fn compile_schema(schema: &Value) -> Result<CompiledSchema, SchemaError> {
    let draft = match dialect(schema)? {
        Dialect::Draft7 => jsonschema::Draft::Draft7,
        Dialect::Draft202012 => jsonschema::Draft::Draft202012,
    };
    let validator = jsonschema::options()
        .with_draft(draft)
        .should_validate_formats(true)
        // Linear-time regexes: patterns run on model-written input.
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(schema)
        .map_err(|e| SchemaError::Invalid(e.masked().to_string()))?;
    Ok(CompiledSchema {
        validator: std::sync::Arc::new(validator),
    })
}

/// Deepest nesting of `[`/`{` in JSON text, counted outside strings, stopping early once
/// `limit` is passed (so a hostile input costs one linear scan, no recursion).
fn nesting_exceeds(text: &str, limit: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for byte in text.bytes() {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// The error's message with instance values masked. Unexpected property *names* are
/// model-written too, so those kinds get a fixed message.
fn safe_message(error: &jsonschema::ValidationError<'_>) -> String {
    use jsonschema::error::ValidationErrorKind as Kind;
    match error.kind() {
        Kind::AdditionalProperties { unexpected } | Kind::UnevaluatedProperties { unexpected } => {
            format!(
                "{} unexpected propert{}",
                unexpected.len(),
                if unexpected.len() == 1 { "y" } else { "ies" }
            )
        }
        Kind::UnevaluatedItems { unexpected } => format!("{} unexpected items", unexpected.len()),
        // The inner error's instance is the property *name*, and jsonschema prints it
        // unmasked (its masked Display of `PropertyNames` is the inner error's plain Display).
        Kind::PropertyNames { error } => format!("property name: {}", safe_message(error)),
        _ => error.masked().to_string(),
    }
}

impl CompiledSchema {
    /// Checks a parsed value and returns the first [`MAX_VIOLATIONS`] violations.
    pub fn check_value(&self, value: &Value) -> Result<(), Vec<Violation>> {
        self.violations(value).map_err(|(violations, _)| violations)
    }

    /// The first [`MAX_VIOLATIONS`] violations, and how many more there were.
    fn violations(&self, value: &Value) -> Result<(), (Vec<Violation>, usize)> {
        let mut errors = self.validator.iter_errors(value);
        let violations: Vec<Violation> = errors
            .by_ref()
            .take(MAX_VIOLATIONS)
            .map(|error| Violation {
                path: crate::text::clipped(error.instance_path().as_str(), MAX_POINTER_BYTES),
                keyword: error.kind().keyword().to_string(),
                message: safe_message(&error),
            })
            .collect();
        if violations.is_empty() {
            Ok(())
        } else {
            Err((violations, errors.count()))
        }
    }

    /// Checks JSON text: size, then depth, then syntax, then the schema. Returns the value.
    pub fn check_text(&self, text: &str, limits: InputLimits) -> Result<Value, InputError> {
        if text.len() > limits.max_bytes {
            return Err(InputError::TooLarge {
                size: text.len(),
                limit: limits.max_bytes,
            });
        }
        if nesting_exceeds(text, limits.max_depth) {
            return Err(InputError::TooDeep {
                limit: limits.max_depth,
            });
        }
        let value: Value = serde_json::from_str(text).map_err(|e| InputError::NotJson {
            line: e.line(),
            column: e.column(),
        })?;
        self.violations(&value)
            .map_err(|(violations, omitted)| InputError::Schema {
                violations,
                omitted,
            })?;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn word_count_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "text": {"type": "string", "maxLength": 10},
                "count": {"type": "integer", "minimum": 0},
                "email": {"type": "string", "format": "email"}
            },
            "required": ["text"]
        })
    }

    #[test]
    fn valid_input_is_returned_parsed() {
        let schema = compile_schema(&word_count_schema()).unwrap();
        let value = schema
            .check_text(r#"{"text": "hello"}"#, InputLimits::default())
            .unwrap();
        assert_eq!(value, json!({"text": "hello"}));
    }

    #[test]
    fn violations_name_the_pointer_and_keyword_but_never_the_value() {
        let schema = compile_schema(&word_count_schema()).unwrap();
        let secret = "hunter2-secret-value";
        let text = format!(r#"{{"text": "{secret}", "count": -5, "email": "{secret}"}}"#);
        let err = schema
            .check_text(&text, InputLimits::default())
            .unwrap_err();
        let InputError::Schema { violations, .. } = &err else {
            panic!("expected schema error, got {err:?}");
        };
        let mut found: Vec<(&str, &str)> = violations
            .iter()
            .map(|v| (v.path.as_str(), v.keyword.as_str()))
            .collect();
        found.sort();
        assert_eq!(
            found,
            vec![
                ("/count", "minimum"),
                ("/email", "format"),
                ("/text", "maxLength")
            ]
        );
        let rendered = format!(
            "{err} {:?} {}",
            violations,
            serde_json::to_string(&err).unwrap()
        );
        assert!(!rendered.contains(secret), "{rendered}");
        assert!(!rendered.contains("-5"), "{rendered}");
    }

    #[test]
    fn missing_required_field_is_reported_at_the_root() {
        let schema = compile_schema(&word_count_schema()).unwrap();
        let err = schema.check_text("{}", InputLimits::default()).unwrap_err();
        let InputError::Schema { violations, .. } = err else {
            panic!()
        };
        assert_eq!(violations[0].path, "");
        assert_eq!(violations[0].keyword, "required");
    }

    #[test]
    fn oversized_input_is_refused_before_parsing() {
        let schema = compile_schema(&word_count_schema()).unwrap();
        let limits = InputLimits {
            max_bytes: 16,
            max_depth: 64,
        };
        let err = schema
            .check_text(r#"{"text": "0123456789abc"}"#, limits)
            .unwrap_err();
        assert!(matches!(
            err,
            InputError::TooLarge {
                size: 25,
                limit: 16
            }
        ));
    }

    #[test]
    fn deep_nesting_is_refused_before_parsing() {
        let schema = compile_schema(&json!({})).unwrap();
        let deep = "[".repeat(100_000);
        let err = schema
            .check_text(&deep, InputLimits::default())
            .unwrap_err();
        assert_eq!(
            err,
            InputError::TooDeep {
                limit: DEFAULT_MAX_DEPTH
            }
        );
        // Brackets inside strings do not count.
        let text = format!(r#"{{"a": "{}"}}"#, "[".repeat(1000));
        assert!(schema.check_text(&text, InputLimits::default()).is_ok());
    }

    #[test]
    fn property_name_violations_never_repeat_the_name() {
        let schema = compile_schema(
            &json!({"type": "object", "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 8}}),
        )
        .unwrap();
        let err = schema
            .check_text(r#"{"Hunter2-secret-key": 1}"#, InputLimits::default())
            .unwrap_err();
        let InputError::Schema { violations, .. } = &err else {
            panic!("expected schema error, got {err:?}");
        };
        assert!(violations.iter().all(|v| v.keyword == "propertyNames"));
        let rendered = format!("{err} {violations:?}");
        assert!(!rendered.contains("Hunter2"), "{rendered}");
    }

    #[test]
    fn malformed_json_reports_position_only() {
        let schema = compile_schema(&json!({})).unwrap();
        let err = schema
            .check_text("{\"a\": secret}", InputLimits::default())
            .unwrap_err();
        assert_eq!(err, InputError::NotJson { line: 1, column: 7 });
        assert!(!err.to_string().contains("secret"));
    }

    #[test]
    fn draft_07_and_2020_12_are_accepted_and_others_refused() {
        let d7 = json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"});
        let d2020 =
            json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"});
        let d4 = json!({"$schema": "http://json-schema.org/draft-04/schema#"});
        assert!(compile_schema(&d7).is_ok());
        assert!(compile_schema(&d2020).is_ok());
        assert!(matches!(
            compile_schema(&d4),
            Err(SchemaError::UnsupportedDraft(_))
        ));
    }

    #[test]
    fn remote_and_file_refs_are_never_fetched() {
        for uri in ["https://example.com/s.json", "file:///etc/passwd"] {
            let schema = json!({"$ref": uri});
            assert!(
                matches!(compile_schema(&schema), Err(SchemaError::Invalid(_))),
                "{uri}"
            );
        }
    }

    #[test]
    fn schemas_the_meta_schema_refuses_do_not_compile_in_either_draft() {
        for uri in ["http://json-schema.org/draft-07/schema#", DRAFT_2020_12] {
            for body in [
                json!({"minLength": -1}),
                json!({"maxItems": 1.5}),
                json!({"required": "name"}),
                json!({"properties": {"a": 5}}),
            ] {
                let mut schema = body;
                schema["$schema"] = json!(uri);
                assert!(
                    matches!(compile_schema(&schema), Err(SchemaError::Invalid(_))),
                    "{schema}"
                );
            }
        }
    }

    #[test]
    fn broken_schema_does_not_compile() {
        let schema = json!({"type": "no-such-type"});
        assert!(matches!(
            compile_schema(&schema),
            Err(SchemaError::Invalid(_))
        ));
    }

    #[test]
    fn an_input_breaking_the_schema_many_times_reports_the_first_few_and_counts_the_rest() {
        let schema = compile_schema(&json!({
            "type": "object",
            "properties": {"n": {"type": "array", "items": {"type": "integer"}}}
        }))
        .unwrap();
        let text = format!(r#"{{"n": [{}]}}"#, vec![r#""x""#; 5000].join(","));
        let err = schema
            .check_text(&text, InputLimits::default())
            .unwrap_err();
        let InputError::Schema {
            violations,
            omitted,
        } = &err
        else {
            panic!("expected schema error, got {err:?}");
        };
        assert_eq!(violations.len(), MAX_VIOLATIONS);
        assert_eq!(*omitted, 5000 - MAX_VIOLATIONS);
        assert!(err.to_string().ends_with(&format!("; and {omitted} more")));
        assert!(err.to_string().len() < 4096, "{}", err.to_string().len());
    }

    #[test]
    fn a_violation_at_a_long_key_names_it_cut_short() {
        let schema = compile_schema(&json!({
            "type": "object",
            "additionalProperties": {"type": "integer"}
        }))
        .unwrap();
        let key = "é".repeat(10_000);
        let err = schema
            .check_text(&format!(r#"{{"{key}": "x"}}"#), InputLimits::default())
            .unwrap_err();
        let InputError::Schema { violations, .. } = &err else {
            panic!("expected schema error, got {err:?}");
        };
        assert_eq!(violations.len(), 1);
        assert!(violations[0].path.len() <= MAX_POINTER_BYTES);
        assert!(violations[0].path.starts_with("/éé"));
        assert!(violations[0].path.ends_with('…'));
    }
}
