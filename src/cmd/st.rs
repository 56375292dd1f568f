//! `tlio st`: inspect, verify, convert and diff safetensors files. Each command is one
//! call into `core::safetensors` plus printing (tables, JSON, progress).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde::Serialize;

use super::args::FloatDtype;
use super::Outcome;
use crate::output::{human_bytes, human_count, PlainTable, Printer, Tone};
use tlio_core::model::arch::{summary, Summary};
use tlio_core::model::int4::DEFAULT_GROUP;
use tlio_core::model::transform::{self, Op, Report as TransformReport};
use tlio_core::model::view::{diff_views, verify_model, Listing, ModelView, Row};
use tlio_core::model::{Kind, Model, ModelError};
use tlio_core::safetensors::diff::{Changed, DiffReport, Different, MetaChange, ValueDiff};
use tlio_core::safetensors::header::{totals, Totals};
use tlio_core::safetensors::stats::{Number, TensorStats};
use tlio_core::safetensors::verify::{Finding, VerifyOptions};
use tlio_core::safetensors::{Dtype, SafetensorsError};
use tlio_core::text::escape;
use tlio_core::Failure;

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
    #[command(after_help = DIFF_EXAMPLES)]
    Diff(DiffArgs),
    /// Quantize the selected 2-D float weights to int4-gG-sym pairs (`<name>.qweight`
    /// U8 + `<name>.scales` F16), copying the rest: file in, file out; index or
    /// directory in, directory out.
    #[command(
        after_help = QUANTIZE_EXAMPLES,
        override_usage = "tlio st quantize [OPTIONS] <MODEL> -o <OUT> --int4"
    )]
    Quantize(QuantizeArgs),
    /// Turn every int4 pair back into one tensor of the requested dtype, removing the
    /// `quant` metadata: file in, file out; index or directory in, directory out.
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
  tlio -q st diff a.safetensors b.safetensors && echo identical";

const QUANTIZE_EXAMPLES: &str = "\
Examples:
  tlio st quantize model.safetensors -o model-int4.safetensors --int4
  tlio st quantize path/to/model-dir -o model-dir-int4 --int4 --group 64
  tlio st quantize model.safetensors -o q.safetensors --int4 --exclude 'down_proj'";

const DEQUANTIZE_EXAMPLES: &str = "\
Examples:
  tlio st dequantize model-int4.safetensors -o model.safetensors
  tlio st dequantize model-dir-int4 -o model-dir-bf16 --dtype bf16";

/// Arguments of `st inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Models: safetensors files, sharded `*.index.json` indexes or model directories.
    #[arg(required = true, value_name = "MODEL")]
    pub files: Vec<PathBuf>,
    /// Also read the data: min, max, mean, std, NaN and inf counts per tensor.
    #[arg(long)]
    pub stats: bool,
}

/// Arguments of `st verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Models to check: files, indexes or model directories.
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
    #[arg(long, value_name = "N")]
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
    /// Quantize to int4-gG-sym (the only scheme; required so the command says what it
    /// does).
    #[arg(long, required = true)]
    pub int4: bool,
    /// Group size G: an even number that divides each selected weight's columns.
    #[arg(long, value_name = "G", default_value_t = DEFAULT_GROUP)]
    pub group: u64,
    /// Quantize only 2-D float tensors whose name matches this regular expression
    /// (default: names ending in `_proj.weight`).
    #[arg(long, value_name = "REGEX")]
    pub only: Option<String>,
    /// Do not quantize tensors whose name matches this regular expression.
    #[arg(long, value_name = "REGEX")]
    pub exclude: Option<String>,
    /// Shards processed at once (default: the number of CPUs, at most 4).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
}

/// Arguments of `st dequantize`.
#[derive(Debug, Args)]
pub struct DequantizeArgs {
    /// Input model with int4 pairs: a file, an index or a model directory.
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
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
}

/// The default selection of `st quantize`: the linear projections.
const DEFAULT_QUANTIZE: &str = "_proj\\.weight$";
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

#[cfg(test)]
mod tests {
    use super::significant;

