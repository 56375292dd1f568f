//! Streaming statistics over decoded tensor values: min, max, mean, std, NaN and
//! infinity counts, computed chunk by chunk so memory stays fixed whatever the size.
//!
//! Invariant: min, max, mean and std cover the finite values only; NaN and infinities
//! are counted apart, so one NaN cannot hide the rest of a tensor.

use super::dtype::Dtype;
use super::float::decode_f64;
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

/// Statistics of one tensor's values.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct TensorStats {
    /// Number of values (C64 counts real and imaginary parts).
    pub count: u64,
    /// Smallest finite value (None when there is none).
    pub min: Option<f64>,
    /// Largest finite value.
    pub max: Option<f64>,
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
#[derive(Default)]
pub struct Acc {
    n: u64,
    mean: f64,
    m2: f64,
    min: f64,
    max: f64,
    nan: u64,
    inf: u64,
    count: u64,
}

impl Acc {
    /// Add a chunk of values.
    pub fn add_chunk(&mut self, values: &[f64]) {
        let mut n = 0u64;
        let mut sum = 0.0;
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for &v in values {
            if v.is_nan() {
                self.nan += 1;
            } else if v.is_infinite() {
                self.inf += 1;
            } else {
                n += 1;
                sum += v;
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
        self.count += values.len() as u64;
        if n == 0 {
            return;
        }
        let mean = sum / n as f64;
        let m2: f64 = values
            .iter()
            .filter(|v| v.is_finite())
            .map(|v| (v - mean) * (v - mean))
            .sum();
        if self.n == 0 {
            self.min = lo;
            self.max = hi;
            self.mean = mean;
            self.m2 = m2;
            self.n = n;
            return;
        }
        self.min = self.min.min(lo);
        self.max = self.max.max(hi);
        let total = self.n + n;
        let delta = mean - self.mean;
        self.mean += delta * n as f64 / total as f64;
        self.m2 += m2 + delta * delta * (self.n as f64) * (n as f64) / total as f64;
        self.n = total;
    }

    /// The statistics of everything added.
    pub fn finish(self) -> TensorStats {
        let some = |v| (self.n > 0).then_some(v);
        TensorStats {
            count: self.count,
            min: some(self.min),
            max: some(self.max),
            mean: some(self.mean),
            std: some((self.m2 / self.n.max(1) as f64).sqrt()),
            nan: self.nan,
            inf: self.inf,
        }
    }
}

/// Statistics of a tensor's bytes; None for dtypes that cannot be decoded.
pub fn tensor_stats(info: &TensorInfo, bytes: &[u8]) -> Option<TensorStats> {
    let mut acc = Acc::default();
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
        assert_eq!((s.min, s.max), (Some(0.0), Some(6.0)));
        assert!((s.mean.unwrap() - mean).abs() < 1e-9);
        assert!((s.std.unwrap() - var.sqrt()).abs() < 1e-9);
        let (nan, inf, first) = non_finite(&info(Dtype::F32, values.len() as u64), &bytes);
        assert_eq!((nan, inf, first), (1, 1, Some(values.len() as u64 - 2)));
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
