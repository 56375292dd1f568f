//! `st inspect`: a model's headline, architecture, tensor table (with `--stats` the
//! values' statistics) and metadata, or the same as one JSON document.
//!
//! Invariants: rows are made from the listing one at a time, for the table and JSON
//! alike, so a header of a million tensors is never held twice; the JSON keeps the
//! bytes a sorted `serde_json::Value` gave (see [`JsonDoc`]).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::super::Outcome;
use super::{cell, shape_text, InspectArgs};
use crate::output::{human_bytes, human_count, significant, PlainTable, Printer};
use tlio_core::model::arch::{summary, Summary};
use tlio_core::model::view::{Listing, ModelView, Row};
use tlio_core::model::{Kind, Model};
use tlio_core::safetensors::header::{totals, Totals};
use tlio_core::safetensors::stats::{Number, TensorStats};
use tlio_core::text::escape;

/// One model opened for `st inspect`: the model, the statistics of its logical tensors
/// (with `--stats`, in the order of `Model::logical`) and its listing order. Rows are
/// made from it one at a time, for the table and for JSON alike.
pub(super) struct Inspected {
    path: String,
    pub(super) model: Model,
    stats: Option<Vec<Option<TensorStats>>>,
}

pub(super) fn inspect_one(
    path: &Path,
    stats: bool,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Inspected> {
    let context = || format!("cannot inspect {}", path.display());
    if let Some(url) = crate::cmd::s3_url(path)? {
        // An object in storage: its header by range requests; with --stats, the
        // object downloaded once and mapped.
        if stats {
            let view = tlio_core::remote::map_model(&url).with_context(context)?;
            bar.inc_length(view.model.shards.iter().map(|s| s.header.data_len()).sum());
            let values = view.stats(&mut |n| bar.inc(n));
            return Ok(Inspected {
                path: url.to_string(),
                model: view.model,
                stats: Some(values),
            });
        }
        let model = tlio_core::remote::open_model(&url).with_context(context)?;
        return Ok(Inspected {
            path: url.to_string(),
            model,
            stats: None,
        });
    }
    let files = [path];
    let model = Model::open(path).map_err(|e| super::in_context(e, context(), &files))?;
    let (model, stats) = if stats {
        let view = ModelView::map(model).map_err(|e| super::in_context(e, context(), &files))?;
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
    pub(super) fn stats_of(&self, row: &Row<'_>) -> Option<Option<TensorStats>> {
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
pub(super) struct JsonDoc<'a> {
    pub(super) files: Vec<JsonFile<'a>>,
}

#[derive(Serialize)]
pub(super) struct JsonFile<'a> {
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

pub(super) fn json_file(file: &Inspected) -> anyhow::Result<JsonFile<'_>> {
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
            "model parameters {} (an int4 pair counts as the weight it encodes), tensor data {} in {} shard{}, dtypes: {}, quantization: {}, config dtype: {}",
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

fn meta_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => escape(s),
        other => escape(&other.to_string()),
    }
}

/// True when `path` is a sharded checkpoint step (a directory holding shards.json), or
/// a step on object storage (`s3://.../step-N`, whose manifest says whether it is one).
fn is_sharded_step(path: &Path) -> bool {
    if tlio_core::remote::location::is_remote(path) {
        return tlio_core::checkpoint::sharded::open::dir_step(path).is_some();
    }
    path.join(tlio_core::checkpoint::sharded::SHARDS_NAME)
        .is_file()
}

/// `st inspect STEP_DIR` of a sharded step: its global tensors, from the chunk table.
fn inspect_step(path: &Path, printer: &Printer) -> anyhow::Result<()> {
    let (step, tensors) = tlio_core::remote::location::global_tensors(path)
        .map_err(|e| anyhow::Error::new(e).context(format!("cannot inspect {}", path.display())))?;
    if printer.json {
        #[derive(serde::Serialize)]
        struct T<'a> {
            group: &'static str,
            name: &'a str,
            dtype: &'static str,
            shape: &'a [u64],
            chunks: usize,
            bytes: u64,
        }
        #[derive(serde::Serialize)]
        struct Doc<'a> {
            step_dir: String,
            step: u64,
            tensors: Vec<T<'a>>,
        }
        printer.json_line(&Doc {
            step_dir: path.display().to_string(),
            step,
            tensors: tensors
                .iter()
                .map(|t| T {
                    group: t.group.name(),
                    name: &t.name,
                    dtype: t.dtype.name(),
                    shape: &t.shape,
                    chunks: t.chunks,
                    bytes: t.bytes,
                })
                .collect(),
        })?;
        return Ok(());
    }
    let total = tensors.iter().fold(0u64, |a, t| a.saturating_add(t.bytes));
    let mut out = io::BufWriter::new(printer.out());
    writeln!(
        out,
        "{}: sharded checkpoint step {step}, {} global tensors, {total} bytes",
        path.display(),
        tensors.len()
    )?;
    for t in &tensors {
        writeln!(
            out,
            "  {:<9} {:<40} {:<5} {:<20} {} chunks",
            t.group.name(),
            tlio_core::text::escape(&t.name),
            t.dtype.name(),
            format!("{:?}", t.shape),
            t.chunks
        )?;
    }
    out.flush()?;
    Ok(())
}

pub(super) fn inspect(args: &InspectArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let steps = args.files.iter().filter(|p| is_sharded_step(p)).count();
    if steps > 0 {
        if steps != args.files.len() {
            anyhow::bail!("inspect sharded checkpoint steps and models in separate calls");
        }
        for path in &args.files {
            inspect_step(path, printer)?;
        }
        return Ok(Outcome::Success);
    }
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
        "{}: {} stored tensors, {} stored values, {} on disk ({header})",
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
pub(super) fn print_tensor_table(
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
pub(super) fn tensor_cells(
    r: &Row<'_>,
    sharded: bool,
    stats: Option<Option<TensorStats>>,
) -> Vec<String> {
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
