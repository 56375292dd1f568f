//! Whole-model transformations: `convert` (re-encode floats), `quantize` (int4-gG-sym)
//! and `dequantize`, for a file (file out, atomic) or an index or directory (directory
//! out, atomic as a whole via [`OutDir`]): same sharding, index rewritten with the true
//! `total_size`, `config.json`'s dtype updated by convert, other files copied.
//!
//! Invariants: memory is bounded by fixed chunks per worker whatever the tensor sizes
//! (inputs are read with positioned reads, never mapped, so their pages are not this
//! process's); output bytes depend only on the input and the options (shards may be
//! processed in parallel, each into its own file); nothing appears under the output
//! name unless everything succeeded.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use serde_json::Value;

use super::int4::{
    dequantize_row, parse_quant, quant_name, quantize_row, row_scales, QuantFailure, QUANT_KEY,
    QWEIGHT_SUFFIX, SCALES_SUFFIX,
};
use super::outdir::OutDir;
use super::{torch_name, Entry, Kind, Model, ModelError, Storage, CONFIG_NAME, INDEX_NAME};
use crate::atomic::{same_file, AtomicFile};
use crate::safetensors::convert::{convert_saturating, is_convert_target};
use crate::safetensors::float::{decode_f32, encode_f32, EncodeError, EncodeFailure};
use crate::safetensors::write::{canonical_header, Layout, TensorSpec};
use crate::safetensors::{Dtype, SafetensorsError, TensorInfo};

/// Elements handled per step and worker (a multiple of every group size up to
/// [`MAX_GROUP`]): a few MiB of buffers.
pub const CHUNK_ELEMS: usize = 1 << 20;
/// Largest group size accepted (a group is quantized in one piece).
pub const MAX_GROUP: u64 = 1 << 20;
/// Most worker threads used for shards.
pub const MAX_JOBS: usize = 16;

/// What to do to each shard.
pub enum Op<'a> {
    /// Re-encode the selected float tensors to `target`.
    Convert {
        /// Target dtype.
        target: Dtype,
        /// Clamp out-of-range F8_E4M3 values instead of failing.
        saturate: bool,
        /// Which tensors.
        select: &'a (dyn Fn(&str) -> bool + Sync),
    },
    /// Quantize the selected 2-D float tensors to int4 pairs with group `group`.
    Quantize {
        /// Group size G.
        group: u64,
        /// Which tensors.
        select: &'a (dyn Fn(&str) -> bool + Sync),
    },
    /// Turn every int4 pair back into one tensor of dtype `target`.
    Dequantize {
        /// Target dtype.
        target: Dtype,
    },
}

/// What a transformation did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// Tensors transformed (converted, quantized or dequantized).
    pub transformed: u64,
    /// Tensors copied unchanged.
    pub copied: u64,
    /// Safetensors files written.
    pub shards: usize,
    /// Other files copied (tokenizer, generation config, ...), by name.
    pub files_copied: Vec<String>,
    /// Bytes of tensor data read.
    pub bytes_in: u64,
    /// Bytes of the safetensors files written.
    pub bytes_out: u64,
    /// Whether the output is a directory.
    pub directory: bool,
}

struct ShardResult {
    transformed: u64,
    copied: u64,
    file_size: u64,
    data_len: u64,
    params: u64,
    names: Vec<String>,
}