    /// A small file with a name needing JSON escapes, a non-ASCII name, metadata and a
    /// zero-size tensor; written by the canonical writer into `dir`.
    fn sample(dir: &std::path::Path, name: &str, scale: f32) -> std::path::PathBuf {
        use tlio_core::safetensors::{save, Dtype, Tensor, TensorData};
        let path = dir.join(name);
        let w = [1.0f32, -2.5, scale, 4.0];
        let tensors = [
            Tensor {
                name: "w\"q\u{1b}".to_string(),
                dtype: Dtype::F32,
                shape: vec![2, 2],
                data: TensorData::F32(&w),
            },
            Tensor {
                name: "café".to_string(),
                dtype: Dtype::BF16,
                shape: vec![0, 3],
                data: TensorData::F32(&[]),
            },
        ];
        let meta = [("format".to_string(), "pt".to_string())].into();
        save(&path, &tensors, &meta).unwrap();
        path
    }

    /// The streamed documents must have the bytes a `serde_json::Value` (sorted keys)
    /// of the same document has: that is how they were printed before streaming.
    fn assert_sorted_like_a_value<T: serde::Serialize>(doc: &T) {
        let streamed = serde_json::to_string(doc).unwrap();
        let value = serde_json::to_value(doc).unwrap();
        assert_eq!(streamed, serde_json::to_string(&value).unwrap());
    }

    #[test]
    fn streamed_inspect_json_is_the_sorted_document() {
        let dir = tempfile::tempdir().unwrap();
        let path = sample(dir.path(), "a.safetensors", 3.0);
        let bar = indicatif::ProgressBar::hidden();
        for stats in [false, true] {
            let file = super::inspect_one(&path, stats, &bar).unwrap();
            let doc = super::JsonDoc {
                files: vec![super::json_file(&file).unwrap()],
            };
            assert_sorted_like_a_value(&doc);
        }
    }

    #[test]
    fn streamed_diff_json_is_the_sorted_document() {
        use tlio_core::model::view::{diff_views, ModelView};
        let dir = tempfile::tempdir().unwrap();
        let a = ModelView::open(&sample(dir.path(), "a.safetensors", 3.0)).unwrap();
        let b = ModelView::open(&sample(dir.path(), "b.safetensors", 5.0)).unwrap();
        let report = diff_views(&a, &b);
        assert_eq!(report.different.len(), 1);
        assert_eq!(report.equal.len(), 1);
        assert_sorted_like_a_value(&super::DiffJson {
            changed: &report.changed,
            different: &report.different,
            equal: &report.equal,
            identical: report.identical(),
            metadata: &report.metadata,
            only_in_a: &report.only_in_a,
            only_in_b: &report.only_in_b,
        });
    }

    #[test]
    fn the_streamed_table_is_the_piped_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = sample(dir.path(), "a.safetensors", 3.0);
        let bar = indicatif::ProgressBar::hidden();
        let file = super::inspect_one(&path, true, &bar).unwrap();
        let listing = super::Listing::new(&file.model);
        let printer = crate::output::Printer::with_writers(
            false,
            false,
            false,
            std::io::sink(),
            std::io::sink(),
        );
        let mut streamed = Vec::new();
        super::print_tensor_table(&file, &listing, true, &printer, &mut streamed).unwrap();
        // What comfy-table made of the same rows before the table was streamed.
        let mut table = printer.table();
        table.set_header(vec![
            "name", "dtype", "shape", "params", "bytes", "offsets", "min", "max", "mean", "std",
            "nan", "inf",
        ]);
        for r in listing.rows() {
            table.add_row(super::tensor_cells(&r, false, file.stats_of(&r)));
        }
        let expected = format!("{}\n", crate::output::table_text(&table));
        assert_eq!(String::from_utf8(streamed).unwrap(), expected);
        // File order (the writer puts the zero-size tensor last), names escaped.
        let lines: Vec<&str> = expected.lines().collect();
        assert!(lines[1].starts_with(" w\"q\\u{1b}  F32"), "{expected}");
        assert!(lines[2].starts_with(" café       BF16"), "{expected}");
    }

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

/// One model opened for `st inspect`: the model, the statistics of its logical tensors
/// (with `--stats`, in the order of `Model::logical`) and its listing order. Rows are
/// made from it one at a time, for the table and for JSON alike.
struct Inspected {
    path: String,
    model: Model,
    stats: Option<Vec<Option<TensorStats>>>,
}

