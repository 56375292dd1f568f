//! `tlio tokens`: `header` (show and validate shard headers), `pack` (build shards from
//! bytes, id text or raw arrays, or from text, JSONL or Parquet documents through a real
//! tokenizer, whole or one part of N), `merge` (the shards of a pack made in parts),
//! `windows` (print what the token stream yields, from a seed or a saved
//! cursor), `decode` (the text of a shard's ids). Each command is one core call plus
//! printing.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

mod pack;
mod parts;
mod windows;

use pack::pack;
use windows::windows;

use super::Outcome;
use crate::error::operational;
use crate::output::Printer;
use tlio_core::pcg::{Pcg32, DEFAULT_SEQ};
use tlio_core::text::escape;
use tlio_core::tokens::{
    self, CorpusFormat, Cursor, CursorSession, HeaderReport, InputFormat, Layout, PackInput,
    PackOptions, Ranks, Shard, ShardOrder, ShardPlan, StreamOptions, TextPackOptions,
    TextPackProgress, Tokenizer, TokensError, BYTES_VOCAB, DEFAULT_SHARD_TOKENS,
};
use tlio_core::{Failure, FailureKind};

/// The `tokens` subcommands.
#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Show and validate shard headers: magic, version, dtype, n, V, size (reads only the
    /// 1024-byte header unless --check-ids). Exit 1 if any file is invalid.
    #[command(after_help = HEADER_EXAMPLES)]
    Header(HeaderArgs),
    /// Build shards from standard input or files, in bounded memory.
    #[command(after_help = PACK_EXAMPLES)]
    Pack(PackArgs),
    /// Write the final shards of a pack made in parts (--part K/N), byte-identical to
    /// one pack of the same inputs; exit 1 naming the parts missing or incomplete.
    #[command(after_help = MERGE_EXAMPLES)]
    Merge(MergeArgs),
    /// Print the batches the token stream yields, one JSON line per batch.
    #[command(after_help = WINDOWS_EXAMPLES)]
    Windows(WindowsArgs),
    /// Print the text of a shard's ids (what a run trains on), through a tokenizer.
    #[command(after_help = DECODE_EXAMPLES)]
    Decode(DecodeArgs),
}

const HEADER_EXAMPLES: &str = "\
Examples:
  tlio tokens header corpus.bin
  tlio tokens header --check-ids train_*.bin
  tlio --json tokens header corpus.bin";

const PACK_EXAMPLES: &str = "\
Examples:
  tlio tokens pack corpus.txt -o corpus.bin
  tlio tokens pack ids.txt --from ids --vocab-size 50257 -o train.bin
  tlio tokens pack docs.jsonl.zst --tokenizer gpt2 --from jsonl --val-tokens 10000 -o fw
  tlio tokens pack t.parquet --from parquet --tokenizer tok.json --eot none --skip-bad -o ll.bin";

const MERGE_EXAMPLES: &str = "\
Examples:
  tlio tokens merge fw
  tlio tokens merge --verify fw
  tlio --json tokens merge corpus.bin";

const DECODE_EXAMPLES: &str = "\
Examples:
  tlio tokens decode fw_val_000000.bin --tokenizer gpt2 --count 200
  tlio --json tokens decode ll.bin --tokenizer tok.json --start 1000 --count 8";

const WINDOWS_EXAMPLES: &str = "\
Examples:
  tlio tokens windows corpus.bin --seq-len 8 --batch 2
  tlio tokens windows corpus.bin --seq-len 8 --batch 2 --batches 2 --seed 7 --save-cursor c.json
  tlio tokens windows corpus.bin --seq-len 8 --batch 2 --cursor c.json";

/// Arguments of `tokens header`.
#[derive(Debug, Args)]
pub struct HeaderArgs {
    /// The shard files (or s3://bucket/key objects, read by range requests).
    #[arg(required = true, value_name = "SHARD")]
    pub files: Vec<PathBuf>,
    /// Also check every id against the recorded vocabulary (reads the whole file).
    #[arg(long)]
    pub check_ids: bool,
    /// The vocabulary size V of shards that record none (llm.c's): every id is checked
    /// against it, and a shard recording another V is invalid.
    #[arg(long, value_name = "V")]
    pub vocab_size: Option<u64>,
}