/// Run `op` on `model`, writing `output`. `jobs` workers process shards in parallel;
/// `progress(done, total)` receives source data bytes.
pub fn run(
    model: &Model,
    output: &Path,
    op: &Op<'_>,
    jobs: usize,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Report, ModelError> {
    check_op(model, op)?;
    let total: u64 = model.shards.iter().map(|s| s.header.data_len()).sum();
    let size_in = model
        .shards
        .iter()
        .fold(0u64, |acc, s| acc.saturating_add(s.header.file_size));
    let done = AtomicU64::new(0);
    let shared = Shared {
        done: &done,
        total,
        progress,
    };
    if model.kind == Kind::File {
        return run_file(model, output, op, &shared, size_in);
    }
    let out = OutDir::create(output, model.dir.as_deref())?;
    let results = parallel_shards(model, &out, op, jobs, &shared)?;
    let mut report = Report {
        shards: results.len(),
        bytes_in: size_in,
        directory: true,
        ..Report::default()
    };
    let totals = tally(model, &results, &mut report);
    write_index(model, &out, &totals)?;
    write_config(model, &out, op)?;
    report.files_copied = copy_other_files(model, &out)?;
    // Every file is in the temporary directory, nothing is under the final name yet:
    // the instant an interruption must leave no trace (tests pause here).
    fail::fail_point!("model/before-commit");
    out.commit()?;
    Ok(report)
}

/// A single-file model: one shard written atomically straight to `output`.
fn run_file(
    model: &Model,
    output: &Path,
    op: &Op<'_>,
    shared: &Shared<'_>,
    size_in: u64,
) -> Result<Report, ModelError> {
    let shard = model.shards.first().ok_or_else(|| ModelError::Usage {
        detail: "the model has no safetensors file".to_string(),
    })?;
    if same_file(&shard.path, output) {
        return Err(ModelError::SameAsInput {
            path: output.to_path_buf(),
        });
    }
    let r = shard_to(model, 0, output, op, shared, true)?;
    Ok(Report {
        transformed: r.transformed,
        copied: r.copied,
        shards: 1,
        files_copied: Vec::new(),
        bytes_in: size_in,
        bytes_out: r.file_size,
        directory: false,
    })
}

/// What the rewritten index records over all shards.
struct Totals {
    /// Tensor name to the shard file holding it.
    weight_map: BTreeMap<String, Value>,
    /// Tensor data bytes.
    size: u64,
    /// Parameters.
    params: u64,
}

/// Add every shard's counts to `report` and gather the index's totals.
fn tally(model: &Model, results: &[ShardResult], report: &mut Report) -> Totals {
    let mut totals = Totals {
        weight_map: BTreeMap::new(),
        size: 0,
        params: 0,
    };
    for (shard, r) in model.shards.iter().zip(results) {
        report.transformed += r.transformed;
        report.copied += r.copied;
        report.bytes_out = report.bytes_out.saturating_add(r.file_size);
        totals.size = totals.size.saturating_add(r.data_len);
        totals.params = totals.params.saturating_add(r.params);
        for n in &r.names {
            totals
                .weight_map
                .insert(n.clone(), Value::String(shard.name.clone()));
        }
    }
    totals
}

/// Rewrite the index (if the model has one) with the true `total_size`, and
/// `total_parameters` where the source had it.
fn write_index(model: &Model, out: &OutDir, totals: &Totals) -> Result<(), ModelError> {
    let Some(index_path) = &model.index_path else {
        return Ok(());
    };
    let mut metadata: serde_json::Map<String, Value> = model
        .index_metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.insert("total_size".to_string(), Value::from(totals.size));
    if metadata.contains_key("total_parameters") {
        metadata.insert("total_parameters".to_string(), Value::from(totals.params));
    }
    let index = serde_json::json!({ "metadata": metadata, "weight_map": totals.weight_map });
    let name = index_path
        .file_name()
        .map_or_else(|| INDEX_NAME.to_string(), |n| n.to_string_lossy().into());
    out.write_file(&name, &pretty(&index)?)
}

/// `config.json`: its dtype updated by convert, copied as it is otherwise.
fn write_config(model: &Model, out: &OutDir, op: &Op<'_>) -> Result<(), ModelError> {
    let Some(dir) = &model.dir else {
        return Ok(());
    };
    let config_path = dir.join(CONFIG_NAME);
    if let Some(config) = &model.config {
        match op {
            Op::Convert { target, .. } => {
                let mut c = config.clone();
                if let Some(name) = torch_name(*target) {
                    c.insert("torch_dtype".to_string(), Value::from(name));
                    if c.contains_key("dtype") {
                        c.insert("dtype".to_string(), Value::from(name));
                    }
                }
                out.write_file(CONFIG_NAME, &pretty(&Value::Object(c))?)?;
            }
            _ => out.copy_file(CONFIG_NAME, &config_path)?,
        }
    } else if config_path.is_file() {
        out.copy_file(CONFIG_NAME, &config_path)?;
    }
    Ok(())
}

/// Copy a model directory's other files (see [`other_files`]); returns their names.
fn copy_other_files(model: &Model, out: &OutDir) -> Result<Vec<String>, ModelError> {
    let mut copied = Vec::new();
    let Some(dir) = &model.dir else {
        return Ok(copied);
    };
    if model.kind == Kind::Directory {
        for name in other_files(model)? {
            out.copy_file(&name, &dir.join(&name))?;
            copied.push(name);
        }
    }
    Ok(copied)
}

/// JSON as transformers writes its index and config: two-space indent, sorted keys,
/// a final newline.
fn pretty(v: &Value) -> Result<Vec<u8>, ModelError> {
    let mut s = serde_json::to_vec_pretty(v).map_err(|e| ModelError::Usage {
        detail: format!("cannot serialise JSON: {e}"),
    })?;
    s.push(b'\n');
    Ok(s)
}

/// The byte counter all shard workers add to and its consumer.
struct Shared<'a> {
    /// Source data bytes done so far, over every worker.
    done: &'a AtomicU64,
    /// Source data bytes in all.
    total: u64,
    /// Receives (done, total).
    progress: &'a (dyn Fn(u64, u64) + Sync),
}

