//! The presets shipped in `policies/presets/*.toml`, embedded in the binary.

/// (name, TOML text) of every preset.
pub const PRESETS: &[(&str, &str)] = &[
    ("default", include_str!("../presets/default.toml")),
    ("examples", include_str!("../presets/examples.toml")),
];

/// The TOML text of a preset by name.
pub fn preset_text(name: &str) -> Option<&'static str> {
    PRESETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| *text)
}

/// A JSON Schema (2020-12) of the policy file format, for editors (`airlock schema`).
pub const POLICY_FILE_SCHEMA: &str = include_str!("../policy.schema.json");

/// The policy `airlock exec` and `airlock run` use when no file is given.
pub const DEFAULT_PRESET: &str = "default";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load_policy_str;

    #[test]
    fn every_preset_passes_check_without_errors() {
        for (name, text) in PRESETS {
            let loaded = load_policy_str(text, &format!("presets/{name}.toml"))
                .unwrap_or_else(|e| panic!("preset {name}: {e:?}"));
            assert!(
                loaded.policy.profiles.contains_key("default"),
                "{name} lacks a default profile"
            );
        }
    }

    #[test]
    fn presets_match_the_published_file_schema_and_typos_do_not() {
        let schema: serde_json::Value = serde_json::from_str(POLICY_FILE_SCHEMA).unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        let example = ("examples/gate", include_str!("../examples/gate.toml"));
        for (name, text) in PRESETS.iter().chain(std::iter::once(&example)) {
            let value: toml::Value = toml::from_str(text).unwrap();
            let json = serde_json::to_value(&value).unwrap();
            let errors: Vec<String> = validator
                .iter_errors(&json)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "{name}: {errors:?}");
        }
        let typo: toml::Value = toml::from_str("version = 1\n[profiles.p]\nmemroy = 1\n").unwrap();
        assert!(!validator.is_valid(&serde_json::to_value(&typo).unwrap()));
    }

    #[test]
    fn default_preset_has_the_documented_default_profile() {
        let loaded = load_policy_str(preset_text(DEFAULT_PRESET).unwrap(), "default.toml").unwrap();
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let p = &loaded.policy.profiles["default"];
        assert_eq!(p.limits.memory_bytes, 256 << 20);
        assert_eq!(p.limits.pids, 64);
        assert_eq!(p.limits.timeout, std::time::Duration::from_secs(30));
        assert_eq!(p.spec.network, airlock_protocol::NetworkMode::None);
        assert!(p.spec.mounts.iter().any(
            |m| matches!(m, airlock_protocol::MountOp::Tmpfs { target, .. } if target == "/tmp")
        ));
        assert!(
            p.spec
                .mounts
                .iter()
                .all(|m| !matches!(m, airlock_protocol::MountOp::Bind { writable: true, .. }))
        );
    }
}
