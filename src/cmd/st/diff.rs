//! `st diff`: what differs between two models (tensors only in one, changed dtype or
//! shape, different values, metadata), one line per difference then the verdict, or
//! one JSON document.
//!
//! Invariant: the JSON keeps the bytes a sorted `serde_json::Value` gave (keys in the
//! byte order of their names).

use std::borrow::Cow;
use std::io::{self, Write};
use std::path::PathBuf;

use serde::Serialize;

use super::super::Outcome;
use super::{shape_text, DiffArgs};
use crate::output::{significant, Printer};
use tlio_core::model::view::{diff_views, ModelView};
use tlio_core::safetensors::diff::{Changed, DiffReport, Different, MetaChange, ValueDiff};
use tlio_core::text::escape;

fn value_text(v: &Option<ValueDiff>) -> String {
    match v {
        None => "values not comparable".to_string(),
        Some(v) if v.differing == 0 => "values equal".to_string(),
        Some(v) => {
            let mut s = format!("{} of {} values differ", v.differing, v.count);
            if let Some(m) = v.max_abs_diff {
                s.push_str(&format!(", max abs diff {}", significant(m)));
            }
            if v.nan_mismatch > 0 {
                s.push_str(&format!(", {} NaN mismatches", v.nan_mismatch));
            }
            s
        }
    }
}

/// `--json st diff`'s document, keys in the byte order of their names (see
/// [`JsonDoc`](super::inspect::JsonDoc)); the report's own types declare their fields
/// in that order too.
#[derive(Serialize)]
pub(super) struct DiffJson<'r> {
    pub(super) changed: &'r [Changed<'r>],
    pub(super) different: &'r [Different<'r>],
    pub(super) equal: &'r [Cow<'r, str>],
    pub(super) identical: bool,
    pub(super) metadata: &'r [MetaChange<'r>],
    pub(super) only_in_a: &'r [Cow<'r, str>],
    pub(super) only_in_b: &'r [Cow<'r, str>],
}

pub(super) fn run_diff(args: &DiffArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let open = |p: &PathBuf| {
        ModelView::open(p).map_err(|e| {
            super::in_context(e, format!("cannot diff {}", p.display()), &[p.as_path()])
        })
    };
    let (a, b) = (open(&args.a)?, open(&args.b)?);
    let report = diff_views(&a, &b);
    let identical = report.identical();
    if printer.json {
        printer.json_line(&DiffJson {
            changed: &report.changed,
            different: &report.different,
            equal: &report.equal,
            identical,
            metadata: &report.metadata,
            only_in_a: &report.only_in_a,
            only_in_b: &report.only_in_b,
        })?;
        return Ok(Outcome::from_ok(identical));
    }
    let mut out = io::BufWriter::new(printer.out());
    print_diff(&report, &mut out)?;
    out.flush()?;
    Ok(Outcome::from_ok(identical))
}

/// What changed about a tensor in both models: dtype, shape, values.
fn changed_text(c: &Changed<'_>) -> String {
    let mut what = Vec::new();
    if c.dtype_a != c.dtype_b {
        what.push(format!("dtype {} -> {}", c.dtype_a, c.dtype_b));
    }
    if c.shape_a != c.shape_b {
        what.push(format!(
            "shape {} -> {}",
            shape_text(&c.shape_a),
            shape_text(&c.shape_b)
        ));
    }
    if c.values.is_some() {
        what.push(value_text(&c.values));
    }
    what.join(", ")
}

/// The human form of a diff: one line per difference, then the verdict.
fn print_diff(report: &DiffReport<'_>, out: &mut impl Write) -> io::Result<()> {
    for n in &report.only_in_a {
        writeln!(out, "only in A: {}", escape(n))?;
    }
    for n in &report.only_in_b {
        writeln!(out, "only in B: {}", escape(n))?;
    }
    for c in &report.changed {
        writeln!(out, "changed: {}: {}", escape(&c.name), changed_text(c))?;
    }
    for d in &report.different {
        writeln!(
            out,
            "differs: {}: {}",
            escape(&d.name),
            value_text(&d.values)
        )?;
    }
    for m in &report.metadata {
        let show = |v: Option<&str>| {
            v.map_or("(absent)".to_string(), |s| {
                escape(&tlio_core::text::quote(s))
            })
        };
        writeln!(
            out,
            "metadata: {}: {} -> {}",
            escape(&m.key),
            show(m.a.as_deref()),
            show(m.b.as_deref())
        )?;
    }
    if report.identical() {
        writeln!(
            out,
            "identical: {} tensors bitwise equal",
            report.equal.len()
        )
    } else {
        writeln!(
            out,
            "different: {} only in A, {} only in B, {} changed (dtype or shape), {} differ (same dtype and shape, other values), {} equal, {} metadata",
            report.only_in_a.len(),
            report.only_in_b.len(),
            report.changed.len(),
            report.different.len(),
            report.equal.len(),
            report.metadata.len()
        )
    }
}
