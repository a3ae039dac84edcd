//! Policy validation as `airlock check` reports it: every error at once, at its position.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use airlock_policy::validate::{ArgTemplate, SideEffect, StdinSource};
use airlock_policy::{PolicyError, Severity, load_policy_str};
use serde_json::json;

const PROFILE: &str = r#"
version = 1
[profiles.default]
read = ["/usr"]
tmpfs = { "/tmp" = "16MiB" }
"#;

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

fn warnings(text: &str) -> Vec<String> {
    load_policy_str(text, "p.toml")
        .unwrap_or_else(|e| panic!("{e:?}"))
        .warnings
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn tool(body: &str) -> String {
    format!("{PROFILE}\n[tools.t]\n{body}\n")
}

const INPUT: &str = r#"input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }"#;

#[test]
fn three_different_mistakes_give_three_located_errors() {
    let text = r#"version = 1
[profiles.default]
read = ["usr"]
limits = { memory = "lots", timeout = "30s" }

[tools.Bad_Name]
description = "x"
command = ["/bin/true"]
input = { type = "object" }
"#;
    let found = errors(text);
    assert_eq!(
        found,
        vec![
            "p.toml:3:9: error: read path \"usr\" must be absolute",
            "p.toml:4:21: error: limits.memory: expected a number followed by a unit, like \"256MiB\"",
            "p.toml:6:8: error: tool name \"Bad_Name\" must match ^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$ (at most 64 characters)",
        ]
    );
}

#[test]
fn syntax_errors_and_unknown_keys_are_located() {
    let found = errors("version = 1\n[profiles.default]\nread = [\"/usr\"\n");
    assert_eq!(found.len(), 1);
    assert!(found[0].starts_with("p.toml:3:"), "{found:?}");
    let found = errors("version = 1\n[profiles.default]\nmemroy = 1\n");
    assert_eq!(found.len(), 1);
    assert!(
        found[0].starts_with("p.toml:3:1: error: unknown key `memroy` in `profiles.default`"),
        "{found:?}"
    );
}

#[test]
fn wrong_version_is_an_error() {
    assert_eq!(
        errors("version = 2\n"),
        vec!["p.toml:1:11: error: version must be 1, not 2"]
    );
}

#[test]
fn paths_must_be_absolute_normalised_and_free_of_dotdot() {
    for (path, problem) in [
        ("usr", "must be absolute"),
        ("/usr/../etc", "must not contain `..`"),
        ("/usr/./lib", "no `.` components"),
        ("/usr//lib", "no repeated or trailing `/`"),
        ("/usr/", "no repeated or trailing `/`"),
    ] {
        let found = errors(&format!(
            "version = 1\n[profiles.default]\nread = [{path:?}]\n"
        ));
        assert_eq!(found.len(), 1, "{path}: {found:?}");
        assert!(found[0].contains(problem), "{path}: {found:?}");
    }
}

#[test]
fn duplicate_and_reserved_paths_are_errors() {
    let found = errors(
        "version = 1\n[profiles.default]\nread = [\"/usr\", \"/proc\"]\nwrite = [\"/usr\"]\n",
    );
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("mounted by airlock itself"));
    assert!(found[1].contains("listed more than once"));
}

#[test]
fn limits_outside_sane_bounds_are_errors() {
    let found = errors(
        "version = 1\n[profiles.default]\nlimits = { memory = \"1KiB\", pids = 0, timeout = \"48h\", output = \"1GiB\", open_files = 2, cpu = \"1.5s\" }\n",
    );
    assert_eq!(found.len(), 6, "{found:?}");
}

#[test]
fn timeouts_must_be_positive_durations_and_retries_non_negative() {
    let found = errors(&tool(&format!(
        "description = \"d\"\ncommand = [\"/bin/true\"]\ntimeout = \"0s\"\nretries = -1\n{INPUT}"
    )));
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("greater than zero"));
    assert!(found[1].contains("retries must be between 0 and 10"));
}

#[test]
fn blank_description_and_missing_profile_are_errors() {
    let found = errors(&tool(&format!(
        "description = \"  \"\nprofile = \"nope\"\ncommand = [\"/bin/true\"]\n{INPUT}"
    )));
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("description must not be blank"));
    assert!(found[1].contains("profile \"nope\" is not defined"));
}

