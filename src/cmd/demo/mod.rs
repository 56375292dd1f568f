//! `tlio demo`: the whole mission end to end on a corpus built into the binary: pack it
//! into a shard, check the shard, train the bigram with checkpoints, abort a run
//! mid-way through the `train/after-step` failpoint, resume it, train the same run
//! uninterrupted, and check that both end bit for bit equal.
//!
//! Every step runs the `tlio` binary itself as a child process with the flags of the
//! spec, so the demo exercises exactly the command-line contract a user or a script
//! relies on, and the abort is a real crash of a real process. Invariant: the demo
//! exits 0 only when every check held; a child's stderr is captured and shown only
//! when that child did something unexpected.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use comfy_table::Cell;
use serde::Serialize;
use serde_json::Value;

use super::Outcome;
use crate::output::Printer;
use children::Children;

mod children;
mod steps;

/// The built-in corpus: an essay written for this project (same licence as the code).
pub const CORPUS: &[u8] = include_bytes!("../../../assets/demo_corpus.txt");

/// Optimizer steps of every run (the spec's resume experiment: 100 steps).
const STEPS: u64 = 100;
/// A checkpoint every this many steps.
const CKPT_EVERY: u64 = 25;
/// The failpoint lets this many steps pass and aborts after the next one.
const ABORT_AFTER: u64 = 60;
/// Windows per batch.
const BATCH: u64 = 8;
/// Positions per window.
const SEQ_LEN: u64 = 64;
/// The stream's seed.
const SEED: u64 = 1337;
/// AdamW's learning rate: large enough for the loss to fall visibly in 100 steps.
const LR: &str = "0.05";
/// Byte-level data: every byte is a token.
const VOCAB: u64 = 256;

/// How many child processes a complete demo runs (for the progress bar).
const CHILDREN: u64 = 10;

const SHARD: &str = "corpus.bin";
const FULL: &str = "run-uninterrupted";
const RESUMED: &str = "run-resumed";

/// The examples of `tlio demo --help`.
pub const EXAMPLES: &str = "\
Examples:
  tlio demo
  tlio demo -o demo-files
  tlio --json demo";

/// Arguments of `tlio demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Keep every file the demo makes in DIR (created if missing; must be empty).
    /// Without it the demo works in a temporary directory and removes it afterwards.
    #[arg(short = 'o', long = "output", alias = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// One check of the report.
#[derive(Debug, Serialize)]
struct Check {
    name: String,
    ok: bool,
    detail: String,
}

/// One training run of the report.
#[derive(Debug, Serialize)]
struct Run {
    run: String,
    steps: String,
    loss: Option<f64>,
}

/// The whole report, also the `--json` document.
#[derive(Debug, Serialize)]
struct Report {
    ok: bool,
    corpus_bytes: usize,
    runs: Vec<Run>,
    checks: Vec<Check>,
    /// False when a step the later ones depend on failed and the demo stopped there.
    completed: bool,
    final_line: Option<Value>,
    /// The final line's exact bytes, shown as they are (re-serializing the parsed
    /// value would reorder its keys).
    #[serde(skip)]
    final_line_text: Option<String>,
    kept_in: Option<PathBuf>,
}

/// Collects checks; `need` ends the demo early when a step others depend on failed.
struct Checks(Vec<Check>);

impl Checks {
    fn add(&mut self, name: &str, ok: bool, detail: impl Into<String>) -> bool {
        self.0.push(Check {
            name: name.to_string(),
            ok,
            detail: detail.into(),
        });
        ok
    }
}

