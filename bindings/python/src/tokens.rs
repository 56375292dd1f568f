//! `tlio._tlio.tokens`: token shards and the resumable token stream of tokens.md, over
//! `tlio_core::tokens`. The Python module `tlio.tokens` wraps these in its public names.
//!
//! Invariants: every shard rule (header, size, ids, vocabulary) and every stream rule
//! (phases, windows, cursor checks) is core's; this file converts arguments, results
//! and errors only. The GIL is released while shards are validated and batches read.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use numpy::{PyArray, PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use tlio_core::pcg::Pcg32;
use tlio_core::remote::{self, RemoteError};
use tlio_core::tokens::boundaries::{cu_seqlens_width, Boundaries};
use tlio_core::tokens::{
    Cursor, Ranks, Shard, ShardOrder, StreamOptions, TokenStream, TokensError, HEADER_BYTES,
};

use crate::args::path_arg;
use crate::errors::{core_err, errno_of_kind, guard, one_line};

/// A tokens error as the Python exception python.md names. `TokensError::Io` keeps its
/// `io::Error` in the message rather than the cause chain, so it is mapped here.
pub fn tokens_err(err: TokensError) -> PyErr {
    if let TokensError::Io { error, .. } = &err {
        let message = one_line(&err);
        return match (error.kind(), error.raw_os_error()) {
            (std::io::ErrorKind::NotFound, _) => PyFileNotFoundError::new_err(message),
            (_, Some(errno)) => PyOSError::new_err((errno, message)),
            (kind, None) => match errno_of_kind(kind) {
                Some(errno) => PyOSError::new_err((errno, message)),
                None => PyOSError::new_err(message),
            },
        };
    }
    core_err(err)
}

/// A remote-or-local error as the Python exception python.md names (a shard's own
/// error as [`tokens_err`] maps it).
pub fn remote_err(err: RemoteError) -> PyErr {
    match err {
        RemoteError::Tokens(e) => tokens_err(e),
        other => core_err(other),
    }
}

/// A non-negative integer argument that fits `u64` (crate::args' one rule).
pub(crate) use crate::args::u64_arg as count_arg;

/// `count_arg` as a `usize`.
pub(crate) fn size_arg(value: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    let v = count_arg(value, name)?;
    usize::try_from(v).map_err(|_| PyValueError::new_err(format!("{name} {v} is too large")))
}

/// An optional vocabulary size; core checks its range (1 .. 2**31 - 1).
pub(crate) fn vocab_arg(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u32>> {
    let Some(v) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let n = count_arg(v, "vocab_size")?;
    match u32::try_from(n) {
        Ok(0) | Err(_) => Err(PyValueError::new_err(format!(
            "vocab_size must be between 1 and {}, got {n}",
            tlio_core::tokens::MAX_COUNT
        ))),
        Ok(v) => Ok(Some(v)),
    }
}

/// `{"magic", "version", "n", "vocab_size"}` of a shard, reading its header only (0 for
/// a vocabulary the file does not record).
#[pyfunction]
fn read_tokens_header<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    guard(|| {
        path_arg(&path, "path")?;
        let header = py
            .detach(|| remote::read_shard_header(&path))
            .map_err(remote_err)?;
        let d = PyDict::new(py);
        d.set_item("magic", header.magic)?;
        d.set_item("version", header.version)?;
        d.set_item("n", header.count)?;
        d.set_item("vocab_size", header.vocab.unwrap_or(0))?;
        Ok(d)
    })
}

/// Validate a whole shard (header, size, every id against the vocabulary) and return
/// what `open_tokens` maps: `(itemsize, n, offset of the first id)`.
#[pyfunction]
#[pyo3(signature = (path, vocab_size=None))]
fn validate_shard(
    py: Python<'_>,
    path: PathBuf,
    vocab_size: Option<&Bound<'_, PyAny>>,
) -> PyResult<(usize, usize, usize)> {
    guard(|| {
        path_arg(&path, "path")?;
        let vocab = vocab_arg(vocab_size)?;
        let shard = py
            .detach(|| Shard::open(&path, vocab))
            .map_err(tokens_err)?;
        Ok((shard.header().dtype.itemsize(), shard.len(), HEADER_BYTES))
    })
}

