//! The MX pass over one pair: dequantize its blocks to the target dtype, whole blocks at
//! a time, straight through or with the last two axes swapped (gpt-oss experts, which
//! transformers uses as `[E, in, out]`).
//!
//! Invariants: memory is a few buffers of at most [`CHUNK_ELEMS`] values whatever the
//! tensor; every output byte is written once, inside the tensor's planned place; a NaN
//! scale (255) or a value the target cannot hold is an error naming the tensor.

use std::os::unix::fs::FileExt;

use super::super::mx::{dequantize, DequantFailure, BLOCK};
use super::super::ModelError;
use super::out::{write_err, Out};
use super::plan::{MxDequant, OutTensor};
use super::quant::encode_error;
use super::read::Files;
use super::CHUNK_ELEMS;
use crate::safetensors::float::encode_f32;
use crate::safetensors::Dtype;
use crate::text::quote;

/// Write the MX pair `m` as output tensor `t` of dtype `target`.
pub(super) fn dequantize_mx(
    files: &Files<'_>,
    t: &OutTensor,
    m: &MxDequant,
    target: Dtype,
    mut out: Out<'_>,
    tick: &mut dyn FnMut(u64),
) -> Result<(), ModelError> {
    let n = m.shape.last().copied().unwrap_or(0);
    let rows = if m.transposed {
        m.shape.iter().rev().nth(1).copied().unwrap_or(1)
    } else {
        1
    };
    let numel = crate::safetensors::dtype::numel(&m.shape).unwrap_or(0);
    let size = target.size().unwrap_or(4) as u64;
    // Whole rows of [.., rows, n] per step (at least one), so a step is whole blocks.
    let row_step = (CHUNK_ELEMS as u64 / n.max(1)).max(1);
    let mut bufs = Bufs::default();
    let mut at = 0u64;
    while at < numel {
        // A transposed step stays inside one matrix: its rows' columns are contiguous.
        let (row, matrix_elems) = (at / n.max(1) % rows.max(1), rows * n);
        let len = if m.transposed {
            row_step.min(rows - row) * n
        } else {
            (numel - at).min(row_step * n)
        };
        bufs.decode(files, t, m, (at, len), target)?;
        if m.transposed {
            // Row r of matrix k, element j, lands at [k, j, r].
            let k = at / matrix_elems.max(1);
            let band = (row, len / n.max(1), rows, n);
            write_columns(&mut out, &bufs.enc, k * matrix_elems, band, size)?;
        } else {
            out.write(&bufs.enc)?;
        }
        at += len;
        tick(len / 2);
    }
    if m.transposed {
        out.at = out.end;
    }
    out.finish()
}

/// One step's buffers.
#[derive(Default)]
struct Bufs {
    elems: Vec<u8>,
    scales: Vec<u8>,
    vals: Vec<f32>,
    enc: Vec<u8>,
}

impl Bufs {
    /// Read and dequantize `len` values from flat index `at` (whole blocks) into
    /// `self.enc`, encoded to `target`.
    fn decode(
        &mut self,
        files: &Files<'_>,
        t: &OutTensor,
        m: &MxDequant,
        (at, len): (u64, u64),
        target: Dtype,
    ) -> Result<(), ModelError> {
        let block = BLOCK as u64;
        let per = m.fmt.block_bytes() as u64;
        let (first, blocks) = (at / block, len / block);
        self.elems.resize((blocks * per) as usize, 0);
        files.read(m.elems, first * per, &mut self.elems)?;
        self.scales.resize(blocks as usize, 0);
        files.read(m.scales, first, &mut self.scales)?;
        self.vals.clear();
        dequantize(&self.elems, &self.scales, m.fmt, &mut self.vals).map_err(|f| {
            let (b, what) = match f {
                DequantFailure::NanScale { block } => (block, "is 255, the E8M0 NaN"),
                DequantFailure::Overflow { block } => (block, "gives a value beyond f32"),
            };
            ModelError::Invalid {
                first: format!(
                    "mx (scales): tensor {}: scale {} {what}; scales must be numbers",
                    quote(&t.name),
                    first + b as u64
                ),
                more: 0,
            }
        })?;
        self.enc.clear();
        encode_f32(target, &self.vals, &mut self.enc)
            .map_err(|e| encode_error(&t.name, target, at, &e))
    }
}

/// Write `band` rows (from row `row`) of an `[rows, n]` matrix whose output starts at
/// element `base`, each of `size` bytes in `enc`, transposed into `[n, rows]`: for each
/// column j, the band's values are contiguous at `[j, row..row + band]`.
fn write_columns(
    out: &mut Out<'_>,
    enc: &[u8],
    base: u64,
    (row, band, rows, n): (u64, u64, u64, u64),
    size: u64,
) -> Result<(), ModelError> {
    let s = size as usize;
    let mut col = Vec::with_capacity((band * size) as usize);
    for j in 0..n {
        col.clear();
        for r in 0..band {
            let from = ((r * n + j) * size) as usize;
            col.extend_from_slice(enc.get(from..from + s).unwrap_or_default());
        }
        let pos = out.at + (base + j * rows + row) * size;
        if pos + col.len() as u64 > out.end {
            return Err(ModelError::Usage {
                detail: "a transposed MX column reached past its tensor".to_string(),
            });
        }
        out.to
            .file
            .write_all_at(&col, pos)
            .map_err(|source| write_err(out.to.path, source))?;
    }
    Ok(())
}
