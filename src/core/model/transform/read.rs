//! Positioned reads of a model's tensor data: each shard file opened once, on first
//! use, and read at an entry's offset.
//!
//! Invariant: inputs are read with `pread`, never mapped, so memory stays bounded by
//! the callers' chunk buffers and the pages read are not this process's. Reads take
//! `&self`, so a chunk can be read ahead while the previous one is worked on.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

use super::super::{Entry, Model, ModelError};

/// Open shard files, one handle each, on first use.
pub(super) struct Files<'a> {
    model: &'a Model,
    open: Vec<OnceLock<File>>,
    /// The scales bytes the last qweight pass computed, with the entry and group they
    /// belong to: the scales tensor comes next in file order, and writing it from here
    /// spares reading and quantizing its source a second time.
    pub(super) scales: Option<(usize, u64, Vec<u8>)>,
}

impl<'a> Files<'a> {
    pub(super) fn new(model: &'a Model) -> Self {
        Files {
            model,
            open: (0..model.shards.len()).map(|_| OnceLock::new()).collect(),
            scales: None,
        }
    }

    /// Read `buf.len()` bytes of entry `i`'s data starting `offset` bytes into it.
    pub(super) fn read(&self, i: usize, offset: u64, buf: &mut [u8]) -> Result<(), ModelError> {
        let e = self.model.entry(i).ok_or_else(|| ModelError::Usage {
            detail: format!("no tensor entry {i}"),
        })?;
        let shard = self
            .model
            .shards
            .get(e.shard)
            .ok_or_else(|| ModelError::Usage {
                detail: format!("no shard {}", e.shard),
            })?;
        let io = |source| ModelError::Io {
            path: shard.path.clone(),
            source,
        };
        let slot = self.open.get(e.shard).ok_or_else(|| ModelError::Usage {
            detail: format!("no shard {}", e.shard),
        })?;
        if slot.get().is_none() {
            // Two racing first reads may both open; one handle is kept, both are valid.
            let _ = slot.set(crate::files::open_regular(&shard.path).map_err(io)?);
        }
        let start = shard
            .header
            .data_start()
            .checked_add(e.info.data_offsets.0)
            .and_then(|s| s.checked_add(offset))
            .ok_or_else(|| ModelError::Usage {
                detail: "offset overflow".to_string(),
            })?;
        match slot.get() {
            Some(f) => f.read_exact_at(buf, start).map_err(io),
            None => Ok(()),
        }
    }
}

/// Entry `i` of `model`, or a usage error naming it.
pub(super) fn entry(model: &Model, i: usize) -> Result<&Entry, ModelError> {
    model.entry(i).ok_or_else(|| ModelError::Usage {
        detail: format!("no tensor entry {i}"),
    })
}
