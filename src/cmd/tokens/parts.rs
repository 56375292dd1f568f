//! `tlio tokens pack --part K/N` and `tlio tokens merge`: the flags of a pack turned into
//! one part job (core plans the split, packs the part and writes its marker), and the
//! merge's report. Each is one core call plus printing.

use super::pack::{
    id_format, input_paths, published_shards, report_pack, show_text_progress, text_options,
    PackReport,
};
use super::*;
use tlio_core::remote::parts::{merge_at, pack_part_at};
use tlio_core::tokens::{MergeSummary, Part, PartJob, PartMarker, PartOutcome, PartSource};

/// What `tokens pack --part` reports.
#[derive(Serialize)]
struct PartReport {
    part: String,
    /// `packed` now, or `complete` already (nothing done).
    status: &'static str,
    dir: String,
    documents: u64,
    tokens: u64,
    skipped: u64,
}

/// The part `--part` names: `K/N`, or `slurm` for a Slurm array task.
fn part_arg(given: &str) -> anyhow::Result<Part> {
    let part = if given == "slurm" {
        Part::from_slurm(&|name| std::env::var(name).ok())
    } else {
        Part::parse(given)
    };
    part.context("--part takes K/N (part K of N, K from 0) or slurm")
}

pub(super) fn pack_part(
    args: &PackArgs,
    given: &str,
    printer: &Printer,
) -> anyhow::Result<Outcome> {
    let part = part_arg(given)?;
    let started = std::time::Instant::now();
    let bar = printer.bar(0, "", "{spinner} {elapsed} {msg}");
    let mut show = |p: &TextPackProgress| show_text_progress(&bar, started, p);
    let outcome = match args.tokenizer.as_deref() {
        Some(spec) => {
            let (tokenizer, opts, paths) = text_options(args, spec)?;
            let identity = tokens::tokenizer_identity(spec, &tokenizer)?;
            let job = PartJob {
                out: &args.output,
                inputs: &paths,
                part,
                source: PartSource::Text {
                    tokenizer: &tokenizer,
                    identity,
                    opts: &opts,
                },
            };
            pack_part_at(&job, &mut show)
        }
        None => {
            let (format, vocab) = id_format(args)?;
            let opts = PackOptions {
                format,
                vocab,
                shard_tokens: args.shard_tokens,
                layout: layout(args.format),
            };
            let paths = input_paths(args);
            let job = PartJob {
                out: &args.output,
                inputs: &paths,
                part,
                source: PartSource::Ids { opts: &opts },
            };
            pack_part_at(&job, &mut show)
        }
    };
    bar.finish_and_clear();
    let (outcome, dir) = outcome?;
    let (status, marker): (&'static str, PartMarker) = match outcome {
        PartOutcome::AlreadyComplete(m) => ("complete", m),
        PartOutcome::Packed(m) => ("packed", m),
    };
    let report = PartReport {
        part: part.to_string(),
        status,
        dir,
        documents: marker.documents,
        tokens: marker.tokens,
        skipped: marker.skipped,
    };
    if printer.json {
        printer.json_line(&report)?;
    } else if status == "complete" {
        printer.info(format!(
            "part {part} is complete already ({} tokens in {}): nothing to do",
            report.tokens,
            escape(&report.dir)
        ));
    } else {
        printer.info(format!(
            "packed part {part}: {} documents, {} tokens into {}{}",
            report.documents,
            report.tokens,
            escape(&report.dir),
            if report.skipped > 0 {
                format!(", {} bad lines or rows skipped", report.skipped)
            } else {
                String::new()
            }
        ));
    }
    Ok(Outcome::Success)
}

pub(super) fn merge(args: MergeArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let bar = printer.bar(0, "merging", "{msg} {bytes} {bytes_per_sec}");
    let merged = merge_at(&args.output, args.verify, &mut |n| bar.inc(n));
    bar.finish_and_clear();
    let (summary, published) =
        merged.with_context(|| format!("cannot merge the parts of {}", args.output.display()))?;
    let MergeSummary {
        parts,
        documents,
        tokens,
        skipped,
        ..
    } = summary;
    let report = PackReport {
        shards: published_shards(&published.shards),
        tokens,
        documents: Some(documents),
        skipped: Some(skipped),
        manifest: published.manifest,
        already_complete: published.already_complete,
    };
    if !printer.json {
        printer.info(format!("merged {parts} parts"));
    }
    report_pack(&report, printer)
}
