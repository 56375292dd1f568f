//! `convert`: re-encode the float tensors of a file to another float dtype, copying the
//! rest, into a canonical file written atomically, streaming through fixed buffers.
//!
//! Invariants: memory use is a few MiB whatever the file size (the input is read with
//! plain reads, not mapped, so its pages are never charged to this process); each value
//! is rounded once, from its source value (F64 sources are encoded from f64, every other
//! float dtype decodes exactly to f32); the output never replaces the input.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use super::dtype::Dtype;
use super::float::{decode_f32, decode_f64, encode_f32, encode_f64, EncodeFailure, E4M3_MAX};
use super::header::{read_header_from, Header, ReadFailure, TensorInfo};
use super::write::{canonical_header, TensorSpec};
use super::SafetensorsError;
use crate::atomic::{same_file, AtomicFile};

/// Bytes of source data handled per step (a multiple of every element size).
pub const CONVERT_CHUNK: usize = 4 << 20;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct ConvertReport {
    /// Tensors re-encoded to the target dtype.
    pub converted: u64,
    /// Tensors copied unchanged (not float, not selected, or already the target).
    pub copied: u64,
    /// Size of the input file.
    pub bytes_in: u64,
    /// Size of the output file.
    pub bytes_out: u64,
}

/// The float dtypes `convert` can write.
pub fn is_convert_target(d: Dtype) -> bool {
    matches!(
        d,
        Dtype::F64 | Dtype::F32 | Dtype::BF16 | Dtype::F16 | Dtype::F8_E4M3 | Dtype::F8_E5M2
    )
}

/// Convert `input` to `output`: every float tensor for which `select(name)` holds is
/// encoded to `target`; `progress(done, total)` receives the source data bytes done
/// after each step.
pub fn convert(
    input: &Path,
    output: &Path,
    target: Dtype,
    select: &dyn Fn(&str) -> bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertReport, SafetensorsError> {
    convert_saturating(input, output, target, false, select, progress)
}

/// [`convert`], where `saturate` makes F8_E4M3 clamp magnitudes beyond 448 (infinities
/// included) to +-448 as torch's saturating cast does, instead of the default error;
/// NaN stays NaN.
pub fn convert_saturating(
    input: &Path,
    output: &Path,
    target: Dtype,
    saturate: bool,
    select: &dyn Fn(&str) -> bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertReport, SafetensorsError> {
    let saturate = saturate && target == Dtype::F8_E4M3;
    if !is_convert_target(target) {
        return Err(SafetensorsError::BadTarget { dtype: target });
    }
    if same_file(input, output) {
        return Err(SafetensorsError::SameFile {
            path: output.to_path_buf(),
        });
    }
    let io = |source| SafetensorsError::Io {
        path: input.to_path_buf(),
        source,
    };
    let mut src = crate::files::open_regular(input).map_err(io)?;
    let size = src.metadata().map_err(io)?.len();
    let header = read_header_from(&mut src, size).map_err(|e| match e {
        ReadFailure::Io(source) => io(source),
        ReadFailure::Invalid(e) => e,
    })?;
    let plan = plan_dtypes(&header, target, select)?;
    let specs: Vec<TensorSpec<'_>> = plan
        .iter()
        .map(|&(t, dtype)| TensorSpec::from_info(t, dtype))
        .collect();
    let layout = canonical_header(&specs, &header.metadata)?;

    let mut out = AtomicFile::create(output)?;
    out.write_all(&layout.header)
        .map_err(SafetensorsError::Write)?;
    let mut report = ConvertReport {
        bytes_in: size,
        bytes_out: layout.file_size(),
        ..ConvertReport::default()
    };
    let mut stream = Stream {
        src: &mut src,
        out: &mut out,
        input,
        saturate,
        raw: vec![0u8; CONVERT_CHUNK],
        codec: Codec::default(),
        done: 0,
        total: header.data_len(),
    };
    for &(t, to) in layout.in_file_order(&plan)? {
        if to == t.dtype {
            report.copied += 1;
        } else {
            report.converted += 1;
        }
        let start = header.data_start() + t.data_offsets.0;
        stream.tensor(t, start, to, progress)?;
    }
    out.commit()?;
    Ok(report)
}

/// Each tensor with the dtype it is written as: `target` for the selected float
/// tensors (which must be decodable), its own otherwise.
fn plan_dtypes<'h>(
    header: &'h Header,
    target: Dtype,
    select: &dyn Fn(&str) -> bool,
) -> Result<Vec<(&'h TensorInfo, Dtype)>, SafetensorsError> {
    let mut plan = Vec::with_capacity(header.len());
    for t in header.tensors() {
        let convert = t.dtype.is_float() && t.dtype != target && select(&t.name);
        if convert && !t.dtype.decodable() {
            return Err(SafetensorsError::CannotDecode {
                tensor: t.name.clone(),
                dtype: t.dtype,
            });
        }
        plan.push((t, if convert { target } else { t.dtype }));
    }
    Ok(plan)
}

/// The source, the output and the fixed buffers one conversion streams through.
struct Stream<'a> {
    src: &'a mut File,
    out: &'a mut AtomicFile,
    input: &'a Path,
    saturate: bool,
    raw: Vec<u8>,
    codec: Codec,
    done: u64,
    total: u64,
}

