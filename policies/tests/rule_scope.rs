//! Decision rules that could never fire, or that would fire wider than they read, are refused
//! by `airlock check`: a rule is only worth writing if it decides what it says it decides.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use airlock_policy::{PolicyError, Severity, load_policy_str};

const PROFILE: &str = r#"version = 1
[profiles.default]
read = ["/usr"]
tmpfs = { "/tmp" = "16MiB" }

[tools.shell]
description = "runs a shell"
builtin = "bash"

[tools.reader]
description = "reads"
builtin = "read_file"

[tools.open_input]
description = "takes anything"
command = ["/usr/bin/true"]
side_effect = "read"
input = { type = "object", properties = { text = { type = "string" } } }
"#;

fn diagnostics(text: &str, severity: Severity) -> Vec<String> {
    match load_policy_str(text, "p.toml") {
        Err(PolicyError::Invalid { diagnostics, .. }) => diagnostics
            .iter()
            .filter(|d| d.severity == severity)
            .map(ToString::to_string)
            .collect(),
        Ok(loaded) => loaded
            .warnings
            .iter()
            .filter(|d| d.severity == severity)
            .map(ToString::to_string)
            .collect(),
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

fn errors(rules: &str) -> Vec<String> {
    diagnostics(&format!("{PROFILE}\n{rules}"), Severity::Error)
}

fn warnings(rules: &str) -> Vec<String> {
    diagnostics(&format!("{PROFILE}\n{rules}"), Severity::Warning)
}

/// The 1-based line of `PROFILE` + a blank line + `rules` at which `rules`' line `n` is.
fn line(n: usize) -> usize {
    PROFILE.lines().count() + 1 + n
}

mod pattern_fields {
    use super::*;

    #[test]
    fn a_field_the_named_tool_does_not_have_is_a_located_error() {
        let found = errors(
            "[[rules]]\nname = \"no-rm\"\nmatch = \"pattern\"\ntools = [\"shell\"]\nfield = \"cmd\"\npatterns = ['rm']\ndecision = \"deny\"\n",
        );
        assert_eq!(
            found,
            vec![format!(
                "p.toml:{}:1: error: rule no-rm: tool shell has no input field \"cmd\" (its input schema allows only: command), so the rule could never match it",
                line(5)
            )]
        );
    }

    #[test]
    fn a_field_every_named_tool_declares_is_accepted() {
        assert_eq!(
            errors(
                "[[rules]]\nmatch = \"pattern\"\ntools = [\"shell\"]\nfield = \"command\"\npatterns = ['rm']\ndecision = \"deny\"\n"
            ),
            Vec::<String>::new()
        );
    }

    #[test]
    fn each_named_tool_without_the_field_is_its_own_error() {
        let found = errors(
            "[[rules]]\nmatch = \"pattern\"\ntools = [\"shell\", \"reader\"]\nfield = \"path\"\npatterns = ['^/etc']\ndecision = \"deny\"\n",
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("rule rules[0]: tool shell has no input field \"path\""),
            "{found:?}"
        );
    }

    #[test]
    fn an_open_schema_without_the_field_is_a_warning() {
        let rule = "[[rules]]\nmatch = \"pattern\"\ntools = [\"open_input\"]\nfield = \"path\"\npatterns = ['^/etc']\ndecision = \"deny\"\n";
        assert_eq!(errors(rule), Vec::<String>::new());
        let found = warnings(rule);
        assert!(
            found.iter().any(|w| w.starts_with(&format!("p.toml:{}:1: warning: rule rules[0]: tool open_input's input schema does not declare \"path\"", line(4)))),
            "{found:?}"
        );
    }

    #[test]
    fn a_rule_for_every_tool_needs_some_tool_that_may_have_the_field() {
        // `path` is the reader's: the rule fires for it, and is simply never met for the rest.
        assert_eq!(
            errors(
                "[[rules]]\nmatch = \"pattern\"\nfield = \"path\"\npatterns = ['^/etc']\ndecision = \"deny\"\n"
            ),
            Vec::<String>::new()
        );
        // Only the open schema could hold `cmd`: a warning, not an error.
        let rule = "[[rules]]\nmatch = \"pattern\"\nfield = \"cmd\"\npatterns = ['rm']\ndecision = \"deny\"\n";
        assert_eq!(errors(rule), Vec::<String>::new());
        assert!(
            warnings(rule)
                .iter()
                .any(|w| w.contains("rule rules[0]: no tool's input schema declares \"cmd\"")),
            "{:?}",
            warnings(rule)
        );
    }

    #[test]
    fn a_rule_for_every_tool_whose_field_no_tool_may_have_is_an_error() {
        let text = "version = 1\n[profiles.default]\nread = [\"/usr\"]\n[tools.shell]\ndescription = \"d\"\nbuiltin = \"bash\"\n\n[[rules]]\nmatch = \"pattern\"\nfield = \"cmd\"\npatterns = ['rm']\ndecision = \"deny\"\n";
        assert_eq!(
            diagnostics(text, Severity::Error),
            vec![
                "p.toml:10:1: error: rule rules[0]: no tool has an input field \"cmd\", so the rule could never match".to_string()
            ]
        );
    }

    #[test]
    fn a_field_matched_by_pattern_properties_is_accepted() {
        let text = "version = 1\n[profiles.default]\nread = [\"/usr\"]\n[tools.t]\ndescription = \"d\"\ncommand = [\"/usr/bin/true\"]\nside_effect = \"read\"\ninput = { type = \"object\", patternProperties = { \"^x_\" = { type = \"string\" } }, additionalProperties = false }\n\n[[rules]]\nmatch = \"pattern\"\ntools = [\"t\"]\nfield = \"x_cmd\"\npatterns = ['rm']\ndecision = \"deny\"\n";
        assert_eq!(diagnostics(text, Severity::Error), Vec::<String>::new());
    }
}

mod keys_of_another_kind {
    use super::*;

    #[test]
    fn a_tool_rule_with_pattern_keys_is_refused_at_each_key() {
        // Reads as "allow bash only for ls", but a tool rule looks at nothing but `tools`.
        let found = errors(
            "[[rules]]\nname = \"ls-only\"\nmatch = \"tool\"\ntools = [\"shell\"]\nfield = \"command\"\npatterns = ['^ls( |$)']\ndecision = \"allow\"\n",
        );
        assert_eq!(
            found,
            vec![
                format!(
                    "p.toml:{}:1: error: rule ls-only: field does not belong to a match = \"tool\" rule, which uses only tools; it would be ignored",
                    line(5)
                ),
                format!(
                    "p.toml:{}:1: error: rule ls-only: patterns does not belong to a match = \"tool\" rule, which uses only tools; it would be ignored",
                    line(6)
                ),
            ]
        );
    }

    #[test]
    fn every_kind_refuses_the_keys_it_does_not_use() {
        for (kind, keys, stray) in [
            ("read_only", "", "tools = [\"shell\"]"),
            (
                "side_effect",
                "side_effects = [\"write\"]",
                "categories = [\"x\"]",
            ),
            (
                "category",
                "categories = [\"x\"]",
                "preset = \"dangerous_shell\"",
            ),
            ("tool", "tools = [\"shell\"]", "side_effects = [\"read\"]"),
            (
                "pattern",
                "field = \"command\"\npatterns = ['rm']",
                "categories = []",
            ),
        ] {
            let found = errors(&format!(
                "[[rules]]\nmatch = \"{kind}\"\n{keys}\n{stray}\ndecision = \"deny\"\n"
            ));
            let key = stray.split(' ').next().unwrap();
            assert!(
                found.iter().any(|e| e.contains(&format!(
                    "rule rules[0]: {key} does not belong to a match = \"{kind}\" rule"
                ))),
                "{kind}: {found:?}"
            );
        }
    }

    #[test]
    fn the_keys_of_a_rules_own_kind_are_accepted() {
        assert_eq!(
            errors(
                "[[rules]]\nname = \"n\"\nmatch = \"pattern\"\ntools = [\"shell\"]\nfield = \"command\"\npatterns = ['rm']\npreset = \"dangerous_shell\"\ndecision = \"deny\"\n\n[[rules]]\nmatch = \"read_only\"\ndecision = \"allow\"\n"
            ),
            Vec::<String>::new()
        );
    }
}
