//! `tlio tokens`: `header` (show and validate shard headers), `pack` (build shards from
//! bytes, id text or raw arrays, or from text, JSONL or Parquet documents through a real
//! tokenizer, whole or one part of N), `merge` (the shards of a pack made in parts),
//! `windows` (print what the token stream yields, from a seed or a saved
//! cursor, of one list of shards or a mixture of sources), `decode` (the text of a
//! shard's ids). Each command is one core call plus printing.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

mod decode;
mod header;
pub(crate) mod mix;
mod pack;
mod parts;
mod windows;

use decode::decode;
use header::header;
use pack::pack;
use windows::windows;

use super::Outcome;
use crate::error::operational;
use crate::output::Printer;
use tlio_core::pcg::{Pcg32, DEFAULT_SEQ};
use tlio_core::text::escape;
use tlio_core::tokens::{
    self, CorpusFormat, CursorSession, HeaderReport, InputFormat, Layout, PackInput, PackOptions,
    Ranks, Shard, ShardOrder, ShardPlan, StreamOptions, TextPackOptions, TextPackProgress,
    Tokenizer, TokensError, BYTES_VOCAB, DEFAULT_SHARD_TOKENS,
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
    /// Print the batches the token stream yields, one JSON line per batch (or, with
    /// --mix --report, where a mixture's windows come from).
    #[command(
        after_help = WINDOWS_EXAMPLES,
        override_usage = "tlio tokens windows [OPTIONS] (--mix <SRC:W>)... | <SHARD>..."
    )]
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
  tlio tokens windows corpus.bin --seq-len 8 --batch 2 --batches 2 --seed 7 --save-cursor c.json
  tlio tokens windows corpus.bin --seq-len 8 --batch 2 --cursor c.json
  tlio tokens windows --mix 'web/*.bin:0.6' --mix 'code/*.bin:0.4' --seq-len 8 --batch 4
  tlio tokens windows --mix web.bin:0.7 --mix code.bin:0.3 --seq-len 64 --batch 8 --report";

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
    /// with `*` in its last segment, or a pack's OUT.manifest.json (or a mixture's
    /// sources with --mix).
    #[arg(
        value_name = "SHARD",
        required_unless_present = "mix",
        conflicts_with = "mix"
    )]
    pub shards: Vec<PathBuf>,
    /// A mixture of sources instead of SHARDs: each line then holds every row's source.
    #[command(flatten)]
    pub mix: mix::MixArgs,
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
    /// epoch's start (passes within a shard are unchanged); of a mixture, each source's.
    #[arg(long)]
    pub shuffle: bool,
    /// With --mix: instead of the windows, report over the --batches global batches
    /// each source's windows and share beside the share its weights ask for, the worst
    /// gap within one global batch, and the passes and epochs it went through (reads
    /// no token; the saved cursor is the one after those batches).
    #[arg(long)]
    pub report: bool,
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
