//! `tlio st`: inspect, verify, convert and diff safetensors files. Each command is one
//! call into `core::safetensors` plus printing (tables, JSON, progress).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;

use super::args::FloatDtype;
use super::Outcome;
use crate::core::safetensors::convert::convert;
use crate::core::safetensors::diff::{diff, DiffReport, ValueDiff};
use crate::core::safetensors::header::{totals, Totals};
use crate::core::safetensors::index::read_index;
use crate::core::safetensors::stats::{tensor_stats, Number, TensorStats};
use crate::core::safetensors::verify::{verify_with_progress, Finding, VerifyOptions};
use crate::core::safetensors::{read_header, Dtype, Header, MappedFile};
use crate::core::text::escape;
use crate::output::{human_bytes, human_count, Printer, Tone};

/// The `st` subcommands.
#[derive(Debug, Subcommand)]
pub enum StCommand {
    /// Show tensors (name, dtype, shape, parameters, bytes, offsets), metadata and
    /// totals by dtype, from the header alone. Accepts sharded `*.index.json` files.
    #[command(after_help = INSPECT_EXAMPLES)]
    Inspect(InspectArgs),
    /// Check every reader rule; print one line per failure naming the file, the rule
    /// and the tensor; exit 1 when any file fails.
    #[command(after_help = VERIFY_EXAMPLES)]
    Verify(VerifyArgs),
    /// Convert every float tensor to another float dtype, copying the rest, into a
    /// canonical file written atomically.
    // clap would show the output as optional: it is required in one of two spellings.
    #[command(
        after_help = CONVERT_EXAMPLES,
        override_usage = "tlio st convert [OPTIONS] <MODEL> -o <FILE> --dtype <DTYPE>"
    )]
    Convert(ConvertArgs),
    /// Compare two files: tensors only in one, dtype and shape changes, value
    /// differences, metadata; exit 0 when identical, 1 when they differ.
    #[command(after_help = DIFF_EXAMPLES)]
    Diff(DiffArgs),
}

const INSPECT_EXAMPLES: &str = "\
Examples:
  tlio st inspect model.safetensors
  tlio st inspect model.safetensors.index.json
  tlio st inspect --stats model.safetensors
  tlio --json st inspect model.safetensors";

const VERIFY_EXAMPLES: &str = "\
Examples:
  tlio st verify model.safetensors
  tlio st verify --canonical --finite *.safetensors
  tlio --json st verify model.safetensors";

const CONVERT_EXAMPLES: &str = "\
Examples:
  tlio st convert model.safetensors -o model-bf16.safetensors --dtype bf16
  tlio st convert model.safetensors -o half.safetensors --dtype fp16 --exclude 'norm'
  tlio st convert model.safetensors -o f8.safetensors --dtype fp8_e5m2 --only '^layers\\.'";

const DIFF_EXAMPLES: &str = "\
Examples:
  tlio st diff before.safetensors after.safetensors
  tlio --json st diff a.safetensors b.safetensors
  tlio -q st diff a.safetensors b.safetensors && echo identical";

/// Arguments of `st inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Safetensors files or sharded `*.index.json` indexes.
    #[arg(required = true, value_name = "MODEL")]
    pub files: Vec<PathBuf>,
    /// Also read the data: min, max, mean, std, NaN and inf counts per tensor.
    #[arg(long)]
    pub stats: bool,
}

/// Arguments of `st verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Safetensors files to check.
    #[arg(required = true, value_name = "MODEL")]
    pub files: Vec<PathBuf>,
    /// Also require the exact bytes of the canonical writer (order, compact JSON,
    /// padding).
    #[arg(long)]
    pub canonical: bool,
    /// Also require no NaN or infinity in float tensors.
    #[arg(long)]
    pub finite: bool,
}

