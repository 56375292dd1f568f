//! Core errors as the Python exceptions python.md names: `FileNotFoundError` for a
//! missing file or directory, `OSError` (with its errno) for another operating-system
//! failure or a held lock, `ValueError` for a malformed file or a bad argument; and Rust
//! panics as `RuntimeError`, never as pyo3's `PanicException` (a `BaseException` that an
//! `except Exception` would not catch).
//!
//! Invariant: the message is the one line the CLI prints after `tlio: error: `: the
//! error and its causes, outermost first, joined with ": ".

use std::error::Error;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{
    PyFileNotFoundError, PyNotADirectoryError, PyOSError, PyRuntimeError, PyValueError,
};
use pyo3::PyErr;
use tlio_core::{Failure, FailureKind};

/// The chain of `err` and its sources on one line, outermost first (core's one
/// definition, the same text the CLI prints after `tlio: error: `).
pub fn one_line(err: &(dyn Error + 'static)) -> String {
    tlio_core::failure::full_text(err)
}

/// The first `io::Error` in the chain of `err`, if any.
fn io_cause<'a>(err: &'a (dyn Error + 'static)) -> Option<&'a io::Error> {
    let mut cause: Option<&(dyn Error + 'static)> = Some(err);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<io::Error>() {
            return Some(io);
        }
        cause = c.source();
    }
    None
}

/// A core error as the Python exception of its kind.
pub fn core_err<E: Failure + Send + Sync + 'static>(err: E) -> PyErr {
    let message = one_line(&err);
    let io = io_cause(&err);
    match (err.kind(), io) {
        (_, Some(e)) if e.kind() == io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(message)
        }
        (FailureKind::Operational, Some(e)) => match e.raw_os_error() {
            Some(errno) => PyOSError::new_err((errno, message)),
            // Core names a component that is not a directory (a FIFO where a checkpoint
            // directory should be) in its own words, without the errno.
            None if e.kind() == io::ErrorKind::NotADirectory => {
                PyNotADirectoryError::new_err(message)
            }
            None => PyOSError::new_err(message),
        },
        (FailureKind::Invalid, _) | (FailureKind::Operational, None) => {
            PyValueError::new_err(message)
        }
    }
}

/// Runs `f`, turning a Rust panic into a `RuntimeError` that names it as a bug of tlio
/// (pyo3 would raise `PanicException`, which derives from `BaseException`).
pub fn guard<T>(f: impl FnOnce() -> pyo3::PyResult<T>) -> pyo3::PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            Err(PyRuntimeError::new_err(format!(
                "internal error in tlio (please report it): {what}"
            )))
        }
    }
}
