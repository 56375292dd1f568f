//! `tlio._tlio.safetensors`: the Rust half of `tlio.safetensors`. It reads headers and
//! model layouts through tlio-core, decodes BF16/F8 and writes files through the core's
//! canonical writer; the Python half (python/tlio/safetensors.py) maps numpy dtypes and
//! builds the zero-copy views.
//!
//! Invariants: every format rule (dtype names, the reader and writer rules, rounding,
//! the E4M3 range, model and index checks) is tlio-core's; the GIL is released around
//! file I/O and conversion; a Rust panic becomes a `RuntimeError` (`errors::guard`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use numpy::{
    IntoPyArray, PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArray1, PyReadonlyArrayDyn,
};
use pyo3::exceptions::{PyFileNotFoundError, PyMemoryError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tlio_core::model::Model;
use tlio_core::safetensors::float::{decode_f32, first_f32_overflow};
use tlio_core::safetensors::slice::{Index, SlicePlan};
use tlio_core::safetensors::write::{save_unsynced_with_metadata, write_with_metadata};
use tlio_core::safetensors::{
    parse_header, read_header, save, Dtype, Tensor, TensorData, TensorInfo,
};

use crate::args::path_arg;
use crate::errors::{core_err, errno_named, guard, os_error};

/// One tensor of a header as Python sees it: name, dtype, shape, and its byte range
/// `[start, end)` from the start of the file holding it.
type TensorRow = (String, &'static str, Vec<u64>, u64, u64);

/// A file's header as Python sees it: tensors, metadata, file size, and whether the
/// header has a `__metadata__` key.
type FileHeader = (Vec<TensorRow>, BTreeMap<String, String>, u64, bool);

/// The header of bytes in memory: tensors, metadata (`None` without the key), size.
type BytesHeader = (Vec<TensorRow>, Option<BTreeMap<String, String>>, u64);

/// A core error raised as its Python exception, with the file named in front when the
/// core's message does not name it already.
pub(crate) fn at_path<E>(path: &Path, err: E) -> PyErr
where
    E: tlio_core::Failure + Send + Sync + 'static,
{
    with_path(path, core_err(err))
}

/// `err` with `path` named in front of its message (unless it names it already), as
/// the same exception type.
pub(crate) fn with_path(path: &Path, err: PyErr) -> PyErr {
    let shown = path.display().to_string();
    Python::attach(|py| {
        let message = err.value(py).to_string();
        if message.contains(&shown) {
            return err;
        }
        let message = format!("{shown}: {message}");
        // An OSError keeps its errno (and so its subclass): rebuilt from the message
        // alone, `.errno` would be None.
        let errno = err
            .value(py)
            .getattr("errno")
            .ok()
            .and_then(|e| e.extract::<i32>().ok());
        let made = match errno {
            Some(n) if err.is_instance_of::<pyo3::exceptions::PyOSError>(py) => {
                err.get_type(py).call1((n, message))
            }
            _ => err.get_type(py).call1((message,)),
        };
        match made {
            Ok(obj) => PyErr::from_value(obj),
            Err(e) => e,
        }
    })
}

/// A dtype from its exact safetensors name (`bf16` is unknown), or a `ValueError`.
pub(crate) fn dtype_arg(name: &str, tensor: &str) -> PyResult<Dtype> {
    Dtype::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "tensor {tensor:?}: unknown dtype {name:?} (dtype names are exact and upper-case, e.g. BF16)"
        ))
    })
}

/// Every dtype of safetensors 0.8 in writer-rank order: (name, bits, bytes per element
/// or None for sub-byte dtypes, encodable from numbers, decodable to numbers).
#[pyfunction]
fn dtypes() -> Vec<(&'static str, u64, Option<usize>, bool, bool)> {
    Dtype::ALL
        .iter()
        .map(|d| (d.name(), d.bits(), d.size(), d.encodable(), d.decodable()))
        .collect()
}

/// The header of one file: tensors in file order (byte ranges from the start of the
/// file), the metadata, the file size, and whether the header has a `__metadata__`
/// key (an empty one included). Reads the header and the size only.
#[pyfunction]
fn header(py: Python<'_>, path: PathBuf) -> PyResult<FileHeader> {
    guard(|| {
        path_arg(&path, "path")?;
        // An s3:// object: its header by range requests (tlio-core's remote reader).
        let remote = match path.to_str() {
            Some(text) if tlio_core::s3::is_s3_url(text) => Some(
                tlio_core::s3::S3Url::parse(text)
                    .map_err(|e| crate::tokens::remote_err(e.into()))?,
            ),
            _ => None,
        };
        let h = match remote {
            Some(url) => {
                py.detach(|| tlio_core::remote::safetensors_header(&url))
                    .map_err(crate::tokens::remote_err)?
                    .0
            }
            None => py
                .detach(|| read_header(&path))
                .map_err(|e| at_path(&path, e))?,
        };
        let start = h.data_start();
        let rows = h.tensors().iter().map(|t| row(t, start)).collect();
        let present = h.has_metadata();
        Ok((rows, h.metadata, h.file_size, present))
    })
}

