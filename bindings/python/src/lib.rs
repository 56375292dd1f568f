//! The extension module `tlio._tlio`: one submodule per Python module of the package
//! (`safetensors`, `pcg`, `tokens`, `checkpoint`), each converting between Python
//! objects and tlio-core types and nothing more.
//!
//! Invariants: every format rule lives in tlio-core; an error becomes the Python
//! exception python.md names (`errors`); no Rust panic crosses into Python; the GIL is
//! released around file I/O, hashing and conversion.

use pyo3::prelude::*;

mod checkpoint;
mod errors;
mod pcg;
mod safetensors;
mod tokens;

/// Adds `name` as a submodule of `parent`, filled by `fill`.
fn add_submodule(
    parent: &Bound<'_, PyModule>,
    name: &str,
    fill: fn(&Bound<'_, PyModule>) -> PyResult<()>,
) -> PyResult<()> {
    let sub = PyModule::new(parent.py(), name)?;
    fill(&sub)?;
    parent.add_submodule(&sub)
}

#[pymodule]
fn _tlio(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // FAILPOINTS is read once, at import, exactly as the CLI reads it at start: a
    // malformed value fails the import instead of silently running without the point.
    tlio_core::failpoints::configure_from_env().map_err(errors::core_err)?;
    add_submodule(m, "safetensors", safetensors::register)?;
    add_submodule(m, "pcg", pcg::register)?;
    add_submodule(m, "tokens", tokens::register)?;
    add_submodule(m, "checkpoint", checkpoint::register)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
