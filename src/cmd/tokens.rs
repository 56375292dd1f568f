//! `tlio tokens`: `header` (show and validate shard headers), `pack` (build shards from
//! bytes, id text or raw arrays, or from text, JSONL or Parquet documents through a real
//! tokenizer), `windows` (print what the token stream yields, from a seed or a saved
//! cursor), `decode` (the text of a shard's ids). Each command is one core call plus
//! printing.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use super::Outcome;
use crate::error::{invalid, operational};
use crate::output::Printer;
use tlio_core::atomic;
use tlio_core::pcg::{Pcg32, DEFAULT_SEQ};
use tlio_core::text::escape;
use tlio_core::tokens::{
    self, CorpusFormat, Cursor, HeaderReport, InputFormat, Layout, PackInput, PackOptions, Shard,
    ShardPlan, TextPackOptions, TextPackProgress, TokenStream, Tokenizer, TokensError, BYTES_VOCAB,
    DEFAULT_SHARD_TOKENS,
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
  tlio tokens pack docs.jsonl.zst --tokenizer gpt2 --from jsonl --val-tokens 100000000 -o fw
  tlio tokens pack t.parquet --from parquet --tokenizer tokenizer.json --eot none -o ll";

const DECODE_EXAMPLES: &str = "\
Examples:
  tlio tokens decode fw_val_000000.bin --tokenizer gpt2 --count 200
  tlio --json tokens decode ll.bin --tokenizer tokenizer.json --start 1000 --count 8";

const WINDOWS_EXAMPLES: &str = "\
Examples:
  tlio tokens windows corpus.bin --seq-len 8 --batch 2
  tlio tokens windows corpus.bin --seq-len 8 --batch 2 --batches 2 --seed 7 --save-cursor c.json
  tlio tokens windows corpus.bin --seq-len 8 --batch 2 --cursor c.json";

/// Arguments of `tokens header`.
#[derive(Debug, Args)]
pub struct HeaderArgs {
    /// The shard files.
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
    /// SHARD_val_000000.bin, SHARD_train_000001.bin, ... with --val-tokens.
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
}

/// Arguments of `tokens decode`.
#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// The shard.
    #[arg(value_name = "SHARD")]
    pub shard: PathBuf,
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
    /// The shards, in stream order.
    #[arg(required = true, value_name = "SHARD")]
    pub shards: Vec<PathBuf>,
    /// T: inputs per window.
    #[arg(long, value_name = "T")]
    pub seq_len: usize,
    /// B: windows per batch.
    #[arg(long, value_name = "B")]
    pub batch: usize,
    /// The generator seed S: PCG32 seed(S, 54).
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// How many batches to print.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub batches: u64,
    /// Start from this saved cursor instead of the seed's position.
    #[arg(long, value_name = "FILE")]
    pub cursor: Option<PathBuf>,
    /// Write the final cursor to FILE (atomically).
    #[arg(long, value_name = "FILE")]
    pub save_cursor: Option<PathBuf>,
    /// The vocabulary size V: every shard must record V or, recording none (llm.c's),
    /// have every id below V.
    #[arg(long, value_name = "V")]
    pub vocab_size: Option<u64>,
}