/// The regular files of a model directory that are not the model's own (index,
/// shards, config): tokenizer, generation config and the like, in name order.
fn other_files(model: &Model) -> Result<Vec<String>, ModelError> {
    let Some(dir) = &model.dir else {
        return Ok(Vec::new());
    };
    let io = |source| ModelError::Io {
        path: dir.clone(),
        source,
    };
    let mut own: Vec<&str> = model.shards.iter().map(|s| s.name.as_str()).collect();
    own.extend([INDEX_NAME, CONFIG_NAME]);
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        // Symlinked files (the Hugging Face cache) are copied as files.
        let is_file = std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file());
        if is_file && !own.contains(&name.as_str()) && !name.starts_with(".tlio-") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

fn check_op(model: &Model, op: &Op<'_>) -> Result<(), ModelError> {
    match op {
        Op::Convert { target, .. } | Op::Dequantize { target } => {
            if !is_convert_target(*target) {
                return Err(ModelError::Safetensors(SafetensorsError::BadTarget {
                    dtype: *target,
                }));
            }
        }
        Op::Quantize { group, .. } => {
            if *group < 2 || group % 2 != 0 || *group > MAX_GROUP {
                return Err(ModelError::BadGroup { group: *group });
            }
            if let Some(q) = &model.quant {
                if parse_quant(q) != Some(*group) {
                    return Err(ModelError::Usage {
                        detail: format!(
                            "the model is already quantized as {q}; quantizing more tensors with group {group} would mix group sizes"
                        ),
                    });
                }
            }
        }
    }
    Ok(())
}

