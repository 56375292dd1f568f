//! `tlio._tlio.sharded`: sharded checkpoints through `tlio_core::checkpoint::sharded`
//! (every rank writes its own files, rank 0 commits the chunk table, any rank reads
//! verified regions of global tensors). The Python module `tlio.sharded` re-exports
//! these names with their documentation.
//!
//! Invariants: every rule (the table, coverage, the protocol, the digests, the read
//! plan) is core's; this file converts Python lists, dicts and numpy buffers to core
//! types and core errors to exceptions. The GIL is released while files are written,
//! committed, opened and read.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tlio_core::checkpoint::sharded::{self as core_sharded, Group, ShardedError};
use tlio_core::safetensors::Dtype;

use crate::checkpoint::ckpt_err;
use crate::errors::core_err;
use crate::tokens::count_arg;

mod save;
mod step;

/// A sharded error as the exception python.md names.
fn sharded_err(py: Python<'_>, err: ShardedError) -> PyErr {
    match err {
        ShardedError::Checkpoint(e) => ckpt_err(py, e),
        other => core_err(other),
    }
}

fn group_arg(name: &str) -> PyResult<Group> {
    Group::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown group {name:?} (the groups are \"model\", \"optimizer\" and \"dcp\")"
        ))
    })
}

fn opt_count(value: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<u64>> {
    value
        .filter(|v| !v.is_none())
        .map(|v| count_arg(v, name))
        .transpose()
}

/// Dtype names that sharded steps accept (whole bytes per element).
fn whole_byte_dtypes() -> Vec<&'static str> {
    Dtype::ALL
        .iter()
        .filter(|d| d.size().is_some())
        .map(|d| d.name())
        .collect()
}

/// Fills the `sharded` submodule.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<save::ShardedSave>()?;
    m.add_class::<step::ShardedStep>()?;
    m.add_function(wrap_pyfunction!(save::begin, m)?)?;
    m.add_function(wrap_pyfunction!(save::write_rank_file, m)?)?;
    m.add_function(wrap_pyfunction!(save::check_shared, m)?)?;
    m.add_function(wrap_pyfunction!(step::open_step, m)?)?;
    m.add_function(wrap_pyfunction!(save::begin_named, m)?)?;
    m.add_function(wrap_pyfunction!(step::open_step_dir, m)?)?;
    m.add_function(wrap_pyfunction!(step::pick, m)?)?;
    m.add("FORMAT", core_sharded::SHARDS_FORMAT)?;
    m.add("VERSION", core_sharded::SHARDS_VERSION)?;
    m.add("SHARDS_NAME", core_sharded::SHARDS_NAME)?;
    m.add("PIECE_BYTES", core_sharded::PIECE_BYTES)?;
    m.add("DIGEST", core_sharded::piece::DIGEST_NAME)?;
    m.add("GROUPS", ("model", "optimizer", "dcp"))?;
    m.add("DCP_TABLE_VERSION", core_sharded::table::DCP_VERSION)?;
    m.add("DCP_FORMAT", core_sharded::dcp::DCP_FORMAT)?;
    m.add("DCP_DOC_VERSION", core_sharded::dcp::DCP_DOC_VERSION)?;
    m.add("DCP_META_KEY", core_sharded::dcp::DCP_META_KEY)?;
    m.add("DTYPES", whole_byte_dtypes())?;
    Ok(())
}
