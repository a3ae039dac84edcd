//! airlock-policy: policy files from TOML text to a compiled sandbox spec.
//!
//! Three steps with three types: [`parse_policy_str`] gives the serde file model
//! ([`model::PolicyFile`]), [`validate::validate_policy`] a [`validated::ValidatedPolicy`]
//! (every error at once, as `FILE:LINE:COL` diagnostics), and [`compile::compile_policy`] a
//! [`compile::CompiledPolicy`] of pure data for workers. [`load_policy_str`] runs all three.
#![forbid(unsafe_code)]

pub mod builtin;
pub mod compile;
pub mod diagnostic;
pub mod egress;
pub mod model;
pub mod presets;
pub mod rules;
pub mod schema;
pub mod seccomp;
pub mod strict;
pub mod syscalls;
pub mod units;
pub mod validate;
pub mod validated;

pub use compile::{CompiledPolicy, CompiledProfile, CompiledTool};
pub use diagnostic::{Diagnostic, Severity, Source};

/// Why a policy could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("cannot read policy file {path}")]
    Read {
        /// Path as given.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file has errors; every one is listed (warnings too).
    #[error("policy {file} has {} error(s)", .diagnostics.iter().filter(|d| d.severity == Severity::Error).count())]
    Invalid {
        /// File name.
        file: String,
        /// Errors and warnings, in file order.
        diagnostics: Vec<Diagnostic>,
    },
    /// A valid policy failed to compile.
    #[error(transparent)]
    Compile(#[from] compile::CompileError),
}

/// A loaded policy and the warnings its check produced.
#[derive(Debug, Clone)]
pub struct LoadedPolicy {
    /// The compiled policy.
    pub policy: CompiledPolicy,
    /// Warnings about risky grants.
    pub warnings: Vec<Diagnostic>,
}

/// Step 1: parses TOML into the file model; syntax errors, unknown keys and wrong types
/// come back as one diagnostic at their position.
pub fn parse_policy_str(text: &str, file_name: &str) -> Result<model::PolicyFile, Diagnostic> {
    let source = Source::new(file_name, text);
    toml::from_str::<model::PolicyFile>(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        source.error(span, e.message().trim().to_string())
    })
}

/// Parses, validates and compiles policy text.
pub fn load_policy_str(text: &str, file_name: &str) -> Result<LoadedPolicy, PolicyError> {
    let invalid = |diagnostics| PolicyError::Invalid {
        file: file_name.to_string(),
        diagnostics,
    };
    let file = parse_policy_str(text, file_name).map_err(|d| invalid(vec![d]))?;
    let (validated, warnings) =
        validate::validate_policy(&file, Source::new(file_name, text)).map_err(invalid)?;
    let policy = compile::compile_policy(&validated, text)?;
    Ok(LoadedPolicy { policy, warnings })
}

/// Reads and loads a policy file.
pub fn load_policy_file(path: &std::path::Path) -> Result<LoadedPolicy, PolicyError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
        path: name.clone(),
        source,
    })?;
    load_policy_str(&text, &name)
}
