//! `tlio generate`: man pages (one per command, clap_mangen) and shell completions
//! (clap_complete), both derived from the same clap definition as the parser.

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
  tlio generate man -o ~/.local/share/man/man1   # then add ~/.local/share/man to MANPATH";

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
            tlio_core::files::create_dir_all(&dir)
                .with_context(|| format!("cannot create directory {}", dir.display()))?;
            for (name, bytes) in &pages {
                let path = dir.join(name);
                tlio_core::atomic::write_file(&path, bytes)
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
            if printer.json {
                // cli.md: with --json every command prints a JSON summary.
                #[derive(serde::Serialize)]
                struct Out<'a> {
                    dir: String,
                    pages: Vec<&'a str>,
                }
                printer.json_line(&Out {
                    dir: dir.display().to_string(),
                    pages: pages.iter().map(|(name, _)| name.as_str()).collect(),
                })?;
            } else {
                printer.info(format!(
                    "wrote {} man pages to {}",
                    pages.len(),
                    dir.display()
                ));
            }
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
    collect(&command, "tlio", "tlio", &mut pages)?;
    Ok(pages)
}

fn collect(
    cmd: &clap::Command,
    name: &str,
    words: &str,
    pages: &mut Vec<(String, Vec<u8>)>,
) -> anyhow::Result<()> {
    let page_cmd = cmd.clone().name(name.to_string());
    let man = clap_mangen::Man::new(page_cmd.clone());
    let mut bytes = Vec::new();
    // The sections clap_mangen renders, then ours; its EXTRA section (the raw
    // `after_help`) becomes EXAMPLES instead.
    man.render_title(&mut bytes)?;
    man.render_name_section(&mut bytes)?;
    // Our own SYNOPSIS: clap_mangen's drops each option's value placeholder
    // (`[--vocab-size]` for `--vocab-size <V>`).
    bytes.extend_from_slice(synopsis(&page_cmd, words).as_bytes());
    man.render_description_section(&mut bytes)?;
    if page_cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut bytes)?;
    }
    let subs: Vec<&clap::Command> = cmd
        .get_subcommands()
        .filter(|s| s.get_name() != "help")
        .collect();
    if !subs.is_empty() {
        man.render_subcommands_section(&mut bytes)?;
    }
    bytes.extend_from_slice(extra_sections(cmd, name, &subs).as_bytes());
    man.render_version_section(&mut bytes)?;
    pages.push((format!("{name}.1"), bytes));
    for sub in subs {
        let sub_words = format!("{words} {}", sub.get_name());
        collect(
            sub,
            &format!("{name}-{}", sub.get_name()),
            &sub_words,
            pages,
        )?;
    }
    Ok(())
}

/// The SYNOPSIS section: the command's words, then every visible option with its value
/// placeholder (`[\fB--vocab-size\fR \fI<V>\fR]`), then the positionals and the
/// subcommand; optional ones in brackets.
fn synopsis(cmd: &clap::Command, command_words: &str) -> String {
    let mut words = vec![format!("\\fB{}\\fR", roff(command_words))];
    let value = |arg: &clap::Arg| -> String {
        let names: Vec<String> = arg
            .get_value_names()
            .map(|v| v.iter().map(|n| format!("\\fI<{}>\\fR", roff(n))).collect())
            .unwrap_or_else(|| vec![format!("\\fI<{}>\\fR", roff(arg.get_id().as_str()))]);
        names.join(" ")
    };
    let visible = cmd.get_arguments().filter(|a| !a.is_hide_set());
    let (positionals, options): (Vec<&clap::Arg>, Vec<&clap::Arg>) =
        visible.partition(|a| a.is_positional());
    for arg in options {
        let mut flags = Vec::new();
        if let Some(short) = arg.get_short() {
            flags.push(format!("\\fB\\-{short}\\fR"));
        }
        if let Some(long) = arg.get_long() {
            flags.push(format!("\\fB\\-\\-{}\\fR", roff(long)));
        }
        let mut word = flags.join("|");
        if arg.get_action().takes_values() {
            word = format!("{word} {}", value(arg));
        }
        words.push(if arg.is_required_set() {
            word
        } else {
            format!("[{word}]")
        });
    }
    for arg in positionals {
        let many = arg.get_num_args().is_some_and(|n| n.max_values() > 1);
        let word = format!("{}{}", value(arg), if many { "..." } else { "" });
        words.push(if arg.is_required_set() {
            word
        } else {
            format!("[{word}]")
        });
    }
    if cmd.has_subcommands() {
        words.push("\\fI<COMMAND>\\fR".to_string());
    }
    format!(".SH SYNOPSIS\n{}\n", words.join(" "))
}

