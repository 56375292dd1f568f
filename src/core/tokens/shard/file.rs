//! A validated shard file ([`Shard`]): its header, exact size and every id (against V,
//! when known) checked at opening, then its ids read by position.
//!
//! Invariants: ids are read by positioned reads from the descriptor that was validated
//! (never mapped, so a file shrinking underneath is an error, not SIGBUS) and never
//! copied whole; a file whose identity, size or time changed since it was validated is
//! refused, naming the shard.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::{
    check_shard_vocab, io_err, open_and_parse, IdDtype, ShardHeader, HEADER_BYTES, U16_VOCAB_LIMIT,
};
use crate::tokens::TokensError;

/// Bytes read per positioned read while scanning a whole shard's ids.
const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// What a shard's file looked like when it was opened: a later `fstat` (of the held
/// descriptor, or of the path when it is opened again) that differs means the file was
/// rewritten in place or replaced underneath a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        }
    }

    /// What differs between the stamp at opening (`self`) and `now`, if anything.
    fn change(&self, now: &Stamp) -> Option<String> {
        if (now.dev, now.ino) != (self.dev, self.ino) {
            Some("the path now names another file (it was replaced)".to_string())
        } else if now.len != self.len {
            Some(format!(
                "its size went from {} to {} bytes",
                self.len, now.len
            ))
        } else if now.modified != self.modified {
            Some("it was modified".to_string())
        } else {
            None
        }
    }
}

/// A validated shard, its ids read by position from the file.
///
/// Reads are positioned reads, never a memory map: a map turns a file that shrinks
/// underneath (a tokenizer re-run writing the shard in place) into SIGBUS, which kills
/// the process; here a read that comes up short, or a file whose size, time or identity
/// changed since it was validated, is an error naming the shard. A shard larger than
/// memory still costs nothing until read. The descriptor is held from opening until
/// [`Shard::release`] (a stream over thousands of shards holds only the one it reads);
/// a released shard opens its path again when read, and refuses a file that is not the
/// one validated.
#[derive(Debug)]
pub struct Shard {
    path: PathBuf,
    header: ShardHeader,
    vocab: Option<u32>,
    file: Option<File>,
    stamp: Stamp,
    /// The path made absolute at opening, so a reopen after the process changed its
    /// working directory finds the same file.
    absolute: PathBuf,
}

impl Shard {
    /// Open and validate `path`: header, exact size, and every id below the vocabulary
    /// (the recorded one, else `vocab`; a given `vocab` must equal a recorded one).
    pub fn open(path: &Path, vocab: Option<u32>) -> Result<Shard, TokensError> {
        Shard::open_named(path, path, vocab)
    }

    /// [`Shard::open`] of the local file `local`, known (in errors and [`Shard::path`])
    /// by `shown`: a verified local copy of an object is named by its URL.
    pub fn open_named(
        local: &Path,
        shown: &Path,
        vocab: Option<u32>,
    ) -> Result<Shard, TokensError> {
        let path = shown;
        let vocab = vocab.map(|v| check_shard_vocab(u64::from(v))).transpose()?;
        let (file, _size, header) = open_and_parse(local, shown)?;
        if let (Some(recorded), Some(expected)) = (header.vocab, vocab) {
            if recorded != expected {
                return Err(TokensError::VocabMismatch {
                    path: path.to_path_buf(),
                    recorded,
                    expected,
                });
            }
        }
        let stamp = Stamp::of(&file.metadata().map_err(io_err(path))?);
        let shard = Shard {
            path: path.to_path_buf(),
            header,
            vocab: header.vocab.or(vocab),
            file: Some(file),
            stamp,
            absolute: std::path::absolute(local).unwrap_or_else(|_| local.to_path_buf()),
        };
        if let Some(limit) = shard.vocab {
            shard.check_ids(limit)?;
        }
        // A file rewritten while it was scanned is refused now rather than read later.
        shard.check_unchanged()?;
        Ok(shard)
    }

    /// Close the descriptor; the next read opens the path again (and checks that it is
    /// still the file validated).
    pub fn release(&mut self) {
        self.file = None;
    }

    /// Hold a descriptor (opening the path again when released), so that reads that
    /// follow use it.
    pub fn hold(&mut self) -> Result<(), TokensError> {
        if self.file.is_none() {
            self.file = Some(self.reopen()?);
        }
        Ok(())
    }

    /// Open the path again and check that it is the file validated, unchanged.
    fn reopen(&self) -> Result<File, TokensError> {
        let file = crate::files::open_regular(&self.absolute).map_err(io_err(&self.path))?;
        let now = Stamp::of(&file.metadata().map_err(io_err(&self.path))?);
        match self.stamp.change(&now) {
            None => Ok(file),
            Some(what) => Err(TokensError::ShardChanged {
                path: self.path.clone(),
                what,
            }),
        }
    }

    /// Check that the file still has the identity, size and modification time it had
    /// when it was opened: a shard rewritten in place would otherwise feed other ids
    /// than the ones validated.
    pub fn check_unchanged(&self) -> Result<(), TokensError> {
        let now = match &self.file {
            Some(file) => Stamp::of(&file.metadata().map_err(io_err(&self.path))?),
            None => return self.reopen().map(drop),
        };
        match self.stamp.change(&now) {
            None => Ok(()),
            Some(what) => Err(TokensError::ShardChanged {
                path: self.path.clone(),
                what,
            }),
        }
    }

