//! The command line: clap derive structs for every group and the dispatch from a parsed
//! command to its group. Each group module turns arguments into one core call plus
//! printing; no format logic lives here.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::output::Printer;

pub mod args;
pub mod ckpt;
pub mod demo;
pub mod generate;
pub mod st;
pub mod tokens;
pub mod train;

/// The help heading of the options every command accepts, kept apart from each
/// command's own flags.
pub const GLOBAL_HEADING: &str = "Global options";

/// Strict, fast tools for safetensors files, atomic checkpoints, token shards and a
/// bigram trainer that resumes bit for bit.
#[derive(Debug, Parser)]
#[command(
    name = "tlio",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_help = EXAMPLES
)]
pub struct Cli {
    /// Print results as JSON: one compact document per line.
    #[arg(long, global = true, help_heading = GLOBAL_HEADING)]
    pub json: bool,
    /// Silence progress bars and all non-error chatter.
    #[arg(short, long, global = true, help_heading = GLOBAL_HEADING)]
    pub quiet: bool,
    /// When to colour the output: auto (on a terminal, unless NO_COLOR is set), always,
    /// never.
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "WHEN",
        default_value_t = ColorChoice::Auto,
        help_heading = GLOBAL_HEADING
    )]
    pub color: ColorChoice,
    #[allow(
        missing_docs,
        reason = "a doc comment here would replace the command list's heading in --help"
    )]
    #[command(subcommand)]
    pub command: Command,
}

const EXAMPLES: &str = "\
Examples:
  tlio demo
  tlio st inspect model.safetensors
  tlio tokens pack corpus.txt -o corpus.bin
  tlio train bigram corpus.bin -o run --max-steps 200";

// Every group's `--help` ends with examples, as every leaf command's does.
const CKPT_EXAMPLES: &str = "\
Examples:
  tlio ckpt verify run/ckpt
  tlio ckpt latest run/ckpt
  tlio ckpt gc run/ckpt --keep 2 --dry-run";

const GENERATE_EXAMPLES: &str = "\
Examples:
  tlio generate man -o man
  tlio generate completions bash";

const ST_EXAMPLES: &str = "\
Examples:
  tlio st inspect model.safetensors
  tlio st verify model_dir
  tlio st convert model.safetensors -o model-f16.safetensors --dtype f16
  tlio st diff a.safetensors b.safetensors";

const TOKENS_EXAMPLES: &str = "\
Examples:
  tlio tokens pack corpus.txt -o corpus.bin
  tlio tokens header corpus.bin
  tlio tokens windows corpus.bin --seq-len 8 --batch 2 --batches 1
  tlio tokens decode corpus.bin --tokenizer bytes --count 40";

const TRAIN_EXAMPLES: &str = "\
Examples:
  tlio train bigram corpus.bin -o run --max-steps 200
  tlio train bigram corpus.bin -o run --max-steps 200 --resume";

/// The `--color` choice.
pub use crate::output::ColorChoice;

/// The command groups.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Atomic, verified training checkpoints: save, verify, latest, gc, export, import.
    #[command(subcommand, after_help = CKPT_EXAMPLES)]
    Ckpt(ckpt::CkptCommand),
    /// Run the whole mission end to end on built-in data: pack, train, crash, resume,
    /// and prove the resumed run bitwise equal to an uninterrupted one.
    #[command(after_help = demo::EXAMPLES)]
    Demo(demo::DemoArgs),
    /// Write man pages and shell completions: man, completions.
    #[command(subcommand, after_help = GENERATE_EXAMPLES)]
    Generate(generate::GenerateCommand),
    /// Safetensors files and model directories: inspect, verify, convert, diff, quantize,
    /// dequantize.
    #[command(subcommand, after_help = ST_EXAMPLES)]
    St(st::StCommand),
    /// Token shards: header, pack, merge, windows, decode.
    #[command(subcommand, after_help = TOKENS_EXAMPLES)]
    Tokens(tokens::TokensCommand),
    /// Train a model on token shards with atomic checkpoints and exact resume: bigram.
    #[command(subcommand, after_help = TRAIN_EXAMPLES)]
    Train(train::TrainCommand),
}

/// How a command that did not fail ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Everything held: exit 0.
    Success,
    /// The answer is "no" (a verify that fails, files that differ): exit 1.
    No,
    /// A refusal of the input (exit 2) that a child process has already reported on
    /// stderr in the CLI's words (`ckpt import`).
    Refused,
}

impl Outcome {
    /// The exit code of cli.md for this outcome.
    pub fn exit_code(self) -> ExitCode {
        match self {
            Outcome::Success => ExitCode::SUCCESS,
            Outcome::No => ExitCode::from(1),
            Outcome::Refused => ExitCode::from(2),
        }
    }

    /// `Success` when `ok`, else `No`.
    pub fn from_ok(ok: bool) -> Self {
        if ok {
            Outcome::Success
        } else {
            Outcome::No
        }
    }
}

/// The object-storage URL a path argument names (`s3://bucket/key`), validated; `None`
/// for a local path. A malformed URL is the core's error naming the rule.
pub fn s3_url(path: &std::path::Path) -> anyhow::Result<Option<tlio_core::s3::S3Url>> {
    match path.to_str() {
        Some(text) if tlio_core::s3::is_s3_url(text) => {
            Ok(Some(tlio_core::s3::S3Url::parse(text)?))
        }
        _ => Ok(None),
    }
}

/// Parse the process's arguments without letting clap print or exit, so that a usage
/// error can be reported as the one-line error of the CLI contract
/// (`crate::error::report_usage`).
pub fn parse() -> Result<Cli, clap::Error> {
    Cli::try_parse()
}

/// Run a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    let printer = Printer::new(cli.json, cli.quiet, cli.color);
    match cli.command {
        Command::Ckpt(cmd) => ckpt::run(cmd, &printer),
        Command::Demo(args) => demo::run(args, &printer),
        Command::Generate(cmd) => generate::run(cmd, &printer),
        Command::St(cmd) => st::run(cmd, &printer),
        Command::Tokens(cmd) => tokens::run(cmd, &printer),
        Command::Train(cmd) => train::run(cmd, &printer),
    }
}
