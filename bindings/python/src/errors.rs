//! Core errors as the Python exceptions python.md names: `FileNotFoundError` for a
//! missing file or directory, `OSError` (with its errno) for another operating-system
//! failure or a held lock (`PermissionError`, `ConnectionRefusedError`, `TimeoutError`
//! for a server's refusal or silence, which come without an errno), `ValueError` for a
//! malformed file or a bad argument; and Rust panics as `RuntimeError`, never as pyo3's
//! `PanicException` (a `BaseException` that an `except Exception` would not catch).
//!
//! Invariant: the message is the one line the CLI prints after `tlio: error: `: the
//! error and its causes, outermost first, joined with ": ".

use std::error::Error;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{
    PyFileNotFoundError, PyNotADirectoryError, PyOSError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::PyErr;
use tlio_core::{Failure, FailureKind};

/// The chain of `err` and its sources on one line, outermost first (core's one
/// definition, the same text the CLI prints after `tlio: error: `), with the secrets a
/// URL in it may carry redacted.
pub fn one_line(err: &(dyn Error + 'static)) -> String {
    tlio_core::text::redact(&tlio_core::failure::full_text(err))
}

/// Every `io::Error` in the chain of `err`, outermost first, including the errors an
/// `io::Error` wraps (`io::Error::other(e)`: its `source()` skips `e` itself and goes
/// on with `e`'s source, so a wrapped error carrying the OS's errno would be missed).
fn io_errors<'a>(err: &'a (dyn Error + 'static), out: &mut Vec<&'a io::Error>) {
    let mut cause: Option<&(dyn Error + 'static)> = Some(err);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<io::Error>() {
            out.push(io);
            if let Some(inner) = io.get_ref() {
                io_errors(inner, out);
                return;
            }
        }
        cause = c.source();
    }
}

/// An errno of Python's `errno` module by name (the values are the platform's).
pub fn errno_named(name: &str) -> Option<i32> {
    Python::attach(|py| {
        py.import("errno")
            .and_then(|m| m.getattr(name))
            .and_then(|v| v.extract::<i32>())
            .ok()
    })
}

/// `OSError(errno, message)`: Python picks the subclass from the errno
/// (`PermissionError` for EACCES, `FileNotFoundError` for ENOENT, ...), exactly as for
/// its own I/O, and `.errno` is set.
pub fn os_error(errno: i32, message: String) -> PyErr {
    PyOSError::new_err((errno, message))
}

/// The errno Python gives an `OSError` of `kind` when the failure came with none (a
/// server's refusal or an unreachable server, reported by an HTTP client): so the
/// exception is `PermissionError`, `ConnectionRefusedError` or `TimeoutError`, as
/// Python's own I/O would raise, and `.errno` is set.
pub fn errno_of_kind(kind: io::ErrorKind) -> Option<i32> {
    match kind {
        io::ErrorKind::PermissionDenied => errno_named("EACCES"),
        io::ErrorKind::ConnectionRefused => errno_named("ECONNREFUSED"),
        io::ErrorKind::TimedOut => errno_named("ETIMEDOUT"),
        _ => None,
    }
}

/// A core error as the Python exception of its kind: an operating-system failure as
/// `OSError` with the errno the OS gave (its subclass chosen by Python), a missing file
/// as `FileNotFoundError`, bad input as `ValueError`.
pub fn core_err<E: Failure + Send + Sync + 'static>(err: E) -> PyErr {
    let message = one_line(&err);
    let mut ios = Vec::new();
    io_errors(&err, &mut ios);
    let errno = ios.iter().find_map(|e| e.raw_os_error());
    let has = |kind: io::ErrorKind| ios.iter().any(|e| e.kind() == kind);
    match (err.kind(), errno) {
        (FailureKind::Operational, Some(errno)) => os_error(errno, message),
        (_, Some(errno)) if has(io::ErrorKind::NotFound) => os_error(errno, message),
        _ if has(io::ErrorKind::NotFound) => PyFileNotFoundError::new_err(message),
        // Core names a component that is not a directory (a FIFO where a checkpoint
        // directory should be) in its own words, without the OS's errno.
        (FailureKind::Operational, None) if has(io::ErrorKind::NotADirectory) => {
            match errno_named("ENOTDIR") {
                Some(n) => os_error(n, message),
                None => PyNotADirectoryError::new_err(message),
            }
        }
        (FailureKind::Operational, None) if !ios.is_empty() => {
            match ios.iter().find_map(|e| errno_of_kind(e.kind())) {
                Some(n) => os_error(n, message),
                None => PyOSError::new_err(message),
            }
        }
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
