//! `airlock explain`: the effective sandbox of one tool or profile in plain words — paths,
//! network, syscalls, limits, environment, layer requirements, and for a tool how it is
//! run and approved — so a security engineer can review a policy without reading TOML.
//!
//! Built from the validated policy (which keeps what compilation folds away, such as the
//! syscall lists), after the same load as `airlock run` so an invalid policy is refused
//! with the same diagnostics.

mod facts;
mod profile;
mod render;
mod tool;

use std::path::PathBuf;
use std::process::ExitCode;

use airlock_policy::validate::{ValidatedPolicy, validate_policy};
use airlock_policy::{PolicyError, Source, load_policy_str, parse_policy_str, presets};

use facts::Explanation;
use profile::describe_profile;
use render::render;
use tool::describe_tool;

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
    let file =
        parse_policy_str(text, name).map_err(|_| anyhow::anyhow!("policy {name} is invalid"))?;
    let (validated, _) = validate_policy(&file, Source::new(name, text))
        .map_err(|_| anyhow::anyhow!("policy {name} is invalid"))?;
    let warnings = loaded.warnings.iter().map(ToString::to_string).collect();
    Ok((validated, loaded.policy.version, warnings))
}
