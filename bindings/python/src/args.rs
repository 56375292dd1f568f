//! Integer arguments, read the same way by every function of the package: a Python int
//! or an object with `__index__` (numpy's integers), never a str, a float or a bool.
//!
//! Invariant: a wrong type or a value outside [0, 2**64) is a `ValueError` naming the
//! argument, as python.md says of every bad argument.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A Python int (or an object with `__index__`, as numpy's integers) as a u64; a str, a
/// float, a bool or anything else is a `ValueError` naming `what`: `PCG32("42")` must
/// never quietly mean `PCG32(0x42)`, nor `PCG32(4.0)` mean `PCG32(4)`.
pub(crate) fn u64_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    let shown = || {
        obj.repr()
            .map_or_else(|_| "?".to_string(), |r| r.to_string())
    };
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyValueError::new_err(format!(
            "{what} must be an integer, not a bool ({})",
            shown()
        )));
    }
    if !obj.is_instance_of::<pyo3::types::PyInt>() && !obj.hasattr("__index__")? {
        return Err(PyValueError::new_err(format!(
            "{what} must be an integer, got {} {}",
            obj.get_type().name()?,
            shown()
        )));
    }
    obj.extract::<u64>().map_err(|_| {
        PyValueError::new_err(format!(
            "{what} must be an integer in [0, 2**64), got {}",
            shown()
        ))
    })
}

/// Refuses a path with a NUL byte as Python's own I/O does (`ValueError: embedded null
/// byte`): no operating-system call can take it, and an `OSError` without an errno
/// would say nothing true.
pub(crate) fn path_arg(path: &std::path::Path, what: &str) -> PyResult<()> {
    if path.as_os_str().to_string_lossy().contains('\0') {
        return Err(PyValueError::new_err(format!("{what}: embedded null byte")));
    }
    Ok(())
}

/// A name given as a Python str, as a Rust `String`: a str that UTF-8 cannot hold (a
/// lone surrogate such as `"\udc80"`) is a `ValueError` naming `what` and the value,
/// anything but a str a `TypeError` (pyo3's own conversion would call both a TypeError).
pub(crate) fn str_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    let s = obj.cast::<pyo3::types::PyString>().map_err(|_| {
        let kind = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".to_string(), |n| n.to_string());
        pyo3::exceptions::PyTypeError::new_err(format!("{what} must be str, got {kind}"))
    })?;
    // A str that does not convert is one UTF-8 cannot encode.
    match s.extract::<String>() {
        Ok(text) => Ok(text),
        Err(_) => Err(PyValueError::new_err(format!(
            "{what} {} is not valid UTF-8 (a lone surrogate): safetensors names are UTF-8",
            obj.repr()
                .map_or_else(|_| "?".to_string(), |r| r.to_string())
        ))),
    }
}
