//! `tlio st`: inspect, verify, convert, quantize, dequantize and diff safetensors files
//! and model directories. Each command is one call into `tlio_core` plus printing
//! (tables, JSON, progress); this file holds the clap structs, the dispatch and the
//! cell formats the commands share, one file per command does the rest.

mod diff;
mod inspect;
/// A model error under the command's `context`, which names every file in `files`:
/// each file is said once. A core error that only says it could not read one of those
/// files gives way to its cause (`cannot inspect x: No such file...`, not `cannot
/// inspect x: cannot read x: No such file...`); a refusal of one of them keeps only its
/// reason. Chosen by the error's type, never by its text.
pub(super) fn in_context(
    err: tlio_core::model::ModelError,
    context: String,
    files: &[&std::path::Path],
) -> anyhow::Error {
    use tlio_core::model::ModelError;
    use tlio_core::safetensors::SafetensorsError;
    use tlio_core::Failure;
    let named = |path: &std::path::Path| files.contains(&path);
    let kind = err.kind();
    let reason = match &err {
        ModelError::OutputExists { path } if named(path) => {
            Some("it already exists and is not an empty directory")
        }
        ModelError::SameAsInput { path } if named(path) => {
            Some("it is the input or lies inside the input model's directory")
        }
        _ => None,
    };
    if let Some(reason) = reason {
        return crate::error::Classified {
            message: format!("{context}: {reason}"),
            kind,
        }
        .into();
    }
    match err {
        ModelError::Io { path, source }
        | ModelError::Safetensors(SafetensorsError::Io { path, source })
            if named(&path) =>
        {
            anyhow::Error::new(source).context(context)
        }
        other => anyhow::Error::new(other).context(context),
    }
}

#[cfg(test)]
mod tests;
mod transform;
mod verify;

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::args::FloatDtype;
use super::Outcome;
use crate::output::Printer;
use diff::run_diff;
use inspect::inspect;
use tlio_core::model::int4::DEFAULT_GROUP;
use transform::{run_convert, run_dequantize, run_quantize};
use verify::run_verify;

/// The `st` subcommands.
#[derive(Debug, Subcommand)]
pub enum StCommand {
    /// Show tensors (name, dtype, shape, parameters, bytes, offsets), metadata and
    /// totals by dtype, from the headers alone; for an index or a model directory also
    /// the architecture summary and each tensor's shard. int4 pairs show as one tensor.
    #[command(after_help = INSPECT_EXAMPLES)]
    Inspect(InspectArgs),
    /// Check every reader rule, and for models the index, architecture and int4 rules;
    /// print one line per failure naming the file, the rule and the tensor or shard;
    /// exit 1 when any model fails.
    #[command(after_help = VERIFY_EXAMPLES)]
    Verify(VerifyArgs),
    /// Convert every float tensor to another float dtype, copying the rest: a file into
    /// a canonical file, an index or directory into a new directory (same sharding,
    /// index and config.json updated), written atomically.
    // clap would show the output as optional: it is required in one of two spellings.
    #[command(
        after_help = CONVERT_EXAMPLES,
        override_usage = "tlio st convert [OPTIONS] <MODEL> -o <OUT> --dtype <DTYPE>"
    )]
    Convert(ConvertArgs),
    /// Compare two models tensor by tensor, whatever their sharding: tensors only in
    /// one, dtype and shape changes, value differences, metadata; exit 0 when
    /// identical, 1 when they differ.
    ///
    /// A tensor "changed" when its dtype or shape is not the same in A and B (its values
    /// are still compared when the element counts agree); it "differs" when dtype and
    /// shape are the same and the values are not. In --json, `max_abs_diff` is a number,
    /// the string "inf" for an infinite difference, or null when no compared pair of
    /// numbers differs.
    #[command(after_help = DIFF_EXAMPLES)]
    Diff(DiffArgs),
    /// Quantize the selected float weights to int4-gG-sym pairs (`<name>.qweight` U8 +
    /// `<name>.scales` F16) or to MX block-scaled pairs (MXFP4, MXFP8), copying the rest:
    /// file in, file out; index or directory in, directory out.
    #[command(
        after_help = QUANTIZE_EXAMPLES,
        override_usage = "tlio st quantize [OPTIONS] <MODEL> -o <OUT> --int4|--mx <FORMAT>"
    )]
    Quantize(QuantizeArgs),
    /// Turn every int4 and MX pair (MXFP4, MXFP8) back into one tensor of the requested
    /// dtype, removing the `quant` metadata (and config.json's `quantization_config`):
    /// file in, file out; index or directory in, directory out.
    #[command(
        after_help = DEQUANTIZE_EXAMPLES,
        override_usage = "tlio st dequantize [OPTIONS] <MODEL> -o <OUT>"
    )]
    Dequantize(DequantizeArgs),
}

