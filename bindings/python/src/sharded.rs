//! `tlio._tlio.sharded`: sharded checkpoints through `tlio_core::checkpoint::sharded`
//! (every rank writes its own files, rank 0 commits the chunk table, any rank reads
//! verified regions of global tensors). The Python module `tlio.sharded` re-exports
//! these names with their documentation.
//!
//! Invariants: every rule (the table, coverage, the protocol, the digests, the read
//! plan) is core's; this file converts Python lists, dicts and numpy buffers to core
//! types and core errors to exceptions. The GIL is released while files are written,
//! committed, opened and read.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, RwLock};

use numpy::{PyReadonlyArray1, PyReadwriteArrayDyn};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use tlio_core::checkpoint::sharded::{
    self as core_sharded, ChunkData, ChunkRequest, CommitRequest, Group, RankFile, ReadRequest,
    ShardedError, TensorRequest, WrittenChunk,
};
use tlio_core::checkpoint::{RngState, TrainerState};
use tlio_core::remote::location;
use tlio_core::safetensors::Dtype;

use crate::args::path_arg;
use crate::checkpoint::ckpt_err;
use crate::errors::{core_err, guard};
use crate::safetensors::dtype_arg;
use crate::tokens::count_arg;

/// A sharded error as the exception python.md names.
fn sharded_err(py: Python<'_>, err: ShardedError) -> PyErr {
    match err {
        ShardedError::Checkpoint(e) => ckpt_err(py, e),
        other => core_err(other),
    }
}

fn group_arg(name: &str) -> PyResult<Group> {
    Group::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown group {name:?} (the groups are \"model\", \"optimizer\" and \"dcp\")"
        ))
    })
}

