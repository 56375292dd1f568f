//! Writing one output shard: convert through the safetensors converter, quantize and
//! dequantize by streaming each planned tensor (copied, quantized or dequantized) to its
//! place after the canonical header, into an atomic file or a plain file of the output
//! directory.
//!
//! Invariant: a shard's bytes are the planned header then each tensor at its layout
//! offset, in bounded chunks, each byte written once by a positioned write (so both
//! halves of a quantized tensor are written from one pass over its source); a plain
//! shard is synced before its directory is committed.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering;

use super::super::{Model, ModelError};
use super::mx::dequantize_mx;
use super::out::{write_err, Out, QuantOuts, Target};
use super::plan::{plan_shard, planned_result, OutTensor, Plan};
use super::quant::{dequantize_pair, quantize_entry};
use super::read::{entry, Files};
use super::{shard_err, Op, ShardResult, Shared, CHUNK_ELEMS};
use crate::atomic::AtomicFile;
use crate::safetensors::convert::convert_saturating;
use crate::safetensors::write::{canonical_header, Layout, TensorSpec};
use crate::safetensors::Dtype;

/// Write shard `si` of `model` to `target` as `op` says: atomically when it is the whole
/// output (`atomic`), as a plain file inside the output directory otherwise.
pub(super) fn shard_to(
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
    let files = Files::new(model);
    let Shared {
        done,
        total,
        progress,
    } = *shared;
    let mut tick = |n: u64| {
        let now = done.fetch_add(n, Ordering::Relaxed) + n;
        progress(now, total);
    };
    let mut body = |file: &File| -> Result<(), ModelError> {
        let to = Target { file, path: target };
        write_tensors(model, &files, &tensors, &layout, to, &mut tick)
    };
    write_shard(target, atomic, &layout, &mut body)?;
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
        .filter_map(|l| l.storage.pair())
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

/// A shard file being written: atomic (a single-file output) or plain, inside an
/// [`OutDir`](super::super::outdir::OutDir), which makes the whole directory atomic.
enum ShardFile {
    Atomic(AtomicFile),
    Plain(File),
}

impl ShardFile {
    fn create(target: &Path, atomic: bool) -> Result<Self, ModelError> {
        if atomic {
            return AtomicFile::create(target)
                .map(ShardFile::Atomic)
                .map_err(|e| shard_err(e.into()));
        }
        let file = File::create(target).map_err(|source| write_err(target, source))?;
        Ok(ShardFile::Plain(file))
    }

    /// The file written (an atomic file's under its buffer, which positioned writes
    /// leave empty).
    fn file(&mut self) -> &File {
        match self {
            ShardFile::Atomic(f) => f.writer().get_ref(),
            ShardFile::Plain(f) => f,
        }
    }

    /// Commit an atomic file; sync a plain one.
    fn finish(self, target: &Path) -> Result<(), ModelError> {
        match self {
            ShardFile::Atomic(f) => f.commit().map_err(|e| shard_err(e.into())),
            ShardFile::Plain(f) => f.sync_all().map_err(|source| write_err(target, source)),
        }
    }
}

/// Write `layout`'s header then `body` to `target`, atomically or plain (see
/// [`ShardFile`]). Every byte goes to its place with a positioned write (the buffer in
/// front of the file stays empty), so tensors may be written in any order.
fn write_shard(
    target: &Path,
    atomic: bool,
    layout: &Layout,
    body: &mut dyn FnMut(&File) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let mut file = ShardFile::create(target, atomic)?;
    let file_ref = file.file();
    file_ref
        .write_all_at(&layout.header, 0)
        .map_err(|source| write_err(target, source))?;
    body(file_ref)?;
    file.finish(target)
}

/// Write every planned tensor of a shard to `file` at its place in `layout`, in file
/// order, except that both halves of a quantized tensor come from one pass over its
/// source (the scales sort before the qweights, so a pass per half would read every
/// source twice).
fn write_tensors(
    model: &Model,
    files: &Files<'_>,
    tensors: &[OutTensor],
    layout: &Layout,
    to: Target<'_>,
    tick: &mut dyn FnMut(u64),
) -> Result<(), ModelError> {
    let base = layout.header.len() as u64;
    let place = |i: usize| -> Result<Out<'_>, ModelError> {
        match layout.offsets.get(i) {
            Some(&(start, end)) => Ok(Out {
                to,
                at: base + start,
                end: base + end,
            }),
            _ => Err(ModelError::Usage {
                detail: format!("no planned tensor {i}"),
            }),
        }
    };
    // The output tensors of each quantized source entry: (scales, qweight).
    let mut halves: HashMap<usize, (Option<usize>, Option<usize>)> = HashMap::new();
    for (i, t) in tensors.iter().enumerate() {
        match t.plan {
            Plan::Scales(q) => halves.entry(q.entry).or_default().0 = Some(i),
            Plan::Qweight(q) => halves.entry(q.entry).or_default().1 = Some(i),
            Plan::Copy(_) | Plan::Dequant(..) | Plan::MxDequant(_) => {}
        }
    }
    let mut written = vec![false; tensors.len()];
    for &i in &layout.order {
        let (Some(t), Some(false)) = (tensors.get(i), written.get(i).copied()) else {
            continue;
        };
        match &t.plan {
            &Plan::Copy(e) => copy_entry(model, files, e, place(i)?, tick)?,
            Plan::MxDequant(m) => dequantize_mx(files, t, m, t.dtype, place(i)?, tick)?,
            // The planned dtype of a dequantized tensor is the target.
            &Plan::Dequant(q, s, group) => {
                dequantize_pair(files, t, (q, s, group), t.dtype, place(i)?, tick)?
            }
            &Plan::Scales(q) | &Plan::Qweight(q) => {
                let (s, w) = halves.get(&q.entry).copied().unwrap_or_default();
                let outs = QuantOuts {
                    scales: s.map(place).transpose()?,
                    packed: w.map(place).transpose()?,
                };
                for k in [s, w].into_iter().flatten() {
                    if let Some(d) = written.get_mut(k) {
                        *d = true;
                    }
                }
                quantize_entry(model, files, q, outs, tick)?;
            }
        }
        if let Some(d) = written.get_mut(i) {
            *d = true;
        }
    }
    Ok(())
}

/// Copy entry `i`'s bytes in chunks.
fn copy_entry(
    model: &Model,
    files: &Files<'_>,
    i: usize,
    mut out: Out<'_>,
    tick: &mut dyn FnMut(u64),
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
        out.write(chunk)?;
        at += n as u64;
        tick(n as u64);
    }
    out.finish()
}
