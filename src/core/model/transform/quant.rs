//! The int4 passes over one tensor: quantize a float tensor into its scales and its
//! packed values (one pass over the source for both), and dequantize a pair back to
//! floats, whole groups at a time through the row kernels of [`int4`](super::super::int4).
//!
//! Invariants: each chunk holds whole groups, so a chunk's result does not depend on
//! where chunks begin, nor on the thread count (fixed pieces, each into its own place);
//! memory is a few chunk buffers and a cache-sized buffer per thread, never a tensor;
//! a scale the reader rule forbids (not finite, or negative) is an error, never
//! dequantized; a value the target cannot hold names its tensor and index.

use super::super::int4::{dequantize_row, quantize_row, row_scales, QuantFailure, SCALES_SUFFIX};
use super::super::int4_kernel::quantize_raw;
use super::super::{Model, ModelError};
use super::out::{Out, QuantOuts};
use super::plan::{OutTensor, Quant};
use super::read::{entry, Files};
use super::{shard_err, CHUNK_ELEMS};
use crate::safetensors::float::{decode_f32, encode_f32, EncodeError, EncodeFailure};
use crate::safetensors::{Dtype, SafetensorsError};

/// Write the scales and (or) the packed values of quantizing `q` to `outs`, whole
/// groups at a time, from one pass over the source.
pub(super) fn quantize_entry(
    model: &Model,
    files: &Files<'_>,
    q: Quant,
    outs: QuantOuts<'_>,
    tick: &mut dyn FnMut(u64),
) -> Result<(), ModelError> {
    let info = &entry(model, q.entry)?.info;
    let QuantOuts {
        scales: mut scales_out,
        packed: mut packed_out,
    } = outs;
    let pack = packed_out.is_some();
    let g = q.group as usize;
    let size = q.size;
    let numel = info.numel();
    let step = (CHUNK_ELEMS / g).max(1) * g;
    let (mut scales, mut packed) = (Vec::new(), Vec::new());
    // The bytes of the chunk before, written while this one is quantized.
    let (mut scale_bytes_now, mut pending_scales) = (Vec::new(), Vec::new());
    let mut pending_packed = Vec::new();
    // Both halves in one pass read the source once; a half on its own counts half.
    let share = if scales_out.is_some() && pack { 1 } else { 2 };
    let mut at = 0u64;
    while at < numel {
        let n = (numel - at).min(step as u64) as usize;
        // Each piece reads its own weights into its worker's buffer (cache-sized, so
        // the kernel reads them from cache) while the chunk before is written: no
        // thread waits for a whole chunk to be read, and nothing is mapped (mapping
        // and unmapping the page cache's pages cost more than copying them).
        let read = |first: usize, buf: &mut [u8]| {
            files.read(q.entry, (at + first as u64) * size as u64, buf)
        };
        let (so, po) = (&mut scales_out, &mut packed_out);
        let (ps, pp) = (&pending_scales, &pending_packed);
        let write = || -> Result<(), ModelError> {
            if let Some(o) = so {
                o.write(ps)?;
            }
            if let Some(o) = po {
                o.write(pp)?;
            }
            Ok(())
        };
        let (done, wrote) = rayon::join(
            || {
                quantize_pieces(
                    n,
                    &read,
                    (info.dtype, size, g),
                    !pack,
                    &mut scales,
                    &mut packed,
                )
            },
            write,
        );
        // Errors keep the order of a serial run: the write, then the pieces in order
        // (each one's read before its weights).
        wrote?;
        done.map_err(|e| match e {
            PieceError::Read(e) => e,
            PieceError::Weight(col, f) => quant_error(&info.name, q, at + col as u64, f),
        })?;
        if scales_out.is_some() {
            scale_bytes_now.clear();
            scale_bytes(&scales, &mut scale_bytes_now);
            std::mem::swap(&mut pending_scales, &mut scale_bytes_now);
        }
        if pack {
            std::mem::swap(&mut pending_packed, &mut packed);
        }
        at += n as u64;
        tick((n * size / share) as u64);
    }
    if let Some(mut o) = scales_out {
        o.write(&pending_scales)?;
        o.finish()?;
    }
    if let Some(mut o) = packed_out {
        o.write(&pending_packed)?;
        o.finish()?;
    }
    Ok(())
}

/// Append the little-endian bytes of the scale bits `scales` to `bytes`.
fn scale_bytes(scales: &[u16], bytes: &mut Vec<u8>) {
    bytes.extend(scales.iter().flat_map(|s| s.to_le_bytes()));
}

/// Weights of one parallel piece of [`quantize_pieces`] (rounded down to whole groups).
const PIECE_ELEMS: usize = 64 << 10;