/// Input formats of `tokens pack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FromFormat {
    /// Each byte is an id (vocabulary 256 unless --vocab-size).
    Bytes,
    /// Decimal ids separated by whitespace.
    Ids,
    /// Raw little-endian uint16 ids.
    U16le,
    /// Raw little-endian uint32 ids.
    U32le,
    /// With --tokenizer: each file is one document (`-`: standard input).
    Text,
    /// With --tokenizer: one JSON object per line, the document in --field.
    Jsonl,
    /// With --tokenizer: the string column --field of a Parquet file.
    Parquet,
}

/// The header of shards with V > 65,536.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShardFormat {
    /// llm.c's Llama-3 layout (magic 20240801, version 7), which llm.c's readers take.
    Llama3,
    /// Magic 20240520 version 2.
    V2,
}

/// Arguments of `tokens pack`.
#[derive(Debug, Args)]
pub struct PackArgs {
    /// Input files, read in order; `-` (the default) is standard input. Files ending in
    /// .gz or .zst are decompressed (text and JSONL).
    #[arg(value_name = "FILE")]
    pub inputs: Vec<PathBuf>,
    /// The output shard; the prefix of SHARD_000000.bin, ... with --shard-tokens, or of
    /// SHARD_val_000000.bin, SHARD_train_000001.bin, ... with --val-tokens; an
    /// s3://bucket/prefix uploads them, with SHARD.manifest.json created last.
    #[arg(short, long, value_name = "SHARD", alias = "out")]
    pub output: PathBuf,
    /// How to read the inputs [default: bytes, or text with --tokenizer].
    #[arg(long, value_enum)]
    pub from: Option<FromFormat>,
    /// The vocabulary size V (every id must be below it); required with --from ids,
    /// u16le or u32le.
    #[arg(long, value_name = "V")]
    pub vocab_size: Option<u64>,
    /// Split into shards of N ids: SHARD_000000.bin, SHARD_000001.bin, ... [default with
    /// --val-tokens: 100000000]
    #[arg(long, value_name = "N")]
    pub shard_tokens: Option<u64>,
    /// Tokenize documents: gpt2 (= r50k_base), p50k_base, cl100k_base, o200k_base (built
    /// in), or the path of a Hugging Face tokenizer.json.
    #[arg(long, value_name = "T")]
    pub tokenizer: Option<String>,
    /// The JSONL field or Parquet column holding each document.
    #[arg(long, value_name = "NAME", default_value = "text")]
    pub field: String,
    /// The token put before every document, or `none` [default: <|endoftext|> for the
    /// built-in encodings; required for a tokenizer.json].
    #[arg(long, value_name = "TOKEN")]
    pub eot: Option<String>,
    /// The first N tokens go to SHARD_val_000000.bin, the rest to SHARD_train_000001.bin, ...
    /// (llm.c's fineweb.py naming).
    #[arg(long, value_name = "N")]
    pub val_tokens: Option<u64>,
    /// Tokenizing threads [default: every core]; the shards are the same for any N.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Skip bad JSONL lines and null Parquet values, and report how many, instead of
    /// stopping at the first.
    #[arg(long)]
    pub skip_bad: bool,
    /// The header of shards whose vocabulary exceeds 65,536 (uint32 ids).
    #[arg(long, value_enum, default_value_t = ShardFormat::Llama3)]
    pub format: ShardFormat,
    /// Pack only part K of N (K from 0) into SHARD.parts/K-of-N (a directory, or a
    /// prefix beside an s3:// output), for `tokens merge`; `slurm` takes K and N from a
    /// Slurm array task's environment. A complete part is not packed again.
    #[arg(long, value_name = "K/N")]
    pub part: Option<String>,
}

/// Arguments of `tokens merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The output the parts were packed for (the -o of `tokens pack --part`: a path or
    /// s3://bucket/prefix).
    #[arg(value_name = "SHARD")]
    pub output: PathBuf,
    /// Also check every part's ids against the digest in its marker (reads them twice;
    /// always done for parts in object storage, as they are downloaded).
    #[arg(long)]
    pub verify: bool,
}

/// Arguments of `tokens decode`.
#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// The shard.
    #[arg(value_name = "SHARD")]
    pub shard: PathBuf,
    /// bytes (a shard `tokens pack` wrote without --tokenizer: one id per byte, V 256),
    /// gpt2, p50k_base, cl100k_base, o200k_base, or the path of a tokenizer.json.
    #[arg(long, value_name = "T")]
    pub tokenizer: String,
    /// The index of the first id.
    #[arg(long, value_name = "I", default_value_t = 0)]
    pub start: u64,
    /// How many ids [default: all from --start on].
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

