//! Fuzz target: arbitrary bytes as the raw JSON arguments of a tool call, through the checks
//! the supervisor runs on them before anything is spawned (`CompiledSchema::check_text`, then
//! `render_argv`, `render_stdin` and the gate's `rules::decide` on what was accepted).
//!
//! Input layout: the first byte picks the tool (low 6 bits, modulo the number of tools), tight
//! limits instead of the defaults (bit 6) and the tool's output schema instead of its input
//! schema (bit 7, when it has one); the rest, as UTF-8 (lossy: the supervisor only ever sees
//! `String` arguments), is the JSON text. The tools come from two compilations of one policy
//! with varied schemas (with and without `strict_objects`) and from the shipped `examples`
//! preset. Seeds: `corpus/validate_input/*.json`.
//!
//! Besides "never panics", it checks what the supervisor relies on: an accepted input fits the
//! size and depth limits, is exactly the JSON parse of the text and passes the schema again;
//! valid JSON within the limits is never refused as too large, too deep or not JSON; a
//! validated input always renders to an argv (unless a substituted string holds a NUL); and
//! schema violations never repeat model-written text (the `MARKER` below) in their messages.
#![no_main]

use std::sync::LazyLock;

use airlock_policy::compile::ArgvError;
use airlock_policy::rules::decide;
use airlock_policy::schema::{CompiledSchema, InputError, InputLimits};
use airlock_policy::validate::{ArgTemplate, StdinSource};
use airlock_policy::{CompiledPolicy, CompiledTool, load_policy_str, presets};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// Model-written text that must never reach a violation message; the seeds plant it in keys,
/// values and array items so mutations keep it around. Not in `POLICY` (checked at setup), so
/// a message holding it can only have copied it from the input.
const MARKER: &str = "s3cr3tv4lue";

/// Tight limits (bit 6 of the selector): small enough that fuzz inputs cross them often.
const TIGHT: InputLimits = InputLimits {
    max_bytes: 200,
    max_depth: 2,
};

/// Tools with every kind of schema a policy author might write: regex patterns, enums, numeric
/// bounds, nested and open/closed objects, `propertyNames`, arrays, combinators, `$ref`,
/// formats, a draft-07 schema, an output schema, and the built-ins; plus gate rules (pattern
/// rules read input fields). Compiled as written and again with `strict_objects = true`.
const POLICY: &str = r##"
default_decision = "review"

[profiles.default]
read = ["/usr"]
network = "none"

[tools.search]
description = "Search a workspace file for a pattern"
command = ["/usr/bin/grep", "--max-count", "{max_count}", "-e", "{pattern}", "--", "{path}"]
side_effect = "read"
category = "text"
[tools.search.input]
type = "object"
required = ["pattern", "path", "max_count"]
[tools.search.input.properties.pattern]
type = "string"
minLength = 1
maxLength = 256
[tools.search.input.properties.path]
type = "string"
pattern = '^/workspace(/[A-Za-z0-9._-]+)*$'
[tools.search.input.properties.max_count]
type = "integer"
minimum = 1
maximum = 1000
[tools.search.input.properties.mode]
enum = ["fixed", "basic", "extended", "perl"]
[tools.search.input.properties.ignore_case]
type = "boolean"

[tools.deploy]
description = "Deploy a service"
command = ["/usr/bin/env", "deploy", "{service}", "{dry_run}"]
stdin = "$input"
side_effect = "destructive"
approval = "human"
output = { type = "object", properties = { id = { type = "string", format = "uuid" }, url = { type = "string", format = "uri" } }, required = ["id"] }
[tools.deploy.input]
type = "object"
required = ["service", "dry_run", "target"]
properties.service = { type = "string", pattern = '^[a-z][a-z0-9-]{0,30}$' }
properties.dry_run = { type = "boolean" }
properties.version = { const = 2 }
properties.replicas = { type = "integer", multipleOf = 2, exclusiveMinimum = 0, maximum = 64 }
properties.target = { type = "object", required = ["env"], properties = { env = { enum = ["dev", "staging", "prod"] }, region = { type = "string", pattern = '^[a-z]{2}-[a-z]+-\d$' } } }
properties.labels = { type = "object", maxProperties = 8, propertyNames = { pattern = '^[a-z][a-z0-9_]*$', maxLength = 32 }, additionalProperties = { type = "string", maxLength = 64 } }
properties.tags = { type = "array", maxItems = 4, uniqueItems = true, items = { enum = ["canary", "blue", "green"] } }
properties.env = { type = "object", patternProperties = { '^[A-Z_][A-Z0-9_]*$' = { type = "string" } } }

