//! `tlio._tlio.tokens.Mixture`: core's mixture of sources (scale.md section 8), which
//! `tlio.tokens.TokenStream(sources=...)` wraps.
//!
//! Invariants: every mixture rule (weights, stages, the source of each window, the
//! cursor's checks) is core's; this file converts arguments, results and errors only.
//! The GIL is released while shards are opened and batches read, and a long batch
//! stays interruptible (Ctrl-C leaves the mixture where it was).

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use numpy::{PyArray, PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tlio_core::remote;
use tlio_core::tokens::{
    Mixture as CoreMixture, MixtureCursor, MixtureOptions, Ranks, ShardOrder, Stage, TokensError,
};

use crate::args::path_arg;
use crate::errors::guard;
use crate::tokens::{pcg, remote_err, rng_arg, size_arg, tokens_err, vocab_arg};

/// A mixture behind a mutex, as `Stream` holds its stream.
#[pyclass(module = "tlio._tlio.tokens", name = "Mixture", frozen)]
pub struct Mixture {
    inner: Mutex<CoreMixture>,
    /// Each source's name and its entries made absolute (what a pickled stream opens).
    absolute: Vec<(String, Vec<PathBuf>)>,
    vocab: Option<u32>,
    initial: (u64, u64),
}

type Array2<'py> = Bound<'py, PyArray<i64, numpy::Ix2>>;

/// `[(name, [path, ...]), ...]` from Python.
fn sources_arg(sources: &Bound<'_, PyAny>) -> PyResult<Vec<(String, Vec<PathBuf>)>> {
    let list: Vec<(String, Vec<PathBuf>)> = sources
        .extract()
        .map_err(|_| PyTypeError::new_err("sources must be a list of (name, [paths]) pairs"))?;
    for (_, paths) in &list {
        for p in paths {
            path_arg(p, "sources")?;
        }
    }
    Ok(list)
}

/// `[(batch, [weight, ...]), ...]` from Python.
fn stages_arg(stages: &Bound<'_, PyAny>) -> PyResult<Vec<Stage>> {
    let list: Vec<(Bound<'_, PyAny>, Vec<f64>)> = stages.extract().map_err(|_| {
        PyTypeError::new_err("stages must be a list of (global batch, [weights]) pairs")
    })?;
    list.into_iter()
        .map(|(b, weights)| {
            Ok(Stage {
                batch: crate::tokens::count_arg(&b, "a stage's global batch")?,
                weights,
            })
        })
        .collect()
}