/// A model's layout as `safe_open` needs it.
type ModelLayout = (
    Vec<(String, u64)>,
    Vec<(TensorRow, usize)>,
    BTreeMap<String, String>,
);

/// A sharded index or a model directory, checked by tlio-core as `tlio model` checks
/// it: the shards (path, size), every tensor with its shard, and the metadata entries
/// that every shard has with the same value. A shard that is missing or invalid is a
/// `ValueError` naming it (the path given exists; the model is invalid).
#[pyfunction]
fn model(py: Python<'_>, path: PathBuf) -> PyResult<ModelLayout> {
    guard(|| {
        path_arg(&path, "path")?;
        let exists = path.exists();
        let m = py.detach(|| Model::open(&path)).map_err(|e| {
            let err = at_path(&path, e);
            if exists && Python::attach(|py| err.is_instance_of::<PyFileNotFoundError>(py)) {
                Python::attach(|py| PyValueError::new_err(err.value(py).to_string()))
            } else {
                err
            }
        })?;
        Ok(layout(&m))
    })
}

/// The Python view of an opened model.
fn layout(m: &Model) -> ModelLayout {
    let shards = m
        .shards
        .iter()
        .map(|s| (s.path.display().to_string(), s.header.file_size))
        .collect();
    let entries = m
        .entries
        .iter()
        .filter_map(|e| {
            let start = m.shards.get(e.shard)?.header.data_start();
            let t = &e.info;
            let row = (
                t.name.clone(),
                t.dtype.name(),
                t.shape.clone(),
                start.saturating_add(t.data_offsets.0),
                start.saturating_add(t.data_offsets.1),
            );
            Some((row, e.shard))
        })
        .collect();
    let mut common: BTreeMap<String, String> = BTreeMap::new();
    if let Some((first, rest)) = m.shards.split_first() {
        common = first.header.metadata.clone();
        for s in rest {
            common.retain(|k, v| s.header.metadata.get(k) == Some(v));
        }
    }
    (shards, entries, common)
}

/// Decodes the stored bytes `data` of `dtype` to float32 values (exact: BF16 is the top
/// half of a float32, F8 codes map through their tables). The GIL is released.
#[pyfunction]
fn decode<'py>(
    py: Python<'py>,
    dtype: &str,
    tensor: &str,
    data: PyReadonlyArray1<'py, u8>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    guard(|| {
        let d = dtype_arg(dtype, tensor)?;
        let bytes = data
            .as_slice()
            .map_err(|e| PyValueError::new_err(format!("tensor {tensor:?}: {e}")))?;
        // One float32 per stored element; reserved fallibly, so that a tensor larger
        // than the memory available is a MemoryError, never an abort of the process.
        let count = (bytes.len() / d.size().unwrap_or(1).max(1)).saturating_mul(d.lanes());
        let mut out: Vec<f32> = Vec::new();
        out.try_reserve_exact(count).map_err(|_| {
            PyMemoryError::new_err(format!(
                "tensor {tensor:?}: cannot allocate {} bytes to decode it",
                count.saturating_mul(4)
            ))
        })?;
        let (ok, values) = py.detach(|| {
            let ok = decode_f32(d, bytes, &mut out);
            (ok, out)
        });
        if !ok {
            return Err(PyValueError::new_err(format!(
                "tensor {tensor:?}: {dtype} takes raw bytes only and has no decoder (load it with raw=True)"
            )));
        }
        Ok(values.into_pyarray(py))
    })
}

/// The data of one tensor to save, borrowed from a numpy array for the whole write.
pub(crate) enum Held<'py> {
    /// Stored bytes, written as they are.
    Raw(PyReadonlyArray1<'py, u8>),
    /// float32 values, encoded to the tensor's dtype.
    F32(PyReadonlyArray1<'py, f32>),
    /// float64 values, encoded to the tensor's dtype with one rounding.
    F64(PyReadonlyArray1<'py, f64>),
}

/// One tensor as the Python half hands it over: name, dtype name, shape, a flat
/// C-contiguous array, and how to read it (`raw`, `f32` or `f64`).
pub(crate) type Item<'py> = (String, String, Vec<u64>, Bound<'py, PyAny>, String);

/// One tensor to save with its array borrowed: name, dtype, shape, data.
pub(crate) type HeldTensor<'py> = (String, Dtype, Vec<u64>, Held<'py>);