fn parallel_shards(
    model: &Model,
    out: &OutDir,
    op: &Op<'_>,
    jobs: usize,
    shared: &Shared<'_>,
) -> Result<Vec<ShardResult>, ModelError> {
    let n = model.shards.len();
    let jobs = jobs.clamp(1, MAX_JOBS).min(n.max(1));
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let slots: Mutex<Vec<Option<Result<ShardResult, ModelError>>>> =
        Mutex::new((0..n).map(|_| None).collect());
    let work = || loop {
        if failed.load(Ordering::Relaxed) {
            return;
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(shard) = model.shards.get(i) else {
            return;
        };
        let target = out.path().join(&shard.name);
        let r = shard_to(model, i, &target, op, shared, false);
        if r.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        if let Ok(mut s) = slots.lock() {
            if let Some(slot) = s.get_mut(i) {
                *slot = Some(r);
            }
        }
    };
    if jobs == 1 {
        work();
    } else {
        std::thread::scope(|scope| {
            for _ in 0..jobs {
                scope.spawn(work);
            }
        });
    }
    // A worker that panicked poisons the lock: its shard has no result, reported below.
    let slots = slots
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut results = Vec::with_capacity(n);
    let mut first_err = None;
    for (shard, slot) in model.shards.iter().zip(slots) {
        match slot {
            Some(Ok(r)) => results.push(r),
            Some(Err(e)) => {
                first_err.get_or_insert(with_shard(e, &shard.name, model));
            }
            None => {}
        }
    }
    match first_err {
        Some(e) => Err(e),
        None if results.len() == n => Ok(results),
        None => Err(ModelError::Usage {
            detail: "a shard worker stopped without a result".to_string(),
        }),
    }
}

fn with_shard(e: ModelError, shard: &str, model: &Model) -> ModelError {
    match e {
        ModelError::Safetensors(source) if model.shards.len() > 1 => ModelError::Shard {
            shard: shard.to_string(),
            source,
        },
        other => other,
    }
}

/// One output tensor and how its bytes are produced.
enum Plan {
    /// Copy entry `i`'s bytes.
    Copy(usize),
    /// The scales of quantizing a source tensor.
    Scales(Quant),
    /// The packed values of quantizing a source tensor.
    Qweight(Quant),
    /// Dequantize the pair (qweight entry, scales entry, group) to the tensor's dtype
    /// (the target).
    Dequant(usize, usize, u64),
}

/// A source tensor to quantize, with what planning checked: a 2-D F32, F16 or BF16
/// tensor whose columns are a multiple of the group.
#[derive(Clone, Copy)]
struct Quant {
    /// Its entry.
    entry: usize,
    /// Group size G.
    group: u64,
    /// Columns (the second dimension).
    cols: u64,
    /// Bytes per source element.
    size: usize,
}

struct OutTensor {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    plan: Plan,
}

/// A safetensors failure of the shard being written (named by the caller).
fn shard_err(source: SafetensorsError) -> ModelError {
    ModelError::Safetensors(source)
}

fn shard_to(
    model: &Model,
    si: usize,
    target: &Path,
    op: &Op<'_>,
    shared: &Shared<'_>,
    atomic: bool,
) -> Result<ShardResult, ModelError> {
    let Some(shard) = model.shards.get(si) else {
        return Err(ModelError::Usage {
            detail: format!("no shard {si}"),
        });
    };
    if let Op::Convert {
        target: to,
        saturate,
        select,
    } = op
    {
        let how = ConvertShard {
            to: *to,
            saturate: *saturate,
            select: *select,
        };
        return convert_shard(model, &shard.path, target, &how, shared);
    }
    let (tensors, metadata) = plan_shard(model, si, op)?;
    let specs: Vec<TensorSpec<'_>> = tensors
        .iter()
        .map(|t| TensorSpec::new(&t.name, t.dtype, &t.shape))
        .collect();
    let layout = canonical_header(&specs, &metadata).map_err(shard_err)?;
    let result = planned_result(&tensors, &layout);
    let mut files = Files::new(model);
    let Shared {
        done,
        total,
        progress,
    } = *shared;
    let mut tick = |n: u64| {
        let now = done.fetch_add(n, Ordering::Relaxed) + n;
        progress(now, total);
    };
    let mut body = |out: &mut dyn Write| -> Result<(), ModelError> {
        for &i in &layout.order {
            if let Some(t) = tensors.get(i) {
                produce(model, &mut files, t, out, &mut tick)?;
            }
        }
        Ok(())
    };
    if atomic {
        write_atomic(target, &layout.header, &mut body)?;
    } else {
        write_plain(target, &layout.header, &mut body)?;
    }
    Ok(result)
}

/// Convert's options for one shard.
struct ConvertShard<'a> {
    to: Dtype,
    saturate: bool,
    select: &'a (dyn Fn(&str) -> bool + Sync),
}

