//! `airlock explain`: the effective sandbox of one tool or profile in plain words — paths,
//! network, syscalls, limits, environment, layer requirements, and for a tool how it is
//! run and approved — so a security engineer can review a policy without reading TOML.
//!
//! Built from the validated policy (which keeps what compilation folds away, such as the
//! syscall lists), after the same load as `airlock run` so an invalid policy is refused
//! with the same diagnostics.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use airlock_policy::compile::HIDDEN_IN_PROC;
use airlock_policy::rules::{Decision, GatePolicy, RateLimit, RuleMatch};
use airlock_policy::seccomp::{DEFAULT_ALLOW, DENIED_EPERM_GROUPS, SocketFamilies};
use airlock_policy::units::{format_duration, format_size};
use airlock_policy::validate::{
    Approval, ArgTemplate, Network, ProcView, Profile, SideEffect, StdinSource, Tool, ToolState,
    ValidatedPolicy, validate_policy,
};
use airlock_policy::{PolicyError, Source, load_policy_str, parse_policy_str, presets};
use airlock_protocol::Requirement;
use serde::Serialize;
use serde_json::Value;

/// Options of `airlock explain`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("subject").required(true).args(["tool", "profile"])))]
pub struct ExplainArgs {
    /// Policy file (default: the embedded `examples` preset for --tool, `default` for
    /// --profile, as `airlock run` and `airlock exec` use them).
    #[arg(long, conflicts_with = "preset")]
    pub policy: Option<PathBuf>,
    /// Embedded preset to use instead of a file.
    #[arg(long)]
    pub preset: Option<String>,
    /// Explain this tool (and the profile it runs in).
    #[arg(long)]
    pub tool: Option<String>,
    /// Explain this profile.
    #[arg(long)]
    pub profile: Option<String>,
    /// Print the explanation as one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Everything `explain` says, as `--json` prints it.
#[derive(Debug, Serialize)]
struct Explanation {
    /// The policy file or `preset:NAME`.
    policy: String,
    /// SHA-256 of the policy text.
    policy_version: String,
    /// The tool, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    tool: Option<ToolFacts>,
    /// The profile (the tool's, when a tool was asked for).
    profile: ProfileFacts,
    /// Warnings `airlock check` gives for the policy.
    warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
struct ToolFacts {
    name: String,
    description: String,
    profile: String,
    /// argv template (`{field}` for input fields), empty for a built-in.
    command: Vec<String>,
    /// The built-in run instead of a command.
    builtin: Option<String>,
    stdin: String,
    side_effect: SideEffect,
    category: Option<String>,
    approval: Approval,
    retries: u32,
    timeout_ms: u64,
    timeout: String,
    input: InputFacts,
    /// The tool's stdout must be JSON matching an output schema.
    output_schema: bool,
    /// What the gate does with its calls.
    gate: GateFacts,
}

#[derive(Debug, Serialize)]
struct GateFacts {
    /// active | deferred | suspended.
    state: ToolState,
    /// Rules that can fire for this tool, in order, up to the first that always does.
    rules: Vec<RuleFacts>,
    /// The decision when no conditional rule fires.
    decision: Decision,
    /// The rule giving it, or `default`.
    decision_rule: String,
    /// When a human must approve a call.
    human_approval: String,
    /// Allowed in plan mode (read-only tools only).
    plan_mode: bool,
    rate_limits: Vec<String>,
    /// Declared permissions, when declared.
    permissions: Option<Vec<String>>,
    concurrency_safe: bool,
}

#[derive(Debug, Serialize)]
struct RuleFacts {
    name: String,
    /// What the rule matches, in words.
    matches: String,
    decision: Decision,
    /// Fires only for some inputs (a pattern rule).
    conditional: bool,
}

#[derive(Debug, Serialize)]
struct InputFacts {
    required: Vec<String>,
    fields: Vec<FieldFacts>,
    /// Fields not in `properties` are refused.
    other_fields_refused: bool,
}

#[derive(Debug, Serialize)]
struct FieldFacts {
    name: String,
    kind: String,
    required: bool,
    constraints: Vec<String>,
}

#[derive(Debug, Serialize)]
struct PathFacts {
    path: String,
    /// Bound only when it exists on the host.
    optional: bool,
}

#[derive(Debug, Serialize)]
struct TmpfsFacts {
    path: String,
    size_bytes: u64,
    size: String,
}

#[derive(Debug, Serialize)]
struct NetworkFacts {
    /// `none` | `loopback` | `tcp`.
    mode: &'static str,
    summary: String,
    tcp_connect: Vec<u16>,
    tcp_bind: Vec<u16>,
}

#[derive(Debug, Serialize)]
struct SyscallGroup {
    name: &'static str,
    allowed: usize,
    of: usize,
}

#[derive(Debug, Serialize)]
struct DenialGroup {
    category: &'static str,
    syscalls: Vec<String>,
}

#[derive(Debug, Serialize)]
struct SyscallFacts {
    /// Syscalls that run normally.
    allowed_count: usize,
    /// What every other syscall gets.
    otherwise: &'static str,
    groups: Vec<SyscallGroup>,
    /// Allowed beyond the default base (`syscalls.allow`).
    added: Vec<String>,
    /// The profile's own `syscalls.deny` (EPERM).
    denied_by_profile: Vec<String>,
    /// The fixed EPERM list, by category.
    always_eperm: Vec<DenialGroup>,
    /// EPERM depending on arguments.
    argument_rules: Vec<String>,
    /// Never allowed, answered with ENOSYS so runtimes fall back.
    always_enosys: Vec<&'static str>,
    socket_families: Vec<&'static str>,
}

#[derive(Debug, Serialize)]
struct LimitFacts {
    memory_bytes: u64,
    memory: String,
    pids: u64,
    timeout_ms: u64,
    timeout: String,
    cpu_seconds: Option<u64>,
    cpu: String,
    output_bytes: u64,
    output: String,
    open_files: u64,
    file_size_bytes: u64,
    file_size: String,
}

#[derive(Debug, Serialize)]
struct RequireFacts {
    landlock: &'static str,
    seccomp: &'static str,
    cgroup: &'static str,
}

/// What the sandbox's `/proc` shows.
#[derive(Debug, Serialize)]
struct ProcFacts {
    /// `masked` or `full` (the profile's `proc`).
    view: &'static str,
    /// Entries covered with empty ones, relative to `/proc`.
    hidden: Vec<&'static str>,
}

#[derive(Debug, Serialize)]
struct ProfileFacts {
    name: String,
    read_only: Vec<PathFacts>,
    read_write: Vec<PathFacts>,
    tmpfs: Vec<TmpfsFacts>,
    network: NetworkFacts,
    syscalls: SyscallFacts,
    limits: LimitFacts,
    env: BTreeMap<String, String>,
    hostname: String,
    cwd: String,
    proc: ProcFacts,
    namespaces: Vec<&'static str>,
    require: RequireFacts,
}

/// The groups of [`DEFAULT_ALLOW`], in its order, each named with its first member (the
/// list is written group by group in policies/src/seccomp.rs).
const SYSCALL_GROUPS: &[(&str, &str)] = &[
    ("descriptors and I/O", "read"),
    ("files and directories", "open"),
    ("memory", "mmap"),
    ("processes and threads", "clone"),
    ("signals and timers", "rt_sigaction"),
    ("time and randomness", "clock_gettime"),
    ("System V and POSIX IPC", "shmget"),
    ("sockets", "socket"),
    ("legacy asynchronous I/O", "io_setup"),
];

/// Syscalls no policy can allow, answered with ENOSYS (policies/src/seccomp.rs).
const ALWAYS_ENOSYS: [&str; 4] = [
    "clone3",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
];

/// The namespaces every worker gets (supervisor/src/sys.rs).
const NAMESPACES: [&str; 7] = ["user", "mount", "pid", "net", "ipc", "uts", "cgroup"];

/// Prints the explanation; exit 1 (with a message on stderr) for an unknown tool or
/// profile or a policy that does not load.
pub fn run_explain(args: &ExplainArgs) -> ExitCode {
    match explain(args) {
        Ok(text) => match crate::write_stdout(&text) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("airlock: error: {error:#}");
                ExitCode::FAILURE
            }
        },
        Err(error) => {
            eprintln!("airlock: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn explain(args: &ExplainArgs) -> anyhow::Result<String> {
    let fallback = if args.tool.is_some() {
        "examples"
    } else {
        presets::DEFAULT_PRESET
    };
    let (text, name) = match &args.policy {
        Some(path) => (
            std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read policy file {}: {e}", path.display()))?,
            path.display().to_string(),
        ),
        None => {
            let preset = args.preset.as_deref().unwrap_or(fallback);
            let text = presets::preset_text(preset).ok_or_else(|| {
                anyhow::anyhow!("no preset named {preset:?}; see `airlock preset`")
            })?;
            (text.to_string(), format!("preset:{preset}"))
        }
    };
    let (validated, version, warnings) = validate_text(&text, &name)?;

    let (tool, profile_name) = match (&args.tool, &args.profile) {
        (Some(tool_name), _) => {
            let tool = validated.tools.get(tool_name).ok_or_else(|| {
                anyhow::anyhow!(
                    "no tool named {tool_name:?} in {name}; its tools: {}",
                    names(validated.tools.keys())
                )
            })?;
            (Some(tool), tool.profile.clone())
        }
        (None, Some(profile_name)) => (None, profile_name.clone()),
        (None, None) => anyhow::bail!("give --tool NAME or --profile NAME"),
    };
    let profile = validated.profiles.get(&profile_name).ok_or_else(|| {
        anyhow::anyhow!(
            "no profile named {profile_name:?} in {name}; its profiles: {}",
            names(validated.profiles.keys())
        )
    })?;
    let explanation = Explanation {
        policy: name,
        policy_version: version,
        tool: tool.map(|t| describe_tool(t, &validated)),
        profile: describe_profile(profile),
        warnings,
    };
    if args.json {
        Ok(format!("{}\n", serde_json::to_string_pretty(&explanation)?))
    } else {
        Ok(render(&explanation))
    }
}

fn names<'a>(keys: impl Iterator<Item = &'a String>) -> String {
    let list: Vec<&str> = keys.map(String::as_str).collect();
    if list.is_empty() {
        "none".into()
    } else {
        list.join(", ")
    }
}

/// Loads the policy as `airlock run` does (so an invalid one is refused with the same
/// diagnostics), then validates it again to keep what compilation folds away.
fn validate_text(text: &str, name: &str) -> anyhow::Result<(ValidatedPolicy, String, Vec<String>)> {
    let loaded = match load_policy_str(text, name) {
        Ok(loaded) => loaded,
        Err(PolicyError::Invalid { diagnostics, file }) => {
            for d in &diagnostics {
                eprintln!("{d}");
            }
            anyhow::bail!("policy {file} is invalid");
        }
        Err(other) => return Err(other.into()),
    };
    let file = parse_policy_str(text, name).map_err(|d| anyhow::anyhow!("{d}"))?;
    let (validated, _) = validate_policy(&file, Source::new(name, text))
        .map_err(|_| anyhow::anyhow!("policy {name} is invalid"))?;
    let warnings = loaded.warnings.iter().map(ToString::to_string).collect();
    Ok((validated, loaded.policy.version, warnings))
}

fn requirement_word(requirement: Requirement) -> &'static str {
    match requirement {
        Requirement::Required => "required",
        Requirement::BestEffort => "best_effort",
    }
}

fn describe_profile(profile: &Profile) -> ProfileFacts {
    let paths = |grants: &[airlock_policy::validate::PathGrant]| {
        grants
            .iter()
            .map(|g| PathFacts {
                path: g.path.clone(),
                optional: g.optional,
            })
            .collect()
    };
    let limits = &profile.limits;
    ProfileFacts {
        name: profile.name.clone(),
        read_only: paths(&profile.read),
        read_write: paths(&profile.write),
        tmpfs: profile
            .tmpfs
            .iter()
            .map(|(path, size)| TmpfsFacts {
                path: path.clone(),
                size_bytes: *size,
                size: format_size(*size),
            })
            .collect(),
        network: describe_network(&profile.network),
        syscalls: describe_syscalls(profile),
        limits: LimitFacts {
            memory_bytes: limits.memory_bytes,
            memory: format_size(limits.memory_bytes),
            pids: limits.pids,
            timeout_ms: u64::try_from(limits.timeout.as_millis()).unwrap_or(u64::MAX),
            timeout: format_duration(limits.timeout),
            cpu_seconds: limits.cpu.map(|d| d.as_secs()),
            cpu: limits
                .cpu
                .map_or_else(|| "unlimited".to_string(), format_duration),
            output_bytes: limits.output_bytes,
            output: format_size(limits.output_bytes),
            open_files: limits.open_files,
            file_size_bytes: limits.file_size_bytes,
            file_size: format_size(limits.file_size_bytes),
        },
        env: profile.env.iter().cloned().collect(),
        hostname: profile.hostname.clone(),
        cwd: profile.cwd.clone(),
        proc: match profile.proc {
            ProcView::Masked => ProcFacts {
                view: "masked",
                hidden: HIDDEN_IN_PROC.to_vec(),
            },
            ProcView::Full => ProcFacts {
                view: "full",
                hidden: Vec::new(),
            },
        },
        namespaces: NAMESPACES.to_vec(),
        require: RequireFacts {
            landlock: requirement_word(profile.require.landlock),
            seccomp: requirement_word(profile.require.seccomp),
            cgroup: requirement_word(profile.require.cgroup),
        },
    }
}

fn ports(list: &[u16]) -> String {
    if list.is_empty() {
        "no port".into()
    } else {
        list.iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn describe_network(network: &Network) -> NetworkFacts {
    match network {
        Network::None => NetworkFacts {
            mode: "none",
            summary: "no network: only AF_UNIX sockets, in a network namespace with no \
                      interface up (a root supervisor on a kernel that scopes abstract \
                      unix sockets to each worker, Landlock ABI 6, shares one empty \
                      namespace between workers; elsewhere each gets a fresh one)"
                .into(),
            tcp_connect: Vec::new(),
            tcp_bind: Vec::new(),
        },
        Network::Loopback => NetworkFacts {
            mode: "loopback",
            summary: "loopback only: a fresh network namespace with just `lo` up (the \
                      sandbox can talk to itself, not to the host or the internet)"
                .into(),
            tcp_connect: Vec::new(),
            tcp_bind: Vec::new(),
        },
        Network::Tcp { connect, bind } => NetworkFacts {
            mode: "tcp",
            summary: format!(
                "the host network, TCP as the rules allow: connect to {}, bind to {} (Landlock, \
                 ABI 4 / Linux 6.7); abstract unix sockets scoped to the sandbox (ABI 6, \
                 required); other protocols such as UDP are not narrowed by Landlock",
                ports(connect),
                ports(bind)
            ),
            tcp_connect: connect.clone(),
            tcp_bind: bind.clone(),
        },
    }
}

fn describe_syscalls(profile: &Profile) -> SyscallFacts {
    let policy = &profile.syscalls;
    let allowed: Vec<&String> = policy
        .allow
        .iter()
        .filter(|s| !policy.deny.contains(*s))
        .collect();
    let is_allowed = |name: &str| allowed.iter().any(|s| s.as_str() == name);

    // Group boundaries by position of each group's first member in DEFAULT_ALLOW.
    let mut starts: Vec<(usize, &'static str)> = SYSCALL_GROUPS
        .iter()
        .filter_map(|(group, first)| {
            DEFAULT_ALLOW
                .iter()
                .position(|s| s == first)
                .map(|i| (i, *group))
        })
        .collect();
    starts.sort_unstable();
    let groups = starts
        .iter()
        .enumerate()
        .map(|(n, (start, group))| {
            let end = starts.get(n + 1).map_or(DEFAULT_ALLOW.len(), |(e, _)| *e);
            let members = DEFAULT_ALLOW.get(*start..end).unwrap_or_default();
            SyscallGroup {
                name: group,
                allowed: members.iter().filter(|s| is_allowed(s)).count(),
                of: members.len(),
            }
        })
        .collect();

    let always_eperm = DENIED_EPERM_GROUPS
        .iter()
        .map(|(category, members)| DenialGroup {
            category,
            syscalls: members.iter().map(|s| s.to_string()).collect(),
        })
        .filter(|g| !g.syscalls.is_empty())
        .collect();

    let families: Vec<&'static str> = match policy.families {
        SocketFamilies::UnixOnly => vec!["AF_UNIX"],
        SocketFamilies::UnixAndInet => vec!["AF_UNIX", "AF_INET", "AF_INET6"],
    };
    SyscallFacts {
        allowed_count: allowed.len(),
        otherwise: "ENOSYS",
        groups,
        added: allowed
            .iter()
            .filter(|s| !DEFAULT_ALLOW.contains(&s.as_str()))
            .map(|s| s.to_string())
            .collect(),
        denied_by_profile: policy.deny.iter().cloned().collect(),
        always_eperm,
        argument_rules: vec![
            "clone with any CLONE_NEW* flag (no nested namespaces)".into(),
            "ioctl TIOCSTI and TIOCLINUX (no typing into the terminal)".into(),
            format!(
                "socket and socketpair outside {}, and SOCK_RAW or SOCK_PACKET",
                families.join(", ")
            ),
            "mknod of character or block devices".into(),
            "personality changes (other than the harmless values)".into(),
        ],
        always_enosys: ALWAYS_ENOSYS.to_vec(),
        socket_families: families,
    }
}

fn describe_tool(tool: &Tool, policy: &ValidatedPolicy) -> ToolFacts {
    let input = describe_input(&tool.input_schema);
    let command = tool
        .command
        .iter()
        .map(|a| match a {
            ArgTemplate::Literal(text) => text.clone(),
            ArgTemplate::Field(field) => format!("{{{field}}}"),
        })
        .collect();
    let stdin = match &tool.stdin {
        StdinSource::Empty => "empty".to_string(),
        StdinSource::Field(field) => format!("the input field {field:?}"),
        StdinSource::WholeInput => "the whole input, as JSON".to_string(),
    };
    ToolFacts {
        name: tool.name.clone(),
        description: tool.description.clone(),
        profile: tool.profile.clone(),
        command,
        builtin: tool.builtin.map(|b| b.name().to_string()),
        stdin,
        side_effect: tool.side_effect,
        category: tool.category.clone(),
        approval: tool.approval,
        retries: tool.retries,
        timeout_ms: u64::try_from(tool.timeout.as_millis()).unwrap_or(u64::MAX),
        timeout: format_duration(tool.timeout),
        gate: describe_gate(&policy.gate, tool, &input),
        input,
        output_schema: tool.output_schema.is_some(),
    }
}

fn rate_text(limit: RateLimit) -> String {
    format!(
        "{} calls per {}",
        limit.calls,
        format_duration(limit.period)
    )
}

/// Which rules can decide this tool's calls (as `rules::decide` evaluates them: in order,
/// the first match wins), what is decided when no input-dependent rule fires, and when a
/// human must approve (a `review` decision or the tool's `approval = "human"`, as the gate
/// does).
fn describe_gate(gate: &GatePolicy, tool: &Tool, input: &InputFacts) -> GateFacts {
    let mut rules = Vec::new();
    let mut decision = (gate.default_decision, "default".to_string());
    for rule in &gate.rules {
        let (applies, conditional, matches) = match &rule.matches {
            RuleMatch::ReadOnly => (
                tool.side_effect == SideEffect::Read,
                false,
                "read-only tools".to_string(),
            ),
            RuleMatch::SideEffects(effects) => (
                effects.contains(&tool.side_effect),
                false,
                format!(
                    "side effects {}",
                    effects
                        .iter()
                        .map(|e| format!("{e:?}").to_lowercase())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            RuleMatch::Tools(names) => (
                names.contains(&tool.name),
                false,
                format!("tools {}", names.join(", ")),
            ),
            RuleMatch::Categories(categories) => (
                tool.category
                    .as_ref()
                    .is_some_and(|c| categories.contains(c)),
                false,
                format!("categories {}", categories.join(", ")),
            ),
            RuleMatch::Pattern {
                tools,
                field,
                patterns,
            } => {
                let may_have_field =
                    input.fields.iter().any(|f| &f.name == field) || !input.other_fields_refused;
                (
                    tools.contains(&tool.name) || (tools.is_empty() && may_have_field),
                    true,
                    format!(
                        "input field {field:?} matching one of {} pattern(s)",
                        patterns.len()
                    ),
                )
            }
        };
        if !applies {
            continue;
        }
        rules.push(RuleFacts {
            name: rule.name.clone(),
            matches,
            decision: rule.decision,
            conditional,
        });
        if !conditional {
            decision = (rule.decision, rule.name.clone());
            break;
        }
    }
    let human_approval = if tool.approval_implied {
        "every call (a destructive tool that declares no approval, under destructive_requires_approval)".to_string()
    } else if tool.approval == Approval::Human {
        "every call (the tool sets approval = \"human\")".to_string()
    } else {
        let mut when: Vec<String> = rules
            .iter()
            .filter(|r| r.conditional && r.decision == Decision::Review)
            .map(|r| format!("when rule {} fires", r.name))
            .collect();
        if decision.0 == Decision::Review {
            let by = if decision.1 == "default" {
                "the default decision".to_string()
            } else {
                format!("rule {}", decision.1)
            };
            when.push(if when.is_empty() {
                format!("every call ({by})")
            } else {
                format!("otherwise every call ({by})")
            });
        }
        if when.is_empty() {
            "never".to_string()
        } else {
            when.join("; ")
        }
    };
    let mut rate_limits = Vec::new();
    match (tool.rate_limit, gate.tool_rate) {
        (Some(own), _) => rate_limits.push(format!("{} for this tool", rate_text(own))),
        (None, Some(shared)) => rate_limits.push(format!(
            "{} for this tool (the policy's per-tool limit)",
            rate_text(shared)
        )),
        (None, None) => {}
    }
    if let Some(session) = gate.session_rate {
        rate_limits.push(format!("{} per session", rate_text(session)));
    }
    GateFacts {
        state: tool.state,
        rules,
        decision: decision.0,
        decision_rule: decision.1,
        human_approval,
        plan_mode: tool.side_effect == SideEffect::Read,
        rate_limits,
        permissions: tool.permissions.clone(),
        concurrency_safe: tool.concurrency_safe,
    }
}

fn decision_word(decision: Decision) -> &'static str {
    match decision {
        Decision::Allow => "allow",
        Decision::Deny => "deny",
        Decision::Review => "review (a human approves first)",
    }
}

fn render_gate(gate: &GateFacts, line: &mut impl FnMut(String)) {
    line(format!(
        "  state:       {}",
        match gate.state {
            ToolState::Active => "active (listed and callable)",
            ToolState::Deferred => "deferred (known, not offered yet)",
            ToolState::Suspended => "suspended (taken out of service)",
        }
    ));
    line("  gate rules:  in order, the first that matches decides".into());
    for rule in &gate.rules {
        line(format!(
            "               {}: {} -> {}",
            rule.name,
            rule.matches,
            decision_word(rule.decision)
        ));
    }
    let by = if gate.decision_rule == "default" {
        "the default decision".to_string()
    } else {
        format!("rule {}", gate.decision_rule)
    };
    let lead = if gate.rules.iter().any(|r| r.conditional) {
        "otherwise"
    } else {
        "every call"
    };
    line(format!(
        "               {lead}: {}, by {by}",
        decision_word(gate.decision)
    ));
    line(format!("  human approval: {}", gate.human_approval));
    line(format!(
        "  plan mode:   {}",
        if gate.plan_mode {
            "allowed (read-only tool)"
        } else {
            "refused (not a read-only tool)"
        }
    ));
    line(format!(
        "  rate limits: {}",
        if gate.rate_limits.is_empty() {
            "none".to_string()
        } else {
            gate.rate_limits.join("; ")
        }
    ));
    line(format!(
        "  permissions: {}{}",
        gate.permissions
            .as_ref()
            .map_or("not declared".to_string(), |p| p.join(", ")),
        if gate.concurrency_safe {
            "; safe to run concurrently"
        } else {
            ""
        }
    ));
}

/// The top level of an input schema: its fields, which are required, their constraints.
/// `schema` is the enforced document (`strict_objects` already applied).
fn describe_input(schema: &Value) -> InputFacts {
    let required: Vec<String> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let fields = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|properties| {
            properties
                .iter()
                .map(|(name, field)| FieldFacts {
                    name: name.clone(),
                    kind: field_kind(field),
                    required: required.contains(name),
                    constraints: field_constraints(field),
                })
                .collect()
        })
        .unwrap_or_default();
    let other_fields_refused = ["additionalProperties", "unevaluatedProperties"]
        .iter()
        .any(|k| schema.get(*k) == Some(&Value::Bool(false)));
    InputFacts {
        required,
        fields,
        other_fields_refused,
    }
}

fn field_kind(field: &Value) -> String {
    match field.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ if field.get("enum").is_some() => "enum".into(),
        _ => "any".into(),
    }
}

fn field_constraints(field: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let number = |key: &str| field.get(key).filter(|v| v.is_number());
    if let Some(n) = number("minLength") {
        out.push(format!("at least {n} characters"));
    }
    if let Some(n) = number("maxLength") {
        out.push(format!("at most {n} characters"));
    }
    if let Some(n) = number("minimum") {
        out.push(format!(">= {n}"));
    }
    if let Some(n) = number("maximum") {
        out.push(format!("<= {n}"));
    }
    if let Some(n) = number("maxItems") {
        out.push(format!("at most {n} items"));
    }
    if let Some(Value::String(pattern)) = field.get("pattern") {
        out.push(format!("matching /{pattern}/"));
    }
    if let Some(Value::String(format)) = field.get("format") {
        out.push(format!("format {format}"));
    }
    if let Some(Value::Array(values)) = field.get("enum") {
        let values: Vec<String> = values.iter().map(Value::to_string).collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    out
}

/// Quotes an argv element for display when it holds spaces or quotes.
fn display_arg(arg: &str) -> String {
    if !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,{}@%".contains(c))
    {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

fn render(e: &Explanation) -> String {
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    if let Some(tool) = &e.tool {
        render_tool(tool, &mut line);
        line(String::new());
    }
    render_profile(&e.profile, &e.policy, &mut line);
    if !e.warnings.is_empty() {
        line(String::new());
        line(format!("Warnings from `airlock check` for {}:", e.policy));
        for warning in &e.warnings {
            line(format!("  {warning}"));
        }
    }
    out
}

fn render_tool(tool: &ToolFacts, line: &mut impl FnMut(String)) {
    line(format!("Tool {}: {}", tool.name, tool.description));
    match &tool.builtin {
        Some(builtin) => line(format!(
            "  runs:        the built-in {builtin}, inside the sandbox (a confined child of the \
             worker), never on the host"
        )),
        None => {
            let argv: Vec<String> = tool.command.iter().map(|a| display_arg(a)).collect();
            line(format!("  runs:        {}", argv.join(" ")));
            if tool.command.iter().any(|a| a.starts_with('{')) {
                line(
                    "               each {field} becomes that input field as exactly one \
                     argument; no shell sees it"
                        .into(),
                );
            }
        }
    }
    line(format!("  stdin:       {}", tool.stdin));
    line(format!(
        "  side effect: {}",
        match tool.side_effect {
            SideEffect::Read => "read (only reads)",
            SideEffect::Write => "write (changes state)",
            SideEffect::Destructive => "destructive (may change state irreversibly)",
        }
    ));
    line(format!(
        "  category:    {}",
        tool.category.as_deref().unwrap_or("none")
    ));
    line(format!(
        "  approval:    {}",
        match tool.approval {
            Approval::Auto =>
                "auto (the tool itself demands no approval; the gate rules below decide)",
            Approval::Human =>
                "human (every call waits for a human's approval: propose, then execute)",
        }
    ));
    line(format!(
        "  retries:     {} extra attempt(s) after a retryable failure",
        tool.retries
    ));
    line(format!(
        "  timeout:     {} per attempt, then the whole process tree is killed",
        tool.timeout
    ));
    line(format!(
        "  input:       a JSON object checked against its schema before anything runs; \
         required: {}",
        if tool.input.required.is_empty() {
            "none".to_string()
        } else {
            tool.input.required.join(", ")
        }
    ));
    for field in &tool.input.fields {
        let mut words = vec![field.kind.clone()];
        words.push(
            if field.required {
                "required"
            } else {
                "optional"
            }
            .into(),
        );
        words.extend(field.constraints.iter().cloned());
        line(format!(
            "               {}: {}",
            field.name,
            words.join(", ")
        ));
    }
    if tool.input.other_fields_refused {
        line("               other fields are refused".into());
    }
    line(format!(
        "  output:      {}",
        if tool.output_schema {
            "JSON on stdout, checked against the output schema"
        } else {
            "stdout as text"
        }
    ));
    render_gate(&tool.gate, line);
    line(format!("  profile:     {} (below)", tool.profile));
}

fn render_paths(paths: &[PathFacts], optional: bool) -> String {
    let list: Vec<&str> = paths
        .iter()
        .filter(|p| p.optional == optional)
        .map(|p| p.path.as_str())
        .collect();
    if list.is_empty() {
        "none".into()
    } else {
        list.join(", ")
    }
}

fn render_profile(p: &ProfileFacts, policy: &str, line: &mut impl FnMut(String)) {
    line(format!("Profile {} (policy {policy})", p.name));
    line(
        "  filesystem:  a fresh tmpfs root holding only what is listed here; nothing else of \
         the host is visible"
            .into(),
    );
    line(format!(
        "    read-only:            {}",
        render_paths(&p.read_only, false)
    ));
    if p.read_only.iter().any(|g| g.optional) {
        line(format!(
            "    read-only if present: {}",
            render_paths(&p.read_only, true)
        ));
    }
    let mut writable = render_paths(&p.read_write, false);
    if p.read_write.iter().any(|g| g.optional) {
        writable = format!(
            "{writable}; if present: {}",
            render_paths(&p.read_write, true)
        );
    }
    if !p.read_write.is_empty() {
        writable.push_str(" (nosuid, nodev; writable by the sandbox's host uid)");
    }
    line(format!("    read-write:           {writable}"));
    let tmpfs: Vec<String> = p
        .tmpfs
        .iter()
        .map(|t| format!("{} ({}, emptied after each call)", t.path, t.size))
        .collect();
    line(format!(
        "    tmpfs:                {}",
        if tmpfs.is_empty() {
            "none".into()
        } else {
            tmpfs.join(", ")
        }
    ));
    line(
        "    always:               a fresh /proc; /dev with only null, zero, full, random, \
         urandom"
            .into(),
    );
    line(match p.proc.view {
        "masked" => format!(
            "    /proc:                masked: {} read as empty (proc = \"full\" shows them)",
            p.proc.hidden.join(", ")
        ),
        _ => "    /proc:                full: every entry, host-wide ones included".into(),
    });
    line(format!("    working directory:    {}", p.cwd));
    line(format!("  network:     {}", p.network.summary));

    let s = &p.syscalls;
    line(format!(
        "  syscalls:    seccomp allowlist of {} syscalls; any other gets {}",
        s.allowed_count, s.otherwise
    ));
    let groups: Vec<String> = s
        .groups
        .iter()
        .map(|g| {
            if g.allowed == g.of {
                g.name.to_string()
            } else {
                format!("{} ({} of {})", g.name, g.allowed, g.of)
            }
        })
        .collect();
    line(format!("    allowed groups:       {}", groups.join(", ")));
    line(format!(
        "    added to the base:    {}",
        if s.added.is_empty() {
            "none".into()
        } else {
            s.added.join(", ")
        }
    ));
    if !s.denied_by_profile.is_empty() {
        line(format!(
            "    denied by profile:    {} (EPERM)",
            s.denied_by_profile.join(", ")
        ));
    }
    line(format!(
        "    sockets:              {} only",
        s.socket_families.join(", ")
    ));
    line("    always EPERM:".into());
    for group in &s.always_eperm {
        line(format!(
            "      {}: {}",
            group.category,
            group.syscalls.join(", ")
        ));
    }
    for rule in &s.argument_rules {
        line(format!("      {rule}"));
    }
    line(format!(
        "    always ENOSYS:        {} (so libc and runtimes fall back)",
        s.always_enosys.join(", ")
    ));

    let l = &p.limits;
    line("  limits:".into());
    line(format!(
        "    memory:               {} (cgroup; swap not allowed; OOM kills the call)",
        l.memory
    ));
    line(format!(
        "    processes:            {} (cgroup pids, threads included)",
        l.pids
    ));
    line(format!(
        "    timeout:              {} wall clock, then the whole tree is killed",
        l.timeout
    ));
    line(format!(
        "    cpu time:             {}{}",
        l.cpu,
        if l.cpu_seconds.is_some() {
            " (RLIMIT_CPU)"
        } else {
            ""
        }
    ));
    line(format!(
        "    output:               {} per stream (stdout, stderr), the rest is cut",
        l.output
    ));
    line(format!(
        "    open files:           {} (RLIMIT_NOFILE)",
        l.open_files
    ));
    line(format!(
        "    file size:            {} per file written (RLIMIT_FSIZE)",
        l.file_size
    ));
    line("  environment: (the whole environment; nothing is inherited from the host)".into());
    for (name, value) in &p.env {
        line(format!("    {name}={value}"));
    }
    line(format!("  hostname:    {}", p.hostname));
    line("  layers:".into());
    line(format!(
        "    namespaces:           {} (always)",
        p.namespaces.join(", ")
    ));
    let layer = |word: &str| match word {
        "required" => {
            "required (the call fails with sandbox_unavailable if the kernel cannot \
                       enforce it)"
        }
        _ => "best effort (applied as far as the kernel allows; the result reports the level)",
    };
    line(format!(
        "    Landlock:             {}",
        layer(p.require.landlock)
    ));
    line(format!(
        "    seccomp:              {}",
        layer(p.require.seccomp)
    ));
    line(format!(
        "    cgroup limits:        {}",
        layer(p.require.cgroup)
    ));
    line(
        "    always:               no capabilities, no_new_privs, the sandbox root mapped to \
         an unprivileged host uid"
            .into(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syscall_group_starts_at_a_member_of_the_default_allowlist() {
        for (group, first) in SYSCALL_GROUPS {
            assert!(DEFAULT_ALLOW.contains(first), "{group}: {first}");
        }
    }

    #[test]
    fn groups_cover_the_whole_default_allowlist() {
        let text = presets::preset_text("default").unwrap();
        let (validated, _, _) = validate_text(text, "default").unwrap();
        let facts = describe_syscalls(&validated.profiles["default"]);
        let total: usize = facts.groups.iter().map(|g| g.of).sum();
        assert_eq!(total, DEFAULT_ALLOW.len());
        assert_eq!(facts.allowed_count, DEFAULT_ALLOW.len());
        assert!(facts.added.is_empty());
    }

    #[test]
    fn arguments_with_spaces_are_quoted_for_display() {
        assert_eq!(display_arg("/usr/bin/wc"), "/usr/bin/wc");
        assert_eq!(display_arg("{text}"), "{text}");
        assert_eq!(display_arg("a b"), "'a b'");
        assert_eq!(display_arg("it's"), "'it'\\''s'");
    }
}