/// How [`quantize_pieces`] reads a piece: `read(first weight, buffer)` fills the buffer
/// with the raw weights from that one on.
type ReadPiece<'r> = dyn Fn(usize, &mut [u8]) -> Result<(), ModelError> + Sync + 'r;

/// Why a piece of [`quantize_pieces`] failed.
enum PieceError {
    /// Reading its weights.
    Read(ModelError),
    /// A weight it cannot quantize, by its column in the chunk.
    Weight(usize, QuantFailure),
}

/// The scales (and, unless `scales_only`, the packed values) of `n` weights of `dtype`
/// (`size` bytes each), whole groups of `g`, into `scales` and `packed` (resized to
/// fit): fixed pieces, each read by `read(first weight, buffer)` into its worker's
/// buffer and quantized in parallel into its own place of the outputs, so the bytes
/// never depend on the thread count and no thread gathers the pieces afterwards; the
/// error is the one of the lowest piece (its read first), then the lowest column.
fn quantize_pieces(
    n: usize,
    read: &ReadPiece<'_>,
    (dtype, size, g): (Dtype, usize, usize),
    scales_only: bool,
    scales: &mut Vec<u16>,
    packed: &mut Vec<u8>,
) -> Result<(), PieceError> {
    use rayon::prelude::*;
    let size = size.max(1);
    let g = g.max(2);
    let piece = (PIECE_ELEMS / g).max(1) * g;
    // Every place is overwritten by its piece: resizing alone (no clearing) spares
    // zeroing the buffers at every chunk.
    scales.resize(n / g, 0);
    let work = |k: usize, s: &mut [u16], p: &mut [u8], b: &mut PieceBuffers| {
        let first = k * piece;
        let len = piece.min(n.saturating_sub(first));
        b.raw.resize(len * size, 0);
        read(first, &mut b.raw).map_err(PieceError::Read)?;
        b.scales.clear();
        b.packed.clear();
        // The scales pass needs no values: only the qweight pass packs them.
        let (bs, bp) = (&mut b.scales, &mut b.packed);
        let done = match quantize_raw(&b.raw, dtype, g, !scales_only, bs, bp) {
            Some(done) => done,
            None => {
                b.vals.clear();
                decode_f32(dtype, &b.raw, &mut b.vals);
                if scales_only {
                    row_scales(&b.vals, g, bs)
                } else {
                    quantize_row(&b.vals, g, bs, bp)
                }
            }
        };
        // The piece's place holds exactly what it made (whole groups, even counts).
        for (d, x) in s.iter_mut().zip(&b.scales) {
            *d = *x;
        }
        for (d, x) in p.iter_mut().zip(&b.packed) {
            *d = *x;
        }
        done.map_err(|(col, f)| PieceError::Weight(col + first, f))
    };
    // Each worker thread keeps its buffers from piece to piece and call to call (a
    // buffer per piece would be a fresh allocation, its pages faulted in each time).
    let work = |k: usize, s: &mut [u16], p: &mut [u8]| {
        BUFFERS.with(|b| match b.try_borrow_mut() {
            Ok(mut b) => work(k, s, p, &mut b),
            // A worker runs one piece at a time; this is only for safety's sake.
            Err(_) => work(k, s, p, &mut PieceBuffers::default()),
        })
    };
    let pieces = scales.par_chunks_mut(piece / g).enumerate();
    let results: Vec<Result<(), PieceError>> = if scales_only {
        pieces.map(|(k, s)| work(k, s, &mut [])).collect()
    } else {
        packed.resize(n / 2, 0);
        pieces
            .zip(packed.par_chunks_mut(piece / 2))
            .map(|((k, s), p)| work(k, s, p))
            .collect()
    };
    results.into_iter().collect()
}

thread_local! {
    /// This thread's [`PieceBuffers`].
    static BUFFERS: std::cell::RefCell<PieceBuffers> = std::cell::RefCell::default();
}

/// One worker's buffers for its pieces, reused from piece to piece.
#[derive(Default)]
struct PieceBuffers {
    raw: Vec<u8>,
    scales: Vec<u16>,
    packed: Vec<u8>,
    vals: Vec<f32>,
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
pub(super) fn dequantize_pair(
    files: &Files<'_>,
    t: &OutTensor,
    (q, s, group): (usize, usize, u64),
    target: Dtype,
    mut out: Out<'_>,
    tick: &mut dyn FnMut(u64),
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
        out.write(&enc)?;
        at += n as u64;
        tick((n / 2 + groups * 2) as u64);
    }
    out.finish()
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
pub(super) fn encode_error(tensor: &str, target: Dtype, at: u64, e: &EncodeError) -> ModelError {
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
