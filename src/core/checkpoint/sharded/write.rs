//! One rank's data file: a canonical safetensors file of the chunks the rank writes,
//! created inside `step-N.tmp/`, its sha256 and the piece digests of every chunk
//! computed from the very buffers written (never by reading the file back), fsynced.
//!
//! On object storage the file is an object uploaded under the save's attempt by
//! `remote::checkpoint::sharded`, through [`write_rank_file_with`]: the same digests.
//!
//! Invariants: the file is created exclusively (two ranks naming the same file is an
//! error, never a silent overwrite) and never through a symlink; the table returned
//! describes exactly the bytes written; everything checkable (names, dtypes, sizes) is
//! checked before the file is created.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::piece::piece_digest;
use super::{io_at, table_err, ShardedError, PIECE_BYTES};
use crate::checkpoint::fsops::{no_follow, FsOps, RealFs};
use crate::checkpoint::manifest::{is_plain_name, MANIFEST_NAME};
use crate::digest::hex;
use crate::safetensors::dtype::{byte_len, Dtype};
use crate::safetensors::write::{canonical_header, TensorSpec};

/// Bytes hashed and written per step: keeps each block in cache between the two.
const WRITE_BLOCK_BYTES: usize = 4 << 20;

/// One chunk a rank writes: its key in the file, dtype, shape and raw bytes.
#[derive(Debug, Clone, Copy)]
pub struct ChunkData<'a> {
    /// The tensor name inside the rank file.
    pub key: &'a str,
    /// Its dtype (whole bytes per element).
    pub dtype: Dtype,
    /// Its shape (the chunk's sizes).
    pub shape: &'a [u64],
    /// Its little-endian bytes, row-major.
    pub data: &'a [u8],
}

/// One chunk as written: dtype, shape, absolute byte range, piece digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenChunk {
    /// Its dtype.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<u64>,
    /// First byte of its data in the file.
    pub begin: u64,
    /// End of its data in the file.
    pub end: u64,
    /// Digests of its pieces of [`PIECE_BYTES`].
    pub pieces: Vec<String>,
}

/// The small table of one written rank file, which rank 0 gathers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankFile {
    /// The file's name in the step directory.
    pub name: String,
    /// Its size.
    pub size: u64,
    /// Its sha256, lowercase hex.
    pub sha256: String,
    /// Its chunks by key.
    pub tensors: BTreeMap<String, WrittenChunk>,
}

/// Check a rank file's name: plain, a `.safetensors` file, not a name the step uses.
pub fn check_file_name(name: &str) -> Result<(), ShardedError> {
    if !is_plain_name(name) || !name.ends_with(".safetensors") || name == MANIFEST_NAME {
        return Err(table_err(
            format!("rank file {name:?}"),
            "not a plain file name ending in .safetensors",
        ));
    }
    if name == crate::checkpoint::MODEL_NAME || name == crate::checkpoint::OPTIMIZER_NAME {
        return Err(table_err(
            format!("rank file {name:?}"),
            "the name of an unsharded step's file; a sharded step names its files otherwise",
        ));
    }
    Ok(())
}