/// Borrows each item's array and checks its dtype name.
pub(crate) fn hold<'py>(items: Vec<Item<'py>>) -> PyResult<Vec<HeldTensor<'py>>> {
    items
        .into_iter()
        .map(|(name, dtype, shape, array, mode)| {
            let d = dtype_arg(&dtype, &name)?;
            let held = match mode.as_str() {
                "raw" => Held::Raw(array.extract()?),
                "f32" => Held::F32(array.extract()?),
                "f64" => Held::F64(array.extract()?),
                other => {
                    return Err(PyValueError::new_err(format!(
                        "tensor {name:?}: unknown data mode {other:?}"
                    )))
                }
            };
            Ok((name, d, shape, held))
        })
        .collect()
}

/// The core tensor over a held array (no copy).
pub(crate) fn tensor<'a>(
    name: &str,
    dtype: Dtype,
    shape: &[u64],
    held: &'a Held<'_>,
) -> PyResult<Tensor<'a>> {
    let contiguous =
        |e: numpy::AsSliceError| PyValueError::new_err(format!("tensor {name:?}: {e}"));
    let data = match held {
        Held::Raw(a) => TensorData::Raw(Cow::Borrowed(a.as_slice().map_err(contiguous)?)),
        Held::F32(a) => TensorData::F32(a.as_slice().map_err(contiguous)?),
        Held::F64(a) => {
            let values = a.as_slice().map_err(contiguous)?;
            if dtype == Dtype::F32 {
                if let Some(i) = first_f32_overflow(values) {
                    let v = values.get(i).copied().unwrap_or(f64::NAN);
                    return Err(PyValueError::new_err(format!(
                        "encode: tensor {name:?}: value {v} at index {i} is beyond the F32 range (it would become an infinity)"
                    )));
                }
            }
            TensorData::F64(values)
        }
    };
    Ok(Tensor {
        name: name.to_string(),
        dtype,
        shape: shape.to_vec(),
        data,
    })
}

/// Writes `items` and `meta` canonically and atomically to `path` through tlio-core;
/// `durable` adds the fsyncs of the file and its directory. `meta=None` writes no
/// `__metadata__`; an empty dict writes an empty one unless `durable` (the chapter's
/// writer omits it). The GIL is released while encoding and writing. A directory that
/// does not exist is a `FileNotFoundError`, as Python's own `open` makes it.
#[pyfunction]
fn save_file(
    py: Python<'_>,
    path: PathBuf,
    items: Vec<Item<'_>>,
    meta: Option<BTreeMap<String, String>>,
    durable: bool,
) -> PyResult<()> {
    guard(|| {
        path_arg(&path, "path")?;
        let held = hold(items).map_err(|e| with_path(&path, e))?;
        let tensors = held
            .iter()
            .map(|(name, dtype, shape, h)| tensor(name, *dtype, shape, h))
            .collect::<PyResult<Vec<_>>>()
            .map_err(|e| with_path(&path, e))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // As Python's own `open(path, "wb")`: a missing directory is ENOENT, a file
            // where the directory should be ENOTDIR, and so on, with the errno.
            let refused = |errno: Option<i32>, why: String| {
                let message = format!("{}: {why}: {}", path.display(), dir.display());
                match errno {
                    Some(n) => os_error(n, message),
                    None => PyOSError::new_err(message),
                }
            };
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(refused(errno_named("ENOTDIR"), "not a directory".into())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(refused(
                        e.raw_os_error().or_else(|| errno_named("ENOENT")),
                        "no such directory".into(),
                    ))
                }
                Err(e) => return Err(refused(e.raw_os_error(), format!("cannot use it ({e})"))),
            }
        }
        py.detach(|| {
            if durable {
                save(&path, &tensors, &meta.unwrap_or_default())
            } else {
                save_unsynced_with_metadata(&path, &tensors, meta.as_ref())
            }
        })
        .map_err(|e| at_path(&path, e))
    })
}

/// ENOENT, the errno of a missing file or directory.
/// The bytes of a safetensors file holding `items` and `meta` (`None`: no
/// `__metadata__`; an empty dict: an empty one), built in memory.
#[pyfunction]
fn serialize<'py>(
    py: Python<'py>,
    items: Vec<Item<'py>>,
    meta: Option<BTreeMap<String, String>>,
) -> PyResult<Bound<'py, PyBytes>> {
    guard(|| {
        let held = hold(items)?;
        let tensors = held
            .iter()
            .map(|(name, dtype, shape, h)| tensor(name, *dtype, shape, h))
            .collect::<PyResult<Vec<_>>>()?;
        let mut out = Vec::new();
        py.detach(|| write_with_metadata(&mut out, &tensors, meta.as_ref()))
            .map_err(core_err)?;
        Ok(PyBytes::new(py, &out))
    })
}

