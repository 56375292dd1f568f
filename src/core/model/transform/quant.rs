//! The int4 passes over one tensor: quantize a float tensor into its scales or its
//! packed values, and dequantize a pair back to floats, whole groups at a time through
//! the row kernels of [`int4`](super::super::int4).
//!
//! Invariants: each chunk holds whole groups, so a chunk's result does not depend on
//! where chunks begin; a scale the reader rule forbids (not finite, or negative) is an
//! error, never dequantized; a value the target cannot hold names its tensor and index.

use super::super::int4::{dequantize_row, quantize_row, row_scales, QuantFailure, SCALES_SUFFIX};
use super::super::int4_kernel::quantize_raw;
use super::super::{Model, ModelError};
use super::plan::{OutTensor, Quant};
use super::read::{entry, Files};
use super::write::Sink;
use super::{shard_err, CHUNK_ELEMS};
use crate::safetensors::float::{decode_f32, encode_f32, EncodeError, EncodeFailure};
use crate::safetensors::{Dtype, SafetensorsError};

/// Write the scales (`is_scales`) or the packed values of quantizing `q`, whole
/// groups at a time.
pub(super) fn quantize_entry(
    model: &Model,
    files: &mut Files<'_>,
    q: Quant,
    is_scales: bool,
    sink: &mut Sink<'_>,
) -> Result<(), ModelError> {
    let info = &entry(model, q.entry)?.info;
    if is_scales {
        if let Some((e, g, bytes)) = files.scales.take() {
            if e == q.entry && g == q.group {
                sink.write(&bytes)?;
                (sink.tick)(info.byte_len() / 2);
                return Ok(());
            }
        }
    }
    let g = q.group as usize;
    let size = q.size;
    let numel = info.numel();
    let step = (CHUNK_ELEMS / g).max(1) * g;
    // The scales of the qweight pass are kept for the scales pass when they are small
    // (a 64th of a BF16 source at group 128): beyond the limit they are recomputed.
    let keep = !is_scales && numel / q.group.max(1) * 2 <= SCALES_KEPT_MAX;
    let mut kept = Vec::new();
    let (mut scales, mut packed) = (Vec::new(), Vec::new());
    // The bytes of the chunk before, written while this one is quantized.
    let (mut bytes, mut pending) = (Vec::new(), Vec::new());
    let len_at = |at: u64| (numel - at).min(step as u64) as usize;
    let mut at = 0u64;
    // The source is mapped a chunk at a time (no copy of it), the next chunk's window
    // mapped and populated while this one is quantized.
    let mut window = if at < numel {
        Some(files.window(q.entry, 0, len_at(at) * size)?)
    } else {
        None
    };
    // The window quantized last, unmapped by the I/O job of the next step rather than
    // between steps (an unmap of pages both threads touched waits on the other CPU).
    let mut spent = None;
    while let Some(this) = window.take() {
        let n = len_at(at);
        let after = at + n as u64;
        let files_ref = &*files;
        let out = &mut sink.out;
        // Three jobs at once: the next chunk mapped, the chunk before written, this
        // chunk quantized (in pieces, which the two threads share once their I/O is
        // done). Errors keep the order of a serial run: the write, the work, the read.
        let old = spent.take();
        let io = || {
            drop(old);
            let wrote = out.write(&pending);
            if after >= numel {
                return (wrote, Ok(None));
            }
            let next = files_ref.window(q.entry, after * size as u64, len_at(after) * size);
            (wrote, next.map(Some))
        };
        let raw = this.bytes();
        scales.clear();
        packed.clear();
        let (done, (wrote, read)) = rayon::join(
            || {
                quantize_pieces(
                    raw,
                    (info.dtype, size, g),
                    is_scales,
                    &mut scales,
                    &mut packed,
                )
            },
            io,
        );
        wrote?;
        done.map_err(|(col, f)| quant_error(&info.name, q, at + col as u64, f))?;
        window = read?;
        if is_scales {
            bytes.clear();
            scale_bytes(&scales, &mut bytes);
        } else {
            std::mem::swap(&mut bytes, &mut packed);
            if keep {
                scale_bytes(&scales, &mut kept);
            }
        }
        std::mem::swap(&mut pending, &mut bytes);
        spent = Some(this);
        at = after;
        // Each source tensor is read twice (scales, then values): count half.
        (sink.tick)((n * size / 2) as u64);
    }
    sink.write(&pending)?;
    if keep {
        files.scales = Some((q.entry, q.group, kept));
    }
    Ok(())
}

/// Append the little-endian bytes of the scale bits `scales` to `bytes`.
fn scale_bytes(scales: &[u16], bytes: &mut Vec<u8>) {
    bytes.extend(scales.iter().flat_map(|s| s.to_le_bytes()));
}

/// The most scales bytes the qweight pass keeps for the scales pass (larger scales
/// tensors are quantized again, so memory stays bounded whatever the tensor).
const SCALES_KEPT_MAX: u64 = 16 << 20;

/// Weights of one parallel piece of [`quantize_pieces`] (rounded down to whole groups).
const PIECE_ELEMS: usize = 64 << 10;

/// The scales (and, unless `scales_only`, the packed values) of the raw weights `raw`
/// of `dtype` (`size` bytes each), whole groups of `g`, into `scales` and `packed`
/// (resized to fit): fixed pieces decoded and quantized in parallel, each into its own
/// place of the outputs, so the bytes never depend on the thread count and no thread
/// gathers the pieces afterwards; the error is the one of the lowest column.
fn quantize_pieces(
    raw: &[u8],
    (dtype, size, g): (Dtype, usize, usize),
    scales_only: bool,
    scales: &mut Vec<u16>,
    packed: &mut Vec<u8>,
) -> Result<(), (usize, QuantFailure)> {
    use rayon::prelude::*;
    let size = size.max(1);
    let g = g.max(2);
    let piece = (PIECE_ELEMS / g).max(1) * g;
    let n = raw.len() / size;
    scales.clear();
    scales.resize(n / g, 0);
    packed.clear();
    let work = |k: usize, bytes: &[u8], s: &mut [u16], p: &mut [u8], b: &mut PieceBuffers| {
        b.scales.clear();
        b.packed.clear();
        // The scales pass needs no values: only the qweight pass packs them.
        let (bs, bp) = (&mut b.scales, &mut b.packed);
        let done = match quantize_raw(bytes, dtype, g, !scales_only, bs, bp) {
            Some(done) => done,
            None => {
                b.vals.clear();
                decode_f32(dtype, bytes, &mut b.vals);
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
        done.map_err(|(col, f)| (col + k * piece, f))
    };
    let pieces = raw
        .par_chunks(piece * size)
        .zip(scales.par_chunks_mut(piece / g));
    let results: Vec<Result<(), (usize, QuantFailure)>> = if scales_only {
        pieces
            .enumerate()
            .map_init(PieceBuffers::default, |b, (k, (bytes, s))| {
                work(k, bytes, s, &mut [], b)
            })
            .collect()
    } else {
        packed.resize(n / 2, 0);
        pieces
            .zip(packed.par_chunks_mut(piece / 2))
            .enumerate()
            .map_init(PieceBuffers::default, |b, (k, ((bytes, s), p))| {
                work(k, bytes, s, p, b)
            })
            .collect()
    };
    results.into_iter().collect()
}

/// One worker's buffers for its pieces, reused from piece to piece.
#[derive(Default)]
struct PieceBuffers {
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
