//! The canonical writer: tensors sorted by dtype rank then name bytes, compact JSON with
//! `__metadata__` first (sorted keys, omitted when empty), raw UTF-8, space padding to a
//! multiple of 8; data streamed to the output in tensor order.
//!
//! Invariants: the bytes equal the reference library's `serialize` for the same tensors
//! (with at most one metadata key; several are sorted, where the library's order is
//! random); memory use is the header plus one fixed encoding buffer, never the file.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;

use super::dtype::{byte_len, numel, Dtype, SizeError};
use super::float::{encode_f32, encode_f64, EncodeError, EncodeFailure};
use super::header::{TensorInfo, MAX_HEADER_SIZE, METADATA_KEY, N_LEN};
use super::{SafetensorsError, Tensor, TensorData};
use crate::atomic::AtomicFile;

/// Values encoded per step: bounds the writer's buffer to a few hundred KiB.
const ENCODE_CHUNK: usize = 64 * 1024;

/// What the canonical header needs to know about one tensor.
#[derive(Debug, Clone, Copy)]
pub struct TensorSpec<'a> {
    /// Name.
    pub name: &'a str,
    /// Dtype.
    pub dtype: Dtype,
    /// Shape.
    pub shape: &'a [u64],
}

impl<'a> TensorSpec<'a> {
    /// The spec of a tensor named `name` stored as `dtype` with `shape`: the one way
    /// every writer (file, conversion, model transformation, canonical check) builds it.
    pub fn new(name: &'a str, dtype: Dtype, shape: &'a [u64]) -> Self {
        TensorSpec { name, dtype, shape }
    }

    /// The spec of a header's tensor stored as `dtype` (its own, or a conversion target).
    pub fn from_info(info: &'a TensorInfo, dtype: Dtype) -> Self {
        TensorSpec::new(&info.name, dtype, &info.shape)
    }
}

/// The canonical layout of a set of tensors.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Indices into the given specs, in file order.
    pub order: Vec<usize>,
    /// Data offsets of each spec (indexed like the specs).
    pub offsets: Vec<(u64, u64)>,
    /// The first `8 + N` bytes of the file: the length prefix and the padded header.
    pub header: Vec<u8>,
    /// Size of the data buffer.
    pub data_len: u64,
}

impl Layout {
    /// Total file size.
    pub fn file_size(&self) -> u64 {
        self.header.len() as u64 + self.data_len
    }

    /// `items`, indexed like the specs this layout was computed from, in file order;
    /// an error (never a skipped item) when they are not one per spec.
    pub fn in_file_order<'t, T>(&self, items: &'t [T]) -> Result<Vec<&'t T>, SafetensorsError> {
        let mismatch = || SafetensorsError::LayoutMismatch {
            specs: self.order.len(),
            items: items.len(),
        };
        if items.len() != self.order.len() {
            return Err(mismatch());
        }
        self.order
            .iter()
            .map(|&i| items.get(i).ok_or_else(mismatch))
            .collect()
    }
}

