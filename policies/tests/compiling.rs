//! Compiling a validated policy: what validation already compiled is used as it is, and
//! profiles with the same syscalls get the same seccomp program.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use airlock_policy::load_policy_str;
use serde_json::json;

const POLICY: &str = r#"
version = 1
[profiles.default]
read = ["/usr"]

[profiles.same]
read = ["/etc"]

[profiles.stricter]
read = ["/usr"]
syscalls = { base = "default", deny = ["uname"] }

[tools.echo]
description = "prints its text"
command = ["/bin/echo", "{text}"]
input = { type = "object", properties = { text = { type = "string", maxLength = 8 } }, required = ["text"] }
output = { type = "object", required = ["said"] }

[tools.read]
description = "reads a file"
builtin = "read_file"
"#;

#[test]
fn profiles_with_the_same_syscalls_share_a_program_and_others_get_their_own() {
    let policy = load_policy_str(POLICY, "p.toml").unwrap().policy;
    let program = |name: &str| policy.profiles[name].spec.seccomp.clone();
    let (default, same, stricter) = (program("default"), program("same"), program("stricter"));
    assert_eq!(default.program, same.program);
    assert_eq!(default.digest, same.digest);
    assert_ne!(default.program, stricter.program);
    assert_ne!(default.digest, stricter.digest);
    // Each is what compiling its profile alone gives.
    for name in ["default", "same", "stricter"] {
        let alone = airlock_policy::compile::compile_profile_as(
            &load_validated(name),
            airlock_policy::seccomp::Form::Reporting,
        )
        .unwrap();
        assert_eq!(alone.spec.seccomp.program, program(name).program, "{name}");
    }
}

#[test]
fn compiled_tools_enforce_their_declared_and_built_in_schemas() {
    let policy = load_policy_str(POLICY, "p.toml").unwrap().policy;
    let echo = &policy.tools["echo"];
    assert!(echo.input.check_value(&json!({ "text": "hi" })).is_ok());
    for refused in [
        json!({}),
        json!({ "text": 1 }),
        json!({ "text": "far too long" }),
    ] {
        assert!(echo.input.check_value(&refused).is_err(), "{refused}");
    }
    let output = echo.output.as_ref().unwrap();
    assert!(output.check_value(&json!({ "said": "hi" })).is_ok());
    assert!(output.check_value(&json!({})).is_err());
    // The built-in's schema is not declared in the file: compiled from its own.
    let read = &policy.tools["read"];
    assert!(read.input.check_value(&json!({})).is_err());
}

fn load_validated(profile: &str) -> airlock_policy::validated::Profile {
    let source = airlock_policy::Source::new("p.toml", POLICY);
    let file = toml::from_str(POLICY).unwrap();
    let (validated, _) = airlock_policy::validate::validate_policy(&file, source).unwrap();
    validated.profiles[profile].clone()
}
