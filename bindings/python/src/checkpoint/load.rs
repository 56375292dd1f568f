//! `load`, `load_step` and `load_files`: one verified step read back as numpy arrays
//! (views of the hashed bytes where the dtype allows) and JSON text, with the steps
//! `load` skipped and why; the GIL released while the step is read and decoded.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use numpy::PyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PySlice};
use tlio_core::checkpoint::{self, parse_step_name, CheckpointError, Loaded, Unsharded};
use tlio_core::remote::location;
use tlio_core::safetensors::{self as st, Dtype};

use super::ckpt_err;
use crate::args::path_arg;
use crate::errors::{core_err, guard, one_line};
use crate::tokens::count_arg;

/// The step directories `load` rejected, as python.md's `skipped` (a bad LATEST is not
/// a directory).
fn skipped_dirs<'py>(py: Python<'py>, loaded: &Loaded) -> PyResult<Bound<'py, PyList>> {
    let skipped = PyList::empty(py);
    for (name, why) in &loaded.skipped {
        if parse_step_name(name).is_some() {
            skipped.append((name, why))?;
        }
    }
    Ok(skipped)
}

/// Choose and verify a checkpoint as `load` does, without decoding its tensors (for
/// `tlio.torch`, which reads them in their own dtypes). Returns (path, step,
/// trainer_state_json, rng, config, skipped).
#[pyfunction]
#[pyo3(signature = (dir, step=None))]
pub(super) fn load_step<'py>(
    py: Python<'py>,
    dir: PathBuf,
    step: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    guard(|| {
        path_arg(&dir, "dir")?;
        let step = step
            .filter(|s| !s.is_none())
            .map(|s| count_arg(s, "step"))
            .transpose()?;
        let loaded = py
            .detach(|| location::load(&dir, step))
            .map_err(|e| ckpt_err(py, e))?;
        let state_json = String::from_utf8(loaded.state.to_json().map_err(core_err)?)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let rng = loaded.state.rng_state.map(|r| (r.state, r.inc));
        let config = loaded.config.as_deref().map(|c| PyBytes::new(py, c));
        let skipped = skipped_dirs(py, &loaded)?;
        let path = loaded.path.display().to_string();
        Ok((path, loaded.step, state_json, rng, config, skipped)
            .into_pyobject(py)?
            .into_any())
    })
}

/// One safetensors file of a loaded checkpoint: its bytes (an owned numpy uint8 array
/// over the very buffer the core read and hashed, not copied), its tensors as
/// `tlio.safetensors` rows (byte ranges from the start of the file) and its metadata.
type FileParts<'py> = (
    Bound<'py, PyArray1<u8>>,
    Vec<(String, &'static str, Vec<u64>, u64, u64)>,
    BTreeMap<String, String>,
);

/// The rows and metadata of a verified safetensors file held in memory.
fn file_parts<'py>(py: Python<'py>, name: &str, bytes: Vec<u8>) -> PyResult<FileParts<'py>> {
    let header = checkpoint::TensorBytes::parse(&bytes)
        .map_err(|e| PyValueError::new_err(format!("{name}: {}", one_line(&e))))?;
    let start = header.header().data_start();
    let rows = header
        .header()
        .tensors()
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.dtype.name(),
                t.shape.clone(),
                start.saturating_add(t.data_offsets.0),
                start.saturating_add(t.data_offsets.1),
            )
        })
        .collect();
    let meta = header.header().metadata.clone();
    Ok((PyArray1::from_vec(py, bytes), rows, meta))
}