#[test]
fn schemas_must_compile_and_describe_objects() {
    let found = errors(&tool(
        "description = \"d\"\ncommand = [\"/bin/true\"]\ninput = { type = \"nonsense\" }",
    ));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("input schema: schema does not compile"),
        "{found:?}"
    );
    let found = errors(&tool(
        "description = \"d\"\ncommand = [\"/bin/true\"]\ninput = { type = \"string\" }",
    ));
    assert!(
        found[0].contains("must have type = \"object\""),
        "{found:?}"
    );
    let found = errors(&tool(&format!(
        "description = \"d\"\ncommand = [\"/bin/true\"]\n{INPUT}\noutput = {{ type = 5 }}"
    )));
    assert!(found[0].contains("output schema"), "{found:?}");
}

#[test]
fn command_fields_are_whole_required_scalar_arguments() {
    let cases = [
        (r#"["{text}"]"#, "executable must be a literal path"),
        (r#"["/bin/echo", "--x={text}"]"#, "whole arguments only"),
        (
            r#"["/bin/echo", "{other}"]"#,
            "not a property of the input schema",
        ),
        (r#"["echo"]"#, "must be absolute"),
        (r#"[]"#, "must name an executable"),
    ];
    for (command, problem) in cases {
        let found = errors(&tool(&format!(
            "description = \"d\"\ncommand = {command}\n{INPUT}"
        )));
        assert_eq!(found.len(), 1, "{command}: {found:?}");
        assert!(found[0].contains(problem), "{command}: {found:?}");
    }
    let optional = r#"input = { type = "object", properties = { text = { type = "string" } } }"#;
    let found = errors(&tool(&format!(
        "description = \"d\"\ncommand = [\"/bin/echo\", \"{{text}}\"]\n{optional}"
    )));
    assert!(found[0].contains("required"), "{found:?}");
    let array = r#"input = { type = "object", properties = { text = { type = "array" } }, required = ["text"] }"#;
    let found = errors(&tool(&format!(
        "description = \"d\"\ncommand = [\"/bin/echo\", \"{{text}}\"]\n{array}"
    )));
    assert!(found[0].contains("scalar type"), "{found:?}");
}

#[test]
fn unknown_or_never_allowed_syscalls_are_errors() {
    let found = errors(
        "version = 1\n[profiles.default]\nsyscalls = { allow = [\"ptrace\", \"io_uring_setup\", \"frobnicate\"], deny = [\"nope\"] }\n",
    );
    assert_eq!(found.len(), 4, "{found:?}");
    assert!(found[0].contains("can never be allowed"));
    assert!(found[1].contains("can never be allowed"));
    assert!(found[2].contains("unknown syscall \"frobnicate\""));
    assert!(found[3].contains("unknown syscall \"nope\""));
}

#[test]
fn risky_grants_are_warnings_not_errors() {
    let found = warnings(
        "version = 1\n[profiles.default]\nwrite = [\"/\"]\nnetwork = \"host\"\nrequire = { landlock = \"best_effort\" }\n",
    );
    assert_eq!(found.len(), 4, "{found:?}");
    assert!(found[0].contains("write path \"/\" lets tools change the host system"));
    assert!(found[1].contains("\"/\" reaches the host's unix sockets in \"/run\""));
    assert!(found[2].contains("shares the host's network"), "{found:?}");
    assert!(found[2].contains("no TCP port is filtered"), "{found:?}");
    assert!(found[3].contains("landlock is best_effort"));
    let found = warnings("version = 1\n[profiles.default]\nread = [\"/sys\"]\n");
    assert!(found[0].contains("exposes host kernel state"));
}

#[test]
fn a_bind_that_reaches_the_hosts_socket_directories_is_a_warning() {
    // Of, inside and above them; a fresh tmpfs at /tmp and a sibling name are not.
    let found = warnings(
        "version = 1\n[profiles.default]\nread = [\"/usr\", \"/run/user/1000/bus\", \"/var\", \"/runner\"]\nread_optional = [\"/tmp/.X11-unix\"]\nwrite = [\"/var/tmp/out\"]\ntmpfs = { \"/tmp\" = \"1MiB\" }\n",
    );
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(
        found[0].contains("\"/run/user/1000/bus\" reaches the host's unix sockets in \"/run\""),
        "{found:?}"
    );
    assert!(
        found[0].contains("neither a read-only bind nor Landlock refuses"),
        "{found:?}"
    );
    assert!(
        found[1].contains("\"/var\" reaches the host's unix sockets in \"/var/run\""),
        "{found:?}"
    );
    assert!(found[2].contains("\"/tmp/.X11-unix\" reaches"), "{found:?}");
    assert!(
        found.iter().all(|w| !w.contains("/var/tmp/out")),
        "{found:?}"
    );
}

#[test]
fn a_mount_inside_a_writable_path_is_a_warning() {
    let found = warnings(
        "version = 1\n[profiles.default]\nread = [\"/usr\", \"/work/ws/cfg/ssh\", \"/work/wsx\"]\nwrite = [\"/work/ws\"]\ntmpfs = { \"/work/ws/tmp\" = \"1MiB\" }\n",
    );
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].contains("\"/work/ws/cfg/ssh\" is mounted inside writable path \"/work/ws\""),
        "{found:?}"
    );
    assert!(
        found[1].contains("\"/work/ws/tmp\" is mounted inside"),
        "{found:?}"
    );
    // A sibling that merely shares a prefix is not inside.
    assert!(!found.iter().any(|w| w.contains("/work/wsx")), "{found:?}");
}

#[test]
fn bad_network_rules_and_requirements_are_errors() {
    let found = errors(
        "version = 1\n[profiles.default]\nnetwork = { mode = \"host\", connect = [\"udp:53\", \"tcp:0\", \"tcp:443\"] }\nrequire = { seccomp = \"maybe\" }\n",
    );
    assert_eq!(found.len(), 3, "{found:?}");
    let found = errors("version = 1\n[profiles.default]\nnetwork = \"everything\"\n");
    assert!(found[0].contains("network must be"), "{found:?}");
}

#[test]
fn a_valid_tool_compiles_to_argv_and_stdin() {
    let text = tool(&format!(
        "description = \"d\"\ncommand = [\"/usr/bin/grep\", \"-c\", \"{{text}}\"]\nstdin = \"$input\"\nside_effect = \"read\"\n{INPUT}"
    ));
    let loaded = load_policy_str(&text, "p.toml").unwrap();
    let t = &loaded.policy.tools["t"];
    assert_eq!(
        t.tool.command,
        vec![
            ArgTemplate::Literal("/usr/bin/grep".into()),
            ArgTemplate::Literal("-c".into()),
            ArgTemplate::Field("text".into())
        ]
    );
    assert_eq!(t.tool.stdin, StdinSource::WholeInput);
    assert_eq!(t.tool.side_effect, SideEffect::Read);
    let input = json!({"text": "a b; rm -rf / $(x)"});
    assert_eq!(
        t.render_argv(&input).unwrap(),
        vec!["/usr/bin/grep", "-c", "a b; rm -rf / $(x)"]
    );
    assert_eq!(
        t.render_stdin(&input),
        br#"{"text":"a b; rm -rf / $(x)"}"#.to_vec()
    );
    assert_eq!(loaded.policy.version.len(), 64);
}

#[test]
fn side_effect_defaults_to_destructive() {
    let loaded = load_policy_str(
        &tool(&format!(
            "description = \"d\"\ncommand = [\"/bin/true\"]\n{INPUT}"
        )),
        "p.toml",
    )
    .unwrap();
    assert_eq!(
        loaded.policy.tools["t"].tool.side_effect,
        SideEffect::Destructive
    );
}

#[test]
fn tools_need_exactly_one_known_builtin_or_a_command_with_an_input_schema() {
    let both = errors(&tool(&format!(
        "description = \"d\"\ncommand = [\"/bin/true\"]\nbuiltin = \"bash\"\n{INPUT}"
    )));
    assert!(both[0].contains("either command or builtin"), "{both:?}");
    let neither = errors(&tool("description = \"d\""));
    assert!(
        neither[0].contains("needs a command or a builtin"),
        "{neither:?}"
    );
    let unknown = errors(&tool("description = \"d\"\nbuiltin = \"rm_rf\""));
    assert!(
        unknown[0].contains("unknown builtin \"rm_rf\""),
        "{unknown:?}"
    );
    let no_input = errors(&tool("description = \"d\"\ncommand = [\"/bin/true\"]"));
    assert!(no_input[0].contains("need an input schema"), "{no_input:?}");
    let loaded = load_policy_str(
        &tool("description = \"d\"\nbuiltin = \"read_file\""),
        "p.toml",
    )
    .unwrap();
    let t = &loaded.policy.tools["t"];
    assert_eq!(t.tool.side_effect, SideEffect::Read);
    assert!(t.tool.command.is_empty());
    assert!(t.input.check_value(&json!({"path": "/x"})).is_ok());
    assert!(
        t.input
            .check_value(&json!({"path": "/x", "more": 1}))
            .is_err()
    );
}

mod gate {
    use super::*;
    use airlock_policy::rules::{Decision, decide};

    const TOOLS: &str = r#"
[tools.reader]
description = "reads"
builtin = "read_file"
category = "files"

[tools.shell]
description = "runs a shell"
builtin = "bash"

[tools.writer]
description = "writes"
builtin = "write_file"
category = "files"
"#;

    /// `top` holds top-level keys (they must precede every table); `rules` the [[rules]].
    fn policy_with(top: &str, rules: &str) -> airlock_policy::CompiledPolicy {
        let text = format!("{top}\n{PROFILE}{TOOLS}\n{rules}");
        load_policy_str(&text, "p.toml")
            .unwrap_or_else(|e| panic!("{e:?}"))
            .policy
    }

    fn verdict(
        policy: &airlock_policy::CompiledPolicy,
        tool: &str,
        input: serde_json::Value,
    ) -> (Decision, String) {
        let v = decide(&policy.gate, &policy.tools[tool].tool, &input);
        (v.decision, v.rule)
    }

    #[test]
    fn every_rule_kind_decides_and_the_first_match_wins() {
        let p = policy_with(
            "default_decision = \"review\"",
            r#"[[rules]]
name = "no-dangerous-shell"
match = "pattern"
tools = ["shell"]
field = "command"
preset = "dangerous_shell"
decision = "deny"

[[rules]]
name = "no-secrets-path"
match = "pattern"
field = "path"
patterns = ['^/etc/']
decision = "deny"

[[rules]]
name = "reads-are-fine"
match = "read_only"
decision = "allow"

[[rules]]
name = "shell-needs-review"
match = "tool"
tools = ["shell"]
decision = "review"

[[rules]]
name = "files-ok"
match = "category"
categories = ["files"]
decision = "allow"
"#,
        );
        assert_eq!(
            verdict(&p, "shell", json!({"command": "rm -rf /"})),
            (Decision::Deny, "no-dangerous-shell".into())
        );
        assert_eq!(
            verdict(&p, "shell", json!({"command": "ls"})),
            (Decision::Review, "shell-needs-review".into())
        );
        assert_eq!(
            verdict(&p, "reader", json!({"path": "/etc/shadow"})),
            (Decision::Deny, "no-secrets-path".into())
        );
        assert_eq!(
            verdict(&p, "reader", json!({"path": "/tmp/x"})),
            (Decision::Allow, "reads-are-fine".into())
        );
        assert_eq!(
            verdict(&p, "writer", json!({"path": "/tmp/x", "content": ""})),
            (Decision::Allow, "files-ok".into())
        );
    }

    #[test]
    fn the_default_decision_applies_when_nothing_matches() {
        let p = policy_with("default_decision = \"deny\"", "");
        assert_eq!(
            verdict(&p, "shell", json!({"command": "ls"})),
            (Decision::Deny, "default".into())
        );
        let p = policy_with("", "");
        assert_eq!(
            verdict(&p, "shell", json!({"command": "ls"})),
            (Decision::Allow, "default".into())
        );
    }

    #[test]
    fn bad_rules_are_located_errors() {
        let text = format!(
            "{PROFILE}{TOOLS}\n[[rules]]\nmatch = \"tool\"\ntools = [\"nope\"]\ndecision = \"maybe\"\n\n[[rules]]\nmatch = \"pattern\"\nfield = \"command\"\npatterns = [\"(\"]\ndecision = \"deny\"\n\n[[rules]]\nmatch = \"vibes\"\ndecision = \"allow\"\n"
        );
        let found = errors(&text);
        assert_eq!(found.len(), 4, "{found:?}");
        assert!(found[0].contains("no tool named \"nope\""));
        assert!(found[1].contains("decision must be allow, deny or review"));
        assert!(found[2].contains("bad pattern"));
        assert!(found[3].contains("match must be"));
    }

    #[test]
    fn tool_metadata_is_validated_and_over_grants_are_errors() {
        let over = "version = 1\n[profiles.default]\nwrite = [\"/srv\"]\nnetwork = \"loopback\"\n[tools.t]\ndescription = \"d\"\nbuiltin = \"read_file\"\npermissions = [\"fs:read\"]\n";
        let e = errors(over);
        assert!(
            e.iter().any(|e| e.contains("does not declare fs:write")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|e| e.contains("does not declare network")),
            "{e:?}"
        );
        let text = "version = 1\n[profiles.default]\nread = [\"/usr\"]\n[tools.t]\ndescription = \"d\"\nbuiltin = \"read_file\"\npermissions = [\"fs:read\"]\nstate = \"deferred\"\nrate_limit = \"5/1m\"\nconcurrency_safe = true\n".to_string();
        let loaded = load_policy_str(&text, "p.toml").unwrap();
        let t = &loaded.policy.tools["t"].tool;
        assert_eq!(t.state, airlock_policy::validate::ToolState::Deferred);
        assert!(t.concurrency_safe);
        assert_eq!(t.rate_limit.unwrap().calls, 5);
        let bad = errors(&format!(
            "{PROFILE}[tools.t]\ndescription = \"d\"\nbuiltin = \"bash\"\npermissions = [\"root\"]\nstate = \"on\"\nrate_limit = \"lots\"\n"
        ));
        assert_eq!(bad.len(), 3, "{bad:?}");
    }
}

#[test]
fn cpu_quota_is_a_percentage_of_one_core() {
    let ok = load_policy_str(
        "version = 1\n[profiles.default]\nlimits = { cpu_quota = \"150%\" }\n",
        "p.toml",
    )
    .unwrap();
    assert_eq!(
        ok.policy.profiles["default"].limits.cpu_quota_percent,
        Some(150)
    );
    for bad in ["\"0%\"", "\"lots\"", "\"50\"", "\"30000%\""] {
        let found = errors(&format!(
            "version = 1\n[profiles.default]\nlimits = {{ cpu_quota = {bad} }}\n"
        ));
        assert!(found[0].contains("limits.cpu_quota"), "{bad}: {found:?}");
    }
}

#[test]
fn proc_is_masked_unless_a_profile_opts_into_the_full_view() {
    let hidden = |extra: &str| {
        let loaded = load_policy_str(
            &format!("version = 1\n[profiles.default]\n{extra}\n"),
            "p.toml",
        )
        .unwrap();
        loaded.policy.profiles["default"]
            .spec
            .mounts
            .iter()
            .find_map(|op| match op {
                airlock_protocol::MountOp::Proc { hide, .. } => Some(hide.clone()),
                _ => None,
            })
            .unwrap()
    };
    let masked = hidden("");
    for entry in [
        "cmdline",
        "config.gz",
        "sys/kernel/random/boot_id",
        "pressure",
    ] {
        assert!(masked.iter().any(|h| h == entry), "{entry}: {masked:?}");
    }
    assert_eq!(hidden("proc = \"masked\""), masked);
    assert_eq!(hidden("proc = \"full\""), Vec::<String>::new());
    assert_eq!(
        errors("version = 1\n[profiles.default]\nproc = \"none\"\n"),
        vec!["p.toml:3:8: error: proc must be \"masked\" or \"full\", not \"none\""]
    );
}

fn profile_with_network(network: &str) -> String {
    format!("version = 1\n[profiles.default]\nread = [\"/usr\"]\nnetwork = {network}\n")
}

#[test]
fn every_bad_egress_entry_is_its_own_located_error() {
    let found = errors(&profile_with_network(
        r#"{ allow = ["pypi.org", "exa mple.com", "api.github.com:0", "*.", "[::1"], allow_addresses = ["127.0.0.1/32", "10.0.0.1/8", "300.0.0.0/8"] }"#,
    ));
    assert_eq!(found.len(), 6, "{found:?}");
    for (error, entry) in found.iter().zip([
        "exa mple.com",
        "api.github.com:0",
        "*.",
        "[::1",
        "10.0.0.1/8",
        "300.0.0.0/8",
    ]) {
        assert!(error.starts_with("p.toml:4:11: error: network."), "{error}");
        assert!(
            error.contains(&format!("{entry:?}")),
            "{error} should name {entry}"
        );
    }
}

#[test]
fn a_network_table_says_which_network_it_means() {
    let neither = errors(&profile_with_network(r#"{ connect = ["tcp:443"] }"#));
    assert_eq!(neither.len(), 1, "{neither:?}");
    assert!(neither[0].contains("mode = \"host\""), "{neither:?}");
    let both = errors(&profile_with_network(
        r#"{ mode = "host", allow = ["pypi.org"] }"#,
    ));
    assert!(both[0].contains("exclude each other"), "{both:?}");
    let mixed = errors(&profile_with_network(
        r#"{ allow = ["pypi.org"], connect = ["tcp:443"] }"#,
    ));
    assert!(mixed[0].contains("belong to mode = \"host\""), "{mixed:?}");
    let addresses_on_host = errors(&profile_with_network(
        r#"{ mode = "host", allow_addresses = ["10.0.0.0/8"] }"#,
    ));
    assert!(
        addresses_on_host[0].contains("egress proxy"),
        "{addresses_on_host:?}"
    );
    let other_mode = errors(&profile_with_network(r#"{ mode = "loopback" }"#));
    assert!(other_mode[0].contains("must be \"host\""), "{other_mode:?}");
}

#[test]
fn an_egress_profile_gets_its_own_namespace_a_listener_and_the_proxy_variables() {
    let text = format!(
        "{}env = {{ PATH = \"/usr/bin\", HTTPS_PROXY = \"http://attacker:1\" }}\n",
        profile_with_network(r#"{ allow = ["pypi.org", "*.pythonhosted.org"] }"#)
    );
    let loaded = load_policy_str(&text, "p.toml").unwrap();
    let profile = &loaded.policy.profiles["default"];
    assert_eq!(
        profile.spec.network,
        airlock_protocol::NetworkMode::Loopback
    );
    assert_eq!(
        profile.spec.egress_port,
        Some(airlock_policy::compile::EGRESS_PORT)
    );
    let egress = profile.egress.as_ref().expect("an allowlist");
    assert_eq!(egress.hosts().len(), 2);
    let env = &profile.spec.env;
    let value = |name: &str| {
        let found: Vec<&String> = env
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v)
            .collect();
        assert_eq!(found.len(), 1, "{name} set once: {env:?}");
        found[0].clone()
    };
    let http = format!("http://127.0.0.1:{}", airlock_policy::compile::EGRESS_PORT);
    assert_eq!(
        value("HTTPS_PROXY"),
        http,
        "the profile's own proxy is replaced"
    );
    assert_eq!(value("http_proxy"), http);
    assert!(value("ALL_PROXY").starts_with("socks5h://127.0.0.1:"));
    assert_eq!(value("PATH"), "/usr/bin");
}

#[test]
fn a_host_network_refuses_udp_unless_the_profile_allows_it() {
    use airlock_policy::seccomp::SocketFamilies;
    let families = |network: &str| {
        let text = profile_with_network(network);
        let file = airlock_policy::parse_policy_str(&text, "p.toml").unwrap();
        let source = airlock_policy::diagnostic::Source::new("p.toml", &text);
        let (validated, _) = airlock_policy::validate::validate_policy(&file, source).unwrap();
        validated.profiles["default"].syscalls.families
    };
    assert_eq!(families("\"host\""), SocketFamilies::UnixAndInetStreams);
    assert_eq!(
        families(r#"{ mode = "host", connect = ["tcp:443"] }"#),
        SocketFamilies::UnixAndInetStreams
    );
    assert_eq!(
        families(r#"{ mode = "host", udp = true }"#),
        SocketFamilies::UnixAndInet
    );
    assert_eq!(families(r#"{ allow = [] }"#), SocketFamilies::UnixAndInet);
    assert_eq!(families("\"none\""), SocketFamilies::UnixOnly);
}

#[test]
fn a_host_network_with_empty_port_lists_allows_no_tcp_port() {
    let landlock = |network: &str| {
        let loaded = load_policy_str(&profile_with_network(network), "p.toml")
            .unwrap_or_else(|e| panic!("{e:?}"));
        loaded.policy.profiles["default"].spec.landlock.clone()
    };
    let empty = landlock(r#"{ mode = "host", connect = [], bind = [] }"#);
    assert!(empty.restrict_tcp, "empty lists must not mean every port");
    assert!(empty.tcp_connect.is_empty() && empty.tcp_bind.is_empty());
    let connect_only = landlock(r#"{ mode = "host", connect = [] }"#);
    assert!(connect_only.restrict_tcp);
    let some = landlock(r#"{ mode = "host", connect = ["tcp:443"] }"#);
    assert!(some.restrict_tcp);
    assert_eq!(some.tcp_connect, vec![443]);
    assert!(some.tcp_bind.is_empty());
    // Lists left out: the host's TCP as it is, as documented for network = "host".
    assert!(!landlock(r#"{ mode = "host", udp = true }"#).restrict_tcp);
    assert!(!landlock("\"host\"").restrict_tcp);
    let w = warnings(&profile_with_network(
        r#"{ mode = "host", connect = [], bind = [] }"#,
    ));
    assert!(
        w.iter().any(|w| w.contains("(no TCP port is allowed)")),
        "{w:?}"
    );
}
