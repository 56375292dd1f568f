//! `diff`: what differs between two safetensors files: tensors only in one, dtype and
//! shape changes, metadata changes, and for tensors in both whether their bytes are
//! equal, else the largest absolute difference of their values.
//!
//! Invariant: two files are identical for `diff` exactly when every list of the report
//! is empty; values are compared chunk by chunk, in fixed memory.

use std::collections::{BTreeMap, BTreeSet};

use super::dtype::Dtype;
use super::float::decode_f64;
use super::header::TensorInfo;
use super::stats::SCAN_ELEMS;
use super::MappedFile;

/// A tensor present in both files with a different dtype or shape.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Changed {
    /// Name.
    pub name: String,
    /// Dtype in A.
    pub dtype_a: Dtype,
    /// Dtype in B.
    pub dtype_b: Dtype,
    /// Shape in A.
    pub shape_a: Vec<u64>,
    /// Shape in B.
    pub shape_b: Vec<u64>,
    /// Value comparison when the element counts match and both decode.
    pub values: Option<ValueDiff>,
}

/// How the values of two tensors differ.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ValueDiff {
    /// Elements whose values differ (NaN equals NaN here).
    pub differing: u64,
    /// Elements compared.
    pub count: u64,
    /// Largest |a - b| over elements where both are numbers (infinite when one side is
    /// infinite); None when no such pair differs.
    pub max_abs_diff: Option<f64>,
    /// Elements where exactly one side is NaN.
    pub nan_mismatch: u64,
}

/// A tensor with the same dtype and shape in both files whose bytes differ.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Different {
    /// Name.
    pub name: String,
    /// Dtype.
    pub dtype: Dtype,
    /// Value comparison (None for dtypes that cannot be decoded).
    pub values: Option<ValueDiff>,
}

/// A metadata key whose value differs (None: absent on that side).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MetaChange {
    /// Key.
    pub key: String,
    /// Value in A.
    pub a: Option<String>,
    /// Value in B.
    pub b: Option<String>,
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct DiffReport {
    /// Tensors only in A.
    pub only_in_a: Vec<String>,
    /// Tensors only in B.
    pub only_in_b: Vec<String>,
    /// Tensors whose dtype or shape changed.
    pub changed: Vec<Changed>,
    /// Tensors with the same dtype and shape but different bytes.
    pub different: Vec<Different>,
    /// Tensors bitwise equal in both.
    pub equal: Vec<String>,
    /// Metadata differences.
    pub metadata: Vec<MetaChange>,
}

impl DiffReport {
    /// True when nothing differs.
    pub fn identical(&self) -> bool {
        self.only_in_a.is_empty()
            && self.only_in_b.is_empty()
            && self.changed.is_empty()
            && self.different.is_empty()
            && self.metadata.is_empty()
    }
}

/// One side of a comparison: tensors by name with their bytes, and the metadata. A
/// side may gather the tensors of several files (a sharded model).
#[derive(Debug, Default)]
pub struct Side<'a> {
    /// Tensor name to its info and bytes.
    pub tensors: BTreeMap<&'a str, (&'a TensorInfo, &'a [u8])>,
    /// The metadata.
    pub metadata: BTreeMap<String, String>,
}