/// Arguments of `tokens windows`.
#[derive(Debug, Args)]
pub struct WindowsArgs {
    /// The shards, in stream order: files, s3://bucket/key objects, an s3:// pattern
    /// with `*` in its last segment, or a pack's OUT.manifest.json.
    #[arg(required = true, value_name = "SHARD")]
    pub shards: Vec<PathBuf>,
    /// T: inputs per window.
    #[arg(long, value_name = "T")]
    pub seq_len: usize,
    /// B: windows per batch.
    #[arg(long, value_name = "B")]
    pub batch: usize,
    /// The generator seed S: PCG32 seed(S, 54) [default: 0]. Not with --cursor, which
    /// holds the generator's state.
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// How many batches to print.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub batches: u64,
    /// Start from this saved cursor instead of the seed's position.
    #[arg(long, value_name = "FILE")]
    pub cursor: Option<PathBuf>,
    /// Write the final cursor to FILE (atomically).
    #[arg(long, value_name = "FILE")]
    pub save_cursor: Option<PathBuf>,
    /// This process's rank R: print windows R*B .. (R+1)*B of each global batch of B*W
    /// windows (the cursor is the global one, the same on every rank).
    #[arg(long, value_name = "R", default_value_t = 0)]
    pub rank: usize,
    /// The number of ranks W reading the stream together (data-parallel training).
    #[arg(long, value_name = "W", default_value_t = 1,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub world_size: usize,
    /// The vocabulary size V: every shard must record V or, recording none (llm.c's),
    /// have every id below V.
    #[arg(long, value_name = "V")]
    pub vocab_size: Option<u64>,
    /// Visit the shards in a new order each epoch, drawn from the generator at the
    /// epoch's start (passes within a shard are unchanged).
    #[arg(long)]
    pub shuffle: bool,
}

/// `--vocab-size V` checked: 1 to 2^31 - 1.
fn vocab_arg(v: u64) -> anyhow::Result<u32> {
    u32::try_from(v)
        .ok()
        .filter(|&v| v >= 1 && u64::from(v) <= tokens::MAX_COUNT)
        .ok_or_else(|| {
            operational(format!(
                "--vocab-size must be 1 to {}, got {v}",
                tokens::MAX_COUNT
            ))
        })
}

fn layout(format: ShardFormat) -> Layout {
    match format {
        ShardFormat::Llama3 => Layout::Llama3,
        ShardFormat::V2 => Layout::V2,
    }
}

/// Run `tlio tokens`.
pub fn run(cmd: TokensCommand, printer: &Printer) -> anyhow::Result<Outcome> {
    match cmd {
        TokensCommand::Header(args) => header(args, printer),
        // A part of a pack is its own job (parts.rs, which reads the pack's flags with
        // pack.rs's helpers): dispatched here so pack.rs never reaches up into parts.rs.
        TokensCommand::Pack(args) => {
            // Before any input is opened: a URL is not a missing file.
            tokens::refuse_url_inputs(args.inputs.iter().map(PathBuf::as_path))?;
            match args.part.clone() {
                Some(part) => parts::pack_part(&args, &part, printer),
                None => pack(args, printer),
            }
        }
        TokensCommand::Merge(args) => parts::merge(args, printer),
        TokensCommand::Windows(args) => windows(args, printer),
        TokensCommand::Decode(args) => decode(args, printer),
    }
}

/// One row of `tokens header`.
#[derive(Debug, Serialize)]
struct HeaderRow {
    file: String,
    magic: Option<i32>,
    version: Option<i32>,
    dtype: Option<&'static str>,
    n: Option<i32>,
    vocab_size: Option<i32>,
    size: u64,
    valid: bool,
    error: Option<String>,
}

/// The report row of one file and, when it does not validate, why. `Err` when the file
/// cannot be read at all.
fn header_row(
    path: &Path,
    check_ids: bool,
    vocab: Option<u32>,
) -> Result<(HeaderRow, Option<TokensError>), TokensError> {
    let file = path.display().to_string();
    let report = tokens::inspect_header(path)?;
    Ok(row_of(
        file,
        report,
        &mut |v| {
            if check_ids || vocab.is_some() {
                Shard::open(path, v).map(|_| ())
            } else {
                Ok(())
            }
        },
        vocab,
    ))
}

