//! What a tool's metadata means, as `airlock check` and the gate see it: the schema enforced
//! is the schema published, declared permissions match the profile, destructive tools wait
//! for a human, rules match on side effect, and argv values cannot become options.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use airlock_policy::compile::ArgvError;
use airlock_policy::rules::{Decision, decide};
use airlock_policy::validate::{Approval, SideEffect};
use airlock_policy::{LoadedPolicy, PolicyError, Severity, load_policy_str};
use serde_json::json;

const PROFILE: &str = r#"
[profiles.default]
read = ["/usr"]
tmpfs = { "/tmp" = "16MiB" }
"#;

fn load(text: &str) -> LoadedPolicy {
    load_policy_str(text, "p.toml").unwrap_or_else(|e| panic!("{e:?}"))
}

fn errors(text: &str) -> Vec<String> {
    match load_policy_str(text, "p.toml") {
        Err(PolicyError::Invalid { diagnostics, .. }) => diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .map(|d| d.message.clone())
            .collect(),
        Ok(_) => vec![],
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

fn warnings(loaded: &LoadedPolicy) -> Vec<String> {
    loaded.warnings.iter().map(|d| d.message.clone()).collect()
}

/// `top` holds top-level keys; `tool` the body of `[tools.t]`.
fn policy(top: &str, tool: &str) -> String {
    format!("version = 1\n{top}\n{PROFILE}\n[tools.t]\ndescription = \"d\"\n{tool}\n")
}

#[test]
fn strict_objects_enforce_and_publish_one_document_in_which_all_of_stays_satisfiable() {
    let loaded = load(&policy(
        "strict_objects = true",
        r#"command = ["/bin/true"]
side_effect = "read"
[tools.t.input]
type = "object"
allOf = [
  { properties = { a = { type = "string" } }, required = ["a"] },
  { properties = { b = { type = "string" } }, required = ["b"] },
]
"#,
    ));
    let tool = &loaded.policy.tools["t"];
    // Valid input is accepted; a property no subschema declares is not.
    assert!(tool.input.check_value(&json!({"a": "1", "b": "2"})).is_ok());
    assert!(
        tool.input
            .check_value(&json!({"a": "1", "b": "2", "c": "3"}))
            .is_err()
    );
    // What is enforced is what the gate publishes.
    let published = &tool.tool.input_schema;
    assert_eq!(published["unevaluatedProperties"], json!(false));
    let recompiled = airlock_policy::schema::compile_schema(published).unwrap();
    for input in [
        json!({"a": "1", "b": "2"}),
        json!({"a": "1", "b": "2", "c": "3"}),
    ] {
        assert_eq!(
            recompiled.check_value(&input).is_ok(),
            tool.input.check_value(&input).is_ok()
        );
    }
    let w = warnings(&loaded);
    assert!(
        w.iter().any(|w| w.contains("tool t: input schema: strict_objects closes the schema root with unevaluatedProperties = false")),
        "{w:?}"
    );
}

#[test]
fn strict_objects_warn_where_they_change_a_schemas_meaning() {
    let loaded = load(&policy(
        "strict_objects = true",
        r#"command = ["/bin/true"]
side_effect = "read"
input = { type = "object", properties = { meta = { type = "object" } } }
"#,
    ));
    let w = warnings(&loaded);
    assert!(
        w.iter().any(|w| w
            .contains("strict_objects closes `/properties/meta`, which declares no properties")),
        "{w:?}"
    );
    let draft7 = load(&policy(
        "strict_objects = true",
        r#"command = ["/bin/true"]
side_effect = "read"
[tools.t.input]
"$schema" = "http://json-schema.org/draft-07/schema#"
type = "object"
anyOf = [{ properties = { a = {} } }, { properties = { b = {} } }]
"#,
    ));
    assert!(
        warnings(&draft7)
            .iter()
            .any(|w| w.contains("strict_objects leaves the schema root open: draft-07")),
        "{:?}",
        warnings(&draft7)
    );
    // Without strict_objects nothing is rewritten and nothing is said.
    let loose = load(&policy(
        "",
        r#"command = ["/bin/true"]
side_effect = "read"
input = { type = "object", properties = { meta = { type = "object" } } }
"#,
    ));
    assert!(warnings(&loose).is_empty(), "{:?}", warnings(&loose));
    assert!(
        loose.policy.tools["t"]
            .tool
            .input_schema
            .get("additionalProperties")
            .is_none()
    );
}

#[test]
fn declared_permissions_the_profile_cannot_honour_are_errors() {
    let with_profile = |profile: &str, permissions: &str| {
        errors(&format!(
            "version = 1\n[profiles.default]\n{profile}\n[tools.t]\ndescription = \"d\"\nbuiltin = \"bash\"\npermissions = {permissions}\n"
        ))
    };
    let e = with_profile("read = [\"/usr\"]", "[\"fs:read\", \"fs:write\"]");
    assert_eq!(
        e,
        vec![
            "tool t declares fs:write but profile default has no write paths or workspace (a tmpfs is gone after the call)"
        ]
    );
    let e = with_profile("read = [\"/usr\"]", "[\"network\"]");
    assert_eq!(
        e,
        vec!["tool t declares network but profile default has network = \"none\""]
    );
    let e = with_profile("tmpfs = { \"/tmp\" = \"1MiB\" }", "[\"fs:read\"]");
    assert!(
        e[0].contains("declares fs:read but profile default binds no host path"),
        "{e:?}"
    );
    let e = with_profile(
        "read = [\"/usr\"]\nlimits = { pids = 1 }",
        "[\"fs:read\", \"subprocess\"]",
    );
    assert_eq!(
        e,
        vec!["tool t declares subprocess but profile default allows 1 process (limits.pids)"]
    );
    let e = with_profile(
        "read = [\"/usr\"]\nsyscalls = { deny = [\"clone\", \"fork\", \"vfork\"] }",
        "[\"fs:read\", \"subprocess\"]",
    );
    assert_eq!(
        e,
        vec![
            "tool t declares subprocess but profile default's syscalls allow none of clone, fork and vfork"
        ]
    );
    // A profile that grants exactly what is declared is fine.
    assert_eq!(
        with_profile("read = [\"/usr\"]", "[\"fs:read\", \"subprocess\"]"),
        Vec::<String>::new()
    );
}

#[test]
fn destructive_tools_need_a_human_unless_the_policy_says_otherwise() {
    let undeclared = load(&policy(
        "",
        "command = [\"/bin/true\"]\ninput = { type = \"object\" }",
    ));
    let t = &undeclared.policy.tools["t"].tool;
    assert_eq!(t.side_effect, SideEffect::Destructive);
    assert_eq!(t.approval, Approval::Human);
    assert!(t.approval_implied);
    assert!(
        warnings(&undeclared)
            .iter()
            .any(|w| w.contains("tool t declares no side_effect, so it is taken as destructive")),
        "{:?}",
        warnings(&undeclared)
    );
    let bash = load(&policy("", "builtin = \"bash\""));
    assert_eq!(bash.policy.tools["t"].tool.approval, Approval::Human);
    assert!(warnings(&bash).is_empty(), "{:?}", warnings(&bash));
    // The tool says otherwise...
    let own = load(&policy("", "builtin = \"bash\"\napproval = \"auto\""));
    assert_eq!(own.policy.tools["t"].tool.approval, Approval::Auto);
    // ...or the policy does.
    let off = load(&policy(
        "destructive_requires_approval = false",
        "builtin = \"bash\"",
    ));
    assert_eq!(off.policy.tools["t"].tool.approval, Approval::Auto);
    // Writes are not destructive.
    let write = load(&policy("", "builtin = \"write_file\""));
    assert_eq!(write.policy.tools["t"].tool.approval, Approval::Auto);
}

#[test]
fn rules_match_on_side_effect() {
    let text = format!(
        "version = 1\ndefault_decision = \"allow\"\n{PROFILE}\n[tools.reader]\ndescription = \"d\"\nbuiltin = \"read_file\"\n[tools.writer]\ndescription = \"d\"\nbuiltin = \"write_file\"\n[tools.shell]\ndescription = \"d\"\nbuiltin = \"bash\"\n\n[[rules]]\nname = \"changes-are-reviewed\"\nmatch = \"side_effect\"\nside_effects = [\"write\", \"destructive\"]\ndecision = \"review\"\n"
    );
    let p = load(&text).policy;
    let verdict = |tool: &str| {
        let v = decide(&p.gate, &p.tools[tool].tool, &json!({}));
        (v.decision, v.rule)
    };
    assert_eq!(verdict("reader"), (Decision::Allow, "default".into()));
    assert_eq!(
        verdict("writer"),
        (Decision::Review, "changes-are-reviewed".into())
    );
    assert_eq!(
        verdict("shell"),
        (Decision::Review, "changes-are-reviewed".into())
    );
    let bad = errors(&format!(
        "version = 1\n{PROFILE}\n[[rules]]\nmatch = \"side_effect\"\nside_effects = [\"explosive\"]\ndecision = \"deny\"\n\n[[rules]]\nmatch = \"side_effect\"\ndecision = \"deny\"\n"
    ));
    assert_eq!(
        bad,
        vec![
            "rule rules[0]: side effect must be read, write or destructive, not \"explosive\"",
            "rule rules[1]: match = \"side_effect\" needs side_effects = [...]",
        ]
    );
}

const ECHO: &str = r#"command = ["/bin/echo", "{text}"]
side_effect = "read"
input = { type = "object", properties = { text = { type = "string" }, n = { type = "integer" } }, required = ["text"] }"#;

#[test]
fn an_argv_value_starting_with_a_dash_is_refused_naming_its_field() {
    let loaded = load(&policy("", ECHO));
    let t = &loaded.policy.tools["t"];
    for value in ["--version", "-n", "-", "--output=/etc/passwd"] {
        assert_eq!(
            t.render_argv(&json!({"text": value})),
            Err(ArgvError::DashValue("text".into())),
            "{value}"
        );
    }
    let err = t.render_argv(&json!({"text": "--version"})).unwrap_err();
    assert_eq!(err.field(), "text");
    assert!(
        err.to_string().contains("\"text\" starts with `-`"),
        "{err}"
    );
    // Dashes elsewhere in a value are plain text.
    assert_eq!(
        t.render_argv(&json!({"text": "a -b --c"})).unwrap(),
        vec!["/bin/echo", "a -b --c"]
    );
}

#[test]
fn allow_dash_values_lets_a_listed_field_start_with_a_dash() {
    let loaded = load(&policy(
        "",
        r#"command = ["/usr/bin/grep", "-e", "{pattern}", "--", "{path}"]
side_effect = "read"
allow_dash_values = ["path"]
input = { type = "object", properties = { pattern = { type = "string" }, path = { type = "string" } }, required = ["pattern", "path"] }"#,
    ));
    assert!(warnings(&loaded).is_empty(), "{:?}", warnings(&loaded));
    let t = &loaded.policy.tools["t"];
    assert_eq!(
        t.render_argv(&json!({"pattern": "x", "path": "-weird-name"}))
            .unwrap(),
        vec!["/usr/bin/grep", "-e", "x", "--", "-weird-name"]
    );
    assert_eq!(
        t.render_argv(&json!({"pattern": "-x", "path": "f"})),
        Err(ArgvError::DashValue("pattern".into()))
    );
}

#[test]
fn allow_dash_values_must_name_command_fields_and_is_linted_without_an_end_of_options_marker() {
    let loaded = load(&policy(
        "",
        &format!("{ECHO}\nallow_dash_values = [\"text\"]"),
    ));
    let w = warnings(&loaded);
    assert_eq!(
        w,
        vec![
            "tool t: command field \"text\" may start with `-` (allow_dash_values) and no \"--\" comes before it, so the program may read it as an option"
        ]
    );
    let e = errors(&policy(
        "",
        &format!("{ECHO}\nallow_dash_values = [\"n\", \"nope\"]"),
    ));
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].contains("allow_dash_values names \"n\", which is not a {field} of the command"),
        "{e:?}"
    );
}

