//! `st verify`: every reader rule over a file, an index or a directory, one line (or
//! one JSON object) per file with its findings.
//!
//! Invariant: each file's verdict is printed as soon as it is reached, so a later file
//! that cannot be read does not hide the earlier ones; the exit status says whether
//! every file passed.

use std::io::Write;

use serde::Serialize;

use super::super::Outcome;
use super::VerifyArgs;
use crate::output::{Printer, Tone};
use tlio_core::model::view::verify_model;
use tlio_core::safetensors::verify::{Finding, VerifyOptions};
use tlio_core::text::escape;

#[derive(Serialize)]
struct VerifyReport {
    path: String,
    ok: bool,
    failures: Vec<Finding>,
}

pub(super) fn run_verify(args: &VerifyArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let opts = VerifyOptions {
        canonical: args.canonical,
        finite: args.finite,
    };
    let mut reports = Vec::new();
    for path in &args.files {
        let bar = printer.bytes_bar(0, "verify");
        let mut progress = |done: u64, total: u64| {
            bar.set_length(total);
            bar.set_position(done);
        };
        let failures = verify_model(path, opts, &mut progress).map_err(|e| {
            super::in_context(e, format!("cannot verify {}", path.display()), &[path])
        });
        bar.finish_and_clear();
        let report = VerifyReport {
            path: path.display().to_string(),
            ok: failures.as_ref().is_ok_and(|f| f.is_empty()),
            failures: failures?,
        };
        if !printer.json {
            // Each file's lines as soon as it is read: a later file that cannot be
            // read must not hide the verdicts already reached (cli.md).
            let mut out = printer.out();
            if report.ok {
                writeln!(
                    out,
                    "{}: {}",
                    escape(&report.path),
                    printer.paint("ok", Tone::Good)
                )?;
            }
            for f in &report.failures {
                writeln!(
                    out,
                    "{}: {}",
                    escape(&report.path),
                    printer.paint(&escape(&f.message), Tone::Bad)
                )?;
            }
            out.flush()?;
        }
        reports.push(report);
    }
    let ok = reports.iter().all(|r| r.ok);
    if printer.json {
        printer.json_line(&serde_json::json!({ "ok": ok, "files": reports }))?;
    }
    Ok(Outcome::from_ok(ok))
}