/// The buffers of re-encoding one chunk.
#[derive(Default)]
struct Codec {
    encoded: Vec<u8>,
    v32: Vec<f32>,
    v64: Vec<f64>,
}

impl Stream<'_> {
    /// Copy or re-encode tensor `t` (whose data starts at file offset `start`) as `to`,
    /// a chunk at a time.
    fn tensor(
        &mut self,
        t: &TensorInfo,
        start: u64,
        to: Dtype,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), SafetensorsError> {
        let input = self.input;
        let io = |source| SafetensorsError::Io {
            path: input.to_path_buf(),
            source,
        };
        let w = SafetensorsError::Write;
        self.src.seek(SeekFrom::Start(start)).map_err(io)?;
        let mut index = 0u64;
        for n in chunk_lengths(t.byte_len(), self.raw.len()) {
            // chunk_lengths never yields more than the buffer holds.
            let Some(chunk) = self.raw.get_mut(..n) else {
                return Err(io(std::io::Error::other(
                    "a chunk is larger than the conversion buffer",
                )));
            };
            self.src.read_exact(chunk).map_err(io)?;
            if to == t.dtype {
                self.out.write_all(chunk).map_err(w)?;
            } else {
                index += self.codec.encode(chunk, t, to, index, self.saturate)?;
                self.out.write_all(&self.codec.encoded).map_err(w)?;
            }
            self.done += n as u64;
            progress(self.done, self.total);
        }
        Ok(())
    }
}

impl Codec {
    /// Re-encode the raw `chunk` of `t` to `to` into `encoded`; returns the number of
    /// values, the chunk's first being value `index` of the tensor.
    fn encode(
        &mut self,
        chunk: &[u8],
        t: &TensorInfo,
        to: Dtype,
        index: u64,
        saturate: bool,
    ) -> Result<u64, SafetensorsError> {
        self.encoded.clear();
        let result = if t.dtype == Dtype::F64 {
            self.v64.clear();
            decode_f64(t.dtype, chunk, &mut self.v64);
            if saturate {
                saturate_f64(&mut self.v64);
            }
            encode_f64(to, &self.v64, &mut self.encoded).map(|()| self.v64.len())
        } else {
            self.v32.clear();
            decode_f32(t.dtype, chunk, &mut self.v32);
            if saturate {
                saturate_f32(&mut self.v32);
            }
            encode_f32(to, &self.v32, &mut self.encoded).map(|()| self.v32.len())
        };
        let count = result.map_err(|e| {
            let tensor = t.name.clone();
            let at = index + e.index as u64;
            match e.failure {
                EncodeFailure::OutOfRange => SafetensorsError::OutOfRange {
                    tensor,
                    index: at,
                    value: e.value,
                    dtype: to,
                },
                EncodeFailure::NotExact => SafetensorsError::NotExact {
                    tensor,
                    index: at,
                    value: e.value,
                    dtype: to,
                },
                EncodeFailure::RawOnly => SafetensorsError::RawOnly { tensor, dtype: to },
            }
        })?;
        Ok(count as u64)
    }
}

/// The lengths of the chunks `len` bytes are read in, each at most `chunk` bytes.
fn chunk_lengths(len: u64, chunk: usize) -> impl Iterator<Item = usize> {
    let chunk = chunk.max(1) as u64;
    let mut left = len;
    std::iter::from_fn(move || {
        (left > 0).then(|| {
            let n = left.min(chunk);
            left -= n;
            n as usize
        })
    })
}

/// Clamp |x| > 448 to +-448 (F8_E4M3's largest finite value), leaving NaN alone.
pub fn saturate_f32(values: &mut [f32]) {
    let max = E4M3_MAX as f32;
    for v in values {
        if v.abs() > max {
            *v = max.copysign(*v);
        }
    }
}

/// [`saturate_f32`] for f64 values.
pub fn saturate_f64(values: &mut [f64]) {
    for v in values {
        if v.abs() > E4M3_MAX {
            *v = E4M3_MAX.copysign(*v);
        }
    }
}