/// Arguments of `st convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The safetensors file to convert.
    #[arg(value_name = "MODEL")]
    pub input: PathBuf,
    /// The file to write (never the input).
    #[arg(
        short,
        long,
        value_name = "FILE",
        required_unless_present = "legacy_output"
    )]
    pub output: Option<PathBuf>,
    /// The output as a second positional: the spelling before -o, kept for one release.
    #[arg(value_name = "OUTPUT", hide = true, conflicts_with = "output")]
    pub legacy_output: Option<PathBuf>,
    /// Target dtype; also accepted: bf16, bfloat16, fp16, float16, half, f32, float32,
    /// float, f64, float64, fp8_e4m3, float8_e4m3fn, fp8_e5m2, float8_e5m2 (any case).
    #[arg(long, value_enum, ignore_case = true)]
    pub dtype: FloatDtype,
    /// Convert only tensors whose name matches this regular expression.
    #[arg(long, value_name = "REGEX")]
    pub only: Option<String>,
    /// Do not convert tensors whose name matches this regular expression.
    #[arg(long, value_name = "REGEX")]
    pub exclude: Option<String>,
}

/// Arguments of `st diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The first file (A).
    #[arg(value_name = "MODEL")]
    pub a: PathBuf,
    /// The second file (B).
    #[arg(value_name = "MODEL")]
    pub b: PathBuf,
}

/// Run `tlio st`.
pub fn run(cmd: StCommand, printer: &Printer) -> anyhow::Result<Outcome> {
    match cmd {
        StCommand::Inspect(args) => inspect(&args, printer),
        StCommand::Verify(args) => run_verify(&args, printer),
        StCommand::Convert(args) => run_convert(&args, printer),
        StCommand::Diff(args) => run_diff(&args, printer),
    }
}

#[cfg(test)]
mod tests {
    use super::significant;

    #[test]
    fn significant_digits_for_people() {
        assert_eq!(significant(1e-8), "1e-8");
        assert_eq!(significant(2.5), "2.5");
        assert_eq!(significant(4.0), "4");
        assert_eq!(significant(1.118033988749895), "1.11803");
        assert_eq!(significant(-0.000123456789), "-0.000123457");
        assert_eq!(significant(123456.7), "123457");
        assert_eq!(significant(3.3895313892515355e38), "3.38953e38");
        assert_eq!(significant(0.0), "0");
        assert_eq!(significant(-65504.0), "-65504");
        assert_eq!(significant(f64::MAX), "1.79769e308");
    }
}

#[derive(Serialize)]
struct TensorRow {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    params: u64,
    bytes: u64,
    data_offsets: [u64; 2],
    #[serde(skip_serializing_if = "Option::is_none")]
    shard: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stats: Option<TensorStats>,
}

#[derive(Serialize)]
struct FileReport {
    path: String,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    header_len: Option<u64>,
    file_size: u64,
    metadata: BTreeMap<String, serde_json::Value>,
    tensors: Vec<TensorRow>,
    totals: Vec<Totals>,
    total: Totals,
}

fn is_index(path: &Path) -> bool {
    path.to_string_lossy().ends_with(".json")
}

fn rows(
    header: &Header,
    shard: Option<&str>,
    mapped: Option<&MappedFile>,
    bar: &indicatif::ProgressBar,
) -> Vec<TensorRow> {
    header
        .tensors
        .iter()
        .map(|t| {
            let stats = mapped
                .and_then(|m| m.info_bytes(t))
                .and_then(|bytes| tensor_stats(t, bytes));
            if mapped.is_some() {
                bar.inc(t.byte_len());
            }
            (t, stats)
        })
        .map(|(t, stats)| TensorRow {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            params: t.numel(),
            bytes: t.byte_len(),
            data_offsets: [t.data_offsets.0, t.data_offsets.1],
            shard: shard.map(str::to_string),
            stats,
        })
        .collect()
}

