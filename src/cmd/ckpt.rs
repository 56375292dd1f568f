//! `tlio ckpt`: commit existing files as an atomic checkpoint (`save`), check a
//! checkpoint directory (`verify`), print the step a resume would load (`latest`),
//! and clean up (`gc`). Each command is one call of `core::checkpoint` plus printing.

use std::borrow::Cow;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;

use super::Outcome;
use crate::output::{Printer, Tone};
use comfy_table::Cell;
use tlio_core::checkpoint::{
    self, load::Survey, parse_step_name, step_name, verify as ckverify, CheckpointError, Payload,
    SaveAnyway, SaveRequest, TrainerState, MANIFEST_NAME,
};
use tlio_core::remote::location;
use tlio_core::Failure;

mod import;

/// A checkpoint error as the command line says it: how to save anyway is the flag.
pub(super) fn with_flags(err: CheckpointError) -> anyhow::Error {
    let kind = err.kind();
    let flag = |hint: SaveAnyway| match hint {
        SaveAnyway::Overwrite => "--overwrite to replace it",
        SaveAnyway::Force => "--force to save anyway and move LATEST back",
    };
    let message = match err {
        CheckpointError::Exists { path } => format!(
            "{} already exists as a complete checkpoint (use --overwrite to replace it)",
            path.display()
        ),
        CheckpointError::NotNewer { step, latest, hint } => format!(
            "step {step} is not newer than {}, which LATEST names and which verifies; a save must move LATEST forward ({})",
            step_name(latest),
            flag(hint)
        ),
        other => return anyhow::Error::new(other),
    };
    crate::error::Classified { message, kind }.into()
}
use tlio_core::text::escape;

