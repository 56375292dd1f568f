//! `tlio.tokens` (placeholder registration; the module's functions are being written).

use pyo3::prelude::*;

/// Fills the `tokens` submodule.
pub fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
