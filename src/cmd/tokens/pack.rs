//! `tlio tokens pack`: its inputs, plan and report; core's pack does the work and
//! refuses an output that would replace an input.

use super::*;
use tlio_core::remote::pack::{pack_to, Written};
use tlio_core::remote::RemoteError;

#[derive(Serialize)]
pub(super) struct PackedShard {
    file: String,
    n: u64,
    magic: i32,
    version: i32,
    vocab_size: Option<u32>,
}

#[derive(Serialize)]
pub(super) struct PackReport {
    pub(super) shards: Vec<PackedShard>,
    pub(super) tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) documents: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) skipped: Option<u64>,
    /// The manifest created last, for an s3:// output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) manifest: Option<String>,
    /// The s3:// output was complete already, with this pack's very manifest.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) already_complete: bool,
}

pub(super) fn pack(args: PackArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    if let Some(spec) = args.tokenizer.clone() {
        return pack_text(args, &spec, printer);
    }
    let (format, vocab) = id_format(&args)?;
    let (inputs, total) = open_id_inputs(&input_paths(&args))?;
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
    let mut total = 0;
    // A local output is written in place; an s3:// one is packed the same way into a
    // staging directory, then uploaded with its manifest last (core's pack_to).
    let published = pack_to(&args.output, |out| {
        let summary = tokens::pack(inputs, out, &opts, &mut |n| bar.inc(n))?;
        total = summary.tokens;
        Ok(summary.shards)
    });
    bar.finish_and_clear();
    let published = published?;
    let report = PackReport {
        shards: published_shards(&published.shards),
        tokens: total,
        documents: None,
        skipped: None,
        manifest: published.manifest,
        already_complete: published.already_complete,
    };
    report_pack(&report, printer)
}

/// The inputs named on the command line; none means standard input.
pub(super) fn input_paths(args: &PackArgs) -> Vec<PathBuf> {
    if args.inputs.is_empty() {
        vec![PathBuf::from("-")]
    } else {
        args.inputs.clone()
    }
}

