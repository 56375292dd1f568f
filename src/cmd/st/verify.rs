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
struct VerifyReport<'a> {
    path: String,
    ok: bool,
    failures: &'a [Finding],
    /// Findings counted but not listed (past core's per-file cap).
    more_failures: u64,
}

pub(super) fn run_verify(args: &VerifyArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let opts = VerifyOptions {
        canonical: args.canonical,
        finite: args.finite,
    };
    // One document, written as each file is done (nothing accumulates across
    // arguments): `{"files":[` ... `],"ok":B}`, the keys in the order serde_json's
    // sorted maps always printed them. A file that cannot be read still closes it.
    if printer.json {
        let mut out = printer.out();
        write!(out, "{{\"files\":[")?;
        out.flush()?;
    }
    let mut all_ok = true;
    let mut result = Ok(());
    for (i, path) in args.files.iter().enumerate() {
        match verify_one(path, opts, printer, i > 0) {
            Ok(ok) => all_ok &= ok,
            Err(e) => {
                all_ok = false;
                result = Err(e);
                break;
            }
        }
    }
    if printer.json {
        let mut out = printer.out();
        writeln!(out, "],\"ok\":{all_ok}}}")?;
        out.flush()?;
    }
    result.map(|()| Outcome::from_ok(all_ok))
}

/// Verify one argument and print its report; whether it passed.
fn verify_one(
    path: &std::path::Path,
    opts: VerifyOptions,
    printer: &Printer,
    comma: bool,
) -> anyhow::Result<bool> {
    let bar = printer.bytes_bar(0, "verify");
    let mut progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let found = match crate::cmd::s3_url(path)? {
        // An object: header by range requests, data (for --finite) streamed.
        Some(url) => {
            let found = tlio_core::remote::verify::verify_object(&url, opts, &mut progress);
            bar.finish_and_clear();
            // Every error of a remote verify already names the URL.
            found?
        }
        None => {
            let found = verify_model(path, opts, &mut progress);
            bar.finish_and_clear();
            found.map_err(|e| {
                super::in_context(e, format!("cannot verify {}", path.display()), &[path])
            })?
        }
    };
    let report = VerifyReport {
        path: path.display().to_string(),
        ok: found.is_empty(),
        failures: found.kept(),
        more_failures: found.more(),
    };
    let mut out = printer.out();
    if printer.json {
        if comma {
            write!(out, ",")?;
        }
        // Through a Value: its keys sorted, as every other document of tlio prints.
        let value = serde_json::to_value(&report)?;
        serde_json::to_writer(&mut std::io::BufWriter::new(&mut out), &value)
            .map_err(std::io::Error::from)?;
        out.flush()?;
        return Ok(report.ok);
    }
    // Each file's lines as soon as it is read: a later file that cannot be read must
    // not hide the verdicts already reached (cli.md).
    let shown = escape(&report.path);
    if report.ok {
        writeln!(out, "{shown}: {}", printer.paint("ok", Tone::Good))?;
    }
    for f in report.failures {
        writeln!(
            out,
            "{shown}: {}",
            printer.paint(&escape(&f.message), Tone::Bad)
        )?;
    }
    if report.more_failures > 0 {
        let more = format!(
            "and {} more failures (only the first {} of a file are listed)",
            report.more_failures,
            report.failures.len()
        );
        writeln!(out, "{shown}: {}", printer.paint(&more, Tone::Bad))?;
    }
    out.flush()?;
    Ok(report.ok)
}