/// The `ckpt` subcommands.
#[derive(Debug, Subcommand)]
pub enum CkptCommand {
    /// Commit existing files as checkpoint step N of DIR, atomically (inputs are copied).
    #[command(after_help = SAVE_EXAMPLES)]
    Save(SaveArgs),
    /// Verify every step directory of DIR (or one step directory) against its manifest.
    #[command(after_help = VERIFY_EXAMPLES)]
    Verify {
        /// A checkpoint directory, or one step directory in it (or an s3:// prefix).
        #[arg(value_name = "DIR")]
        path: PathBuf,
    },
    /// Print the path of the newest step directory that verifies, the one `train
    /// bigram --resume` continues from (LATEST, or the newest older step when LATEST's
    /// fails); exit 1 when none.
    #[command(after_help = LATEST_EXAMPLES)]
    Latest {
        /// A checkpoint directory (or an s3://bucket/prefix URL).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Write a step's model as a Hugging Face model directory (model.safetensors, or
    /// model-0000K-of-0000N.safetensors shards with model.safetensors.index.json),
    /// consolidating sharded tensors by streaming, atomically; config.json copied.
    #[command(after_help = EXPORT_EXAMPLES)]
    Export {
        /// A step directory (sharded or not; or an s3://.../step-N URL).
        #[arg(value_name = "STEP_DIR")]
        step_dir: PathBuf,
        /// The new model directory.
        #[arg(short = 'o', long = "output", value_name = "MODEL_DIR")]
        output: PathBuf,
        /// Largest tensor data per shard file (5GB, 500MiB, bytes); one file without it.
        #[arg(long, value_name = "SIZE", value_parser = super::args::byte_size)]
        max_shard_size: Option<u64>,
    },
    /// Convert a PyTorch DCP FileSystemWriter checkpoint (.metadata and *.distcp) into
    /// a verified step of a run directory; prints the step directory. Runs the tlio
    /// Python package (the interpreter in TLIO_PYTHON, else python3), which reads the
    /// pickled .metadata without running any of its code.
    #[command(after_help = IMPORT_EXAMPLES)]
    Import {
        /// The DCP checkpoint directory.
        #[arg(value_name = "DCP_DIR")]
        dcp_dir: PathBuf,
        /// The run directory the step is committed into.
        #[arg(short = 'o', long = "output", value_name = "RUN_DIR")]
        output: PathBuf,
        /// The step number (default: the number ending DCP_DIR's name, else 0).
        #[arg(long, value_name = "N")]
        step: Option<u64>,
    },
    /// Remove stale temporaries, steps newer than LATEST and steps beyond the newest K.
    #[command(after_help = GC_EXAMPLES)]
    Gc {
        /// A checkpoint directory (or an s3://bucket/prefix URL).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// How many valid steps to keep (at least 1).
        #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
        keep: u64,
        /// List what would be removed without removing it.
        #[arg(long)]
        dry_run: bool,
        /// On object storage (s3://): remove an attempt that no manifest names only
        /// once its newest object is this many seconds old (default 3600; a writer
        /// still uploading wrote one more recently).
        #[arg(long, value_name = "SECONDS")]
        grace: Option<u64>,
    },
}

const SAVE_EXAMPLES: &str = "\
Examples:
  tlio ckpt save ckpt --step 100 --model model.safetensors --tokens-seen 51200 --lr 0.01
  tlio ckpt save ckpt --step 200 --model model.safetensors --optimizer optim.safetensors --keep 3
  tlio ckpt save ckpt --step 300 --model model.safetensors --state trainer_state.json";

const VERIFY_EXAMPLES: &str = "\
Examples:
  tlio ckpt verify run/ckpt
  tlio ckpt verify run/ckpt/step-000100
  tlio --json ckpt verify run/ckpt";

const LATEST_EXAMPLES: &str = "\
Examples:
  tlio ckpt latest run/ckpt
  step=$(tlio ckpt latest run/ckpt) && ls \"$step\"
  tlio --json ckpt latest run/ckpt";

const EXPORT_EXAMPLES: &str = "\
Examples:
  tlio ckpt export run/ckpt/step-000500 -o gpt2-final
  tlio ckpt export \"$(tlio ckpt latest run/ckpt)\" -o gpt2-shards --max-shard-size 2GB";

const IMPORT_EXAMPLES: &str = "\
Examples:
  tlio ckpt import outputs/checkpoint/step-1000 -o run/ckpt
  TLIO_PYTHON=.venv/bin/python tlio ckpt import dcp_ckpt -o run/ckpt --step 1000";

const GC_EXAMPLES: &str = "\
Examples:
  tlio ckpt gc run/ckpt --keep 2 --dry-run
  tlio ckpt gc run/ckpt --keep 2";

/// Arguments of `ckpt save`.
#[derive(Debug, Args)]
pub struct SaveArgs {
    /// The checkpoint directory (created if missing), or an s3://bucket/prefix URL.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// The optimizer step; the directory becomes step-NNNNNN.
    #[arg(long, value_name = "N")]
    pub step: u64,
    /// The model's safetensors file.
    #[arg(long, value_name = "FILE")]
    pub model: PathBuf,
    /// The optimizer's safetensors file (`<parameter>.<key>` arrays, state metadata).
    #[arg(long, value_name = "FILE")]
    pub optimizer: Option<PathBuf>,
    /// A trainer_state.json to store (its step must equal --step; missing keys take
    /// their defaults).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["tokens_seen", "lr", "git_sha"])]
    pub state: Option<PathBuf>,
    /// Tokens seen so far (when no --state is given).
    #[arg(long, value_name = "N")]
    pub tokens_seen: Option<u64>,
    /// The learning rate (when no --state is given).
    #[arg(long, value_name = "LR", value_parser = super::args::train_float, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// The git commit of the training code, 40 or 64 hex digits (when no --state).
    #[arg(long, value_name = "SHA")]
    pub git_sha: Option<String>,
    /// The run's config.json (stored and hashed into the state).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Keep only the newest K valid steps after saving.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    pub keep: Option<u64>,
    /// Replace step N when it already exists as a complete checkpoint.
    #[arg(long)]
    pub overwrite: bool,
    /// Save even when N is not newer than the step LATEST names (moves LATEST back;
    /// a later gc then removes the newer steps).
    #[arg(long)]
    pub force: bool,
}

/// Run `tlio ckpt`.
pub fn run(cmd: CkptCommand, printer: &Printer) -> anyhow::Result<Outcome> {
    match cmd {
        CkptCommand::Save(args) => save(args, printer),
        CkptCommand::Verify { path } => verify(&path, printer),
        CkptCommand::Latest { dir } => latest(&dir, printer),
        CkptCommand::Gc {
            dir,
            keep,
            dry_run,
            grace,
        } => gc(&dir, keep, dry_run, grace, printer),
        CkptCommand::Export {
            step_dir,
            output,
            max_shard_size,
        } => export(&step_dir, &output, max_shard_size, printer),
        CkptCommand::Import {
            dcp_dir,
            output,
            step,
        } => import::run(&dcp_dir, &output, step, printer),
    }
}

fn export(
    step_dir: &Path,
    output: &Path,
    max_shard_size: Option<u64>,
    printer: &Printer,
) -> anyhow::Result<Outcome> {
    let report = location::export(step_dir, output, max_shard_size).with_context(|| {
        format!(
            "cannot export {} to {}",
            step_dir.display(),
            output.display()
        )
    })?;
    if printer.json {
        #[derive(Serialize)]
        struct Out<'a> {
            output: String,
            files: &'a [String],
            tensors: usize,
            tied: usize,
            data_bytes: u64,
        }
        printer.json_line(&Out {
            output: output.display().to_string(),
            files: &report.files,
            tensors: report.tensors,
            tied: report.tied.len(),
            data_bytes: report.data_bytes,
        })?;
    } else {
        // A command that writes files prints no result of its own: what it wrote is
        // chatter on stderr, which -q silences (docs/cli.md).
        printer.info(format!(
            "exported {} tensors ({} bytes) to {}: {}",
            report.tensors,
            report.data_bytes,
            output.display(),
            report.files.join(", ")
        ));
        if let Some((name, stored)) = report.tied.first() {
            // transformers re-ties these itself; a plain strict load_state_dict of
            // the files would miss them.
            let pairs: Vec<String> = report
                .tied
                .iter()
                .map(|(name, stored)| format!("{name} = {stored}"))
                .collect();
            printer.info(format!(
                "tied, stored once: {}; after load_file, add each before a strict \
                 load_state_dict (state[\"{name}\"] = state[\"{stored}\"]), or let \
                 transformers' from_pretrained tie them",
                pairs.join(", ")
            ));
        }
    }
    Ok(Outcome::Success)
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    // A JSON input of a save (state, config): bounded like the JSON a verify reads.
    tlio_core::files::read_limited(path, tlio_core::checkpoint::verify::MAX_JSON_BYTES)
        .with_context(|| format!("cannot read {}", path.display()))
}