fn opt_count(value: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<u64>> {
    value
        .filter(|v| !v.is_none())
        .map(|v| count_arg(v, name))
        .transpose()
}

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
fn begin(
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
fn begin_named(
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
fn check_shared(py: Python<'_>, tmp_dir: PathBuf, token: &str) -> PyResult<()> {
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
fn write_rank_file<'py>(
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

/// A step opened for verified region reads (from `open_step`).
#[pyclass(module = "tlio._tlio.sharded", frozen)]
pub struct ShardedStep {
    inner: RwLock<Option<core_sharded::ShardedStep>>,
    path: String,
    step: u64,
    sharded: bool,
    state_json: String,
    rng: Option<(u64, u64)>,
    config: Option<Vec<u8>>,
    skipped: Vec<(String, String)>,
    meta: BTreeMap<String, BTreeMap<String, String>>,
}

/// Open the step `load` would pick (or exactly `step`); with `below`, the one `load`
/// would pick among the steps older than `below` (a collective load's next candidate).
#[pyfunction]
#[pyo3(signature = (dir, step=None, *, below=None))]
fn open_step(
    py: Python<'_>,
    dir: PathBuf,
    step: Option<&Bound<'_, PyAny>>,
    below: Option<&Bound<'_, PyAny>>,
) -> PyResult<ShardedStep> {
    guard(|| {
        path_arg(&dir, "dir")?;
        let step = opt_count(step, "step")?;
        let below = opt_count(below, "below")?;
        if step.is_some() && below.is_some() {
            return Err(PyValueError::new_err(
                "open_step takes step or below, not both",
            ));
        }
        let opened = py
            .detach(|| match below {
                Some(b) if !location::is_remote(&dir) => {
                    core_sharded::open::open_step_below(&dir, b)
                }
                // The remote choice of a named step still takes the newest older one
                // that passes: asking for the step below gives the same candidate.
                Some(b) => location::sharded_open_step(&dir, Some(b.saturating_sub(1))),
                None => location::sharded_open_step(&dir, step),
            })
            .map_err(|e| sharded_err(py, e))?;
        step_object(opened)
    })
}

/// Open exactly the step directory `step_dir` (any name; local only).
#[pyfunction]
fn open_step_dir(py: Python<'_>, step_dir: PathBuf) -> PyResult<ShardedStep> {
    guard(|| {
        path_arg(&step_dir, "step_dir")?;
        let opened = py
            .detach(|| core_sharded::open_step_dir(&step_dir))
            .map_err(|e| sharded_err(py, e))?;
        step_object(opened)
    })
}

/// What `pick` returns: the chosen step's path, its number, and each step skipped
/// before it as (name, why).
type Picked = (String, u64, Vec<(String, String)>);

/// The step `tlio ckpt latest` picks in `dir` (every candidate verified whole).
#[pyfunction]
#[pyo3(signature = (dir, step=None))]
fn pick(py: Python<'_>, dir: PathBuf, step: Option<&Bound<'_, PyAny>>) -> PyResult<Picked> {
    guard(|| {
        path_arg(&dir, "dir")?;
        let step = opt_count(step, "step")?;
        let picked = py
            .detach(|| location::pick(&dir, step))
            .map_err(|e| ckpt_err(py, e))?;
        Ok((
            picked.path.display().to_string(),
            picked.step,
            picked.skipped,
        ))
    })
}

/// The Python object of an opened step.
fn step_object(opened: core_sharded::ShardedStep) -> PyResult<ShardedStep> {
    let state_json = String::from_utf8(opened.state.to_json().map_err(core_err)?)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(ShardedStep {
        path: opened.path.display().to_string(),
        step: opened.step,
        sharded: opened.sharded,
        state_json,
        rng: opened.state.rng_state.map(|r| (r.state, r.inc)),
        config: opened.config.clone(),
        skipped: opened.skipped.clone(),
        meta: opened
            .meta
            .iter()
            .map(|(g, m)| (g.name().to_string(), m.clone()))
            .collect(),
        inner: RwLock::new(Some(opened)),
    })
}

/// `tensors()`: (group, name) -> (dtype, global shape).
type TensorList = BTreeMap<(String, String), (String, Vec<u64>)>;

/// One region read as Python gives it.
type ReadItem<'py> = (
    String,
    String,
    Vec<u64>,
    Vec<u64>,
    PyReadwriteArrayDyn<'py, u8>,
);

#[pymethods]
impl ShardedStep {
    /// The step directory.
    #[getter]
    fn path(&self) -> String {
        self.path.clone()
    }
    /// Its step.
    #[getter]
    fn step(&self) -> u64 {
        self.step
    }
    /// True for a sharded step, False for today's unsharded format.
    #[getter]
    fn sharded(&self) -> bool {
        self.sharded
    }
    /// trainer_state.json as text.
    #[getter]
    fn state_json(&self) -> String {
        self.state_json.clone()
    }
    /// The generator's (state, inc), when saved.
    #[getter]
    fn rng(&self) -> Option<(u64, u64)> {
        self.rng
    }
    /// config.json's bytes, when present.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.config.as_deref().map(|c| PyBytes::new(py, c))
    }
    /// Step directories refused on the way, (name, why).
    #[getter]
    fn skipped(&self) -> Vec<(String, String)> {
        self.skipped.clone()
    }
    /// String metadata per group.
    #[getter]
    fn meta(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        self.meta.clone()
    }

    /// Every global tensor: {(group, name): (dtype, shape)}.
    fn tensors(&self) -> PyResult<TensorList> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let step = inner.as_ref().ok_or_else(closed)?;
        Ok(step
            .tensors()
            .into_iter()
            .map(|(g, n, d, s)| {
                (
                    (g.name().to_string(), n.to_string()),
                    (d.name().to_string(), s.to_vec()),
                )
            })
            .collect())
    }

    /// The chunks of one global tensor as (offsets, sizes), sorted by offsets.
    fn chunks(&self, group: &str, name: &str) -> PyResult<Vec<(Vec<u64>, Vec<u64>)>> {
        let group = group_arg(group)?;
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let step = inner.as_ref().ok_or_else(closed)?;
        let boxes = step.chunk_boxes(group, name).ok_or_else(|| {
            PyValueError::new_err(format!("the step holds no tensor {group}/{name}"))
        })?;
        Ok(boxes
            .into_iter()
            .map(|(o, s)| (o.to_vec(), s.to_vec()))
            .collect())
    }

    /// Fill `out` with the region [offsets, offsets + sizes) of a global tensor.
    fn read(
        &self,
        py: Python<'_>,
        group: &str,
        name: &str,
        offsets: Vec<u64>,
        sizes: Vec<u64>,
        mut out: PyReadwriteArrayDyn<'_, u8>,
    ) -> PyResult<()> {
        guard(|| {
            let group = group_arg(group)?;
            let buf = out.as_slice_mut().map_err(|e| {
                PyValueError::new_err(format!(
                    "out: {e} (pass a C-contiguous, writable uint8 array)"
                ))
            })?;
            let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
            let step = inner.as_ref().ok_or_else(closed)?;
            py.detach(|| step.read(group, name, &offsets, &sizes, buf))
                .map_err(|e| sharded_err(py, e))
        })
    }

    /// `read` of many regions in one call, all their pieces in parallel.
    fn read_many(&self, py: Python<'_>, reads: Vec<ReadItem<'_>>) -> PyResult<()> {
        guard(|| {
            let mut reads = reads;
            let mut groups = Vec::with_capacity(reads.len());
            for (g, _, _, _, _) in &reads {
                groups.push(group_arg(g)?);
            }
            let mut reqs = Vec::with_capacity(reads.len());
            for ((_, name, offsets, sizes, out), group) in reads.iter_mut().zip(groups) {
                let buf = out.as_slice_mut().map_err(|e| {
                    PyValueError::new_err(format!(
                        "out of {name:?}: {e} (pass a C-contiguous, writable uint8 array)"
                    ))
                })?;
                reqs.push(ReadRequest {
                    group,
                    name,
                    offsets,
                    sizes,
                    out: buf,
                });
            }
            let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
            let step = inner.as_ref().ok_or_else(closed)?;
            py.detach(|| step.read_many(&mut reqs))
                .map_err(|e| sharded_err(py, e))
        })
    }

    /// Close the data files (and drop an unsharded step's bytes).
    fn close(&self) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        *inner = None;
    }
}

