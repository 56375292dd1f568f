//! The document starts of a pack in parts (parts.rs): each part of a tokenized pack
//! writes where its documents start, and the merge cuts them into the sidecars
//! (docs.rs) of the shards it writes, so a merge gives the sidecars one pack gives.
//!
//! Invariants: a part's `docs.bin` is its document starts as little-endian u64
//! positions in the part's own id stream, strictly increasing and below its id count,
//! committed before its marker (which records how many); the merge reads them in part
//! order, each shifted by the ids of the parts before it, one shard's worth at a time
//! (memory bounded by one sidecar), and refuses a file that breaks a rule, naming it.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use super::docs::{prepare_docs, MAX_DOCUMENTS};
use super::parts::{PartMarker, PartsError};
use super::TokensError;
use crate::atomic::{AtomicFile, Prepared};

/// A part's document starts, inside its directory `K-of-N`.
pub const DOCS_FILE: &str = "docs.bin";
/// Bytes of one start.
const START_BYTES: u64 = 8;

/// Writes a part's document starts as they come.
pub(super) struct PartDocs {
    file: AtomicFile,
    path: PathBuf,
    /// The next id pushed starts a document.
    pending: bool,
    count: u64,
}

impl PartDocs {
    /// Start writing the starts file at `path` (under a temporary name until finished).
    pub(super) fn create(path: &Path) -> Result<PartDocs, PartsError> {
        Ok(PartDocs {
            file: AtomicFile::create(path)?,
            path: path.to_path_buf(),
            pending: false,
            count: 0,
        })
    }

    /// The next id pushed is a document's first.
    pub(super) fn start(&mut self) {
        self.pending = true;
    }

    /// Ids are about to be pushed at position `at` of the part's stream: record it
    /// when a document starts there.
    pub(super) fn before_push(&mut self, at: u64) -> Result<(), TokensError> {
        if !self.pending {
            return Ok(());
        }
        self.pending = false;
        self.file
            .writer()
            .write_all(&at.to_le_bytes())
            .map_err(|error| TokensError::Io {
                path: self.path.clone(),
                error,
            })?;
        self.count = self.count.saturating_add(1);
        Ok(())
    }

    /// Commit the file under its name; returns how many starts it holds.
    pub(super) fn finish(self) -> Result<u64, PartsError> {
        self.file.commit()?;
        Ok(self.count)
    }
}

/// One part's starts file being read by the merge.
struct Source {
    path: PathBuf,
    /// The ids of the parts before it.
    base: u64,
    /// Its own ids.
    tokens: u64,
    /// Starts left to read.
    left: u64,
    reader: Option<BufReader<File>>,
    previous: Option<u64>,
}

/// Reads the parts' starts in order and hands out each shard's sidecar.
pub(super) struct MergeDocs {
    sources: Vec<Source>,
    index: usize,
    /// The next start, read ahead (absolute in the merged stream).
    peeked: Option<u64>,
}

fn bad(path: &Path, reason: String) -> PartsError {
    PartsError::BadIds {
        path: path.to_path_buf(),
        reason,
    }
}

impl MergeDocs {
    /// The merge's reader of the starts of `parts` (each part's directory and marker),
    /// or `None` when the parts record no documents (packs of raw ids). Parts of which
    /// some record documents and others not are refused.
    pub(super) fn open(parts: &[(PathBuf, PartMarker)]) -> Result<Option<MergeDocs>, PartsError> {
        let with = parts.iter().filter(|(_, m)| m.doc_starts.is_some()).count();
        if with == 0 {
            return Ok(None);
        }
        let mut sources = Vec::with_capacity(parts.len());
        let mut base = 0u64;
        for (dir, marker) in parts {
            let path = dir.join(DOCS_FILE);
            let Some(count) = marker.doc_starts else {
                return Err(bad(
                    &path,
                    "the part records no document starts while others do".to_string(),
                ));
            };
            let size = std::fs::metadata(&path)
                .map_err(|error| PartsError::Io {
                    path: path.clone(),
                    error,
                })?
                .len();
            if count.checked_mul(START_BYTES) != Some(size) {
                return Err(bad(
                    &path,
                    format!("{size} bytes, but the marker records {count} document starts"),
                ));
            }
            sources.push(Source {
                path,
                base,
                tokens: marker.tokens,
                left: count,
                reader: None,
                previous: None,
            });
            base = base.saturating_add(marker.tokens);
        }
        Ok(Some(MergeDocs {
            sources,
            index: 0,
            peeked: None,
        }))
    }

    /// The next start of the merged stream, if any, checked against its part.
    fn next_start(&mut self) -> Result<Option<u64>, PartsError> {
        if let Some(p) = self.peeked.take() {
            return Ok(Some(p));
        }
        while let Some(source) = self.sources.get_mut(self.index) {
            if source.left == 0 {
                self.index = self.index.saturating_add(1);
                continue;
            }
            let reader = match &mut source.reader {
                Some(r) => r,
                None => {
                    let file = crate::files::open_regular(&source.path).map_err(|error| {
                        PartsError::Io {
                            path: source.path.clone(),
                            error,
                        }
                    })?;
                    source.reader.insert(BufReader::new(file))
                }
            };
            let mut word = [0u8; 8];
            reader
                .read_exact(&mut word)
                .map_err(|error| PartsError::Io {
                    path: source.path.clone(),
                    error,
                })?;
            source.left = source.left.saturating_sub(1);
            let at = u64::from_le_bytes(word);
            if at >= source.tokens || source.previous.is_some_and(|p| at <= p) {
                return Err(bad(
                    &source.path,
                    format!(
                        "document start {at} is not increasing or not below the part's {} ids",
                        source.tokens
                    ),
                ));
            }
            source.previous = Some(at);
            return Ok(Some(source.base.saturating_add(at)));
        }
        Ok(None)
    }

    /// The sidecar of the shard at `shard` holding merged ids `first .. first + count`,
    /// prepared under a temporary name.
    pub(super) fn prepare_shard(
        &mut self,
        shard: &Path,
        first: u64,
        count: u64,
    ) -> Result<Prepared, PartsError> {
        let end = first.saturating_add(count);
        let mut starts = Vec::new();
        while let Some(at) = self.next_start()? {
            if at >= end {
                self.peeked = Some(at);
                break;
            }
            starts.push(at.saturating_sub(first));
            if starts.len() as u64 > MAX_DOCUMENTS {
                // prepare_docs refuses it, naming the limit.
                break;
            }
        }
        Ok(prepare_docs(shard, count, &starts).map_err(TokensError::from)?)
    }
}