fn inspect_one(
    path: &Path,
    stats: bool,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<FileReport> {
    let context = || format!("cannot inspect {}", path.display());
    if is_index(path) {
        let index = read_index(path).with_context(context)?;
        let dir = path.parent().unwrap_or(Path::new(""));
        let mut tensors = Vec::new();
        let mut file_size = 0u64;
        for (shard, header) in &index.shards {
            let mapped = if stats {
                Some(MappedFile::open(&dir.join(shard)).with_context(context)?)
            } else {
                None
            };
            file_size = file_size.saturating_add(header.file_size);
            if stats {
                bar.inc_length(header.data_len());
            }
            tensors.extend(rows(header, Some(shard), mapped.as_ref(), bar));
        }
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        let infos: Vec<_> = index.shards.iter().flat_map(|(_, h)| &h.tensors).collect();
        let (by, total) = totals(infos);
        return Ok(FileReport {
            path: path.display().to_string(),
            kind: "index",
            header_len: None,
            file_size,
            metadata: index.metadata,
            tensors,
            totals: by,
            total,
        });
    }
    let (header, mapped) = if stats {
        let m = MappedFile::open(path).with_context(context)?;
        (m.header().clone(), Some(m))
    } else {
        (read_header(path).with_context(context)?, None)
    };
    if stats {
        bar.inc_length(header.data_len());
    }
    let (by, total) = totals(&header.tensors);
    Ok(FileReport {
        path: path.display().to_string(),
        kind: "file",
        header_len: Some(header.header_len),
        file_size: header.file_size,
        metadata: header
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect(),
        tensors: rows(&header, None, mapped.as_ref(), bar),
        totals: by,
        total,
    })
}

/// Dimensions a human-readable shape lists before it abbreviates (`--json` has all).
const MAX_SHAPE_DIMS_SHOWN: usize = 16;
/// Characters a table cell shows before it abbreviates: the table library measures
/// every cell at a cost that grows faster than its length, and a crafted header can
/// hold a name of 100 MB (`--json` carries every name exactly).
const MAX_CELL_CHARS: usize = 1024;

fn shape_text(shape: &[u64]) -> String {
    let shown = shape.len().min(MAX_SHAPE_DIMS_SHOWN);
    let dims: Vec<String> = shape.iter().take(shown).map(u64::to_string).collect();
    if shown < shape.len() {
        format!("[{}, … ({} dims)]", dims.join(", "), shape.len())
    } else {
        format!("[{}]", dims.join(", "))
    }
}

/// `text` for one table cell: whole when short, else its start and how much is cut.
fn cell(text: String) -> String {
    match text.char_indices().nth(MAX_CELL_CHARS) {
        None => text,
        Some((cut, _)) => {
            let rest = text.len().saturating_sub(cut);
            format!(
                "{}… ({rest} more bytes)",
                text.get(..cut).unwrap_or_default()
            )
        }
    }
}

fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), significant)
}

fn extreme(v: Option<Number>) -> String {
    match v {
        None => "-".to_string(),
        Some(Number::Int(i)) => i.to_string(),
        Some(Number::Float(x)) => significant(x),
    }
}

/// Six significant digits, without trailing zeros: plain notation between 1e-4 and
/// 1e6 (`2.5`, `0.000123`, `1.11803`), scientific outside (`1e-8`, `3.38953e38`), so a
/// tiny value never shows as 0.000000 and a huge one never as 39 digits. JSON keeps
/// the full f64.
fn significant(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let magnitude = x.abs();
    if (1e-4..1e6).contains(&magnitude) {
        // Digits after the point so that six significant digits show.
        let exponent = magnitude.log10().floor() as i32;
        let decimals = usize::try_from(5 - exponent).unwrap_or(0);
        let text = format!("{x:.decimals$}");
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text
        }
    } else {
        let text = format!("{x:.5e}");
        match text.split_once('e') {
            Some((mantissa, exp)) => {
                let mantissa = if mantissa.contains('.') {
                    mantissa.trim_end_matches('0').trim_end_matches('.')
                } else {
                    mantissa
                };
                format!("{mantissa}e{exp}")
            }
            None => text,
        }
    }
}