/// Choose, verify and read a checkpoint as `load` does, every file read once into
/// owned memory while it is hashed (GIL released, files on parallel threads), for
/// `tlio.torch` and the any-dtype form of `load_checkpoint`, which decode tensors in
/// Python from those bytes. Returns (path, step, trainer_state_json, rng, config,
/// skipped, files) with files `{name: (bytes, rows, metadata)}` for each safetensors
/// file of the step. With `unless_sharded`, `None` when the choice reaches a sharded
/// step (nothing of it read but its manifest: the sharded loader reads it).
#[pyfunction]
#[pyo3(signature = (dir, step=None, unless_sharded=false))]
pub(super) fn load_files<'py>(
    py: Python<'py>,
    dir: PathBuf,
    step: Option<&Bound<'py, PyAny>>,
    unless_sharded: bool,
) -> PyResult<Bound<'py, PyAny>> {
    guard(|| {
        path_arg(&dir, "dir")?;
        let step = step
            .filter(|s| !s.is_none())
            .map(|s| count_arg(s, "step"))
            .transpose()?;
        let found = py
            .detach(|| {
                if unless_sharded {
                    location::load_unless_sharded(&dir, step)
                } else if location::is_remote(&dir) {
                    location::load(&dir, step).map(|l| Unsharded::Loaded(Box::new(l)))
                } else {
                    checkpoint::load(&dir, step).map(|l| Unsharded::Loaded(Box::new(l)))
                }
            })
            .map_err(|e| ckpt_err(py, e))?;
        let mut loaded = match found {
            Unsharded::Loaded(l) => *l,
            Unsharded::Sharded(_) => return Ok(py.None().into_bound(py)),
        };
        let files = PyDict::new(py);
        for (name, bytes) in std::mem::take(&mut loaded.files) {
            if name.ends_with(".safetensors") {
                let parts = file_parts(py, &loaded.file(&name).display().to_string(), bytes)?;
                files.set_item(name, parts)?;
            }
        }
        let state_json = String::from_utf8(loaded.state.to_json().map_err(core_err)?)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let rng = loaded.state.rng_state.map(|r| (r.state, r.inc));
        let config = loaded.config.as_deref().map(|c| PyBytes::new(py, c));
        let skipped = skipped_dirs(py, &loaded)?;
        let path = loaded.path.display().to_string();
        Ok((path, loaded.step, state_json, rng, config, skipped, files)
            .into_pyobject(py)?
            .into_any())
    })
}

/// The values of one loaded tensor: where its F32 bytes lie in its file's buffer (to be
/// viewed there, not copied), or decoded from another float dtype.
enum Values {
    View(Range<usize>),
    Decoded(Vec<f32>),
}

/// A loaded array: name, shape, values.
type Array = (String, Vec<u64>, Values);
/// A parameter's optimizer arrays, by key.
type ParamArrays = (String, Vec<Array>);

/// A tensor of a verified file as [`Values`]: a view when it is F32 in this machine's
/// byte order and its start is aligned for f32 in the buffer at `base` (the buffer
/// does not move when numpy takes it over), else decoded.
fn values(
    file: &checkpoint::TensorBytes<'_>,
    base: *const u8,
    info: &st::TensorInfo,
) -> Result<Values, PyErr> {
    let range = file.range(info);
    if let Some(range) = range.filter(|r| {
        info.dtype == Dtype::F32
            && cfg!(target_endian = "little")
            && (base as usize).wrapping_add(r.start) % std::mem::align_of::<f32>() == 0
    }) {
        return Ok(Values::View(range));
    }
    file.decode_f32(&info.name)
        .map(Values::Decoded)
        .map_err(core_err)
}

/// What `load` found: the model's and optimizer's verified bytes and their arrays
/// (in file order), the optimizer's JSON state.
struct Decoded {
    loaded: Loaded,
    model: (Vec<u8>, Vec<Array>),
    /// The optimizer's JSON state, its bytes and its arrays by parameter, then key.
    opt: Option<(String, Vec<u8>, Vec<ParamArrays>)>,
}

fn decode(dir: &Path, step: Option<u64>) -> Result<Decoded, PyErrOrCkpt> {
    let py_err = |e: PyErr| PyErrOrCkpt::Py(e);
    let mut loaded = location::load(dir, step).map_err(PyErrOrCkpt::Ckpt)?;
    let file = loaded.model().map_err(|e| py_err(core_err(e)))?;
    let model_base = file_base(&loaded, checkpoint::MODEL_NAME);
    let mut model = Vec::new();
    for t in file.header().tensors() {
        let v = values(&file, model_base, t).map_err(py_err)?;
        model.push((t.name.clone(), t.shape.clone(), v));
    }
    let opt = match loaded.optimizer_bytes().map_err(|e| py_err(core_err(e)))? {
        None => None,
        Some((state, file)) => {
            let json = state.to_json().map_err(|e| py_err(core_err(e)))?;
            let base = file_base(&loaded, checkpoint::OPTIMIZER_NAME);
            let keys = state.state_keys();
            let mut by_param = Vec::new();
            for (param, _, _) in &model {
                let mut arrays = Vec::new();
                for k in keys {
                    if let Some(info) = file.header().get(&format!("{param}.{k}")) {
                        let v = values(&file, base, info).map_err(py_err)?;
                        arrays.push(((*k).to_string(), info.shape.clone(), v));
                    }
                }
                if !arrays.is_empty() {
                    by_param.push((param.clone(), arrays));
                }
            }
            Some((json, by_param))
        }
    };
    // The views name ranges of these very buffers, taken out of `loaded` whole.
    let model_bytes = loaded
        .files
        .remove(checkpoint::MODEL_NAME)
        .unwrap_or_default();
    let opt = opt.map(|(json, by_param)| {
        let bytes = loaded
            .files
            .remove(checkpoint::OPTIMIZER_NAME)
            .unwrap_or_default();
        (json, bytes, by_param)
    });
    Ok(Decoded {
        loaded,
        model: (model_bytes, model),
        opt,
    })
}

