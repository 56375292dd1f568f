//! `tokens pack`: turn byte streams, decimal id text or raw little-endian id arrays into
//! shards, streaming in bounded memory.
//!
//! Invariants: every id is checked against the vocabulary before it is written; every
//! shard is written under a temporary name and no final shard name appears before the
//! whole input has been read (all are renamed at the end, so a crash mid-pack never
//! leaves `OUT_000000..2.bin` that look like a complete dataset); on any error nothing
//! is left under any output name.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::shard::{check_shard_vocab, Layout, ShardHeader, ShardWriter, MAX_COUNT};
use super::TokensError;
use crate::atomic::{self, Prepared};

/// Bytes read from an input at a time.
pub(super) const READ_CHUNK: usize = 1 << 20;
/// Digits in the shard number of `OUT_000000.bin`.
const SHARD_NUMBER_DIGITS: usize = 6;
/// The vocabulary of `--from bytes`: every byte value is an id.
pub const BYTES_VOCAB: u32 = 256;

/// How `pack` reads its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    /// Each byte is an id (vocabulary 256 by default).
    Bytes,
    /// Decimal ids separated by ASCII whitespace.
    Ids,
    /// Little-endian uint16 ids, back to back.
    U16le,
    /// Little-endian uint32 ids, back to back.
    U32le,
}

/// One input: a name for messages (`-` for standard input) and its bytes.
pub struct PackInput {
    /// Shown in errors.
    pub name: String,
    /// The bytes.
    pub reader: Box<dyn Read>,
    /// The file the bytes come from, when there is one: `pack` refuses to write a shard
    /// over it.
    pub path: Option<PathBuf>,
}