fn closed() -> PyErr {
    PyValueError::new_err("the step was closed")
}

/// Dtype names that sharded steps accept (whole bytes per element).
fn whole_byte_dtypes() -> Vec<&'static str> {
    Dtype::ALL
        .iter()
        .filter(|d| d.size().is_some())
        .map(|d| d.name())
        .collect()
}

/// Fills the `sharded` submodule.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ShardedSave>()?;
    m.add_class::<ShardedStep>()?;
    m.add_function(wrap_pyfunction!(begin, m)?)?;
    m.add_function(wrap_pyfunction!(write_rank_file, m)?)?;
    m.add_function(wrap_pyfunction!(check_shared, m)?)?;
    m.add_function(wrap_pyfunction!(open_step, m)?)?;
    m.add_function(wrap_pyfunction!(begin_named, m)?)?;
    m.add_function(wrap_pyfunction!(open_step_dir, m)?)?;
    m.add_function(wrap_pyfunction!(pick, m)?)?;
    m.add("FORMAT", core_sharded::SHARDS_FORMAT)?;
    m.add("VERSION", core_sharded::SHARDS_VERSION)?;
    m.add("SHARDS_NAME", core_sharded::SHARDS_NAME)?;
    m.add("PIECE_BYTES", core_sharded::PIECE_BYTES)?;
    m.add("DIGEST", core_sharded::piece::DIGEST_NAME)?;
    m.add("GROUPS", ("model", "optimizer", "dcp"))?;
    m.add("DCP_TABLE_VERSION", core_sharded::table::DCP_VERSION)?;
    m.add("DCP_FORMAT", core_sharded::dcp::DCP_FORMAT)?;
    m.add("DCP_DOC_VERSION", core_sharded::dcp::DCP_DOC_VERSION)?;
    m.add("DCP_META_KEY", core_sharded::dcp::DCP_META_KEY)?;
    m.add("DTYPES", whole_byte_dtypes())?;
    Ok(())
}