fn meta_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => escape(s),
        other => escape(&other.to_string()),
    }
}

fn inspect(args: &InspectArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    // Only --stats reads data; the header alone is instant.
    let new_bar = || {
        if args.stats {
            printer.bytes_bar(0, "stats")
        } else {
            indicatif::ProgressBar::hidden()
        }
    };
    if printer.json {
        let bar = new_bar();
        let mut files = Vec::new();
        for path in &args.files {
            files.push(inspect_one(path, args.stats, &bar)?);
        }
        bar.finish_and_clear();
        printer.json_line(&serde_json::json!({ "files": files }))?;
        return Ok(Outcome::Success);
    }
    let mut out = printer.out();
    for (i, path) in args.files.iter().enumerate() {
        let bar = new_bar();
        let report = inspect_one(path, args.stats, &bar)?;
        bar.finish_and_clear();
        if i > 0 {
            writeln!(out)?;
        }
        let header = match report.header_len {
            Some(n) => format!("header {}", human_bytes(n)),
            None => "sharded index".to_string(),
        };
        writeln!(
            out,
            "{}: {} tensors, {} parameters, {} ({header})",
            escape(&report.path),
            report.total.tensors,
            human_count(report.total.params),
            human_bytes(report.file_size)
        )?;
        let sharded = report.kind == "index";
        let mut table = printer.table();
        let mut head = vec!["name", "dtype", "shape", "params", "bytes", "offsets"];
        if sharded {
            head.push("shard");
        }
        if args.stats {
            head.extend(["min", "max", "mean", "std", "nan", "inf"]);
        }
        table.set_header(head);
        for r in &report.tensors {
            let mut row = vec![
                cell(escape(&r.name)),
                r.dtype.to_string(),
                shape_text(&r.shape),
                human_count(r.params),
                human_bytes(r.bytes),
                format!("[{}, {})", r.data_offsets[0], r.data_offsets[1]),
            ];
            if let Some(shard) = &r.shard {
                row.push(cell(escape(shard)));
            }
            if args.stats {
                match &r.stats {
                    Some(s) => row.extend([
                        extreme(s.min),
                        extreme(s.max),
                        num(s.mean),
                        num(s.std),
                        s.nan.to_string(),
                        s.inf.to_string(),
                    ]),
                    None => row.extend(std::iter::repeat_n("raw".to_string(), 6)),
                }
            }
            table.add_row(row);
        }
        if !report.tensors.is_empty() {
            writeln!(out, "{}", crate::output::table_text(&table))?;
        }
        if !report.metadata.is_empty() {
            writeln!(out, "metadata:")?;
            for (k, v) in &report.metadata {
                writeln!(out, "  {} = {}", escape(k), meta_text(v))?;
            }
        }
        let mut totals_table = printer.table();
        totals_table.set_header(vec!["dtype", "tensors", "params", "bytes"]);
        for t in report.totals.iter().chain(std::iter::once(&report.total)) {
            totals_table.add_row(vec![
                t.dtype.map_or("total".to_string(), |d| d.to_string()),
                t.tensors.to_string(),
                human_count(t.params),
                human_bytes(t.bytes),
            ]);
        }
        writeln!(out, "totals:")?;
        writeln!(out, "{}", crate::output::table_text(&totals_table))?;
    }
    out.flush()?;
    Ok(Outcome::Success)
}

#[derive(Serialize)]
struct VerifyReport {
    path: String,
    ok: bool,
    failures: Vec<Finding>,
}