/// The generator the stream starts from: a `PCG32` (anything with `.state()` giving
/// `{"state": int, "inc": int}`) or that dict itself; its state is copied.
pub fn rng_arg(rng: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
    let d = if rng.is_instance_of::<PyDict>() {
        rng.clone()
    } else if rng.hasattr("state")? {
        rng.call_method0("state")?
    } else {
        return Err(PyTypeError::new_err(format!(
            "rng must be a tlio.pcg.PCG32 or {{\"state\": int, \"inc\": int}}, got {}",
            rng.get_type().name()?
        )));
    };
    let d = d.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err("rng.state() must return {\"state\": int, \"inc\": int}")
    })?;
    if d.len() != 2 {
        return Err(PyValueError::new_err(
            "rng state must have exactly the keys \"state\" and \"inc\"",
        ));
    }
    let word = |key: &str| -> PyResult<u64> {
        let v = d.get_item(key)?.ok_or_else(|| {
            PyValueError::new_err(format!("rng state has no {key:?} (keys: state, inc)"))
        })?;
        count_arg(&v, &format!("rng {key}"))
    };
    Ok((word("state")?, word("inc")?))
}

/// The PCG32 of `(state, inc)`; an even increment is a `ValueError`.
pub(crate) fn pcg(state: u64, inc: u64) -> PyResult<Pcg32> {
    Pcg32::from_parts(state, inc).ok_or_else(|| {
        PyValueError::new_err(format!(
            "rng inc {inc:016x} is even; a PCG32 increment is always odd"
        ))
    })
}

/// tokens.md's stream over validated shards (`tlio.tokens.TokenStream` wraps it).
///
/// The stream sits behind a mutex, locked only without the GIL (so a thread asking for
/// the cursor while another reads a batch waits for that batch instead of failing);
/// the pyclass is frozen, so pyo3 keeps no borrow flag that a second thread could trip.
#[pyclass(module = "tlio._tlio.tokens", name = "Stream", frozen)]
pub struct Stream {
    inner: Mutex<TokenStream>,
    /// The shards as absolute paths, resolved against the working directory of the
    /// construction: what a pickled stream re-opens, wherever the reader's cwd is.
    absolute: Vec<PathBuf>,
    /// The `vocab_size` given (core keeps only its checks' outcome).
    vocab: Option<u32>,
    /// The generator as given, before the first phase was drawn.
    initial: (u64, u64),
    /// Where documents start (sidecars, else `eot`); locked after `inner`.
    boundaries: Mutex<Boundaries>,
}

