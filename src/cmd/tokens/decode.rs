//! `tlio tokens decode`: the text of a range of a shard's ids through a tokenizer (or the
//! byte level of plain `tokens pack`), refusing a tokenizer of another vocabulary with a
//! hint.

use super::*;

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

pub(super) fn decode(args: DecodeArgs, printer: &Printer) -> anyhow::Result<Outcome> {
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
