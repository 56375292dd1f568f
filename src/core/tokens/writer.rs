//! Writing one shard (tokens.md's format): [`ShardWriter`], atomic and in bounded
//! memory.
//!
//! Invariants: the header written last records the final count and V; an id at or
//! above the vocabulary is refused before it is written; dropping a writer without
//! `finish` leaves nothing under the shard's name.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::shard::*;
use super::TokensError;
use crate::atomic::{AtomicFile, Prepared};

/// Encoding buffer of the writer, in ids (bounded memory whatever the input size).
const WRITE_CHUNK_IDS: usize = 1 << 16;

/// Writes one 20240520 shard atomically and in bounded memory: a placeholder header,
/// the ids as they come, then the real header (with the final count) patched in before
/// the commit. Dropping it without `finish` leaves nothing on disk.
pub struct ShardWriter {
    file: AtomicFile,
    path: PathBuf,
    vocab: u32,
    layout: Layout,
    dtype: IdDtype,
    count: u64,
    buf: Vec<u8>,
}

impl ShardWriter {
    /// Start writing `path` for vocabulary `vocab` (1 to 2^31 - 1), in the default
    /// layout.
    pub fn create(path: &Path, vocab: u32) -> Result<ShardWriter, TokensError> {
        ShardWriter::create_with(path, vocab, Layout::default())
    }

    /// Start writing `path` for vocabulary `vocab` with uint32 layout `layout`.
    pub fn create_with(
        path: &Path,
        vocab: u32,
        layout: Layout,
    ) -> Result<ShardWriter, TokensError> {
        let header = ShardHeader::for_layout(0, vocab, layout)?;
        let mut file = AtomicFile::create(path)?;
        file.write_all(&[0u8; HEADER_BYTES]).map_err(io_err(path))?;
        Ok(ShardWriter {
            file,
            path: path.to_path_buf(),
            vocab,
            layout,
            dtype: header.dtype,
            count: 0,
            buf: Vec::new(),
        })
    }

    /// Ids written so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append ids. Every id must be below the vocabulary, and the shard can hold at
    /// most `MAX_COUNT` ids; on error nothing of `ids` is written.
    pub fn push(&mut self, ids: &[u32]) -> Result<(), TokensError> {
        let max = ids.iter().fold(0u32, |m, &id| m.max(id));
        if !ids.is_empty() && max >= self.vocab {
            let (index, &id) = ids
                .iter()
                .enumerate()
                .find(|(_, &id)| id >= self.vocab)
                .unwrap_or((0, &max));
            return Err(TokensError::IdOutOfVocab {
                path: self.path.clone(),
                index: self.count.saturating_add(index as u64),
                id: u64::from(id),
                vocab: self.vocab,
            });
        }
        let total = self.count.saturating_add(ids.len() as u64);
        if total > MAX_COUNT {
            return Err(TokensError::BadOptions(format!(
                "{}: more than {MAX_COUNT} ids do not fit one shard (split it with a smaller shard_tokens)",
                self.path.display()
            )));
        }
        let size = self.dtype.itemsize();
        for chunk in ids.chunks(WRITE_CHUNK_IDS) {
            self.buf.clear();
            self.buf.resize(chunk.len().saturating_mul(size), 0);
            // Plain zipped loops over fixed-size chunks: the compiler vectorizes them.
            match self.dtype {
                IdDtype::U16 => {
                    let (out, _) = self.buf.as_chunks_mut::<2>();
                    for (o, &id) in out.iter_mut().zip(chunk) {
                        // Below vocab <= 65536 (checked above), so it fits in u16.
                        *o = (id as u16).to_le_bytes();
                    }
                }
                IdDtype::U32 => {
                    let (out, _) = self.buf.as_chunks_mut::<4>();
                    for (o, &id) in out.iter_mut().zip(chunk) {
                        *o = id.to_le_bytes();
                    }
                }
            }
            self.file.write_all(&self.buf).map_err(io_err(&self.path))?;
        }
        self.count = total;
        Ok(())
    }

    /// Patch the header with the final count and commit the file under its name.
    pub fn finish(self) -> Result<ShardHeader, TokensError> {
        let (header, ready) = self.prepare()?;
        ready.publish()?;
        Ok(header)
    }

    /// Patch the header with the final count and make the file durable under its
    /// temporary name; the caller renames it into place (with others, see
    /// [`atomic::publish_all`](crate::atomic::publish_all)).
    pub fn prepare(mut self) -> Result<(ShardHeader, Prepared), TokensError> {
        let header = ShardHeader::for_layout(self.count, self.vocab, self.layout)?;
        let w = self.file.writer();
        w.seek(SeekFrom::Start(0))
            .and_then(|_| w.write_all(&header.to_bytes()))
            .map_err(io_err(&self.path))?;
        Ok((header, self.file.prepare()?))
    }
}