/// Escape text for roff: backslashes and hyphens (so `-o` is not a typographic dash),
/// and a leading period or apostrophe that roff would read as a request.
fn roff(text: &str) -> String {
    let text = text.replace('\\', "\\e").replace('-', "\\-");
    if text.starts_with('.') || text.starts_with('\'') {
        format!("\\&{text}")
    } else {
        text
    }
}

/// The variables of object storage, the cache and the helpers tlio runs, in every page's
/// ENVIRONMENT (after FAILPOINTS and the colour ones); `tests/cli/generate.rs` checks
/// that every variable the source reads is named.
const ENVIRONMENT_S3: &str = concat!(
    ".TP\nAWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY\nThe credentials of \\fBs3://\\fR URLs \
     (both required for object storage).\n",
    ".TP\nAWS_SESSION_TOKEN\nA temporary credential's session token, sent when set.\n",
    ".TP\nAWS_REGION, AWS_DEFAULT_REGION\nThe region (the first that is set; else us\\-east\\-1).\n",
    ".TP\nAWS_ENDPOINT_URL\nAn S3\\-compatible server, \\fBscheme://host[:port]\\fR \
     (else AWS's own endpoint for the region).\n",
    ".TP\nTLIO_CACHE_DIR\nThe cache of objects a token stream reads (their copies go in its \
     \\fBs3/\\fR folder); else \\fB$XDG_CACHE_HOME/tlio\\fR, else \\fB$HOME/.cache/tlio\\fR.\n",
    ".TP\nXDG_CACHE_HOME, HOME\nWhere the cache goes when TLIO_CACHE_DIR is not set.\n",
    ".TP\nTLIO_PYTHON\nThe Python interpreter \\fBckpt import\\fR runs (else python3); it \
     needs the tlio package and torch.\n",
    ".TP\nSLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_MIN, SLURM_ARRAY_TASK_COUNT, SLURM_ARRAY_TASK_STEP\n\
     Read by \\fBtokens pack \\-\\-part slurm\\fR: K is the task id less the minimum, N the count \
     (a step other than 1 is refused).\n",
);

/// EXAMPLES (from the command's `after_help`), EXIT STATUS, ENVIRONMENT and SEE ALSO.
fn extra_sections(cmd: &clap::Command, name: &str, subs: &[&clap::Command]) -> String {
    let mut out = String::new();
    if let Some(help) = cmd.get_after_help() {
        let text = help.to_string();
        let examples: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Examples:"))
            .skip(1)
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        if !examples.is_empty() {
            out.push_str(".SH EXAMPLES\n.nf\n");
            for line in examples {
                out.push_str(&roff(line));
                out.push('\n');
            }
            out.push_str(".fi\n");
        }
    }
    out.push_str(concat!(
        ".SH \"EXIT STATUS\"\n",
        ".TP\n0\nSuccess; for a question, the answer is yes (valid, equal, found).\n",
        ".TP\n1\nThe input is invalid, or the answer is no (verify found a problem, diff \\\n",
        "found a difference, no loadable checkpoint, a demo check failed).\n",
        ".TP\n2\nUsage error (unknown flag, bad value, no command) or operational error \\\n",
        "(missing file, permission, full disk).\n",
        ".SH ENVIRONMENT\n",
        ".TP\nFAILPOINTS\nFault injection for crash tests, e.g. \\fBtrain/after\\-step=60*off\\->return\\fR \\\n",
        "aborts after step 61; points: ckpt/fsync, ckpt/rename, train/after\\-step.\n",
        ".TP\nNO_COLOR\nWhen set and not empty, \\fB\\-\\-color auto\\fR uses no colour.\n",
        ".TP\nCLICOLOR_FORCE\nWhen set and not 0, \\fB\\-\\-color auto\\fR colours even when not on a terminal.\n",
    ));
    out.push_str(ENVIRONMENT_S3);
    // SEE ALSO: the parent page, the sub-pages, and the top page.
    let mut see: Vec<String> = Vec::new();
    if let Some((parent, _)) = name.rsplit_once('-') {
        see.push(format!("{parent}(1)"));
    }
    for sub in subs {
        see.push(format!("{name}-{}(1)", sub.get_name()));
    }
    if name != "tlio" && !see.iter().any(|s| s == "tlio(1)") {
        see.push("tlio(1)".to_string());
    }
    if !see.is_empty() {
        out.push_str(".SH \"SEE ALSO\"\n");
        let refs: Vec<String> = see
            .iter()
            .map(|s| {
                let (page, section) = s.split_once('(').unwrap_or((s.as_str(), "1)"));
                format!("\\fB{}\\fR({section}", roff(page))
            })
            .collect();
        out.push_str(&refs.join(", "));
        out.push('\n');
    }
    out
}
