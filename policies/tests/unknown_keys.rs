//! Unknown keys (typos) are diagnostics like every other mistake: located, with a
//! suggestion when a known key is close, reported beside the rest, and always fatal.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use airlock_policy::{PolicyError, Severity, load_policy_str, parse_policy_str, presets};

/// Every error `load_policy_str` reports, rendered as `airlock check` prints them.
fn errors(text: &str) -> Vec<String> {
    match load_policy_str(text, "p.toml") {
        Err(PolicyError::Invalid { diagnostics, .. }) => diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .map(ToString::to_string)
            .collect(),
        Ok(_) => vec![],
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

const TOOL: &str = r#"
[tools.t]
description = "d"
command = ["/bin/true"]
input = { type = "object" }
"#;

#[test]
fn two_typos_and_a_bad_limit_give_three_located_errors_in_one_run() {
    let text = r#"version = 1
[profiles.default]
read = ["/usr"]
limits = { memory = "lots" }

[tools.t]
description = "d"
comand = ["/bin/true"]
builtin = "read_file"

[approvals]
tll = "5m"
"#;
    assert_eq!(
        errors(text),
        vec![
            "p.toml:4:21: error: limits.memory: expected a number followed by a unit, like \"256MiB\"",
            "p.toml:8:1: error: unknown key `comand` in `tools.t`; did you mean `command`?",
            "p.toml:12:1: error: unknown key `tll` in `approvals`; did you mean `ttl`?",
        ]
    );
}

#[test]
fn a_typo_of_a_known_key_gets_a_did_you_mean() {
    let found = errors("version = 1\n[profiles.default]\nlimits = { memroy = \"1GiB\" }\n");
    assert_eq!(
        found,
        vec![
            "p.toml:3:12: error: unknown key `memroy` in `profiles.default.limits`; did you mean `memory`?"
        ]
    );
}

#[test]
fn a_key_far_from_every_known_key_gets_no_suggestion() {
    let found = errors("version = 1\n[profiles.default]\nfrobnicate = true\n");
    assert_eq!(
        found,
        vec!["p.toml:3:1: error: unknown key `frobnicate` in `profiles.default`"]
    );
}

#[test]
fn unknown_keys_are_found_in_every_kind_of_table() {
    let text = r#"version = 1
verison = 1
[profiles.default]
reed = ["/usr"]
network = { allow = ["example.com"], alow_addresses = [] }
syscalls = { allow = [], denny = [] }
require = { landlok = "required" }
[profiles.default.limits]
pid = 8
[tools.t]
description = "d"
builtin = "read_file"
side_efect = "read"
[[rules]]
match = "read_only"
decision = "allow"
[[rules]]
nmae = "second"
match = "read_only"
decision = "deny"
[rate_limits]
sesion = "1/s"
[audit]
include_inputs = true
"#;
    let found = errors(text);
    let keys: Vec<&str> = found
        .iter()
        .map(|e| e.split('`').nth(1).unwrap_or_default())
        .collect();
    assert_eq!(
        keys,
        vec![
            "verison",
            "reed",
            "alow_addresses",
            "denny",
            "landlok",
            "pid",
            "side_efect",
            "nmae",
            "sesion",
            "include_inputs",
        ],
        "{found:#?}"
    );
    assert!(
        found.iter().all(|e| e.contains("did you mean")),
        "{found:#?}"
    );
    assert!(
        found.contains(
            &"p.toml:18:1: error: unknown key `nmae` in `rules[1]`; did you mean `name`?"
                .to_string()
        ),
        "{found:#?}"
    );
    assert!(
        found.contains(&"p.toml:5:38: error: unknown key `alow_addresses` in `profiles.default.network`; did you mean `allow_addresses`?".to_string()),
        "{found:#?}"
    );
}

#[test]
fn unknown_tables_are_reported_at_their_header() {
    let text = "version = 1\n[profiles.default]\n[profiles.default.limitz]\nmemory = \"1GiB\"\n";
    assert_eq!(
        errors(text),
        vec![
            "p.toml:3:19: error: unknown key `limitz` in `profiles.default`; did you mean `limits`?"
        ]
    );
}

#[test]
fn free_form_tables_take_any_key() {
    // env, tmpfs and JSON Schemas name their own keys; none of them is a typo.
    let text = format!(
        "version = 1\n[profiles.default]\nenv = {{ PATH = \"/bin\", ANYTHING = \"x\" }}\ntmpfs = {{ \"/tmp\" = \"1MiB\" }}\n{TOOL}"
    );
    assert_eq!(errors(&text), Vec::<String>::new());
}

#[test]
fn a_policy_with_only_an_unknown_key_is_refused_by_the_loading_path() {
    // The same function serve, exec and reload use: a misspelt key is never ignored.
    let text = format!("version = 1\n[profiles.default]\n{TOOL}\nside_efect = \"read\"\n");
    let err = load_policy_str(&text, "p.toml").unwrap_err();
    let PolicyError::Invalid { diagnostics, .. } = err else {
        panic!("expected Invalid, got {err:?}");
    };
    let errors: Vec<_> = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    assert_eq!(errors.len(), 1, "{diagnostics:?}");
    assert!(errors[0].message.contains("side_efect"));
    assert!(parse_policy_str(&text, "p.toml").is_err());
}

#[test]
fn unknown_keys_are_reported_beside_a_wrong_type() {
    let text = "version = 1\nverison = 2\n[profiles.default]\nread = \"/usr\"\n";
    let found = errors(text);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found[0].starts_with("p.toml:2:1: error: unknown key `verison`"));
    assert!(found[1].starts_with("p.toml:4:8: error: "), "{found:#?}");
}

#[test]
fn control_characters_in_an_unknown_key_are_escaped() {
    let found = errors("version = 1\n\"\\u001b[31mred\" = 1\n");
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(!found[0].contains('\u{1b}'), "{found:#?}");
    assert!(found[0].contains("\\u{1b}[31mred"), "{found:#?}");
}

#[test]
fn every_preset_still_passes() {
    for (name, text) in presets::PRESETS {
        let loaded = load_policy_str(text, name);
        assert!(loaded.is_ok(), "{name}: {loaded:?}");
    }
}

mod schema_keywords {
    use super::*;

    fn policy(input: &str) -> String {
        format!(
            "version = 1\n[profiles.default]\nread = [\"/usr\"]\n[tools.t]\ndescription = \"d\"\ncommand = [\"/bin/true\"]\nside_effect = \"read\"\ninput = {input}\n"
        )
    }

    #[test]
    fn misspelt_keywords_inside_a_tool_schema_are_located_errors() {
        let found = errors(&policy(
            "{ type = \"object\", additionalproperties = false, properties = { text = { type = \"string\", patern = \"^a\", maxlength = 4 } } }",
        ));
        assert_eq!(
            found,
            vec![
                "p.toml:8:28: error: unknown key `additionalproperties` in `tools.t.input`: not a keyword of JSON Schema 2020-12; did you mean `additionalProperties`?",
                "p.toml:8:99: error: unknown key `patern` in `tools.t.input.properties.text`: not a keyword of JSON Schema 2020-12; did you mean `pattern`?",
                "p.toml:8:114: error: unknown key `maxlength` in `tools.t.input.properties.text`: not a keyword of JSON Schema 2020-12; did you mean `maxLength`?",
            ]
        );
    }

    #[test]
    fn names_data_and_extensions_are_not_keywords() {
        // Property names, `$defs` names, enum and default values may be anything; `x-` keys
        // are extensions.
        let text = policy(
            "{ type = \"object\", \"x-origin\" = \"ours\", properties = { patern = { \"$ref\" = \"#/$defs/maxlength\" }, other = { enum = [{ whatever = 1 }], default = { nope = 2 } } }, \"$defs\" = { maxlength = { type = \"string\" } } }",
        );
        assert_eq!(errors(&text), Vec::<String>::new());
    }

    #[test]
    fn draft_07_keywords_beside_a_ref_which_it_ignores_are_errors() {
        // Draft-07 checks only the `$ref` here: the length and the type would be dropped.
        let draft7 = policy(
            "{ \"$schema\" = \"http://json-schema.org/draft-07/schema#\", type = \"object\", properties = { text = { \"$ref\" = \"#/definitions/short\", title = \"t\", maxLength = 8, type = \"string\" } }, definitions = { short = { type = \"string\" } } }",
        );
        let found = errors(&draft7);
        assert_eq!(found.len(), 2, "{found:#?}");
        for (error, keyword) in found.iter().zip(["maxLength", "type"]) {
            assert!(
                error.contains(&format!(
                    "error: `{keyword}` in `tools.t.input.properties.text` stands beside a `$ref`, where JSON Schema draft-07 ignores it"
                )),
                "{found:#?}"
            );
        }
        // 2020-12 applies them, and an `allOf` says the same in draft-07.
        let later = draft7.replace(
            "\"$schema\" = \"http://json-schema.org/draft-07/schema#\", ",
            "",
        );
        assert_eq!(errors(&later), Vec::<String>::new());
        let wrapped = policy(
            "{ \"$schema\" = \"http://json-schema.org/draft-07/schema#\", type = \"object\", properties = { text = { allOf = [{ \"$ref\" = \"#/definitions/short\" }, { maxLength = 8 }] } }, definitions = { short = { type = \"string\" } } }",
        );
        assert_eq!(errors(&wrapped), Vec::<String>::new());
    }

    #[test]
    fn each_dialect_has_its_own_keywords() {
        // `definitions` and `dependencies` are draft-07's; `$defs` and `prefixItems` 2020-12's.
        let draft7 = policy(
            "{ \"$schema\" = \"http://json-schema.org/draft-07/schema#\", type = \"object\", definitions = { a = { type = \"string\" } }, dependencies = { a = [\"b\"] }, prefixItems = [] }",
        );
        let found = errors(&draft7);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("unknown key `prefixItems` in `tools.t.input`: not a keyword of JSON Schema draft-07"),
            "{found:?}"
        );
        let in_output = format!(
            "{}output = {{ type = \"array\", prefixItems = [{{ type = \"string\", minlength = 1 }}] }}\n",
            policy("{ type = \"object\" }")
        );
        let found = errors(&in_output);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("unknown key `minlength` in `tools.t.output.prefixItems[0]`"),
            "{found:?}"
        );
    }
}