/// The row of a shard object in storage, from a range request of its header; with
/// `--check-ids` or `--vocab-size`, every id is checked in the shard fetched through
/// the verified local cache (as `tokens windows` fetches it), its errors naming the URL.
fn remote_header_row(
    url: &tlio_core::s3::S3Url,
    check_ids: bool,
    vocab: Option<u32>,
) -> anyhow::Result<(HeaderRow, Option<TokensError>)> {
    let report = tlio_core::remote::shard_header(url)
        .with_context(|| format!("cannot read the header of {url}"))?;
    let mut ids = Ok(());
    if (check_ids || vocab.is_some()) && report.header.is_ok() {
        let source = [tlio_core::remote::url_path(url)];
        ids = match tlio_core::remote::shards::open_shards(&source, vocab) {
            Ok(_) => Ok(()),
            Err(tlio_core::remote::RemoteError::Tokens(e)) => Err(e),
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("cannot check the ids of {url}")))
            }
        };
    }
    let mut ids = Some(ids);
    Ok(row_of(
        url.to_string(),
        report,
        &mut |_| ids.take().unwrap_or(Ok(())),
        vocab,
    ))
}

/// A row from a header report; `check` is the further verdict of a valid header.
fn row_of(
    file: String,
    report: HeaderReport,
    check: &mut dyn FnMut(Option<u32>) -> Result<(), TokensError>,
    vocab: Option<u32>,
) -> (HeaderRow, Option<TokensError>) {
    let HeaderReport {
        size,
        words,
        header,
    } = report;
    let dtype = header.as_ref().ok().map(|h| h.dtype.name());
    let verdict = match header {
        Ok(_) => check(vocab),
        Err(e) => Err(e),
    };
    // Show only the header words that passed validation: after a bad magic nothing in
    // the header means anything, after a bad version only the magic does.
    let trusted = match &verdict {
        Err(TokensError::BadMagic { .. }) => 0,
        Err(TokensError::BadVersion { .. }) => 1,
        Err(TokensError::NegativeCount { .. }) => 2,
        Err(TokensError::NegativeVocab { .. }) => 3,
        _ => 4,
    };
    let word = |i: usize| {
        words
            .and_then(|w| w.get(i).copied())
            .filter(|_| i < trusted)
    };
    let row = HeaderRow {
        file,
        magic: word(0),
        version: word(1),
        dtype,
        n: word(2),
        vocab_size: word(3),
        size,
        valid: verdict.is_ok(),
        error: verdict.as_ref().err().map(ToString::to_string),
    };
    (row, verdict.err())
}

fn header(args: HeaderArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let vocab = args.vocab_size.map(vocab_arg).transpose()?;
    let mut rows = Vec::new();
    let mut any_invalid = false;
    for path in &args.files {
        // A file that cannot be read is an error (exit 2); an invalid file is a "no"
        // answer in the report. The files read before the error are still reported
        // (cli.md: a report line for every file read), then the error.
        let row = match crate::cmd::s3_url(path)? {
            Some(url) => match remote_header_row(&url, args.check_ids, vocab) {
                Ok(row) => Ok(row),
                Err(e) => {
                    print_header_rows(&rows, printer)?;
                    return Err(e);
                }
            },
            None => header_row(path, args.check_ids, vocab),
        };
        let failed = match row {
            // The row of an unreadable file is not a verdict: it is left out.
            Ok((_, Some(e))) if e.kind() == FailureKind::Operational => Some(e),
            Ok((row, err)) => {
                any_invalid |= err.is_some();
                rows.push(row);
                None
            }
            Err(e) => Some(e),
        };
        if let Some(e) = failed {
            print_header_rows(&rows, printer)?;
            return Err(e.into());
        }
    }
    print_header_rows(&rows, printer)?;
    Ok(Outcome::from_ok(!any_invalid))
}

fn print_header_rows(rows: &[HeaderRow], printer: &Printer) -> anyhow::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    if printer.json {
        for row in rows {
            printer.json_line(row)?;
        }
    } else {
        let mut table = printer.table();
        table.set_header([
            "file", "magic", "version", "dtype", "n", "V", "size", "valid",
        ]);
        let show = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
        for row in rows {
            let valid = match &row.error {
                None => printer.cell("yes", crate::output::Tone::Good),
                // The row already names the file.
                Some(e) => {
                    let why = e
                        .strip_prefix(row.file.as_str())
                        .and_then(|r| r.strip_prefix(": "))
                        .unwrap_or(e);
                    printer.cell(format!("no: {}", escape(why)), crate::output::Tone::Bad)
                }
            };
            table.add_row(vec![
                comfy_table::Cell::new(escape(&row.file)),
                comfy_table::Cell::new(show(row.magic.map(i64::from))),
                comfy_table::Cell::new(show(row.version.map(i64::from))),
                comfy_table::Cell::new(row.dtype.unwrap_or("-")),
                comfy_table::Cell::new(show(row.n.map(i64::from))),
                comfy_table::Cell::new(show(row.vocab_size.map(i64::from))),
                comfy_table::Cell::new(crate::output::human_bytes(row.size)),
                valid,
            ]);
        }
        let mut out = printer.out();
        writeln!(out, "{}", crate::output::table_text(&table))?;
        out.flush()?;
    }
    Ok(())
}

