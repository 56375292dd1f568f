//! The reading side: `open_step`, `open_step_dir` and `pick`, and the opened step whose
//! verified region reads fill numpy buffers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::RwLock;

use numpy::PyReadwriteArrayDyn;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tlio_core::checkpoint::sharded::{self as core_sharded, ReadRequest};
use tlio_core::remote::location;

use super::{group_arg, opt_count, sharded_err};
use crate::args::path_arg;
use crate::checkpoint::ckpt_err;
use crate::errors::{core_err, guard};

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
pub(super) fn open_step(
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
                Some(b) => location::sharded_open_step_below(&dir, b),
                None => location::sharded_open_step(&dir, step),
            })
            .map_err(|e| sharded_err(py, e))?;
        step_object(opened)
    })
}

/// Open exactly the step directory `step_dir` (any name; local only).
#[pyfunction]
pub(super) fn open_step_dir(py: Python<'_>, step_dir: PathBuf) -> PyResult<ShardedStep> {
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
pub(super) fn pick(
    py: Python<'_>,
    dir: PathBuf,
    step: Option<&Bound<'_, PyAny>>,
) -> PyResult<Picked> {
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