/// Write `chunks` as the canonical safetensors file `tmp_dir/name`, hashing while
/// writing; fsync it when `durable`. Returns the table rank 0 needs. (An attempt on
/// object storage is `remote::location::sharded_write_rank_file`'s.)
pub fn write_rank_file(
    tmp_dir: &Path,
    name: &str,
    chunks: &[ChunkData<'_>],
    durable: bool,
) -> Result<RankFile, ShardedError> {
    super::refuse_remote(tmp_dir)?;
    let path = tmp_dir.join(name);
    let file = write_rank_file_with(name, chunks, &|header, ordered| {
        write_all(&path, header, ordered)
    })?;
    if durable {
        RealFs.fsync_file(&path).map_err(io_at(&path))?;
    }
    Ok(file)
}

/// Where a rank file's bytes go: given the header and the chunks in file order, it
/// writes them all (through [`stream_all`]) and returns the size and the sha256.
pub(crate) type RankSink<'a> =
    dyn Fn(&[u8], &[&ChunkData<'_>]) -> Result<(u64, String), ShardedError> + Sync + 'a;

/// [`write_rank_file`]'s rules and digests, whatever the bytes' destination: the checks
/// before anything is written, the canonical header, the piece digests computed on the
/// pool from the very buffers `sink` writes while `sink` hashes them whole.
pub(crate) fn write_rank_file_with(
    name: &str,
    chunks: &[ChunkData<'_>],
    sink: &RankSink<'_>,
) -> Result<RankFile, ShardedError> {
    check_file_name(name)?;
    let what = |key: &str| format!("rank file {name}: chunk {key:?}");
    for c in chunks {
        if c.dtype.size().is_none() {
            return Err(table_err(
                what(c.key),
                format!("dtype {} has no whole byte per element", c.dtype),
            ));
        }
        let expected = byte_len(c.dtype, c.shape)
            .map_err(|_| table_err(what(c.key), "its size overflows 64 bits"))?;
        if c.data.len() as u64 != expected {
            return Err(table_err(
                what(c.key),
                format!(
                    "{} bytes given for {} {:?} ({expected} bytes)",
                    c.data.len(),
                    c.dtype,
                    c.shape
                ),
            ));
        }
    }
    let specs: Vec<TensorSpec<'_>> = chunks
        .iter()
        .map(|c| TensorSpec::new(c.key, c.dtype, c.shape))
        .collect();
    let layout = canonical_header(&specs, &BTreeMap::new())
        .map_err(|e| table_err(format!("rank file {name}"), crate::failure::full_text(&e)))?;
    let data_start = layout.header.len() as u64;
    let ordered = layout
        .in_file_order(chunks)
        .map_err(|e| table_err(format!("rank file {name}"), e.to_string()))?;
    // The piece digests on the pool while this thread writes and computes the sha256.
    let (pieces, written) = rayon::join(
        || {
            chunks
                .iter()
                .map(|c| {
                    c.data
                        .par_chunks(PIECE_BYTES as usize)
                        .map(piece_digest)
                        .collect::<Vec<String>>()
                })
                .collect::<Vec<_>>()
        },
        || sink(&layout.header, &ordered),
    );
    let (size, sha) = written?;
    let mut tensors = BTreeMap::new();
    for ((c, &(b, e)), p) in chunks.iter().zip(&layout.offsets).zip(pieces) {
        tensors.insert(
            c.key.to_string(),
            WrittenChunk {
                dtype: c.dtype,
                shape: c.shape.to_vec(),
                begin: data_start.saturating_add(b),
                end: data_start.saturating_add(e),
                pieces: p,
            },
        );
    }
    Ok(RankFile {
        name: name.to_string(),
        size,
        sha256: sha,
        tensors,
    })
}

/// Create the file exclusively and write the header and the chunks' data, in blocks
/// hashed just before they are written; returns the size and the sha256.
fn write_all(
    path: &Path,
    header: &[u8],
    ordered: &[&ChunkData<'_>],
) -> Result<(u64, String), ShardedError> {
    let mut file = no_follow(OpenOptions::new().write(true).create_new(true))
        .open(path)
        .map_err(io_at(path))?;
    stream_all(&mut file, header, ordered).map_err(io_at(path))
}

/// Write the header and the chunks' data to `out`, in blocks hashed just before they
/// are written; returns the size and the sha256 of exactly the bytes written.
pub(crate) fn stream_all(
    out: &mut dyn Write,
    header: &[u8],
    ordered: &[&ChunkData<'_>],
) -> std::io::Result<(u64, String)> {
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut put = |block: &[u8]| -> std::io::Result<()> {
        hasher.update(block);
        size = size.saturating_add(block.len() as u64);
        out.write_all(block)
    };
    put(header)?;
    for c in ordered {
        for block in c.data.chunks(WRITE_BLOCK_BYTES) {
            put(block)?;
        }
    }
    Ok((size, hex(&hasher.finalize())))
}
