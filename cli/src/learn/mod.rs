//! `airlock learn`: runs a command (or a policy tool's command) once and writes the profile
//! that is just enough for it — or, based on an existing profile, a reviewable list of what
//! it would add, each line with its evidence.
//!
//! The learning run is the base profile widened: the host's system trees (`/etc`, `/opt`,
//! `/srv` and the `/usr` family) read-only, the directories given with `--read` and
//! `--write`, and the learning form of the seccomp program, which hands every syscall that
//! names a path or a destination, and every syscall outside the allowlist that a profile
//! could allow, to the supervisor to be recorded and then let run. Its network is the egress
//! proxy with a recording policy: every destination the command asks for is let through
//! and recorded (the base's allowlist, if any, is kept), and a direct connection around the
//! proxy finds no route, as in any sandbox. Never the host's network, whatever the base says.
//! That is less confined than the base profile, and the learner says so before it runs
//! anything. Everything else — namespaces, Landlock on the widened view, the never-allowed
//! syscalls, cgroup limits — stays as the base profile has it. The learner never writes the
//! policy file it was given.

mod network;
mod output;
mod propose;
mod render;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use airlock::observe::Observations;
use airlock::{SandboxRun, Supervisor};
use airlock_policy::compile::compile_profile_as;
use airlock_policy::egress::EgressPolicy;
use airlock_policy::seccomp::Form;
use airlock_policy::seccomp::SocketFamilies;
use airlock_policy::validate::{ValidatedPolicy, validate_policy};
use airlock_policy::validated::{Network, PathGrant, Profile};
use airlock_policy::{PolicyError, Source, load_policy_str, parse_policy_str, presets};

use propose::{Host, PathKind, propose};

