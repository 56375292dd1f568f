//! Read plans for part of one tensor (`get_slice(name)[...]`): an index per dimension
//! (an integer, a range with a step, or an ellipsis standing for the dimensions not
//! named) becomes the output shape and the byte runs of the stored tensor that hold
//! it, in output order, so that a reader touches only those bytes.
//!
//! Invariants: every index is checked against its dimension before any byte is read
//! (the words are the `safetensors` package's, so that its callers see the same
//! messages); every product and offset is checked arithmetic; a run never reaches past
//! the tensor's bytes; packed sub-byte dtypes (F4, F6) are refused, since their
//! elements do not start on byte boundaries.

use super::dtype::Dtype;
use crate::failure::{Failure, FailureKind};

/// The most dimensions a slice may name: the reader rules bound a shape by the header,
/// and numpy's and torch's arrays hold 64 at most.
pub const MAX_SLICE_DIMS: usize = 64;

/// The index of one dimension, as Python's `__getitem__` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Index {
    /// One position (negative counts from the end); the dimension is dropped.
    At(i64),
    /// `start:stop:step` (`None` for an omitted bound); the dimension is kept.
    Range {
        /// First position (negative counts from the end); `None` is 0.
        start: Option<i64>,
        /// One past the last position (negative counts from the end); `None` is the
        /// dimension's size. A stop past the size is an error, as in the package.
        stop: Option<i64>,
        /// Distance between positions, at least 1; `None` is 1.
        step: Option<i64>,
    },
    /// `...`: as many full ranges as the dimensions the other indices do not name.
    Ellipsis,
}

/// Why a slice cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    /// A negative index beyond the start of its dimension.
    #[error("Invalid index {index} for dimension {dim} of size {size}")]
    Negative {
        /// The index as given.
        index: i64,
        /// The dimension (0 is the outermost).
        dim: usize,
        /// The dimension's size.
        size: u64,
    },
    /// An index at or past the end of its dimension.
    #[error("index {index} out of bounds for tensor dimension #{dim} of size {size}")]
    OutOfBounds {
        /// The position (for a range: its last one, `stop - 1`).
        index: u64,
        /// The dimension.
        dim: usize,
        /// The dimension's size.
        size: u64,
    },
    /// More indices than the tensor has dimensions.
    #[error("{given} indices for a tensor of {ndim} dimensions")]
    TooMany {
        /// Indices given (an ellipsis not counted).
        given: usize,
        /// The tensor's dimensions.
        ndim: usize,
    },
    /// Two ellipses.
    #[error("an index can only have a single ellipsis ('...')")]
    TwoEllipses,
    /// A step of zero or below.
    #[error("slice step {step} in dimension {dim} must be at least 1")]
    Step {
        /// The step given.
        step: i64,
        /// The dimension.
        dim: usize,
    },
    /// A packed sub-byte dtype.
    #[error("{dtype} packs several elements per byte and cannot be sliced; read the tensor whole")]
    SubByte {
        /// The dtype.
        dtype: Dtype,
    },
    /// A size or offset that overflows, or bytes shorter than the shape says.
    #[error("the slice does not fit the tensor's {len} bytes")]
    Size {
        /// The bytes given.
        len: usize,
    },
}

impl Failure for SliceError {
    fn kind(&self) -> FailureKind {
        FailureKind::Invalid
    }
}

/// One dimension of a plan: the first position taken, how many, and the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Taken {
    start: u64,
    count: u64,
    step: u64,
    /// Bytes between consecutive positions of this dimension in the stored tensor.
    stride: u64,
}

/// What to read for one slice: the output shape and the stored byte runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePlan {
    /// The shape of the result (integer indices dropped).
    pub shape: Vec<u64>,
    /// The dimensions iterated run by run, outermost first.
    outer: Vec<Taken>,
    /// Offset of the first run within the tensor's bytes, beyond the outer dimensions'.
    base: u64,
    /// Bytes of each run (the inner dimensions, taken whole or as one range).
    block: u64,
    /// Bytes of the result.
    total: u64,
}

/// `index` of a dimension of `size`, negative counting from the end.
fn position(index: i64, dim: usize, size: u64) -> Result<u64, SliceError> {
    let at = if index < 0 {
        size.checked_sub(index.unsigned_abs())
            .ok_or(SliceError::Negative { index, dim, size })?
    } else {
        index.unsigned_abs()
    };
    if at >= size {
        return Err(SliceError::OutOfBounds {
            index: at,
            dim,
            size,
        });
    }
    Ok(at)
}

/// A range bound: negative counts from the end and stops at 0; `None` is `default`.
fn bound(value: Option<i64>, size: u64, default: u64) -> u64 {
    match value {
        None => default,
        Some(v) if v < 0 => size.saturating_sub(v.unsigned_abs()),
        Some(v) => v.unsigned_abs(),
    }
}

/// One index against its dimension: (start, count, step, kept).
fn take(index: Index, dim: usize, size: u64) -> Result<(u64, u64, u64, bool), SliceError> {
    match index {
        Index::At(i) => Ok((position(i, dim, size)?, 1, 1, false)),
        Index::Range { start, stop, step } => {
            let step = step.unwrap_or(1);
            if step < 1 {
                return Err(SliceError::Step { step, dim });
            }
            let step = step.unsigned_abs();
            let stop = bound(stop, size, size);
            if stop > size {
                let index = stop.saturating_sub(1);
                return Err(SliceError::OutOfBounds { index, dim, size });
            }
            let start = bound(start, size, 0).min(stop);
            let count = (stop - start).div_ceil(step);
            Ok((start, count, step, true))
        }
        // Expanded before this point.
        Index::Ellipsis => Ok((0, size, 1, true)),
    }
}

