//! `tlio generate`: man pages (one per command, clap_mangen) and shell completions
//! (clap_complete), both derived from the same clap definition as the parser.

use std::fs;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{CommandFactory, Subcommand, ValueEnum};

use super::{Cli, Outcome};
use crate::output::Printer;

/// What to generate.
#[derive(Debug, Subcommand)]
pub enum GenerateCommand {
    /// Write one man page per command and subcommand into DIR.
    // clap would show the directory as optional: it is required in one of two spellings.
    #[command(after_help = MAN_EXAMPLES, override_usage = "tlio generate man [OPTIONS] -o <DIR>")]
    Man {
        /// The directory to write the pages into (created if missing).
        #[arg(
            short = 'o',
            long = "output",
            value_name = "DIR",
            required_unless_present = "legacy_dir"
        )]
        dir: Option<PathBuf>,
        /// The directory as a positional: the spelling before -o, kept for one release.
        #[arg(value_name = "DIR", hide = true, conflicts_with = "dir")]
        legacy_dir: Option<PathBuf>,
    },
    /// Print a completion script for SHELL to standard output.
    #[command(after_help = COMPLETIONS_EXAMPLES)]
    Completions {
        /// The shell to complete for.
        shell: Shell,
    },
}

const MAN_EXAMPLES: &str = "\
Examples:
  tlio generate man -o man
  tlio generate man -o ~/.local/share/man/man1 && man tlio-st-inspect";

const COMPLETIONS_EXAMPLES: &str = "\
Examples:
  tlio generate completions bash > ~/.local/share/bash-completion/completions/tlio
  tlio generate completions zsh > ~/.zfunc/_tlio
  tlio generate completions fish > ~/.config/fish/completions/tlio.fish";

/// Shells with completion support.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Shell {
    /// GNU bash.
    Bash,
    /// Z shell.
    Zsh,
    /// fish.
    Fish,
}

/// Run `tlio generate`.
pub fn run(cmd: GenerateCommand, printer: &Printer) -> anyhow::Result<Outcome> {
    match cmd {
        GenerateCommand::Man { dir, legacy_dir } => {
            let dir = dir
                .or(legacy_dir)
                .ok_or_else(|| crate::error::operational("a directory is required: -o DIR"))?;
            let pages = man_pages()?;
            fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create directory {}", dir.display()))?;
            for (name, bytes) in &pages {
                let path = dir.join(name);
                crate::core::atomic::write_file(&path, bytes)
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
            printer.info(format!(
                "wrote {} man pages to {}",
                pages.len(),
                dir.display()
            ));
            Ok(Outcome::Success)
        }
        GenerateCommand::Completions { shell } => {
            let shell = match shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
            };
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "tlio", &mut buf);
            let mut out = printer.out();
            out.write_all(&buf)?;
            out.flush()?;
            Ok(Outcome::Success)
        }
    }
}

/// Every man page as (file name, roff bytes), one per command and subcommand, in a
/// stable order. Used by `generate man` and by the test that keeps `man/` current.
pub fn man_pages() -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    // No page for clap's `help` subcommand: `tlio help st` works, but a `tlio-help(1)`
    // page would describe nothing.
    let mut command = Cli::command().disable_help_subcommand(true);
    command.build();
    let mut pages = Vec::new();
    collect(&command, "tlio", &mut pages)?;
    Ok(pages)
}

fn collect(
    cmd: &clap::Command,
    name: &str,
    pages: &mut Vec<(String, Vec<u8>)>,
) -> anyhow::Result<()> {
    let mut bytes = Vec::new();
    let page_cmd = cmd.clone().name(name.to_string());
    clap_mangen::Man::new(page_cmd).render(&mut bytes)?;
    pages.push((format!("{name}.1"), bytes));
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        collect(sub, &format!("{name}-{}", sub.get_name()), pages)?;
    }
    Ok(())
}
