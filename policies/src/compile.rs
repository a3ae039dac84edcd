//! Step 3 of 3: turns a [`ValidatedPolicy`] into pure data ready for workers — one
//! [`SandboxSpec`] per profile (mount plan, Landlock rules, seccomp program, limits, env)
//! and, per tool, compiled schemas and the argv template. Done once per policy load, never
//! per call.

use std::collections::BTreeMap;
use std::sync::Arc;

use airlock_protocol::{
    BpfInstruction, LandlockSpec, MountOp, NetworkMode, Rlimits, SandboxSpec, SeccompSpec,
};
use serde_json::Value;

use crate::egress::EgressPolicy;
use crate::schema::{CompiledSchema, SchemaError, compile_schema};
use crate::seccomp::{
    Form, SeccompError, SyscallPolicy, compile_seccomp_program_as, digest_program,
};
use crate::validated::{
    ArgTemplate, GatePolicy, Limits, Network, ProcView, Profile, Requirements, SessionPolicy,
    StdinSource, Tool, ValidatedPolicy, Workspace,
};

/// Why a validated policy could not be compiled (a bug or an unsupported platform: every
/// user mistake is caught by validation).
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The seccomp program could not be built.
    #[error("profile {profile}: cannot build its seccomp program")]
    Seccomp {
        /// Profile name.
        profile: String,
        /// Cause.
        #[source]
        source: SeccompError,
    },
    /// A schema that validated did not compile.
    #[error("tool {tool}: cannot compile its schema")]
    Schema {
        /// Tool name.
        tool: String,
        /// Cause.
        #[source]
        source: SchemaError,
    },
}

/// Why a validated input could not be turned into an argv.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgvError {
    /// A field used in the command is missing from the input.
    #[error("input field {0:?} used in the command is missing")]
    MissingField(String),
    /// A field used in the command is not a scalar.
    #[error("input field {0:?} used in the command is not a string, number or boolean")]
    NotScalar(String),
    /// A substituted string holds a NUL byte, which no argv can carry.
    #[error("input field {0:?} contains a NUL byte")]
    Nul(String),
    /// A substituted value starts with `-`, so the program would read it as an option.
    #[error(
        "input field {0:?} starts with `-`, which the program would read as an option; \
         the tool's allow_dash_values does not list it"
    )]
    DashValue(String),
}

impl ArgvError {
    /// The input field at fault.
    pub fn field(&self) -> &str {
        match self {
            ArgvError::MissingField(field)
            | ArgvError::NotScalar(field)
            | ArgvError::Nul(field)
            | ArgvError::DashValue(field) => field,
        }
    }
}

/// A compiled profile: the spec every worker of this profile receives, and what the
/// supervisor enforces itself.
#[derive(Debug, Clone)]
pub struct CompiledProfile {
    /// Name.
    pub name: String,
    /// What the worker builds.
    pub spec: SandboxSpec,
    /// Limits the supervisor enforces (cgroup, deadline, output).
    pub limits: Limits,
    /// How hard each layer is required.
    pub require: Requirements,
    /// The egress proxy's allowlist, for a profile whose network is `allow = [...]`.
    pub egress: Option<Arc<EgressPolicy>>,
    /// Where a session's files appear; the spec holds no mount for it (each session's
    /// calls add their own).
    pub workspace: Option<Workspace>,
    /// The form of the spec's seccomp program, which says what the supervisor answering its
    /// listener does: [`Form::Observing`] makes every call of the profile a diagnosed one.
    pub seccomp_form: Form,
}

/// A compiled tool.
#[derive(Debug, Clone)]
pub struct CompiledTool {
    /// The validated definition.
    pub tool: Tool,
    /// Input schema.
    pub input: CompiledSchema,
    /// Output schema.
    pub output: Option<CompiledSchema>,
}

/// A policy ready to serve calls.
#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    /// SHA-256 of the policy text, the `policy_version` of approvals and results.
    pub version: String,
    /// Profiles by name.
    pub profiles: BTreeMap<String, Arc<CompiledProfile>>,
    /// Tools by name.
    pub tools: BTreeMap<String, CompiledTool>,
    /// Decision rules, rate limits, approval and audit settings.
    pub gate: GatePolicy,
    /// Session workspace bounds.
    pub sessions: SessionPolicy,
}

