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

use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};

#[cfg(feature = "parquet")]
use parquet::basic::Type as PhysicalType;
#[cfg(feature = "parquet")]
use parquet::column::reader::ColumnReader;
#[cfg(feature = "parquet")]
use parquet::data_type::ByteArray;
#[cfg(feature = "parquet")]
use parquet::file::reader::{FileReader, SerializedFileReader};
use rayon::prelude::*;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use super::pack::{IdSink, ShardPlan, Sink};
use super::shard::{Layout, ShardHeader};
use super::tokenizer::Tokenizer;
use super::TokensError;

/// The largest single document (a text file, a JSONL line, a Parquet value): it is
/// tokenized whole, so it is held in memory whole.
pub const MAX_DOCUMENT_BYTES: usize = 1 << 30;
/// Documents are handed to the tokenizing threads in batches of about this many bytes.
const BATCH_BYTES: usize = 4 << 20;
/// ... or this many documents, whichever comes first.
const BATCH_DOCS: usize = 4096;
/// Batches read ahead of the tokenizers (bounded memory: at most this many waiting).
const BATCHES_AHEAD: usize = 2;
/// Parquet values read per call.
#[cfg(feature = "parquet")]
const PARQUET_BATCH: usize = 1024;
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

fn bad(input: impl Into<String>, reason: impl Into<String>) -> TokensError {
    TokensError::BadDocument {
        input: input.into(),
        reason: reason.into(),
    }
}

fn read_err(name: &str, error: io::Error) -> TokensError {
    // Corrupt compressed data is bad input (exit 1), like bad UTF-8; a failing file
    // under it is a read error.
    #[cfg(feature = "compression")]
    if let Some(c) = super::compressed::corrupt_reason(&error) {
        return bad(name, c);
    }
    TokensError::Read {
        input: name.to_string(),
        error,
    }
}

/// Open `path` (`-`: standard input) for reading, decompressing `.gz` and `.zst`.
fn open_stream(path: &Path) -> Result<Box<dyn BufRead + Send>, TokensError> {
    let name = path.display().to_string();
    if path.as_os_str() == "-" {
        if crate::files::stdin_is_closed() {
            return Err(TokensError::Read {
                input: name,
                error: crate::files::stdin_closed_error(),
            });
        }
        return Ok(Box::new(BufReader::new(io::stdin())));
    }
    let compressed = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("gz" | "zst")
    );
    if compressed && !cfg!(feature = "compression") {
        return Err(TokensError::NotBuilt {
            input: name,
            feature: "compression",
        });
    }
    let file = crate::files::open_regular(path).map_err(|e| read_err(&name, e))?;
    let raw = BufReader::with_capacity(1 << 20, file);
    Ok(match path.extension().and_then(|e| e.to_str()) {
        #[cfg(feature = "compression")]
        Some("gz") => Box::new(BufReader::with_capacity(
            1 << 20,
            super::compressed::Gzip(flate2::bufread::MultiGzDecoder::new(raw)),
        )),
        #[cfg(feature = "compression")]
        Some("zst") => Box::new(BufReader::with_capacity(
            1 << 20,
            super::compressed::Zstd::new(raw).map_err(|e| read_err(&name, e))?,
        )),
        _ => Box::new(raw),
    })
}

/// Deserializes only the field `name` of a JSON object, as a string, skipping the rest
/// without building them; of a repeated field the last counts. `Ok(None)`: the object
/// has no such field.
struct FieldSeed<'a>(&'a str);

/// Why a JSON line has no usable document.
enum FieldError {
    NotAnObject,
    NotAString,
}

impl<'de> DeserializeSeed<'de> for FieldSeed<'_> {
    type Value = Result<Option<String>, FieldError>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FieldSeed<'_> {
    type Value = Result<Option<String>, FieldError>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found: Option<Result<String, FieldError>> = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            // A repeated field: the last one wins, as in serde_json's Value and Python's
            // json (what wrote or will read the corpus), documented in tokens.md.
            if key == self.0 {
                let value = map.next_value::<serde_json::Value>()?;
                found = Some(match value {
                    serde_json::Value::String(s) => Ok(s),
                    _ => Err(FieldError::NotAString),
                });
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found.transpose())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Err(FieldError::NotAnObject))
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Err(FieldError::NotAnObject))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Err(FieldError::NotAnObject))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Err(FieldError::NotAnObject))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Err(FieldError::NotAnObject))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Err(FieldError::NotAnObject))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Err(FieldError::NotAnObject))
    }
}