/// True when `text` starts as a URL does, `scheme://` (`s3://`, `https://`, `gs://`,
/// ...): a scheme of an ASCII letter then letters, digits, `+`, `-` or `.`.
fn is_url(text: &str) -> bool {
    text.split_once("://").is_some_and(|(scheme, _)| {
        let mut chars = scheme.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

/// Refuse an input named by a URL: a pack reads local files (and standard input)
/// only, and a URL taken as a path would fail as a missing file, which misleads.
pub fn refuse_url_inputs<'a>(
    inputs: impl IntoIterator<Item = &'a Path>,
) -> Result<(), TokensError> {
    match inputs.into_iter().find(|p| p.to_str().is_some_and(is_url)) {
        Some(input) => Err(TokensError::UrlInput {
            input: input.display().to_string(),
        }),
        None => Ok(()),
    }
}

impl PackInput {
    /// The file at `path`, opened now (so a missing input fails before anything is
    /// written), with its size for a progress total. A URL is refused.
    pub fn open(path: &Path) -> Result<(PackInput, u64), TokensError> {
        refuse_url_inputs([path])?;
        let io_error = |error| TokensError::Io {
            path: path.to_path_buf(),
            error,
        };
        let file = crate::files::open_regular(path).map_err(io_error)?;
        let size = file.metadata().map_err(io_error)?.len();
        let input = PackInput {
            name: path.display().to_string(),
            reader: Box::new(file),
            path: Some(path.to_path_buf()),
        };
        Ok((input, size))
    }
}

/// What to build.
#[derive(Debug, Clone, Copy)]
pub struct PackOptions {
    /// The input format.
    pub format: InputFormat,
    /// The vocabulary every id must be below (recorded in each shard).
    pub vocab: u32,
    /// Ids per shard; `None` writes one file.
    pub shard_tokens: Option<u64>,
    /// The header of uint32 shards (V > 65,536).
    pub layout: Layout,
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackSummary {
    /// Each shard written, in order, with its header.
    pub shards: Vec<(PathBuf, ShardHeader)>,
    /// Ids written in all.
    pub tokens: u64,
}

/// The name of shard `index` for output `out` with `--shard-tokens`: `OUT_000000.bin`
/// (a trailing `.bin` of `out` is dropped first, so `train.bin` gives
/// `train_000000.bin`).
pub fn output_name(out: &Path, index: usize) -> PathBuf {
    let base = if out.extension().is_some_and(|e| e == "bin") {
        out.with_extension("")
    } else {
        out.to_path_buf()
    };
    let mut name = base.into_os_string();
    name.push(format!("_{index:0SHARD_NUMBER_DIGITS$}.bin"));
    PathBuf::from(name)
}

/// Which shard files a pack writes, and how many ids each holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardPlan {
    /// One file, `OUT` itself.
    Single(PathBuf),
    /// `OUT_000000.bin`, `OUT_000001.bin`, ... of `shard_tokens` ids each.
    Numbered {
        /// OUT.
        out: PathBuf,
        /// Ids per shard.
        shard_tokens: u64,
    },
    /// llm.c's fineweb.py naming: the first `val_tokens` ids in `PREFIX_val_000000.bin`,
    /// the rest in `PREFIX_train_000001.bin`, ... of `shard_tokens` ids each.
    ValTrain {
        /// PREFIX.
        prefix: PathBuf,
        /// Ids in the validation shard.
        val_tokens: u64,
        /// Ids per training shard.
        shard_tokens: u64,
    },
}

impl ShardPlan {
    /// True when writing the shards of this plan would replace the file `input` (the
    /// same file by device and inode, so links count; of a numbered plan, every shard
    /// name that exists now).
    pub fn would_replace(&self, input: &Path) -> bool {
        if let ShardPlan::Single(out) = self {
            return atomic::same_file(input, out);
        }
        (0..)
            .map(|i| self.shard(i).0)
            .take_while(|p| p.exists())
            .any(|p| atomic::same_file(input, &p))
    }

    /// Refuse the plan when one of its shards would replace one of `inputs`.
    pub fn refuse_inputs<'a>(
        &self,
        inputs: impl IntoIterator<Item = &'a Path>,
    ) -> Result<(), TokensError> {
        match inputs.into_iter().find(|p| self.would_replace(p)) {
            Some(input) => Err(TokensError::ReplacesInput {
                input: input.to_path_buf(),
            }),
            None => Ok(()),
        }
    }

    /// The path of shard `index` and the most ids it may hold.
    pub fn shard(&self, index: usize) -> (PathBuf, u64) {
        match self {
            ShardPlan::Single(out) => (out.clone(), MAX_COUNT),
            ShardPlan::Numbered { out, shard_tokens } => (output_name(out, index), *shard_tokens),
            ShardPlan::ValTrain {
                prefix,
                val_tokens,
                shard_tokens,
            } => {
                let mut name = prefix.clone().into_os_string();
                if index == 0 {
                    name.push(format!("_val_{index:0SHARD_NUMBER_DIGITS$}.bin"));
                    (PathBuf::from(name), *val_tokens)
                } else {
                    name.push(format!("_train_{index:0SHARD_NUMBER_DIGITS$}.bin"));
                    (PathBuf::from(name), *shard_tokens)
                }
            }
        }
    }

    /// Refuse a pack of `tokens` ids in all that would leave this plan's training
    /// shards empty: a validation split of at least the whole corpus writes only the
    /// validation shard, which no training run can use.
    pub fn check_total(&self, tokens: u64) -> Result<(), TokensError> {
        match self {
            ShardPlan::ValTrain { val_tokens, .. } if tokens <= *val_tokens => {
                Err(TokensError::NoTrainTokens {
                    tokens,
                    val_tokens: *val_tokens,
                })
            }
            _ => Ok(()),
        }
    }

    /// Check the shard sizes (1 to `MAX_COUNT` ids).
    pub fn check(&self) -> Result<(), TokensError> {
        let sizes: &[(&str, u64)] = match self {
            ShardPlan::Single(_) => &[],
            ShardPlan::Numbered { shard_tokens, .. } => &[("shard_tokens", *shard_tokens)],
            ShardPlan::ValTrain {
                val_tokens,
                shard_tokens,
                ..
            } => &[("val_tokens", *val_tokens), ("shard_tokens", *shard_tokens)],
        };
        for &(name, n) in sizes {
            if n == 0 || n > MAX_COUNT {
                return Err(TokensError::BadOptions(format!(
                    "{name} must be 1 to {MAX_COUNT}, got {n}"
                )));
            }
        }
        Ok(())
    }
}

/// Where the ids of a pack go: the final shards ([`Sink`]), or the raw id stream of
/// one part of a partitioned pack (which `tokens merge` cuts into the same shards).
pub(super) trait IdSink {
    /// The vocabulary every id must be below.
    fn vocab(&self) -> u32;
    /// Append ids.
    fn push(&mut self, ids: &[u32]) -> Result<(), TokensError>;
    /// Ids accepted so far.
    fn tokens(&self) -> u64;
    /// The next id pushed is a document's first (a document of no ids starts nowhere).
    fn start_document(&mut self) {}
}

impl IdSink for Sink {
    fn vocab(&self) -> u32 {
        self.vocab
    }
    fn push(&mut self, ids: &[u32]) -> Result<(), TokensError> {
        Sink::push(self, ids)
    }
    fn tokens(&self) -> u64 {
        Sink::tokens(self)
    }
    fn start_document(&mut self) {
        if let Some(docs) = &mut self.docs {
            docs.pending = true;
        }
    }
}

/// The document starts of the shard being written, when the pack records documents.
#[derive(Default)]
struct ShardDocs {
    /// The next id pushed starts a document.
    pending: bool,
    /// Offsets within the current shard of the documents started in it.
    starts: Vec<u64>,
}

/// Where ids go: the current shard, rotated as the plan says. Each shard is made
/// durable under its temporary name as it fills; only `finish` renames them all into
/// place, so until then no final shard name exists, and `abort` (or a drop) removes
/// every temporary file.
pub(super) struct Sink {
    plan: ShardPlan,
    vocab: u32,
    layout: Layout,
    current: Option<(ShardWriter, u64)>,
    done: Vec<(PathBuf, ShardHeader)>,
    ready: Vec<Prepared>,
    tokens: u64,
    /// Document starts, written as each shard's sidecar (docs.rs) when it is prepared.
    docs: Option<ShardDocs>,
}

impl Sink {
    /// A sink writing `plan`'s shards for vocabulary `vocab`; with `documents`, each
    /// shard gets its document sidecar (docs.rs), prepared and renamed with it.
    pub(super) fn new(
        plan: ShardPlan,
        vocab: u32,
        layout: Layout,
        documents: bool,
    ) -> Result<Sink, TokensError> {
        check_shard_vocab(u64::from(vocab))?;
        plan.check()?;
        Ok(Sink {
            plan,
            vocab,
            layout,
            current: None,
            done: Vec::new(),
            ready: Vec::new(),
            tokens: 0,
            docs: documents.then(ShardDocs::default),
        })
    }

    /// Ids accepted so far.
    pub(super) fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Append ids, preparing each shard (durable under its temporary name) as it fills.
    pub(super) fn push(&mut self, mut ids: &[u32]) -> Result<(), TokensError> {
        while !ids.is_empty() {
            let (writer, limit) = match self.current.take() {
                Some(w) => w,
                None => {
                    let (path, limit) = self.plan.shard(self.done.len());
                    (
                        ShardWriter::create_with(&path, self.vocab, self.layout)?,
                        limit,
                    )
                }
            };
            let (writer, limit) = self.current.insert((writer, limit));
            let limit = *limit;
            let room = usize::try_from(limit.saturating_sub(writer.count())).unwrap_or(usize::MAX);
            if let Some(docs) = self.docs.as_mut().filter(|d| d.pending) {
                // The first id of `ids` lands in this shard, at its current count.
                docs.pending = false;
                docs.starts.push(writer.count());
            }
            let (now, later) = ids.split_at(room.min(ids.len()));
            writer.push(now)?;
            self.tokens = self.tokens.saturating_add(now.len() as u64);
            if writer.count() >= limit {
                self.finish_current()?;
            }
            ids = later;
        }
        Ok(())
    }

    fn finish_current(&mut self) -> Result<(), TokensError> {
        if let Some((writer, _)) = self.current.take() {
            let path = writer.path().to_path_buf();
            let (header, ready) = writer.prepare()?;
            self.ready.push(ready);
            if let Some(docs) = &mut self.docs {
                let starts = std::mem::take(&mut docs.starts);
                self.ready
                    .push(super::docs::prepare_docs(&path, header.count, &starts)?);
            }
            self.done.push((path, header));
        }
        Ok(())
    }

    /// Prepare the last shard, then rename every shard into place and return them.
    /// No id at all is an error (llm.c's loader aborts on an empty shard), leaving
    /// nothing behind.
    pub(super) fn finish(mut self) -> Result<Vec<(PathBuf, ShardHeader)>, TokensError> {
        if self.tokens == 0 {
            self.abort();
            return Err(TokensError::Empty);
        }
        if let Err(e) = self.plan.check_total(self.tokens) {
            self.abort();
            return Err(e);
        }
        if let Err(e) = self.finish_current() {
            self.abort();
            return Err(e);
        }
        // Every shard is complete and durable under its temporary name: only now do the
        // final names appear, one rename each (publish_all removes the ones it renamed
        // if a later rename fails).
        atomic::publish_all(std::mem::take(&mut self.ready))?;
        Ok(self.done)
    }

    /// Drop every temporary file this sink wrote (the unfinished shard's and the
    /// prepared ones'), so a failed pack leaves nothing under any name.
    pub(super) fn abort(&mut self) {
        drop(self.current.take());
        self.ready.clear();
        self.done.clear();
    }
}

/// Read into `buf` until it is full or the input ends; returns the bytes read.
fn fill(reader: &mut dyn Read, buf: &mut [u8], name: &str) -> Result<usize, TokensError> {
    let mut got = 0;
    while let Some(rest) = buf.get_mut(got..) {
        if rest.is_empty() {
            break;
        }
        match reader.read(rest) {
            Ok(0) => break,
            // Read's contract, checked: a reader claiming more than it was given is an
            // error, so the count returned never exceeds `buf`.
            Ok(n) if n > rest.len() => {
                return Err(TokensError::Read {
                    input: name.to_string(),
                    error: io::Error::other("the reader reported more bytes than it was given"),
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => {
                return Err(TokensError::Read {
                    input: name.to_string(),
                    error,
                })
            }
        }
    }
    Ok(got)
}

fn out_of_vocab(name: &str, position: u64, id: u64, vocab: u32) -> TokensError {
    TokensError::BadInput {
        input: name.to_string(),
        reason: format!("id {id} at position {position} is not below the vocabulary size {vocab}"),
    }
}

/// Check a decoded chunk against the vocabulary, naming the input and position.
fn check_chunk(ids: &[u32], vocab: u32, name: &str, first: u64) -> Result<(), TokensError> {
    if ids.iter().fold(0u32, |m, &id| m.max(id)) < vocab {
        return Ok(());
    }
    match ids.iter().enumerate().find(|(_, &id)| id >= vocab) {
        Some((i, &id)) => Err(out_of_vocab(
            name,
            first.saturating_add(i as u64),
            u64::from(id),
            vocab,
        )),
        None => Ok(()),
    }
}

/// The character that starts at `bytes[i]`, quoted and escaped for display. A byte is
/// not a character: showing a UTF-8 lead byte as `char::from(byte)` would print `é` as
/// `Ã`, so the whole UTF-8 sequence is decoded, and a byte that starts no valid
/// sequence (or one cut by the chunk boundary) is shown as a byte.
fn describe_char_at(bytes: &[u8], i: usize, byte: u8) -> String {
    let end = bytes.len().min(i.saturating_add(4));
    let window = bytes.get(i..end).unwrap_or_default();
    let valid = match std::str::from_utf8(window) {
        Ok(s) => s,
        // `valid_up_to` marks a prefix that is valid UTF-8.
        Err(e) => std::str::from_utf8(window.get(..e.valid_up_to()).unwrap_or_default())
            .unwrap_or_default(),
    };
    match valid.chars().next() {
        Some(c) => crate::text::quote(c.encode_utf8(&mut [0; 4])),
        None => format!("byte 0x{byte:02x}"),
    }
}

/// Decimal ids separated by whitespace, parsed across chunk boundaries.
struct IdText {
    current: Option<u64>,
    offset: u64,
}

impl IdText {
    fn feed(&mut self, bytes: &[u8], ids: &mut Vec<u32>, name: &str) -> Result<(), TokensError> {
        for (i, &b) in bytes.iter().enumerate() {
            match b {
                b'0'..=b'9' => {
                    let value = self
                        .current
                        .unwrap_or(0)
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(u64::from(b - b'0')))
                        .filter(|&v| v <= u64::from(u32::MAX))
                        .ok_or_else(|| TokensError::BadInput {
                            input: name.to_string(),
                            reason: format!("id at byte {} is too large for a token id", self.offset),
                        })?;
                    self.current = Some(value);
                }
                b if b.is_ascii_whitespace() => self.end(ids),
                other => {
                    return Err(TokensError::BadInput {
                        input: name.to_string(),
                        reason: format!(
                            "invalid character {} at byte {} (ids are decimal integers separated by whitespace)",
                            describe_char_at(bytes, i, other),
                            self.offset
                        ),
                    })
                }
            }
            self.offset = self.offset.saturating_add(1);
        }
        Ok(())
    }

    fn end(&mut self, ids: &mut Vec<u32>) {
        if let Some(v) = self.current.take() {
            // At most u32::MAX, checked as the digits came in.
            ids.push(u32::try_from(v).unwrap_or(u32::MAX));
        }
    }
}

/// Pack one input into the sink.
pub(super) fn pack_input(
    input: &mut PackInput,
    sink: &mut dyn IdSink,
    format: InputFormat,
    buf: &mut [u8],
    ids: &mut Vec<u32>,
    progress: &mut dyn FnMut(u64),
) -> Result<(), TokensError> {
    let vocab = sink.vocab();
    let name = input.name.as_str();
    let mut position = 0u64;
    let mut carry = 0usize;
    let mut text = IdText {
        current: None,
        offset: 0,
    };
    loop {
        // `carry` is a partial id (under 4 bytes) and `got` at most the space after it,
        // so both ranges lie inside `buf`; an empty slice here would end the input early.
        #[allow(
            clippy::expect_used,
            reason = "the ranges are inside buf by construction"
        )]
        let space = buf
            .get_mut(carry..)
            .expect("invariant: the carried partial id is shorter than the buffer");
        let got = fill(&mut input.reader, space, name)?;
        progress(got as u64);
        let total = carry + got;
        #[allow(
            clippy::expect_used,
            reason = "the ranges are inside buf by construction"
        )]
        let data = buf
            .get(..total)
            .expect("invariant: a read never returns more than the space it was given");
        ids.clear();
        let rest = match format {
            InputFormat::Bytes => {
                ids.extend(data.iter().map(|&b| u32::from(b)));
                0
            }
            InputFormat::Ids => {
                text.feed(data, ids, name)?;
                if got == 0 {
                    text.end(ids);
                }
                0
            }
            InputFormat::U16le => {
                let (whole, rest) = data.as_chunks::<2>();
                ids.extend(whole.iter().map(|c| u32::from(u16::from_le_bytes(*c))));
                rest.len()
            }
            InputFormat::U32le => {
                let (whole, rest) = data.as_chunks::<4>();
                ids.extend(whole.iter().map(|c| u32::from_le_bytes(*c)));
                rest.len()
            }
        };
        check_chunk(ids, vocab, name, position)?;
        sink.push(ids)?;
        position = position.saturating_add(ids.len() as u64);
        if got == 0 {
            if rest != 0 {
                let size = if format == InputFormat::U16le { 2 } else { 4 };
                return Err(TokensError::BadInput {
                    input: name.to_string(),
                    reason: format!(
                        "{rest} trailing byte(s): the input is not a whole number of {size}-byte ids"
                    ),
                });
            }
            return Ok(());
        }
        // Keep the partial id for the next read.
        buf.copy_within(total - rest..total, 0);
        carry = rest;
    }
}

