//! llm.c-style token shards and the exactly resumable token stream of tokens.md.
//!
//! Invariants: a `Shard` is only ever built from a file whose header, size and every id
//! have been validated; a `TokenStream`'s `Cursor` is its whole position (shard, offset
//! of the next window, generator state, and the global batch of a stream with ranks),
//! so restoring it continues bit for bit.
//!
//! The stream as a library (what a binding calls):
//! - [`TokenStream::open`]`(paths, seq_len, batch, rng, vocab_size, Ranks { rank,
//!   world_size })` opens and validates the shards and builds rank `rank`'s stream
//!   ([`Ranks::SINGLE`] for one process; [`TokenStream::new`] takes opened shards).
//! - [`TokenStream::next_batch`] returns fresh [B, T] `Vec<i64>`s;
//!   [`TokenStream::next_batch_into`] fills caller-owned `&mut [i64]` of B × T each.
//! - [`TokenStream::cursor`] returns the [`Cursor`], whose serde is the JSON of
//!   tokens.md (`Cursor::from_json`, `Cursor::to_json`, or `serde_json` directly);
//!   [`TokenStream::restore`] moves to one, checking it against the stream.
//! - [`CursorSession`] and [`read_cursor`] are `tokens windows`'s cursor files: read
//!   bounded, saved atomically, never over a shard.

use std::io;
use std::path::PathBuf;

use crate::failure::{Failure, FailureKind};

mod batch;
pub mod boundaries;
mod checks;
#[cfg(feature = "compression")]
mod compressed;
mod corpus;
pub mod docs;
#[cfg(feature = "tokenizers")]
mod gpt2fast;
#[cfg(feature = "tokenizers")]
mod hf;
pub mod manifest;
mod mixture;
#[cfg(feature = "tokenizers")]
mod o200k;
mod order;
mod pack;
mod part_docs;
pub mod parts;
#[cfg(feature = "tokenizers")]
mod runs;
mod session;
mod shard;
mod skip;
mod stream;
pub mod tokenizer;
mod writer;

pub use crate::cursor::Cursor;
pub use crate::pcg::RngState;
pub use corpus::{
    pack_text, CorpusFormat, TextPackOptions, TextPackProgress, TextPackSummary,
    DEFAULT_SHARD_TOKENS,
};
pub use manifest::{manifest_source, Manifest, ManifestShard, Split};
pub use mixture::{
    check_stages, check_weights, choose_source, expand_source, source_digest, sources_of, stage_at,
    MixReport, Mixture, MixtureBatch, MixtureCursor, MixtureOptions, MixtureSource, Rule,
    SourceCursor, SourceReport, Stage, StageRecord, WindowOrigin, MAX_SOURCES,
    WEIGHT_SUM_TOLERANCE,
};
pub use pack::{
    output_name, pack, refuse_url_inputs, InputFormat, PackInput, PackOptions, PackSummary,
    ShardPlan, BYTES_VOCAB,
};
pub use parts::{
    merge_parts, pack_part, part_area, tokenizer_identity, MergeSummary, Part, PartJob, PartMarker,
    PartOutcome, PartSource, PartsError,
};
pub use session::{read_cursor, CursorSession, Resumable};
pub use shard::{
    inspect_header, read_shard_header, report_from_bytes, HeaderReport, IdDtype, Layout, Shard,
    ShardHeader, ShardWriter, HEADER_BYTES, LLAMA3_MAGIC, MAGIC, MAX_COUNT, U16_VOCAB_LIMIT,
};
pub use stream::{
    check_batch_shape, check_ranks, shuffle_order, Batch, Ranks, ShardOrder, StreamOptions,
    TokenStream, MAX_BATCH_TOKENS, MAX_CURSOR_BYTES, MAX_GLOBAL_BATCH, MAX_SHARDS, MAX_WORLD_SIZE,
};
pub use tokenizer::Tokenizer;

/// What a bad magic word's four bytes look like, for the message: a file of text
/// handed to `tokens` by mistake is the common case.
fn magic_hint(magic: i32) -> &'static str {
    let bytes = magic.to_le_bytes();
    if bytes.starts_with(b"PK\x03\x04") {
        "; it is a zip archive"
    } else if std::str::from_utf8(&bytes).is_ok_and(|t| {
        t.chars()
            .all(|c| !c.is_control() || c.is_ascii_whitespace())
    }) {
        "; it starts with text"
    } else {
        ""
    }
}