const INSPECT_EXAMPLES: &str = "\
Examples:
  tlio st inspect model.safetensors
  tlio st inspect path/to/model-dir
  tlio st inspect --stats model.safetensors
  tlio --json st inspect model.safetensors.index.json";

const VERIFY_EXAMPLES: &str = "\
Examples:
  tlio st verify model.safetensors
  tlio st verify path/to/model-dir
  tlio st verify --canonical --finite *.safetensors
  tlio --json st verify model.safetensors";

const CONVERT_EXAMPLES: &str = "\
Examples:
  tlio st convert model.safetensors -o model-bf16.safetensors --dtype bf16
  tlio st convert path/to/model-dir -o model-dir-bf16 --dtype bf16
  tlio st convert model.safetensors -o half.safetensors --dtype fp16 --exclude 'norm'
  tlio st convert model.safetensors -o f8.safetensors --dtype fp8_e4m3 --saturate";

const DIFF_EXAMPLES: &str = "\
Examples:
  tlio st diff before.safetensors after.safetensors
  tlio st diff path/to/model-dir model.safetensors
  tlio --json st diff a.safetensors b.safetensors
  tlio st diff a.safetensors b.safetensors > /dev/null && echo identical";

const QUANTIZE_EXAMPLES: &str = "\
Examples:
  tlio st quantize model.safetensors -o model-int4.safetensors --int4
  tlio st quantize path/to/model-dir -o model-dir-int4 --int4 --group 32
  tlio st quantize model.safetensors -o q.safetensors --int4 --exclude 'down_proj'
  tlio st quantize model.safetensors -o model-mxfp8.safetensors --mx fp8";

const DEQUANTIZE_EXAMPLES: &str = "\
Examples:
  tlio st dequantize model-int4.safetensors -o model-f32.safetensors
  tlio st dequantize model-dir-int4 -o model-dir-dequantized --dtype bf16
  tlio st dequantize model-mxfp8.safetensors -o model-from-mx.safetensors --dtype bf16";

/// Arguments of `st inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Models: safetensors files, sharded `*.index.json` indexes or model directories
    /// (local, or s3:// URLs).
    #[arg(required = true, value_name = "MODEL")]
    pub files: Vec<PathBuf>,
    /// Also read the data: per tensor min, max, mean and std of the finite values (NaN
    /// and inf are left out of all four) and how many NaN and inf values it holds.
    #[arg(long)]
    pub stats: bool,
}

/// Arguments of `st verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Models to check: files, indexes or model directories (local, or s3:// URLs).
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
    /// Input model: a file, an index or a model directory.
    #[arg(value_name = "MODEL")]
    pub input: PathBuf,
    /// Output: a file for a file, a new directory for an index or a directory (written
    /// atomically as a whole; an existing non-empty directory is refused).
    #[arg(
        short,
        long,
        value_name = "OUT",
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
    /// For F8_E4M3: clamp |x| > 448 (and infinities) to +-448 as torch does, instead
    /// of failing; NaN stays NaN.
    #[arg(long)]
    pub saturate: bool,
    /// Shards converted at once (default: the number of CPUs, at most 4).
    #[arg(long, value_name = "N", value_parser = jobs_parser())]
    pub jobs: Option<usize>,
}

/// Arguments of `st diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The first model (A): a file, an index or a model directory.
    #[arg(value_name = "MODEL")]
    pub a: PathBuf,
    /// The second model (B), compared tensor by tensor whatever the sharding.
    #[arg(value_name = "MODEL")]
    pub b: PathBuf,
}