/// The document of one JSONL line, or why there is none.
fn parse_line(line: &[u8], field: &str) -> Result<String, String> {
    let mut de = serde_json::Deserializer::from_slice(line);
    let parsed = FieldSeed(field)
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v));
    match parsed {
        Err(e) => Err(format!("not JSON: {e}")),
        Ok(Err(FieldError::NotAnObject)) => Err("not a JSON object".to_string()),
        Ok(Err(FieldError::NotAString)) => Err(format!("field \"{field}\" is not a string")),
        Ok(Ok(None)) => Err(format!("no field \"{field}\"")),
        Ok(Ok(Some(doc))) => Ok(doc),
    }
}

/// Hands documents to `emit` in order, counting what `skip_bad` skipped.
struct Reader<'a> {
    field: &'a str,
    skip_bad: bool,
    skipped: u64,
}

impl Reader<'_> {
    /// Either skip (and count) a bad line or row, or fail with `error`.
    fn bad(&mut self, error: TokensError) -> Result<(), TokensError> {
        if self.skip_bad {
            self.skipped = self.skipped.saturating_add(1);
            Ok(())
        } else {
            Err(error)
        }
    }

    fn text(
        &mut self,
        path: &Path,
        emit: &mut dyn FnMut(String) -> Result<(), TokensError>,
    ) -> Result<(), TokensError> {
        let name = path.display().to_string();
        let limit = u64::try_from(MAX_DOCUMENT_BYTES)
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let mut bytes = Vec::new();
        open_stream(path)?
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(|e| read_err(&name, e))?;
        if bytes.len() > MAX_DOCUMENT_BYTES {
            return Err(bad(
                name,
                format!("a document is at most {MAX_DOCUMENT_BYTES} bytes"),
            ));
        }
        let text = String::from_utf8(bytes).map_err(|e| {
            bad(
                name.as_str(),
                format!(
                    "not UTF-8 text: invalid byte at offset {}",
                    e.utf8_error().valid_up_to()
                ),
            )
        })?;
        emit(text)
    }

    fn jsonl(
        &mut self,
        path: &Path,
        emit: &mut dyn FnMut(String) -> Result<(), TokensError>,
    ) -> Result<(), TokensError> {
        let name = path.display().to_string();
        self.jsonl_lines(open_stream(path)?, &name, emit)
    }

    /// The documents of the JSONL lines `reader` yields; `name` is shown in errors.
    fn jsonl_lines(
        &mut self,
        mut reader: Box<dyn BufRead + Send>,
        name: &str,
        emit: &mut dyn FnMut(String) -> Result<(), TokensError>,
    ) -> Result<(), TokensError> {
        let limit = u64::try_from(MAX_DOCUMENT_BYTES).unwrap_or(u64::MAX);
        let mut line = Vec::new();
        let mut number = 0u64;
        loop {
            line.clear();
            let got = (&mut reader)
                .take(limit.saturating_add(1))
                .read_until(b'\n', &mut line)
                .map_err(|e| read_err(name, e))?;
            if got == 0 {
                return Ok(());
            }
            number = number.saturating_add(1);
            if line.len() > MAX_DOCUMENT_BYTES {
                // Cannot skip a line we cannot hold: always an error.
                return Err(bad(
                    format!("{name}:{number}"),
                    format!("line longer than {MAX_DOCUMENT_BYTES} bytes"),
                ));
            }
            // A blank line (as at the end of a hand-edited file) holds no document.
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match parse_line(&line, self.field) {
                Ok(doc) => emit(doc)?,
                Err(reason) => self.bad(bad(format!("{name}:{number}"), reason))?,
            }
        }
    }

    /// Without the `parquet` feature a Parquet input is refused, never misread.
    #[cfg(not(feature = "parquet"))]
    fn parquet(
        &mut self,
        path: &Path,
        _emit: &mut dyn FnMut(String) -> Result<(), TokensError>,
    ) -> Result<(), TokensError> {
        Err(TokensError::NotBuilt {
            input: path.display().to_string(),
            feature: "parquet",
        })
    }

    #[cfg(feature = "parquet")]
    fn parquet(
        &mut self,
        path: &Path,
        emit: &mut dyn FnMut(String) -> Result<(), TokensError>,
    ) -> Result<(), TokensError> {
        let name = path.display().to_string();
        let perr = |e: parquet::errors::ParquetError| bad(name.as_str(), e.to_string());
        let file = crate::files::open_regular(path).map_err(|e| read_err(&name, e))?;
        let reader = SerializedFileReader::new(file).map_err(perr)?;
        let schema = reader.metadata().file_metadata().schema_descr_ptr();
        let column = (0..schema.num_columns())
            .find(|&i| {
                let c = schema.column(i);
                c.path().parts() == [self.field.to_string()]
            })
            .ok_or_else(|| {
                bad(
                    name.as_str(),
                    format!("no top-level column \"{}\"", self.field),
                )
            })?;
        let descr = schema.column(column);
        if descr.physical_type() != PhysicalType::BYTE_ARRAY || descr.max_rep_level() != 0 {
            return Err(bad(
                name.as_str(),
                format!(
                    "column \"{}\" is not a string column (physical type {}, repetition level {})",
                    self.field,
                    descr.physical_type(),
                    descr.max_rep_level()
                ),
            ));
        }
        let max_def = descr.max_def_level();
        let mut row = 0u64;
        let mut values: Vec<ByteArray> = Vec::with_capacity(PARQUET_BATCH);
        let mut defs: Vec<i16> = Vec::with_capacity(PARQUET_BATCH);
        for group in 0..reader.num_row_groups() {
            let rg = reader.get_row_group(group).map_err(perr)?;
            let ColumnReader::ByteArrayColumnReader(mut col) =
                rg.get_column_reader(column).map_err(perr)?
            else {
                return Err(bad(name.as_str(), "the column is not a byte-array column"));
            };
            loop {
                values.clear();
                defs.clear();
                let (records, _, _) = col
                    .read_records(PARQUET_BATCH, Some(&mut defs), None, &mut values)
                    .map_err(perr)?;
                if records == 0 {
                    break;
                }
                let mut next_value = values.drain(..);
                for i in 0..records {
                    row = row.saturating_add(1);
                    let present = max_def == 0 || defs.get(i).is_some_and(|&d| d == max_def);
                    let value = if present { next_value.next() } else { None };
                    let Some(value) = value else {
                        self.bad(bad(format!("{name}: row {row}"), "null document"))?;
                        continue;
                    };
                    if value.len() > MAX_DOCUMENT_BYTES {
                        return Err(bad(
                            format!("{name}: row {row}"),
                            format!("a document is at most {MAX_DOCUMENT_BYTES} bytes"),
                        ));
                    }
                    match String::from_utf8(value.data().to_vec()) {
                        Ok(doc) => emit(doc)?,
                        Err(_) => self.bad(bad(format!("{name}: row {row}"), "not UTF-8 text"))?,
                    }
                }
            }
        }
        Ok(())
    }
}

