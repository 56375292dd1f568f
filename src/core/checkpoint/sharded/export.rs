//! `ckpt export`: a step's model as a Hugging Face model directory (`model.safetensors`,
//! or `model-0000K-of-0000N.safetensors` with `model.safetensors.index.json`), the
//! sharded tensors consolidated by streaming: each output tensor is filled slab by slab
//! (at most [`SLAB_BYTES`] at a time) by verified region reads, each slab written at its
//! place with a positioned write. Tied names (the model meta's `tied`) are not written
//! again: the one stored tensor stands for them, as transformers saves tied weights.
//!
//! A step saved through `tlio.dcp` has no model group: its model is what the DCP
//! document's `hf_export` rule names (written at save time by the integration that knows
//! the model, e.g. `tlio.torchtitan`), each stored tensor under its Hugging Face name,
//! with the rule's rotary projections' rows reordered per head ([`write_rotary`]).
//!
//! Invariants: memory is one slab plus one piece buffer per thread (for a rotary
//! projection, one head's rows twice), never a tensor or the model; the output directory appears whole or not at all (`OutDir`); a step that
//! does not verify (any file, the optimizer's too) is refused before anything is
//! written; every byte written was verified (piece digests, or the file's sha256 for an
//! unsharded step);
//! the bytes depend only on the step (canonical files, sorted index).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::open::{dir_step, open_dir, ShardedStep, StepTensor};
use super::table::Group;
use super::ShardedError;
use crate::checkpoint::CheckpointError;
use crate::model::outdir::OutDir;
use crate::safetensors::write::{canonical_header, TensorSpec};

/// Bytes of one slab: the export's working memory besides the piece buffers.
pub const SLAB_BYTES: u64 = 32 << 20;
/// The single file of an unsharded model directory.
pub const SINGLE_NAME: &str = "model.safetensors";
/// The index of a sharded model directory.
pub const INDEX_NAME: &str = "model.safetensors.index.json";
/// The meta key of the model group that maps each tied name to the stored one.
pub const TIED_KEY: &str = "tied";
/// The metadata transformers writes into its safetensors files.
const PT_FORMAT: (&str, &str) = ("format", "pt");

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportReport {
    /// The files written, in order (shards, then the index and config).
    pub files: Vec<String>,
    /// Tensors written.
    pub tensors: usize,
    /// Tied names not written again, each with the stored name it stands for, in name
    /// order (a strict `load_state_dict` of the files alone misses them).
    pub tied: Vec<(String, String)>,
    /// Bytes of tensor data.
    pub data_bytes: u64,
}

/// Export the model of `step_dir` to the new directory `out_dir`, in shards of at most
/// `max_shard_bytes` of tensor data (a larger tensor gets a shard of its own).
pub fn export(
    step_dir: &Path,
    out_dir: &Path,
    max_shard_bytes: Option<u64>,
) -> Result<ExportReport, ShardedError> {
    // A FIFO, file or socket where the step directory should be is named as what it is
    // (a step-NNNNNN name alone would send the user looking for the wrong mistake).
    // A missing step is a failed operation naming the step directory, not a problem
    // of a directory that is not there.
    match std::fs::metadata(step_dir) {
        Ok(meta) if !meta.is_dir() => {
            return Err(ShardedError::Request(format!(
                "{} is a {}, not a step directory",
                step_dir.display(),
                crate::files::kind_name(&meta.file_type())
            )));
        }
        Ok(_) => {}
        Err(source) => return Err(super::io_at(step_dir)(source)),
    }
    // A step of another name (torchtitan's `step-100`, written through `tlio.dcp`) is
    // one whose manifest says which step it holds.
    let step = dir_step(step_dir)
        .or_else(|| super::named::manifest_step(step_dir))
        .ok_or_else(|| {
            ShardedError::Request(format!(
                "{} is not a step directory (step-NNNNNN); `tlio ckpt latest DIR` names the one to export",
                step_dir.display()
            ))
        })?;
    // Every file of the step is checked as `ckpt verify` checks it, the optimizer's
    // too, though the export reads only the model: a model taken from a step that
    // does not verify would carry a damage nobody was told about.
    if let Some(problem) = crate::checkpoint::verify::verify(step_dir).first() {
        return Err(ShardedError::Request(format!(
            "{} does not verify, so it is not exported: {problem} (`tlio ckpt verify` lists every problem)",
            step_dir.display()
        )));
    }
    let opened = open_dir(step_dir, step, true).map_err(|why| CheckpointError::NotFound {
        dir: step_dir.to_path_buf(),
        reasons: vec![(crate::checkpoint::step_name(step), why)],
    })?;
    let model = model_tensors(&opened)?;
    let tied = tied_names(&opened, &model)?;
    let shards = plan_shards(&model, max_shard_bytes);
    let out = OutDir::create(out_dir, Some(step_dir))?;
    let mut report = ExportReport {
        files: Vec::new(),
        tensors: model.len(),
        tied: tied.into_iter().collect(),
        data_bytes: 0,
    };
    let count = shards.len();
    let mut weight_map = BTreeMap::new();
    for (k, shard) in shards.iter().enumerate() {
        let name = if count == 1 {
            SINGLE_NAME.to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", k + 1, count)
        };
        report.data_bytes =
            report
                .data_bytes
                .saturating_add(write_shard(&opened, shard, &out.path().join(&name))?);
        for t in shard {
            weight_map.insert(t.name.clone(), serde_json::Value::String(name.clone()));
        }
        report.files.push(name);
    }
    if count > 1 {
        let index = serde_json::json!({
            "metadata": { "total_size": report.data_bytes },
            "weight_map": weight_map,
        });
        out.write_file(INDEX_NAME, &pretty(&index))?;
        report.files.push(INDEX_NAME.to_string());
    }
    if let Some(config) = &opened.config {
        out.write_file(crate::checkpoint::CONFIG_NAME, config)?;
        report
            .files
            .push(crate::checkpoint::CONFIG_NAME.to_string());
    }
    out.commit()?;
    Ok(report)
}

