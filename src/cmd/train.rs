//! `tlio train bigram`: flags to a `RunSpec`, one call of the training core, progress on
//! stderr (a bar on a terminal, a plain line every `--log-every` steps otherwise) and
//! exactly one line on stdout: the final line, the same bytes as `DIR/final.json`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use indicatif::ProgressBar;

use super::Outcome;
use crate::output::Printer;
use tlio_core::optim::{OptimConfig, ADAMW_WEIGHT_DECAY, SGD_MOMENTUM};
use tlio_core::train::layout::CKPT_DIR;
use tlio_core::train::run::run as run_training;
use tlio_core::train::spec::{Method, Progress, RunSpec};
use tlio_core::train::{shard_text, Field, TrainError};
use tlio_core::Failure;

/// AdamW's default learning rate (the spec's example).
pub const ADAMW_LR: f64 = 0.01;
/// SGD's default learning rate (the spec's example).
pub const SGD_LR: f64 = 0.1;

/// Training commands.
#[derive(Debug, Subcommand)]
pub enum TrainCommand {
    /// Train the bigram model on token shards with atomic checkpoints; a run killed at
    /// any instant and resumed with --resume ends bitwise equal to an uninterrupted one.
    ///
    /// The model is a V x V table of F32 logits, and the optimizer keeps two more of the
    /// same size: V x V x 3 x 4 bytes of state, at most 4 GiB, so V is at most 18,918.
    /// Byte shards (V 256) and small tokenizers fit; a GPT-2 shard (V 50,257) would need
    /// 30 GB and is refused before training starts.
    // The usage writes the shards as clap's Arguments section does (`[SHARD]...`: the
    // hidden old `--data` spelling can stand in for them); the argument's help says
    // that at least one is required.
    #[command(
        after_help = BIGRAM_EXAMPLES,
        override_usage = "tlio train bigram [OPTIONS] [SHARD]... -o <DIR>"
    )]
    Bigram(BigramArgs),
}

const BIGRAM_EXAMPLES: &str = "\
Examples:
  tlio train bigram corpus.bin -o run --max-steps 200 --ckpt-every 50
  tlio train bigram corpus.bin -o run --max-steps 400 --ckpt-every 50 --resume
  tlio train bigram train_*.bin -o run-sgd --optimizer sgd --lr 0.1 --keep 2
  tlio train bigram corpus.bin -o counts --method counts";

/// The optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OptimizerArg {
    /// AdamW (torch defaults: betas 0.9, 0.999, eps 1e-8, weight decay 0.01).
    Adamw,
    /// SGD (momentum 0.9 unless --momentum; dampening 0, no nesterov, weight decay 0).
    Sgd,
}

/// How the model is fitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MethodArg {
    /// Optimizer steps on the mean cross-entropy of each batch.
    Gradient,
    /// One counting pass: W[i][j] = ln((count(i->j) + 1) / (count(i) + V)).
    Counts,
}

/// `tlio train bigram`.
#[derive(Debug, Args)]
pub struct BigramArgs {
    /// The token shards (at least one), read in the order given.
    #[arg(value_name = "SHARD", required_unless_present = "data_flag")]
    pub data: Vec<PathBuf>,
    /// The shards as `--data SHARD` (repeated): the spelling before positional
    /// shards, kept for one release.
    #[arg(
        long = "data",
        value_name = "SHARD",
        hide = true,
        conflicts_with = "data"
    )]
    pub data_flag: Vec<PathBuf>,
    /// The run directory to create or resume: config.json, final.json, ckpt/ (and
    /// model.safetensors for --method counts).
    #[arg(short = 'o', long = "output", alias = "out", value_name = "DIR")]
    pub out: PathBuf,
    /// Train until this step (may be raised on --resume to extend a run).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub max_steps: u64,
    /// Windows per batch (B).
    #[arg(long, value_name = "B", default_value_t = 8)]
    pub batch: usize,
    /// Input tokens per window (T).
    #[arg(long, value_name = "T", default_value_t = 64)]
    pub seq_len: usize,
    /// Save a checkpoint every K steps (and after the last step).
    #[arg(long, value_name = "K", default_value_t = 100)]
    pub ckpt_every: u64,
    /// Keep only the newest K checkpoints (default: keep all).
    #[arg(long, value_name = "K")]
    pub keep: Option<usize>,
    /// The optimizer.
    #[arg(long, value_enum, default_value_t = OptimizerArg::Adamw)]
    pub optimizer: OptimizerArg,
    /// Learning rate [default: 0.01 for adamw, 0.1 for sgd].
    #[arg(long, value_name = "LR", value_parser = super::args::train_float, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// Weight decay [default: 0.01 for adamw (decoupled), 0 for sgd (L2)].
    #[arg(long, value_name = "WD", value_parser = super::args::train_float, allow_negative_numbers = true)]
    pub weight_decay: Option<f64>,
    /// SGD momentum (0 = plain SGD) [default: 0.9].
    #[arg(long, value_name = "M", value_parser = super::args::train_float, allow_negative_numbers = true)]
    pub momentum: Option<f64>,
    /// Seed of the token stream's generator (PCG32 seed(S, 54)).
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Continue from the newest checkpoint in DIR/ckpt (start at step 0 when there is
    /// none yet, so a preemptible job can always pass it).
    #[arg(long)]
    pub resume: bool,
    /// How the model is fitted.
    #[arg(long, value_enum, default_value_t = MethodArg::Gradient)]
    pub method: MethodArg,
    /// Without a terminal, print a progress line every N steps (0 = never).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub log_every: u64,
    /// The vocabulary size, needed only when no shard records one (llm.c's shards
    /// write 0); must equal every recorded one.
    #[arg(long, value_name = "V")]
    pub vocab_size: Option<u32>,
    /// Visit the shards in a new order each epoch, drawn from the stream's generator
    /// (passes within a shard are unchanged). A resume may switch it on, not off.
    #[arg(long)]
    pub shuffle: bool,
}

