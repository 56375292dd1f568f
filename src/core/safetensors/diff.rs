//! `diff`: what differs between two safetensors files: tensors only in one, dtype and
//! shape changes, metadata changes, and for tensors in both whether their bytes are
//! equal, else the largest absolute difference of their values.
//!
//! Invariant: two files are identical for `diff` exactly when every list of the report
//! is empty; values are compared chunk by chunk, in fixed memory.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use super::dtype::Dtype;
use super::float::decode_f64;
use super::header::TensorInfo;
use super::stats::SCAN_ELEMS;
use super::MappedFile;

/// A tensor present in both files with a different dtype or shape. (Fields of the
/// report's types are declared in the byte order of their names: `--json st diff`
/// serializes them as they are, in the key order a `serde_json::Value` gave.)
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Changed<'a> {
    /// Dtype in A.
    pub dtype_a: Dtype,
    /// Dtype in B.
    pub dtype_b: Dtype,
    /// Name.
    pub name: Cow<'a, str>,
    /// Shape in A.
    pub shape_a: Cow<'a, [u64]>,
    /// Shape in B.
    pub shape_b: Cow<'a, [u64]>,
    /// Value comparison when the element counts match and both decode.
    pub values: Option<ValueDiff>,
}

/// How the values of two tensors differ.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ValueDiff {
    /// Elements compared.
    pub count: u64,
    /// Elements whose values differ (NaN equals NaN here).
    pub differing: u64,
    /// Largest |a - b| over elements where both are numbers (infinite when one side is
    /// infinite); None when no such pair differs.
    #[serde(serialize_with = "number_or_inf")]
    pub max_abs_diff: Option<f64>,
    /// Elements where exactly one side is NaN.
    pub nan_mismatch: u64,
}

/// JSON has no infinity (serde writes it as null, which here means "no pair differs"):
/// an infinite difference is written as the string `"inf"` instead.
fn number_or_inf<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(x) if x.is_infinite() => s.serialize_str("inf"),
        Some(x) => s.serialize_some(x),
        None => s.serialize_none(),
    }
}

/// A tensor with the same dtype and shape in both files whose bytes differ.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Different<'a> {
    /// Dtype.
    pub dtype: Dtype,
    /// Name.
    pub name: Cow<'a, str>,
    /// Value comparison (None for dtypes that cannot be decoded).
    pub values: Option<ValueDiff>,
}

/// A metadata key whose value differs (None: absent on that side).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MetaChange<'a> {
    /// Value in A.
    pub a: Option<Cow<'a, str>>,
    /// Value in B.
    pub b: Option<Cow<'a, str>>,
    /// Key.
    pub key: Cow<'a, str>,
}

/// The whole comparison. Made by [`diff_sides`], it borrows its names from the two
/// sides (a diff of two million-tensor files must not copy every name into the
/// report); [`DiffReport::into_owned`] detaches it.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct DiffReport<'a> {
    /// Tensors only in A.
    pub only_in_a: Vec<Cow<'a, str>>,
    /// Tensors only in B.
    pub only_in_b: Vec<Cow<'a, str>>,
    /// Tensors whose dtype or shape changed.
    pub changed: Vec<Changed<'a>>,
    /// Tensors with the same dtype and shape but different bytes.
    pub different: Vec<Different<'a>>,
    /// Tensors bitwise equal in both.
    pub equal: Vec<Cow<'a, str>>,
    /// Metadata differences.
    pub metadata: Vec<MetaChange<'a>>,
}

impl DiffReport<'_> {
    /// The same report owning its names and values.
    pub fn into_owned(self) -> DiffReport<'static> {
        let own = |s: Cow<'_, str>| Cow::Owned(s.into_owned());
        DiffReport {
            only_in_a: self.only_in_a.into_iter().map(own).collect(),
            only_in_b: self.only_in_b.into_iter().map(own).collect(),
            changed: self
                .changed
                .into_iter()
                .map(|c| Changed {
                    dtype_a: c.dtype_a,
                    dtype_b: c.dtype_b,
                    name: own(c.name),
                    shape_a: Cow::Owned(c.shape_a.into_owned()),
                    shape_b: Cow::Owned(c.shape_b.into_owned()),
                    values: c.values,
                })
                .collect(),
            different: self
                .different
                .into_iter()
                .map(|d| Different {
                    dtype: d.dtype,
                    name: own(d.name),
                    values: d.values,
                })
                .collect(),
            equal: self.equal.into_iter().map(own).collect(),
            metadata: self
                .metadata
                .into_iter()
                .map(|m| MetaChange {
                    a: m.a.map(own),
                    b: m.b.map(own),
                    key: own(m.key),
                })
                .collect(),
        }
    }

    /// True when nothing differs.
    pub fn identical(&self) -> bool {
        self.only_in_a.is_empty()
            && self.only_in_b.is_empty()
            && self.changed.is_empty()
            && self.different.is_empty()
            && self.metadata.is_empty()
    }
}

/// One tensor of a side: its name, info and bytes.
type SideTensor<'a> = (&'a str, &'a TensorInfo, &'a [u8]);