/// Convert one shard with the safetensors converter, leaving int4 pairs alone.
fn convert_shard(
    model: &Model,
    source: &Path,
    target: &Path,
    how: &ConvertShard<'_>,
    shared: &Shared<'_>,
) -> Result<ShardResult, ModelError> {
    let Shared {
        done,
        total,
        progress,
    } = *shared;
    // The halves of an int4 pair keep their layout: convert never touches them.
    let members: std::collections::HashSet<&str> = model
        .logical
        .iter()
        .filter_map(|l| match l.storage {
            Storage::Int4 {
                qweight, scales, ..
            } => Some([qweight, scales]),
            Storage::Plain(_) => None,
        })
        .flatten()
        .filter_map(|i| model.entry(i).map(|e| e.info.name.as_str()))
        .collect();
    let pick = |name: &str| !members.contains(name) && (how.select)(name);
    let mut last = 0u64;
    let mut prog = |d: u64, _t: u64| {
        let now = done.fetch_add(d.saturating_sub(last), Ordering::Relaxed) + d - last;
        last = d;
        progress(now, total);
    };
    let r = convert_saturating(source, target, how.to, how.saturate, &pick, &mut prog)
        .map_err(shard_err)?;
    let header = crate::safetensors::read_header(target).map_err(shard_err)?;
    Ok(ShardResult {
        transformed: r.converted,
        copied: r.copied,
        file_size: r.bytes_out,
        data_len: header.data_len(),
        params: header.tensors().iter().map(|t| t.numel()).sum(),
        names: header.tensors().iter().map(|t| t.name.clone()).collect(),
    })
}

/// The counts of a planned shard, known before any byte is written.
fn planned_result(tensors: &[OutTensor], layout: &Layout) -> ShardResult {
    ShardResult {
        transformed: tensors
            .iter()
            .filter(|t| matches!(t.plan, Plan::Qweight(_) | Plan::Dequant(..)))
            .count() as u64,
        copied: tensors
            .iter()
            .filter(|t| matches!(t.plan, Plan::Copy(_)))
            .count() as u64,
        file_size: layout.file_size(),
        data_len: layout.data_len,
        params: tensors
            .iter()
            .map(|t| crate::safetensors::dtype::numel(&t.shape).unwrap_or(0))
            .sum(),
        names: tensors.iter().map(|t| t.name.clone()).collect(),
    }
}

/// Write `header` then `body` to `target` atomically (a single-file output).
fn write_atomic(
    target: &Path,
    header: &[u8],
    body: &mut dyn FnMut(&mut dyn Write) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let werr = |source| ModelError::Write {
        path: target.to_path_buf(),
        source,
    };
    let mut out = AtomicFile::create(target).map_err(|e| shard_err(e.into()))?;
    out.write_all(header).map_err(werr)?;
    body(&mut out)?;
    out.commit().map_err(|e| shard_err(e.into()))
}

/// Write `header` then `body` to `target` and sync it (a shard inside an [`OutDir`],
/// which makes the whole directory atomic).
fn write_plain(
    target: &Path,
    header: &[u8],
    body: &mut dyn FnMut(&mut dyn Write) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let werr = |source| ModelError::Write {
        path: target.to_path_buf(),
        source,
    };
    let file = File::create(target).map_err(werr)?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    out.write_all(header).map_err(werr)?;
    body(&mut out)?;
    let file = out.into_inner().map_err(|e| werr(e.into_error()))?;
    file.sync_all().map_err(werr)
}

/// The output tensors of shard `si` and its metadata.
fn plan_shard(
    model: &Model,
    si: usize,
    op: &Op<'_>,
) -> Result<(Vec<OutTensor>, BTreeMap<String, String>), ModelError> {
    let mut metadata = model
        .shards
        .get(si)
        .map(|s| s.header.metadata.clone())
        .unwrap_or_default();
    let out = match op {
        Op::Convert { .. } => Vec::new(),
        Op::Quantize { group, select } => {
            let out = plan_quantize(model, si, *group, *select)?;
            metadata.insert(QUANT_KEY.to_string(), quant_name(*group));
            out
        }
        Op::Dequantize { target } => {
            metadata.remove(QUANT_KEY);
            plan_dequantize(model, si, *target)
        }
    };
    Ok((out, metadata))
}

/// Quantize: each selected 2-D float tensor of shard `si` becomes a scales and a
/// qweight tensor, every other one is copied.
fn plan_quantize(
    model: &Model,
    si: usize,
    group: u64,
    select: &(dyn Fn(&str) -> bool + Sync),
) -> Result<Vec<OutTensor>, ModelError> {
    let mut out = Vec::new();
    for (i, e) in model.entries.iter().enumerate() {
        if e.shard != si {
            continue;
        }
        let t = &e.info;
        let pick = t.shape.len() == 2 && t.dtype.is_float() && select(&t.name);
        if pick {
            out.extend(quant_pair(i, t, group)?);
        } else {
            out.push(OutTensor {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                plan: Plan::Copy(i),
            });
        }
    }
    Ok(out)
}

