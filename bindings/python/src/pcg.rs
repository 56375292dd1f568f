//! `tlio.pcg`: tokens.md's PCG32 generator as the Python class `PCG32`, a thin wrapper
//! of `tlio_core::pcg::Pcg32` (the same code the CLI's stream uses).
//!
//! Invariant: a `PCG32` always holds an odd increment; every way in (`__init__`,
//! `from_state`, `set_state`, unpickling) goes through the core constructors, so an even
//! increment is a `ValueError` everywhere, never a generator.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple, PyType};
use tlio_core::pcg::{Pcg32, DEFAULT_SEQ};

use crate::args::u64_arg;

/// The largest bound `below` accepts (its argument is a u32).
const MAX_BOUND: u64 = u32::MAX as u64;

/// tokens.md's PCG32 (XSH-RR, 64-bit state, 32-bit output).
///
/// Other modules of the binding (tokens, checkpoint) take and return it as
/// `crate::pcg::PyPcg32` and reach the core generator through [`PyPcg32::core`] and
/// [`PyPcg32::from_core`].
#[pyclass(name = "PCG32", module = "tlio.pcg", eq, from_py_object)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PyPcg32 {
    rng: Pcg32,
}

#[allow(dead_code, reason = "shared with the tokens and checkpoint modules")]
impl PyPcg32 {
    /// The core generator at this object's position (a copy).
    pub(crate) fn core(&self) -> Pcg32 {
        self.rng
    }

    /// A Python generator at the position of `rng`.
    pub(crate) fn from_core(rng: Pcg32) -> Self {
        PyPcg32 { rng }
    }

    /// Moves this object to the position of `rng`.
    pub(crate) fn set_core(&mut self, rng: Pcg32) {
        self.rng = rng;
    }
}

/// A word of a saved state: an int, or the 16 lowercase hex digits that cursors and
/// trainer_state.json write (core's wire form, nothing looser).
fn word_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if let Ok(s) = obj.extract::<String>() {
        return tlio_core::wire::Hex64::parse(&s)
            .map(|w| w.0)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "{what}: {s:?} is not 16 lowercase hexadecimal digits"
                ))
            });
    }
    u64_arg(obj, what)
}

/// The generator at (`state`, `inc`), or the `ValueError` of an even increment.
pub(crate) fn from_parts(state: u64, inc: u64) -> PyResult<Pcg32> {
    Pcg32::from_parts(state, inc).ok_or_else(|| {
        PyValueError::new_err(format!(
            "rng: the increment {inc:#018x} is even (a PCG32 increment is always odd)"
        ))
    })
}

/// A generator from `{"state": int, "inc": int}` (ints or hex strings).
pub(crate) fn from_dict(d: &Bound<'_, PyAny>) -> PyResult<Pcg32> {
    let d = d.cast::<PyDict>().map_err(|_| {
        PyValueError::new_err("rng: the state must be a dict {\"state\": int, \"inc\": int}")
    })?;
    let field = |key: &str| -> PyResult<u64> {
        let value = d
            .get_item(key)?
            .ok_or_else(|| PyValueError::new_err(format!("rng: the state has no key {key:?}")))?;
        word_arg(&value, &format!("rng.{key}"))
    };
    if d.len() != 2 {
        return Err(PyValueError::new_err(
            "rng: the state must have exactly the keys \"state\" and \"inc\"",
        ));
    }
    from_parts(field("state")?, field("inc")?)
}

/// `{"state": int, "inc": int}` of `rng`.
pub(crate) fn to_dict<'py>(py: Python<'py>, rng: &Pcg32) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("state", rng.state())?;
    d.set_item("inc", rng.inc())?;
    Ok(d)
}

#[pymethods]
impl PyPcg32 {
    /// `PCG32(seed, seq=54)`: pcg_basic's `seed(initstate=seed, initseq=seq)`.
    #[new]
    #[pyo3(signature = (seed, seq = None))]
    fn new(seed: &Bound<'_, PyAny>, seq: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let seed = u64_arg(seed, "seed")?;
        let seq = match seq {
            Some(s) => u64_arg(s, "seq")?,
            None => DEFAULT_SEQ,
        };
        Ok(PyPcg32 {
            rng: Pcg32::seed(seed, seq),
        })
    }

    /// A generator at an exact saved position; an even `inc` is a `ValueError`.
    #[classmethod]
    fn from_state(
        _cls: &Bound<'_, PyType>,
        state: &Bound<'_, PyAny>,
        inc: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(PyPcg32 {
            rng: from_parts(u64_arg(state, "state")?, u64_arg(inc, "inc")?)?,
        })
    }

    /// The next 32-bit output.
    fn next_u32(&mut self) -> u32 {
        self.rng.next_u32()
    }

    /// Uniform in `[0, bound)` without modulo bias; `bound` in `[1, 2**32)`.
    fn below(&mut self, bound: &Bound<'_, PyAny>) -> PyResult<u32> {
        let b = u64_arg(bound, "bound")?;
        match u32::try_from(b) {
            Ok(b) if b >= 1 && u64::from(b) <= MAX_BOUND => Ok(self.rng.below(b)),
            _ => Err(PyValueError::new_err(format!(
                "bound must be in [1, 2**32), got {b}"
            ))),
        }
    }

    /// The whole position: `{"state": int, "inc": int}`.
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        to_dict(py, &self.rng)
    }

    /// Move to the position `d` (as `state()` returns it; ints, or 16-hex-digit strings).
    fn set_state(&mut self, d: &Bound<'_, PyAny>) -> PyResult<()> {
        self.rng = from_dict(d)?;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "PCG32.from_state({:#018x}, {:#018x})",
            self.rng.state(),
            self.rng.inc()
        )
    }

    fn __copy__(&self) -> Self {
        self.clone()
    }

    fn __deepcopy__(&self, _memo: &Bound<'_, PyAny>) -> Self {
        self.clone()
    }

    /// Pickling goes through `from_state`, so an unpickled generator is checked too.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let rng = slf.borrow().rng;
        let ctor = slf.get_type().getattr("from_state")?;
        let args = PyTuple::new(py, [rng.state(), rng.inc()])?;
        Ok((ctor, args))
    }
}

/// Fills the `pcg` submodule.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPcg32>()?;
    m.add("DEFAULT_SEQ", DEFAULT_SEQ)?;
    Ok(())
}
