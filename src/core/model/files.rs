//! Where a model's files are read from: the local filesystem, or a prefix in object
//! storage (`remote`), so that [`super::Model::scan_with`] applies one set of rules to
//! both.
//!
//! Invariants: the rules read only what they need through these calls: whether a
//! path is a directory, whether a file exists and its size, small JSON files (bounded
//! by the caller's limit), and safetensors headers; never tensor data.

use std::io;
use std::path::Path;

use crate::safetensors::{Header, SafetensorsError};

/// The reads a model's checks make.
pub trait ModelFiles {
    /// Whether `path` is a directory; an error of kind `NotFound` when nothing is there.
    fn is_dir(&self, path: &Path) -> io::Result<bool>;
    /// Whether a file exists at `path` (an unreadable one counts as absent).
    fn exists(&self, path: &Path) -> bool;
    /// The size of the file at `path`.
    fn size(&self, path: &Path) -> io::Result<u64>;
    /// The whole file at `path`, refused (an error) when it is over `limit` bytes.
    fn read_limited(&self, path: &Path, limit: u64) -> io::Result<Vec<u8>>;
    /// The validated safetensors header of the file at `path`.
    fn read_header(&self, path: &Path) -> Result<Header, SafetensorsError>;
}

/// The local filesystem.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalFiles;

impl ModelFiles for LocalFiles {
    fn is_dir(&self, path: &Path) -> io::Result<bool> {
        std::fs::metadata(path).map(|m| m.is_dir())
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn size(&self, path: &Path) -> io::Result<u64> {
        std::fs::metadata(path).map(|m| m.len())
    }

    fn read_limited(&self, path: &Path, limit: u64) -> io::Result<Vec<u8>> {
        crate::files::read_limited(path, limit)
    }

    fn read_header(&self, path: &Path) -> Result<Header, SafetensorsError> {
        crate::safetensors::read_header(path)
    }
}