/// The id format and vocabulary of a pack without a tokenizer, refusing the flags and
/// formats that need one.
pub(super) fn id_format(args: &PackArgs) -> anyhow::Result<(InputFormat, u32)> {
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

/// Open every input before writing anything, so a missing file fails first (core's
/// pack refuses an output that would replace one). Returns the readers and their total
/// size (None when standard input is among them).
fn open_id_inputs(paths: &[PathBuf]) -> anyhow::Result<(Vec<PackInput>, Option<u64>)> {
    let mut inputs = Vec::new();
    let mut total = Some(0u64);
    for path in paths {
        if path.as_os_str() == "-" {
            if tlio_core::files::stdin_is_closed() {
                return Err(anyhow::Error::new(tlio_core::files::stdin_closed_error())
                    .context("cannot read -"));
            }
            total = None;
            inputs.push(PackInput {
                name: "-".to_string(),
                reader: Box::new(io::stdin()),
                path: None,
            });
            continue;
        }
        let (input, size) = PackInput::open(path)?;
        total = total.map(|t| t.saturating_add(size));
        inputs.push(input);
    }
    Ok((inputs, total))
}

/// The report rows of shards named by path or URL.
pub(super) fn published_shards(shards: &[Written]) -> Vec<PackedShard> {
    shards
        .iter()
        .map(|(file, h)| PackedShard {
            file: file.clone(),
            n: h.count,
            magic: h.magic,
            version: h.version,
            vocab_size: h.vocab,
        })
        .collect()
}

/// Like every command that writes files, pack says what it wrote as chatter on stderr
/// (silenced by -q), or as one JSON document on stdout with --json.
pub(super) fn report_pack(report: &PackReport, printer: &Printer) -> anyhow::Result<Outcome> {
    if printer.json {
        printer.json_line(report)?;
    } else {
        if let (true, Some(manifest)) = (report.already_complete, &report.manifest) {
            printer.info(format!(
                "{} is already complete: its manifest names the {} shards this pack gives \
                 (nothing uploaded)",
                escape(manifest),
                report.shards.len()
            ));
            return Ok(Outcome::Success);
        }
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
        if let Some(manifest) = &report.manifest {
            printer.info(format!(
                "wrote {}: the manifest of {} shards, created last",
                escape(manifest),
                report.shards.len()
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
    let (tokenizer, mut opts, paths) = text_options(&args, spec)?;
    let bar = printer.bar(0, "", "{spinner} {elapsed} {msg}");
    let started = std::time::Instant::now();
    let mut counts = (0, 0, 0);
    // As the id pack above: an s3:// output is packed into a staging directory first.
    let published = pack_to(&args.output, |out| {
        opts.plan = plan_at(&opts.plan, out);
        let summary = tokens::pack_text(&paths, &tokenizer, &opts, &mut |p: &TextPackProgress| {
            show_text_progress(&bar, started, p);
        })?;
        counts = (summary.tokens, summary.documents, summary.skipped);
        Ok(summary.shards)
    });
    bar.finish_and_clear();
    let published = published.map_err(val_tokens_hint)?;
    let report = PackReport {
        shards: published_shards(&published.shards),
        tokens: counts.0,
        documents: Some(counts.1),
        skipped: Some(counts.2),
        manifest: published.manifest,
        already_complete: published.already_complete,
    };
    report_pack(&report, printer)
}

/// Core's refusal of a validation split that leaves no training token, in the flag's
/// words; any other error as it is.
fn val_tokens_hint(err: RemoteError) -> anyhow::Error {
    let hint = matches!(err, RemoteError::Tokens(TokensError::NoTrainTokens { .. }));
    let err = anyhow::Error::new(err);
    if hint {
        err.context("--val-tokens must be below the number of tokens the inputs yield")
    } else {
        err
    }
}

/// `plan` with its output at `out` (the staging path of an s3:// output).
fn plan_at(plan: &ShardPlan, out: &Path) -> ShardPlan {
    let out = out.to_path_buf();
    match plan {
        ShardPlan::Single(_) => ShardPlan::Single(out),
        ShardPlan::Numbered { shard_tokens, .. } => ShardPlan::Numbered {
            out,
            shard_tokens: *shard_tokens,
        },
        ShardPlan::ValTrain {
            val_tokens,
            shard_tokens,
            ..
        } => ShardPlan::ValTrain {
            prefix: out,
            val_tokens: *val_tokens,
            shard_tokens: *shard_tokens,
        },
    }
}

/// The progress line of a pack with a tokenizer.
pub(super) fn show_text_progress(
    bar: &indicatif::ProgressBar,
    started: std::time::Instant,
    p: &TextPackProgress,
) {
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    bar.set_message(format!(
        "{} documents, {} tokens, {:.1} MB/s",
        p.documents,
        p.tokens,
        p.bytes as f64 / 1e6 / secs
    ));
    bar.tick();
}

/// The tokenizer, options and input paths of a pack with a tokenizer, from its flags.
pub(super) fn text_options(
    args: &PackArgs,
    spec: &str,
) -> anyhow::Result<(Tokenizer, TextPackOptions, Vec<PathBuf>)> {
    let format = corpus_format(args)?;
    let tokenizer = Tokenizer::load(spec).map_err(TokensError::from)?;
    // Core names the field (eot); the flag's words are the CLI's.
    let eot = match args.eot.as_deref() {
        Some("none") => None,
        Some(token) => Some(
            tokenizer
                .token_id(token)
                .map_err(TokensError::from)
                .context("give --eot one of the tokenizer's special tokens, or --eot none")?,
        ),
        None => Some(
            tokenizer
                .default_eot()
                .map_err(TokensError::from)
                .context("give --eot TOKEN (e.g. --eot '<|end_of_text|>') or --eot none")?,
        ),
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
    let paths = input_paths(args);
    check_text_inputs(&paths, format)?;
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
    Ok((tokenizer, opts, paths))
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

/// Every input must exist before anything is written (core's pack refuses one that an
/// output would replace), and standard input can be read once (and not as Parquet,
/// which needs a file).
fn check_text_inputs(paths: &[PathBuf], format: CorpusFormat) -> anyhow::Result<()> {
    let stdin_count = paths.iter().filter(|p| p.as_os_str() == "-").count();
    if stdin_count > 1 || (stdin_count == 1 && format == CorpusFormat::Parquet) {
        return Err(operational(
            "standard input (-) can be read once, and not as Parquet (which needs a file)",
        ));
    }
    for path in paths.iter().filter(|p| p.as_os_str() != "-") {
        std::fs::metadata(path).with_context(|| format!("cannot open {}", path.display()))?;
    }
    Ok(())
}
