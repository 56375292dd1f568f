//! Writing one output shard: convert through the safetensors converter, quantize and
//! dequantize by streaming each planned tensor (copied, quantized or dequantized) after
//! the canonical header, into an atomic file or a plain file of the output directory.
//!
//! Invariant: a shard's bytes are the planned header then each tensor in the layout's
//! order, in bounded chunks; a plain shard is synced before its directory is committed.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::super::{Model, ModelError, Storage};
use super::plan::{plan_shard, planned_result, OutTensor, Plan};
use super::quant::{dequantize_pair, quantize_entry};
use super::read::{entry, Files};
use super::{shard_err, Op, ShardResult, Shared, CHUNK_ELEMS};
use crate::atomic::AtomicFile;
use crate::safetensors::convert::convert_saturating;
use crate::safetensors::write::{canonical_header, TensorSpec};
use crate::safetensors::Dtype;

/// Bytes buffered in front of a plain shard file.
const PLAIN_BUFFER_BYTES: usize = 1 << 20;

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
    let mut body = |out: &mut (dyn Write + Send)| -> Result<(), ModelError> {
        for &i in &layout.order {
            if let Some(t) = tensors.get(i) {
                produce(model, &mut files, t, out, &mut tick)?;
            }
        }
        Ok(())
    };
    write_shard(target, atomic, &layout.header, &mut body)?;
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

/// A shard file being written: atomic (a single-file output) or plain, inside an
/// [`OutDir`](super::super::outdir::OutDir), which makes the whole directory atomic.
enum ShardFile {
    Atomic(AtomicFile),
    Plain(BufWriter<File>),
}

impl ShardFile {
    fn create(target: &Path, atomic: bool) -> Result<Self, ModelError> {
        if atomic {
            return AtomicFile::create(target)
                .map(ShardFile::Atomic)
                .map_err(|e| shard_err(e.into()));
        }
        let file = File::create(target).map_err(|source| write_err(target, source))?;
        Ok(ShardFile::Plain(BufWriter::with_capacity(
            PLAIN_BUFFER_BYTES,
            file,
        )))
    }

    fn out(&mut self) -> &mut (dyn Write + Send) {
        match self {
            ShardFile::Atomic(f) => f,
            ShardFile::Plain(w) => w,
        }
    }

    /// Commit an atomic file; flush and sync a plain one.
    fn finish(self, target: &Path) -> Result<(), ModelError> {
        match self {
            ShardFile::Atomic(f) => f.commit().map_err(|e| shard_err(e.into())),
            ShardFile::Plain(w) => {
                let file = w
                    .into_inner()
                    .map_err(|e| write_err(target, e.into_error()))?;
                file.sync_all().map_err(|source| write_err(target, source))
            }
        }
    }
}

fn write_err(target: &Path, source: std::io::Error) -> ModelError {
    ModelError::Write {
        path: target.to_path_buf(),
        source,
    }
}

/// Write `header` then `body` to `target`, atomically or plain (see [`ShardFile`]).
fn write_shard(
    target: &Path,
    atomic: bool,
    header: &[u8],
    body: &mut dyn FnMut(&mut (dyn Write + Send)) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let mut file = ShardFile::create(target, atomic)?;
    file.out()
        .write_all(header)
        .map_err(|source| write_err(target, source))?;
    body(file.out())?;
    file.finish(target)
}

/// Where one output tensor's bytes go: the writer (with the tensor's name, for write
/// errors) and the progress counter.
pub(super) struct Sink<'s> {
    pub(super) out: Out<'s>,
    pub(super) tick: &'s mut dyn FnMut(u64),
}

/// The writer of one output tensor: apart from the progress counter so that it can
/// be handed to another thread (a write overlapping the next chunk's work).
pub(super) struct Out<'s> {
    name: &'s str,
    out: &'s mut (dyn Write + Send),
}

impl Sink<'_> {
    pub(super) fn write(&mut self, bytes: &[u8]) -> Result<(), ModelError> {
        self.out.write(bytes)
    }
}

impl Out<'_> {
    pub(super) fn write(&mut self, bytes: &[u8]) -> Result<(), ModelError> {
        self.out
            .write_all(bytes)
            .map_err(|source| ModelError::Write {
                path: PathBuf::from(self.name),
                source,
            })
    }
}

/// Write the bytes of output tensor `t`.
fn produce(
    model: &Model,
    files: &mut Files<'_>,
    t: &OutTensor,
    out: &mut (dyn Write + Send),
    tick: &mut dyn FnMut(u64),
) -> Result<(), ModelError> {
    let mut sink = Sink {
        out: Out { name: &t.name, out },
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
