//! `tokens pack --tokenizer`: documents from text, JSONL or Parquet files (`.gz` and
//! `.zst` decompressed on the fly) tokenized in parallel into llm.c-style shards.
//!
//! Invariants: the ids written are exactly `[eot] + encode(document)` for every document
//! in input order, whatever the thread count or the way the documents are split into
//! files; memory is bounded by a few batches of documents (plus one document, which
//! must be tokenized whole to be exact, up to `MAX_DOCUMENT_BYTES`); on any error
//! nothing is left under an output name.
//!
//! Parquet needs the crate's `parquet` feature, `.gz` and `.zst` its `compression`
//! feature; without them such an input is [`TokensError::NotBuilt`], never read as
//! plain text.
//!
//! Reading the documents is `documents`; this file runs the pipeline (one reading
//! thread, a pool of tokenizing threads, the shard writer) and owns its options.

use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver};

use rayon::prelude::*;

use super::pack::{refuse_url_inputs, IdSink, ShardPlan, Sink};
use super::shard::{Layout, ShardHeader};
use super::tokenizer::Tokenizer;
use super::TokensError;

mod documents;

use documents::Reader;
pub(super) use documents::{open_range, range_name, Source};

/// The largest single document (a text file, a JSONL line, a Parquet value): it is
/// tokenized whole, so it is held in memory whole.
pub const MAX_DOCUMENT_BYTES: usize = 1 << 30;
/// Documents are handed to the tokenizing threads in batches of about this many bytes.
const BATCH_BYTES: usize = 4 << 20;
/// ... or this many documents, whichever comes first.
const BATCH_DOCS: usize = 4096;
/// Batches read ahead of the tokenizers (bounded memory: at most this many waiting).
const BATCHES_AHEAD: usize = 2;
/// llm.c's shard size, the default of `--shard-tokens` with `--val-tokens`.
pub const DEFAULT_SHARD_TOKENS: u64 = 100_000_000;
/// The most threads `--threads` may ask for.
pub const MAX_THREADS: usize = 1024;

/// How documents are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CorpusFormat {
    /// Each file is one document (`-`: standard input).
    Text,
    /// One JSON object per line, the document in a string field.
    Jsonl,
    /// The string column of every row group of a Parquet file.
    Parquet,
}

/// What `pack_text` builds.
#[derive(Debug, Clone)]
pub struct TextPackOptions {
    /// How to read the inputs.
    pub format: CorpusFormat,
    /// The JSONL field or Parquet column holding the document.
    pub field: String,
    /// The id put before every document, if any.
    pub eot: Option<u32>,
    /// The shard files.
    pub plan: ShardPlan,
    /// Tokenizing threads (1 to `MAX_THREADS`).
    pub threads: usize,
    /// Skip (and count) bad JSONL lines and null Parquet values instead of failing.
    pub skip_bad: bool,
    /// The header of uint32 shards.
    pub layout: Layout,
}

/// Running totals, reported after every batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TextPackProgress {
    /// Documents tokenized.
    pub documents: u64,
    /// Ids written.
    pub tokens: u64,
    /// Document text bytes tokenized.
    pub bytes: u64,
}

/// What `pack_text` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextPackSummary {
    /// Each shard, in order, with its header.
    pub shards: Vec<(PathBuf, ShardHeader)>,
    /// Documents packed.
    pub documents: u64,
    /// Ids written.
    pub tokens: u64,
    /// Bad lines or rows skipped under `skip_bad`.
    pub skipped: u64,
}

/// Reads every input in order and sends batches of documents down `send`.
fn read_all(
    inputs: &[Source],
    opts: &TextPackOptions,
    send: &std::sync::mpsc::SyncSender<Vec<String>>,
) -> Result<u64, TokensError> {
    let mut reader = Reader {
        field: &opts.field,
        skip_bad: opts.skip_bad,
        skipped: 0,
    };
    let mut batch: Vec<String> = Vec::new();
    let mut batch_bytes = 0usize;
    // A closed channel means the consumer failed and reports why: stop quietly.
    let mut emit = |doc: String| -> Result<(), TokensError> {
        batch_bytes = batch_bytes.saturating_add(doc.len());
        batch.push(doc);
        if batch_bytes >= BATCH_BYTES || batch.len() >= BATCH_DOCS {
            batch_bytes = 0;
            send.send(std::mem::take(&mut batch))
                .map_err(|_| TokensError::BadOptions("stopped".to_string()))?;
        }
        Ok(())
    };
    for source in inputs {
        match (source, opts.format) {
            (Source::Whole(path), CorpusFormat::Text) => reader.text(path, &mut emit)?,
            (Source::Whole(path), CorpusFormat::Jsonl) => reader.jsonl(path, &mut emit)?,
            (Source::Whole(path), CorpusFormat::Parquet) => reader.parquet(path, &mut emit)?,
            (Source::Lines { path, start, end }, CorpusFormat::Jsonl) => {
                let lines = open_range(path, *start, *end)?;
                reader.jsonl_lines(Box::new(lines), &range_name(path, *start), &mut emit)?;
            }
            // The part planner cuts only uncompressed JSONL inside a file.
            (Source::Lines { path, .. }, CorpusFormat::Text | CorpusFormat::Parquet) => {
                return Err(TokensError::BadOptions(format!(
                    "{}: only JSONL is read by byte range",
                    path.display()
                )))
            }
        }
    }
    if !batch.is_empty() {
        send.send(batch)
            .map_err(|_| TokensError::BadOptions("stopped".to_string()))?;
    }
    Ok(reader.skipped)
}

