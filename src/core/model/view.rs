//! A model as commands show it: its listing (`st inspect`'s rows, whatever the
//! sharding) and, with its files mapped, logical tensors' bytes for `diff`, `--stats`
//! (int4 pairs dequantized) and `verify`'s data checks (int4 scales finite and >= 0,
//! `--finite`, `--canonical` per shard).
//!
//! Invariants: every slice comes from a mapping whose header was validated, through
//! [`MappedData::info_bytes`], so it lies inside its file; a listing borrows from the
//! model and is produced a row at a time (a 100 MB header must not be copied per row).

use std::collections::BTreeMap;
use std::path::Path;

use super::int4::dequantize_row;
use super::{finding, Kind, Model, ModelError, Storage};
use crate::safetensors::diff::{diff_sides, DiffReport, Side};
use crate::safetensors::mmap::MappedData;
use crate::safetensors::stats::{tensor_stats, Acc, TensorStats};
use crate::safetensors::verify::{verify_with_progress, Findings, VerifyOptions};
use crate::text::quote;

/// A model and its mapped files (in the order of [`Model::shards`]); the headers are
/// the model's, read once.
pub struct ModelView {
    /// The model.
    pub model: Model,
    maps: Vec<MappedData>,
}

impl ModelView {
    /// Open and map `path` (a file, an index or a directory), failing on any broken rule.
    pub fn open(path: &Path) -> Result<ModelView, ModelError> {
        ModelView::map(Model::open(path)?)
    }

    /// Map the files of an opened model, refusing an int4 scale the reader rule forbids
    /// (not finite, or negative): every command that reads tensor data checks the
    /// scales first (docs/models.md).
    pub fn map(model: Model) -> Result<ModelView, ModelError> {
        let view = ModelView::map_unchecked(model)?;
        if let Some((_, _, message)) = view.bad_scales().into_iter().next() {
            return Err(ModelError::Invalid {
                first: message,
                more: 0,
            });
        }
        Ok(view)
    }

    /// Map the files without the scale check (`verify` reports a bad scale as a finding).
    fn map_unchecked(model: Model) -> Result<ModelView, ModelError> {
        let mut maps = Vec::with_capacity(model.shards.len());
        for s in &model.shards {
            let m = MappedData::open(&s.path, &s.header).map_err(|source| {
                ModelError::in_shard((model.shards.len() > 1).then(|| s.name.clone()), source)
            })?;
            maps.push(m);
        }
        Ok(ModelView { model, maps })
    }

    /// The bytes of entry `i`.
    pub fn entry_bytes(&self, i: usize) -> Option<&[u8]> {
        let e = self.model.entry(i)?;
        self.maps.get(e.shard)?.info_bytes(&e.info)
    }

    /// The comparison side of this model: every physical tensor of every shard, and the
    /// union of the shards' metadata (shards of one model carry the same keys).
    pub fn side(&self) -> Side<'_> {
        let mut side = Side::default();
        for s in &self.model.shards {
            for (k, v) in &s.header.metadata {
                side.metadata.entry(k.as_str()).or_insert(v.as_str());
            }
        }
        // The model's entries: every physical tensor once, already in name order.
        side.add(self.model.entries.iter().enumerate().filter_map(|(i, e)| {
            let bytes = self.entry_bytes(i)?;
            Some((&e.info, bytes))
        }));
        side
    }

    /// Statistics of every logical tensor, in the order of [`Model::logical`] (int4
    /// pairs dequantized); None for a tensor whose dtype cannot be decoded.
    /// `progress(bytes)` after each tensor.
    pub fn stats(&self, progress: &mut dyn FnMut(u64)) -> Vec<Option<TensorStats>> {
        let mut out = Vec::with_capacity(self.model.logical.len());
        for l in &self.model.logical {
            let s = match l.storage {
                Storage::Plain(i) => {
                    let e = self.model.entry(i);
                    let b = self.entry_bytes(i);
                    progress(b.map_or(0, |b| b.len() as u64));
                    e.zip(b).and_then(|(e, b)| tensor_stats(&e.info, b))
                }
                Storage::Int4 {
                    qweight,
                    scales,
                    group,
                } => {
                    let (Some(q), Some(s)) = (self.entry_bytes(qweight), self.entry_bytes(scales))
                    else {
                        out.push(None);
                        continue;
                    };
                    progress((q.len() + s.len()) as u64);
                    Some(int4_stats(q, s, group))
                }
                Storage::Mx { elems, scales, fmt } => {
                    let (Some(q), Some(s)) = (self.entry_bytes(elems), self.entry_bytes(scales))
                    else {
                        out.push(None);
                        continue;
                    };
                    progress((q.len() + s.len()) as u64);
                    mx_stats(q, s, fmt)
                }
            };
            out.push(s);
        }
        out
    }
}

