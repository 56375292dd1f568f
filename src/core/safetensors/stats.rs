//! Streaming statistics over decoded tensor values: min, max, mean, std, NaN and
//! infinity counts, computed chunk by chunk so memory stays fixed whatever the size.
//!
//! Invariant: min, max, mean and std cover the finite values only; NaN and infinities
//! are counted apart, so one NaN cannot hide the rest of a tensor.

use super::dtype::Dtype;
use super::float::{decode_f64, decode_ints};
use super::header::TensorInfo;

/// Elements decoded per step.
pub const SCAN_ELEMS: usize = 1 << 18;

/// Call `f` with the values of `bytes` (of `dtype`) decoded to f64, a fixed-size chunk
/// at a time. Returns false (calling nothing) for the raw-only sub-byte dtypes.
pub fn for_each_chunk(dtype: Dtype, bytes: &[u8], mut f: impl FnMut(&[f64])) -> bool {
    if !dtype.decodable() {
        return false;
    }
    // Decodable dtypes are whole bytes; C64's element is two f32.
    let size = dtype.size().unwrap_or(1);
    let mut buf = Vec::with_capacity(SCAN_ELEMS * 2);
    for chunk in bytes.chunks(SCAN_ELEMS * size) {
        buf.clear();
        decode_f64(dtype, chunk, &mut buf);
        f(&buf);
    }
    true
}

/// A minimum or maximum: exact for integer dtypes (an I64 or U64 value does not
/// survive a trip through f64), a float otherwise. Serialized as a plain JSON number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// An integer value, exact.
    Int(i128),
    /// A float value.
    Float(f64),
}

impl serde::Serialize for Number {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Number::Int(v) => s.serialize_i128(v),
            Number::Float(v) => s.serialize_f64(v),
        }
    }
}

/// Statistics of one tensor's values.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct TensorStats {
    /// Number of values (C64 counts real and imaginary parts).
    pub count: u64,
    /// Smallest finite value (None when there is none).
    pub min: Option<Number>,
    /// Largest finite value.
    pub max: Option<Number>,
    /// Mean of the finite values.
    pub mean: Option<f64>,
    /// Population standard deviation of the finite values.
    pub std: Option<f64>,
    /// NaN count.
    pub nan: u64,
    /// Infinity count (either sign).
    pub inf: u64,
}

/// Running accumulator (Chan et al.'s parallel update of mean and squared deviations).
///
/// Mean and squared deviations are kept in units of `scale`, a power of two at least
/// the largest magnitude seen: every scaled value lies in [-1, 1], so no sum overflows
/// even for F64 values near f64::MAX, and the results (|mean| and std are at most the
/// largest magnitude) come back into range when multiplied out. Scaling by a power of
/// two is exact.
#[derive(Default)]
pub struct Acc {
    n: u64,
    scale: f64,
    mean: f64,
    m2: f64,
    min: f64,
    max: f64,
    nan: u64,
    inf: u64,
    count: u64,
}

/// The smallest power of two >= |x| (1 for 0), saturating at 2^1023.
fn pow2_at_least(x: f64) -> f64 {
    let mut p = 1.0f64;
    if x <= 1.0 {
        while p / 2.0 >= x && p / 2.0 > 0.0 && x > 0.0 {
            p /= 2.0;
        }
        return p;
    }
    while p < x && p < f64::MAX / 2.0 {
        p *= 2.0;
    }
    p
}