/// The scales and qweight tensors of quantizing entry `i` (`t`, a selected 2-D float
/// tensor), after checking it can be.
fn quant_pair(i: usize, t: &TensorInfo, group: u64) -> Result<Vec<OutTensor>, ModelError> {
    let cannot = |detail: String| ModelError::CannotQuantize {
        tensor: t.name.clone(),
        detail,
    };
    let size = match t.dtype {
        Dtype::F32 => 4,
        Dtype::F16 | Dtype::BF16 => 2,
        _ => {
            return Err(cannot(format!(
                "{} weights cannot be quantized (F32, F16 and BF16 are read exactly; F64 would be rounded twice)",
                t.dtype
            )))
        }
    };
    let (rows, cols) = match t.shape.as_slice() {
        &[r, c] => (r, c),
        _ => return Ok(Vec::new()),
    };
    if cols % group != 0 {
        return Err(cannot(format!(
            "{cols} columns are not a multiple of the group size {group}"
        )));
    }
    let q = Quant {
        entry: i,
        group,
        cols,
        size,
    };
    Ok(vec![
        OutTensor {
            name: format!("{}{SCALES_SUFFIX}", t.name),
            dtype: Dtype::F16,
            shape: vec![rows, cols / group],
            plan: Plan::Scales(q),
        },
        OutTensor {
            name: format!("{}{QWEIGHT_SUFFIX}", t.name),
            dtype: Dtype::U8,
            shape: vec![rows, cols / 2],
            plan: Plan::Qweight(q),
        },
    ])
}

/// Dequantize: each int4 pair whose qweight is in shard `si` becomes one tensor of
/// `target`; every entry of the shard that is not half of a pair is copied.
fn plan_dequantize(model: &Model, si: usize, target: Dtype) -> Vec<OutTensor> {
    let here = |i: usize| model.entry(i).is_some_and(|e| e.shard == si);
    let mut out = Vec::new();
    let mut paired = vec![false; model.entries.len()];
    for l in &model.logical {
        if let Storage::Int4 {
            qweight,
            scales,
            group,
        } = l.storage
        {
            for k in [qweight, scales] {
                if let Some(p) = paired.get_mut(k) {
                    *p = true;
                }
            }
            if here(qweight) {
                out.push(OutTensor {
                    name: l.name.clone(),
                    dtype: target,
                    shape: l.shape.clone(),
                    plan: Plan::Dequant(qweight, scales, group),
                });
            }
        }
    }
    for (i, e) in model.entries.iter().enumerate() {
        if e.shard == si && !paired.get(i).copied().unwrap_or(false) {
            out.push(OutTensor {
                name: e.info.name.clone(),
                dtype: e.info.dtype,
                shape: e.info.shape.clone(),
                plan: Plan::Copy(i),
            });
        }
    }
    out
}

/// Open shard files, one handle each, on first use.
struct Files<'a> {
    model: &'a Model,
    open: Vec<Option<File>>,
}

impl<'a> Files<'a> {
    fn new(model: &'a Model) -> Self {
        Files {
            model,
            open: (0..model.shards.len()).map(|_| None).collect(),
        }
    }

    /// Read `buf.len()` bytes of entry `i`'s data starting `offset` bytes into it.
    fn read(&mut self, i: usize, offset: u64, buf: &mut [u8]) -> Result<(), ModelError> {
        let e = self.model.entry(i).ok_or_else(|| ModelError::Usage {
            detail: format!("no tensor entry {i}"),
        })?;
        let shard = self
            .model
            .shards
            .get(e.shard)
            .ok_or_else(|| ModelError::Usage {
                detail: format!("no shard {}", e.shard),
            })?;
        let io = |source| ModelError::Io {
            path: shard.path.clone(),
            source,
        };
        let slot = self
            .open
            .get_mut(e.shard)
            .ok_or_else(|| ModelError::Usage {
                detail: format!("no shard {}", e.shard),
            })?;
        if slot.is_none() {
            *slot = Some(File::open(&shard.path).map_err(io)?);
        }
        let start = shard
            .header
            .data_start()
            .checked_add(e.info.data_offsets.0)
            .and_then(|s| s.checked_add(offset))
            .ok_or_else(|| ModelError::Usage {
                detail: "offset overflow".to_string(),
            })?;
        match slot {
            Some(f) => f.read_exact_at(buf, start).map_err(io),
            None => Ok(()),
        }
    }
}

