//! `airlock completions` and `airlock man`: shell completion scripts and man pages, both
//! generated from the parser's own clap definitions (`args.rs`).

use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

use crate::args::{Cli, CompletionShell};

/// Why a man page could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ManualError {
    /// `airlock man NAME` for a NAME that is no subcommand.
    #[error("no subcommand named {name:?}; `airlock --help` lists them")]
    NoSuchSubcommand { name: String },
    /// Rendering failed (it writes to memory, so only on a bug in the renderer).
    #[error("cannot render the man page: {0}")]
    Render(#[from] std::io::Error),
}

/// The command as the parser sees it, with its version and global flags propagated.
fn command() -> clap::Command {
    let mut command = Cli::command();
    command.build();
    command
}

/// `airlock completions SHELL`: the script on stdout.
pub(crate) fn completions(shell: CompletionShell) -> anyhow::Result<ExitCode> {
    let shell = match shell {
        CompletionShell::Bash => Shell::Bash,
        CompletionShell::Zsh => Shell::Zsh,
        CompletionShell::Fish => Shell::Fish,
    };
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command(), "airlock", &mut script);
    crate::write_stdout_bytes(&script)?;
    Ok(ExitCode::SUCCESS)
}

/// `airlock man [SUBCOMMAND]`: airlock(1), or airlock-SUBCOMMAND(1), as roff on stdout.
pub(crate) fn man_page(subcommand: Option<&str>) -> anyhow::Result<ExitCode> {
    crate::write_stdout_bytes(&render(subcommand)?)?;
    Ok(ExitCode::SUCCESS)
}

fn render(subcommand: Option<&str>) -> Result<Vec<u8>, ManualError> {
    let command = command();
    let source = format!("airlock {}", command.get_version().unwrap_or_default());
    let page = match subcommand {
        None => command,
        // Built above, so its display name is `airlock-exec`: the page's title, as man(1)
        // and git name their subcommands' pages.
        Some(name) => command
            .find_subcommand(name)
            .ok_or_else(|| ManualError::NoSuchSubcommand {
                name: name.to_string(),
            })?
            .clone(),
    };
    let mut roff = Vec::new();
    clap_mangen::Man::new(page)
        .source(source)
        .render(&mut roff)?;
    Ok(roff)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_main_page_lists_the_subcommands() {
        let page = String::from_utf8(render(None).unwrap()).unwrap();
        assert!(page.contains(".TH airlock"), "{page}");
        for name in ["exec", "run", "serve", "mcp", "completions"] {
            assert!(page.contains(name), "no {name} in {page}");
        }
    }

    #[test]
    fn a_subcommand_page_is_named_after_it() {
        let page = String::from_utf8(render(Some("exec")).unwrap()).unwrap();
        assert!(page.contains("airlock\\-exec"), "{page}");
        assert!(page.contains("\\-\\-timeout"), "{page}");
    }

    #[test]
    fn an_unknown_subcommand_is_refused() {
        assert!(matches!(
            render(Some("nonesuch")),
            Err(ManualError::NoSuchSubcommand { .. })
        ));
    }
}