[tools.convert]
description = "Convert a value between units"
command = ["/usr/bin/units", "{quantity}"]
stdin = "note"
side_effect = "read"
[tools.convert.input]
type = "object"
required = ["quantity"]
"$defs".unit = { enum = ["m", "km", "mi", "ft"] }
"$defs".point = { type = "array", prefixItems = [{ type = "number" }, { type = "number" }], items = false, minItems = 2 }
properties.quantity = { type = "number", exclusiveMinimum = -1e9, maximum = 1e9 }
properties.from = { "$ref" = "#/$defs/unit" }
properties.to = { "$ref" = "#/$defs/unit" }
properties.note = { anyOf = [{ type = "string", maxLength = 80 }, { type = "null" }] }
properties.when = { type = "string", format = "date-time" }
properties.contact = { type = "string", format = "email" }
properties.host = { anyOf = [{ type = "string", format = "ipv4" }, { type = "string", format = "ipv6" }, { type = "string", format = "hostname" }] }
properties.count = { oneOf = [{ type = "integer", minimum = 1 }, { type = "string", pattern = '^[1-9][0-9]{0,5}$' }] }
properties.route = { type = "array", items = { "$ref" = "#/$defs/point" }, maxItems = 16, contains = { type = "array" } }
properties.precision = { not = { type = "string" }, if = { type = "integer" }, then = { minimum = 0 }, else = { type = "null" } }
dependentRequired = { from = ["to"] }
unevaluatedProperties = false

[tools.legacy]
description = "A tool with a draft-07 schema"
command = ["/usr/bin/printf", "%s\\n", "{name}"]
side_effect = "read"
[tools.legacy.input]
"$schema" = "http://json-schema.org/draft-07/schema#"
type = "object"
required = ["name"]
definitions.id = { type = "string", pattern = '^[0-9a-f]{8}$' }
properties.name = { type = "string", minLength = 1, maxLength = 40 }
properties.ids = { type = "array", items = [{ "$ref" = "#/definitions/id" }, { type = "integer" }], additionalItems = false }
properties.options = { type = "object", properties = { verbose = { type = "boolean" } }, dependencies = { verbose = { required = ["level"] } } }
properties.level = { type = "integer", minimum = 0, maximum = 9 }

[tools.read_text]
description = "Read a file"
builtin = "read_file"
category = "files"

[tools.write_text]
description = "Write a file"
builtin = "write_file"
category = "files"

[tools.edit_text]
description = "Edit a file"
builtin = "edit"
category = "files"

[tools.list]
description = "List a directory"
builtin = "list_dir"

[tools.bash]
description = "Run a shell command"
builtin = "bash"

[[rules]]
name = "no-dangerous-shell"
match = "pattern"
tools = ["bash"]
field = "command"
preset = "dangerous_shell"
decision = "deny"

[[rules]]
name = "no-etc"
match = "pattern"
field = "path"
patterns = ['^/etc/', '\.\./']
decision = "deny"

[[rules]]
name = "reads-are-free"
match = "read_only"
decision = "allow"

[[rules]]
name = "files-ok"
match = "category"
categories = ["files"]
decision = "allow"
"##;

/// Every tool of every policy the target checks against, in a fixed order (policy, then tool
/// name), with the policy's label for traces.
static TOOLS: LazyLock<Vec<(&str, CompiledPolicy, CompiledTool)>> = LazyLock::new(|| {
    // Fixed, known-good inputs: a failure here is a broken harness, not a finding.
    assert!(
        !POLICY.contains(MARKER),
        "the marker must not be in the policy"
    );
    let examples = presets::preset_text("examples").expect("the examples preset exists");
    let texts = [
        ("open", format!("version = 1\n{POLICY}")),
        (
            "strict",
            format!("version = 1\nstrict_objects = true\n{POLICY}"),
        ),
        ("examples", examples.to_string()),
    ];
    let mut tools = Vec::new();
    for (label, text) in &texts {
        let policy = load_policy_str(text, "fuzz.toml")
            .unwrap_or_else(|e| panic!("fixed fuzz policy does not load: {e:?}"))
            .policy;
        for tool in policy.tools.values() {
            tools.push((*label, policy.clone(), tool.clone()));
        }
    }
    tools
});

/// `AIRLOCK_FUZZ_TRACE=1` prints each input's tool and outcome to stderr: for checking that a
/// new seed reaches the tool and the branch it was written for (run the target on the file).
static TRACE: LazyLock<bool> = LazyLock::new(|| std::env::var_os("AIRLOCK_FUZZ_TRACE").is_some());

fn trace(
    label: &str,
    tool: &CompiledTool,
    what: &str,
    limits: InputLimits,
    result: &Result<Value, InputError>,
) {
    if *TRACE {
        let outcome = match result {
            Ok(_) => "accepted".to_string(),
            Err(error) => format!("refused: {error}"),
        };
        eprintln!("{label}/{} {what} {limits:?}: {outcome}", tool.tool.name);
    }
}

