//! The writing side: `begin` / `begin_named` (rank 0's save in progress, committed or
//! aborted) and `write_rank_file` (one rank's data file and its table).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use numpy::PyReadonlyArray1;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tlio_core::checkpoint::sharded::{
    self as core_sharded, ChunkData, ChunkRequest, CommitRequest, Group, RankFile, TensorRequest,
    WrittenChunk,
};
use tlio_core::checkpoint::{RngState, TrainerState};
use tlio_core::remote::location;

use super::{group_arg, opt_count, sharded_err};
use crate::args::path_arg;
use crate::checkpoint::ckpt_err;
use crate::errors::guard;
use crate::safetensors::dtype_arg;
use crate::tokens::count_arg;

/// A sharded save in progress on rank 0 (from `begin`): the lock is held and
/// `tmp_dir` exists until `commit` or `abort` (or until the object is collected).
#[pyclass(module = "tlio._tlio.sharded", frozen)]
pub struct ShardedSave {
    inner: Mutex<location::ShardedSaveAt>,
    tmp_dir: String,
    probe: Option<String>,
    step: u64,
}

/// Start a sharded save of `step` in `dir` (rank 0 only).
#[pyfunction]
#[pyo3(signature = (dir, step, overwrite=false))]
pub(super) fn begin(
    py: Python<'_>,
    dir: PathBuf,
    step: &Bound<'_, PyAny>,
    overwrite: bool,
) -> PyResult<ShardedSave> {
    guard(|| {
        path_arg(&dir, "dir")?;
        let step = count_arg(step, "step")?;
        let save = py
            .detach(|| location::sharded_begin(&dir, step, overwrite))
            .map_err(|e| sharded_err(py, e))?;
        Ok(ShardedSave::started(save, step))
    })
}

impl ShardedSave {
    /// The Python object of a save just begun (its tmp directory read once, here).
    fn started(save: location::ShardedSaveAt, step: u64) -> Self {
        let tmp_dir = save
            .tmp_dir()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let probe = save.probe().map(str::to_string);
        ShardedSave {
            inner: Mutex::new(save),
            tmp_dir,
            probe,
            step,
        }
    }
}

/// Start a sharded save of `step` into the directory `step_dir` of any name (a
/// canonical `step-NNNNNN` name is its parent's step, LATEST included).
#[pyfunction]
#[pyo3(signature = (step_dir, step, overwrite=false))]
pub(super) fn begin_named(
    py: Python<'_>,
    step_dir: PathBuf,
    step: &Bound<'_, PyAny>,
    overwrite: bool,
) -> PyResult<ShardedSave> {
    guard(|| {
        path_arg(&step_dir, "step_dir")?;
        let step = count_arg(step, "step")?;
        let save = py
            .detach(|| core_sharded::begin_named(&step_dir, step, overwrite))
            .map_err(|e| sharded_err(py, e))?;
        Ok(ShardedSave::started(
            location::ShardedSaveAt::Local(save),
            step,
        ))
    })
}

fn item<'py, T>(d: &Bound<'py, PyDict>, key: &str, what: &str) -> PyResult<T>
where
    T: pyo3::conversion::FromPyObjectOwned<'py>,
{
    let value = d
        .get_item(key)?
        .ok_or_else(|| PyValueError::new_err(format!("{what}: missing key {key:?}")))?;
    value.extract::<T>().map_err(|e| {
        let e: PyErr = e.into();
        PyValueError::new_err(format!("{what}: key {key:?}: {e}"))
    })
}