/// Run `tlio tokens`.
pub fn run(cmd: TokensCommand, printer: &Printer) -> anyhow::Result<Outcome> {
    match cmd {
        TokensCommand::Header(args) => header(args, printer),
        TokensCommand::Pack(args) => pack(args, printer),
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
    let HeaderReport {
        size,
        words,
        header,
    } = report;
    let dtype = header.as_ref().ok().map(|h| h.dtype.name());
    let verdict = match header {
        Ok(_) if check_ids || vocab.is_some() => Shard::open(path, vocab).map(|_| ()),
        Ok(_) => Ok(()),
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
    Ok((row, verdict.err()))
}

fn header(args: HeaderArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let vocab = args.vocab_size.map(vocab_arg).transpose()?;
    let mut rows = Vec::new();
    let mut any_invalid = false;
    for path in &args.files {
        // A file that cannot be read is an error (exit 2); an invalid file is a "no"
        // answer in the report. The files read before the error are still reported
        // (cli.md: a report line for every file read), then the error.
        let failed = match header_row(path, args.check_ids, vocab) {
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

#[derive(Serialize)]
struct PackedShard {
    file: String,
    n: u64,
    magic: i32,
    version: i32,
    vocab_size: Option<u32>,
}

#[derive(Serialize)]
struct PackReport {
    shards: Vec<PackedShard>,
    tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    documents: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    skipped: Option<u64>,
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

fn pack(args: PackArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    if let Some(spec) = args.tokenizer.clone() {
        return pack_text(args, &spec, printer);
    }
    let (format, vocab) = id_format(&args)?;
    let plan = match args.shard_tokens {
        Some(shard_tokens) => ShardPlan::Numbered {
            out: args.output.clone(),
            shard_tokens,
        },
        None => ShardPlan::Single(args.output.clone()),
    };
    let (inputs, total) = open_id_inputs(&input_paths(&args), &plan)?;
    let bar = match total {
        Some(t) => printer.bytes_bar(t, "packing"),
        None => printer.bar(0, "packing", "{msg} {bytes} {bytes_per_sec}"),
    };
    let opts = PackOptions {
        format,
        vocab,
        shard_tokens: args.shard_tokens,
        layout: layout(args.format),
    };
    let summary = tokens::pack(inputs, &args.output, &opts, &mut |n| bar.inc(n));
    bar.finish_and_clear();
    let summary = summary?;
    let report = PackReport {
        shards: packed_shards(&summary.shards),
        tokens: summary.tokens,
        documents: None,
        skipped: None,
    };
    report_pack(&report, printer)
}

/// The inputs named on the command line; none means standard input.
fn input_paths(args: &PackArgs) -> Vec<PathBuf> {
    if args.inputs.is_empty() {
        vec![PathBuf::from("-")]
    } else {
        args.inputs.clone()
    }
}

/// The id format and vocabulary of a pack without a tokenizer, refusing the flags and
/// formats that need one.
fn id_format(args: &PackArgs) -> anyhow::Result<(InputFormat, u32)> {
    let tokenizer_only = [
        ("--val-tokens", args.val_tokens.is_some()),
        ("--eot", args.eot.is_some()),
        ("--threads", args.threads.is_some()),
        ("--skip-bad", args.skip_bad),
        ("--field", args.field != "text"),
    ];
    if let Some((flag, _)) = tokenizer_only.iter().find(|(_, given)| *given) {
        return Err(operational(format!("{flag} needs --tokenizer")));
    }
    let format = match args.from.unwrap_or(FromFormat::Bytes) {
        FromFormat::Bytes => InputFormat::Bytes,
        FromFormat::Ids => InputFormat::Ids,
        FromFormat::U16le => InputFormat::U16le,
        FromFormat::U32le => InputFormat::U32le,
        FromFormat::Text | FromFormat::Jsonl | FromFormat::Parquet => {
            return Err(operational(
                "--from text, jsonl and parquet need --tokenizer (gpt2, cl100k_base, ... or a tokenizer.json)",
            ))
        }
    };
    let vocab = match (args.vocab_size, format) {
        (Some(v), _) => vocab_arg(v)?,
        (None, InputFormat::Bytes) => BYTES_VOCAB,
        (None, _) => {
            return Err(operational(
                "--vocab-size is required with --from ids, u16le or u32le",
            ))
        }
    };
    Ok((format, vocab))
}

/// Open every input before writing anything, so a missing file fails first, and
/// refuse one that an output would replace. Returns the readers and their total size
/// (None when standard input is among them).
fn open_id_inputs(
    paths: &[PathBuf],
    plan: &ShardPlan,
) -> anyhow::Result<(Vec<PackInput>, Option<u64>)> {
    let mut inputs = Vec::new();
    let mut total = Some(0u64);
    for path in paths {
        if path.as_os_str() == "-" {
            total = None;
            inputs.push(PackInput {
                name: "-".to_string(),
                reader: Box::new(io::stdin()),
            });
            continue;
        }
        let file = tlio_core::files::open_regular(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let size = file
            .metadata()
            .with_context(|| format!("cannot read {}", path.display()))?
            .len();
        total = total.map(|t| t.saturating_add(size));
        refuse_clobber(path, plan)?;
        inputs.push(PackInput {
            name: path.display().to_string(),
            reader: Box::new(file),
        });
    }
    Ok((inputs, total))
}

/// An error when writing the shards of `plan` would replace the input `path`.
fn refuse_clobber(path: &Path, plan: &ShardPlan) -> anyhow::Result<()> {
    if clobbers_output(path, plan) {
        return Err(operational(format!(
            "refusing to write over the input {}",
            path.display()
        )));
    }
    Ok(())
}

fn packed_shards(shards: &[(PathBuf, tokens::ShardHeader)]) -> Vec<PackedShard> {
    shards
        .iter()
        .map(|(path, h)| PackedShard {
            file: path.display().to_string(),
            n: h.count,
            magic: h.magic,
            version: h.version,
            vocab_size: h.vocab,
        })
        .collect()
}

/// Like every command that writes files, pack says what it wrote as chatter on stderr
/// (silenced by -q), or as one JSON document on stdout with --json.
fn report_pack(report: &PackReport, printer: &Printer) -> anyhow::Result<Outcome> {
    if printer.json {
        printer.json_line(report)?;
    } else {
        for s in &report.shards {
            printer.info(format!(
                "wrote {}: {} ids, version {}, V {}",
                escape(&s.file),
                s.n,
                s.version,
                s.vocab_size
                    .map_or("not recorded".to_string(), |v| v.to_string())
            ));
        }
        if let (Some(docs), Some(skipped)) = (report.documents, report.skipped) {
            printer.info(format!(
                "{docs} documents, {} tokens{}",
                report.tokens,
                if skipped > 0 {
                    format!(", {skipped} bad lines or rows skipped")
                } else {
                    String::new()
                }
            ));
        }
    }
    Ok(Outcome::Success)
}

fn pack_text(args: PackArgs, spec: &str, printer: &Printer) -> anyhow::Result<Outcome> {
    let format = corpus_format(&args)?;
    let tokenizer = Tokenizer::load(spec).map_err(TokensError::from)?;
    let eot = match args.eot.as_deref() {
        Some("none") => None,
        Some(token) => Some(tokenizer.token_id(token).map_err(TokensError::from)?),
        None => Some(tokenizer.default_eot().map_err(TokensError::from)?),
    };
    let plan = match (args.val_tokens, args.shard_tokens) {
        (Some(val_tokens), shard_tokens) => ShardPlan::ValTrain {
            prefix: args.output.clone(),
            val_tokens,
            shard_tokens: shard_tokens.unwrap_or(DEFAULT_SHARD_TOKENS),
        },
        (None, Some(shard_tokens)) => ShardPlan::Numbered {
            out: args.output.clone(),
            shard_tokens,
        },
        (None, None) => ShardPlan::Single(args.output.clone()),
    };
    let paths = input_paths(&args);
    check_text_inputs(&paths, format, &plan)?;
    let threads = match args.threads {
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let opts = TextPackOptions {
        format,
        field: args.field.clone(),
        eot,
        plan,
        threads,
        skip_bad: args.skip_bad,
        layout: layout(args.format),
    };
    let bar = printer.bar(0, "", "{spinner} {elapsed} {msg}");
    let started = std::time::Instant::now();
    let summary = tokens::pack_text(&paths, &tokenizer, &opts, &mut |p: &TextPackProgress| {
        let secs = started.elapsed().as_secs_f64().max(1e-3);
        bar.set_message(format!(
            "{} documents, {} tokens, {:.1} MB/s",
            p.documents,
            p.tokens,
            p.bytes as f64 / 1e6 / secs
        ));
        bar.tick();
    });
    bar.finish_and_clear();
    let summary = summary?;
    let report = PackReport {
        shards: packed_shards(&summary.shards),
        tokens: summary.tokens,
        documents: Some(summary.documents),
        skipped: Some(summary.skipped),
    };
    report_pack(&report, printer)
}

/// The text format of a pack with a tokenizer, refusing id formats and `--vocab-size`
/// (the tokenizer's vocabulary is the one recorded).
fn corpus_format(args: &PackArgs) -> anyhow::Result<CorpusFormat> {
    let format = match args.from.unwrap_or(FromFormat::Text) {
        FromFormat::Text => CorpusFormat::Text,
        FromFormat::Jsonl => CorpusFormat::Jsonl,
        FromFormat::Parquet => CorpusFormat::Parquet,
        other => {
            return Err(operational(format!(
                "--from {} reads ids, not text: it does not take --tokenizer (use text, jsonl or parquet)",
                other.to_possible_value().map_or("?".into(), |v| v.get_name().to_string())
            )))
        }
    };
    if args.vocab_size.is_some() {
        return Err(operational(
            "--vocab-size does not go with --tokenizer: the tokenizer's vocabulary is recorded",
        ));
    }
    Ok(format)
}

/// Every input must exist before anything is written, none may be an output, and
/// standard input can be read once (and not as Parquet, which needs a file).
fn check_text_inputs(
    paths: &[PathBuf],
    format: CorpusFormat,
    plan: &ShardPlan,
) -> anyhow::Result<()> {
    let stdin_count = paths.iter().filter(|p| p.as_os_str() == "-").count();
    if stdin_count > 1 || (stdin_count == 1 && format == CorpusFormat::Parquet) {
        return Err(operational(
            "standard input (-) can be read once, and not as Parquet (which needs a file)",
        ));
    }
    for path in paths.iter().filter(|p| p.as_os_str() != "-") {
        std::fs::metadata(path).with_context(|| format!("cannot open {}", path.display()))?;
        refuse_clobber(path, plan)?;
    }
    Ok(())
}

/// True when writing the shards of `plan` would replace the input `input`.
fn clobbers_output(input: &Path, plan: &ShardPlan) -> bool {
    if let ShardPlan::Single(out) = plan {
        return atomic::same_file(input, out);
    }
    (0..)
        .map(|i| plan.shard(i).0)
        .take_while(|p| p.exists())
        .any(|p| atomic::same_file(input, &p))
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

fn decode(args: DecodeArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let tokenizer = Tokenizer::load(&args.tokenizer).map_err(TokensError::from)?;
    let shard = Shard::open(&args.shard, Some(tokenizer.vocab_size()))?;
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
    let ids = shard
        .ids(range)
        .ok_or_else(|| operational("the id range is out of the shard"))?;
    let text = tokenizer.decode(&ids).map_err(TokensError::from)?;
    if printer.json {
        printer.json_line(&Decoded {
            file: args.shard.display().to_string(),
            tokenizer: tokenizer.name(),
            start: args.start,
            ids,
            text,
        })?;
    } else {
        // The text itself is the result, exactly as decoded (like cat).
        let mut out = printer.out();
        out.write_all(text.as_bytes())?;
        if !text.ends_with('\n') {
            out.write_all(b"\n")?;
        }
        out.flush()?;
    }
    Ok(Outcome::Success)
}

/// One line of `tokens windows`.
#[derive(Serialize)]
struct WindowLine<'a> {
    inputs: Vec<&'a [i64]>,
    targets: Vec<&'a [i64]>,
    cursor: Cursor,
}

fn windows(args: WindowsArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let vocab = args.vocab_size.map(vocab_arg).transpose()?;
    let shards = args
        .shards
        .iter()
        .map(|p| Shard::open(p, vocab))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(path) = &args.save_cursor {
        // Checked before any batch is printed: the cursor must never replace a shard
        // (the cursor file read with --cursor may be rewritten: it was read whole).
        let inputs: Vec<&Path> = args.shards.iter().map(PathBuf::as_path).collect();
        atomic::refuse_inputs(path, &inputs)?;
        atomic::check_target(path)?;
    }
    let rng = Pcg32::seed(args.seed, DEFAULT_SEQ);
    let mut stream = TokenStream::new(shards, args.seq_len, args.batch, rng, vocab)?;
    if let Some(path) = &args.cursor {
        let bytes = tlio_core::files::read_limited(path, tokens::MAX_CURSOR_BYTES)
            .with_context(|| format!("cannot read cursor {}", path.display()))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| invalid(format!("cursor {}: not UTF-8", path.display())))?;
        let cursor = Cursor::from_json(&text).with_context(|| path.display().to_string())?;
        stream
            .restore(&cursor)
            .with_context(|| path.display().to_string())?;
    }
    // Create the cursor's file before any batch, so an unwritable destination fails
    // before the work rather than after every batch is printed.
    let mut cursor_file = match &args.save_cursor {
        Some(path) => Some(
            atomic::AtomicFile::create(path)
                .with_context(|| format!("cannot save cursor {}", path.display()))?,
        ),
        None => None,
    };
    let mut out = BufWriter::new(printer.out());
    let mut line_buf = Vec::new();
    // Once the reader of stdout is gone, batches are no longer printed; the stream
    // still advances when a cursor must be saved, so the file always holds the
    // position after every requested batch, whoever reads stdout.
    let mut stdout_open = true;
    for _ in 0..args.batches {
        let batch = stream.next_batch();
        if !stdout_open {
            continue;
        }
        let line = WindowLine {
            inputs: (0..batch.batch)
                .filter_map(|b| batch.input_row(b))
                .collect(),
            targets: (0..batch.batch)
                .filter_map(|b| batch.target_row(b))
                .collect(),
            cursor: stream.cursor(),
        };
        // Serialize into memory first, so that a closed stdout surfaces as the plain
        // BrokenPipe error main treats as a quiet exit.
        line_buf.clear();
        serde_json::to_writer(&mut line_buf, &line).map_err(io::Error::other)?;
        line_buf.push(b'\n');
        match out.write_all(&line_buf) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe && cursor_file.is_some() => {
                stdout_open = false;
            }
            other => other?,
        }
    }
    match out.flush() {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe && cursor_file.is_some() => {}
        other => other?,
    }
    if let (Some(path), Some(mut file)) = (&args.save_cursor, cursor_file.take()) {
        let text = format!("{}\n", stream.cursor().to_json());
        let context = || format!("cannot save cursor {}", path.display());
        file.write_all(text.as_bytes()).with_context(context)?;
        file.commit().with_context(context)?;
    }
    Ok(Outcome::Success)
}