/// The exported tensors: the model group's, else those of a DCP step's export rule.
fn model_tensors(opened: &ShardedStep) -> Result<Vec<OutTensor<'_>>, ShardedError> {
    let model: Vec<OutTensor<'_>> = opened
        .tensors
        .iter()
        .filter(|t| t.group == Group::Model)
        .map(|t| OutTensor {
            name: t.name.clone(),
            src: t,
            rotary_heads: None,
        })
        .collect();
    if model.is_empty() {
        dcp_model(opened)
    } else {
        Ok(model)
    }
}

/// One tensor of the exported model: its name there and the stored tensor it is.
struct OutTensor<'t> {
    name: String,
    src: &'t StepTensor,
    /// Rows reordered per head from interleaved rotary pairs to halves
    /// ([`super::dcp::HfTensor::rotary_heads`]).
    rotary_heads: Option<u64>,
}

/// The model of a step saved through `tlio.dcp`: the tensors of its document's
/// `hf_export` rule, sorted by name (the rule was checked when the step was opened).
fn dcp_model(step: &ShardedStep) -> Result<Vec<OutTensor<'_>>, ShardedError> {
    let Some(text) = step
        .meta
        .get(&Group::Dcp)
        .and_then(|m| m.get(super::dcp::DCP_META_KEY))
    else {
        return Ok(Vec::new());
    };
    let doc = super::dcp::DcpDocument::from_json(text)?;
    let rule = doc.hf_export.ok_or_else(|| {
        ShardedError::Request(format!(
            "{} holds a DCP state dict without a Hugging Face export rule, so its model's names are \
             unknown (tlio.torchtitan's checkpoint manager writes one for a model with a state dict adapter)",
            step.path.display()
        ))
    })?;
    rule.tensors
        .into_iter()
        .map(|t| {
            let src = step.tensor(Group::Dcp, &t.from).ok_or_else(|| {
                super::table_err(
                    format!("hf_export {:?}", t.name),
                    format!("{:?} is not stored", t.from),
                )
            })?;
            Ok(OutTensor {
                name: t.name,
                src,
                rotary_heads: t.rotary_heads,
            })
        })
        .collect()
}