/// Mount targets ordered parents first, so a nested bind lands on top of its parent.
fn depth(path: &str) -> usize {
    path.split('/').filter(|c| !c.is_empty()).count()
}

/// What a masked `/proc` (every profile's unless it says `proc = "full"`) hides, relative
/// to it: what identifies the host (the kernel's command line and build configuration, the
/// boot id), host-wide activity (pressure stalls, interrupts, timers with their owners'
/// names), and the rest of what container runtimes mask (runc's `maskedPaths`). Each is
/// covered with an empty read-only file or directory; one the kernel lacks is skipped.
pub const HIDDEN_IN_PROC: &[&str] = &[
    "acpi",
    "asound",
    "cmdline",
    "config.gz",
    "interrupts",
    "kcore",
    "keys",
    "latency_stats",
    "pressure",
    "sched_debug",
    "scsi",
    "sys/kernel/random/boot_id",
    "timer_list",
    "timer_stats",
];

/// The mount plan of a profile, applied by the worker on a fresh tmpfs root.
pub fn plan_mounts(profile: &Profile) -> Vec<MountOp> {
    let mut targets: Vec<(usize, MountOp)> = Vec::new();
    for grant in &profile.read {
        targets.push((
            depth(&grant.path),
            MountOp::Bind {
                source: grant.path.clone(),
                target: grant.path.clone(),
                writable: false,
                optional: grant.optional,
            },
        ));
    }
    for grant in &profile.write {
        targets.push((
            depth(&grant.path),
            MountOp::Bind {
                source: grant.path.clone(),
                target: grant.path.clone(),
                writable: true,
                optional: grant.optional,
            },
        ));
    }
    for (path, size) in &profile.tmpfs {
        let mode = if path == "/tmp" || path == "/var/tmp" {
            0o1777
        } else {
            0o755
        };
        targets.push((
            depth(path),
            MountOp::Tmpfs {
                target: path.clone(),
                size_bytes: *size,
                mode,
            },
        ));
    }
    targets.sort_by_key(|(d, _)| *d);
    let mut plan: Vec<MountOp> = targets.into_iter().map(|(_, op)| op).collect();
    plan.push(MountOp::Proc {
        target: "/proc".to_string(),
        hide: match profile.proc {
            ProcView::Masked => HIDDEN_IN_PROC.iter().map(|p| p.to_string()).collect(),
            ProcView::Full => Vec::new(),
        },
    });
    plan.push(MountOp::Dev {
        target: "/dev".to_string(),
    });
    plan
}

/// The profile a call of one session runs under: `profile` with the session's storage at
/// `source` bound read-write (nosuid, nodev, like every bind) at the profile's workspace,
/// and Landlock letting tools write there. A profile without a workspace comes back as it
/// is.
pub fn with_workspace(profile: &CompiledProfile, source: &str) -> CompiledProfile {
    let mut compiled = profile.clone();
    let Some(workspace) = &profile.workspace else {
        return compiled;
    };
    let bind = MountOp::Bind {
        source: source.to_string(),
        target: workspace.path.clone(),
        writable: true,
        optional: false,
    };
    // After every mount it is not below (validation keeps it apart from all of them), so
    // before /proc and /dev, which come last.
    let at = compiled
        .spec
        .mounts
        .iter()
        .position(|op| matches!(op, MountOp::Proc { .. } | MountOp::Dev { .. }))
        .unwrap_or(compiled.spec.mounts.len());
    compiled.spec.mounts.insert(at, bind);
    compiled.spec.landlock.write.push(workspace.path.clone());
    compiled
}