/// Where one output tensor's bytes go: its name (for write errors), the writer and
/// the progress counter.
struct Sink<'s> {
    name: &'s str,
    out: &'s mut dyn Write,
    tick: &'s mut dyn FnMut(u64),
}

impl Sink<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), ModelError> {
        self.out
            .write_all(bytes)
            .map_err(|source| ModelError::Write {
                path: PathBuf::from(self.name),
                source,
            })
    }
}

fn entry(model: &Model, i: usize) -> Result<&Entry, ModelError> {
    model.entry(i).ok_or_else(|| ModelError::Usage {
        detail: format!("no tensor entry {i}"),
    })
}

/// Write the bytes of output tensor `t`.
fn produce(
    model: &Model,
    files: &mut Files<'_>,
    t: &OutTensor,
    out: &mut dyn Write,
    tick: &mut dyn FnMut(u64),
) -> Result<(), ModelError> {
    let mut sink = Sink {
        name: &t.name,
        out,
        tick,
    };
    match t.plan {
        Plan::Copy(i) => copy_entry(model, files, i, &mut sink),
        Plan::Scales(q) => quantize_entry(model, files, q, true, &mut sink),
        Plan::Qweight(q) => quantize_entry(model, files, q, false, &mut sink),
        // The planned dtype of a dequantized tensor is the target.
        Plan::Dequant(q, s, group) => dequantize_pair(files, t, (q, s, group), t.dtype, &mut sink),
    }
}

/// Copy entry `i`'s bytes in chunks.
fn copy_entry(
    model: &Model,
    files: &mut Files<'_>,
    i: usize,
    sink: &mut Sink<'_>,
) -> Result<(), ModelError> {
    let len = entry(model, i)?.info.byte_len();
    let mut buf = vec![0u8; CHUNK_ELEMS.min(usize::try_from(len).unwrap_or(CHUNK_ELEMS))];
    let mut at = 0u64;
    // Whole buffers, then the rest: every chunk fits the buffer.
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        let Some(chunk) = buf.get_mut(..n) else {
            return Err(ModelError::Usage {
                detail: format!("a chunk of {n} bytes is larger than the copy buffer"),
            });
        };
        files.read(i, at, chunk)?;
        sink.write(chunk)?;
        at += n as u64;
        (sink.tick)(n as u64);
    }
    Ok(())
}

/// Write the scales (`is_scales`) or the packed values of quantizing `q`, whole
/// groups at a time.
fn quantize_entry(
    model: &Model,
    files: &mut Files<'_>,
    q: Quant,
    is_scales: bool,
    sink: &mut Sink<'_>,
) -> Result<(), ModelError> {
    let info = &entry(model, q.entry)?.info;
    let g = q.group as usize;
    let size = q.size;
    let numel = info.numel();
    let step = (CHUNK_ELEMS / g).max(1) * g;
    let (mut raw, mut vals) = (Vec::new(), Vec::new());
    let (mut scales, mut packed, mut bytes) = (Vec::new(), Vec::new(), Vec::new());
    let mut at = 0u64;
    while at < numel {
        let n = (numel - at).min(step as u64) as usize;
        raw.resize(n * size, 0);
        files.read(q.entry, at * size as u64, &mut raw)?;
        vals.clear();
        decode_f32(info.dtype, &raw, &mut vals);
        scales.clear();
        packed.clear();
        // The scales pass needs no values: only the qweight pass packs them.
        let done = if is_scales {
            row_scales(&vals, g, &mut scales)
        } else {
            quantize_row(&vals, g, &mut scales, &mut packed)
        };
        done.map_err(|(col, f)| quant_error(&info.name, q, at + col as u64, f))?;
        if is_scales {
            bytes.clear();
            for s in &scales {
                bytes.extend_from_slice(&s.to_le_bytes());
            }
            sink.write(&bytes)?;
        } else {
            sink.write(&packed)?;
        }
        at += n as u64;
        // Each source tensor is read twice (scales, then values): count half.
        (sink.tick)((n * size / 2) as u64);
    }
    Ok(())
}