/// Tokenize the batches coming down `recv` on `pool` and write them to `sink`, in order.
fn tokenize_all(
    recv: &Receiver<Vec<String>>,
    tokenizer: &Tokenizer,
    eot: Option<u32>,
    pool: &rayon::ThreadPool,
    sink: &mut dyn IdSink,
    progress: &mut dyn FnMut(&TextPackProgress),
) -> Result<u64, TokensError> {
    let mut totals = TextPackProgress::default();
    while let Ok(batch) = recv.recv() {
        // Results come back in document order whatever thread made them.
        let encoded: Vec<Result<Vec<u32>, TokensError>> = pool.install(|| {
            batch
                .par_iter()
                .map(|doc| {
                    let mut ids = Vec::with_capacity(doc.len() / 4 + 1);
                    ids.extend(eot);
                    ids.extend(tokenizer.encode(doc)?);
                    Ok(ids)
                })
                .collect()
        });
        for (doc, ids) in batch.iter().zip(encoded) {
            let ids = ids?;
            sink.start_document();
            sink.push(&ids)?;
            totals.documents = totals.documents.saturating_add(1);
            totals.bytes = totals.bytes.saturating_add(doc.len() as u64);
        }
        totals.tokens = sink.tokens();
        progress(&totals);
    }
    Ok(totals.documents)
}

/// Check the options every text pack shares: the thread count, and an end-of-text id
/// inside the tokenizer's vocabulary.
pub(super) fn check_text_options(
    tokenizer: &Tokenizer,
    opts: &TextPackOptions,
) -> Result<(), TokensError> {
    if opts.threads == 0 || opts.threads > MAX_THREADS {
        return Err(TokensError::BadOptions(format!(
            "threads must be 1 to {MAX_THREADS}, got {}",
            opts.threads
        )));
    }
    if let Some(eot) = opts.eot {
        if eot >= tokenizer.vocab_size() {
            return Err(TokensError::BadOptions(format!(
                "end-of-text id {eot} is not below the vocabulary size {}",
                tokenizer.vocab_size()
            )));
        }
    }
    Ok(())
}

/// Tokenize the documents of `sources`, in order, into `sink`: reading on its own
/// thread, tokenizing on `opts.threads` threads. Returns the documents packed and the
/// bad lines or rows skipped. The caller owns the sink (and its cleanup on error).
pub(super) fn tokenize_sources(
    sources: &[Source],
    tokenizer: &Tokenizer,
    opts: &TextPackOptions,
    sink: &mut dyn IdSink,
    progress: &mut dyn FnMut(&TextPackProgress),
) -> Result<(u64, u64), TokensError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .build()
        .map_err(|e| {
            TokensError::BadOptions(format!("cannot start {} threads: {e}", opts.threads))
        })?;
    let (send, recv) = sync_channel::<Vec<String>>(BATCHES_AHEAD);
    let (read_result, write_result) = std::thread::scope(|scope| {
        let reading = scope.spawn(move || read_all(sources, opts, &send));
        let written = tokenize_all(&recv, tokenizer, opts.eot, &pool, sink, progress);
        // Unblock the reader if we stopped early.
        drop(recv);
        let read = reading
            .join()
            .unwrap_or_else(|_| Err(TokensError::BadOptions("the reading thread failed".into())));
        (read, written)
    });
    // A write error is the first cause when both failed (the reader then only saw the
    // channel close).
    match (read_result, write_result) {
        (_, Err(e)) | (Err(e), Ok(_)) => Err(e),
        (Ok(skipped), Ok(documents)) => Ok((documents, skipped)),
    }
}

/// Tokenize the documents of `inputs` with `tokenizer` into the shards of
/// `opts.plan`: `[eot] + encode(document)` for each document, in order. Reading runs
/// on its own thread, tokenizing on `opts.threads` threads; `progress` gets the running
/// totals after every batch. On error nothing is left under any output name.
pub fn pack_text(
    inputs: &[PathBuf],
    tokenizer: &Tokenizer,
    opts: &TextPackOptions,
    progress: &mut dyn FnMut(&TextPackProgress),
) -> Result<TextPackSummary, TokensError> {
    check_text_options(tokenizer, opts)?;
    refuse_url_inputs(inputs.iter().map(PathBuf::as_path))?;
    opts.plan.refuse_inputs(
        inputs
            .iter()
            .map(PathBuf::as_path)
            .filter(|p| p.as_os_str() != "-"),
    )?;
    let mut sink = Sink::new(opts.plan.clone(), tokenizer.vocab_size(), opts.layout, true)?;
    let sources: Vec<Source> = inputs.iter().cloned().map(Source::Whole).collect();
    let (documents, skipped) =
        match tokenize_sources(&sources, tokenizer, opts, &mut sink, progress) {
            Ok(counts) => counts,
            Err(e) => {
                sink.abort();
                return Err(e);
            }
        };
    let tokens = sink.tokens();
    let shards = sink.finish()?;
    Ok(TextPackSummary {
        shards,
        documents,
        tokens,
        skipped,
    })
}