/// Where a pack's documents come from: a whole input file, or the byte range
/// `start..end` of an uncompressed JSONL file that begins and ends at line boundaries
/// (one part of a partitioned pack).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Source {
    /// The whole file (`-`: standard input), decompressed as its name says.
    Whole(PathBuf),
    /// Lines `start..end` (byte offsets) of an uncompressed JSONL file.
    Lines {
        /// The file.
        path: PathBuf,
        /// The first byte, the start of a line.
        start: u64,
        /// One past the last byte, the end of a line (or of the file).
        end: u64,
    },
}

/// The name of a byte range of `path` in messages: line numbers count from its start.
pub(super) fn range_name(path: &Path, start: u64) -> String {
    format!("{} (from byte {start})", path.display())
}

/// Open bytes `start..end` of the regular file `path`, buffered.
pub(super) fn open_range(
    path: &Path,
    start: u64,
    end: u64,
) -> Result<BufReader<io::Take<std::fs::File>>, TokensError> {
    use std::io::{Seek, SeekFrom};
    let name = path.display().to_string();
    let mut file = crate::files::open_regular(path).map_err(|e| read_err(&name, e))?;
    file.seek(SeekFrom::Start(start))
        .map_err(|e| read_err(&name, e))?;
    Ok(BufReader::with_capacity(
        1 << 20,
        file.take(end.saturating_sub(start)),
    ))
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
    opts.plan.refuse_inputs(
        inputs
            .iter()
            .map(PathBuf::as_path)
            .filter(|p| p.as_os_str() != "-"),
    )?;
    let mut sink = Sink::new(opts.plan.clone(), tokenizer.vocab_size(), opts.layout)?;
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