/// A model error under the command's `context`, which names every file in `files`:
/// each file is said once. A core error that only says it could not read one of those
/// files gives way to its cause (`cannot inspect x: No such file...`, not `cannot
/// inspect x: cannot read x: No such file...`); a refusal of one of them keeps only its
/// reason. Chosen by the error's type, never by its text.
fn in_context(err: ModelError, context: String, files: &[&Path]) -> anyhow::Error {
    let named = |path: &Path| files.contains(&path);
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

fn inspect_one(
    path: &Path,
    stats: bool,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Inspected> {
    let context = || format!("cannot inspect {}", path.display());
    let files = [path];
    let model = Model::open(path).map_err(|e| in_context(e, context(), &files))?;
    let (model, stats) = if stats {
        let view = ModelView::map(model).map_err(|e| in_context(e, context(), &files))?;
        bar.inc_length(view.model.shards.iter().map(|s| s.header.data_len()).sum());
        let values = view.stats(&mut |n| bar.inc(n));
        (view.model, Some(values))
    } else {
        (model, None)
    };
    Ok(Inspected {
        path: path.display().to_string(),
        model,
        stats,
    })
}

impl Inspected {
    fn kind(&self) -> &'static str {
        match self.model.kind {
            Kind::File => "file",
            Kind::Index => "index",
            Kind::Directory => "directory",
        }
    }

    fn sharded(&self) -> bool {
        self.model.kind != Kind::File
    }

    fn header_len(&self) -> Option<u64> {
        (self.model.kind == Kind::File)
            .then(|| self.model.shards.first().map(|s| s.header.header_len))
            .flatten()
    }

    fn architecture(&self) -> Option<Summary> {
        self.sharded().then(|| summary(&self.model))
    }

    /// Totals by dtype and overall, of the physical tensors.
    fn totals(&self) -> (Vec<Totals>, Totals) {
        totals(self.model.entries.iter().map(|e| &e.info))
    }

    /// The statistics of a row, when `--stats` was asked (inner None: not decodable).
    fn stats_of(&self, row: &Row<'_>) -> Option<Option<TensorStats>> {
        self.stats
            .as_ref()
            .map(|all| all.get(row.logical).copied().flatten())
    }
}

/// `--json st inspect`'s document. Its keys are declared in the byte order of their
/// names: the document used to be built as a `serde_json::Value`, whose objects sort
/// their keys, and streaming it must not change a byte. Small nested values (the
/// architecture, totals, statistics) still go through a `Value` for the same reason.
#[derive(Serialize)]
struct JsonDoc<'a> {
    files: Vec<JsonFile<'a>>,
}

#[derive(Serialize)]
struct JsonFile<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    architecture: Option<serde_json::Value>,
    file_size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    header_len: Option<u64>,
    kind: &'static str,
    metadata: BTreeMap<String, serde_json::Value>,
    path: &'a str,
    tensors: JsonRows<'a>,
    total: serde_json::Value,
    totals: serde_json::Value,
}

/// The tensors of one file, serialized a row at a time from its listing.
struct JsonRows<'a> {
    file: &'a Inspected,
    listing: Listing<'a>,
}

impl Serialize for JsonRows<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let stats = |r: &Row<'_>| -> Result<Option<serde_json::Value>, S::Error> {
            match self.file.stats_of(r).flatten() {
                None => Ok(None),
                Some(st) => serde_json::to_value(st)
                    .map(Some)
                    .map_err(serde::ser::Error::custom),
            }
        };
        let mut seq = s.serialize_seq(Some(self.listing.len()))?;
        for r in self.listing.rows() {
            serde::ser::SerializeSeq::serialize_element(
                &mut seq,
                &JsonRow {
                    bytes: r.bytes,
                    data_offsets: [r.data_offsets.0, r.data_offsets.1],
                    stats: stats(&r)?,
                    dtype: r.dtype,
                    name: r.name,
                    params: r.params,
                    shape: r.shape,
                    shard: r.shard,
                },
            )?;
        }
        serde::ser::SerializeSeq::end(seq)
    }
}

#[derive(Serialize)]
struct JsonRow<'a> {
    bytes: u64,
    data_offsets: [u64; 2],
    dtype: String,
    name: &'a str,
    params: u64,
    shape: &'a [u64],
    #[serde(skip_serializing_if = "Option::is_none")]
    shard: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stats: Option<serde_json::Value>,
}

fn json_file(file: &Inspected) -> anyhow::Result<JsonFile<'_>> {
    let listing = Listing::new(&file.model);
    let (by, total) = file.totals();
    Ok(JsonFile {
        architecture: file.architecture().map(serde_json::to_value).transpose()?,
        file_size: listing.file_size(),
        header_len: file.header_len(),
        kind: file.kind(),
        metadata: listing.metadata(),
        path: &file.path,
        tensors: JsonRows { file, listing },
        total: serde_json::to_value(total)?,
        totals: serde_json::to_value(by)?,
    })
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |x| x.to_string())
}