fn run_verify(args: &VerifyArgs, printer: &Printer) -> anyhow::Result<Outcome> {
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
        let failures = verify_with_progress(path, opts, &mut progress)
            .with_context(|| format!("cannot verify {}", path.display()));
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

fn compile(re: &Option<String>, flag: &str) -> anyhow::Result<Option<regex::Regex>> {
    re.as_deref()
        .map(|r| {
            regex::Regex::new(r)
                .map_err(|e| crate::error::operational(format!("bad --{flag} regex: {e}")))
        })
        .transpose()
}

fn run_convert(args: &ConvertArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    // clap guarantees one of the two spellings (required_unless_present/conflicts_with).
    let output = args
        .output
        .as_ref()
        .or(args.legacy_output.as_ref())
        .ok_or_else(|| crate::error::operational("an output file is required: -o FILE"))?;
    let dtype = Dtype::from(args.dtype);
    let only = compile(&args.only, "only")?;
    let exclude = compile(&args.exclude, "exclude")?;
    let select = |name: &str| {
        only.as_ref().is_none_or(|r| r.is_match(name))
            && !exclude.as_ref().is_some_and(|r| r.is_match(name))
    };
    let bar = printer.bytes_bar(0, "convert");
    let mut progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let report =
        convert(&args.input, output, dtype, &select, &mut progress).with_context(|| {
            format!(
                "cannot convert {} to {}",
                args.input.display(),
                output.display()
            )
        })?;
    bar.finish_and_clear();
    if printer.json {
        printer.json_line(&report)?;
    } else {
        printer.info(format!(
            "converted {} tensors to {dtype}, copied {}: {} -> {} bytes",
            report.converted, report.copied, report.bytes_in, report.bytes_out
        ));
    }
    Ok(Outcome::Success)
}

fn value_text(v: &Option<ValueDiff>) -> String {
    match v {
        None => "values not comparable".to_string(),
        Some(v) if v.differing == 0 => "values equal".to_string(),
        Some(v) => {
            let mut s = format!("{} of {} values differ", v.differing, v.count);
            if let Some(m) = v.max_abs_diff {
                s.push_str(&format!(", max abs diff {m:e}"));
            }
            if v.nan_mismatch > 0 {
                s.push_str(&format!(", {} NaN mismatches", v.nan_mismatch));
            }
            s
        }
    }
}

fn run_diff(args: &DiffArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let open =
        |p: &PathBuf| MappedFile::open(p).with_context(|| format!("cannot diff {}", p.display()));
    let (a, b) = (open(&args.a)?, open(&args.b)?);
    let report: DiffReport = diff(&a, &b);
    let identical = report.identical();
    if printer.json {
        printer.json_line(&serde_json::json!({
            "identical": identical,
            "only_in_a": report.only_in_a,
            "only_in_b": report.only_in_b,
            "changed": report.changed,
            "different": report.different,
            "equal": report.equal,
            "metadata": report.metadata,
        }))?;
        return Ok(Outcome::from_ok(identical));
    }
    let mut out = printer.out();
    for n in &report.only_in_a {
        writeln!(out, "only in A: {}", escape(n))?;
    }
    for n in &report.only_in_b {
        writeln!(out, "only in B: {}", escape(n))?;
    }
    for c in &report.changed {
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
        writeln!(out, "changed: {}: {}", escape(&c.name), what.join(", "))?;
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
        let show = |v: &Option<String>| {
            v.as_deref().map_or("(absent)".to_string(), |s| {
                escape(&crate::core::text::quote(s))
            })
        };
        writeln!(
            out,
            "metadata: {}: {} -> {}",
            escape(&m.key),
            show(&m.a),
            show(&m.b)
        )?;
    }
    if identical {
        writeln!(
            out,
            "identical: {} tensors bitwise equal",
            report.equal.len()
        )?;
    } else {
        writeln!(
            out,
            "different: {} only in A, {} only in B, {} changed, {} differ, {} equal, {} metadata",
            report.only_in_a.len(),
            report.only_in_b.len(),
            report.changed.len(),
            report.different.len(),
            report.equal.len(),
            report.metadata.len()
        )?;
    }
    out.flush()?;
    Ok(Outcome::from_ok(identical))
}
