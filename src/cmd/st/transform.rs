//! `st convert`, `st quantize` and `st dequantize`: pick the tensors, run one whole-model
//! transformation with a progress bar and report what it wrote.
//!
//! Invariant: the selection regexes are compiled before the model is opened, so a bad
//! `--only` or `--exclude` fails before any work; the report is the core's, printed as
//! JSON with `--json`, else as one line on stderr.

use std::path::{Path, PathBuf};

use super::super::Outcome;
use super::{
    jobs, ConvertArgs, DequantizeArgs, MxArg, QuantizeArgs, DEFAULT_QUANTIZE, DEFAULT_QUANTIZE_FP4,
};
use crate::output::Printer;
use tlio_core::model::mx::MxFormat;
use tlio_core::model::transform::{self, Op, Report as TransformReport};
use tlio_core::model::{Kind, Model};
use tlio_core::safetensors::Dtype;
use tlio_core::text::escape;

fn compile(re: &Option<String>, flag: &str) -> anyhow::Result<Option<regex::Regex>> {
    re.as_deref()
        .map(|r| {
            regex::Regex::new(r)
                .map_err(|e| crate::error::operational(format!("bad --{flag} regex: {e}")))
        })
        .transpose()
}

fn selector(
    only: &Option<String>,
    exclude: &Option<String>,
) -> anyhow::Result<impl Fn(&str) -> bool + Sync> {
    let only = compile(only, "only")?;
    let exclude = compile(exclude, "exclude")?;
    Ok(move |name: &str| {
        only.as_ref().is_none_or(|r| r.is_match(name))
            && !exclude.as_ref().is_some_and(|r| r.is_match(name))
    })
}

/// Open the model and run one transformation with a progress bar.
fn transform_model(
    input: &Path,
    output: &Path,
    op: &Op<'_>,
    jobs: usize,
    printer: &Printer,
    verb: &str,
) -> anyhow::Result<(Model, TransformReport)> {
    let context = || format!("cannot {verb} {} to {}", input.display(), output.display());
    let files = [input, output];
    let model = Model::open(input).map_err(|e| super::in_context(e, context(), &files))?;
    let bar = printer.bytes_bar(0, verb);
    let progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let report = transform::run(&model, output, op, jobs, &progress)
        .map_err(|e| super::in_context(e, context(), &files))?;
    bar.finish_and_clear();
    Ok((model, report))
}

/// The output path, given as -o/--output or as the second positional.
fn output_of<'a>(
    output: &'a Option<PathBuf>,
    legacy: &'a Option<PathBuf>,
) -> anyhow::Result<&'a Path> {
    // clap guarantees one of the two spellings (required_unless_present/conflicts_with).
    output
        .as_deref()
        .or(legacy.as_deref())
        .ok_or_else(|| crate::error::operational("an output is required: -o OUT"))
}

pub(super) fn run_convert(args: &ConvertArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let output = output_of(&args.output, &args.legacy_output)?;
    let dtype = Dtype::from(args.dtype);
    let select = selector(&args.only, &args.exclude)?;
    let op = Op::Convert {
        target: dtype,
        saturate: args.saturate,
        select: &select,
    };
    let (model, report) = transform_model(
        &args.input,
        output,
        &op,
        jobs(args.jobs),
        printer,
        "convert",
    )?;
    if printer.json {
        if model.kind == Kind::File {
            printer.json_line(&serde_json::json!({
                "converted": report.transformed,
                "copied": report.copied,
                "bytes_in": report.bytes_in,
                "bytes_out": report.bytes_out,
            }))?;
        } else {
            printer.json_line(&report)?;
        }
    } else {
        printer.info(format!(
            "converted {} tensors to {dtype}, copied {}: {} -> {} bytes{}",
            report.transformed,
            report.copied,
            report.bytes_in,
            report.bytes_out,
            dir_text(&report, output)
        ));
    }
    Ok(Outcome::Success)
}

fn dir_text(report: &TransformReport, output: &Path) -> String {
    if !report.directory {
        return String::new();
    }
    let mut s = format!(
        " in {} shard{}, directory {}",
        report.shards,
        if report.shards == 1 { "" } else { "s" },
        escape(&output.display().to_string())
    );
    if !report.files_copied.is_empty() {
        let names: Vec<String> = report.files_copied.iter().map(|n| escape(n)).collect();
        s.push_str(&format!(" (also copied {})", names.join(", ")));
    }
    s
}

pub(super) fn run_quantize(args: &QuantizeArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let output = output_of(&args.output, &args.legacy_output)?;
    let default = match args.mx {
        Some(MxArg::Fp4) => DEFAULT_QUANTIZE_FP4,
        _ => DEFAULT_QUANTIZE,
    };
    let only = Some(args.only.clone().unwrap_or_else(|| default.to_string()));
    let select = selector(&only, &args.exclude)?;
    let (op, scheme) = match args.mx {
        Some(mx) => {
            let fmt = match mx {
                MxArg::Fp4 => MxFormat::Fp4,
                MxArg::Fp8 => MxFormat::Fp8,
            };
            let op = Op::MxQuantize {
                fmt,
                select: &select,
            };
            (op, fmt.quant_name().to_string())
        }
        None => {
            let op = Op::Quantize {
                group: args.group,
                select: &select,
            };
            (op, format!("int4-g{}-sym", args.group))
        }
    };
    let (_, report) = transform_model(
        &args.input,
        output,
        &op,
        jobs(args.jobs),
        printer,
        "quantize",
    )?;
    print_transform(
        printer,
        &report,
        format!(
            "quantized {} tensors to {scheme}, copied {}: {} -> {} bytes{}",
            report.transformed,
            report.copied,
            report.bytes_in,
            report.bytes_out,
            dir_text(&report, output)
        ),
    )
}

/// A transformation's report: the report itself with `--json`, else `line` on stderr.
fn print_transform(
    printer: &Printer,
    report: &TransformReport,
    line: String,
) -> anyhow::Result<Outcome> {
    if printer.json {
        printer.json_line(report)?;
    } else {
        printer.info(line);
    }
    Ok(Outcome::Success)
}

pub(super) fn run_dequantize(args: &DequantizeArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let output = output_of(&args.output, &args.legacy_output)?;
    let dtype = Dtype::from(args.dtype);
    let op = Op::Dequantize { target: dtype };
    let (_, report) = transform_model(
        &args.input,
        output,
        &op,
        jobs(args.jobs),
        printer,
        "dequantize",
    )?;
    print_transform(
        printer,
        &report,
        format!(
            "dequantized {} tensors to {dtype}, copied {}: {} -> {} bytes{}",
            report.transformed,
            report.copied,
            report.bytes_in,
            report.bytes_out,
            dir_text(&report, output)
        ),
    )
}