/// Run `tlio demo`.
pub fn run(args: DemoArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    // The temporary directory (when no --out) lives until the end of this function.
    let (dir, _tmp) = match &args.out {
        Some(out) => {
            prepare_out(out)?;
            (out.clone(), None)
        }
        None => {
            let tmp = tempfile::Builder::new()
                .prefix("tlio-demo-")
                .tempdir()
                .context("cannot create a temporary directory")?;
            // Registered, so that Ctrl-C during the demo removes it too.
            let tmp = tlio_core::atomic::TempDir::adopt(tmp.keep())?;
            (tmp.path().to_path_buf(), Some(tmp))
        }
    };
    let exe = std::env::current_exe().context("cannot find the tlio binary")?;
    let children = Children {
        exe,
        dir: &dir,
        printer,
        bar: printer.bar(CHILDREN, "", "{bar:30} {pos}/{len} {msg}"),
    };
    let mut report = Report {
        ok: false,
        corpus_bytes: CORPUS.len(),
        runs: Vec::new(),
        checks: Vec::new(),
        completed: false,
        final_line: None,
        final_line_text: None,
        kept_in: args.out.clone(),
    };
    let mut checks = Checks(Vec::new());
    report.completed = steps::steps(&children, &mut checks, &mut report)?;
    children.bar.finish_and_clear();
    report.checks = checks.0;
    report.ok = report.completed && report.checks.iter().all(|c| c.ok);
    print_report(&report, printer)?;
    printer.info(format!(
        "tlio demo: {} in {:.1} s{}",
        if report.ok {
            "every check held"
        } else {
            "a check FAILED"
        },
        started.elapsed().as_secs_f64(),
        match &args.out {
            Some(out) => format!("; files kept in {}", out.display()),
            None => String::new(),
        }
    ));
    Ok(Outcome::from_ok(report.ok))
}

/// `--out DIR` must be a new or empty directory: the runs refuse to overwrite old
/// checkpoints, and mixing a previous demo's files into this one would prove nothing.
fn prepare_out(out: &Path) -> anyhow::Result<()> {
    tlio_core::files::create_dir_all(out)
        .with_context(|| format!("cannot create directory {}", out.display()))?;
    let mut entries =
        fs::read_dir(out).with_context(|| format!("cannot read directory {}", out.display()))?;
    if entries.next().is_some() {
        return Err(crate::error::operational(format!(
            "{} is not empty: give a new or empty directory to --out",
            out.display()
        )));
    }
    Ok(())
}

fn print_report(report: &Report, printer: &Printer) -> anyhow::Result<()> {
    if printer.json {
        printer.json_line(report)?;
        return Ok(());
    }
    let mut out = printer.out();
    writeln!(
        out,
        "tlio demo: {} bytes of built-in text, byte-level tokens (V = {VOCAB}), \
         batch {BATCH} x {SEQ_LEN}, AdamW lr {LR}, seed {SEED}",
        report.corpus_bytes
    )?;
    writeln!(out)?;
    if !report.runs.is_empty() {
        let mut runs = printer.table();
        runs.set_header(vec!["run", "steps", "final loss"]);
        for run in &report.runs {
            runs.add_row(vec![
                Cell::new(&run.run),
                Cell::new(&run.steps),
                Cell::new(run.loss.map_or("-".to_string(), |l| format!("{l:.6}"))),
            ]);
        }
        writeln!(out, "{}", crate::output::table_text(&runs))?;
        writeln!(out)?;
    }
    let mut table = printer.table();
    table.set_header(vec!["check", "result", "detail"]);
    for check in &report.checks {
        table.add_row(vec![
            Cell::new(&check.name),
            if check.ok {
                printer.cell("pass", crate::output::Tone::Good)
            } else {
                printer.cell("FAIL", crate::output::Tone::Bad)
            },
            Cell::new(tlio_core::text::escape(&check.detail)),
        ]);
    }
    writeln!(out, "{}", crate::output::table_text(&table))?;
    writeln!(out)?;
    if let Some(line) = &report.final_line_text {
        writeln!(out, "final line of both runs:")?;
        writeln!(out, "{}", tlio_core::text::escape(line))?;
    }
    let failed = report.checks.iter().filter(|c| !c.ok).count();
    if report.ok {
        writeln!(out, "all {} checks passed", report.checks.len())?;
    } else if !report.completed {
        writeln!(
            out,
            "{failed} of {} checks FAILED; the demo stopped there (later steps depend on it)",
            report.checks.len()
        )?;
    } else {
        writeln!(out, "{failed} of {} checks FAILED", report.checks.len())?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_is_plain_text_of_the_promised_size() {
        assert!((60_000..=200_000).contains(&CORPUS.len()));
        assert!(CORPUS
            .iter()
            .all(|&b| b == b'\n' || (0x20..0x7f).contains(&b)));
    }

    #[test]
    fn out_must_be_empty() {
        let dir = tempfile::tempdir().unwrap();
        prepare_out(&dir.path().join("new")).unwrap();
        fs::write(dir.path().join("new/x"), b"x").unwrap();
        assert!(prepare_out(&dir.path().join("new")).is_err());
    }
}