/// One logical tensor as a listing shows it, borrowed from its model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row<'m> {
    /// Index into [`Model::logical`].
    pub logical: usize,
    /// The name (`<name>` for an int4 pair).
    pub name: &'m str,
    /// The stored dtype (`int4-gG-sym` for a pair).
    pub dtype: String,
    /// The logical shape.
    pub shape: &'m [u64],
    /// Element count of the logical shape.
    pub params: u64,
    /// Bytes as stored (both tensors of a pair).
    pub bytes: u64,
    /// The data offsets of the tensor (of the `.qweight` of a pair) in its shard.
    pub data_offsets: (u64, u64),
    /// The shard holding it, for a sharded model.
    pub shard: Option<&'m str>,
}

/// The logical tensors of a model in the order a listing shows them: a single file's
/// in file order, as its header lays them out; a sharded model's by name.
pub struct Listing<'m> {
    model: &'m Model,
    order: Vec<usize>,
}

impl<'m> Listing<'m> {
    /// The listing of `model` (one index per tensor; the rows are made on demand).
    pub fn new(model: &'m Model) -> Self {
        let mut order: Vec<usize> = (0..model.logical.len()).collect();
        if model.kind == Kind::File {
            // Stable: ties (zero-size tensors) stay in name order.
            order.sort_by_key(|&i| model.logical.get(i).map(|l| offsets(model, l)));
        }
        Listing { model, order }
    }

    /// How many rows.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether there is no row.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The rows, in listing order.
    pub fn rows(&self) -> impl Iterator<Item = Row<'m>> + '_ {
        let model = self.model;
        self.order.iter().filter_map(move |&i| row(model, i))
    }

    /// The metadata shown: a file's own (also a directory's single file), else the
    /// index's `metadata` object.
    pub fn metadata(&self) -> BTreeMap<String, serde_json::Value> {
        let model = self.model;
        if model.kind != Kind::File && model.index_path.is_some() {
            return model.index_metadata.clone();
        }
        model.shards.first().map_or_else(BTreeMap::new, |s| {
            s.header
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect()
        })
    }

    /// The size of every file of the model together.
    pub fn file_size(&self) -> u64 {
        self.model
            .shards
            .iter()
            .fold(0u64, |acc, s| acc.saturating_add(s.header.file_size))
    }
}

/// The data offsets of a logical tensor (of its `.qweight` for a pair).
fn offsets(model: &Model, l: &super::Logical) -> (u64, u64) {
    model
        .entry(l.storage.first_entry())
        .map_or((0, 0), |e| e.info.data_offsets)
}

fn row(model: &Model, i: usize) -> Option<Row<'_>> {
    let l = model.logical.get(i)?;
    let (dtype, bytes) = model.stored(l);
    let shard = (model.kind != Kind::File)
        .then(|| model.shard_of(l).map(|s| s.name.as_str()))
        .flatten();
    Some(Row {
        logical: i,
        name: &l.name,
        dtype,
        shape: &l.shape,
        params: crate::safetensors::dtype::numel(&l.shape).unwrap_or(0),
        bytes,
        data_offsets: offsets(model, l),
        shard,
    })
}

/// The message naming the first scale in `bytes` (the F16 scales of the int4 pair
/// `name`) that is not finite or is negative (-0 is 0); `None` when every one is fine.
pub fn bad_scale(name: &str, bytes: &[u8]) -> Option<String> {
    let (at, bits) = scales_of(bytes)
        .enumerate()
        .find(|&(_, b)| (b & 0x7C00) == 0x7C00 || (b & 0x8000 != 0 && b & 0x7FFF != 0))?;
    Some(format!(
        "int4 (scales): tensor {}: scale {at} is {} (bits {bits:#06x}); scales must be finite and >= 0",
        quote(&format!("{name}.scales")),
        crate::safetensors::float::f16_to_f32(bits)
    ))
}

fn scales_of(bytes: &[u8]) -> impl Iterator<Item = u16> + '_ {
    bytes.chunks_exact(2).map(|b| {
        u16::from_le_bytes([
            b.first().copied().unwrap_or(0),
            b.get(1).copied().unwrap_or(0),
        ])
    })
}