/// What `tokens decode --json` prints.
#[derive(Serialize)]
struct Decoded<'a> {
    file: String,
    tokenizer: &'a str,
    start: u64,
    ids: Vec<u32>,
    text: String,
}

/// The name `tokens decode --tokenizer` takes for a byte-level shard.
const BYTES_TOKENIZER: &str = "bytes";

/// The tokenizer of `tokens decode`: the byte level of plain `tokens pack`, or a loaded
/// BPE encoding.
enum Decoder {
    Bytes,
    Bpe(Tokenizer),
}

impl Decoder {
    fn load(name: &str) -> anyhow::Result<Self> {
        if name == BYTES_TOKENIZER {
            return Ok(Decoder::Bytes);
        }
        Ok(Decoder::Bpe(
            Tokenizer::load(name).map_err(TokensError::from)?,
        ))
    }

    fn vocab_size(&self) -> u32 {
        match self {
            Decoder::Bytes => BYTES_VOCAB,
            Decoder::Bpe(t) => t.vocab_size(),
        }
    }

    fn name(&self) -> &str {
        match self {
            Decoder::Bytes => BYTES_TOKENIZER,
            Decoder::Bpe(t) => t.name(),
        }
    }

    /// The decoded bytes: a byte-level window may cut a UTF-8 character, so the bytes
    /// are kept as they are (and made lossy text only for JSON).
    fn decode(&self, ids: &[u32]) -> anyhow::Result<Vec<u8>> {
        match self {
            // Shard::open checked every id against V 256, so each one is a byte.
            Decoder::Bytes => Ok(ids
                .iter()
                .map(|&id| u8::try_from(id).unwrap_or(u8::MAX))
                .collect()),
            Decoder::Bpe(t) => Ok(t.decode(ids).map_err(TokensError::from)?.into_bytes()),
        }
    }
}

/// Open the shard for `decoder`, saying what to do when its vocabulary is another one.
fn open_for(path: &Path, decoder: &Decoder) -> anyhow::Result<Shard> {
    Shard::open(path, Some(decoder.vocab_size())).map_err(|e| match e {
        TokensError::VocabMismatch { recorded, .. } => {
            let hint = if recorded == BYTES_VOCAB {
                " (V 256: a byte-level shard, use --tokenizer bytes)".to_string()
            } else {
                String::new()
            };
            anyhow::Error::from(e).context(format!(
                "--tokenizer {} does not match the shard's vocabulary: pass the tokenizer \
                 the shard was packed with{hint}",
                decoder.name()
            ))
        }
        other => anyhow::Error::from(other),
    })
}

fn decode(args: DecodeArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let tokenizer = Decoder::load(&args.tokenizer)?;
    let shard = open_for(&args.shard, &tokenizer)?;
    let len = shard.len() as u64;
    if args.start > len {
        return Err(operational(format!(
            "--start {} is past the end of {} ({len} ids)",
            args.start,
            args.shard.display()
        )));
    }
    let end = args
        .count
        .map_or(len, |n| args.start.saturating_add(n).min(len));
    let range = usize::try_from(args.start).unwrap_or(usize::MAX)
        ..usize::try_from(end).unwrap_or(usize::MAX);
    let ids = shard.ids(range)?;
    let text = tokenizer.decode(&ids)?;
    if printer.json {
        printer.json_line(&Decoded {
            file: args.shard.display().to_string(),
            tokenizer: tokenizer.name(),
            start: args.start,
            ids,
            text: String::from_utf8_lossy(&text).into_owned(),
        })?;
    } else {
        // The text itself is the result, exactly as decoded (like cat).
        let mut out = printer.out();
        out.write_all(&text)?;
        if !text.ends_with(b"\n") {
            out.write_all(b"\n")?;
        }
        out.flush()?;
    }
    Ok(Outcome::Success)
}