    /// One pass over the ids in chunks of positioned reads, naming the first id at or
    /// above `limit`.
    pub(crate) fn check_ids(&self, limit: u32) -> Result<(), TokensError> {
        if self.header.dtype == IdDtype::U16 && limit >= U16_VOCAB_LIMIT {
            return Ok(());
        }
        let size = self.header.dtype.itemsize();
        let per_chunk = SCAN_CHUNK_BYTES / size;
        let mut buf = Vec::new();
        let mut start = 0usize;
        while start < self.len() {
            let count = per_chunk.min(self.len().saturating_sub(start));
            self.read_bytes(start, count, &mut buf)?;
            let bad = decode_ids(self.header.dtype, &buf)
                .enumerate()
                .find(|&(_, id)| id >= limit);
            if let Some((i, id)) = bad {
                return Err(TokensError::IdOutOfVocab {
                    path: self.path.clone(),
                    index: start.saturating_add(i) as u64,
                    id: u64::from(id),
                    vocab: limit,
                });
            }
            start = start.saturating_add(count);
        }
        Ok(())
    }

    /// Read the bytes of ids `start .. start + count` into `buf` (resized to fit). A
    /// range past the header's count, or a file that no longer holds it (it shrank
    /// since it was opened), is an error naming the shard.
    fn read_bytes(&self, start: usize, count: usize, buf: &mut Vec<u8>) -> Result<(), TokensError> {
        use std::os::unix::fs::FileExt;
        let size = self.header.dtype.itemsize();
        let end = start.checked_add(count).filter(|&e| e <= self.len());
        let (Some(_), Some(len), Some(at)) = (
            end,
            count.checked_mul(size),
            start
                .checked_mul(size)
                .and_then(|b| b.checked_add(HEADER_BYTES)),
        ) else {
            return Err(TokensError::RangePastEnd {
                path: self.path.clone(),
                start: start as u64,
                count: count as u64,
                len: self.len() as u64,
            });
        };
        buf.resize(len, 0);
        let reopened;
        let file = match &self.file {
            Some(file) => file,
            None => {
                reopened = self.reopen()?;
                &reopened
            }
        };
        file.read_exact_at(buf, at as u64)
            .map_err(|error| match error.kind() {
                io::ErrorKind::UnexpectedEof => TokensError::ShardChanged {
                    path: self.path.clone(),
                    what: format!(
                        "it no longer holds the {} ids its header promised (it shrank)",
                        self.len()
                    ),
                },
                _ => io_err(&self.path)(error),
            })
    }

    /// The file this shard was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The local file read (absolute): the path itself, or an object's cached copy.
    pub fn local_path(&self) -> &Path {
        &self.absolute
    }

    /// The validated header.
    pub fn header(&self) -> &ShardHeader {
        &self.header
    }

    /// The vocabulary every id was checked against: the recorded one, else the one
    /// given to `open`, else `None` (not checked).
    pub fn vocab(&self) -> Option<u32> {
        self.vocab
    }

    /// The number of ids.
    pub fn len(&self) -> usize {
        // The header's count was checked against the file size and MAX_COUNT.
        usize::try_from(self.header.count).unwrap_or(usize::MAX)
    }

    /// True when the shard holds no id.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The id at `index`.
    pub fn get(&self, index: usize) -> Result<u32, TokensError> {
        let mut buf = Vec::new();
        self.read_bytes(index, 1, &mut buf)?;
        let id = decode_ids(self.header.dtype, &buf).next();
        id.ok_or_else(|| TokensError::RangePastEnd {
            path: self.path.clone(),
            start: index as u64,
            count: 1,
            len: self.len() as u64,
        })
    }

    /// Read the T + 1 ids of the window at `start` (T = `inputs.len()` =
    /// `targets.len()`) into one row of inputs (the first T) and one of targets (the
    /// last T), each id checked against the shard's vocabulary again (a file changed
    /// underneath must not feed an id past the embedding table). `scratch` is the
    /// caller's reusable buffer.
    pub fn read_window(
        &self,
        start: usize,
        inputs: &mut [i64],
        targets: &mut [i64],
        scratch: &mut Vec<u8>,
    ) -> Result<(), TokensError> {
        let t = inputs.len();
        self.read_bytes(start, t.saturating_add(1), scratch)?;
        let limit = self.vocab.unwrap_or(u32::MAX);
        let mut ids = decode_ids(self.header.dtype, scratch);
        let mut previous = ids.next().unwrap_or(0);
        for (i, (x, y)) in inputs.iter_mut().zip(targets.iter_mut()).enumerate() {
            let id = ids.next().unwrap_or(0);
            if previous >= limit || id >= limit {
                let (index, bad) = if previous >= limit {
                    (i, previous)
                } else {
                    (i + 1, id)
                };
                return Err(TokensError::ShardChanged {
                    path: self.path.clone(),
                    what: format!(
                        "id {bad} at index {} is not below the vocabulary size {limit} it was validated against",
                        start.saturating_add(index)
                    ),
                });
            }
            *x = i64::from(previous);
            *y = i64::from(id);
            previous = id;
        }
        Ok(())
    }

    /// The ids in `range` as u32.
    pub fn ids(&self, range: Range<usize>) -> Result<Vec<u32>, TokensError> {
        let count = range.end.saturating_sub(range.start);
        let mut buf = Vec::new();
        self.read_bytes(range.start, count, &mut buf)?;
        Ok(decode_ids(self.header.dtype, &buf).collect())
    }
}

/// Little-endian ids of `dtype` in `bytes`, widened to u32.
fn decode_ids(dtype: IdDtype, bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    let size = dtype.itemsize();
    bytes.chunks_exact(size).map(move |c| match c {
        [a, b] => u32::from(u16::from_le_bytes([*a, *b])),
        [a, b, c, d] => u32::from_le_bytes([*a, *b, *c, *d]),
        _ => 0,
    })
}
