//! Positioned reads of a model's tensor data: each shard file opened once, on first
//! use, and read at an entry's offset with `pread` into a caller's buffer.
//!
//! Invariant: memory stays bounded by the callers' buffers, never a whole file. Reads
//! take `&self`, so several threads read their own pieces at once.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::OnceLock;

use super::super::{Entry, Model, ModelError};

/// Open shard files, one handle each, on first use.
pub(super) struct Files<'a> {
    model: &'a Model,
    /// Each shard's handle.
    open: Vec<OnceLock<File>>,
}

impl<'a> Files<'a> {
    pub(super) fn new(model: &'a Model) -> Self {
        Files {
            model,
            open: (0..model.shards.len()).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Read `buf.len()` bytes of entry `i`'s data starting `offset` bytes into it.
    pub(super) fn read(&self, i: usize, offset: u64, buf: &mut [u8]) -> Result<(), ModelError> {
        let (file, start, path) = self.locate(i, offset)?;
        file.read_exact_at(buf, start)
            .map_err(|source| ModelError::Io {
                path: path.to_path_buf(),
                source,
            })
    }

    /// Entry `i`'s shard file (opened on first use), the file offset of byte `offset`
    /// of its data, and the file's path.
    fn locate(&self, i: usize, offset: u64) -> Result<(&File, u64, &Path), ModelError> {
        let e = self.model.entry(i).ok_or_else(|| ModelError::Usage {
            detail: format!("no tensor entry {i}"),
        })?;
        let no_shard = || ModelError::Usage {
            detail: format!("no shard {}", e.shard),
        };
        let shard = self.model.shards.get(e.shard).ok_or_else(no_shard)?;
        let slot = self.open.get(e.shard).ok_or_else(no_shard)?;
        let io = |source| ModelError::Io {
            path: shard.path.clone(),
            source,
        };
        let file = match slot.get() {
            Some(f) => f,
            None => {
                let f = crate::files::open_regular(&shard.path).map_err(io)?;
                // Two racing first uses may both open; one handle is kept, both valid.
                let _ = slot.set(f);
                slot.get().ok_or_else(no_shard)?
            }
        };
        let start = shard
            .header
            .data_start()
            .checked_add(e.info.data_offsets.0)
            .and_then(|s| s.checked_add(offset))
            .ok_or_else(|| ModelError::Usage {
                detail: "offset overflow".to_string(),
            })?;
        Ok((file, start, &shard.path))
    }
}

/// Entry `i` of `model`, or a usage error naming it.
pub(super) fn entry(model: &Model, i: usize) -> Result<&Entry, ModelError> {
    model.entry(i).ok_or_else(|| ModelError::Usage {
        detail: format!("no tensor entry {i}"),
    })
}