/// Run a train command.
pub fn run(cmd: TrainCommand, printer: &Printer) -> anyhow::Result<Outcome> {
    match cmd {
        TrainCommand::Bigram(args) => bigram(args, printer),
    }
}

/// The optimizer the flags ask for: torch's defaults but for the learning rate, the
/// weight decay and SGD's momentum.
fn optim_config(args: &BigramArgs) -> anyhow::Result<OptimConfig> {
    Ok(match args.optimizer {
        OptimizerArg::Adamw => {
            if args.momentum.is_some() {
                return Err(crate::error::operational(
                    "--momentum applies to --optimizer sgd only",
                ));
            }
            OptimConfig::adamw(args.lr.unwrap_or(ADAMW_LR))
                .with_weight_decay(args.weight_decay.unwrap_or(ADAMW_WEIGHT_DECAY))
        }
        OptimizerArg::Sgd => OptimConfig::sgd(
            args.lr.unwrap_or(SGD_LR),
            args.momentum.unwrap_or(SGD_MOMENTUM),
        )
        .with_weight_decay(args.weight_decay.unwrap_or(0.0)),
    })
}

fn bigram(args: BigramArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let spec = RunSpec {
        data: if args.data.is_empty() {
            args.data_flag.clone()
        } else {
            args.data.clone()
        },
        out: args.out.clone(),
        max_steps: args.max_steps,
        batch: args.batch,
        seq_len: args.seq_len,
        ckpt_every: args.ckpt_every,
        keep: args.keep,
        optim: optim_config(&args)?,
        seed: args.seed,
        resume: args.resume,
        method: match args.method {
            MethodArg::Gradient => Method::Gradient,
            MethodArg::Counts => Method::Counts,
        },
        vocab_size: args.vocab_size,
        shuffle: args.shuffle,
    };
    if args.shuffle && args.method == MethodArg::Counts {
        return Err(crate::error::operational(
            "--shuffle applies to --method gradient (counts reads every shard whole, in any order)",
        ));
    }
    let mut view = ProgressView {
        printer,
        ckpt: args.out.join(CKPT_DIR),
        bar: printer.bar(
            args.max_steps,
            "train",
            "{msg} {bar:30} {pos}/{len} steps, eta {eta}",
        ),
        plain: printer.wants_plain_progress(),
        log_every: args.log_every,
        started: Instant::now(),
        start_tokens: 0,
    };
    let outcome = run_training(&spec, &mut |p| view.show(p))
        .map_err(with_flags)
        .with_context(|| format!("train bigram {}", args.out.display()))?;
    view.bar.finish_and_clear();
    let mut out = printer.out();
    out.write_all(outcome.line.as_bytes())?;
    out.flush()?;
    Ok(Outcome::Success)
}

/// The flag that sets a field of the run's spec (a field no flag sets, such as AdamW's
/// betas, keeps its name).
fn flag(field: Field) -> &'static str {
    match field {
        Field::Data => "--data",
        Field::MaxSteps => "--max-steps",
        Field::CkptEvery => "--ckpt-every",
        Field::Batch => "--batch",
        Field::SeqLen => "--seq-len",
        Field::Keep => "--keep",
        Field::VocabSize => "--vocab-size",
        Field::Method => "--method",
        Field::Seed => "--seed",
        Field::Optimizer => "--optimizer",
        Field::Lr => "--lr",
        Field::WeightDecay => "--weight-decay",
        Field::Momentum => "--momentum",
        Field::Betas | Field::Eps | Field::Dampening | Field::Nesterov | Field::ConfigFormat => {
            field.name()
        }
    }
}