/// Pack `inputs`, in order, into shards at `out` (one file, or `OUT_000000.bin`, ...
/// with `shard_tokens`). `progress` is called with the bytes read after each read.
/// On error (an input that yields no id is one), nothing is left under any output
/// name. An output that would replace an input file is refused before anything is
/// read.
pub fn pack(
    inputs: Vec<PackInput>,
    out: &Path,
    opts: &PackOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<PackSummary, TokensError> {
    let plan = match opts.shard_tokens {
        Some(shard_tokens) => ShardPlan::Numbered {
            out: out.to_path_buf(),
            shard_tokens,
        },
        None => ShardPlan::Single(out.to_path_buf()),
    };
    plan.refuse_inputs(inputs.iter().filter_map(|i| i.path.as_deref()))?;
    // Raw ids carry no document boundaries: a stream finds them with eot=ID.
    let mut sink = Sink::new(plan, opts.vocab, opts.layout, false)?;
    let mut buf = vec![0u8; READ_CHUNK];
    let mut ids = Vec::with_capacity(READ_CHUNK);
    for mut input in inputs {
        let result = pack_input(
            &mut input,
            &mut sink,
            opts.format,
            &mut buf,
            &mut ids,
            progress,
        );
        if let Err(e) = result {
            // The unfinished shard and the finished ones go with their temporary names.
            sink.abort();
            return Err(e);
        }
    }
    let tokens = sink.tokens();
    let shards = sink.finish()?;
    Ok(PackSummary { shards, tokens })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::Shard;

    #[test]
    fn url_inputs_are_refused_and_local_paths_kept() {
        for url in [
            "s3://b/in.jsonl",
            "https://h/x",
            "http://h",
            "gs://b/k",
            "hf+x.y-z://a",
        ] {
            let err = refuse_url_inputs([Path::new(url)]).unwrap_err();
            assert!(
                matches!(&err, TokensError::UrlInput { input } if input == url),
                "{err}"
            );
        }
        for local in [
            "in.jsonl",
            "-",
            "./s3:/b",
            "dir/a://b",
            "://x",
            "1s3://b",
            "s 3://b",
            "",
        ] {
            assert!(refuse_url_inputs([Path::new(local)]).is_ok(), "{local}");
        }
    }

    fn input(name: &str, bytes: &[u8]) -> PackInput {
        PackInput {
            path: None,
            name: name.to_string(),
            reader: Box::new(io::Cursor::new(bytes.to_vec())),
        }
    }

    /// A reader that hands out at most `step` bytes per read, to cut ids and numbers
    /// across read boundaries.
    struct Trickle(Vec<u8>, usize, usize);
    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.1.min(buf.len()).min(self.0.len() - self.2);
            buf[..n].copy_from_slice(&self.0[self.2..self.2 + n]);
            self.2 += n;
            Ok(n)
        }
    }

    fn opts(format: InputFormat, vocab: u32, shard_tokens: Option<u64>) -> PackOptions {
        PackOptions {
            format,
            vocab,
            shard_tokens,
            layout: Layout::default(),
        }
    }

    /// A library call to pack has the command's guard: an output (one file, or a
    /// numbered shard that exists) that is an input file is refused before anything is
    /// read or written, and the input is untouched.
    #[test]
    fn pack_refuses_to_write_over_its_input() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("in.bin");
        std::fs::write(&src, b"hello").unwrap();
        let link = dir.path().join("link.bin");
        std::fs::hard_link(&src, &link).unwrap();
        let numbered = output_name(&dir.path().join("out"), 0);
        std::fs::hard_link(&src, &numbered).unwrap();
        for (out, shard_tokens) in [
            (src.clone(), None),
            (link, None),
            (dir.path().join("out"), Some(2)),
        ] {
            let (input, _) = PackInput::open(&src).unwrap();
            let e = pack(
                vec![input],
                &out,
                &opts(InputFormat::Bytes, 256, shard_tokens),
                &mut |_| {},
            )
            .unwrap_err();
            assert!(matches!(e, TokensError::ReplacesInput { .. }), "{e}");
            assert_eq!(std::fs::read(&src).unwrap(), b"hello");
        }
    }

    fn all_ids(summary: &PackSummary) -> Vec<u32> {
        summary
            .shards
            .iter()
            .flat_map(|(p, _)| {
                let s = Shard::open(p, None).unwrap();
                s.ids(0..s.len()).unwrap()
            })
            .collect()
    }

    #[test]
    fn bytes_split_into_numbered_shards() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("train.bin");
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let s = pack(
            vec![input("-", &data)],
            &out,
            &opts(InputFormat::Bytes, 256, Some(300)),
            &mut |_| {},
        )
        .unwrap();
        let names: Vec<_> = s
            .shards
            .iter()
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "train_000000.bin",
                "train_000001.bin",
                "train_000002.bin",
                "train_000003.bin"
            ]
        );
        let counts: Vec<_> = s.shards.iter().map(|(_, h)| h.count).collect();
        assert_eq!(counts, [300, 300, 300, 100]);
        assert_eq!(s.tokens, 1000);
        assert_eq!(
            all_ids(&s),
            data.iter().map(|&b| u32::from(b)).collect::<Vec<_>>()
        );
        assert!(!out.exists());
    }

    #[test]
    fn exact_multiple_makes_no_empty_tail_and_empty_input_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("x");
        let s = pack(
            vec![input("a", &[1; 20])],
            &out,
            &opts(InputFormat::Bytes, 256, Some(10)),
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(s.shards.len(), 2);
        let out2 = dir.path().join("empty.bin");
        let err = pack(
            vec![input("a", &[])],
            &out2,
            &opts(InputFormat::Bytes, 256, None),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(matches!(err, TokensError::Empty), "{err}");
        assert!(!out2.exists());
    }

    #[test]
    fn every_format_across_read_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let want: Vec<u32> = vec![0, 7, 65535, 1234, 99, 70000];
        let cases: Vec<(InputFormat, Vec<u8>, u32, Vec<u32>)> = vec![
            (
                InputFormat::Ids,
                b"  0 7\n65535\t1234 99 70000\n".to_vec(),
                70001,
                want.clone(),
            ),
            (
                InputFormat::Ids,
                b"0 7 65535 1234 99 70000".to_vec(),
                70001,
                want.clone(),
            ),
            (
                InputFormat::U16le,
                want.iter()
                    .take(5)
                    .flat_map(|&i| (i as u16).to_le_bytes())
                    .collect(),
                65536,
                want[..5].to_vec(),
            ),
            (
                InputFormat::U32le,
                want.iter().flat_map(|&i| i.to_le_bytes()).collect(),
                70001,
                want.clone(),
            ),
        ];
        for (i, (format, bytes, vocab, expect)) in cases.into_iter().enumerate() {
            for step in [1, 3, 1 << 20] {
                let out = dir.path().join(format!("f{i}_{step}.bin"));
                let inp = PackInput {
                    name: "in".into(),
                    reader: Box::new(Trickle(bytes.clone(), step, 0)),
                    path: None,
                };
                let mut seen = 0;
                let s = pack(vec![inp], &out, &opts(format, vocab, None), &mut |n| {
                    seen += n
                })
                .unwrap();
                assert_eq!(all_ids(&s), expect, "{format:?} step {step}");
                assert_eq!(seen, bytes.len() as u64);
            }
        }
    }

    #[test]
    #[allow(
        clippy::too_many_lines,
        reason = "a table of bad inputs, one row per rule"
    )]
    fn bad_input_leaves_no_output() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o");
        let cases: Vec<(InputFormat, Vec<u8>, &str)> = vec![
            (
                InputFormat::Ids,
                b"1 2 300 4".to_vec(),
                "id 300 at position 2 is not below the vocabulary size 256",
            ),
            (
                InputFormat::Ids,
                b"1 2 x".to_vec(),
                "invalid character \"x\" at byte 4",
            ),
            (
                InputFormat::Ids,
                b"1 -2".to_vec(),
                "invalid character \"-\"",
            ),
            // A UTF-8 character is shown as itself, never as its lead byte ('Ã').
            (
                InputFormat::Ids,
                "1 café".as_bytes().to_vec(),
                "invalid character \"c\" at byte 2",
            ),
            (
                InputFormat::Ids,
                "1 é".as_bytes().to_vec(),
                "invalid character \"é\" at byte 2",
            ),
            (
                InputFormat::Ids,
                "1 \u{202e}".as_bytes().to_vec(),
                "invalid character \"\u{202e}\" at byte 2",
            ),
            (
                InputFormat::Ids,
                b"1 \xff".to_vec(),
                "invalid character byte 0xff at byte 2",
            ),
            (InputFormat::Ids, b"99999999999".to_vec(), "too large"),
            (InputFormat::U16le, vec![1, 0, 2], "1 trailing byte(s)"),
            (
                InputFormat::U32le,
                vec![1, 0, 0, 0, 0, 1, 0, 0],
                "id 256 at position 1",
            ),
        ];
        for (format, bytes, want) in cases {
            // Good shards first: they are committed, then removed when the bad input fails.
            let good = match format {
                InputFormat::Ids => input("good", "5 ".repeat(25).as_bytes()),
                InputFormat::U32le => input("good", &[5, 0, 0, 0].repeat(25)),
                _ => input("good", &[5, 0].repeat(25)),
            };
            let err = pack(
                vec![good, input("bad.txt", &bytes)],
                &out,
                &opts(format, 256, Some(10)),
                &mut |_| {},
            )
            .unwrap_err();
            let msg = err.to_string();
            assert!(msg.starts_with("bad.txt: ") && msg.contains(want), "{msg}");
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "{msg}");
        }
        let bytes_v = pack(
            vec![input("t", b"hello")],
            &out,
            &opts(InputFormat::Bytes, 100, None),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            bytes_v.to_string().contains("id 104 at position 0"),
            "{bytes_v}"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert!(pack(
            vec![],
            &out,
            &opts(InputFormat::Bytes, 256, Some(0)),
            &mut |_| {}
        )
        .is_err());
        assert!(pack(
            vec![],
            &out,
            &opts(InputFormat::Bytes, 0, None),
            &mut |_| {}
        )
        .is_err());
    }

    #[test]
    fn output_names() {
        assert_eq!(
            output_name(Path::new("d/train"), 0),
            Path::new("d/train_000000.bin")
        );
        assert_eq!(
            output_name(Path::new("train.bin"), 12),
            Path::new("train_000012.bin")
        );
        assert_eq!(
            output_name(Path::new("a.b"), 1),
            Path::new("a.b_000001.bin")
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
        #[test]
        fn pack_roundtrips_ids_text(
            ids in proptest::collection::vec(0u32..5000, 0..200),
            shard in proptest::option::of(1u64..50),
            step in 1usize..17,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("p");
            let text: String = ids.iter().map(|i| format!("{i}\n")).collect();
            let inp = PackInput { name: "-".into(), reader: Box::new(Trickle(text.into_bytes(), step, 0)), path: None };
            let s = pack(vec![inp], &out, &opts(InputFormat::Ids, 5000, shard), &mut |_| {});
            if ids.is_empty() {
                proptest::prop_assert!(matches!(s, Err(TokensError::Empty)));
                return Ok(());
            }
            let s = s.unwrap();
            proptest::prop_assert_eq!(all_ids(&s), ids.clone());
            if let Some(n) = shard {
                proptest::prop_assert_eq!(s.shards.len() as u64, (ids.len() as u64).div_ceil(n).max(1));
            }
        }
    }
}
