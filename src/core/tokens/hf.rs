//! Loading a Hugging Face `tokenizer.json` for packing: the file's size limit, the
//! patterns refused, and the settings switched off.
//!
//! Invariants: a load never panics (the library is called under `catch_unwind`, and
//! the binary's panic hook prints nothing); the tokenizer returned splits special-token
//! strings as text and neither pads nor truncates: packing a corpus is not encoding a
//! model's input, so a file's `padding` (`Fixed: 100000000`, `pad_to_multiple_of`)
//! cannot blow up memory or the shard, and its `truncation` cannot cut documents.
//! Encoding gives the library's own ids, and no pre-token longer than
//! [`MAX_PIECE_BYTES`] ever reaches its model: memory stays bounded whatever the
//! document and whatever the file's pre-tokenizer (or its absence).

use std::panic::catch_unwind;
use std::path::{Path, PathBuf};

use tokenizers::{Model, OffsetReferential, OffsetType, PreTokenizer};

use super::o200k::{PieceTooLong, MAX_PIECE_BYTES};
use super::tokenizer::{panic_text, Inner, Tokenizer, TokenizerError, MAX_TOKENIZER_JSON_BYTES};

/// The longest document a tokenizer.json encodes. The library holds the whole document's
/// pre-tokenized form at once (each piece a normalized string with per-byte
/// alignments): about 110 bytes of memory per byte of ordinary text, measured here
/// (16 MiB of words peaked at 1.8 GB), so this bounds one document at about 1 GB. The
/// built-in encodings stream pieces and have only [`super::corpus::MAX_DOCUMENT_BYTES`].
pub const MAX_HF_DOCUMENT_BYTES: usize = 8 << 20;

/// Why a document could not be encoded by a tokenizer.json.
pub(super) enum HfEncodeError {
    /// A document over [`MAX_HF_DOCUMENT_BYTES`] (its length in bytes).
    DocumentTooLong(usize),
    /// A pre-token over [`MAX_PIECE_BYTES`] (its length in bytes).
    TooLong(PieceTooLong),
    /// The library's own error.
    Library(String),
}

/// The ids of `text`, as `tokenizer.encode(text, false)` gives them, in the same steps
/// (added tokens split out, normalizer, pre-tokenizer, model), with one check between
/// the pre-tokenizer and the model: a pre-token longer than [`MAX_PIECE_BYTES`] is
/// refused, as is a document over [`MAX_HF_DOCUMENT_BYTES`]. The models (BPE, Unigram) need tens of bytes of memory per byte of one
/// pre-token, and a tokenizer.json without a pre-tokenizer makes the whole document
/// one; the library has no such limit of its own.
///
/// The ids are taken from each piece as the model makes them, with no `Encoding`: the
/// library's keeps a string, offsets and six per-token vectors, several times the
/// memory of the ids. Its post-processors change ids only when asked to add special
/// tokens (Bert, Roberta and Template return early or add nothing without
/// `add_special_tokens`; ByteLevel touches offsets only), which packing never asks.
pub(super) fn encode_bounded(
    tokenizer: &tokenizers::Tokenizer,
    text: &str,
) -> Result<Vec<u32>, HfEncodeError> {
    if text.len() > MAX_HF_DOCUMENT_BYTES {
        return Err(HfEncodeError::DocumentTooLong(text.len()));
    }
    let library = |e: tokenizers::Error| HfEncodeError::Library(e.to_string());
    let mut pre = tokenizer
        .get_added_vocabulary()
        .extract_and_normalize(tokenizer.get_normalizer(), text);
    if let Some(pre_tokenizer) = tokenizer.get_pre_tokenizer() {
        pre_tokenizer.pre_tokenize(&mut pre).map_err(library)?;
    }
    let splits = pre.get_splits(OffsetReferential::Normalized, OffsetType::None);
    let longest = splits
        .iter()
        .filter(|(_, _, tokens)| tokens.is_none())
        .map(|(piece, _, _)| piece.len())
        .max()
        .unwrap_or(0);
    if longest > MAX_PIECE_BYTES {
        return Err(HfEncodeError::TooLong(PieceTooLong(longest)));
    }
    let model = tokenizer.get_model();
    let mut ids = Vec::new();
    for (piece, _, tokens) in &splits {
        match tokens {
            Some(added) => ids.extend(added.iter().map(|t| t.id)),
            None => ids.extend(model.tokenize(piece).map_err(library)?.iter().map(|t| t.id)),
        }
    }
    Ok(ids)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> tokenizers::Tokenizer {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/tokenizers")
            .join(name);
        let t = Tokenizer::from_json_file(&path).unwrap();
        match t.inner {
            Inner::Hf { tokenizer, .. } => *tokenizer,
            _ => unreachable!("a tokenizer.json loads as Hf"),
        }
    }

    fn library_ids(t: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
        t.encode(text, false).unwrap().get_ids().to_vec()
    }

    fn ours(t: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
        match encode_bounded(t, text) {
            Ok(ids) => ids,
            Err(HfEncodeError::TooLong(PieceTooLong(n))) => panic!("{n} bytes refused"),
            Err(HfEncodeError::DocumentTooLong(n)) => panic!("a document of {n} bytes refused"),
            Err(HfEncodeError::Library(e)) => panic!("{e}"),
        }
    }

    #[test]
    fn bounded_encoding_gives_the_library_ids_on_special_and_unicode_text() {
        for name in ["bpe_small.json", "bpe_split.json"] {
            let t = fixture(name);
            for text in [
                "",
                "hello world",
                "<|endoftext|>a<s>b<|end_of_text|>",
                "e\u{301} caf\u{e9} \u{fb01} \u{1F600}\t\n\n  x",
            ] {
                assert_eq!(ours(&t, text), library_ids(&t, text), "{name}: {text:?}");
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        #[test]
        fn bounded_encoding_is_the_library_encode(
            text in r"(\PC|\s|<s>|<\|endoftext\|>|'s|[0-9]{1,5}){0,64}"
        ) {
            for name in ["bpe_small.json", "bpe_split.json"] {
                let t = fixture(name);
                proptest::prop_assert_eq!(ours(&t, &text), library_ids(&t, &text));
            }
        }
    }

    #[test]
    fn a_piece_over_the_limit_is_refused_before_the_model_sees_it() {
        let t = fixture("bpe_small.json");
        let run = "a".repeat(MAX_PIECE_BYTES + 1);
        assert!(matches!(
            encode_bounded(&t, &run),
            Err(HfEncodeError::TooLong(PieceTooLong(n))) if n == MAX_PIECE_BYTES + 1
        ));
        // Split where the pre-tokenizer splits: many short words of the same size pass.
        let words = "ab ".repeat(MAX_PIECE_BYTES / 3 + 1);
        assert!(encode_bounded(&t, &words).is_ok());
        // A document over its own limit is refused before the library sees it.
        let long = "ab ".repeat(MAX_HF_DOCUMENT_BYTES / 3 + 1);
        assert!(matches!(
            encode_bounded(&t, &long),
            Err(HfEncodeError::DocumentTooLong(n)) if n == long.len()
        ));
    }
}
