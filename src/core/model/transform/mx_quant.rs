//! The MX quantizing pass over one float tensor: its E8M0 scales and its elements (E2M1
//! packed two a byte, or E4M3), both from one pass over the source, whole blocks of 32
//! at a time; gpt-oss experts (MXFP4 of rank >= 3, used `[.., in, out]` by transformers)
//! are stored with their last two axes swapped, `[.., out, in]`, so that blocks run
//! along `in` as gpt-oss ships them.
//!
//! Invariants: memory is a few buffers of at most [`CHUNK_ELEMS`] values whatever the
//! tensor; the output is written in order, each byte once, inside its planned place; a
//! NaN or infinite weight is an error naming the tensor, its row and its column (of
//! the source), never a scale.

use super::super::mx::{quantize, BLOCK};
use super::super::ModelError;
use super::out::QuantOuts;
use super::plan::MxQuant;
use super::read::Files;
use super::CHUNK_ELEMS;
use crate::safetensors::float::decode_f32;

/// Write the scales and the elements of quantizing `q` to `outs`.
pub(super) fn quantize_mx(
    files: &Files<'_>,
    name: &str,
    q: &MxQuant,
    outs: QuantOuts<'_>,
    tick: &mut dyn FnMut(u64),
) -> Result<(), ModelError> {
    let mut step = Step {
        files,
        name,
        q,
        outs,
        raw: Vec::new(),
        vals: Vec::new(),
        scales: Vec::new(),
        elems: Vec::new(),
    };
    let numel = crate::safetensors::dtype::numel(&q.shape).unwrap_or(0);
    let cols = q.shape.last().copied().unwrap_or(1).max(1);
    if q.transposed {
        // Source [.., rows, cols]; stored row c is source column c, `rows` long.
        let rows = q.shape.iter().rev().nth(1).copied().unwrap_or(1).max(1);
        let band = (CHUNK_ELEMS as u64 / rows).max(1);
        let matrices = numel / (rows * cols);
        for k in 0..matrices {
            let mut c0 = 0;
            while c0 < cols {
                let width = band.min(cols - c0);
                step.columns(k, (rows, cols), (c0, width))?;
                tick(width * rows * q.size as u64);
                c0 += width;
            }
        }
    } else {
        // Whole blocks per step: CHUNK_ELEMS is a multiple of BLOCK, and so is numel.
        let mut at = 0u64;
        while at < numel {
            let len = (numel - at).min(CHUNK_ELEMS as u64);
            step.straight(at, len, cols)?;
            tick(len * q.size as u64);
            at += len;
        }
    }
    let QuantOuts { scales, packed } = step.outs;
    for o in [scales, packed].into_iter().flatten() {
        o.finish()?;
    }
    Ok(())
}

/// The state of one tensor's pass: its source, its outputs and the step buffers.
struct Step<'a, 's> {
    files: &'a Files<'a>,
    name: &'a str,
    q: &'a MxQuant,
    outs: QuantOuts<'s>,
    raw: Vec<u8>,
    vals: Vec<f32>,
    scales: Vec<u8>,
    elems: Vec<u8>,
}

impl Step<'_, '_> {
    /// `len` values from flat index `at`, blocks along the last axis (`cols` long).
    fn straight(&mut self, at: u64, len: u64, cols: u64) -> Result<(), ModelError> {
        let size = self.q.size as u64;
        self.raw.resize((len * size) as usize, 0);
        self.files.read(self.q.entry, at * size, &mut self.raw)?;
        self.vals.clear();
        decode_f32(self.q.dtype, &self.raw, &mut self.vals);
        self.emit(|i| {
            let flat = at + i as u64;
            (flat / cols, flat % cols)
        })
    }

    /// Columns `c0..c0 + width` of matrix `k` (`rows` x `cols` in the source), each
    /// column one stored row: read row by row, gathered column-major.
    fn columns(
        &mut self,
        k: u64,
        (rows, cols): (u64, u64),
        (c0, width): (u64, u64),
    ) -> Result<(), ModelError> {
        let size = self.q.size as u64;
        let (w, r) = (width as usize, rows as usize);
        let mut gathered = std::mem::take(&mut self.vals);
        gathered.clear();
        gathered.resize(w * r, 0.0);
        let mut row_vals = Vec::with_capacity(w);
        self.raw.resize(w * self.q.size, 0);
        for i in 0..rows {
            let at = ((k * rows + i) * cols + c0) * size;
            self.files.read(self.q.entry, at, &mut self.raw)?;
            row_vals.clear();
            decode_f32(self.q.dtype, &self.raw, &mut row_vals);
            for (j, &v) in row_vals.iter().enumerate() {
                if let Some(slot) = gathered.get_mut(j * r + i as usize) {
                    *slot = v;
                }
            }
        }
        self.vals = gathered;
        // Value v of the band is source row k * rows + v % rows, column c0 + v / rows.
        self.emit(|v| {
            let v = v as u64;
            (k * rows + v % rows, c0 + v / rows)
        })
    }

    /// Quantize `self.vals` (whole blocks) and write both halves; `place(i)` is the
    /// source (row, column) of value i, for the error of a weight that is not finite.
    fn emit(&mut self, place: impl Fn(usize) -> (u64, u64)) -> Result<(), ModelError> {
        debug_assert_eq!(self.vals.len() % BLOCK, 0);
        self.scales.clear();
        self.elems.clear();
        quantize(&self.vals, self.q.fmt, &mut self.scales, &mut self.elems).map_err(|i| {
            let (row, col) = place(i);
            ModelError::NonFinite {
                tensor: self.name.to_string(),
                row,
                col,
                value: self.vals.get(i).copied().unwrap_or(f32::NAN),
            }
        })?;
        if let Some(o) = self.outs.scales.as_mut() {
            o.write(&self.scales)?;
        }
        if let Some(o) = self.outs.packed.as_mut() {
            o.write(&self.elems)?;
        }
        Ok(())
    }
}
