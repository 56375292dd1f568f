//! `save` and `save_tensors`: numpy arrays (or held tensors) and JSON text turned into
//! one checkpoint step by core's protocol, every check run before the first write and
//! the GIL released while the files are written.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use numpy::{PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tlio_core::checkpoint::optimizer::{check_layout, FORMAT_KEY, FORMAT_VALUE, STATE_KEY};
use tlio_core::checkpoint::{
    self, CheckpointError, OptimizerFile, OptimizerState, Payload, RngState, SaveRequest,
    TrainerState,
};
use tlio_core::remote::location;
use tlio_core::safetensors::{self as st, Dtype, Tensor, TensorData};

use super::ckpt_err;
use crate::args::{path_arg, str_arg};
use crate::errors::{core_err, guard};
use crate::safetensors::{hold, with_path, HeldTensor, Item};
use crate::tokens::count_arg;

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
pub(super) fn save(
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
pub(super) fn save_tensors(
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
