//! `tlio._tlio.checkpoint`: saving, verifying and loading checkpoints through
//! `tlio_core::checkpoint`, the code behind `tlio ckpt save`, `ckpt verify` and
//! `ckpt latest`. The Python module `tlio.checkpoint` wraps these in its public names.
//!
//! Invariants: the protocol (fsyncs, renames, lock, failpoints, LATEST never moving
//! backwards), the trainer-state schema and the optimizer layout are core's; this file
//! converts numpy arrays and JSON text to core types and core errors to exceptions.
//! Every check that can fail runs before the first write. The GIL is released while the
//! files are written, hashed, verified and decoded.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{PyFileExistsError, PyFileNotFoundError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PySlice};
use tlio_core::checkpoint::optimizer::{check_layout, FORMAT_KEY, FORMAT_VALUE, STATE_KEY};
use tlio_core::checkpoint::{
    self, parse_step_name, step_name, CheckpointError, Loaded, OptimizerFile, OptimizerState,
    Payload, RngState, SaveRequest, TrainerState, Unsharded,
};
use tlio_core::remote::location;
use tlio_core::safetensors::{self as st, Dtype, Tensor, TensorData};

use crate::args::{path_arg, str_arg};
use crate::errors::{core_err, guard, one_line, os_error};
use crate::safetensors::{hold, with_path, HeldTensor, Item};
use crate::tokens::count_arg;

/// A checkpoint error as the Python exception python.md names, in the words of a Python
/// call (the core's hints name the CLI's flags).
pub(crate) fn ckpt_err(py: Python<'_>, err: CheckpointError) -> PyErr {
    match &err {
        CheckpointError::NotFound { .. } => PyFileNotFoundError::new_err(one_line(&err)),
        CheckpointError::Locked { .. } => {
            let errno = py
                .import("errno")
                .and_then(|m| m.getattr("EWOULDBLOCK"))
                .and_then(|v| v.extract::<i32>());
            match errno {
                Ok(e) => PyOSError::new_err((e, one_line(&err))),
                Err(_) => PyOSError::new_err(one_line(&err)),
            }
        }
        CheckpointError::Exists { path } => PyValueError::new_err(format!(
            "{} already exists as a complete checkpoint (pass overwrite=True to replace it)",
            path.display()
        )),
        CheckpointError::NotNewer { step, latest, .. } => PyValueError::new_err(format!(
            "step {step} is not newer than {}, which LATEST names and which verifies; \
             a save must move LATEST forward{}",
            step_name(*latest),
            if step == latest {
                " (pass overwrite=True to replace it)"
            } else {
                ""
            }
        )),
        // The loser of two writers of one step on object storage.
        CheckpointError::Lost { .. } => PyFileExistsError::new_err(one_line(&err)),
        _ => core_err(err),
    }
}

/// One float32 array given by the caller: a view of its buffer when C-contiguous, else
/// one copy in C order, made by [`densify`] with the GIL released (a transposed or
/// sliced array of gigabytes must not stop every other Python thread).
enum F32Data<'py> {
    View(PyReadonlyArrayDyn<'py, f32>),
    /// Not C-contiguous: still to be copied.
    Strided(PyReadonlyArrayDyn<'py, f32>),
    Owned(Vec<f32>),
}

/// A named float32 array, its shape and its data.
struct Named<'py> {
    name: String,
    shape: Vec<u64>,
    data: F32Data<'py>,
}

impl Named<'_> {
    fn values(&self) -> PyResult<&[f32]> {
        match &self.data {
            F32Data::View(a) => a
                .as_slice()
                .map_err(|e| PyValueError::new_err(format!("{}: {e}", self.name))),
            F32Data::Owned(v) => Ok(v),
            F32Data::Strided(_) => Err(PyValueError::new_err(format!(
                "{}: internal error: a strided array was not copied",
                self.name
            ))),
        }
    }
}

/// Copy every strided array of `arrays` into C order, with the GIL released.
fn densify(py: Python<'_>, arrays: &mut [Named<'_>]) {
    let copies: Vec<Option<Vec<f32>>> = {
        let views: Vec<_> = arrays
            .iter()
            .map(|a| match &a.data {
                F32Data::Strided(ro) => Some(ro.as_array()),
                F32Data::View(_) | F32Data::Owned(_) => None,
            })
            .collect();
        py.detach(|| {
            views
                .iter()
                .map(|v| v.as_ref().map(|v| v.iter().copied().collect()))
                .collect()
        })
    };
    for (a, copy) in arrays.iter_mut().zip(copies) {
        if let Some(values) = copy {
            a.data = F32Data::Owned(values);
        }
    }
}

