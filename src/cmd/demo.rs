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
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use comfy_table::Cell;
use serde::Serialize;
use serde_json::Value;

use super::Outcome;
use crate::output::Printer;
use tlio_core::checkpoint::step_name;

/// The built-in corpus: an essay written for this project (same licence as the code).
pub const CORPUS: &[u8] = include_bytes!("../../assets/demo_corpus.txt");

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

/// Runs `tlio` children in the work directory with relative paths, so that nothing
/// they print depends on where the work directory is.
struct Children<'a> {
    exe: PathBuf,
    dir: &'a Path,
    printer: &'a Printer,
    /// One tick per child; drawn only on a terminal (the Printer decides).
    bar: indicatif::ProgressBar,
}

impl Children<'_> {
    /// Run `tlio ARGS` with `FAILPOINTS` set to `failpoints` (or cleared).
    fn run(&self, args: &[&str], failpoints: Option<&str>) -> anyhow::Result<Output> {
        let mut cmd = Command::new(&self.exe);
        cmd.args(args)
            .current_dir(self.dir)
            .stdin(Stdio::null())
            .env_remove("FAILPOINTS");
        if let Some(spec) = failpoints {
            cmd.env("FAILPOINTS", spec);
        }
        let out = cmd
            .output()
            .with_context(|| format!("cannot run {}", self.exe.display()))?;
        self.bar.inc(1);
        Ok(out)
    }

    /// Show what a child said on stderr, because it did something unexpected.
    fn show_failure(&self, args: &[&str], out: &Output) {
        self.bar.suspend(|| self.write_failure(args, out));
    }

    fn write_failure(&self, args: &[&str], out: &Output) {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(
            err,
            "tlio demo: `tlio {}` ended with {}; its stderr:",
            args.join(" "),
            describe(&out.status)
        );
        let _ = err.write_all(&out.stderr);
        if !out.stderr.ends_with(b"\n") && !out.stderr.is_empty() {
            let _ = writeln!(err);
        }
    }

    /// Say what the demo is doing: the bar's message on a terminal, else a line of
    /// chatter (silenced by `-q`).
    fn stage(&self, what: &str) {
        if self.printer.wants_progress() {
            self.bar.set_message(what.to_string());
        } else {
            self.printer.info(format!("tlio demo: {what}"));
        }
    }
}

/// How a child ended, in words.
fn describe(status: &ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            if sig == libc::SIGABRT {
                return format!("SIGABRT (signal {sig})");
            }
            return format!("signal {sig}");
        }
    }
    "an unknown status".to_string()
}

/// True when the child was ended by `abort()` (SIGABRT), as the failpoint's `return`
/// action does.
fn aborted(status: &ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        status.signal() == Some(libc::SIGABRT)
    }
    #[cfg(not(unix))]
    {
        !status.success()
    }
}

fn stdout_text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

/// The first value under `key` anywhere in `v`, depth first, objects before arrays'
/// later elements.
fn find<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    match v {
        Value::Object(map) => {
            if let Some(found) = map.get(key) {
                return Some(found);
            }
            map.values().find_map(|x| find(x, key))
        }
        Value::Array(items) => items.iter().find_map(|x| find(x, key)),
        _ => None,
    }
}