/// The address of a loaded file's buffer (null when it has none).
fn file_base(loaded: &Loaded, name: &str) -> *const u8 {
    loaded.bytes(name).map_or(std::ptr::null(), <[u8]>::as_ptr)
}

/// A load failure: core's, or already an exception.
enum PyErrOrCkpt {
    Ckpt(CheckpointError),
    Py(PyErr),
}

/// The arrays of one loaded file: F32 tensors as writable views of `bytes` (which
/// numpy takes over without a copy, and every view keeps alive), others from their
/// decoded values.
fn arrays<'py>(
    py: Python<'py>,
    bytes: Vec<u8>,
    arrays: Vec<Array>,
) -> PyResult<Vec<(String, Bound<'py, PyAny>)>> {
    let base = PyArray1::from_vec(py, bytes);
    let float32 = numpy::dtype::<f32>(py);
    let mut out = Vec::with_capacity(arrays.len());
    for (name, shape, v) in arrays {
        let dims: Vec<usize> = shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<_, _>>()
            .map_err(|_| PyValueError::new_err("a tensor dimension does not fit this machine"))?;
        let a = match v {
            Values::Decoded(values) => PyArray1::from_vec(py, values).into_any(),
            Values::View(r) => base
                .get_item(PySlice::new(
                    py,
                    isize::try_from(r.start)?,
                    isize::try_from(r.end)?,
                    1,
                ))?
                .call_method1("view", (&float32,))?,
        };
        out.push((name, a.call_method1("reshape", (dims,))?));
    }
    Ok(out)
}

/// Load the checkpoint `ckpt latest` picks (or `step`, falling back to older steps).
/// Returns (path, step, model, opt, trainer_state_json, rng, config, skipped); `opt` is
/// (json state, {param: {key: array}}) or None.
#[pyfunction]
#[pyo3(signature = (dir, step=None))]
pub(super) fn load<'py>(
    py: Python<'py>,
    dir: PathBuf,
    step: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    guard(|| {
        path_arg(&dir, "dir")?;
        let step = step
            .filter(|s| !s.is_none())
            .map(|s| count_arg(s, "step"))
            .transpose()?;
        let decoded = py.detach(|| decode(&dir, step)).map_err(|e| match e {
            PyErrOrCkpt::Ckpt(e) => ckpt_err(py, e),
            PyErrOrCkpt::Py(e) => e,
        })?;
        let Decoded { loaded, model, opt } = decoded;
        let model_dict = PyDict::new(py);
        for (name, a) in arrays(py, model.0, model.1)? {
            model_dict.set_item(name, a)?;
        }
        let opt = match opt {
            None => py.None().into_bound(py),
            Some((json, bytes, by_param)) => {
                // One buffer for the file: its arrays flattened in order, then regrouped.
                let counts: Vec<(String, usize)> =
                    by_param.iter().map(|(p, a)| (p.clone(), a.len())).collect();
                let flat = by_param.into_iter().flat_map(|(_, a)| a).collect();
                let mut made = arrays(py, bytes, flat)?.into_iter();
                let state = PyDict::new(py);
                for (param, n) in counts {
                    let entry = PyDict::new(py);
                    for (key, a) in made.by_ref().take(n) {
                        entry.set_item(key, a)?;
                    }
                    state.set_item(param, entry)?;
                }
                (json, state).into_pyobject(py)?.into_any()
            }
        };
        let state_json = String::from_utf8(loaded.state.to_json().map_err(core_err)?)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let rng = loaded.state.rng_state.map(|r| (r.state, r.inc));
        let config = loaded.config.as_deref().map(|c| PyBytes::new(py, c));
        let skipped = skipped_dirs(py, &loaded)?;
        let path = loaded.path.display().to_string();
        Ok((
            path,
            loaded.step,
            model_dict,
            opt,
            state_json,
            rng,
            config,
            skipped,
        )
            .into_pyobject(py)?
            .into_any())
    })
}