/// Options of `airlock learn`.
#[derive(Debug, clap::Args)]
pub struct LearnArgs {
    /// Base the profile on this policy file and print what would be added to `--profile`
    /// (the file itself is never written). Without it, the embedded `default` preset is the
    /// base and a whole policy with the learned profile is printed.
    #[arg(long, conflicts_with = "preset")]
    pub policy: Option<PathBuf>,
    /// Embedded preset to base the profile on instead of a file.
    #[arg(long)]
    pub preset: Option<String>,
    /// The base profile (default: `default`, or the tool's).
    #[arg(long)]
    pub profile: Option<String>,
    /// Learn for this policy tool, run with `--input` (instead of a command).
    #[arg(long, requires = "input", conflicts_with = "command")]
    pub tool: Option<String>,
    /// The tool's arguments, as JSON.
    #[arg(long, requires = "tool")]
    pub input: Option<String>,
    /// A host directory the command may read while learning (data outside the system
    /// trees); only what it uses ends up in the profile.
    #[arg(long = "read", value_name = "DIR")]
    pub read: Vec<PathBuf>,
    /// A host directory the command may write while learning; granted writable if it does.
    #[arg(long = "write", value_name = "DIR")]
    pub write: Vec<PathBuf>,
    /// Name of the learned profile (a new policy only).
    #[arg(long, default_value = "learned")]
    pub name: String,
    /// Write the result here instead of standard output (never the `--policy` file).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// The learning run's deadline (default: the base profile's).
    #[arg(long)]
    pub timeout: Option<String>,
    /// The command and its arguments.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Runs the learner: exit 0 with the profile or the additions written, 1 on any error
/// (which says what), 2 when the command itself failed while learning (the result is still
/// written: a failing command may need what it could not reach).
pub fn run_learn(args: &LearnArgs) -> ExitCode {
    match learn(args) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("airlock: learn: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Top-level host trees a learning run sees read-only, where they exist. Not `/var`: what
/// lives there is state (caches, spools, other services' data, container storage with its
/// own mounts) that a profile should name through `--read` if a command needs it.
const SYSTEM_TREES: [&str; 10] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/srv",
];

fn learn(args: &LearnArgs) -> anyhow::Result<ExitCode> {
    let (text, policy_name) = policy_text(args)?;
    let validated = validate_text(&text, &policy_name)?;
    // Refused before anything runs when it is the policy already; checked again when
    // written, since the command may change what is there (see `output`).
    let output = args
        .output
        .as_deref()
        .map(|path| output::Output::prepare(path, args.policy.as_deref()))
        .transpose()?;
    let (argv, base_name) = match &args.tool {
        Some(tool) => tool_argv(&text, &policy_name, tool, args.input.as_deref())?,
        None => {
            if args.command.is_empty() {
                anyhow::bail!("give the command after `--`, or --tool NAME --input JSON");
            }
            let profile = args
                .profile
                .clone()
                .unwrap_or_else(|| presets::DEFAULT_PRESET.to_string());
            (args.command.clone(), profile)
        }
    };
    let mut base = validated
        .profiles
        .get(&base_name)
        .ok_or_else(|| anyhow::anyhow!("no profile named {base_name:?} in {policy_name}"))?
        .clone();
    let read_dirs = absolute_dirs(&args.read, "--read")?;
    let write_dirs = absolute_dirs(&args.write, "--write")?;
    // Run where the caller is when that is a directory given: `learn --write "$PWD" -- make`
    // builds here, as `make` alone would. The learned profile keeps that working directory.
    let moved_to = std::env::current_dir().ok().and_then(|here| {
        let here = std::fs::canonicalize(here).ok()?.display().to_string();
        write_dirs
            .iter()
            .chain(&read_dirs)
            .any(|dir| here == *dir || here.starts_with(&format!("{dir}/")))
            .then_some(here)
    });
    if let Some(here) = &moved_to {
        base.cwd.clone_from(here);
    }
    let (learning, widened) = learning_profile(&base, &read_dirs, &write_dirs, args)?;
    eprintln!(
        "airlock: learn: running {:?} less confined than profile {base_name:?}: it also sees {} \
         read-only{}, the syscalls its allowlist lacks are let through (each recorded), its \
         file syscalls are watched, and its network is the egress proxy letting through and \
         recording every destination it asks for (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY), this \
         host's loopback and private networks included. Review what it did before trusting \
         the result.",
        argv.join(" "),
        widened.join(", "),
        if write_dirs.is_empty() {
            String::new()
        } else {
            format!(" and {} writable", write_dirs.join(", "))
        },
    );
    let (result, observed) = run_learning(learning, argv.clone())?;
    if result
        .isolation
        .as_ref()
        .map(|i| i.denial_reporting.seccomp)
        != Some(airlock::result::Coverage::Reported)
    {
        let why = result
            .error
            .as_ref()
            .map_or_else(String::new, |e| format!(": {}", e.message));
        anyhow::bail!("the learning run could not be observed (no seccomp listener){why}");
    }
    let proposal = propose(
        &base,
        &observed,
        &write_dirs,
        result.usage.peak_memory_bytes,
        &RealHost,
    );
    if observed.proxied_dropped > 0 {
        eprintln!(
            "airlock: learn: the command asked the proxy for more than {} destinations; only \
             the first {} are in the result ({} connection(s) past them were not recorded)",
            airlock::observe::MAX_PROXIED,
            airlock::observe::MAX_PROXIED,
            observed.proxied_dropped
        );
    }
    let text = match &args.policy {
        Some(_) => render::additions(
            &policy_name,
            &base_name,
            &argv,
            &proposal,
            &result,
            moved_to.as_deref(),
        ),
        None => render::new_policy(&args.name, &base, &policy_name, &argv, &proposal)?,
    };
    match &output {
        Some(output) => output.write(&text, args.policy.as_deref())?,
        None => crate::write_stdout(&text)?,
    }
    if result.ok {
        Ok(ExitCode::SUCCESS)
    } else {
        let error = result.error.as_ref();
        eprintln!(
            "airlock: learn: the command failed while learning ({}): {}{}",
            error.map_or("tool_failed".to_string(), |e| {
                serde_json::to_value(e.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            }),
            error.map_or("", |e| e.message.as_str()),
            if result.stderr.is_empty() {
                String::new()
            } else {
                format!("\n{}", result.stderr.trim_end())
            }
        );
        Ok(ExitCode::from(2))
    }
}

/// The policy text and its name: the file, the preset, or the `default` preset.
fn policy_text(args: &LearnArgs) -> anyhow::Result<(String, String)> {
    read_policy(args.policy.as_ref(), args.preset.as_deref())
}

/// The text and name of policy file `policy`, else of preset `preset` (default `default`).
fn read_policy(policy: Option<&PathBuf>, preset: Option<&str>) -> anyhow::Result<(String, String)> {
    match policy {
        Some(path) => Ok((
            std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read policy file {}: {e}", path.display()))?,
            path.display().to_string(),
        )),
        None => {
            let preset = preset.unwrap_or(presets::DEFAULT_PRESET);
            let text = presets::preset_text(preset).ok_or_else(|| {
                anyhow::anyhow!("no preset named {preset:?}; see `airlock preset`")
            })?;
            Ok((text.to_string(), format!("preset:{preset}")))
        }
    }
}

/// Validates the policy the way `airlock check` would, keeping the validated form (its
/// profiles as written, before compilation folds them).
fn validate_text(text: &str, name: &str) -> anyhow::Result<ValidatedPolicy> {
    if let Err(error) = load_policy_str(text, name) {
        if let PolicyError::Invalid { diagnostics, .. } = &error {
            for d in diagnostics {
                eprintln!("{d}");
            }
        }
        anyhow::bail!("{error}");
    }
    let file =
        parse_policy_str(text, name).map_err(|_| anyhow::anyhow!("policy {name} is invalid"))?;
    let (validated, _) = validate_policy(&file, Source::new(name, text))
        .map_err(|_| anyhow::anyhow!("policy {name} is invalid"))?;
    Ok(validated)
}

/// Profile `profile` of the policy file or preset, compiled in the observing form: every
/// call of it is diagnosed (`airlock exec --diagnose`).
pub(crate) fn observing_profile(
    policy: Option<&PathBuf>,
    preset: Option<&str>,
    profile: &str,
) -> anyhow::Result<airlock_policy::CompiledProfile> {
    let (text, name) = read_policy(policy, preset)?;
    let validated = validate_text(&text, &name)?;
    let base = validated
        .profiles
        .get(profile)
        .ok_or_else(|| anyhow::anyhow!("no profile named {profile:?} in the policy"))?;
    Ok(compile_profile_as(base, Form::Observing)?)
}

/// The argv and profile of `tool` called with `input`, as the gate would run it.
fn tool_argv(
    text: &str,
    name: &str,
    tool: &str,
    input: Option<&str>,
) -> anyhow::Result<(Vec<String>, String)> {
    let policy = load_policy_str(text, name)?.policy;
    let arguments = crate::input::arguments(input.unwrap_or("{}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let plan = runtime.block_on(async {
        let supervisor = Arc::new(Supervisor::start(crate::supervisor_options())?);
        let gate = airlock::Gate::new(Arc::clone(&supervisor), policy);
        let call = airlock::ToolCall {
            call_id: "learn".into(),
            tool: tool.into(),
            arguments,
        };
        let plan = gate.dry_run(&call, &airlock::CallOptions::default());
        supervisor.close().await;
        anyhow::Ok(plan)
    })?;
    let plan = plan.map_err(|refused| {
        anyhow::anyhow!(
            "the tool call is refused: {}",
            refused.error.map_or_else(String::new, |e| e.message)
        )
    })?;
    if plan.decision == airlock_policy::rules::Decision::Deny {
        anyhow::bail!(
            "the gate denies this call (rule {:?}): it would never run, nothing to learn",
            plan.rule
        );
    }
    if let Some(builtin) = plan.builtin {
        anyhow::bail!(
            "{tool} is the built-in {builtin:?}, which runs airlock's own code: nothing to learn"
        );
    }
    Ok((plan.argv, plan.profile))
}

/// Each directory, absolute and existing, as a normalised string.
fn absolute_dirs(dirs: &[PathBuf], flag: &str) -> anyhow::Result<Vec<String>> {
    dirs.iter()
        .map(|dir| {
            let real = std::fs::canonicalize(dir)
                .map_err(|e| anyhow::anyhow!("{flag} {}: {e}", dir.display()))?;
            if !real.is_dir() {
                anyhow::bail!("{flag} {}: not a directory", dir.display());
            }
            Ok(real.display().to_string())
        })
        .collect()
}

/// The base profile widened for learning, and the trees added to its view.
fn learning_profile(
    base: &Profile,
    read_dirs: &[String],
    write_dirs: &[String],
    args: &LearnArgs,
) -> anyhow::Result<(airlock_policy::CompiledProfile, Vec<String>)> {
    let mut learning = base.clone();
    let mut widened = Vec::new();
    let has = |profile: &Profile, path: &str| {
        profile
            .read
            .iter()
            .chain(&profile.write)
            .any(|g| g.path == path)
    };
    for tree in SYSTEM_TREES {
        if Path::new(tree).exists() && !has(&learning, tree) {
            // What the base grants inside the tree is bound with it: a second bind (or a
            // symlink recreated) inside the first would collide.
            let below = |path: &str| path.strip_prefix(tree).is_some_and(|r| r.starts_with('/'));
            learning.read.retain(|g| !below(&g.path));
            learning.read.push(PathGrant {
                path: tree.to_string(),
                optional: true,
            });
            widened.push(tree.to_string());
        }
    }
    for dir in read_dirs {
        if !has(&learning, dir) {
            learning.read.push(PathGrant {
                path: dir.clone(),
                optional: false,
            });
            widened.push(dir.clone());
        }
    }
    for dir in write_dirs {
        learning.read.retain(|g| g.path != *dir);
        if !learning.write.iter().any(|g| g.path == *dir) {
            learning.write.push(PathGrant {
                path: dir.clone(),
                optional: false,
            });
        }
    }
    // The proxy, recording: a learning run never gets the host's network, and a base
    // without the network gets one it can be seen to use.
    let allowlist = match &base.network {
        Network::Egress(policy) => policy.clone(),
        _ => EgressPolicy::default(),
    };
    learning.network = Network::Egress(allowlist.recording());
    learning.syscalls.families = SocketFamilies::UnixAndInet;
    if let Some(timeout) = &args.timeout {
        learning.limits.timeout = airlock_policy::units::parse_duration(timeout)
            .map_err(|e| anyhow::anyhow!("--timeout: {e}"))?;
    }
    Ok((compile_profile_as(&learning, Form::Learning)?, widened))
}

/// Runs `argv` once under `profile` with its observations recorded.
fn run_learning(
    profile: airlock_policy::CompiledProfile,
    argv: Vec<String>,
) -> anyhow::Result<(airlock::ToolResult, Observations)> {
    let log = Arc::new(Mutex::new(Observations::default()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let supervisor = Supervisor::start(crate::supervisor_options())?;
        let timeout = profile.limits.timeout;
        let run = SandboxRun {
            call_id: crate::random_call_id(),
            tool: "learn".into(),
            profile: Arc::new(profile),
            argv,
            stdin: Vec::new(),
            arguments_json: "{}".into(),
            timeout,
            inherit_stdio: None,
            builtin: None,
        };
        let result = supervisor.run_learning(run, Arc::clone(&log)).await;
        supervisor.close().await;
        anyhow::Ok(result)
    })?;
    let observed = log.lock().unwrap_or_else(PoisonError::into_inner).clone();
    Ok((result, observed))
}

/// The host as it is.
struct RealHost;

impl Host for RealHost {
    fn kind(&self, path: &str) -> Option<PathKind> {
        let metadata = std::fs::metadata(path).ok()?;
        Some(if metadata.is_dir() {
            PathKind::Directory
        } else {
            PathKind::Other
        })
    }

    fn resolve(&self, path: &str) -> Option<String> {
        std::fs::canonicalize(path)
            .ok()
            .map(|p| p.display().to_string())
    }
}
