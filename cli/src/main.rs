//! The `airlock` binary: parses the command line and hands each subcommand to the library
//! that owns it (policy checks to `airlock-policy`, sandboxes to the supervisor).

use std::path::PathBuf;
use std::process::ExitCode;

use airlock_policy::{Diagnostic, PolicyError, Severity, load_policy_file, presets};
use clap::{Parser, Subcommand};

/// airlock: a sandbox driver and supervisor for AI agents' tool calls.
#[derive(Debug, Parser)]
#[command(name = "airlock", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate policy files: exit 0 when valid (warnings on stderr), 1 with diagnostics.
    Check {
        /// Policy files to check.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print diagnostics as one JSON document on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of the policy file format (for editors).
    Schema,
    /// Print an embedded preset policy (`default`, `examples`).
    Preset {
        /// Preset name; omit to list them.
        name: Option<String>,
    },
}

/// The outcome of checking one file, as `check --json` prints it.
#[derive(Debug, serde::Serialize)]
struct FileReport {
    file: String,
    valid: bool,
    diagnostics: Vec<Diagnostic>,
}

fn check_file(path: &std::path::Path) -> FileReport {
    let file = path.display().to_string();
    match load_policy_file(path) {
        Ok(loaded) => FileReport {
            file,
            valid: true,
            diagnostics: loaded.warnings,
        },
        Err(PolicyError::Invalid { diagnostics, .. }) => FileReport {
            file,
            valid: false,
            diagnostics,
        },
        Err(other) => {
            // Not a located mistake (unreadable file, compile failure): report at 1:1.
            let mut message = other.to_string();
            let mut source = std::error::Error::source(&other);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            FileReport {
                file: file.clone(),
                valid: false,
                diagnostics: vec![Diagnostic {
                    severity: Severity::Error,
                    file,
                    line: 1,
                    column: 1,
                    message,
                }],
            }
        }
    }
}

/// Writes to stdout; a closed pipe (`airlock schema | head`) is not an error worth a panic.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn run_check(files: &[PathBuf], json: bool) -> anyhow::Result<ExitCode> {
    let reports: Vec<FileReport> = files.iter().map(|f| check_file(f)).collect();
    let all_valid = reports.iter().all(|r| r.valid);
    if json {
        write_stdout(&format!("{}\n", serde_json::to_string_pretty(&reports)?))?;
    } else {
        for report in &reports {
            for diagnostic in &report.diagnostics {
                eprintln!("{diagnostic}");
            }
        }
        let errors: usize = reports
            .iter()
            .flat_map(|r| &r.diagnostics)
            .filter(|d| d.severity == Severity::Error)
            .count();
        if errors > 0 {
            eprintln!(
                "{errors} error(s) in {} file(s)",
                reports.iter().filter(|r| !r.valid).count()
            );
        }
    }
    Ok(if all_valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { files, json } => run_check(&files, json),
        Command::Schema => write_stdout(presets::POLICY_FILE_SCHEMA).map(|()| ExitCode::SUCCESS),
        Command::Preset { name: None } => {
            let names: String = presets::PRESETS
                .iter()
                .map(|(n, _)| format!("{n}\n"))
                .collect();
            write_stdout(&names).map(|()| ExitCode::SUCCESS)
        }
        Command::Preset { name: Some(name) } => match presets::preset_text(&name) {
            Some(text) => write_stdout(text).map(|()| ExitCode::SUCCESS),
            None => Err(anyhow::anyhow!(
                "no preset named {name:?}; see `airlock preset`"
            )),
        },
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("airlock: error: {error:#}");
            ExitCode::from(2)
        }
    }
}