fn summary_lines(a: &Summary) -> Vec<String> {
    let mix: Vec<String> = a
        .dtypes
        .iter()
        .map(|(d, b)| format!("{} {}", escape(d), human_bytes(*b)))
        .collect();
    vec![
        format!(
            "architecture: {}, {} layers, hidden {}, {} heads, {} kv heads, intermediate {}, vocab {}, tied embeddings {}",
            escape(&a.arch),
            opt(a.layers),
            opt(a.hidden),
            opt(a.heads),
            opt(a.kv_heads),
            opt(a.intermediate),
            opt(a.vocab),
            opt(a.tied_embeddings.map(|t| if t { "yes" } else { "no" }))
        ),
        format!(
            "parameters {}, {} in {} shard{}, dtypes: {}, quantization: {}, config dtype: {}",
            human_count(a.params),
            human_bytes(a.bytes),
            a.shards,
            if a.shards == 1 { "" } else { "s" },
            mix.join(", "),
            a.quantization.as_deref().map_or("none".to_string(), escape),
            a.torch_dtype.as_deref().map_or("-".to_string(), escape),
        ),
    ]
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
        // Every model is opened before anything is written: a file that cannot be read
        // leaves no half document behind.
        let bar = new_bar();
        let mut opened = Vec::new();
        for path in &args.files {
            opened.push(inspect_one(path, args.stats, &bar)?);
        }
        bar.finish_and_clear();
        let files = opened
            .iter()
            .map(json_file)
            .collect::<anyhow::Result<_>>()?;
        printer.json_line(&JsonDoc { files })?;
        return Ok(Outcome::Success);
    }
    for (i, path) in args.files.iter().enumerate() {
        let bar = new_bar();
        let file = inspect_one(path, args.stats, &bar)?;
        bar.finish_and_clear();
        let mut out = io::BufWriter::new(printer.out());
        if i > 0 {
            writeln!(out)?;
        }
        print_inspected(&file, args.stats, printer, &mut out)?;
        out.flush()?;
    }
    Ok(Outcome::Success)
}

/// The first line of a model's report: counts, size and what it is.
fn headline(file: &Inspected, total: &Totals, file_size: u64) -> String {
    let shards = file.model.shards.len();
    let header = match (file.header_len(), file.model.kind) {
        (Some(n), _) => format!("header {}", human_bytes(n)),
        (None, Kind::Directory) => format!(
            "model directory, {shards} safetensors file{}",
            if shards == 1 { "" } else { "s" }
        ),
        (None, _) => format!(
            "sharded index, {shards} shard{}",
            if shards == 1 { "" } else { "s" }
        ),
    };
    format!(
        "{}: {} tensors, {} parameters, {} ({header})",
        escape(&file.path),
        total.tensors,
        human_count(total.params),
        human_bytes(file_size)
    )
}

/// One model's human report: headline, architecture, tensors, metadata, totals.
fn print_inspected(
    file: &Inspected,
    stats: bool,
    printer: &Printer,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let listing = Listing::new(&file.model);
    let (by, total) = file.totals();
    writeln!(out, "{}", headline(file, &total, listing.file_size()))?;
    if let Some(a) = file.architecture() {
        for line in summary_lines(&a) {
            writeln!(out, "{line}")?;
        }
    }
    if !listing.is_empty() {
        print_tensor_table(file, &listing, stats, printer, out)?;
    }
    let metadata = listing.metadata();
    if !metadata.is_empty() {
        writeln!(out, "metadata:")?;
        for (k, v) in &metadata {
            writeln!(out, "  {} = {}", escape(k), meta_text(v))?;
        }
    }
    let mut totals_table = printer.table();
    totals_table.set_header(vec!["dtype", "tensors", "params", "bytes"]);
    for t in by.iter().chain(std::iter::once(&total)) {
        totals_table.add_row(vec![
            t.dtype.map_or("total".to_string(), |d| d.to_string()),
            t.tensors.to_string(),
            human_count(t.params),
            human_bytes(t.bytes),
        ]);
    }
    writeln!(out, "totals:")?;
    writeln!(out, "{}", crate::output::table_text(&totals_table))?;
    Ok(())
}

/// Rows up to which a terminal gets the box-drawn table fitted to its width; a longer
/// listing is written in the streamed plain form (the box-drawn table holds every
/// cell of every row, many times the header's size for a million tensors).
const MAX_BOXED_ROWS: usize = 10_000;

