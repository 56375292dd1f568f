//! The extension module `tlio._tlio`: one submodule per Python module of the package
//! (`safetensors`, `pcg`, `tokens`, `checkpoint`), each converting between Python
//! objects and tlio-core types and nothing more.
//!
//! Invariants: every format rule lives in tlio-core; an error becomes the Python
//! exception python.md names (`errors`); no Rust panic crosses into Python; the GIL is
//! released around file I/O, hashing and conversion.

use pyo3::prelude::*;

mod args;
mod checkpoint;
mod errors;
mod mixture;
mod pcg;
mod safetensors;
mod sharded;
mod tokens;

/// Adds `name` as a submodule of `parent`, filled by `fill`.
fn add_submodule(
    parent: &Bound<'_, PyModule>,
    name: &str,
    fill: fn(&Bound<'_, PyModule>) -> PyResult<()>,
) -> PyResult<()> {
    let py = parent.py();
    let sub = PyModule::new(py, name)?;
    fill(&sub)?;
    parent.add_submodule(&sub)?;
    // So that `from tlio._tlio.<name> import x` works as for a package's module.
    py.import("sys")?
        .getattr("modules")?
        .set_item(format!("tlio._tlio.{name}"), &sub)
}

/// A hidden test hook, not part of the API: panics inside `errors::guard`, so that the
/// tests can prove a Rust panic reaches Python as a `RuntimeError`.
#[pyfunction]
fn _panic_for_tests() -> PyResult<()> {
    errors::guard(|| -> PyResult<()> {
        #[allow(clippy::panic, reason = "the test hook's whole purpose")]
        {
            panic!("the test hook panicked on purpose")
        }
    })
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
    add_submodule(m, "sharded", sharded::register)?;
    m.add_function(wrap_pyfunction!(_panic_for_tests, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