/// One dict of `write_rank_file` back as core's table.
fn rank_file(d: &Bound<'_, PyAny>) -> PyResult<RankFile> {
    let d = d
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("files must be the dicts write_rank_file returned"))?;
    let name: String = item(d, "name", "a rank file")?;
    let what = format!("rank file {name:?}");
    let tensors_obj: Bound<'_, PyDict> = item(d, "tensors", &what)?;
    let mut tensors = BTreeMap::new();
    for (k, v) in tensors_obj.iter() {
        let key: String = k.extract()?;
        let v = v
            .cast::<PyDict>()
            .map_err(|_| PyTypeError::new_err(format!("{what}: tensor {key:?} is not a dict")))?;
        let dtype: String = item(v, "dtype", &what)?;
        tensors.insert(
            key.clone(),
            WrittenChunk {
                dtype: dtype_arg(&dtype, &key)?,
                shape: item(v, "shape", &what)?,
                begin: item(v, "begin", &what)?,
                end: item(v, "end", &what)?,
                pieces: item(v, "pieces", &what)?,
            },
        );
    }
    Ok(RankFile {
        size: item(d, "size", &what)?,
        sha256: item(d, "sha256", &what)?,
        name,
        tensors,
    })
}

/// One entry of `tensors` as core's request.
fn tensor_request(d: &Bound<'_, PyAny>) -> PyResult<TensorRequest> {
    let d = d
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("tensors must be dicts"))?;
    let name: String = item(d, "name", "a tensor")?;
    let what = format!("tensor {name:?}");
    let group: String = item(d, "group", &what)?;
    let dtype: String = item(d, "dtype", &what)?;
    let chunks: Bound<'_, PyList> = item(d, "chunks", &what)?;
    let chunks = chunks
        .iter()
        .map(|c| {
            let c = c
                .cast::<PyDict>()
                .map_err(|_| PyTypeError::new_err(format!("{what}: chunks must be dicts")))?;
            Ok(ChunkRequest {
                offsets: item(c, "offsets", &what)?,
                sizes: item(c, "sizes", &what)?,
                file: item(c, "file", &what)?,
                key: item(c, "key", &what)?,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(TensorRequest {
        group: group_arg(&group)?,
        dtype: dtype_arg(&dtype, &name)?,
        shape: item(d, "shape", &what)?,
        name,
        chunks,
    })
}

fn meta_arg(meta: &Bound<'_, PyDict>) -> PyResult<BTreeMap<Group, BTreeMap<String, String>>> {
    let mut out = BTreeMap::new();
    for (g, m) in meta.iter() {
        let g: String = g.extract()?;
        let m: BTreeMap<String, String> = m.extract().map_err(|_| {
            PyTypeError::new_err(format!("meta[{g:?}] must be a dict of str to str"))
        })?;
        out.insert(group_arg(&g)?, m);
    }
    Ok(out)
}

#[pymethods]
impl ShardedSave {
    /// `step-N.tmp`, where every rank writes its files.
    #[getter]
    fn tmp_dir(&self) -> String {
        self.tmp_dir.clone()
    }

    /// The token of the probe every rank checks in a local `tmp_dir` before writing
    /// (`check_shared`); None on object storage.
    #[getter]
    fn probe(&self) -> Option<String> {
        self.probe.clone()
    }

    /// The step being saved.
    #[getter]
    fn step(&self) -> u64 {
        self.step
    }

    /// Check the chunk table, write shards.json, the trainer state, the config and the
    /// manifest last, and commit; returns the step directory. On error nothing is
    /// committed and the tmp directory is removed.
    #[pyo3(signature = (files, tensors, meta, state_json, rng, config, keep))]
    #[allow(clippy::too_many_arguments, reason = "one private call of tlio.torch")]
    fn commit(
        &self,
        py: Python<'_>,
        files: &Bound<'_, PyList>,
        tensors: &Bound<'_, PyList>,
        meta: &Bound<'_, PyDict>,
        state_json: &str,
        rng: Option<(u64, u64)>,
        config: Option<Vec<u8>>,
        keep: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<String> {
        guard(|| {
            let files = files
                .iter()
                .map(|f| rank_file(&f))
                .collect::<PyResult<Vec<_>>>()?;
            let tensors = tensors
                .iter()
                .map(|t| tensor_request(&t))
                .collect::<PyResult<Vec<_>>>()?;
            let meta = meta_arg(meta)?;
            let keep = opt_count(keep, "keep")?
                .map(|k| usize::try_from(k).map_err(|_| PyValueError::new_err("keep is too large")))
                .transpose()?;
            let mut state = TrainerState::from_json_with_defaults(state_json.as_bytes())
                .map_err(|e| ckpt_err(py, e.into()))?;
            state.rng_state = rng.map(|(state, inc)| RngState { state, inc });
            let req = CommitRequest {
                files,
                tensors,
                meta,
                state,
                config,
                keep,
            };
            let result = py.detach(|| {
                let mut save = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                save.commit(req)
            });
            let report = result.map_err(|e| sharded_err(py, e))?;
            Ok(report.path.display().to_string())
        })
    }

    /// Remove the tmp directory and release the lock; nothing is committed.
    fn abort(&self, py: Python<'_>) {
        py.detach(|| {
            let mut save = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            save.abort();
        });
    }
}

/// Check that `tmp_dir` is the directory rank 0 began with the probe `token` (any
/// rank, before writing): one a host of its own would be refused naming its parent.
#[pyfunction]
pub(super) fn check_shared(py: Python<'_>, tmp_dir: PathBuf, token: &str) -> PyResult<()> {
    guard(|| {
        path_arg(&tmp_dir, "tmp_dir")?;
        py.detach(|| core_sharded::check_shared(&tmp_dir, token))
            .map_err(|e| sharded_err(py, e))
    })
}

/// A chunk to write: key, dtype name, shape, flat uint8 array.
type ChunkItem<'py> = (String, String, Vec<u64>, PyReadonlyArray1<'py, u8>);

/// Write one rank's chunks as one canonical safetensors file inside `tmp_dir`;
/// returns the table rank 0's `commit` needs.
#[pyfunction]
#[pyo3(signature = (tmp_dir, file_name, chunks, durable=true))]
pub(super) fn write_rank_file<'py>(
    py: Python<'py>,
    tmp_dir: PathBuf,
    file_name: &str,
    chunks: Vec<ChunkItem<'py>>,
    durable: bool,
) -> PyResult<Bound<'py, PyDict>> {
    guard(|| {
        path_arg(&tmp_dir, "tmp_dir")?;
        let mut dtypes = Vec::with_capacity(chunks.len());
        for (key, dtype, _, _) in &chunks {
            dtypes.push(dtype_arg(dtype, key)?);
        }
        let data = chunks
            .iter()
            .zip(&dtypes)
            .map(|((key, _, shape, arr), &dtype)| {
                let bytes = arr.as_slice().map_err(|e| {
                    PyValueError::new_err(format!(
                        "chunk {key:?}: {e} (pass a C-contiguous uint8 array)"
                    ))
                })?;
                Ok(ChunkData {
                    key,
                    dtype,
                    shape,
                    data: bytes,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let written = py
            .detach(|| location::sharded_write_rank_file(&tmp_dir, file_name, &data, durable))
            .map_err(|e| sharded_err(py, e))?;
        rank_file_dict(py, &written)
    })
}

fn rank_file_dict<'py>(py: Python<'py>, f: &RankFile) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &f.name)?;
    d.set_item("size", f.size)?;
    d.set_item("sha256", &f.sha256)?;
    let tensors = PyDict::new(py);
    for (key, w) in &f.tensors {
        let t = PyDict::new(py);
        t.set_item("dtype", w.dtype.name())?;
        t.set_item("shape", &w.shape)?;
        t.set_item("begin", w.begin)?;
        t.set_item("end", w.end)?;
        t.set_item("pieces", &w.pieces)?;
        tensors.set_item(key, t)?;
    }
    d.set_item("tensors", tensors)?;
    Ok(d)
}