/// The header of a safetensors file given as bytes, as `header` gives it for a file
/// (byte ranges from the start of `data`), with every reader rule checked.
#[pyfunction]
fn header_of_bytes(data: &[u8]) -> PyResult<BytesHeader> {
    guard(|| {
        let h = parse_header(data).map_err(core_err)?;
        let start = h.data_start();
        let rows = h.tensors().iter().map(|t| row(t, start)).collect();
        let meta = h.has_metadata().then(|| h.metadata.clone());
        Ok((rows, meta, h.file_size))
    })
}

/// One tensor of a header with its byte range from the start of the file.
fn row(t: &TensorInfo, start: u64) -> TensorRow {
    (
        t.name.clone(),
        t.dtype.name(),
        t.shape.clone(),
        start.saturating_add(t.data_offsets.0),
        start.saturating_add(t.data_offsets.1),
    )
}

/// One index of a `get_slice(name)[...]` as Python hands it over: `("at", i)`,
/// `("range", start, stop, step)` or `("ellipsis",)`.
type PyIndex = (String, Option<i64>, Option<i64>, Option<i64>);

/// Part of one tensor: the core's read plan for `indices` over the tensor's stored
/// bytes `data` (a view of the map; only the plan's runs are read), as the result's
/// shape and a fresh uint8 array of its bytes. A bad index is a `ValueError` in the
/// package's words.
#[pyfunction]
fn slice<'py>(
    py: Python<'py>,
    dtype: &str,
    tensor: &str,
    shape: Vec<u64>,
    indices: Vec<PyIndex>,
    data: PyReadonlyArray1<'py, u8>,
) -> PyResult<(Vec<u64>, Bound<'py, PyArray1<u8>>)> {
    guard(|| {
        let d = dtype_arg(dtype, tensor)?;
        let idx = indices
            .iter()
            .map(|(kind, a, b, c)| match kind.as_str() {
                "at" => Ok(Index::At(a.unwrap_or(0))),
                "range" => Ok(Index::Range {
                    start: *a,
                    stop: *b,
                    step: *c,
                }),
                "ellipsis" => Ok(Index::Ellipsis),
                other => Err(PyValueError::new_err(format!(
                    "unknown index kind {other:?}"
                ))),
            })
            .collect::<PyResult<Vec<_>>>()?;
        let plan = SlicePlan::new(d, &shape, &idx).map_err(core_err)?;
        let bytes = data
            .as_slice()
            .map_err(|e| PyValueError::new_err(format!("tensor {tensor:?}: {e}")))?;
        let out = py.detach(|| plan.gather(bytes)).map_err(core_err)?;
        Ok((plan.shape, out.into_pyarray(py)))
    })
}

/// A float32 numpy array (any shape, any memory order) as a core F32 tensor named
/// `name`: borrowed when C-contiguous, copied once otherwise. For the checkpoint module.
#[allow(dead_code, reason = "shared with the other modules of the binding")]
pub(crate) fn f32_tensor<'a>(
    name: &str,
    array: &'a PyReadonlyArrayDyn<'_, f32>,
) -> PyResult<Tensor<'a>> {
    let view = array.as_array();
    let shape = view.shape().iter().map(|&n| n as u64).collect();
    let data = match array.as_slice() {
        Ok(values) => TensorData::F32(values),
        Err(_) => TensorData::Raw(Cow::Owned(
            view.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )),
    };
    Ok(Tensor {
        name: name.to_string(),
        dtype: Dtype::F32,
        shape,
        data,
    })
}

/// The stored bytes of a tensor decoded to a writable float32 numpy array of its shape
/// (every decodable dtype, exactly as `load_safetensors` decodes floats; a raw-only
/// dtype is a `ValueError` naming the tensor). For the checkpoint module.
#[allow(dead_code, reason = "shared with the other modules of the binding")]
pub(crate) fn f32_array<'py>(
    py: Python<'py>,
    info: &TensorInfo,
    bytes: &[u8],
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let (ok, values) = py.detach(|| {
        let mut out = Vec::new();
        let ok = decode_f32(info.dtype, bytes, &mut out);
        (ok, out)
    });
    if !ok {
        return Err(PyValueError::new_err(format!(
            "tensor {:?}: {} takes raw bytes only and cannot be decoded to float32",
            info.name, info.dtype
        )));
    }
    let shape = info
        .shape
        .iter()
        .map(|&n| usize::try_from(n))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| PyValueError::new_err(format!("tensor {:?}: shape too large", info.name)))?;
    values.into_pyarray(py).reshape(shape)
}

/// Fills the `safetensors` submodule.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(header, m)?)?;
    m.add_function(wrap_pyfunction!(model, m)?)?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    m.add_function(wrap_pyfunction!(save_file, m)?)?;
    m.add_function(wrap_pyfunction!(serialize, m)?)?;
    m.add_function(wrap_pyfunction!(header_of_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(slice, m)?)?;
    Ok(())
}
