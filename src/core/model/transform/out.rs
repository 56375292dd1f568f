//! Where a planned tensor's bytes go: a shard file being written, a tensor's place in
//! it, and the pair of places one quantizing pass fills. Both the shard writer and
//! the quantizing passes write through these, so they live below both.
//!
//! Invariant: a tensor writes only inside its planned place, with positioned writes,
//! and finishing checks it filled the place exactly (no hole is left in the file).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::super::ModelError;

/// The shard file being written and its path as the user named it (for errors).
#[derive(Clone, Copy)]
pub(super) struct Target<'s> {
    pub(super) file: &'s File,
    pub(super) path: &'s Path,
}

/// Where one output tensor's bytes go: the shard, the position of the tensor's next
/// byte and the end of its place; moved to another thread for a write that overlaps
/// the next chunk's work.
pub(super) struct Out<'s> {
    pub(super) to: Target<'s>,
    pub(super) at: u64,
    pub(super) end: u64,
}

impl Out<'_> {
    /// Write `bytes` at this tensor's next position, never past its place.
    pub(super) fn write(&mut self, bytes: &[u8]) -> Result<(), ModelError> {
        let fits = self
            .at
            .checked_add(bytes.len() as u64)
            .is_some_and(|e| e <= self.end);
        if !fits {
            return Err(self.misplaced(bytes.len() as u64));
        }
        self.to
            .file
            .write_all_at(bytes, self.at)
            .map_err(|source| write_err(self.to.path, source))?;
        self.at += bytes.len() as u64;
        Ok(())
    }

    /// Check that the tensor filled its place exactly (no hole is left in the file).
    pub(super) fn finish(self) -> Result<(), ModelError> {
        if self.at == self.end {
            Ok(())
        } else {
            Err(self.misplaced(0))
        }
    }

    /// The error of a tensor whose bytes do not fit its planned place (a bug, never
    /// an input's fault).
    fn misplaced(&self, more: u64) -> ModelError {
        ModelError::Usage {
            detail: format!(
                "a tensor of {} reached byte {} (+{more}) of a place ending at {}",
                self.to.path.display(),
                self.at,
                self.end
            ),
        }
    }
}

/// The outputs of quantizing one source tensor: its scales, its packed values, or both
/// from one pass.
pub(super) struct QuantOuts<'s> {
    pub(super) scales: Option<Out<'s>>,
    pub(super) packed: Option<Out<'s>>,
}

pub(super) fn write_err(target: &Path, source: std::io::Error) -> ModelError {
    ModelError::Write {
        path: target.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor's writes land in its place and never past it, and a tensor that stops
    /// short of its end is an error rather than a hole in the file.
    #[test]
    fn a_tensor_fills_its_place_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard.safetensors");
        let file = File::create(&path).unwrap();
        let to = Target {
            file: &file,
            path: &path,
        };
        let mut out = Out { to, at: 4, end: 10 };
        out.write(b"abcd").unwrap();
        assert!(out.write(b"efg").is_err(), "past the place's end");
        let short = Out { to, at: 8, end: 10 };
        assert!(short.finish().is_err(), "stopped short");
        out.write(b"ef").unwrap();
        out.finish().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"\0\0\0\0abcdef");
    }
}
