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
pub mod text;
pub mod units;
mod unknown_keys;
pub mod validate;
pub mod validated;

pub use compile::{CompiledPolicy, CompiledProfile, CompiledTool};
pub use diagnostic::{Diagnostic, Severity, Source};

use serde::Deserialize;

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

/// Step 1: parses TOML into the file model. Syntax errors and wrong types come back as one
/// diagnostic at their position; unknown keys as one diagnostic each, all of them.
pub fn parse_policy_str(text: &str, file_name: &str) -> Result<model::PolicyFile, Vec<Diagnostic>> {
    match parse_reporting_unknown_keys(text, Source::new(file_name, text)) {
        (Some(file), errors) if errors.is_empty() => Ok(file),
        (_, errors) => Err(errors),
    }
}

/// Step 1 without stopping at unknown keys: the model of the file with its unknown keys
/// left out (`None` when the text is not TOML or a value has the wrong type), and every
/// error found. The model exists only so that validation can go on and report the rest;
/// a policy with any of these errors must be refused.
fn parse_reporting_unknown_keys(
    text: &str,
    source: Source<'_>,
) -> (Option<model::PolicyFile>, Vec<Diagnostic>) {
    let located = |e: toml::de::Error| {
        let span = e.span().unwrap_or(0..0);
        source.error(span, e.message().trim().to_string())
    };
    let mut document = match toml::de::DeTable::parse(text) {
        Ok(document) => document,
        Err(e) => return (None, vec![located(e)]),
    };
    let mut errors = unknown_keys::remove_unknown_keys(&mut document, source);
    // The model still denies unknown fields: should the schema ever know a key the model
    // does not, the key is refused here rather than ignored.
    match model::PolicyFile::deserialize(toml::de::Deserializer::from(document)) {
        Ok(file) => (Some(file), errors),
        Err(e) => {
            errors.push(located(e));
            errors.sort_by_key(|d| (d.line, d.column));
            (None, errors)
        }
    }
}

/// Parses, validates and compiles policy text. Every error is reported at once: unknown
/// keys beside the validation errors of the rest of the file.
pub fn load_policy_str(text: &str, file_name: &str) -> Result<LoadedPolicy, PolicyError> {
    let source = Source::new(file_name, text);
    let invalid = |mut diagnostics: Vec<Diagnostic>| {
        diagnostics.sort_by_key(|d| (d.line, d.column));
        PolicyError::Invalid {
            file: file_name.to_string(),
            diagnostics,
        }
    };
    let (file, mut errors) = parse_reporting_unknown_keys(text, source);
    let Some(file) = file else {
        return Err(invalid(errors));
    };
    let (validated, warnings) = match validate::validate_policy(&file, source) {
        Ok(valid) => valid,
        Err(diagnostics) => {
            errors.extend(diagnostics);
            return Err(invalid(errors));
        }
    };
    if !errors.is_empty() {
        errors.extend(warnings);
        return Err(invalid(errors));
    }
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