/// The error for a weight of `tensor` (flat index `flat`) that cannot be quantized.
fn quant_error(tensor: &str, q: Quant, flat: u64, f: QuantFailure) -> ModelError {
    let (row, col) = (flat / q.cols.max(1), flat % q.cols.max(1));
    match f {
        QuantFailure::NonFinite { value, .. } => ModelError::NonFinite {
            tensor: tensor.to_string(),
            row,
            col,
            value,
        },
        QuantFailure::ScaleOverflow { amax } => ModelError::ScaleOverflow {
            tensor: tensor.to_string(),
            row,
            group: col / q.group,
            amax,
        },
    }
}

/// Write the int4 pair (qweight entry, scales entry, group) as output tensor `t` of
/// dtype `target`, whole groups at a time.
fn dequantize_pair(
    files: &mut Files<'_>,
    t: &OutTensor,
    (q, s, group): (usize, usize, u64),
    target: Dtype,
    sink: &mut Sink<'_>,
) -> Result<(), ModelError> {
    let numel = crate::safetensors::dtype::numel(&t.shape).unwrap_or(0);
    let g = usize::try_from(group).unwrap_or(usize::MAX).max(2);
    let step = (CHUNK_ELEMS / g).max(1) * g;
    let (mut qbuf, mut sbuf, mut s16, mut vals, mut enc) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut at = 0u64;
    while at < numel {
        let n = (numel - at).min(step as u64) as usize;
        qbuf.resize(n / 2, 0);
        files.read(q, at / 2, &mut qbuf)?;
        let groups = n / g;
        sbuf.resize(groups * 2, 0);
        files.read(s, at / group * 2, &mut sbuf)?;
        read_scales(&sbuf, &t.name, at / group, &mut s16)?;
        vals.clear();
        dequantize_row(&qbuf, &s16, g, &mut vals);
        enc.clear();
        encode_f32(target, &vals, &mut enc).map_err(|e| encode_error(&t.name, target, at, &e))?;
        sink.write(&enc)?;
        at += n as u64;
        (sink.tick)((n / 2 + groups * 2) as u64);
    }
    Ok(())
}

/// Decode little-endian F16 scale bits into `s16`, refusing what the reader rule
/// forbids; `first` is the index of the first scale (for the message).
fn read_scales(
    bytes: &[u8],
    tensor: &str,
    first: u64,
    s16: &mut Vec<u16>,
) -> Result<(), ModelError> {
    s16.clear();
    // The buffer holds whole scales (two bytes each): there is no remainder.
    let (pairs, _) = bytes.as_chunks::<2>();
    for &pair in pairs {
        let bits = u16::from_le_bytes(pair);
        // Reader rule: scales are finite and >= 0 (-0 is 0).
        if bits & 0x7C00 == 0x7C00 || (bits & 0x8000 != 0 && bits & 0x7FFF != 0) {
            return Err(ModelError::Invalid {
                first: format!(
                    "int4 (scales): tensor {}: scale {} has bits {bits:#06x}; scales must be finite and >= 0",
                    crate::text::quote(&format!("{tensor}{SCALES_SUFFIX}")),
                    first + (s16.len() as u64)
                ),
                more: 0,
            });
        }
        s16.push(bits);
    }
    Ok(())
}

/// The error for a value of output tensor `tensor` (chunk starting at element `at`)
/// that `target` cannot hold.
fn encode_error(tensor: &str, target: Dtype, at: u64, e: &EncodeError) -> ModelError {
    let index = at + e.index as u64;
    let tensor = tensor.to_string();
    let source = match e.failure {
        EncodeFailure::OutOfRange => SafetensorsError::OutOfRange {
            tensor,
            index,
            value: e.value,
            dtype: target,
        },
        EncodeFailure::NotExact => SafetensorsError::NotExact {
            tensor,
            index,
            value: e.value,
            dtype: target,
        },
        EncodeFailure::RawOnly => SafetensorsError::RawOnly {
            tensor,
            dtype: target,
        },
    };
    shard_err(source)
}