/// Landlock rules of a profile, as paths inside the sandbox.
pub fn plan_landlock(profile: &Profile) -> LandlockSpec {
    let mut read: Vec<String> = profile.read.iter().map(|g| g.path.clone()).collect();
    read.push("/proc".to_string());
    let mut write: Vec<String> = profile.write.iter().map(|g| g.path.clone()).collect();
    write.extend(profile.tmpfs.iter().map(|(p, _)| p.clone()));
    // /dev holds only null, zero, full, random and urandom; tools write to /dev/null.
    write.push("/dev".to_string());
    let (tcp_connect, tcp_bind, restrict_tcp) = match &profile.network {
        // No interface but the namespace's own: nothing for Landlock to narrow.
        Network::None | Network::Loopback | Network::Egress(_) => (Vec::new(), Vec::new(), false),
        Network::Host { tcp: None, .. } => (Vec::new(), Vec::new(), false),
        Network::Host {
            tcp: Some(ports), ..
        } => (ports.connect.clone(), ports.bind.clone(), true),
    };
    LandlockSpec {
        requirement: profile.require.landlock,
        read,
        write,
        tcp_bind,
        tcp_connect,
        restrict_tcp,
        // Only a supervisor that reads the audit asks for it (`spec_for`).
        log_denials: false,
    }
}

/// The port the egress proxy listens on inside a worker's own network namespace (any
/// port does: the namespace holds nothing else; this is the one proxies conventionally use).
pub const EGRESS_PORT: u16 = 3128;