impl<'a> Side<'a> {
    /// The side of one mapped file.
    pub fn of_file(f: &'a MappedFile) -> Side<'a> {
        let mut side = Side {
            metadata: f.header().metadata.clone(),
            ..Side::default()
        };
        side.add_file(f);
        side
    }

    /// Add every tensor of `f` (a later file's tensor of the same name replaces an
    /// earlier one; callers pass files whose names are disjoint).
    pub fn add_file(&mut self, f: &'a MappedFile) {
        for t in f.header().tensors() {
            if let Some(bytes) = f.info_bytes(t) {
                self.tensors.insert(t.name.as_str(), (t, bytes));
            }
        }
    }
}

/// Compare two mapped files.
pub fn diff(a: &MappedFile, b: &MappedFile) -> DiffReport {
    diff_sides(&Side::of_file(a), &Side::of_file(b))
}

/// Compare two sides tensor by tensor, whatever files they came from.
pub fn diff_sides(a: &Side<'_>, b: &Side<'_>) -> DiffReport {
    let names_a: BTreeSet<&str> = a.tensors.keys().copied().collect();
    let names_b: BTreeSet<&str> = b.tensors.keys().copied().collect();
    let mut report = DiffReport {
        only_in_a: names_a
            .difference(&names_b)
            .map(|s| s.to_string())
            .collect(),
        only_in_b: names_b
            .difference(&names_a)
            .map(|s| s.to_string())
            .collect(),
        ..DiffReport::default()
    };
    for name in names_a.intersection(&names_b) {
        let (Some(&(ta, ba)), Some(&(tb, bb))) = (a.tensors.get(name), b.tensors.get(name)) else {
            continue;
        };
        if ta.dtype != tb.dtype || ta.shape != tb.shape {
            let values = (ta.numel() == tb.numel())
                .then(|| compare_values(ta, ba, tb, bb))
                .flatten();
            report.changed.push(Changed {
                name: name.to_string(),
                dtype_a: ta.dtype,
                dtype_b: tb.dtype,
                shape_a: ta.shape.clone(),
                shape_b: tb.shape.clone(),
                values,
            });
        } else if ba == bb {
            report.equal.push(name.to_string());
        } else {
            report.different.push(Different {
                name: name.to_string(),
                dtype: ta.dtype,
                values: compare_values(ta, ba, tb, bb),
            });
        }
    }
    let keys: BTreeSet<&String> = a.metadata.keys().chain(b.metadata.keys()).collect();
    for key in keys {
        let (va, vb) = (a.metadata.get(key), b.metadata.get(key));
        if va != vb {
            report.metadata.push(MetaChange {
                key: key.clone(),
                a: va.cloned(),
                b: vb.cloned(),
            });
        }
    }
    report
}

/// Compare element by element after decoding both sides to f64, a chunk at a time.
/// An element is a (real, imaginary) pair: complex dtypes decode to two values per
/// element, real ones have imaginary part 0, so `[1+2i, 3+4i]` never equals `[1, 2]`
/// (pairing A's imaginary parts with B's next real values would).
fn compare_values(ta: &TensorInfo, ba: &[u8], tb: &TensorInfo, bb: &[u8]) -> Option<ValueDiff> {
    if !ta.dtype.decodable() || !tb.dtype.decodable() {
        return None;
    }
    let (sa, sb) = (ta.dtype.size()?, tb.dtype.size()?);
    let mut out = ValueDiff {
        differing: 0,
        count: 0,
        max_abs_diff: None,
        nan_mismatch: 0,
    };
    let (mut va, mut vb) = (Vec::new(), Vec::new());
    for (ca, cb) in ba.chunks(SCAN_ELEMS * sa).zip(bb.chunks(SCAN_ELEMS * sb)) {
        va.clear();
        vb.clear();
        decode_f64(ta.dtype, ca, &mut va);
        decode_f64(tb.dtype, cb, &mut vb);
        let (la, lb) = (ta.dtype.lanes(), tb.dtype.lanes());
        let pairs = |v: &[f64], lanes: usize| -> Vec<[f64; 2]> {
            v.chunks(lanes)
                .map(|c| {
                    [
                        c.first().copied().unwrap_or(0.0),
                        c.get(1).copied().unwrap_or(0.0),
                    ]
                })
                .collect()
        };
        let (pa, pb) = (pairs(&va, la), pairs(&vb, lb));
        for (ea, eb) in pa.iter().zip(&pb) {
            out.count += 1;
            let mut nan_mismatch = false;
            let mut differs = false;
            let mut max = None::<f64>;
            for (&x, &y) in ea.iter().zip(eb) {
                match (x.is_nan(), y.is_nan()) {
                    (true, true) => {}
                    (true, false) | (false, true) => {
                        differs = true;
                        nan_mismatch = true;
                    }
                    (false, false) => {
                        if x != y || x.is_sign_negative() != y.is_sign_negative() {
                            differs = true;
                            let d = if x == y { 0.0 } else { (x - y).abs() };
                            let d = if d.is_nan() { f64::INFINITY } else { d };
                            max = Some(max.map_or(d, |m: f64| m.max(d)));
                        }
                    }
                }
            }
            if differs {
                out.differing += 1;
            }
            if nan_mismatch {
                out.nan_mismatch += 1;
            }
            if let Some(d) = max {
                out.max_abs_diff = Some(out.max_abs_diff.map_or(d, |m: f64| m.max(d)));
            }
        }
    }
    Some(out)
}