/// Errors of token shards, packing and the token stream.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// A file could not be opened, read, mapped or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error (in the message, not the cause chain, so that it is
        /// printed once).
        error: io::Error,
    },
    /// The file is shorter than the 1024-byte header.
    #[error("{}: short file: {size} bytes, the header alone is {HEADER_BYTES}", path.display())]
    Short {
        /// The file.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
    },
    /// ShardHeader word 0 is not a known magic number.
    #[error("{}: not a token shard: bad magic {magic} (expected {MAGIC}, or {LLAMA3_MAGIC} for llm.c Llama-3 shards){}", path.display(), magic_hint(*.magic))]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// Word 0 as a signed 32-bit integer.
        magic: i32,
    },
    /// ShardHeader word 1 is not a version this magic allows.
    #[error("{}: unsupported version {version} for magic {magic} (expected {expected})", path.display())]
    BadVersion {
        /// The file.
        path: PathBuf,
        /// The magic number.
        magic: i32,
        /// Word 1.
        version: i32,
        /// The versions this magic allows, for the message.
        expected: &'static str,
    },
    /// ShardHeader word 2 (the id count) is negative.
    #[error("{}: negative id count {count} in header word 2", path.display())]
    NegativeCount {
        /// The file.
        path: PathBuf,
        /// Word 2.
        count: i32,
    },
    /// ShardHeader word 3 (the vocabulary size) is negative.
    #[error("{}: negative vocabulary size {vocab} in header word 3", path.display())]
    NegativeVocab {
        /// The file.
        path: PathBuf,
        /// Word 3.
        vocab: i32,
    },
    /// A reserved header word (4..255) is not zero.
    #[error("{}: reserved header word {word} is {value}, must be 0", path.display())]
    Reserved {
        /// The file.
        path: PathBuf,
        /// The word's index.
        word: usize,
        /// Its value.
        value: i32,
    },
    /// The file size disagrees with the header's id count.
    #[error("{}: size mismatch: the header's {count} ids of {itemsize} bytes need {expected} bytes, the file has {actual}", path.display())]
    SizeMismatch {
        /// The file.
        path: PathBuf,
        /// The header's id count.
        count: u64,
        /// Bytes per id.
        itemsize: u64,
        /// 1024 + count * itemsize.
        expected: u64,
        /// The file's size.
        actual: u64,
    },
    /// An id is not below the vocabulary size.
    #[error("{}: id {id} at index {index} is not below the vocabulary size {vocab}", path.display())]
    IdOutOfVocab {
        /// The file.
        path: PathBuf,
        /// The id's index among the ids.
        index: u64,
        /// The id.
        id: u64,
        /// The vocabulary size.
        vocab: u32,
    },
    /// A range of ids past the shard's end.
    #[error("{}: ids {start}..{start}+{count} pass the end of the shard ({len} ids)", path.display())]
    RangePastEnd {
        /// The shard.
        path: PathBuf,
        /// The first id asked for.
        start: u64,
        /// How many.
        count: u64,
        /// The shard's id count.
        len: u64,
    },
    /// A shard's file changed after it was opened and validated (rewritten or truncated
    /// in place underneath a reader).
    #[error("{}: the shard changed after it was opened: {what}; re-open it (a stream over it must be rebuilt)", path.display())]
    ShardChanged {
        /// The shard.
        path: PathBuf,
        /// What was found.
        what: String,
    },
    /// The vocabulary size given by the caller disagrees with the one the shard records.
    #[error("{}: vocabulary size mismatch: the shard records {recorded}, expected {expected}", path.display())]
    VocabMismatch {
        /// The shard.
        path: PathBuf,
        /// ShardHeader word 3.
        recorded: u32,
        /// What the caller asked for.
        expected: u32,
    },
    /// Two shards of one stream record different vocabularies.
    #[error("{}: the shard records vocabulary size {recorded}, but {} records {first_recorded}: shards of different vocabularies cannot form one stream", path.display(), first.display())]
    MixedVocab {
        /// The shard that disagrees.
        path: PathBuf,
        /// Its header word 3.
        recorded: u32,
        /// The first shard that records a vocabulary.
        first: PathBuf,
        /// Its header word 3.
        first_recorded: u32,
    },
    /// A vocabulary size out of the range a shard header can record.
    #[error("vocabulary size {vocab} is out of range (1 to {max})", max = i32::MAX)]
    BadVocab {
        /// The value given.
        vocab: u64,
    },
    /// A token stream needs at least one shard.
    #[error("the token stream needs at least one shard")]
    NoShards,
    /// seq_len or batch is below 1.
    #[error("{name} must be at least 1, got {value}")]
    BadArg {
        /// `seq_len` or `batch`.
        name: &'static str,
        /// The value given.
        value: usize,
    },
    /// B × (T + 1) ids per batch exceed [`MAX_BATCH_TOKENS`].
    #[error(
        "batch {batch} × (seq_len {seq_len} + 1) ids exceed the limit of {limit} ids per batch"
    )]
    BatchTooLarge {
        /// B.
        batch: usize,
        /// T.
        seq_len: usize,
        /// The limit.
        limit: u64,
    },
    /// A shard holds fewer than T + 1 ids, so not even one window fits.
    #[error("{}: shard {shard} holds {count} ids, too short for one window of seq_len {seq_len} (needs {})", path.display(), seq_len.saturating_add(1))]
    ShardTooShort {
        /// The shard's index in the stream.
        shard: usize,
        /// Its path.
        path: PathBuf,
        /// Its id count.
        count: u64,
        /// T.
        seq_len: usize,
    },
    /// rank is not below world_size.
    #[error("rank {rank} must be below world_size {world_size}")]
    BadRank {
        /// The rank given.
        rank: usize,
        /// The world size given.
        world_size: usize,
    },
    /// B × world_size windows exceed [`MAX_GLOBAL_BATCH`].
    #[error("batch {batch} × world_size {world_size} is above the limit of {limit} windows per global batch")]
    GlobalBatchOverflow {
        /// B.
        batch: usize,
        /// The world size.
        world_size: usize,
        /// The limit.
        limit: usize,
    },
    /// An argument above its named limit.
    #[error("{name} {value} is above the limit of {limit}")]
    TooLarge {
        /// What it is.
        name: &'static str,
        /// The value given.
        value: u64,
        /// The limit.
        limit: u64,
    },
    /// A batch stopped because its caller asked (an interrupt); the stream is unchanged.
    #[error("interrupted")]
    Interrupted,
    /// A caller-provided batch array of the wrong length.
    #[error("{name} holds {len} values, a batch of {batch} × seq_len {seq_len} needs exactly their product")]
    BatchBuffer {
        /// `inputs` or `targets`.
        name: &'static str,
        /// Its length.
        len: usize,
        /// B.
        batch: usize,
        /// T.
        seq_len: usize,
    },
    /// A cursor of another global batch than this stream's.
    #[error("the cursor's global_batch is {cursor}, but this stream's batch {batch} × world_size {world_size} is {stream}: a run resumes only with the same global batch")]
    GlobalBatchMismatch {
        /// The cursor's global_batch.
        cursor: u64,
        /// This stream's B × world_size.
        stream: u64,
        /// B.
        batch: usize,
        /// The world size.
        world_size: usize,
    },
    /// A cursor file that is not a cursor's JSON.
    #[error("{}: {reason}", path.display())]
    BadCursorFile {
        /// The file.
        path: PathBuf,
        /// What is wrong (serde's message, which names the key or value).
        reason: String,
    },
    /// A cursor field is malformed or out of range.
    #[error("cursor field \"{field}\": {reason}")]
    BadCursor {
        /// The field, e.g. `offset` or `rng.inc`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An output shard of `pack` would replace one of its inputs.
    #[error("refusing to write over the input {}", input.display())]
    ReplacesInput {
        /// The input.
        input: PathBuf,
    },
    /// A `pack` input given as a URL: inputs are read as local files only.
    #[error("{input}: a pack's inputs must be local files, and this is a URL (copy the object to a local file first)")]
    UrlInput {
        /// The input as given.
        input: String,
    },
    /// `pack` input is not in the declared format.
    #[error("{input}: {reason}")]
    BadInput {
        /// The input's name (`-` for standard input).
        input: String,
        /// What is wrong.
        reason: String,
    },
    /// `pack` options that cannot work (a zero shard size, too many ids for one shard).
    #[error("{0}")]
    BadOptions(String),
    /// A mixture that cannot be built: bad weights or stages, a source without shards
    /// (scale.md section 8).
    #[error("{reason}")]
    BadMixture {
        /// What is wrong, naming the source or stage.
        reason: String,
    },
    /// Reading a `pack` input failed.
    #[error("cannot read {input}: {error}")]
    Read {
        /// The input's name.
        input: String,
        /// The underlying error (in the message only, printed once).
        error: io::Error,
    },
    /// A pack that yields no id at all (llm.c's loader aborts on an empty shard).
    #[error(
        "the input yields no token: nothing to write (an empty shard is refused by llm.c's loader)"
    )]
    Empty,
    /// A pack split into a validation shard and training shards whose ids all fit the
    /// validation shard: it would write no training shard at all.
    #[error("the inputs yield {tokens} tokens and the validation shard takes the first {val_tokens}: no token is left for a training shard")]
    NoTrainTokens {
        /// Ids the inputs yield in all.
        tokens: u64,
        /// Ids of the validation shard.
        val_tokens: u64,
    },
    /// A document input (text, JSONL or Parquet) that cannot be read as one.
    #[error("{input}: {reason}")]
    BadDocument {
        /// Where: the file, with its line or row when there is one.
        input: String,
        /// What is wrong.
        reason: String,
    },
    /// An input that needs a part of the crate this build was made without (a
    /// `.parquet` file without the `parquet` feature, `.gz` or `.zst` without
    /// `compression`).
    #[error("{input}: this build lacks the `{feature}` feature needed to read it")]
    NotBuilt {
        /// The input's name.
        input: String,
        /// The crate feature that reads it.
        feature: &'static str,
    },
    /// A pack's manifest that cannot be read as one, or a split of it that lists no
    /// shard.
    #[error("{path}: {reason}")]
    BadManifest {
        /// The manifest's path or URL (with the split chosen, when that is the problem).
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The tokenizer could not be loaded or failed.
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerError),
    /// Writing an output shard failed.
    #[error(transparent)]
    Write(#[from] crate::atomic::AtomicError),
    /// A document sidecar is bad, missing where needed, or could not be written.
    #[error(transparent)]
    Docs(#[from] docs::DocsError),
}

impl Failure for TokensError {
    fn kind(&self) -> FailureKind {
        match self {
            TokensError::Io { .. } | TokensError::Read { .. } | TokensError::Write(_) => {
                FailureKind::Operational
            }
            TokensError::Tokenizer(e) => e.kind(),
            TokensError::Docs(e) => e.kind(),
            // Bad arguments are usage errors, not bad data.
            TokensError::NoShards
            | TokensError::BadArg { .. }
            | TokensError::BadRank { .. }
            | TokensError::GlobalBatchOverflow { .. }
            | TokensError::TooLarge { .. }
            | TokensError::Interrupted
            | TokensError::BatchBuffer { .. }
            | TokensError::BatchTooLarge { .. }
            | TokensError::BadVocab { .. }
            | TokensError::BadOptions(_)
            | TokensError::BadMixture { .. }
            | TokensError::NotBuilt { .. }
            | TokensError::UrlInput { .. }
            | TokensError::ReplacesInput { .. } => FailureKind::Operational,
            TokensError::Short { .. }
            | TokensError::BadMagic { .. }
            | TokensError::BadVersion { .. }
            | TokensError::NegativeCount { .. }
            | TokensError::NegativeVocab { .. }
            | TokensError::Reserved { .. }
            | TokensError::SizeMismatch { .. }
            | TokensError::IdOutOfVocab { .. }
            | TokensError::RangePastEnd { .. }
            | TokensError::ShardChanged { .. }
            | TokensError::VocabMismatch { .. }
            | TokensError::ShardTooShort { .. }
            | TokensError::BadCursor { .. }
            | TokensError::BadCursorFile { .. }
            | TokensError::GlobalBatchMismatch { .. }
            | TokensError::BadInput { .. }
            | TokensError::Empty
            | TokensError::NoTrainTokens { .. }
            | TokensError::BadDocument { .. }
            | TokensError::BadManifest { .. }
            | TokensError::MixedVocab { .. } => FailureKind::Invalid,
        }
    }
}