/// JSON as transformers writes it: two-space indent, sorted keys, a final newline.
fn pretty(value: &serde_json::Value) -> Vec<u8> {
    // Serialising a Value into a Vec cannot fail.
    let mut bytes = serde_json::to_vec_pretty(value).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// The model meta's tied map, checked: every tied name absent from the stored tensors
/// and tied to one that is stored.
fn tied_names(
    step: &ShardedStep,
    model: &[OutTensor<'_>],
) -> Result<BTreeMap<String, String>, ShardedError> {
    let Some(text) = step.meta.get(&Group::Model).and_then(|m| m.get(TIED_KEY)) else {
        return Ok(BTreeMap::new());
    };
    let bad = |reason: String| super::table_err(format!("the model's meta {TIED_KEY:?}"), reason);
    let tied: BTreeMap<String, String> =
        serde_json::from_str(text).map_err(|e| bad(format!("not a JSON object of names: {e}")))?;
    let stored = |n: &str| model.iter().any(|t| t.name == n);
    for (other, first) in &tied {
        if stored(other) {
            return Err(bad(format!("{other:?} is tied and stored too")));
        }
        if !stored(first) {
            return Err(bad(format!(
                "{other:?} is tied to {first:?}, which is not stored"
            )));
        }
    }
    Ok(tied)
}

/// The model's tensors (sorted by name) in shards of at most `max` data bytes, a new
/// shard when the next tensor would not fit (a tensor larger than `max` alone).
fn plan_shards<'m, 't>(
    model: &'m [OutTensor<'t>],
    max: Option<u64>,
) -> Vec<Vec<&'m OutTensor<'t>>> {
    let mut shards: Vec<Vec<&OutTensor<'t>>> = vec![Vec::new()];
    let mut used = 0u64;
    for t in model {
        let n = t.src.byte_len();
        if let (Some(max), Some(last)) = (max, shards.last()) {
            if !last.is_empty() && used.saturating_add(n) > max {
                shards.push(Vec::new());
                used = 0;
            }
        }
        used = used.saturating_add(n);
        if let Some(last) = shards.last_mut() {
            last.push(t);
        }
    }
    shards
}

/// Write one shard file: its canonical header, then every tensor slab by slab with
/// positioned writes; fsynced. Returns its data bytes.
fn write_shard(
    step: &ShardedStep,
    tensors: &[&OutTensor<'_>],
    path: &Path,
) -> Result<u64, ShardedError> {
    let specs: Vec<TensorSpec<'_>> = tensors
        .iter()
        .map(|t| TensorSpec::new(&t.name, t.src.dtype, &t.src.shape))
        .collect();
    let meta = BTreeMap::from([(PT_FORMAT.0.to_string(), PT_FORMAT.1.to_string())]);
    let layout = canonical_header(&specs, &meta).map_err(|source| ShardedError::Safetensors {
        path: path.to_path_buf(),
        source,
    })?;
    let io = super::io_at(path);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(super::io_at(path))?;
    file.set_len(layout.file_size())
        .map_err(super::io_at(path))?;
    file.write_all_at(&layout.header, 0)
        .map_err(super::io_at(path))?;
    let start = layout.header.len() as u64;
    let mut slab = Vec::new();
    for (t, &(b, _)) in tensors.iter().zip(&layout.offsets) {
        let at = start.saturating_add(b);
        match t.rotary_heads {
            Some(heads) => write_rotary(step, t.src, heads, &file, path, at, &mut slab)?,
            None => write_tensor(step, t.src, &file, path, at, &mut slab)?,
        }
    }
    file.sync_all().map_err(io)?;
    Ok(layout.data_len)
}

/// One tensor, slab by slab: along the first dimension whose trailing block fits a
/// slab, as many of its rows as fit; each slab is contiguous in the output.
fn write_tensor(
    step: &ShardedStep,
    t: &StepTensor,
    file: &File,
    path: &Path,
    at: u64,
    slab: &mut Vec<u8>,
) -> Result<(), ShardedError> {
    let elem = t.dtype.size().map_or(1, |s| s as u64);
    if t.byte_len() == 0 {
        return Ok(());
    }
    let rank = t.shape.len();
    // row[d]: bytes of one index step along dimension d.
    let mut row = vec![elem; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        let next = row.get(d + 1).copied().unwrap_or(elem);
        let dim = t.shape.get(d + 1).copied().unwrap_or(1);
        if let Some(r) = row.get_mut(d) {
            *r = next.saturating_mul(dim);
        }
    }
    let d = (0..rank).find(|&d| row.get(d).is_some_and(|&r| r <= SLAB_BYTES));
    let Some(d) = d else {
        // Rank 0: one element.
        slab.resize(usize::try_from(elem).unwrap_or(0), 0);
        step.read(t.group, &t.name, &[], &[], slab)?;
        return file.write_all_at(slab, at).map_err(super::io_at(path));
    };
    let step_rows = (SLAB_BYTES / row.get(d).copied().unwrap_or(1).max(1)).max(1);
    let prefixes: u64 = t.shape.iter().take(d).product();
    let dim = t.shape.get(d).copied().unwrap_or(1);
    let mut offsets = vec![0u64; rank];
    let mut sizes: Vec<u64> = t.shape.clone();
    for p in 0..prefixes {
        // The prefix index p in mixed radix over dimensions 0..d, each of size 1.
        let mut rest = p;
        let mut base = 0u64;
        for i in (0..d).rev() {
            let n = t.shape.get(i).copied().unwrap_or(1).max(1);
            let idx = rest % n;
            rest /= n;
            if let (Some(o), Some(s)) = (offsets.get_mut(i), sizes.get_mut(i)) {
                *o = idx;
                *s = 1;
            }
            base = base.saturating_add(idx.saturating_mul(row.get(i).copied().unwrap_or(0)));
        }
        let mut r0 = 0;
        while r0 < dim {
            let k = step_rows.min(dim - r0);
            if let (Some(o), Some(s)) = (offsets.get_mut(d), sizes.get_mut(d)) {
                *o = r0;
                *s = k;
            }
            let bytes = k.saturating_mul(row.get(d).copied().unwrap_or(0));
            slab.resize(usize::try_from(bytes).unwrap_or(0), 0);
            step.read(t.group, &t.name, &offsets, &sizes, slab)?;
            let pos = at
                .saturating_add(base)
                .saturating_add(r0.saturating_mul(row.get(d).copied().unwrap_or(0)));
            file.write_all_at(slab, pos).map_err(super::io_at(path))?;
            r0 += k;
        }
    }
    Ok(())
}

/// A 2-D projection whose rows hold each head's rotary pairs interleaved (row `2i + j`
/// of a head is element `j` of pair `i`), written with each head's rows as two halves
/// (row `j * half + i`), one head at a time: the slab is one head's rows and the
/// reordered copy beside it. The step table's rule was checked on open (2-D, rows a
/// multiple of twice the heads).
fn write_rotary(
    step: &ShardedStep,
    t: &StepTensor,
    heads: u64,
    file: &File,
    path: &Path,
    at: u64,
    slab: &mut Vec<u8>,
) -> Result<(), ShardedError> {
    let elem = t.dtype.size().map_or(1, |s| s as u64);
    let (rows, cols) = match t.shape.as_slice() {
        [r, c] => (*r, *c),
        _ => {
            return Err(super::table_err(
                t.label(),
                "a rotary reorder needs a 2-D tensor".to_string(),
            ))
        }
    };
    let block = rows
        .checked_div(heads)
        .filter(|b| b % 2 == 0 && b.checked_mul(heads) == Some(rows));
    let Some(block) = block else {
        return Err(super::table_err(
            t.label(),
            format!("{rows} rows are no multiple of 2 x {heads} heads"),
        ));
    };
    if t.byte_len() == 0 {
        return Ok(());
    }
    let half = block / 2;
    let row_bytes = usize::try_from(cols.saturating_mul(elem)).unwrap_or(usize::MAX);
    let too_big = || {
        super::table_err(
            t.label(),
            "one head's rows do not fit in memory".to_string(),
        )
    };
    let block_bytes = usize::try_from(block)
        .ok()
        .and_then(|b| b.checked_mul(row_bytes))
        .ok_or_else(too_big)?;
    slab.resize(block_bytes, 0);
    let mut out = vec![0u8; block_bytes];
    for h in 0..heads {
        step.read(
            t.group,
            &t.name,
            &[h.saturating_mul(block), 0],
            &[block, cols],
            slab,
        )?;
        for (src_row, chunk) in slab.chunks_exact(row_bytes.max(1)).enumerate() {
            let src_row = src_row as u64;
            let dst_row = (src_row % 2)
                .saturating_mul(half)
                .saturating_add(src_row / 2);
            let dst = usize::try_from(dst_row)
                .unwrap_or(usize::MAX)
                .saturating_mul(row_bytes);
            if let Some(d) = out.get_mut(dst..dst.saturating_add(row_bytes)) {
                d.copy_from_slice(chunk);
            }
        }
        let pos = at.saturating_add(h.saturating_mul(block_bytes as u64));
        file.write_all_at(&out, pos).map_err(super::io_at(path))?;
    }
    Ok(())
}