#[test]
fn read_only_builtins_are_concurrency_safe_unless_they_say_otherwise() {
    let reader = load(&policy("", "builtin = \"read_file\""));
    assert!(reader.policy.tools["t"].tool.concurrency_safe);
    let pinned = load(&policy(
        "",
        "builtin = \"read_file\"\nconcurrency_safe = false",
    ));
    assert!(!pinned.policy.tools["t"].tool.concurrency_safe);
    let command = load(&policy("", ECHO));
    assert!(!command.policy.tools["t"].tool.concurrency_safe);
}

#[test]
fn the_published_policy_file_schema_takes_the_new_keys_and_refuses_their_typos() {
    let schema: serde_json::Value =
        serde_json::from_str(airlock_policy::presets::POLICY_FILE_SCHEMA).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let as_json =
        |text: &str| serde_json::to_value(toml::from_str::<toml::Value>(text).unwrap()).unwrap();
    let text = format!(
        "destructive_requires_approval = false\n{}",
        policy(
            "",
            &format!(
                "{ECHO}\nallow_dash_values = [\"text\"]\n\n[[rules]]\nmatch = \"side_effect\"\nside_effects = [\"write\"]\ndecision = \"review\"\n"
            )
        )
    );
    let errors: Vec<String> = validator
        .iter_errors(&as_json(&text))
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    assert!(load_policy_str(&text, "p.toml").is_ok());
    let typo = text.replace("side_effects = [\"write\"]", "side_effects = [\"writes\"]");
    assert!(!validator.is_valid(&as_json(&typo)));
}