fn save(args: SaveArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let state = match &args.state {
        Some(path) => TrainerState::from_json_with_defaults(&read(path)?)
            .map_err(checkpoint::CheckpointError::from)
            .with_context(|| format!("invalid {}", path.display()))?,
        None => TrainerState {
            tokens_seen: args.tokens_seen.unwrap_or(0),
            lr: args.lr,
            git_sha: args.git_sha.clone(),
            ..TrainerState::new(args.step)
        },
    };
    let config = match &args.config {
        Some(path) => Some(Cow::Owned(read(path)?)),
        None => None,
    };
    let keep = match args.keep {
        Some(k) => Some(usize::try_from(k).context("--keep is too large")?),
        None => None,
    };
    let req = SaveRequest {
        step: args.step,
        model: Payload::Copy(args.model.clone()),
        optimizer: args.optimizer.clone().map(Payload::Copy),
        state,
        config,
        keep,
        overwrite: args.overwrite,
        force: args.force,
        lock_wait: checkpoint::SAVE_LOCK_WAIT,
    };
    let report = location::save_waiting(&args.dir, req, None, &mut |path| {
        printer.warn(format!(
            "waiting for {} (another tlio save or gc holds it; giving up after {} s)",
            path.display(),
            checkpoint::SAVE_LOCK_WAIT.as_secs()
        ))
    })
    .map_err(with_flags)
    .with_context(|| format!("cannot save step {} in {}", args.step, args.dir.display()))?;
    for path in &report.removed {
        printer.info(format!("removed {}", path.display()));
    }
    // The step is committed: what cleanup could not do is a warning, not a failure.
    for problem in &report.cleanup_problems {
        printer.warn(format!(
            "{problem} (the save succeeded; the next save or gc removes it)"
        ));
    }
    if printer.json {
        #[derive(Serialize)]
        struct Out<'a> {
            step: u64,
            name: String,
            files: &'a [checkpoint::ManifestEntry],
        }
        printer.json_line(&Out {
            step: report.step,
            name: step_name(report.step),
            files: &report.files,
        })?;
    } else {
        let mut out = printer.out();
        writeln!(out, "{}", report.path.display())?;
    }
    Ok(Outcome::Success)
}

#[derive(Serialize)]
struct StepJson {
    step: u64,
    name: String,
    status: String,
    problems: Vec<String>,
    size: u64,
    latest: bool,
    newer_than_latest: bool,
    load: bool,
}

/// A path is one step directory when its name is a step name or it holds a manifest
/// (a URL: when its last segment is a step name).
fn is_step_dir(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_step_name)
        .is_some()
        || (!location::is_remote(path) && fs::symlink_metadata(path.join(MANIFEST_NAME)).is_ok())
}