/// The tensor table: box-drawn on a terminal for up to [`MAX_BOXED_ROWS`] rows, else
/// the plain form, measured in one pass and written a row at a time in a second (the
/// bytes a piped comfy-table gave, without holding any row).
fn print_tensor_table(
    file: &Inspected,
    listing: &Listing<'_>,
    stats: bool,
    printer: &Printer,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut head = vec!["name", "dtype", "shape", "params", "bytes", "offsets"];
    if file.sharded() {
        head.push("shard");
    }
    if stats {
        head.extend(["min", "max", "mean", "std", "nan", "inf"]);
    }
    let cells = |r: &Row<'_>| tensor_cells(r, file.sharded(), file.stats_of(r));
    if printer.stdout_is_terminal() && listing.len() <= MAX_BOXED_ROWS {
        let mut table = printer.table();
        table.set_header(head);
        for r in listing.rows() {
            table.add_row(cells(&r));
        }
        writeln!(out, "{}", crate::output::table_text(&table))?;
        return Ok(());
    }
    let mut table = PlainTable::new(&head);
    for r in listing.rows() {
        table.measure(&cells(&r));
    }
    table.write_header(out, &head)?;
    for r in listing.rows() {
        table.write_row(out, &cells(&r))?;
    }
    Ok(())
}

/// The cells of one tensor row (`stats`: Some with `--stats`).
fn tensor_cells(r: &Row<'_>, sharded: bool, stats: Option<Option<TensorStats>>) -> Vec<String> {
    let mut row = vec![
        cell(escape(r.name)),
        escape(&r.dtype),
        shape_text(r.shape),
        human_count(r.params),
        human_bytes(r.bytes),
        format!("[{}, {})", r.data_offsets.0, r.data_offsets.1),
    ];
    if sharded {
        row.push(r.shard.map_or("-".to_string(), |s| cell(escape(s))));
    }
    match stats {
        None => {}
        Some(Some(s)) => row.extend([
            extreme(s.min),
            extreme(s.max),
            num(s.mean),
            num(s.std),
            s.nan.to_string(),
            s.inf.to_string(),
        ]),
        Some(None) => row.extend(std::iter::repeat_n("raw".to_string(), 6)),
    }
    row
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
        let failures = verify_model(path, opts, &mut progress)
            .map_err(|e| in_context(e, format!("cannot verify {}", path.display()), &[path]));
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
    let model = Model::open(input).map_err(|e| in_context(e, context(), &files))?;
    let bar = printer.bytes_bar(0, verb);
    let progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let report = transform::run(&model, output, op, jobs, &progress)
        .map_err(|e| in_context(e, context(), &files))?;
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

fn run_convert(args: &ConvertArgs, printer: &Printer) -> anyhow::Result<Outcome> {
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

fn run_quantize(args: &QuantizeArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let output = output_of(&args.output, &args.legacy_output)?;
    let only = Some(
        args.only
            .clone()
            .unwrap_or_else(|| DEFAULT_QUANTIZE.to_string()),
    );
    let select = selector(&only, &args.exclude)?;
    let op = Op::Quantize {
        group: args.group,
        select: &select,
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
            "quantized {} tensors to int4-g{}-sym, copied {}: {} -> {} bytes{}",
            report.transformed,
            args.group,
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

fn run_dequantize(args: &DequantizeArgs, printer: &Printer) -> anyhow::Result<Outcome> {
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

/// `--json st diff`'s document, keys in the byte order of their names (see
/// [`JsonDoc`]); the report's own types declare their fields in that order too.
#[derive(Serialize)]
struct DiffJson<'r> {
    changed: &'r [Changed<'r>],
    different: &'r [Different<'r>],
    equal: &'r [Cow<'r, str>],
    identical: bool,
    metadata: &'r [MetaChange<'r>],
    only_in_a: &'r [Cow<'r, str>],
    only_in_b: &'r [Cow<'r, str>],
}

fn run_diff(args: &DiffArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let open = |p: &PathBuf| {
        ModelView::open(p)
            .map_err(|e| in_context(e, format!("cannot diff {}", p.display()), &[p.as_path()]))
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
            "different: {} only in A, {} only in B, {} changed, {} differ, {} equal, {} metadata",
            report.only_in_a.len(),
            report.only_in_b.len(),
            report.changed.len(),
            report.different.len(),
            report.equal.len(),
            report.metadata.len()
        )
    }
}