/// The variables that point HTTP, HTTPS and SOCKS clients at the egress proxy, in the
/// spellings curl, pip, git, python and most other clients read.
pub const EGRESS_PROXY_VARIABLES: [&str; 6] = [
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// The tools' environment: the profile's, and with the egress proxy the variables pointing
/// at it (replacing any the profile set: they are the only way out).
fn environment(profile: &Profile) -> Vec<(String, String)> {
    let mut env = profile.env.clone();
    if matches!(profile.network, Network::Egress(_)) {
        env.retain(|(name, _)| !EGRESS_PROXY_VARIABLES.contains(&name.as_str()));
        for name in EGRESS_PROXY_VARIABLES {
            // SOCKS5 with the proxy resolving names (socks5h): no DNS inside the sandbox.
            let url = if name.eq_ignore_ascii_case("ALL_PROXY") {
                format!("socks5h://127.0.0.1:{EGRESS_PORT}")
            } else {
                format!("http://127.0.0.1:{EGRESS_PORT}")
            };
            env.push((name.to_string(), url));
        }
    }
    env
}

/// Compiles one profile.
pub fn compile_profile(profile: &Profile) -> Result<CompiledProfile, CompileError> {
    compile_profile_as(profile, Form::Reporting)
}

/// Compiles one profile with its seccomp program in `form`: [`Form::Reporting`] for calls,
/// [`Form::Observing`] to diagnose one, [`Form::Learning`] for `airlock learn`.
pub fn compile_profile_as(profile: &Profile, form: Form) -> Result<CompiledProfile, CompileError> {
    compile_profile_sharing(profile, form, &mut Vec::new())
}

/// Seccomp programs already compiled for a policy's profiles, by syscall policy: profiles
/// usually share one (the default), and compiling it is the larger part of a profile's
/// compile.
type Programs = Vec<(SyscallPolicy, Vec<BpfInstruction>)>;

fn compile_profile_sharing(
    profile: &Profile,
    form: Form,
    programs: &mut Programs,
) -> Result<CompiledProfile, CompileError> {
    let program = match programs
        .iter()
        .find(|(syscalls, _)| *syscalls == profile.syscalls)
    {
        Some((_, program)) => program.clone(),
        None => {
            let program =
                compile_seccomp_program_as(&profile.syscalls, form).map_err(|source| {
                    CompileError::Seccomp {
                        profile: profile.name.clone(),
                        source,
                    }
                })?;
            programs.push((profile.syscalls.clone(), program.clone()));
            program
        }
    };
    let digest = digest_program(&program);
    let spec = SandboxSpec {
        profile: profile.name.clone(),
        hostname: profile.hostname.clone(),
        mounts: plan_mounts(profile),
        root: airlock_protocol::RootSource::Build,
        egress_port: matches!(profile.network, Network::Egress(_)).then_some(EGRESS_PORT),
        network: match profile.network {
            Network::None => NetworkMode::None,
            Network::Loopback | Network::Egress(_) => NetworkMode::Loopback,
            Network::Host { .. } => NetworkMode::Host,
        },
        rlimits: Rlimits {
            open_files: profile.limits.open_files,
            file_size_bytes: profile.limits.file_size_bytes,
            cpu_seconds: profile.limits.cpu.map(|d| d.as_secs()),
        },
        landlock: plan_landlock(profile),
        seccomp: SeccompSpec {
            requirement: profile.require.seccomp,
            program,
            digest,
        },
        env: environment(profile),
        cwd: profile.cwd.clone(),
    };
    let egress = match &profile.network {
        Network::Egress(policy) => Some(Arc::new(policy.clone())),
        _ => None,
    };
    Ok(CompiledProfile {
        name: profile.name.clone(),
        spec,
        limits: profile.limits,
        require: profile.require,
        egress,
        workspace: profile.workspace.clone(),
        seccomp_form: form,
    })
}

/// Compiles a validated policy; `source_text` gives the policy version digest.
pub fn compile_policy(
    policy: &ValidatedPolicy,
    source_text: &str,
) -> Result<CompiledPolicy, CompileError> {
    let mut programs = Programs::new();
    let profiles = policy
        .profiles
        .iter()
        .map(|(name, p)| {
            let compiled = compile_profile_sharing(p, Form::Reporting, &mut programs)?;
            Ok((name.clone(), Arc::new(compiled)))
        })
        .collect::<Result<_, CompileError>>()?;
    let tools = policy
        .tools
        .iter()
        .map(|(name, tool)| {
            let schema_error = |source| CompileError::Schema {
                tool: name.clone(),
                source,
            };
            // `validate` already applied `strict_objects`: compiled here is exactly the
            // document the gate publishes.
            let input = match &tool.compiled_schemas.input {
                Some(compiled) => compiled.clone(),
                None => compile_schema(&tool.input_schema).map_err(schema_error)?,
            };
            let output = match (&tool.compiled_schemas.output, &tool.output_schema) {
                (Some(compiled), _) => Some(compiled.clone()),
                (None, schema) => {
                    schema
                        .as_ref()
                        .map(compile_schema)
                        .transpose()
                        .map_err(|source| CompileError::Schema {
                            tool: name.clone(),
                            source,
                        })?
                }
            };
            Ok((
                name.clone(),
                CompiledTool {
                    tool: tool.clone(),
                    input,
                    output,
                },
            ))
        })
        .collect::<Result<_, CompileError>>()?;
    Ok(CompiledPolicy {
        gate: policy.gate.clone(),
        version: sha256_hex(source_text.as_bytes()),
        profiles,
        tools,
        sessions: policy.sessions.clone(),
    })
}

/// Hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A scalar input value as one argument: strings as their text, others as JSON.
fn scalar_text(field: &str, value: Option<&Value>) -> Result<String, ArgvError> {
    let text = match value {
        None => return Err(ArgvError::MissingField(field.to_string())),
        Some(Value::String(s)) => s.clone(),
        Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
        Some(_) => return Err(ArgvError::NotScalar(field.to_string())),
    };
    if text.contains('\0') {
        return Err(ArgvError::Nul(field.to_string()));
    }
    Ok(text)
}

impl CompiledTool {
    /// The argv for a validated input: each `{field}` becomes exactly one argument, so no
    /// input can add, split or reorder arguments, and no shell ever sees it. A value starting
    /// with `-` is refused unless the tool's `allow_dash_values` lists its field: as its own
    /// argument it would be an option (`--version`, `-n`, `--output=/etc/x`).
    pub fn render_argv(&self, input: &Value) -> Result<Vec<String>, ArgvError> {
        self.tool
            .command
            .iter()
            .map(|element| match element {
                ArgTemplate::Literal(text) => Ok(text.clone()),
                ArgTemplate::Field(field) => {
                    let text = scalar_text(field, input.get(field))?;
                    if text.starts_with('-') && !self.tool.allow_dash_values.contains(field) {
                        return Err(ArgvError::DashValue(field.clone()));
                    }
                    Ok(text)
                }
            })
            .collect()
    }

    /// The bytes written to the tool's stdin.
    pub fn render_stdin(&self, input: &Value) -> Vec<u8> {
        match &self.tool.stdin {
            StdinSource::Empty => Vec::new(),
            StdinSource::WholeInput => input.to_string().into_bytes(),
            StdinSource::Field(field) => match input.get(field) {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::String(s)) => s.clone().into_bytes(),
                Some(other) => other.to_string().into_bytes(),
            },
        }
    }
}
