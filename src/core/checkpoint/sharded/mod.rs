//! Sharded checkpoints (scale.md section 1): every rank writes its own canonical
//! safetensors files into `step-N.tmp/`, rank 0 commits them with a chunk table,
//! `shards.json`, that maps every global tensor to its chunks and every chunk to digests
//! of its pieces, so that any rank can read exactly the bytes it needs and verify them.
//!
//! On object storage (`s3://`, through `remote::location`) the same steps are saved and
//! read with the rename-free protocol of `remote::checkpoint::sharded`: the ranks write
//! under a fresh attempt, the manifest's conditional put commits, reads are range
//! requests verified piece by piece.
//!
//! Invariants: a step is sharded exactly when its manifest lists [`SHARDS_NAME`]; the
//! chunk table is checked whole (in bounds, no overlap, full coverage, byte ranges equal
//! to the files' headers) before a step is committed and before one is read; every byte
//! a region read returns was verified against a piece digest (or, for an unsharded
//! step, against the file's sha256) in the same pass that copied it.

pub mod assign;
pub mod commit;
pub mod coverage;
pub mod dcp;
pub mod export;
pub mod named;
pub mod open;
pub mod piece;
pub mod plan;
pub mod read;
pub mod shared;
pub mod table;
pub mod verify;
pub mod write;

#[cfg(test)]
mod tests;

use std::io;
use std::path::PathBuf;

use super::CheckpointError;
use crate::failure::{Failure, FailureKind};

pub use assign::{assign_writers, chunk_key, rank_file_name, tensor_requests, HeldChunk, Writers};
pub use commit::{begin, begin_with, ChunkRequest, CommitRequest, ShardedSave, TensorRequest};
pub use export::{export, ExportReport};
pub use named::{begin_named, open_step_dir};
pub use open::{open_step, ShardedStep};
pub use read::ReadRequest;
pub use shared::check_shared;
pub use table::{ChunkEntry, Group, ShardsTable, TableTensor};
pub use write::{write_rank_file, ChunkData, RankFile, WrittenChunk};

/// The chunk table's file name in a sharded step directory.
pub const SHARDS_NAME: &str = "shards.json";
/// The value of the chunk table's `format` key.
pub const SHARDS_FORMAT: &str = "tlio-shards";
/// The chunk table version this code writes and reads.
pub const SHARDS_VERSION: u64 = 1;
/// The piece size this code writes: 1 MiB. Small enough that a resharded read
/// over-reads little and a piece fits in the cache between its read, its digest and its
/// copy; large enough that a 1 TB step's table stays below [`table::MAX_TABLE_BYTES`].
pub const PIECE_BYTES: u64 = 1 << 20;

/// Errors of sharded checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum ShardedError {
    /// The checkpoint protocol failed (lock, refusal, state, I/O of the commit).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A chunk table, a chunk list or a rank file's table breaks a rule.
    #[error("{what}: {reason}")]
    Table {
        /// What holds the problem (`shards.json`, a tensor, a file).
        what: String,
        /// The rule broken.
        reason: String,
    },
    /// A piece whose bytes do not match its digest.
    #[error("{file}: piece {index} (bytes {begin}..{end}) of {tensor} does not match its {digest} digest in shards.json (the chunk at offsets {chunk:?})")]
    Digest {
        /// The data file.
        file: String,
        /// The tensor (group/name) whose chunk holds the piece.
        tensor: String,
        /// The offsets of that chunk in the global tensor.
        chunk: Vec<u64>,
        /// The piece's index in its chunk.
        index: u64,
        /// First byte of the piece in the file.
        begin: u64,
        /// End of the piece in the file.
        end: u64,
        /// The digest algorithm.
        digest: &'static str,
    },
    /// A region read asked for something the step cannot give.
    #[error("{0}")]
    Request(String),
    /// A rank does not see the directory rank 0 created for the save (`shared`).
    #[error("{} is not shared between the hosts of this save: {seen} (a sharded save from several hosts needs a directory every host sees: a shared file system, or an s3:// prefix)", dir.display())]
    NotShared {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What this rank found instead of rank 0's probe.
        seen: String,
    },
    /// A file operation failed.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The export's output directory failed.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// A data file that breaks a safetensors reader rule.
    #[error("{}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The rule broken.
        source: crate::safetensors::SafetensorsError,
    },
}

impl Failure for ShardedError {
    fn kind(&self) -> FailureKind {
        match self {
            ShardedError::Checkpoint(e) => e.kind(),
            ShardedError::Model(e) => e.kind(),
            ShardedError::Safetensors { source, .. } => source.kind(),
            ShardedError::Table { .. } | ShardedError::Digest { .. } | ShardedError::Request(_) => {
                FailureKind::Invalid
            }
            // Where the files go, not what they hold: the job's storage is wrong.
            ShardedError::NotShared { .. } => FailureKind::Operational,
            ShardedError::Io { source, .. } => match source.kind() {
                io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => FailureKind::Invalid,
                _ => FailureKind::Operational,
            },
        }
    }
}

/// A table error about `what`.
pub(crate) fn table_err(what: impl Into<String>, reason: impl Into<String>) -> ShardedError {
    ShardedError::Table {
        what: what.into(),
        reason: reason.into(),
    }
}

/// Attach a path to an I/O error.
pub(crate) fn io_at(path: &std::path::Path) -> impl FnOnce(io::Error) -> ShardedError + '_ {
    move |source| ShardedError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The functions of this module take local (or shared file-system) directories; an
/// `s3://` URL goes through `remote::location` (which sends it to the object-storage
/// protocol) and is refused here before anything is created, where the local protocol
/// would otherwise make a directory named after the URL's text.
pub(crate) fn refuse_remote(dir: &std::path::Path) -> Result<(), ShardedError> {
    if dir.to_str().is_some_and(crate::s3::is_s3_url) {
        return Err(ShardedError::Request(format!(
            "{}: a URL of object storage, given to the local sharded protocol (an s3:// \
             prefix goes through remote::location)",
            dir.display()
        )));
    }
    Ok(())
}