/// One side of a comparison: tensors with their bytes, and the metadata. A side may
/// gather the tensors of several files (a sharded model).
///
/// Invariant: `tensors` is sorted by name and holds each name once, so that a diff is
/// one merge of two sorted lists (no map per side).
#[derive(Debug, Default)]
pub struct Side<'a> {
    tensors: Vec<SideTensor<'a>>,
    /// The metadata (borrowed from the files' headers).
    pub metadata: BTreeMap<&'a str, &'a str>,
}

impl<'a> Side<'a> {
    /// The side of one mapped file.
    pub fn of_file(f: &'a MappedFile) -> Side<'a> {
        let mut side = Side {
            metadata: f
                .header()
                .metadata
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect(),
            ..Side::default()
        };
        side.add_file(f);
        side
    }

    /// Add every tensor of `f` (a later file's tensor of the same name replaces an
    /// earlier one; callers pass files whose names are disjoint).
    pub fn add_file(&mut self, f: &'a MappedFile) {
        self.add(
            f.header()
                .tensors()
                .iter()
                .filter_map(|t| Some((t, f.info_bytes(t)?))),
        );
    }

    /// Add tensors with their bytes (a later tensor of a name already present replaces
    /// the earlier one). Cheap when they come in name order.
    pub fn add(&mut self, tensors: impl IntoIterator<Item = (&'a TensorInfo, &'a [u8])>) {
        self.tensors
            .extend(tensors.into_iter().map(|(t, b)| (t.name.as_str(), t, b)));
        // Stable, so that of equal names the last added comes last; keep that one.
        self.tensors.sort_by(|x, y| x.0.cmp(y.0));
        let mut kept: Vec<SideTensor<'a>> = Vec::with_capacity(self.tensors.len());
        for t in self.tensors.drain(..) {
            match kept.last_mut() {
                Some(last) if last.0 == t.0 => *last = t,
                _ => kept.push(t),
            }
        }
        self.tensors = kept;
    }

    /// How many tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the side holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
}

/// Compare two mapped files.
pub fn diff(a: &MappedFile, b: &MappedFile) -> DiffReport<'static> {
    diff_sides(&Side::of_file(a), &Side::of_file(b)).into_owned()
}

/// Compare two sides tensor by tensor, whatever files they came from: one merge of the
/// two name-sorted lists.
pub fn diff_sides<'a>(a: &Side<'a>, b: &Side<'a>) -> DiffReport<'a> {
    let mut report = DiffReport::default();
    let (mut ia, mut ib) = (a.tensors.iter().peekable(), b.tensors.iter().peekable());
    loop {
        match (ia.peek(), ib.peek()) {
            (None, None) => break,
            (Some(&&(name, ..)), None) => {
                report.only_in_a.push(Cow::Borrowed(name));
                ia.next();
            }
            (None, Some(&&(name, ..))) => {
                report.only_in_b.push(Cow::Borrowed(name));
                ib.next();
            }
            (Some(&&x), Some(&&y)) => match x.0.cmp(y.0) {
                std::cmp::Ordering::Less => {
                    report.only_in_a.push(Cow::Borrowed(x.0));
                    ia.next();
                }
                std::cmp::Ordering::Greater => {
                    report.only_in_b.push(Cow::Borrowed(y.0));
                    ib.next();
                }
                std::cmp::Ordering::Equal => {
                    compare_pair(&mut report, x, y);
                    ia.next();
                    ib.next();
                }
            },
        }
    }
    diff_metadata(&mut report, &a.metadata, &b.metadata);
    report
}

/// File one tensor present on both sides under changed, equal or different.
fn compare_pair<'a>(report: &mut DiffReport<'a>, a: SideTensor<'a>, b: SideTensor<'a>) {
    let ((name, ta, ba), (_, tb, bb)) = (a, b);
    if ta.dtype != tb.dtype || ta.shape != tb.shape {
        let values = (ta.numel() == tb.numel())
            .then(|| compare_values(ta, ba, tb, bb))
            .flatten();
        report.changed.push(Changed {
            name: Cow::Borrowed(name),
            dtype_a: ta.dtype,
            dtype_b: tb.dtype,
            shape_a: Cow::Borrowed(&ta.shape),
            shape_b: Cow::Borrowed(&tb.shape),
            values,
        });
    } else if ba == bb {
        report.equal.push(Cow::Borrowed(name));
    } else {
        report.different.push(Different {
            name: Cow::Borrowed(name),
            dtype: ta.dtype,
            values: compare_values(ta, ba, tb, bb),
        });
    }
}

/// The metadata keys whose values differ, in key order.
fn diff_metadata<'a>(
    report: &mut DiffReport<'a>,
    a: &BTreeMap<&'a str, &'a str>,
    b: &BTreeMap<&'a str, &'a str>,
) {
    let keys: BTreeSet<&'a str> = a.keys().chain(b.keys()).copied().collect();
    for key in keys {
        let (va, vb) = (a.get(key).copied(), b.get(key).copied());
        if va != vb {
            report.metadata.push(MetaChange {
                key: Cow::Borrowed(key),
                a: va.map(Cow::Borrowed),
                b: vb.map(Cow::Borrowed),
            });
        }
    }
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