/// Statistics of a dequantized int4 pair, a group at a time.
fn int4_stats(q: &[u8], s: &[u8], group: u64) -> TensorStats {
    let g = usize::try_from(group).unwrap_or(usize::MAX).max(2);
    let mut acc = Acc::default();
    let (mut vals, mut wide) = (Vec::with_capacity(g), Vec::with_capacity(g));
    for (bytes, scale) in q.chunks(g / 2).zip(scales_of(s)) {
        vals.clear();
        dequantize_row(bytes, &[scale], g, &mut vals);
        wide.clear();
        wide.extend(vals.iter().map(|&v| f64::from(v)));
        acc.add_chunk(&wide);
    }
    acc.finish()
}

/// Statistics of a dequantized MX pair, a block at a time; None when a scale is NaN
/// (the model was opened without the scale check).
fn mx_stats(elems: &[u8], scales: &[u8], fmt: super::mx::MxFormat) -> Option<TensorStats> {
    let mut acc = Acc::default();
    let (mut vals, mut wide) = (Vec::new(), Vec::new());
    let per = fmt.block_bytes();
    for (bytes, s) in elems.chunks(per * 1024).zip(scales.chunks(1024)) {
        vals.clear();
        super::mx::dequantize(bytes, s, fmt, &mut vals).ok()?;
        wide.clear();
        wide.extend(vals.iter().map(|&v| f64::from(v)));
        acc.add_chunk(&wide);
    }
    Some(acc.finish())
}

/// The message naming the first NaN scale (255) of the MX pair `name` whose scales
/// are `bytes`; `None` when every scale is a number.
pub fn bad_mx_scale(name: &str, bytes: &[u8]) -> Option<String> {
    let at = bytes.iter().position(|&b| b == super::mx::E8M0_NAN)?;
    Some(format!(
        "mx (scales): tensor {}: scale {at} is 255, the E8M0 NaN; scales must be numbers",
        quote(name)
    ))
}

/// Compare two models by tensor, whatever their sharding.
pub fn diff_models(a: &ModelView, b: &ModelView) -> DiffReport<'static> {
    diff_views(a, b).into_owned()
}

/// [`diff_models`] borrowing its names from the two models (no copy of every name).
pub fn diff_views<'a>(a: &'a ModelView, b: &'a ModelView) -> DiffReport<'a> {
    diff_sides(&a.side(), &b.side())
}

/// Every problem of the model at `path`: the rules [`Model::scan`] checks, the int4
/// scales (finite, >= 0), and per shard `--canonical` / `--finite` when asked. Only an
/// unreadable path is an error.
pub fn verify_model(
    path: &Path,
    opts: VerifyOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Findings, ModelError> {
    let (model, mut problems) = Model::scan(path)?;
    let named = model.kind != Kind::File;
    for shard in &model.shards {
        if !(opts.canonical || opts.finite) {
            break;
        }
        let found = verify_with_progress(&shard.path, opts, progress)
            .map_err(|source| ModelError::in_shard(named.then(|| shard.name.clone()), source))?;
        for mut f in found {
            if named {
                f.message = format!("shard {}: {}", quote(&shard.name), f.message);
            }
            problems.push(f);
        }
    }
    let has_pairs = model.logical.iter().any(|l| l.storage.pair().is_some());
    if has_pairs {
        let view = ModelView::map_unchecked(model)?;
        for (rule, name, message) in view.bad_scales() {
            problems.push(finding(rule, Some(&name), message));
        }
    }
    Ok(problems)
}

impl ModelView {
    /// For each pair with a scale the reader rule forbids (int4: not finite, or
    /// negative, -0 being 0; MX: the NaN code 255), the rule, its logical name and a
    /// message naming the first such scale.
    fn bad_scales(&self) -> Vec<(&'static str, String, String)> {
        let mut out = Vec::new();
        for l in &self.model.logical {
            type Check = fn(&str, &[u8]) -> Option<String>;
            let (rule, scales, check): (&str, usize, Check) = match l.storage {
                Storage::Int4 { scales, .. } => ("int4-scales", scales, bad_scale),
                Storage::Mx { scales, .. } => ("mx-scales", scales, bad_mx_scale),
                Storage::Plain(_) => continue,
            };
            let Some(bytes) = self.entry_bytes(scales) else {
                continue;
            };
            if let Some(message) = check(&l.name, bytes) {
                out.push((rule, l.name.clone(), message));
            }
        }
        out
    }
}
