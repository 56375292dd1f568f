//! Atomic file writes: write to a temporary name in the target's directory, fsync,
//! rename over the target, fsync the directory.
//!
//! Invariant: at every instant the target path holds either its old content (or
//! nothing) or the complete new content; on any error the temporary file is removed.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::core::failure::{Failure, FailureKind};

/// Errors of an atomic write.
#[derive(Debug, thiserror::Error)]
pub enum AtomicError {
    /// The temporary file could not be created next to the target.
    #[error("cannot create a temporary file in {dir}: {source}")]
    Create {
        /// The directory the target lives in.
        dir: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Writing, syncing or renaming failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The target path.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

impl Failure for AtomicError {
    fn kind(&self) -> FailureKind {
        FailureKind::Operational
    }
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Fsync a directory so that renames and creations inside it are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A file being written atomically. Write through `writer()`, then `commit()`; dropping
/// it without committing removes the temporary file and leaves the target untouched.
pub struct AtomicFile {
    target: PathBuf,
    dir: PathBuf,
    writer: BufWriter<tempfile::NamedTempFile>,
}

impl AtomicFile {
    /// Start writing `target`; the temporary file lives in the same directory so the
    /// final rename never crosses a file system.
    pub fn create(target: &Path) -> Result<Self, AtomicError> {
        let dir = parent_dir(target);
        let tmp = tempfile::Builder::new()
            .prefix(".tlio-")
            .suffix(".tmp")
            .tempfile_in(&dir)
            .map_err(|source| AtomicError::Create {
                dir: dir.clone(),
                source,
            })?;
        Ok(AtomicFile {
            target: target.to_path_buf(),
            dir,
            writer: BufWriter::with_capacity(1 << 20, tmp),
        })
    }

    /// The writer for the content.
    pub fn writer(&mut self) -> &mut BufWriter<tempfile::NamedTempFile> {
        &mut self.writer
    }

    /// The final path.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Flush, fsync, rename over the target and fsync the directory.
    pub fn commit(self) -> Result<(), AtomicError> {
        let target = self.target;
        let err = |source| AtomicError::Write {
            path: target.clone(),
            source,
        };
        let tmp = self.writer.into_inner().map_err(|e| err(e.into_error()))?;
        tmp.as_file().sync_all().map_err(err)?;
        tmp.persist(&target).map_err(|e| err(e.error))?;
        sync_dir(&self.dir).map_err(err)?;
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.writer.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }
}

/// Write `bytes` to `path` atomically.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), AtomicError> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes).map_err(|source| AtomicError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    file.commit()
}

/// True when `a` and `b` name the same existing file (so a command never writes over
/// its own input).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_replaces_and_drop_discards() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        write_file(&path, b"one").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"one");
        {
            let mut f = AtomicFile::create(&path).unwrap();
            f.write_all(b"two, never committed").unwrap();
        }
        assert_eq!(fs::read(&path).unwrap(), b"one");
        let leftovers: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "the temporary file is removed on drop");
    }
}
