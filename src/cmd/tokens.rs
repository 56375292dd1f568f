//! `tlio tokens`: `header` (show and validate shard headers), `pack` (build shards from
//! bytes, id text or raw arrays), `windows` (print what the token stream yields, from a
//! seed or a saved cursor). Each command is one core call plus printing.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use super::Outcome;
use crate::core::atomic;
use crate::core::pcg::{Pcg32, DEFAULT_SEQ};
use crate::core::text::escape;
use crate::core::tokens::{
    self, Cursor, HeaderReport, InputFormat, PackInput, PackOptions, Shard, TokenStream,
    TokensError, BYTES_VOCAB,
};
use crate::core::{Failure, FailureKind};
use crate::error::{invalid, operational};
use crate::output::Printer;

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
}

const HEADER_EXAMPLES: &str = "\
Examples:
  tlio tokens header corpus.bin
  tlio tokens header --check-ids train_*.bin
  tlio --json tokens header corpus.bin";

const PACK_EXAMPLES: &str = "\
Examples:
  tlio tokens pack corpus.txt -o corpus.bin
  cat a.txt b.txt | tlio tokens pack -o corpus.bin
  tlio tokens pack ids.txt --from ids --vocab-size 50257 -o train.bin
  tlio tokens pack big.txt -o train --shard-tokens 100000000";

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
}

/// Arguments of `tokens pack`.
#[derive(Debug, Args)]
pub struct PackArgs {
    /// Input files, read in order; `-` (the default) is standard input.
    #[arg(value_name = "FILE")]
    pub inputs: Vec<PathBuf>,
    /// The output shard, or the prefix of SHARD_000000.bin, ... with --shard-tokens.
    #[arg(short, long, value_name = "SHARD", alias = "out")]
    pub output: PathBuf,
    /// How to read the inputs.
    #[arg(long, value_enum, default_value_t = FromFormat::Bytes)]
    pub from: FromFormat,
    /// The vocabulary size V (every id must be below it); required unless --from bytes.
    #[arg(long, value_name = "V")]
    pub vocab_size: Option<u64>,
    /// Split into shards of N ids: SHARD_000000.bin, SHARD_000001.bin, ...
    #[arg(long, value_name = "N")]
    pub shard_tokens: Option<u64>,
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
}

/// Run `tlio tokens`.
pub fn run(cmd: TokensCommand, printer: &Printer) -> anyhow::Result<Outcome> {
    match cmd {
        TokensCommand::Header(args) => header(args, printer),
        TokensCommand::Pack(args) => pack(args, printer),
        TokensCommand::Windows(args) => windows(args, printer),
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
        Ok(_) if check_ids => Shard::open(path, None).map(|_| ()),
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
    let mut rows = Vec::new();
    let mut any_invalid = false;
    for path in &args.files {
        // A file that cannot be read is an error (exit 2); an invalid file is a "no"
        // answer in the report. The files read before the error are still reported
        // (cli.md: a report line for every file read), then the error.
        let failed = match header_row(path, args.check_ids) {
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
    version: i32,
    vocab_size: Option<u32>,
}

#[derive(Serialize)]
struct PackReport {
    shards: Vec<PackedShard>,
    tokens: u64,
}

fn pack(args: PackArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let format = match args.from {
        FromFormat::Bytes => InputFormat::Bytes,
        FromFormat::Ids => InputFormat::Ids,
        FromFormat::U16le => InputFormat::U16le,
        FromFormat::U32le => InputFormat::U32le,
    };
    let vocab = match (args.vocab_size, format) {
        (Some(v), _) => u32::try_from(v)
            .ok()
            .filter(|&v| v >= 1 && u64::from(v) <= tokens::MAX_COUNT)
            .ok_or_else(|| {
                operational(format!(
                    "--vocab-size must be 1 to {}, got {v}",
                    tokens::MAX_COUNT
                ))
            })?,
        (None, InputFormat::Bytes) => BYTES_VOCAB,
        (None, _) => {
            return Err(operational(
                "--vocab-size is required with --from ids, u16le or u32le",
            ))
        }
    };
    let paths = if args.inputs.is_empty() {
        vec![PathBuf::from("-")]
    } else {
        args.inputs.clone()
    };
    // Open every input before writing anything, so a missing file fails first; never
    // write over an input.
    let mut inputs = Vec::new();
    let mut total = Some(0u64);
    for path in &paths {
        if path.as_os_str() == "-" {
            total = None;
            inputs.push(PackInput {
                name: "-".to_string(),
                reader: Box::new(io::stdin()),
            });
            continue;
        }
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let size = file
            .metadata()
            .with_context(|| format!("cannot read {}", path.display()))?
            .len();
        total = total.map(|t| t.saturating_add(size));
        if clobbers_output(path, &args.output, args.shard_tokens.is_some()) {
            return Err(operational(format!(
                "refusing to write over the input {}",
                path.display()
            )));
        }
        inputs.push(PackInput {
            name: path.display().to_string(),
            reader: Box::new(file),
        });
    }
    let bar = match total {
        Some(t) => printer.bytes_bar(t, "packing"),
        None => printer.bar(0, "packing", "{msg} {bytes} {bytes_per_sec}"),
    };
    let opts = PackOptions {
        format,
        vocab,
        shard_tokens: args.shard_tokens,
    };
    let summary = tokens::pack(inputs, &args.output, &opts, &mut |n| bar.inc(n));
    bar.finish_and_clear();
    let summary = summary?;
    let report = PackReport {
        shards: summary
            .shards
            .iter()
            .map(|(path, h)| PackedShard {
                file: path.display().to_string(),
                n: h.count,
                version: h.version,
                vocab_size: h.vocab,
            })
            .collect(),
        tokens: summary.tokens,
    };
    // Like every command that writes files, pack says what it wrote as chatter on
    // stderr (silenced by -q), or as one JSON document on stdout with --json.
    if printer.json {
        printer.json_line(&report)?;
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
    }
    Ok(Outcome::Success)
}

/// True when writing `out` (or its numbered shards) would replace the input `input`.
fn clobbers_output(input: &Path, out: &Path, numbered: bool) -> bool {
    if atomic::same_file(input, out) {
        return true;
    }
    numbered
        && (0..)
            .map(|i| tokens::output_name(out, i))
            .take_while(|p| p.exists())
            .any(|p| atomic::same_file(input, &p))
}

/// One line of `tokens windows`.
#[derive(Serialize)]
struct WindowLine<'a> {
    inputs: Vec<&'a [i64]>,
    targets: Vec<&'a [i64]>,
    cursor: Cursor,
}

fn windows(args: WindowsArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let shards = args
        .shards
        .iter()
        .map(|p| Shard::open(p, None))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(path) = &args.save_cursor {
        // Checked before any batch is printed: the cursor must never replace a shard
        // (the cursor file read with --cursor may be rewritten: it was read whole).
        let inputs: Vec<&Path> = args.shards.iter().map(PathBuf::as_path).collect();
        atomic::refuse_inputs(path, &inputs)?;
        atomic::check_target(path)?;
    }
    let rng = Pcg32::seed(args.seed, DEFAULT_SEQ);
    let mut stream = TokenStream::new(shards, args.seq_len, args.batch, rng, None)?;
    if let Some(path) = &args.cursor {
        let bytes = crate::core::files::read_limited(path, tokens::MAX_CURSOR_BYTES)
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