/// `value` as a float32 array named `what` (float64 and every other dtype refused: a
/// checkpoint's F32 is never reached by a silent conversion).
fn f32_array<'py>(value: &Bound<'py, PyAny>, name: String, what: &str) -> PyResult<Named<'py>> {
    let arr = value.cast::<PyArrayDyn<f32>>().map_err(|_| {
        // A numpy scalar (np.float32(1.0)) has the dtype float32 but is no array: name
        // its type, or the message would read "is float32, not float32".
        let is_array = value.is_instance_of::<numpy::PyUntypedArray>();
        let what_it_is = match value.getattr("dtype") {
            Ok(d) if is_array => format!("an array of {}", d.str().map(|s| s.to_string()).unwrap_or_default()),
            _ => format!("a {}", value.get_type().name().map(|n| n.to_string()).unwrap_or_default()),
        };
        PyValueError::new_err(format!(
            "{what} {name:?} is {what_it_is}, not a float32 numpy array: checkpoint files hold F32 arrays"
        ))
    })?;
    let shape: Vec<u64> = arr.shape().iter().map(|&d| d as u64).collect();
    let ro = arr.readonly();
    let data = if ro.is_c_contiguous() {
        F32Data::View(ro)
    } else {
        F32Data::Strided(ro)
    };
    Ok(Named { name, shape, data })
}

/// The arrays of a `{name: array}` dict, in its order.
fn model_arrays<'py>(model: &Bound<'py, PyDict>) -> PyResult<Vec<Named<'py>>> {
    model
        .iter()
        .map(|(k, v)| {
            let name = str_arg(&k, "a model name")?;
            f32_array(&v, name, "model tensor")
        })
        .collect()
}

/// The optimizer's arrays, `{param: {key: array}}` named `<param>.<key>`.
fn optimizer_arrays<'py>(state: &Bound<'py, PyDict>) -> PyResult<Vec<Named<'py>>> {
    let mut out = Vec::new();
    for (param, entry) in state.iter() {
        let param = str_arg(&param, "an optimizer state's parameter name")?;
        let entry = entry.cast::<PyDict>().map_err(|_| {
            PyValueError::new_err(format!(
                "optimizer state of {param:?} must be a dict of arrays"
            ))
        })?;
        for (key, value) in entry.iter() {
            let key = str_arg(&key, "an optimizer state key")?;
            out.push(f32_array(
                &value,
                format!("{param}.{key}"),
                "optimizer array",
            )?);
        }
    }
    Ok(out)
}

