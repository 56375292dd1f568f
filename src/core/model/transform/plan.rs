//! Planning a shard of quantize or dequantize: every output tensor with its name, dtype,
//! shape and how its bytes are produced, and the counts the report and index need,
//! all known before any byte is written.
//!
//! Invariant: a plan is checked before it is written (a tensor that cannot be
//! quantized fails here), so a shard's writer only streams what the plan says.

use std::collections::BTreeMap;

use super::super::int4::{quant_name, QUANT_KEY, QWEIGHT_SUFFIX, SCALES_SUFFIX};
use super::super::mx::MxFormat;
use super::super::mx_pairs::transposed;
use super::super::{Logical, Model, ModelError, Storage};
use super::{Op, ShardResult};
use crate::safetensors::write::Layout;
use crate::safetensors::{Dtype, TensorInfo};

/// One output tensor and how its bytes are produced.
pub(super) enum Plan {
    /// Copy entry `i`'s bytes.
    Copy(usize),
    /// The scales of quantizing a source tensor.
    Scales(Quant),
    /// The packed values of quantizing a source tensor.
    Qweight(Quant),
    /// Dequantize the pair (qweight entry, scales entry, group) to the tensor's dtype
    /// (the target).
    Dequant(usize, usize, u64),
    /// Dequantize the MX pair to the tensor's dtype.
    MxDequant(MxDequant),
}

/// An MX pair to dequantize: its entries, its format and its logical `[..., n]`.
#[derive(Clone, Debug)]
pub(super) struct MxDequant {
    pub(super) elems: usize,
    pub(super) scales: usize,
    pub(super) fmt: MxFormat,
    /// The logical shape as stored (`[..., n]`).
    pub(super) shape: Vec<u64>,
    /// Whether the output swaps the last two axes (gpt-oss experts).
    pub(super) transposed: bool,
}

/// A source tensor to quantize, with what planning checked: a 2-D F32, F16 or BF16
/// tensor whose columns are a multiple of the group.
#[derive(Clone, Copy)]
pub(super) struct Quant {
    /// Its entry.
    pub(super) entry: usize,
    /// Group size G.
    pub(super) group: u64,
    /// Columns (the second dimension).
    pub(super) cols: u64,
    /// Bytes per source element.
    pub(super) size: usize,
}

/// An output tensor of a shard and its plan.
pub(super) struct OutTensor {
    pub(super) name: String,
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<u64>,
    pub(super) plan: Plan,
}

/// The counts of a planned shard, known before any byte is written.
pub(super) fn planned_result(tensors: &[OutTensor], layout: &Layout) -> ShardResult {
    ShardResult {
        transformed: tensors
            .iter()
            .filter(|t| {
                matches!(
                    t.plan,
                    Plan::Qweight(_) | Plan::Dequant(..) | Plan::MxDequant(_)
                )
            })
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

/// The output tensors of shard `si` and its metadata.
pub(super) fn plan_shard(
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

/// Dequantize: each int4 or MX pair whose first half is in shard `si` becomes one
/// tensor of `target`; every entry of the shard that is not half of a pair is copied.
fn plan_dequantize(model: &Model, si: usize, target: Dtype) -> Vec<OutTensor> {
    let here = |i: usize| model.entry(i).is_some_and(|e| e.shard == si);
    let mut out = Vec::new();
    let mut paired = vec![false; model.entries.len()];
    for l in &model.logical {
        let Some(halves) = l.storage.pair() else {
            continue;
        };
        for k in halves {
            if let Some(p) = paired.get_mut(k) {
                *p = true;
            }
        }
        if here(l.storage.first_entry()) {
            out.extend(dequant_tensor(l, target));
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

/// The output tensor of dequantizing the pair `l` to `target`.
fn dequant_tensor(l: &Logical, target: Dtype) -> Option<OutTensor> {
    let (shape, plan) = match l.storage {
        Storage::Plain(_) => return None,
        Storage::Int4 {
            qweight,
            scales,
            group,
        } => (l.shape.clone(), Plan::Dequant(qweight, scales, group)),
        Storage::Mx { elems, scales, fmt } => {
            let t = transposed(fmt, l.shape.len());
            let mut shape = l.shape.clone();
            if t {
                let r = shape.len();
                shape.swap(r - 2, r - 1);
            }
            let m = MxDequant {
                elems,
                scales,
                fmt,
                shape: l.shape.clone(),
                transposed: t,
            };
            (shape, Plan::MxDequant(m))
        }
    };
    Some(OutTensor {
        name: l.name.clone(),
        dtype: target,
        shape,
        plan,
    })
}