/// Nesting depth of a value: scalars 0, an array or object one more than its deepest child.
fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Checks one text against one schema, asserting the invariants; returns what `check_text`
/// returned.
fn check(schema: &CompiledSchema, text: &str, limits: InputLimits) -> Result<Value, InputError> {
    let result = schema.check_text(text, limits);
    // What the checker says must match an independent reading of the same text.
    let parsed = serde_json::from_str::<Value>(text).ok();
    let fits = text.len() <= limits.max_bytes;
    let shallow = parsed
        .as_ref()
        .is_some_and(|v| depth(v) <= limits.max_depth);
    match result {
        Ok(value) => {
            assert!(
                fits,
                "accepted {} bytes over a {} limit",
                text.len(),
                limits.max_bytes
            );
            assert!(
                depth(&value) <= limits.max_depth,
                "accepted input nests too deep"
            );
            assert_eq!(
                parsed.as_ref(),
                Some(&value),
                "accepted value is not the text's parse"
            );
            assert!(
                schema.check_value(&value).is_ok(),
                "accepted value fails its schema"
            );
            // The supervisor re-serialises it (stdin "$input", digests, audit): the tool must
            // read back exactly what was validated. Floats included: jsonschema turns on
            // serde_json's `float_roundtrip`, in the main workspace as here.
            let again = serde_json::to_string(&value).expect("a Value serialises");
            let reparsed: Value = serde_json::from_str(&again).expect("serialised Value parses");
            assert_eq!(
                reparsed, value,
                "re-serialised input reads back differently"
            );
            Ok(value)
        }
        Err(error) => {
            // Rendering and serialising errors is what the supervisor does with them next.
            let shown = error.to_string();
            let _ = serde_json::to_string(&error).expect("an InputError serialises");
            match &error {
                InputError::TooLarge { size, limit } => {
                    assert_eq!((*size, *limit), (text.len(), limits.max_bytes));
                    assert!(!fits);
                }
                InputError::TooDeep { limit } => {
                    assert_eq!(*limit, limits.max_depth);
                    assert!(fits, "size is checked before depth");
                    assert!(
                        !shallow,
                        "valid JSON within the depth limit refused as too deep"
                    );
                }
                InputError::NotJson { .. } => {
                    assert!(fits);
                    assert!(parsed.is_none(), "valid JSON refused as not JSON");
                }
                InputError::Schema { violations, .. } => {
                    assert!(fits && shallow);
                    assert!(!violations.is_empty(), "a schema error with no violations");
                    let value = parsed.as_ref().expect("checked above: the text parses");
                    assert_eq!(
                        schema.check_value(value).err().as_ref(),
                        Some(violations),
                        "the same value gave different violations"
                    );
                    // Tool arguments may hold secrets: messages and keywords are built from
                    // the schema only. (The JSON pointer may name input keys, by design.)
                    for violation in violations {
                        assert!(
                            !violation.message.contains(MARKER)
                                && !violation.keyword.contains(MARKER),
                            "a violation repeats model-written text: {violation:?}"
                        );
                    }
                }
            }
            if !matches!(error, InputError::Schema { .. }) {
                assert!(
                    !shown.contains(MARKER),
                    "an input error repeats input: {shown}"
                );
            }
            Err(error)
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (label, policy, tool) = &TOOLS[usize::from(selector & 0x3f) % TOOLS.len()];
    let limits = if selector & 0x40 != 0 {
        TIGHT
    } else {
        InputLimits::default()
    };
    let text = String::from_utf8_lossy(rest);

    if selector & 0x80 != 0
        && let Some(output) = &tool.output
    {
        // Tool output, checked by the supervisor before it reaches the model.
        let result = check(output, &text, limits);
        trace(label, tool, "output", limits, &result);
        return;
    }

    let result = check(&tool.input, &text, limits);
    trace(label, tool, "input", limits, &result);
    let Ok(input) = result else {
        return;
    };
    // A validated input always renders: every `{field}` is a required scalar property
    // (enforced when the policy is checked), so only a NUL in a substituted string, or a
    // value that would be read as an option, can fail.
    match tool.render_argv(&input) {
        Ok(argv) => {
            assert_eq!(argv.len(), tool.tool.command.len());
            for (arg, template) in argv.iter().zip(&tool.tool.command) {
                assert!(!arg.contains('\0'), "an argument holds a NUL");
                match template {
                    ArgTemplate::Literal(literal) => assert_eq!(arg, literal),
                    ArgTemplate::Field(field) => assert!(
                        !arg.starts_with('-') || tool.tool.allow_dash_values.contains(field),
                        "field {field} became an option"
                    ),
                }
            }
        }
        Err(ArgvError::Nul(_)) => {}
        Err(ArgvError::DashValue(field)) => {
            assert!(!tool.tool.allow_dash_values.contains(&field), "{field} is allowed dashes");
        }
        Err(error) => panic!("a validated input does not render: {error}"),
    }
    let stdin = tool.render_stdin(&input);
    if tool.tool.stdin == StdinSource::WholeInput {
        assert_eq!(stdin, input.to_string().into_bytes());
    }
    let verdict = decide(&policy.gate, &tool.tool, &input);
    assert!(
        verdict.rule == "default" || policy.gate.rules.iter().any(|r| r.name == verdict.rule),
        "verdict names an unknown rule: {verdict:?}"
    );
});