/// The tensors of `arrays` for the writer.
fn tensors<'a>(arrays: &'a [Named<'_>]) -> PyResult<Vec<Tensor<'a>>> {
    arrays
        .iter()
        .map(|a| {
            Ok(Tensor {
                name: a.name.clone(),
                dtype: Dtype::F32,
                shape: a.shape.clone(),
                data: TensorData::F32(a.values()?),
            })
        })
        .collect()
}

fn write_file(
    out: &mut dyn Write,
    tensors: &[Tensor<'_>],
    meta: &BTreeMap<String, String>,
) -> io::Result<()> {
    st::write(out, tensors, meta)
        .map(|_| ())
        .map_err(io::Error::other)
}

/// Refuses tensors that the writer would refuse (the reserved name `__metadata__`, a
/// duplicate, a size that does not fit) before the step directory exists: a
/// `ValueError` naming the file, never an `OSError` half-way through the save.
fn check_payload(dir: &Path, file: &str, tensors: &[Tensor<'_>]) -> PyResult<()> {
    st::write::check_tensors(tensors).map_err(|e| with_path(&dir.join(file), core_err(e)))
}

/// The optimizer's state from its JSON, checked against the arrays and the model.
fn optimizer_meta(
    json: &str,
    arrays: &[Named<'_>],
    model: &[Named<'_>],
) -> Result<BTreeMap<String, String>, CheckpointError> {
    let invalid = |e: &dyn std::fmt::Display| CheckpointError::Optimizer(e.to_string());
    let state = OptimizerState::from_json(json).map_err(|e| invalid(&e))?;
    let names: BTreeMap<&str, &[u64]> = arrays
        .iter()
        .map(|a| (a.name.as_str(), a.shape.as_slice()))
        .collect();
    if names.len() != arrays.len() {
        return Err(invalid(
            &"two optimizer arrays have the same <parameter>.<key> name",
        ));
    }
    let params: BTreeMap<String, Vec<u64>> = model
        .iter()
        .map(|a| (a.name.clone(), a.shape.clone()))
        .collect();
    check_layout(&state, &names, Some(&params)).map_err(|e| invalid(&e))?;
    OptimizerFile {
        state,
        tensors: BTreeMap::new(),
    }
    .metadata()
    .map_err(|e| invalid(&e))
}

/// Save one checkpoint step with core's protocol; returns the step directory.
///
/// `state_json` is the trainer state without `rng_state` (missing keys take their
/// defaults), `rng` the generator's `(state, inc)`, `opt_json` the optimizer's JSON
/// state (hyper-parameters and step) with `opt_state` its arrays.
#[pyfunction]
#[pyo3(signature = (dir, model, opt_json, opt_state, state_json, rng, config, keep, overwrite))]
#[allow(
    clippy::too_many_arguments,
    reason = "one private call of tlio.checkpoint"
)]
fn save(
    py: Python<'_>,
    dir: PathBuf,
    model: &Bound<'_, PyDict>,
    opt_json: Option<String>,
    opt_state: Option<&Bound<'_, PyDict>>,
    state_json: &str,
    rng: Option<(u64, u64)>,
    config: Option<Vec<u8>>,
    keep: Option<&Bound<'_, PyAny>>,
    overwrite: bool,
) -> PyResult<String> {
    guard(|| {
        path_arg(&dir, "dir")?;
        let mut model = model_arrays(model)?;
        let mut opt = match opt_state {
            Some(s) => optimizer_arrays(s)?,
            None => Vec::new(),
        };
        let keep = match keep.filter(|k| !k.is_none()) {
            Some(k) => Some(
                usize::try_from(count_arg(k, "keep")?)
                    .map_err(|_| PyValueError::new_err("keep is too large"))?,
            ),
            None => None,
        };
        densify(py, &mut model);
        densify(py, &mut opt);
        let model_tensors = tensors(&model)?;
        let opt_tensors = tensors(&opt)?;
        check_payload(&dir, checkpoint::MODEL_NAME, &model_tensors)?;
        check_payload(&dir, checkpoint::OPTIMIZER_NAME, &opt_tensors)?;
        // The cheap checks, before anything is written (core checks them all again).
        let prepared = (|| -> Result<_, CheckpointError> {
            let mut state = TrainerState::from_json_with_defaults(state_json.as_bytes())?;
            state.rng_state = rng.map(|(state, inc)| RngState { state, inc });
            let opt_meta = opt_json
                .as_deref()
                .map(|j| optimizer_meta(j, &opt, &model))
                .transpose()?;
            Ok((state, opt_meta))
        })();
        let (state, opt_meta) = prepared.map_err(|e| ckpt_err(py, e))?;
        let result = py.detach(|| -> Result<checkpoint::SaveReport, CheckpointError> {
            let model_meta = BTreeMap::from([(FORMAT_KEY.to_string(), FORMAT_VALUE.to_string())]);
            let (mt, ot) = (&model_tensors, &opt_tensors);
            let req = SaveRequest {
                step: state.step,
                model: Payload::Writer(Box::new(move |out: &mut dyn Write| {
                    write_file(out, mt, &model_meta)
                })),
                optimizer: opt_meta.map(|meta| {
                    Payload::Writer(Box::new(move |out: &mut dyn Write| {
                        write_file(out, ot, &meta)
                    }))
                }),
                state,
                config: config.map(Cow::Owned),
                keep,
                overwrite,
                force: false,
                // The CLI's wait: a save queued behind another save or a gc waits as
                // `tlio ckpt save` does, then fails with OSError.
                lock_wait: checkpoint::SAVE_LOCK_WAIT,
            };
            location::save(&dir, req)
        });
        committed(py, result.map_err(|e| ckpt_err(py, e))?)
    })
}

/// The path of a committed save, after warning (`warnings.warn`, `UserWarning`) of
/// each cleanup problem: the step is committed, so the save succeeded.
fn committed(py: Python<'_>, report: checkpoint::SaveReport) -> PyResult<String> {
    for problem in &report.cleanup_problems {
        let text = format!("{problem} (the save succeeded; the next save or gc removes it)");
        let text = std::ffi::CString::new(text.replace('\0', "\\0"))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        PyErr::warn(
            py,
            &py.get_type::<pyo3::exceptions::PyUserWarning>(),
            &text,
            1,
        )?;
    }
    Ok(report.path.display().to_string())
}

/// Held tensors as core tensors (views of the caller's arrays, no copy).
fn held_tensors<'a>(held: &'a [HeldTensor<'_>]) -> PyResult<Vec<Tensor<'a>>> {
    held.iter()
        .map(|(name, dtype, shape, h)| crate::safetensors::tensor(name, *dtype, shape, h))
        .collect()
}

/// Save one checkpoint step whose tensors keep their own dtypes (`tlio.torch`): the
/// model's and the optimizer's tensors as `(name, dtype, shape, flat array, mode)`
/// items (those of `tlio.safetensors`), `model_meta` the model file's metadata beside
/// `format`, `opt_state_json` the optimizer's JSON state (python.md's torch form, which
/// core checks against the model's names). The rest as in `save`.
#[pyfunction]
#[pyo3(signature = (dir, model, model_meta, opt, opt_state_json, state_json, rng, config, keep, overwrite))]
#[allow(clippy::too_many_arguments, reason = "one private call of tlio.torch")]
fn save_tensors(
    py: Python<'_>,
    dir: PathBuf,
    model: Vec<Item<'_>>,
    model_meta: BTreeMap<String, String>,
    opt: Option<Vec<Item<'_>>>,
    opt_state_json: Option<String>,
    state_json: &str,
    rng: Option<(u64, u64)>,
    config: Option<Vec<u8>>,
    keep: Option<&Bound<'_, PyAny>>,
    overwrite: bool,
) -> PyResult<String> {
    guard(|| {
        path_arg(&dir, "dir")?;
        let model_held = hold(model)?;
        let opt_held = opt.map(hold).transpose()?;
        let keep = match keep.filter(|k| !k.is_none()) {
            Some(k) => Some(
                usize::try_from(count_arg(k, "keep")?)
                    .map_err(|_| PyValueError::new_err("keep is too large"))?,
            ),
            None => None,
        };
        let model_tensors = held_tensors(&model_held)?;
        let opt_tensors = opt_held.as_deref().map(held_tensors).transpose()?;
        check_payload(&dir, checkpoint::MODEL_NAME, &model_tensors)?;
        if let Some(t) = &opt_tensors {
            check_payload(&dir, checkpoint::OPTIMIZER_NAME, t)?;
        }
        let mut model_meta = model_meta;
        model_meta.insert(FORMAT_KEY.to_string(), FORMAT_VALUE.to_string());
        let opt_meta = match (&opt_tensors, opt_state_json) {
            (Some(_), Some(json)) => Some(BTreeMap::from([
                (FORMAT_KEY.to_string(), FORMAT_VALUE.to_string()),
                (STATE_KEY.to_string(), json),
            ])),
            (None, None) => None,
            _ => {
                return Err(PyValueError::new_err(
                    "optimizer tensors and their JSON state come together",
                ))
            }
        };
        let mut state = TrainerState::from_json_with_defaults(state_json.as_bytes())
            .map_err(|e| ckpt_err(py, e.into()))?;
        state.rng_state = rng.map(|(state, inc)| RngState { state, inc });
        let result = py.detach(|| -> Result<checkpoint::SaveReport, CheckpointError> {
            let (mt, ot) = (&model_tensors, &opt_tensors);
            let req = SaveRequest {
                step: state.step,
                model: Payload::Writer(Box::new(move |out: &mut dyn Write| {
                    write_file(out, mt, &model_meta)
                })),
                optimizer: opt_meta.map(|meta| {
                    Payload::Writer(Box::new(move |out: &mut dyn Write| {
                        write_file(out, ot.as_deref().unwrap_or_default(), &meta)
                    }))
                }),
                state,
                config: config.map(Cow::Owned),
                keep,
                overwrite,
                force: false,
                lock_wait: checkpoint::SAVE_LOCK_WAIT,
            };
            location::save(&dir, req)
        });
        committed(py, result.map_err(|e| ckpt_err(py, e))?)
    })
}

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
fn load_step<'py>(
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
fn load_files<'py>(
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

/// The problems of one step directory, each naming the file and the rule (empty when
/// it verifies).
#[pyfunction]
fn verify_step_dir(py: Python<'_>, path: PathBuf) -> PyResult<Vec<String>> {
    guard(|| {
        path_arg(&path, "path")?;
        if location::is_remote(&path) {
            let found = py.detach(|| location::inspect_step(&path, &mut |_| {}));
            let problems = found.map_err(|e| ckpt_err(py, e))?.problems;
            return Ok(problems.iter().map(ToString::to_string).collect());
        }
        if let Err(e) = std::fs::symlink_metadata(&path) {
            let message = format!("{}: {e}", path.display());
            return Err(match (e.raw_os_error(), e.kind()) {
                (Some(errno), _) => os_error(errno, message),
                (None, io::ErrorKind::NotFound) => PyFileNotFoundError::new_err(message),
                (None, _) => PyOSError::new_err(message),
            });
        }
        let problems = py.detach(|| checkpoint::verify(&path));
        Ok(problems.iter().map(ToString::to_string).collect())
    })
}

/// `step-` and the step in at least six digits.
#[pyfunction(name = "step_name")]
fn py_step_name(step: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(step_name(count_arg(step, "step")?))
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
fn load<'py>(
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

/// Fills the `checkpoint` submodule.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(save, m)?)?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(save_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(load_step, m)?)?;
    m.add_function(wrap_pyfunction!(load_files, m)?)?;
    m.add_function(wrap_pyfunction!(verify_step_dir, m)?)?;
    m.add_function(wrap_pyfunction!(py_step_name, m)?)?;
    Ok(())
}