fn verify(path: &Path, printer: &Printer) -> anyhow::Result<Outcome> {
    if location::is_remote(path) {
        if is_step_dir(path) {
            return verify_step_dir(path, printer);
        }
        let survey = location::survey_with(path, &mut |_| {}, &mut |_| {})
            .with_context(|| format!("cannot verify {}", path.display()))?;
        let ok = survey.pick.is_some() && survey.latest_is_valid();
        print_survey(&survey, ok, printer)?;
        return Ok(Outcome::from_ok(ok));
    }
    let meta = fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_dir() {
        return Err(crate::error::operational(format!(
            "{} is not a directory but a {}",
            path.display(),
            tlio_core::files::kind_name(&meta.file_type())
        )));
    }
    if is_step_dir(path) {
        return verify_step_dir(path, printer);
    }
    let survey =
        checkpoint::survey(path).with_context(|| format!("cannot verify {}", path.display()))?;
    let ok = survey.pick.is_some() && survey.latest_is_valid();
    print_survey(&survey, ok, printer)?;
    Ok(Outcome::from_ok(ok))
}

fn verify_step_dir(path: &Path, printer: &Printer) -> anyhow::Result<Outcome> {
    let total = if location::is_remote(path) {
        0
    } else {
        ckverify::step_dir_bytes(path)
    };
    let bar = printer.bytes_bar(total, "verify");
    let ins = location::inspect_step(path, &mut |n| bar.inc(n))
        .with_context(|| format!("cannot verify {}", path.display()))?;
    bar.finish_and_clear();
    let ok = ins.problems.is_empty();
    let problems: Vec<String> = ins.problems.iter().map(|p| p.to_string()).collect();
    if printer.json {
        #[derive(Serialize)]
        struct Out {
            ok: bool,
            step: Option<u64>,
            size: u64,
            problems: Vec<String>,
        }
        printer.json_line(&Out {
            ok,
            step: ins.manifest.as_ref().map(|m| m.step),
            size: ins.size,
            problems,
        })?;
    } else {
        let mut out = printer.out();
        if ok {
            writeln!(
                out,
                "ok ({} verified)",
                crate::output::human_bytes(ins.size)
            )?;
        } else {
            for p in &problems {
                writeln!(out, "{}", escape(p))?;
            }
        }
    }
    Ok(Outcome::from_ok(ok))
}

/// The widest status `ckpt verify` keeps in its table, in characters.
const MAX_STATUS_CELL: usize = 40;

/// The status cell of a step whose reason is printed below the table.
const LONG_STATUS: &str = "failed: reason below";

fn print_survey(survey: &Survey, ok: bool, printer: &Printer) -> anyhow::Result<()> {
    let steps: Vec<StepJson> = survey
        .rows
        .iter()
        .map(|r| StepJson {
            step: r.step,
            name: step_name(r.step),
            status: r.status(),
            problems: r.problems.iter().map(|p| p.to_string()).collect(),
            size: r.size,
            latest: r.latest,
            newer_than_latest: r.newer_than_latest,
            load: r.picked,
        })
        .collect();
    let latest = survey.latest_name();
    let latest_problem = survey.latest_problem();
    let stale = survey.stale();
    if printer.json {
        #[derive(Serialize)]
        struct Out<'a> {
            ok: bool,
            latest: Option<String>,
            latest_problem: Option<String>,
            load: Option<String>,
            steps: &'a [StepJson],
            stale: &'a [String],
            // Only where there are some: a local directory never has any.
            #[serde(skip_serializing_if = "<[String]>::is_empty")]
            foreign: &'a [String],
        }
        printer.json_line(&Out {
            ok,
            latest,
            latest_problem,
            load: survey.pick.map(step_name),
            steps: &steps,
            stale: &stale,
            foreign: &survey.foreign,
        })?;
        return Ok(());
    }
    let mut table = printer.table();
    table.set_header(["step", "status", "size", "LATEST", "load"]);
    let mut long_reasons = Vec::new();
    for (s, row) in steps.iter().zip(&survey.rows) {
        let tone = if s.problems.is_empty() {
            Tone::Good
        } else {
            Tone::Bad
        };
        let verdict = escape(&row.verdict());
        // One long reason (a sha256 mismatch names two digests) would widen the status
        // column of every row: it goes below the table instead.
        let status = if verdict.chars().count() > MAX_STATUS_CELL {
            long_reasons.push(format!("{}: {verdict}", s.name));
            LONG_STATUS.to_string()
        } else {
            verdict
        };
        table.add_row(vec![
            Cell::new(&s.name),
            printer.cell(status, tone),
            Cell::new(crate::output::human_bytes(s.size)),
            Cell::new(if s.latest { "LATEST" } else { "" }),
            Cell::new(if s.load { "load" } else { "" }),
        ]);
    }
    let mut out = printer.out();
    writeln!(out, "{}", crate::output::table_text(&table))?;
    for reason in &long_reasons {
        writeln!(out, "{reason}")?;
    }
    if let Some(p) = &latest_problem {
        writeln!(out, "{}", escape(p))?;
    }
    print_leftovers(&mut out, survey, &stale)
}