/// A training error as the command line says it: a field is the flag the user typed.
/// Core's own messages name fields and values; these keep the CLI's words.
fn with_flags(err: TrainError) -> anyhow::Error {
    let kind = err.kind();
    let message = match err {
        TrainError::BadField {
            field: Field::Data, ..
        } => "at least one SHARD is required".to_string(),
        TrainError::BadField { field, rule } => format!("{} {rule}", flag(field)),
        TrainError::NoVocab => {
            "no shard records its vocabulary size (header word 3 is 0): pass --vocab-size"
                .to_string()
        }
        TrainError::ExistingCheckpoints { dir } => format!(
            "{} already holds checkpoints: pass --resume to continue that run, or choose another -o/--output",
            dir.display()
        ),
        TrainError::ConfigMismatch {
            field,
            shard,
            checkpoint,
            given,
        } => format!(
            "--resume: {}{} disagrees with the checkpoint's run: it used {checkpoint}, this run asks for {given}",
            flag(field),
            shard_text(shard)
        ),
        TrainError::PastMaxSteps { step, max_steps } => format!(
            "the run's checkpoint is at step {step}, --max-steps is {max_steps}: pass a larger --max-steps to continue it"
        ),
        TrainError::NonFiniteLoss { step, loss } => format!(
            "the loss became {loss} at step {step}: training diverged (try a smaller --lr); the checkpoints before it are kept, nothing of this step is saved"
        ),
        TrainError::Checkpoint(e) => return super::ckpt::with_flags(e),
        other => return anyhow::Error::new(other),
    };
    crate::error::Classified { message, kind }.into()
}

/// How a run's progress is drawn on stderr: a bar on a terminal, plain lines every
/// `--log-every` steps otherwise. Nothing here reaches stdout.
struct ProgressView<'p> {
    printer: &'p Printer,
    ckpt: PathBuf,
    bar: ProgressBar,
    plain: bool,
    log_every: u64,
    /// When this process started stepping, for the token rate.
    started: Instant,
    /// Tokens consumed before this process started.
    start_tokens: u64,
}

impl ProgressView<'_> {
    fn show(&mut self, p: Progress) {
        let printer = self.printer;
        match p {
            Progress::Start {
                step,
                max_steps,
                tokens_seen,
                resumed_from,
                nothing_to_resume,
            } => {
                if nothing_to_resume {
                    printer.info(format!(
                        "tlio: --resume: no checkpoint in {} yet, starting from step 0",
                        self.ckpt.display()
                    ));
                }
                if let Some(path) = resumed_from {
                    printer.info(format!(
                        "tlio: resuming from {} (step {step})",
                        path.display()
                    ));
                }
                self.bar.set_length(max_steps);
                self.bar.set_position(step);
                self.started = Instant::now();
                self.start_tokens = tokens_seen;
            }
            Progress::Step {
                step,
                loss,
                tokens_seen,
            } => self.step(step, loss, tokens_seen),
            Progress::Saved { step, path } => {
                if self.plain {
                    printer.info(format!("checkpoint step {step}: {}", path.display()));
                }
            }
            Progress::Skipped { name, reason } => {
                // Not silenced by --json: falling back past a newer step is worth
                // knowing even when stdout is for machines (it goes to stderr).
                printer.warn(format!("--resume: skipped {name}: {reason}"));
            }
            Progress::WaitingForLock { path } => {
                printer.warn(format!(
                    "waiting for {} (another tlio save or gc holds it)",
                    path.display()
                ));
            }
            Progress::Counted { shard, positions } => {
                if self.plain {
                    printer.info(format!(
                        "counted shard {shard}: {positions} positions so far"
                    ));
                }
            }
        }
    }

    fn step(&mut self, step: u64, loss: f32, tokens_seen: u64) {
        // Progress only: the rate never reaches stdout or any file.
        let secs = self.started.elapsed().as_secs_f64();
        let done = tokens_seen.saturating_sub(self.start_tokens) as f64;
        let rate = if secs > 0.0 { done / secs } else { 0.0 };
        self.bar.set_position(step);
        self.bar
            .set_message(format!("loss {loss:.4}  {rate:.0} tok/s"));
        if self.plain && self.log_every > 0 && step.is_multiple_of(self.log_every) {
            self.printer.info(format!(
                "step {step} loss {loss:.6} tokens {tokens_seen} tok/s {rate:.0}"
            ));
        }
    }
}