#[pymethods]
impl Stream {
    #[new]
    #[pyo3(signature = (shards, seq_len, batch, rng, vocab_size=None, rank=None, world_size=None, shuffle=false, eot=None))]
    #[allow(
        clippy::too_many_arguments,
        reason = "the Python constructor's arguments"
    )]
    fn new(
        py: Python<'_>,
        shards: &Bound<'_, PyAny>,
        seq_len: &Bound<'_, PyAny>,
        batch: &Bound<'_, PyAny>,
        rng: &Bound<'_, PyAny>,
        vocab_size: Option<&Bound<'_, PyAny>>,
        rank: Option<&Bound<'_, PyAny>>,
        world_size: Option<&Bound<'_, PyAny>>,
        shuffle: bool,
        eot: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        guard(|| {
            let eot = eot_arg(eot)?;
            if shards.is_instance_of::<PyString>() {
                return Err(PyValueError::new_err(format!(
                    "shards must be a list of paths, not one string ({shards}); \
                     pass [path] for a single shard"
                )));
            }
            let paths: Vec<PathBuf> = shards
                .try_iter()
                .map_err(|_| PyTypeError::new_err("shards must be a sequence of paths"))?
                .map(|p| p.and_then(|p| p.extract::<PathBuf>()))
                .collect::<PyResult<_>>()?;
            for p in &paths {
                path_arg(p, "shards")?;
            }
            let seq_len = size_arg(seq_len, "seq_len")?;
            let batch = size_arg(batch, "batch")?;
            let (state, inc) = rng_arg(rng)?;
            let rng = pcg(state, inc)?;
            let initial = (state, inc);
            let vocab = vocab_arg(vocab_size)?;
            let ranks = Ranks {
                rank: rank.map_or(Ok(0), |r| size_arg(r, "rank"))?,
                world_size: world_size.map_or(Ok(1), |w| size_arg(w, "world_size"))?,
            };
            let inner = py
                .detach(|| {
                    let order = if shuffle {
                        ShardOrder::Shuffled
                    } else {
                        ShardOrder::InOrder
                    };
                    let options = StreamOptions { ranks, order };
                    // Shape and ranks are checked before any shard is read; s3://
                    // sources are expanded and fetched through core's verified cache.
                    remote::open_stream(&paths, seq_len, batch, rng, vocab, options)
                })
                .map_err(remote_err)?;
            // What a pickled stream opens again: each shard opened (patterns and
            // manifests expanded), local paths made absolute, URLs as they are.
            let absolute = inner
                .shards()
                .iter()
                .map(|s| remote::absolute_source(s.path()))
                .collect();
            Ok(Stream {
                inner: Mutex::new(inner),
                absolute,
                vocab,
                initial,
                boundaries: Mutex::new(Boundaries::new(eot)),
            })
        })
    }

    /// The construction's arguments as plain values, for pickling: `{"shards": [str]
    /// (absolute), "seq_len", "batch", "rng": {"state", "inc"}, "vocab_size" (int or
    /// None), "rank", "world_size"}`. Given back to the constructor they open the same
    /// shards, checked again.
    fn init_args<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (seq_len, batch, ranks, order) =
            self.with(py, |s| (s.seq_len(), s.batch(), s.ranks(), s.order()));
        let d = PyDict::new(py);
        let shards: Vec<&std::ffi::OsStr> = self.absolute.iter().map(|p| p.as_os_str()).collect();
        d.set_item("shards", shards)?;
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
        let eot = py.detach(|| lock(&self.boundaries).eot());
        d.set_item("eot", eot)?;
        Ok(d)
    }

    /// The next batch: fresh int64 arrays (inputs, targets) of shape [batch, seq_len].
    /// Read without the GIL, asking Python for pending signals every million or so ids:
    /// Ctrl-C stops a long batch with `KeyboardInterrupt` and leaves the stream where it
    /// was.
    #[allow(clippy::type_complexity, reason = "the pair pyo3 returns as a tuple")]
    fn next_batch<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(
        Bound<'py, PyArray<i64, numpy::Ix2>>,
        Bound<'py, PyArray<i64, numpy::Ix2>>,
    )> {
        guard(|| {
            let mut signal: Option<PyErr> = None;
            let read = py.detach(|| {
                let mut inner = lock_stream(&self.inner);
                let (b, t) = (inner.batch(), inner.seq_len());
                let mut inputs = vec![0i64; b.saturating_mul(t)];
                let mut targets = vec![0i64; b.saturating_mul(t)];
                let mut cancel = || match Python::attach(|py| py.check_signals()) {
                    Ok(()) => false,
                    Err(e) => {
                        signal = Some(e);
                        true
                    }
                };
                inner
                    .next_batch_into_cancellable(&mut inputs, &mut targets, &mut cancel)
                    .map(|()| (inputs, targets, [b, t]))
            });
            let (inputs, targets, shape) = match read {
                Ok(batch) => batch,
                Err(TokensError::Interrupted) => {
                    return Err(signal.unwrap_or_else(|| {
                        pyo3::exceptions::PyKeyboardInterrupt::new_err("interrupted")
                    }))
                }
                Err(e) => return Err(tokens_err(e)),
            };
            let inputs = PyArray1::from_vec(py, inputs).reshape(shape)?;
            let targets = PyArray1::from_vec(py, targets).reshape(shape)?;
            Ok((inputs, targets))
        })
    }

    /// The next batch with its document boundaries: int64 inputs and targets
    /// [batch, seq_len], int32 positions [batch, seq_len] and int32 cu_seqlens
    /// [batch, seq_len + 1] (padded with -1), all computed by core.
    #[allow(
        clippy::type_complexity,
        reason = "the four arrays pyo3 returns as a tuple"
    )]
    fn next_batch_boundaries<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(
        Bound<'py, PyArray<i64, numpy::Ix2>>,
        Bound<'py, PyArray<i64, numpy::Ix2>>,
        Bound<'py, PyArray<i32, numpy::Ix2>>,
        Bound<'py, PyArray<i32, numpy::Ix2>>,
    )> {
        guard(|| {
            let mut signal: Option<PyErr> = None;
            let read = py.detach(|| {
                let mut inner = lock_stream(&self.inner);
                let mut bounds = lock(&self.boundaries);
                let (b, t) = (inner.batch(), inner.seq_len());
                let w = cu_seqlens_width(t);
                let mut inputs = vec![0i64; b.saturating_mul(t)];
                let mut targets = vec![0i64; b.saturating_mul(t)];
                let mut positions = vec![0i32; b.saturating_mul(t)];
                let mut cu = vec![0i32; b.saturating_mul(w)];
                let mut cancel = || match Python::attach(|py| py.check_signals()) {
                    Ok(()) => false,
                    Err(e) => {
                        signal = Some(e);
                        true
                    }
                };
                inner
                    .next_batch_boundaries_into(
                        &mut bounds,
                        &mut inputs,
                        &mut targets,
                        &mut positions,
                        &mut cu,
                        &mut cancel,
                    )
                    .map(|()| (inputs, targets, positions, cu, [b, t], [b, w]))
            });
            let (inputs, targets, positions, cu, shape, cu_shape) = match read {
                Ok(batch) => batch,
                Err(TokensError::Interrupted) => {
                    return Err(signal.unwrap_or_else(|| {
                        pyo3::exceptions::PyKeyboardInterrupt::new_err("interrupted")
                    }))
                }
                Err(e) => return Err(tokens_err(e)),
            };
            Ok((
                PyArray1::from_vec(py, inputs).reshape(shape)?,
                PyArray1::from_vec(py, targets).reshape(shape)?,
                PyArray1::from_vec(py, positions).reshape(shape)?,
                PyArray1::from_vec(py, cu).reshape(cu_shape)?,
            ))
        })
    }

    /// The cursor as the CLI's compact JSON.
    fn cursor_json(&self, py: Python<'_>) -> String {
        self.with(py, |s| s.cursor().to_json())
    }

    /// Restore a cursor given as JSON text (checked strictly by core).
    fn restore_json(&self, py: Python<'_>, text: &str) -> PyResult<()> {
        guard(|| {
            let cursor = Cursor::from_json(text)
                .map_err(|e| PyValueError::new_err(format!("invalid cursor: {e}")))?;
            self.with(py, |s| s.restore(&cursor)).map_err(tokens_err)
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
        self.with(py, |s| s.seq_len())
    }

    /// B.
    #[getter]
    fn batch(&self, py: Python<'_>) -> usize {
        self.with(py, |s| s.batch())
    }

    /// This stream's rank.
    #[getter]
    fn rank(&self, py: Python<'_>) -> usize {
        self.with(py, |s| s.ranks().rank)
    }

    /// The number of ranks.
    #[getter]
    fn world_size(&self, py: Python<'_>) -> usize {
        self.with(py, |s| s.ranks().world_size)
    }

    /// Whether each epoch visits the shards in a drawn order.
    #[getter]
    fn shuffle(&self, py: Python<'_>) -> bool {
        self.with(py, |s| s.order()) == ShardOrder::Shuffled
    }

    /// B × world_size, the windows of one global batch.
    #[getter]
    fn global_batch(&self, py: Python<'_>) -> usize {
        self.with(py, |s| s.global_batch())
    }

    /// The shards' paths, in stream order.
    #[getter]
    fn shards(&self, py: Python<'_>) -> Vec<std::ffi::OsString> {
        // As text, not pathlib paths: a path object would fold an s3:// URL's "//".
        self.with(py, |s| {
            s.shards()
                .iter()
                .map(|s| s.path().as_os_str().to_os_string())
                .collect()
        })
    }
}

impl Stream {
    /// The stream, waiting for another thread's batch without holding the GIL (that
    /// thread may need the GIL to check for signals before it lets go).
    fn with<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut TokenStream) -> R + Send) -> R {
        py.detach(|| f(&mut lock_stream(&self.inner)))
    }
}

/// Lock the stream; a poisoned lock (a panic mid-batch, already reported as a
/// `RuntimeError`) still holds a valid stream, whose batches put the position back
/// on failure.
fn lock_stream(m: &Mutex<TokenStream>) -> MutexGuard<'_, TokenStream> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Lock a mutex whose value stays valid across a panic (a poisoned lock still holds
/// it).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An optional end-of-text id (`eot=`): where documents start in shards without a
/// document sidecar.
pub(crate) fn eot_arg(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u32>> {
    let Some(v) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let n = count_arg(v, "eot")?;
    u32::try_from(n)
        .ok()
        .filter(|&e| u64::from(e) < tlio_core::tokens::MAX_COUNT)
        .map(Some)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "eot must be a token id below {}, got {n}",
                tlio_core::tokens::MAX_COUNT
            ))
        })
}

/// Fills the `tokens` submodule.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_tokens_header, m)?)?;
    m.add_function(wrap_pyfunction!(validate_shard, m)?)?;
    m.add_class::<Stream>()?;
    m.add_class::<crate::mixture::Mixture>()?;
    Ok(())
}