fn json_str(out: &mut Vec<u8>, s: &str) {
    // serde_json escapes exactly what the reference library's serde_json does
    // (quote, backslash, control characters) and keeps non-ASCII as raw UTF-8.
    // Serialising a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// One spec in file order, with its position among the specs and its data offsets.
struct Placed<'s, 'a> {
    index: usize,
    spec: &'s TensorSpec<'a>,
    offsets: (u64, u64),
}

/// Compute the canonical layout and header of `specs` with `metadata`, checking names
/// and sizes.
pub fn canonical_header(
    specs: &[TensorSpec<'_>],
    metadata: &BTreeMap<String, String>,
) -> Result<Layout, SafetensorsError> {
    header_with(specs, (!metadata.is_empty()).then_some(metadata))
}

/// [`canonical_header`] where `None` omits `__metadata__` and `Some` writes it even when
/// empty (`"__metadata__":{}`), as the reference library does for `metadata={}`.
fn header_with(
    specs: &[TensorSpec<'_>],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<Layout, SafetensorsError> {
    let sizes = checked_sizes(specs)?;
    let (placed, data_len) = place(specs, &sizes)?;
    let header = frame(header_json(&placed, metadata))?;
    let order = placed.iter().map(|p| p.index).collect();
    let mut by_index: Vec<(usize, (u64, u64))> =
        placed.iter().map(|p| (p.index, p.offsets)).collect();
    by_index.sort_unstable_by_key(|&(i, _)| i);
    Ok(Layout {
        order,
        offsets: by_index.into_iter().map(|(_, o)| o).collect(),
        header,
        data_len,
    })
}

/// The byte count of each spec, refusing the reserved name, duplicates and sizes that
/// overflow or do not fill whole bytes.
fn checked_sizes(specs: &[TensorSpec<'_>]) -> Result<Vec<u64>, SafetensorsError> {
    let mut seen = HashSet::with_capacity(specs.len());
    let mut sizes = Vec::with_capacity(specs.len());
    for s in specs {
        if s.name == METADATA_KEY {
            return Err(SafetensorsError::ReservedName);
        }
        if !seen.insert(s.name) {
            return Err(SafetensorsError::DuplicateTensor {
                tensor: s.name.to_string(),
            });
        }
        let n = byte_len(s.dtype, s.shape).map_err(|e| match e {
            SizeError::Overflow => SafetensorsError::Overflow {
                tensor: s.name.to_string(),
                shape: s.shape.to_vec(),
            },
            SizeError::SubByte { numel } => SafetensorsError::SubByte {
                tensor: s.name.to_string(),
                dtype: s.dtype,
                numel,
            },
        })?;
        sizes.push(n);
    }
    Ok(sizes)
}

/// The specs in canonical order (dtype rank, then name bytes), packed back to back
/// from offset 0; also the end of the last one (the data buffer's size).
fn place<'s, 'a>(
    specs: &'s [TensorSpec<'a>],
    sizes: &[u64],
) -> Result<(Vec<Placed<'s, 'a>>, u64), SafetensorsError> {
    let mut sorted: Vec<(usize, &TensorSpec<'a>, u64)> = specs
        .iter()
        .zip(sizes)
        .enumerate()
        .map(|(i, (spec, &size))| (i, spec, size))
        .collect();
    sorted.sort_by(|(_, x, _), (_, y, _)| {
        x.dtype
            .rank()
            .cmp(&y.dtype.rank())
            .then(x.name.as_bytes().cmp(y.name.as_bytes()))
    });
    let mut cursor = 0u64;
    let mut placed = Vec::with_capacity(sorted.len());
    for (index, spec, size) in sorted {
        let end = cursor
            .checked_add(size)
            .ok_or_else(|| SafetensorsError::Overflow {
                tensor: spec.name.to_string(),
                shape: spec.shape.to_vec(),
            })?;
        placed.push(Placed {
            index,
            spec,
            offsets: (cursor, end),
        });
        cursor = end;
    }
    Ok((placed, cursor))
}

/// The compact header JSON: `__metadata__` first (when given), then the tensors in
/// file order.
fn header_json(placed: &[Placed<'_, '_>], metadata: Option<&BTreeMap<String, String>>) -> Vec<u8> {
    let mut json = Vec::with_capacity(64 + placed.len() * 96);
    json.push(b'{');
    let mut first = true;
    if let Some(metadata) = metadata {
        json.extend_from_slice(b"\"__metadata__\":{");
        for (k, (key, value)) in metadata.iter().enumerate() {
            if k > 0 {
                json.push(b',');
            }
            json_str(&mut json, key);
            json.push(b':');
            json_str(&mut json, value);
        }
        json.push(b'}');
        first = false;
    }
    for p in placed {
        if !first {
            json.push(b',');
        }
        first = false;
        let s = p.spec;
        json_str(&mut json, s.name);
        json.extend_from_slice(b":{\"dtype\":\"");
        json.extend_from_slice(s.dtype.name().as_bytes());
        json.extend_from_slice(b"\",\"shape\":[");
        for (k, d) in s.shape.iter().enumerate() {
            if k > 0 {
                json.push(b',');
            }
            json.extend_from_slice(d.to_string().as_bytes());
        }
        let (b, e) = p.offsets;
        json.extend_from_slice(format!("],\"data_offsets\":[{b},{e}]}}").as_bytes());
    }
    json.push(b'}');
    json
}

/// The length prefix and the JSON padded with spaces to a multiple of 8, refusing a
/// header a reader would reject.
fn frame(mut json: Vec<u8>) -> Result<Vec<u8>, SafetensorsError> {
    let padded = json.len().next_multiple_of(N_LEN as usize);
    json.resize(padded, b' ');
    let n = padded as u64;
    if n > MAX_HEADER_SIZE {
        return Err(SafetensorsError::HeaderTooLargeToWrite { n });
    }
    let mut header = Vec::with_capacity(padded + N_LEN as usize);
    header.extend_from_slice(&n.to_le_bytes());
    header.extend_from_slice(&json);
    Ok(header)
}

fn encode_error(name: &str, dtype: Dtype, start: usize, e: EncodeError) -> SafetensorsError {
    let tensor = name.to_string();
    let index = (start + e.index) as u64;
    match e.failure {
        EncodeFailure::OutOfRange => SafetensorsError::OutOfRange {
            tensor,
            index,
            value: e.value,
            dtype,
        },
        EncodeFailure::NotExact => SafetensorsError::NotExact {
            tensor,
            index,
            value: e.value,
            dtype,
        },
        EncodeFailure::RawOnly => SafetensorsError::RawOnly { tensor, dtype },
    }
}

/// Check that each tensor's data matches its dtype and shape.
fn check_data(t: &Tensor<'_>) -> Result<(), SafetensorsError> {
    let length_error = |expected: u64, actual: u64, unit| SafetensorsError::DataLength {
        tensor: t.name.clone(),
        dtype: t.dtype,
        shape: t.shape.clone(),
        expected,
        actual,
        unit,
    };
    match &t.data {
        TensorData::Raw(bytes) => {
            // Size errors are reported by canonical_header with their rule.
            if let Ok(n) = byte_len(t.dtype, &t.shape) {
                if n != bytes.len() as u64 {
                    return Err(length_error(n, bytes.len() as u64, "bytes"));
                }
            }
        }
        TensorData::F32(_) | TensorData::F64(_) => {
            if !t.dtype.encodable() {
                return Err(SafetensorsError::RawOnly {
                    tensor: t.name.clone(),
                    dtype: t.dtype,
                });
            }
            let len = match &t.data {
                TensorData::F32(v) => v.len(),
                TensorData::F64(v) => v.len(),
                TensorData::Raw(_) => 0,
            } as u64;
            if let Some(n) = numel(&t.shape) {
                if n != len {
                    return Err(length_error(n, len, "values"));
                }
            }
        }
    }
    Ok(())
}

/// Every check the writer makes before its first byte (the reserved name, duplicate
/// names, sizes, and each tensor's data against its dtype and shape), so that a caller
/// that creates files or directories first (a checkpoint step) can refuse bad tensors
/// before it touches the disk.
pub fn check_tensors(tensors: &[Tensor<'_>]) -> Result<(), SafetensorsError> {
    let specs: Vec<TensorSpec<'_>> = tensors
        .iter()
        .map(|t| TensorSpec::new(&t.name, t.dtype, &t.shape))
        .collect();
    checked_sizes(&specs)?;
    tensors.iter().try_for_each(check_data)
}

/// Write `tensors` and `metadata` canonically to `out`, streaming the data; returns the
/// number of bytes written. On an error part of the file may have been written: use
/// [`save`] for an output that appears whole or not at all.
pub fn write<W: Write>(
    out: W,
    tensors: &[Tensor<'_>],
    metadata: &BTreeMap<String, String>,
) -> Result<u64, SafetensorsError> {
    write_with_metadata(out, tensors, (!metadata.is_empty()).then_some(metadata))
}

/// [`write`] where `None` omits `__metadata__` and `Some` writes it even when empty:
/// the reference library's `metadata=None` against `metadata={}`, for callers that
/// promise its bytes for both.
pub fn write_with_metadata<W: Write>(
    mut out: W,
    tensors: &[Tensor<'_>],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<u64, SafetensorsError> {
    for t in tensors {
        if t.name == METADATA_KEY {
            return Err(SafetensorsError::ReservedName);
        }
    }
    let specs: Vec<TensorSpec<'_>> = tensors
        .iter()
        .map(|t| TensorSpec::new(&t.name, t.dtype, &t.shape))
        .collect();
    let layout = header_with(&specs, metadata)?;
    for t in tensors {
        check_data(t)?;
    }
    let w = SafetensorsError::Write;
    out.write_all(&layout.header).map_err(w)?;
    let mut buf = Vec::new();
    for t in layout.in_file_order(tensors)? {
        write_data(&mut out, t, &mut buf)?;
    }
    out.flush().map_err(w)?;
    Ok(layout.file_size())
}

/// Stream one tensor's data, encoding numbers through `buf` a chunk at a time.
fn write_data<W: Write>(
    out: &mut W,
    t: &Tensor<'_>,
    buf: &mut Vec<u8>,
) -> Result<(), SafetensorsError> {
    let w = SafetensorsError::Write;
    match &t.data {
        TensorData::Raw(bytes) => out.write_all(bytes).map_err(w)?,
        TensorData::F32(values) => {
            for (k, chunk) in values.chunks(ENCODE_CHUNK).enumerate() {
                buf.clear();
                encode_f32(t.dtype, chunk, buf)
                    .map_err(|e| encode_error(&t.name, t.dtype, k * ENCODE_CHUNK, e))?;
                out.write_all(buf).map_err(w)?;
            }
        }
        TensorData::F64(values) => {
            for (k, chunk) in values.chunks(ENCODE_CHUNK).enumerate() {
                buf.clear();
                encode_f64(t.dtype, chunk, buf)
                    .map_err(|e| encode_error(&t.name, t.dtype, k * ENCODE_CHUNK, e))?;
                out.write_all(buf).map_err(w)?;
            }
        }
    }
    Ok(())
}

/// Write `tensors` canonically to `path`, atomically: the file appears whole or not at
/// all.
pub fn save(
    path: &Path,
    tensors: &[Tensor<'_>],
    metadata: &BTreeMap<String, String>,
) -> Result<(), SafetensorsError> {
    let mut file = AtomicFile::create(path)?;
    write(&mut file, tensors, metadata)?;
    file.commit()?;
    Ok(())
}

/// Buffer of [`save_unsynced`]'s writer: headers and encoded chunks are gathered, while a
/// raw tensor larger than it goes to the file in one write, without a copy.
const UNSYNCED_BUFFER_BYTES: usize = 256 << 10;

/// Like [`save`] without the fsyncs: a temporary file in the target's directory renamed
/// over `path`, so readers still see the whole file or the old one, but a power loss
/// may leave either. It exists for callers comparing with libraries that never sync
/// (the Python package's `durable=False`); everything durable goes through [`save`].
pub fn save_unsynced(
    path: &Path,
    tensors: &[Tensor<'_>],
    metadata: &BTreeMap<String, String>,
) -> Result<(), SafetensorsError> {
    save_unsynced_with_metadata(path, tensors, (!metadata.is_empty()).then_some(metadata))
}

/// [`save_unsynced`] with [`write_with_metadata`]'s choice of an empty `__metadata__`.
pub fn save_unsynced_with_metadata(
    path: &Path,
    tensors: &[Tensor<'_>],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<(), SafetensorsError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let temp = tempfile::Builder::new()
        .prefix(".tlio-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(SafetensorsError::Write)?;
    let mut out = std::io::BufWriter::with_capacity(UNSYNCED_BUFFER_BYTES, temp);
    write_with_metadata(&mut out, tensors, metadata)?;
    let temp = out
        .into_inner()
        .map_err(|e| SafetensorsError::Write(e.into_error()))?;
    temp.persist(path)
        .map_err(|e| SafetensorsError::Write(e.error))?;
    Ok(())
}

#[cfg(test)]
mod unsynced_tests {
    use super::*;
    use std::borrow::Cow;

    /// `Some(empty)` writes `"__metadata__":{}`, `None` and `write` omit it.
    #[test]
    fn empty_metadata_is_written_only_when_asked() {
        let t = [Tensor {
            name: "a".into(),
            dtype: Dtype::F32,
            shape: vec![2],
            data: TensorData::Raw(Cow::Borrowed(&[0; 8])),
        }];
        let empty = BTreeMap::new();
        let mut with = Vec::new();
        write_with_metadata(&mut with, &t, Some(&empty)).unwrap();
        let mut without = Vec::new();
        write(&mut without, &t, &empty).unwrap();
        assert!(with.windows(17).any(|w| w == b"\"__metadata__\":{}"));
        assert!(!without.windows(12).any(|w| w == b"__metadata__"));
        let mut none = Vec::new();
        write_with_metadata(&mut none, &t, None).unwrap();
        assert_eq!(none, without);
    }

    /// `check_tensors` refuses what `write` refuses, before any byte: the reserved name,
    /// a duplicate name and data of the wrong length; it accepts a valid set.
    #[test]
    fn check_tensors_refuses_what_the_writer_refuses() {
        let one = |name: &str, data: &'static [u8]| Tensor {
            name: name.into(),
            dtype: Dtype::U8,
            shape: vec![2],
            data: TensorData::Raw(Cow::Borrowed(data)),
        };
        assert!(check_tensors(&[one("a", &[1, 2]), one("b", &[3, 4])]).is_ok());
        assert!(matches!(
            check_tensors(&[one("__metadata__", &[1, 2])]),
            Err(SafetensorsError::ReservedName)
        ));
        assert!(matches!(
            check_tensors(&[one("a", &[1, 2]), one("a", &[3, 4])]),
            Err(SafetensorsError::DuplicateTensor { .. })
        ));
        assert!(matches!(
            check_tensors(&[one("a", &[1])]),
            Err(SafetensorsError::DataLength { .. })
        ));
    }

    /// The unsynced writer writes the same bytes as the durable one and leaves no
    /// temporary file behind.
    #[test]
    fn save_unsynced_writes_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let values = [1.0f32, 2.5, -0.0];
        let tensors = [
            Tensor {
                name: "w".into(),
                dtype: Dtype::BF16,
                shape: vec![3],
                data: TensorData::F32(&values),
            },
            Tensor {
                name: "b".into(),
                dtype: Dtype::U8,
                shape: vec![2],
                data: TensorData::Raw(Cow::Borrowed(&[7, 9])),
            },
        ];
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let (a, b) = (
            dir.path().join("a.safetensors"),
            dir.path().join("b.safetensors"),
        );
        save(&a, &tensors, &meta).unwrap();
        save_unsynced(&b, &tensors, &meta).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