/// Arguments of `st quantize`.
#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// Input model: a file, an index or a model directory.
    #[arg(value_name = "MODEL")]
    pub input: PathBuf,
    /// Output: a file for a file, a new directory otherwise (written atomically).
    #[arg(
        short,
        long,
        value_name = "OUT",
        required_unless_present = "legacy_output"
    )]
    pub output: Option<PathBuf>,
    /// The output as a second positional (the spelling of the spec), also accepted.
    #[arg(value_name = "OUTPUT", hide = true, conflicts_with = "output")]
    pub legacy_output: Option<PathBuf>,
    /// Quantize to int4-gG-sym pairs (one of --int4 and --mx is required, so the
    /// command says what it does).
    #[arg(long, required_unless_present = "mx", conflicts_with = "mx")]
    pub int4: bool,
    /// Quantize to MX block-scaled pairs (OCP Microscaling v1.0, one E8M0 scale per 32
    /// values): fp4 writes gpt-oss's MXFP4 layout (`NAME_blocks` + `NAME_scales`), fp8
    /// MXFP8 (`NAME.weight` F8_E4M3 + `NAME.weight_scale` F8_E8M0).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub mx: Option<MxArg>,
    /// Group size G: an even number that divides each selected weight's columns
    /// (int4 only).
    #[arg(long, value_name = "G", default_value_t = DEFAULT_GROUP, conflicts_with = "mx",
          value_parser = clap::value_parser!(u64).range(MIN_GROUP..))]
    pub group: u64,
    /// Quantize only float tensors whose name matches this regular expression (default:
    /// names ending in `_proj.weight`, and for --mx fp4 also gpt-oss experts' `_proj`).
    /// int4 takes 2-D tensors, MX tensors of rank 2 or more.
    #[arg(long, value_name = "REGEX")]
    pub only: Option<String>,
    /// Do not quantize tensors whose name matches this regular expression.
    #[arg(long, value_name = "REGEX")]
    pub exclude: Option<String>,
    /// Shards processed at once (default: the number of CPUs, at most 4).
    #[arg(long, value_name = "N", value_parser = jobs_parser())]
    pub jobs: Option<usize>,
}

/// Arguments of `st dequantize`.
#[derive(Debug, Args)]
pub struct DequantizeArgs {
    /// Input model with int4 or MX pairs: a file, an index or a model directory.
    #[arg(value_name = "MODEL")]
    pub input: PathBuf,
    /// Output: a file for a file, a new directory otherwise (written atomically).
    #[arg(
        short,
        long,
        value_name = "OUT",
        required_unless_present = "legacy_output"
    )]
    pub output: Option<PathBuf>,
    /// The output as a second positional (the spelling of the spec), also accepted.
    #[arg(value_name = "OUTPUT", hide = true, conflicts_with = "output")]
    pub legacy_output: Option<PathBuf>,
    /// Dtype of the dequantized weights (aliases as for convert's --dtype).
    #[arg(long, value_enum, ignore_case = true, default_value = "F32")]
    pub dtype: FloatDtype,
    /// Shards processed at once (default: the number of CPUs, at most 4).
    #[arg(long, value_name = "N", value_parser = jobs_parser())]
    pub jobs: Option<usize>,
}

/// The default selection of `st quantize`: the linear projections.
const DEFAULT_QUANTIZE: &str = "_proj\\.weight$";
/// The default selection of `st quantize --mx fp4`: the linear projections and the
/// gpt-oss experts (`...experts.gate_up_proj`, `...experts.down_proj`, rank 3).
const DEFAULT_QUANTIZE_FP4: &str = "_proj(\\.weight)?$";

/// The MX element format of `st quantize --mx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MxArg {
    /// MXFP4: E2M1 elements, two a byte.
    Fp4,
    /// MXFP8: E4M3 elements.
    Fp8,
}
/// `--jobs` is at least one worker, checked when parsing.
fn jobs_parser() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..)
}
/// The smallest `--group` (an even number), checked when parsing; divisibility and
/// evenness are checked against each weight by the core.
const MIN_GROUP: u64 = 2;
/// Default shard workers when `--jobs` is not given (the CPUs, capped).
const DEFAULT_JOBS_CAP: usize = 4;

fn jobs(j: Option<usize>) -> usize {
    j.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(DEFAULT_JOBS_CAP)
    })
    .max(1)
}

/// Run `tlio st`.
pub fn run(cmd: StCommand, printer: &Printer) -> anyhow::Result<Outcome> {
    match cmd {
        StCommand::Inspect(args) => inspect(&args, printer),
        StCommand::Verify(args) => run_verify(&args, printer),
        StCommand::Convert(args) => run_convert(&args, printer),
        StCommand::Diff(args) => run_diff(&args, printer),
        StCommand::Quantize(args) => run_quantize(&args, printer),
        StCommand::Dequantize(args) => run_dequantize(&args, printer),
    }
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
