//! Loading a Hugging Face `tokenizer.json` for packing: the file's size limit, the
//! patterns refused, and the settings switched off.
//!
//! Invariants: a load never panics (the library is called under `catch_unwind`, and
//! the binary's panic hook prints nothing); the tokenizer returned splits special-token
//! strings as text and neither pads nor truncates: packing a corpus is not encoding a
//! model's input, so a file's `padding` (`Fixed: 100000000`, `pad_to_multiple_of`)
//! cannot blow up memory or the shard, and its `truncation` cannot cut documents.

use std::panic::catch_unwind;
use std::path::{Path, PathBuf};

use super::tokenizer::{panic_text, Inner, Tokenizer, TokenizerError, MAX_TOKENIZER_JSON_BYTES};

/// Refuse a tokenizer.json whose regex patterns use an interval quantifier followed by
/// `+` (`\p{N}{1,3}+`): the Python library's engine (Oniguruma, Ruby syntax) reads it
/// as a repetition of the interval, ours (fancy-regex) as a possessive interval, and the
/// ids would differ. Better no ids than different ones. The tokenizer.json files of
/// real models (GPT-2, Llama-3, Qwen2, Mistral) do not use it.
fn check_patterns(bytes: &[u8]) -> Result<(), String> {
    // `{n}+`, `{n,}+`, `{n,m}+`; not `\p{L}+`, a class repeated.
    let Ok(interval_plus) = regex::Regex::new(r"\{[0-9]+(,[0-9]*)?\}\+") else {
        return Ok(());
    };
    let walk = |v: &serde_json::Value| -> Result<(), String> { walk_patterns(v, &interval_plus) };
    // Unparsable JSON is reported by the library itself, with its own message.
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(v) => walk(&v),
        Err(_) => Ok(()),
    }
}

fn walk_patterns(v: &serde_json::Value, interval_plus: &regex::Regex) -> Result<(), String> {
    let walk = |v: &serde_json::Value| walk_patterns(v, interval_plus);
    {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(p)) = map.get("Regex") {
                    if interval_plus.is_match(p) {
                        return Err(format!(
                            "the pattern {p:?} has an interval quantifier followed by '+', which the tokenizers library's two regex engines read differently (a repetition in Oniguruma, possessive in fancy-regex); tlio refuses it rather than give different ids"
                        ));
                    }
                }
                map.values().try_for_each(walk)
            }
            serde_json::Value::Array(items) => items.iter().try_for_each(walk),
            _ => Ok(()),
        }
    }
}

impl Tokenizer {
    /// A Hugging Face `tokenizer.json` (a directory means its `tokenizer.json`).
    pub fn from_json_file(path: &Path) -> Result<Tokenizer, TokenizerError> {
        let path = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        let read_err = |error| TokenizerError::Read {
            path: path.clone(),
            error,
        };
        // Through the opening rule of every input: a FIFO is refused, never waited on,
        // and the size is the open file's.
        let file = crate::files::open_regular(&path).map_err(read_err)?;
        let size = file.metadata().map_err(read_err)?.len();
        if size > MAX_TOKENIZER_JSON_BYTES {
            return Err(TokenizerError::TooLarge { path, size });
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, MAX_TOKENIZER_JSON_BYTES),
            &mut bytes,
        )
        .map_err(read_err)?;
        Tokenizer::from_json_bytes(&path.display().to_string(), &bytes).map_err(|e| match e {
            TokenizerError::Invalid { reason, .. } => TokenizerError::Invalid {
                path: path.clone(),
                reason,
            },
            other => other,
        })
    }

    /// A Hugging Face tokenizer from the bytes of a `tokenizer.json`; `name` is for
    /// messages.
    pub fn from_json_bytes(name: &str, bytes: &[u8]) -> Result<Tokenizer, TokenizerError> {
        let invalid = |reason: String| TokenizerError::Invalid {
            path: PathBuf::from(name),
            reason,
        };
        check_patterns(bytes).map_err(invalid)?;
        let loaded = catch_unwind(|| tokenizers::Tokenizer::from_bytes(bytes))
            .map_err(|p| invalid(panic_text(p.as_ref())))?;
        let mut tokenizer = loaded.map_err(|e| invalid(e.to_string()))?;
        // Special-token strings in the text are ordinary text, as in tiktoken's
        // encode_ordinary: a document can never inject an end-of-text.
        tokenizer.set_encode_special_tokens(true);
        // Packing is not encoding for a model's input: no padding, no truncation.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| invalid(e.to_string()))?;
        let vocab = tokenizer.get_vocab(true);
        let size = vocab
            .values()
            .map(|&id| u64::from(id) + 1)
            .max()
            .unwrap_or(0);
        let vocab_size = u32::try_from(size)
            .ok()
            .filter(|&v| v >= 1 && v <= i32::MAX as u32)
            .ok_or(TokenizerError::BadVocab {
                name: name.to_string(),
                size,
            })?;
        Ok(Tokenizer {
            name: name.to_string(),
            vocab_size,
            inner: Inner::Hf {
                tokenizer: Box::new(tokenizer),
                vocab,
            },
        })
    }
}
