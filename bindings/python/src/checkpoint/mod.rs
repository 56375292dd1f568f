//! `tlio._tlio.checkpoint`: saving, verifying and loading checkpoints through
//! `tlio_core::checkpoint`, the code behind `tlio ckpt save`, `ckpt verify` and
//! `ckpt latest`. The Python module `tlio.checkpoint` wraps these in its public names.
//!
//! Invariants: the protocol (fsyncs, renames, lock, failpoints, LATEST never moving
//! backwards), the trainer-state schema and the optimizer layout are core's; this file
//! converts numpy arrays and JSON text to core types and core errors to exceptions.
//! Every check that can fail runs before the first write. The GIL is released while the
//! files are written, hashed, verified and decoded.

use std::io;
use std::path::PathBuf;

use pyo3::exceptions::{PyFileExistsError, PyFileNotFoundError, PyOSError, PyValueError};
use pyo3::prelude::*;
use tlio_core::checkpoint::{self, step_name, CheckpointError};
use tlio_core::remote::location;

use crate::args::path_arg;
use crate::errors::{core_err, guard, one_line, os_error};
use crate::tokens::count_arg;

mod load;
mod save;

/// A checkpoint error as the Python exception python.md names, in the words of a Python
/// call (the core's hints name the CLI's flags).
pub(crate) fn ckpt_err(py: Python<'_>, err: CheckpointError) -> PyErr {
    match &err {
        CheckpointError::NotFound { .. } => PyFileNotFoundError::new_err(one_line(&err)),
        CheckpointError::Locked { .. } => {
            let errno = py
                .import("errno")
                .and_then(|m| m.getattr("EWOULDBLOCK"))
                .and_then(|v| v.extract::<i32>());
            match errno {
                Ok(e) => PyOSError::new_err((e, one_line(&err))),
                Err(_) => PyOSError::new_err(one_line(&err)),
            }
        }
        CheckpointError::Exists { path } => PyValueError::new_err(format!(
            "{} already exists as a complete checkpoint (pass overwrite=True to replace it)",
            path.display()
        )),
        CheckpointError::NotNewer { step, latest, .. } => PyValueError::new_err(format!(
            "step {step} is not newer than {}, which LATEST names and which verifies; \
             a save must move LATEST forward{}",
            step_name(*latest),
            if step == latest {
                " (pass overwrite=True to replace it)"
            } else {
                ""
            }
        )),
        // The loser of two writers of one step on object storage.
        CheckpointError::Lost { .. } => PyFileExistsError::new_err(one_line(&err)),
        _ => core_err(err),
    }
}

/// The problems of one step directory, each naming the file and the rule (empty when
/// it verifies).
#[pyfunction]
fn verify_step_dir(py: Python<'_>, path: PathBuf) -> PyResult<Vec<String>> {
    guard(|| {
        path_arg(&path, "path")?;
        if location::is_remote(&path) {
            let found = py.detach(|| location::inspect_step(&path, &mut |_| {}));
            let problems = found.map_err(|e| ckpt_err(py, e))?.problems;
            return Ok(problems.iter().map(ToString::to_string).collect());
        }
        if let Err(e) = std::fs::symlink_metadata(&path) {
            let message = format!("{}: {e}", path.display());
            return Err(match (e.raw_os_error(), e.kind()) {
                (Some(errno), _) => os_error(errno, message),
                (None, io::ErrorKind::NotFound) => PyFileNotFoundError::new_err(message),
                (None, _) => PyOSError::new_err(message),
            });
        }
        let problems = py.detach(|| checkpoint::verify(&path));
        Ok(problems.iter().map(ToString::to_string).collect())
    })
}

/// `step-` and the step in at least six digits.
#[pyfunction(name = "step_name")]
fn py_step_name(step: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(step_name(count_arg(step, "step")?))
}

/// Fills the `checkpoint` submodule.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(save::save, m)?)?;
    m.add_function(wrap_pyfunction!(load::load, m)?)?;
    m.add_function(wrap_pyfunction!(save::save_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(load::load_step, m)?)?;
    m.add_function(wrap_pyfunction!(load::load_files, m)?)?;
    m.add_function(wrap_pyfunction!(verify_step_dir, m)?)?;
    m.add_function(wrap_pyfunction!(py_step_name, m)?)?;
    Ok(())
}