impl Acc {
    /// Add a chunk of values.
    pub fn add_chunk(&mut self, values: &[f64]) {
        let mut n = 0u64;
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for &v in values {
            if v.is_nan() {
                self.nan += 1;
            } else if v.is_infinite() {
                self.inf += 1;
            } else {
                n += 1;
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
        self.count += values.len() as u64;
        if n == 0 {
            return;
        }
        let scale = pow2_at_least(lo.abs().max(hi.abs()));
        let sum: f64 = values
            .iter()
            .filter(|v| v.is_finite())
            .map(|v| v / scale)
            .sum();
        let mean = sum / n as f64;
        let m2: f64 = values
            .iter()
            .filter(|v| v.is_finite())
            .map(|v| (v / scale - mean) * (v / scale - mean))
            .sum();
        if self.n == 0 {
            self.min = lo;
            self.max = hi;
            self.scale = scale;
            self.mean = mean;
            self.m2 = m2;
            self.n = n;
            return;
        }
        self.min = self.min.min(lo);
        self.max = self.max.max(hi);
        // Bring both parts to the larger scale (exact division by a power of two).
        let (mean, m2) = if scale > self.scale {
            let r = self.scale / scale;
            self.mean *= r;
            self.m2 *= r * r;
            self.scale = scale;
            (mean, m2)
        } else {
            let r = scale / self.scale;
            (mean * r, m2 * r * r)
        };
        let total = self.n + n;
        let delta = mean - self.mean;
        self.mean += delta * n as f64 / total as f64;
        self.m2 += m2 + delta * delta * (self.n as f64) * (n as f64) / total as f64;
        self.n = total;
    }

    /// The statistics of everything added.
    pub fn finish(self) -> TensorStats {
        let any = self.n > 0;
        TensorStats {
            count: self.count,
            min: any.then_some(Number::Float(self.min)),
            max: any.then_some(Number::Float(self.max)),
            mean: any.then_some(self.mean * self.scale),
            std: any.then_some((self.m2 / self.n.max(1) as f64).sqrt() * self.scale),
            nan: self.nan,
            inf: self.inf,
        }
    }
}

/// Statistics of a tensor's bytes; None for dtypes that cannot be decoded. Integer
/// dtypes get exact min and max.
pub fn tensor_stats(info: &TensorInfo, bytes: &[u8]) -> Option<TensorStats> {
    let mut acc = Acc::default();
    let mut ints = Vec::new();
    let mut floats = Vec::new();
    let mut range: Option<(i128, i128)> = None;
    let size = info.dtype.size().unwrap_or(1);
    for chunk in bytes.chunks(SCAN_ELEMS * size) {
        ints.clear();
        if !decode_ints(info.dtype, chunk, &mut ints) {
            break;
        }
        for &v in &ints {
            range = Some(match range {
                None => (v, v),
                Some((lo, hi)) => (lo.min(v), hi.max(v)),
            });
        }
        floats.clear();
        // i128 to f64 rounds to nearest: only mean and std use these.
        floats.extend(ints.iter().map(|&v| v as f64));
        acc.add_chunk(&floats);
    }
    // decode_ints on no bytes answers whether the dtype is an integer one.
    if decode_ints(info.dtype, &[], &mut ints) {
        let mut stats = acc.finish();
        stats.min = range.map(|r| Number::Int(r.0));
        stats.max = range.map(|r| Number::Int(r.1));
        return Some(stats);
    }
    for_each_chunk(info.dtype, bytes, |v| acc.add_chunk(v)).then(|| acc.finish())
}

/// Non-finite values of a float tensor: (NaN count, infinity count, first index).
pub fn non_finite(info: &TensorInfo, bytes: &[u8]) -> (u64, u64, Option<u64>) {
    let (mut nan, mut inf, mut first, mut seen) = (0u64, 0u64, None, 0u64);
    if info.dtype.is_float() {
        for_each_chunk(info.dtype, bytes, |values| {
            for (i, v) in values.iter().enumerate() {
                if !v.is_finite() {
                    if v.is_nan() {
                        nan += 1;
                    } else {
                        inf += 1;
                    }
                    first.get_or_insert(seen + i as u64);
                }
            }
            seen += values.len() as u64;
        });
    }
    (nan, inf, first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(dtype: Dtype, n: u64) -> TensorInfo {
        TensorInfo {
            name: "t".into(),
            dtype,
            shape: vec![n],
            data_offsets: (0, n * dtype.size().unwrap() as u64),
        }
    }

    #[test]
    fn stats_skip_non_finite_and_merge_chunks() {
        let mut values: Vec<f32> = (0..(SCAN_ELEMS as u32 * 2 + 5))
            .map(|i| (i % 7) as f32)
            .collect();
        values.push(f32::NAN);
        values.push(f32::INFINITY);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let s = tensor_stats(&info(Dtype::F32, values.len() as u64), &bytes).unwrap();
        let finite: Vec<f64> = values
            .iter()
            .filter(|v| v.is_finite())
            .map(|&v| f64::from(v))
            .collect();
        let mean = finite.iter().sum::<f64>() / finite.len() as f64;
        let var = finite.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / finite.len() as f64;
        assert_eq!(s.count, values.len() as u64);
        assert_eq!((s.nan, s.inf), (1, 1));
        assert_eq!(
            (s.min, s.max),
            (Some(Number::Float(0.0)), Some(Number::Float(6.0)))
        );
        assert!((s.mean.unwrap() - mean).abs() < 1e-9);
        assert!((s.std.unwrap() - var.sqrt()).abs() < 1e-9);
        let (nan, inf, first) = non_finite(&info(Dtype::F32, values.len() as u64), &bytes);
        assert_eq!((nan, inf, first), (1, 1, Some(values.len() as u64 - 2)));
    }

    #[test]
    fn integer_extremes_are_exact() {
        let values = [i64::MAX, i64::MIN, 0, i64::MAX - 1];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let s = tensor_stats(&info(Dtype::I64, 4), &bytes).unwrap();
        assert_eq!(s.min, Some(Number::Int(i128::from(i64::MIN))));
        assert_eq!(s.max, Some(Number::Int(i128::from(i64::MAX))));
        let bytes: Vec<u8> = [u64::MAX, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
        let s = tensor_stats(&info(Dtype::U64, 2), &bytes).unwrap();
        assert_eq!(s.max, Some(Number::Int(i128::from(u64::MAX))));
        assert_eq!(s.min, Some(Number::Int(3)));
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"max\":18446744073709551615"), "{json}");
    }

    #[test]
    fn mean_and_std_near_f64_max_do_not_overflow() {
        let values = [f64::MAX, f64::MAX, -f64::MAX, f64::MAX];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let s = tensor_stats(&info(Dtype::F64, 4), &bytes).unwrap();
        let mean = s.mean.unwrap();
        let std = s.std.unwrap();
        assert!((mean / f64::MAX - 0.5).abs() < 1e-12, "{mean}");
        assert!((std / f64::MAX - 0.75f64.sqrt()).abs() < 1e-12, "{std}");
        // Tiny values keep their precision.
        let values = [1e-300f64, 3e-300];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let s = tensor_stats(&info(Dtype::F64, 2), &bytes).unwrap();
        assert!((s.mean.unwrap() / 2e-300 - 1.0).abs() < 1e-12);
        assert!((s.std.unwrap() / 1e-300 - 1.0).abs() < 1e-12);
        // Chunks of different scales merge.
        let mut values = vec![1.0f64; SCAN_ELEMS];
        values.extend(vec![1e300; SCAN_ELEMS]);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let s = tensor_stats(&info(Dtype::F64, values.len() as u64), &bytes).unwrap();
        assert!((s.mean.unwrap() / 5e299 - 1.0).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn empty_and_raw_only() {
        let s = tensor_stats(&info(Dtype::BF16, 0), &[]).unwrap();
        assert_eq!(s.count, 0);
        assert_eq!(s.mean, None);
        let f4 = TensorInfo {
            name: "p".into(),
            dtype: Dtype::F4,
            shape: vec![2],
            data_offsets: (0, 1),
        };
        assert_eq!(tensor_stats(&f4, &[0]), None);
    }
}