#[pymethods]
impl Mixture {
    #[new]
    #[pyo3(signature = (sources, stages, seq_len, batch, rng, vocab_size=None, rank=None, world_size=None, shuffle=false))]
    #[allow(
        clippy::too_many_arguments,
        reason = "the Python constructor's arguments"
    )]
    fn new(
        py: Python<'_>,
        sources: &Bound<'_, PyAny>,
        stages: &Bound<'_, PyAny>,
        seq_len: &Bound<'_, PyAny>,
        batch: &Bound<'_, PyAny>,
        rng: &Bound<'_, PyAny>,
        vocab_size: Option<&Bound<'_, PyAny>>,
        rank: Option<&Bound<'_, PyAny>>,
        world_size: Option<&Bound<'_, PyAny>>,
        shuffle: bool,
    ) -> PyResult<Self> {
        guard(|| {
            let sources = sources_arg(sources)?;
            let stages = stages_arg(stages)?;
            let seq_len = size_arg(seq_len, "seq_len")?;
            let batch = size_arg(batch, "batch")?;
            let (state, inc) = rng_arg(rng)?;
            let rng = pcg(state, inc)?;
            let vocab = vocab_arg(vocab_size)?;
            let ranks = Ranks {
                rank: rank.map_or(Ok(0), |r| size_arg(r, "rank"))?,
                world_size: world_size.map_or(Ok(1), |w| size_arg(w, "world_size"))?,
            };
            let order = if shuffle {
                ShardOrder::Shuffled
            } else {
                ShardOrder::InOrder
            };
            let options = MixtureOptions { ranks, order };
            let inner = py
                .detach(|| {
                    // Shape, ranks and weights are checked before any shard is read.
                    remote::open_mixture(&sources, &stages, (seq_len, batch), rng, vocab, options)
                })
                .map_err(remote_err)?;
            let absolute = sources
                .iter()
                .map(|(name, paths)| {
                    let abs = paths.iter().map(|p| remote::absolute_source(p)).collect();
                    (name.clone(), abs)
                })
                .collect();
            Ok(Mixture {
                inner: Mutex::new(inner),
                absolute,
                vocab,
                initial: (state, inc),
            })
        })
    }

    /// The construction's arguments as plain values, for pickling (as `Stream`'s).
    fn init_args<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (seq_len, batch, ranks, order, stages) = self.with(py, |m| {
            let stages: Vec<(u64, Vec<f64>)> = m
                .stages()
                .iter()
                .map(|s| (s.batch, s.weights.clone()))
                .collect();
            (m.seq_len(), m.batch(), m.ranks(), m.order(), stages)
        });
        let d = PyDict::new(py);
        let sources: Vec<(String, Vec<&std::ffi::OsStr>)> = self
            .absolute
            .iter()
            .map(|(n, ps)| (n.clone(), ps.iter().map(|p| p.as_os_str()).collect()))
            .collect();
        d.set_item("sources", sources)?;
        d.set_item("stages", stages)?;
        d.set_item("seq_len", seq_len)?;
        d.set_item("batch", batch)?;
        let rng = PyDict::new(py);
        rng.set_item("state", self.initial.0)?;
        rng.set_item("inc", self.initial.1)?;
        d.set_item("rng", rng)?;
        d.set_item("vocab_size", self.vocab)?;
        d.set_item("rank", ranks.rank)?;
        d.set_item("world_size", ranks.world_size)?;
        d.set_item("shuffle", order == ShardOrder::Shuffled)?;
        Ok(d)
    }

    /// The next batch: fresh int64 (inputs, targets) of shape [batch, seq_len] and the
    /// int32 source index of each row.
    #[allow(clippy::type_complexity, reason = "the triple pyo3 returns as a tuple")]
    fn next_batch<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Array2<'py>, Array2<'py>, Bound<'py, PyArray1<i32>>)> {
        guard(|| {
            let mut signal: Option<PyErr> = None;
            let read = py.detach(|| {
                let mut inner = lock(&self.inner);
                let (b, t) = (inner.batch(), inner.seq_len());
                let mut inputs = vec![0i64; b.saturating_mul(t)];
                let mut targets = vec![0i64; b.saturating_mul(t)];
                let mut origins = Vec::with_capacity(b);
                let mut cancel = || match Python::attach(|py| py.check_signals()) {
                    Ok(()) => false,
                    Err(e) => {
                        signal = Some(e);
                        true
                    }
                };
                inner
                    .next_batch_into_cancellable(
                        &mut inputs,
                        &mut targets,
                        &mut origins,
                        &mut cancel,
                    )
                    .map(|()| (inputs, targets, origins, [b, t]))
            });
            let (inputs, targets, origins, shape) = match read {
                Ok(batch) => batch,
                Err(TokensError::Interrupted) => {
                    return Err(signal.unwrap_or_else(|| {
                        pyo3::exceptions::PyKeyboardInterrupt::new_err("interrupted")
                    }))
                }
                Err(e) => return Err(tokens_err(e)),
            };
            let sources: Vec<i32> = origins
                .iter()
                .map(|o| i32::try_from(o.source).unwrap_or(i32::MAX))
                .collect();
            let inputs = PyArray1::from_vec(py, inputs).reshape(shape)?;
            let targets = PyArray1::from_vec(py, targets).reshape(shape)?;
            Ok((inputs, targets, PyArray1::from_vec(py, sources)))
        })
    }

    /// The cursor as compact JSON.
    fn cursor_json(&self, py: Python<'_>) -> String {
        self.with(py, |m| m.cursor().to_json())
    }

    /// Restore a cursor given as JSON text; `allow_new_mixture` accepts a cursor of
    /// another mixture on purpose (core's rule).
    fn restore_json(&self, py: Python<'_>, text: &str, allow_new_mixture: bool) -> PyResult<()> {
        guard(|| {
            let cursor = MixtureCursor::from_json(text)
                .map_err(|e| PyValueError::new_err(format!("invalid mixture cursor: {e}")))?;
            self.with(py, |m| m.restore(&cursor, allow_new_mixture))
                .map_err(tokens_err)
        })
    }

    /// Move past the next `n` global batches without reading them (core's
    /// `skip_batches`), without the GIL; Ctrl-C stops it with `KeyboardInterrupt` and
    /// leaves the position where it was.
    fn skip_batches(&self, py: Python<'_>, n: u64) -> PyResult<()> {
        guard(|| {
            let mut signal: Option<PyErr> = None;
            let done = self.with(py, |s| {
                let mut cancel = || match Python::attach(|py| py.check_signals()) {
                    Ok(()) => false,
                    Err(e) => {
                        signal = Some(e);
                        true
                    }
                };
                s.skip_batches(n, &mut cancel)
            });
            match done {
                Ok(()) => Ok(()),
                Err(TokensError::Interrupted) => Err(signal.unwrap_or_else(|| {
                    pyo3::exceptions::PyKeyboardInterrupt::new_err("interrupted")
                })),
                Err(e) => Err(tokens_err(e)),
            }
        })
    }

    /// T.
    #[getter]
    fn seq_len(&self, py: Python<'_>) -> usize {
        self.with(py, |m| m.seq_len())
    }

    /// B.
    #[getter]
    fn batch(&self, py: Python<'_>) -> usize {
        self.with(py, |m| m.batch())
    }

    /// This stream's rank.
    #[getter]
    fn rank(&self, py: Python<'_>) -> usize {
        self.with(py, |m| m.ranks().rank)
    }

    /// The number of ranks.
    #[getter]
    fn world_size(&self, py: Python<'_>) -> usize {
        self.with(py, |m| m.ranks().world_size)
    }

    /// Whether each source's epochs visit its shards in a drawn order.
    #[getter]
    fn shuffle(&self, py: Python<'_>) -> bool {
        self.with(py, |m| m.order()) == ShardOrder::Shuffled
    }

    /// B × world_size.
    #[getter]
    fn global_batch(&self, py: Python<'_>) -> usize {
        self.with(py, |m| m.global_batch())
    }

    /// The normalised stages, `[(batch, [weights])]`.
    #[getter]
    fn stages(&self, py: Python<'_>) -> Vec<(u64, Vec<f64>)> {
        self.with(py, |m| {
            m.stages()
                .iter()
                .map(|s| (s.batch, s.weights.clone()))
                .collect()
        })
    }

    /// Each source's shards, in stream order.
    #[getter]
    fn source_shards(&self, py: Python<'_>) -> Vec<Vec<std::ffi::OsString>> {
        self.with(py, |m| {
            (0..m.source_count())
                .filter_map(|j| m.source(j))
                .map(|s| {
                    s.shards()
                        .iter()
                        .map(|x| x.path().as_os_str().to_os_string())
                        .collect()
                })
                .collect()
        })
    }
}

impl Mixture {
    fn with<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut CoreMixture) -> R + Send) -> R {
        py.detach(|| f(&mut lock(&self.inner)))
    }
}

/// Lock the mixture; a poisoned lock still holds a valid mixture (its batches put the
/// position back on failure).
fn lock(m: &Mutex<CoreMixture>) -> MutexGuard<'_, CoreMixture> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