/// The lines below the table: leftovers, foreign keys and `load`'s choice.
fn print_leftovers(out: &mut impl Write, survey: &Survey, stale: &[String]) -> anyhow::Result<()> {
    for s in stale {
        writeln!(out, "stale: {} (removed by the next save or gc)", escape(s))?;
    }
    for f in &survey.foreign {
        writeln!(
            out,
            "ignored: {} (not a key of the checkpoint protocol: no object-store path names it)",
            escape(f)
        )?;
    }
    match survey.pick {
        Some(n) => writeln!(out, "load picks {}", step_name(n))?,
        None => writeln!(out, "no loadable checkpoint")?,
    }
    Ok(())
}

fn latest(dir: &Path, printer: &Printer) -> anyhow::Result<Outcome> {
    let loaded = location::pick(dir, None)
        .with_context(|| format!("cannot load a checkpoint from {}", dir.display()))?;
    if printer.json {
        #[derive(Serialize)]
        struct Skipped<'a> {
            name: &'a str,
            reason: &'a str,
        }
        #[derive(Serialize)]
        struct Out<'a> {
            step: u64,
            name: String,
            path: String,
            skipped: Vec<Skipped<'a>>,
        }
        printer.json_line(&Out {
            step: loaded.step,
            name: step_name(loaded.step),
            path: loaded.path.display().to_string(),
            skipped: loaded
                .skipped
                .iter()
                .map(|(name, reason)| Skipped { name, reason })
                .collect(),
        })?;
    } else {
        for (name, reason) in &loaded.skipped {
            printer.warn(format!("skipped {name}: {reason}"));
        }
        let mut out = printer.out();
        writeln!(out, "{}", loaded.path.display())?;
    }
    Ok(Outcome::Success)
}

fn gc(
    dir: &Path,
    keep: u64,
    dry_run: bool,
    grace: Option<u64>,
    printer: &Printer,
) -> anyhow::Result<Outcome> {
    let keep = usize::try_from(keep).context("--keep is too large")?;
    if grace.is_some() && !location::is_remote(dir) {
        return Err(crate::error::operational(format!(
            "--grace applies to object storage (s3://) only: a local gc holds the directory's \
             lock, so no save is writing while it removes {}'s temporaries",
            dir.display()
        )));
    }
    let grace = grace.map(std::time::Duration::from_secs);
    let report = location::gc(dir, keep, dry_run, grace)
        .with_context(|| format!("cannot collect garbage in {}", dir.display()))?;
    let rows: Vec<(String, &str)> = report
        .removed
        .iter()
        .map(|r| {
            // Every removal is below `dir` (`step-N`, or `step-N/attempt-x` on object
            // storage): shown relative to it, or whole if it somehow is not.
            let name = r.path.strip_prefix(dir).map_or_else(
                |_| r.path.display().to_string(),
                |n| n.display().to_string(),
            );
            (name, r.reason.describe())
        })
        .collect();
    if printer.json {
        #[derive(Serialize)]
        struct Entry<'a> {
            name: &'a str,
            reason: &'a str,
        }
        #[derive(Serialize)]
        struct Out<'a> {
            dry_run: bool,
            removed: Vec<Entry<'a>>,
            kept_newer: Vec<String>,
            latest_problem: Option<&'a str>,
        }
        printer.json_line(&Out {
            dry_run,
            kept_newer: report.kept_newer.iter().map(|&n| step_name(n)).collect(),
            latest_problem: report.latest_problem.as_deref(),
            removed: rows
                .iter()
                .map(|(name, reason)| Entry { name, reason })
                .collect(),
        })?;
    } else {
        let mut out = printer.out();
        let verb = if dry_run { "would remove" } else { "removed" };
        for (name, reason) in &rows {
            writeln!(out, "{verb} {} ({reason})", escape(name))?;
        }
        for &n in &report.kept_newer {
            writeln!(
                out,
                "kept {} (newer than the newest verifying step, and LATEST cannot tell \
                 whether it was completed)",
                step_name(n)
            )?;
        }
        if let Some(why) = &report.latest_problem {
            writeln!(out, "{}", escape(why))?;
        }
        if rows.is_empty() {
            writeln!(out, "nothing to remove")?;
        }
    }
    Ok(Outcome::Success)
}