/// The flags shared by the three training runs.
fn train_args(out: &str) -> Vec<String> {
    vec![
        "train".into(),
        "bigram".into(),
        SHARD.into(),
        "-o".into(),
        out.into(),
        "--max-steps".into(),
        STEPS.to_string(),
        "--ckpt-every".into(),
        CKPT_EVERY.to_string(),
        "--batch".into(),
        BATCH.to_string(),
        "--seq-len".into(),
        SEQ_LEN.to_string(),
        "--seed".into(),
        SEED.to_string(),
        "--lr".into(),
        LR.into(),
    ]
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
    report.completed = steps(&children, &mut checks, &mut report)?;
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
    fs::create_dir_all(out)
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

/// Every step of the demo, in order. Returns false early (with the failed check
/// recorded) when a later step would have nothing to work on.
fn steps(ch: &Children, checks: &mut Checks, report: &mut Report) -> anyhow::Result<bool> {
    let corpus = ch.dir.join("corpus.txt");
    tlio_core::atomic::write_file(&corpus, CORPUS)
        .with_context(|| format!("cannot write {}", corpus.display()))?;
    if !pack_shard(ch, checks)? || !inspect_shard(ch, checks)? {
        return Ok(false);
    }
    let Some((line_a, final_a)) = uninterrupted_run(ch, checks, report)? else {
        return Ok(false);
    };
    let res_args = train_args(RESUMED);
    let res_refs: Vec<&str> = res_args.iter().map(String::as_str).collect();
    if !aborted_run(ch, checks, report, &res_refs)? {
        return Ok(false);
    }
    let Some(last_saved) = crash_leftover(ch, checks)? else {
        return Ok(false);
    };
    if !resumed_run(ch, checks, report, &res_refs, last_saved, &line_a)? {
        return Ok(false);
    }
    report.final_line = final_a;
    report.final_line_text = Some(line_a);
    compare_final_files(ch, checks)?;
    verify_dirs(ch, checks)?;
    Ok(true)
}

/// Step 1: the built-in corpus packed into a shard (every byte is a token).
fn pack_shard(ch: &Children, checks: &mut Checks) -> anyhow::Result<bool> {
    ch.stage("packing the built-in corpus into a token shard");
    let pack = ["tokens", "pack", "corpus.txt", "-o", SHARD];
    let out = ch.run(&pack, None)?;
    if !checks.add(
        "tokens pack: corpus into a shard",
        out.status.success(),
        format!("{} bytes -> {SHARD}", CORPUS.len()),
    ) {
        ch.show_failure(&pack, &out);
        return Ok(false);
    }

    Ok(true)
}

/// Step 2: the shard's header validates and counts every byte.
fn inspect_shard(ch: &Children, checks: &mut Checks) -> anyhow::Result<bool> {
    let header = ["tokens", "header", SHARD, "--json"];
    let out = ch.run(&header, None)?;
    let doc: Option<Value> = serde_json::from_slice(&out.stdout).ok();
    let n = doc
        .as_ref()
        .and_then(|d| find(d, "n"))
        .and_then(Value::as_u64);
    let vocab = doc
        .as_ref()
        .and_then(|d| find(d, "vocab_size"))
        .and_then(Value::as_u64);
    let ok = out.status.success() && n == Some(CORPUS.len() as u64) && vocab == Some(VOCAB);
    if !checks.add(
        "tokens header: shard validates",
        ok,
        format!(
            "n = {}, V = {}",
            n.map_or("?".into(), |n| n.to_string()),
            vocab.map_or("?".into(), |v| v.to_string())
        ),
    ) {
        ch.show_failure(&header, &out);
        return Ok(false);
    }

    Ok(true)
}

/// Step 3: the uninterrupted run; its final line (text and parsed).
fn uninterrupted_run(
    ch: &Children,
    checks: &mut Checks,
    report: &mut Report,
) -> anyhow::Result<Option<(String, Option<Value>)>> {
    ch.stage(&format!("training {STEPS} steps uninterrupted"));
    let full_args = train_args(FULL);
    let full_refs: Vec<&str> = full_args.iter().map(String::as_str).collect();
    let out = ch.run(&full_refs, None)?;
    let line_a = stdout_text(&out);
    let final_a: Option<Value> = serde_json::from_str(&line_a).ok();
    let loss_a = final_a
        .as_ref()
        .and_then(|v| v.get("loss"))
        .and_then(Value::as_f64);
    let step_a = final_a
        .as_ref()
        .and_then(|v| v.get("step"))
        .and_then(Value::as_u64);
    report.runs.push(Run {
        run: "uninterrupted".into(),
        steps: format!("1-{STEPS}"),
        loss: loss_a,
    });
    if !checks.add(
        "train: uninterrupted run",
        out.status.success() && step_a == Some(STEPS),
        format!(
            "step {}, loss {}",
            step_a.map_or("?".into(), |s| s.to_string()),
            loss_a.map_or("?".into(), |l| format!("{l:.4}"))
        ),
    ) {
        ch.show_failure(&full_refs, &out);
        return Ok(None);
    }
    // An unreadable final.json fails the check with the reason, never as empty text.
    let (same, detail) = match fs::read(ch.dir.join(FULL).join("final.json")) {
        Ok(saved) => (
            saved.strip_suffix(b"\n").unwrap_or(&saved) == line_a.as_bytes(),
            format!("{FULL}/final.json"),
        ),
        Err(e) => (false, format!("{FULL}/final.json: {e}")),
    };
    checks.add("train: final.json = the final line", same, detail);
    let ln_v = (VOCAB as f64).ln();
    checks.add(
        "train: the loss fell",
        loss_a.is_some_and(|l| l < ln_v),
        format!(
            "{} < ln {VOCAB} = {ln_v:.4}",
            loss_a.map_or("?".into(), |l| format!("{l:.4}"))
        ),
    );

    Ok(Some((line_a, final_a)))
}

/// Step 4: the same run, aborted by the failpoint right after step ABORT_AFTER + 1.
fn aborted_run(
    ch: &Children,
    checks: &mut Checks,
    report: &mut Report,
    res_refs: &[&str],
) -> anyhow::Result<bool> {
    ch.stage(&format!(
        "training the same run, aborted after step {}",
        ABORT_AFTER + 1
    ));
    let spec = format!("train/after-step={ABORT_AFTER}*off->return");
    let out = ch.run(res_refs, Some(&spec))?;
    let no_final = !ch.dir.join(RESUMED).join("final.json").exists();
    report.runs.push(Run {
        run: "aborted by failpoint".into(),
        steps: format!("1-{}, then abort()", ABORT_AFTER + 1),
        loss: None,
    });
    if !checks.add(
        "failpoint: run aborted mid-way",
        aborted(&out.status) && out.stdout.is_empty() && no_final,
        format!("FAILPOINTS='{spec}': ended by {}", describe(&out.status)),
    ) {
        ch.show_failure(res_refs, &out);
        return Ok(false);
    }

    Ok(true)
}

/// Step 5: what the crash left, the newest checkpoint before the abort; its step.
fn crash_leftover(ch: &Children, checks: &mut Checks) -> anyhow::Result<Option<u64>> {
    let ckpt = format!("{RESUMED}/ckpt");
    let latest = ["ckpt", "latest", ckpt.as_str()];
    let out = ch.run(&latest, None)?;
    let picked = stdout_text(&out);
    let last_saved = ((ABORT_AFTER + 1) / CKPT_EVERY) * CKPT_EVERY;
    let ok = out.status.success() && picked.ends_with(&step_name(last_saved));
    if !checks.add(
        "ckpt latest: crash left a loadable checkpoint",
        ok,
        if picked.is_empty() {
            "none".to_string()
        } else {
            picked.clone()
        },
    ) {
        ch.show_failure(&latest, &out);
        return Ok(None);
    }

    Ok(Some(last_saved))
}

/// Step 6: resume the aborted run; its final line must equal the uninterrupted one's.
fn resumed_run(
    ch: &Children,
    checks: &mut Checks,
    report: &mut Report,
    res_refs: &[&str],
    last_saved: u64,
    line_a: &str,
) -> anyhow::Result<bool> {
    ch.stage(&format!("resuming from step {last_saved}"));
    let mut resume_refs = res_refs.to_vec();
    resume_refs.push("--resume");
    let out = ch.run(&resume_refs, None)?;
    let line_b = stdout_text(&out);
    let final_b: Option<Value> = serde_json::from_str(&line_b).ok();
    let loss_b = final_b
        .as_ref()
        .and_then(|v| v.get("loss"))
        .and_then(Value::as_f64);
    report.runs.push(Run {
        run: "resumed".into(),
        steps: format!("{}-{STEPS}", last_saved + 1),
        loss: loss_b,
    });
    if !checks.add(
        "train --resume: run completed",
        out.status.success() && final_b.is_some(),
        format!("from {}", step_name(last_saved)),
    ) {
        ch.show_failure(&resume_refs, &out);
        return Ok(false);
    }
    checks.add(
        "final lines byte-identical",
        !line_a.is_empty() && line_a == line_b,
        format!("{} bytes each", line_a.len()),
    );

    Ok(true)
}

/// Step 7: the final models and optimizer states, bitwise.
fn compare_final_files(ch: &Children, checks: &mut Checks) -> anyhow::Result<()> {
    let last = step_name(STEPS);
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let a = format!("{FULL}/ckpt/{last}/{file}");
        let b = format!("{RESUMED}/ckpt/{last}/{file}");
        let diff = ["st", "diff", a.as_str(), b.as_str()];
        let out = ch.run(&diff, None)?;
        if !checks.add(
            &format!("st diff: final {file} bitwise equal"),
            out.status.success(),
            describe(&out.status),
        ) {
            ch.show_failure(&diff, &out);
        }
    }

    Ok(())
}

/// Step 8: the checkpoint directories as a whole.
fn verify_dirs(ch: &Children, checks: &mut Checks) -> anyhow::Result<()> {
    for run in [FULL, RESUMED] {
        let ckpt = format!("{run}/ckpt");
        let verify = ["ckpt", "verify", ckpt.as_str()];
        let out = ch.run(&verify, None)?;
        if !checks.add(
            &format!("ckpt verify: {run}"),
            out.status.success(),
            describe(&out.status),
        ) {
            ch.show_failure(&verify, &out);
        }
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
    fn find_searches_nested_documents() {
        let v: Value = serde_json::json!({"files": [{"path": "x", "n": 3}]});
        assert_eq!(find(&v, "n"), Some(&Value::from(3)));
        assert_eq!(find(&v, "missing"), None);
    }

    #[test]
    fn out_must_be_empty() {
        let dir = tempfile::tempdir().unwrap();
        prepare_out(&dir.path().join("new")).unwrap();
        fs::write(dir.path().join("new/x"), b"x").unwrap();
        assert!(prepare_out(&dir.path().join("new")).is_err());
    }
}