/// The indices with the ellipsis (or the missing trailing dimensions) as full ranges.
fn expand(indices: &[Index], ndim: usize) -> Result<Vec<Index>, SliceError> {
    let full = Index::Range {
        start: None,
        stop: None,
        step: None,
    };
    let named = indices.iter().filter(|i| **i != Index::Ellipsis).count();
    if indices.iter().filter(|i| **i == Index::Ellipsis).count() > 1 {
        return Err(SliceError::TwoEllipses);
    }
    if named > ndim || indices.len() > MAX_SLICE_DIMS {
        return Err(SliceError::TooMany { given: named, ndim });
    }
    let missing = ndim - named;
    let mut out = Vec::with_capacity(ndim);
    let mut expanded = false;
    for i in indices {
        if *i == Index::Ellipsis {
            out.extend(std::iter::repeat_n(full, missing));
            expanded = true;
        } else {
            out.push(*i);
        }
    }
    if !expanded {
        out.extend(std::iter::repeat_n(full, missing));
    }
    Ok(out)
}

impl SlicePlan {
    /// The plan for `indices` of a tensor of `dtype` and `shape`.
    pub fn new(dtype: Dtype, shape: &[u64], indices: &[Index]) -> Result<Self, SliceError> {
        let elem = dtype.size().ok_or(SliceError::SubByte { dtype })? as u64;
        let overflow = SliceError::Size { len: 0 };
        let full = expand(indices, shape.len())?;
        // Byte strides of the stored tensor, innermost last.
        let mut strides = vec![0u64; shape.len()];
        let mut acc = elem;
        for (d, n) in shape.iter().enumerate().rev() {
            if let Some(s) = strides.get_mut(d) {
                *s = acc;
            }
            acc = acc.checked_mul(*n).ok_or_else(|| overflow.clone())?;
        }
        let mut taken = Vec::with_capacity(shape.len());
        let mut out_shape = Vec::with_capacity(shape.len());
        for (d, (index, size)) in full.iter().zip(shape).enumerate() {
            let (start, count, step, kept) = take(*index, d, *size)?;
            if kept {
                out_shape.push(count);
            }
            let stride = strides.get(d).copied().unwrap_or(elem);
            taken.push(Taken {
                start,
                count,
                step,
                stride,
            });
        }
        // The inner dimensions form one contiguous block while each is taken with step
        // 1 and its stride is the block so far (every dimension inside it was whole);
        // the first that is not whole still joins, and ends the block.
        let mut block = elem;
        let mut base = 0u64;
        while let Some(t) = taken.last().copied() {
            if t.step != 1 || t.stride != block {
                break;
            }
            taken.pop();
            let offset = t
                .start
                .checked_mul(t.stride)
                .ok_or_else(|| overflow.clone())?;
            base = base.checked_add(offset).ok_or_else(|| overflow.clone())?;
            block = t
                .count
                .checked_mul(t.stride)
                .ok_or_else(|| overflow.clone())?;
        }
        let mut total = block;
        for t in &taken {
            total = total.checked_mul(t.count).ok_or_else(|| overflow.clone())?;
        }
        Ok(SlicePlan {
            shape: out_shape,
            outer: taken,
            base,
            block,
            total,
        })
    }

    /// Bytes of the result.
    pub fn byte_len(&self) -> u64 {
        self.total
    }

    /// Calls `f(offset, len)` for each run of the stored tensor, in output order
    /// (offsets from the tensor's first byte). Nothing when the result is empty.
    pub fn for_each_run(&self, mut f: impl FnMut(u64, u64)) {
        if self.total == 0 {
            return;
        }
        let mut counter = vec![0u64; self.outer.len()];
        loop {
            let mut offset = self.base;
            for (t, j) in self.outer.iter().zip(&counter) {
                // Bounded by the tensor's byte size, which the plan checked.
                offset += (t.start + j * t.step) * t.stride;
            }
            f(offset, self.block);
            // The odometer: the innermost outer dimension turns fastest.
            let mut d = self.outer.len();
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                if let (Some(c), Some(t)) = (counter.get_mut(d), self.outer.get(d)) {
                    *c += 1;
                    if *c < t.count {
                        break;
                    }
                    *c = 0;
                }
            }
        }
    }

    /// The bytes of the slice, gathered from the tensor's stored bytes `src` into a
    /// new buffer (only the runs' bytes of `src` are read).
    pub fn gather(&self, src: &[u8]) -> Result<Vec<u8>, SliceError> {
        let short = || SliceError::Size { len: src.len() };
        let total = usize::try_from(self.total).map_err(|_| short())?;
        let mut out = Vec::new();
        out.try_reserve_exact(total).map_err(|_| short())?;
        let mut bad = false;
        self.for_each_run(|offset, len| {
            let run = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(len).ok())
                .and_then(|(o, l)| src.get(o..o.checked_add(l)?));
            match run {
                Some(bytes) if !bad => out.extend_from_slice(bytes),
                _ => bad = true,
            }
        });
        if bad {
            return Err(short());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
