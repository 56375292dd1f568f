//! Real tokenizers for `tokens pack` and `tokens decode`: the OpenAI encodings built in
//! (rank files compiled into the binary, no download) and Hugging Face `tokenizer.json`
//! files.
//!
//! Invariants: `encode` is a pure function of the text (ids identical to tiktoken's
//! `encode_ordinary`, or to `tokenizers`' `encode(text, add_special_tokens=False)` with
//! `encode_special_tokens` on), so special-token strings inside a document are split as
//! ordinary text and can never become the special token; every id it returns is below
//! `vocab_size()`; a panic inside a tokenizer library is turned into an error, never
//! a crash.
//!
//! Why `tiktoken-rs` for the OpenAI encodings: it is the only crate that ships all four
//! rank files (`r50k_base` = GPT-2, `p50k_base`, `cl100k_base`, `o200k_base`) and runs
//! tiktoken's own algorithm (the same regex, the same merge loop), so its ids are
//! tiktoken's by construction. GitHub's `bpe-openai` ships only `cl100k_base` and
//! `o200k_base` (not GPT-2, the encoding llm.c uses) and builds its tables in a build
//! script. tiktoken's cost is mostly its regex, so for the GPT-2 pattern (r50k, p50k)
//! `gpt2fast` replaces the regex with a hand-written scanner over the same ranks
//! (measured in docs/tokens.md). The reference ids in `fixtures/tokenizers/` hold every
//! path to tiktoken's and `tokenizers`' exact output.
//!
//! Without the `tokenizers` feature the types stay (so callers compile unchanged), no
//! `Tokenizer` can exist, and every load is [`TokenizerError::NotBuilt`].

#[cfg(feature = "tokenizers")]
use std::collections::HashMap;

#[cfg(feature = "tokenizers")]
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

#[cfg(feature = "tokenizers")]
use tiktoken_rs::CoreBPE;

#[cfg(feature = "tokenizers")]
use super::gpt2fast::Gpt2Fast;
#[cfg(feature = "tokenizers")]
use super::o200k::{O200kFast, PieceTooLong, MAX_PIECE_BYTES};
#[cfg(feature = "tokenizers")]
use super::runs::longest_run_within;
#[cfg(all(test, feature = "tokenizers"))]
use super::runs::RUNS;
use crate::{Failure, FailureKind};

/// The largest `tokenizer.json` we load (real ones are a few MB; Llama-3's is 9 MB).
pub const MAX_TOKENIZER_JSON_BYTES: u64 = 256 << 20;
/// tiktoken's end-of-text token.
pub const ENDOFTEXT: &str = "<|endoftext|>";
/// Its id in r50k_base and p50k_base.
#[cfg(feature = "tokenizers")]
const GPT2_ENDOFTEXT: u32 = 50256;

/// Errors of loading and using a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The name is no built-in encoding and no file of that name exists.
    #[error("unknown tokenizer {0:?}: use gpt2, r50k_base, p50k_base, cl100k_base, o200k_base or the path of a tokenizer.json")]
    Unknown(String),
    /// A `tokenizer.json` could not be read.
    #[error("cannot read tokenizer {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A `tokenizer.json` is larger than `MAX_TOKENIZER_JSON_BYTES`.
    #[error("{}: {size} bytes is too large for a tokenizer.json (at most {MAX_TOKENIZER_JSON_BYTES})", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// A `tokenizer.json` that the `tokenizers` library refuses.
    #[error("{}: not a valid tokenizer.json: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The library's message.
        reason: String,
    },
    /// A tokenizer whose vocabulary is empty or does not fit a shard header.
    #[error(
        "{name}: vocabulary size {size} is out of range for a shard (1 to {})",
        i32::MAX
    )]
    BadVocab {
        /// The tokenizer.
        name: String,
        /// Its vocabulary size.
        size: u64,
    },
    /// The end-of-text token asked for is no token of this tokenizer.
    #[error("{name} has no token {token:?}")]
    NoSuchToken {
        /// The tokenizer.
        name: String,
        /// The token asked for.
        token: String,
    },
    /// A tokenizer.json has no default end-of-text token.
    #[error("{name}: a tokenizer.json has no standard end-of-text token (eot): name one of its special tokens, or none")]
    NeedEot {
        /// The tokenizer.
        name: String,
    },
    /// The tokenizer library failed on a text (or panicked).
    #[error("{name} failed to encode a document: {reason}")]
    Encode {
        /// The tokenizer.
        name: String,
        /// What the library said.
        reason: String,
    },
    /// An id the tokenizer cannot decode.
    #[error("{name} cannot decode: {reason}")]
    Decode {
        /// The tokenizer.
        name: String,
        /// What the library said.
        reason: String,
    },
    /// A tokenizer was named, but this build has no tokenizers (the crate was built
    /// without its `tokenizers` feature).
    #[error("cannot load tokenizer {name:?}: this build lacks the `tokenizers` feature (only byte-level and pre-tokenized-id packing are available)")]
    NotBuilt {
        /// The tokenizer named.
        name: String,
    },
}

impl Failure for TokenizerError {
    fn kind(&self) -> FailureKind {
        match self {
            // Naming a tokenizer or token that does not exist, or a file that cannot be
            // read, is a request that cannot be done; a tokenizer.json the library
            // refuses, or text it fails on, is bad input.
            TokenizerError::Unknown(_)
            | TokenizerError::Read { .. }
            | TokenizerError::NoSuchToken { .. }
            | TokenizerError::NeedEot { .. }
            | TokenizerError::NotBuilt { .. } => FailureKind::Operational,
            TokenizerError::TooLarge { .. }
            | TokenizerError::Invalid { .. }
            | TokenizerError::BadVocab { .. }
            | TokenizerError::Encode { .. }
            | TokenizerError::Decode { .. } => FailureKind::Invalid,
        }
    }
}

/// A built-in OpenAI encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenAiEncoding {
    /// GPT-2's encoding, also called `gpt2` (50,257 ids).
    R50kBase,
    /// `p50k_base` (50,281 ids).
    P50kBase,
    /// `cl100k_base` (100,277 ids).
    Cl100kBase,
    /// `o200k_base` (200,019 ids).
    O200kBase,
}

impl OpenAiEncoding {
    /// The encoding a `--tokenizer` name stands for.
    pub fn from_name(name: &str) -> Option<OpenAiEncoding> {
        match name {
            "gpt2" | "r50k_base" => Some(OpenAiEncoding::R50kBase),
            "p50k_base" => Some(OpenAiEncoding::P50kBase),
            "cl100k_base" => Some(OpenAiEncoding::Cl100kBase),
            "o200k_base" => Some(OpenAiEncoding::O200kBase),
            _ => None,
        }
    }

    /// tiktoken's name.
    pub fn name(self) -> &'static str {
        match self {
            OpenAiEncoding::R50kBase => "r50k_base",
            OpenAiEncoding::P50kBase => "p50k_base",
            OpenAiEncoding::Cl100kBase => "cl100k_base",
            OpenAiEncoding::O200kBase => "o200k_base",
        }
    }

    /// tiktoken's `n_vocab`: one more than the largest id, special tokens included
    /// (checked against the rank files by a unit test).
    pub fn vocab_size(self) -> u32 {
        match self {
            OpenAiEncoding::R50kBase => 50_257,
            OpenAiEncoding::P50kBase => 50_281,
            OpenAiEncoding::Cl100kBase => 100_277,
            OpenAiEncoding::O200kBase => 200_019,
        }
    }

    #[cfg(feature = "tokenizers")]
    fn core(self) -> &'static CoreBPE {
        // The singletons parse the compiled-in rank file once per process.
        match self {
            OpenAiEncoding::R50kBase => tiktoken_rs::r50k_base_singleton(),
            OpenAiEncoding::P50kBase => tiktoken_rs::p50k_base_singleton(),
            OpenAiEncoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
            OpenAiEncoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
        }
    }
}

#[cfg(feature = "tokenizers")]
pub(super) enum Inner {
    OpenAi {
        encoding: OpenAiEncoding,
        core: &'static CoreBPE,
        /// The hand-written scanner for the GPT-2 pattern (r50k, p50k).
        fast: Option<Box<Gpt2Fast>>,
        /// o200k without fancy-regex (which gives up on long whitespace runs).
        o200k: Option<Box<O200kFast>>,
    },
    Hf {
        tokenizer: Box<tokenizers::Tokenizer>,
        vocab: HashMap<String, u32>,
    },
}

/// Without the `tokenizers` feature there is no kind of tokenizer: a `Tokenizer`
/// cannot be built, and the compiler knows every method past `load` is unreachable.
#[cfg(not(feature = "tokenizers"))]
pub(super) enum Inner {}

/// A loaded tokenizer; shareable between threads.
pub struct Tokenizer {
    pub(super) name: String,
    pub(super) vocab_size: u32,
    pub(super) inner: Inner,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("name", &self.name)
            .field("vocab_size", &self.vocab_size)
            .finish()
    }
}

/// Why a piece too long to merge is refused, for an error message.
#[cfg(feature = "tokenizers")]
fn too_long(PieceTooLong(len): PieceTooLong) -> String {
    format!("one pre-token (a piece the tokenizer's pattern or pre-tokenizer splits off, such as a run of one kind of character) is {len} bytes, more than the {MAX_PIECE_BYTES} its model is given (a merge needs tens of bytes of memory per byte)")
}

/// The text of a panic payload, for an error message.
#[cfg(feature = "tokenizers")]
pub(super) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "the tokenizer library panicked".to_string())
}

#[cfg(feature = "tokenizers")]
impl Tokenizer {
    /// A built-in encoding by name (`gpt2`, `r50k_base`, `p50k_base`, `cl100k_base`,
    /// `o200k_base`), else the `tokenizer.json` at that path.
    pub fn load(spec: &str) -> Result<Tokenizer, TokenizerError> {
        if let Some(encoding) = OpenAiEncoding::from_name(spec) {
            let core = catch_unwind(|| encoding.core()).map_err(|p| TokenizerError::Encode {
                name: spec.to_string(),
                reason: panic_text(p.as_ref()),
            })?;
            // r50k and p50k share GPT-2's pattern; their one special token is 50256.
            let fast = match encoding {
                OpenAiEncoding::R50kBase | OpenAiEncoding::P50kBase => {
                    Gpt2Fast::from_core(core, encoding.vocab_size(), &[GPT2_ENDOFTEXT])
                        .map(Box::new)
                }
                _ => None,
            };
            let o200k = match encoding {
                OpenAiEncoding::O200kBase => {
                    let specials: Vec<u32> = core
                        .special_tokens()
                        .iter()
                        .filter_map(|s| core.encode_with_special_tokens(s).first().copied())
                        .collect();
                    O200kFast::from_core(core, encoding.vocab_size(), &specials).map(Box::new)
                }
                _ => None,
            };
            return Ok(Tokenizer {
                name: encoding.name().to_string(),
                vocab_size: encoding.vocab_size(),
                inner: Inner::OpenAi {
                    encoding,
                    core,
                    fast,
                    o200k,
                },
            });
        }
        let path = Path::new(spec);
        if !path.exists() {
            return Err(TokenizerError::Unknown(spec.to_string()));
        }
        Tokenizer::from_json_file(path)
    }

    /// The name for messages (the encoding's, or the file's path).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One more than the largest id: what a shard header records as V.
    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// The id of the token `token` (a special token or a vocabulary entry).
    pub fn token_id(&self, token: &str) -> Result<u32, TokenizerError> {
        let found = match &self.inner {
            Inner::OpenAi { core, .. } => {
                if core.special_tokens().contains(token) {
                    match core.encode_with_special_tokens(token).as_slice() {
                        [id] => Some(*id),
                        _ => None,
                    }
                } else {
                    None
                }
            }
            Inner::Hf { vocab, .. } => vocab.get(token).copied(),
        };
        found.ok_or_else(|| TokenizerError::NoSuchToken {
            name: self.name.clone(),
            token: token.to_string(),
        })
    }

    /// The end-of-text token put before every document when none is named:
    /// `<|endoftext|>` for the OpenAI encodings (as llm.c does); a tokenizer.json has
    /// no standard one, so the caller must name it.
    pub fn default_eot(&self) -> Result<u32, TokenizerError> {
        match &self.inner {
            Inner::OpenAi { .. } => self.token_id(ENDOFTEXT),
            Inner::Hf { .. } => Err(TokenizerError::NeedEot {
                name: self.name.clone(),
            }),
        }
    }

    /// The ids of `text`, special-token strings split as ordinary text.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let encoded = catch_unwind(AssertUnwindSafe(|| match &self.inner {
            Inner::OpenAi {
                fast: Some(fast), ..
            } => fast.encode(text).map_err(too_long),
            Inner::OpenAi {
                o200k: Some(fast), ..
            } => fast.encode(text).map_err(too_long),
            Inner::OpenAi { core, .. } => {
                longest_run_within(text, MAX_PIECE_BYTES).map_err(too_long)?;
                Ok(core.encode_ordinary(text))
            }
            Inner::Hf { tokenizer, .. } => {
                use super::hf::{HfEncodeError, MAX_HF_DOCUMENT_BYTES};
                super::hf::encode_bounded(tokenizer, text).map_err(|e| match e {
                    HfEncodeError::DocumentTooLong(len) => format!("the document is {len} bytes, more than the {MAX_HF_DOCUMENT_BYTES} a tokenizer.json is given (the tokenizers library holds about 110 bytes of memory per byte of a document while it encodes it): split the document, or pack with a built-in encoding"),
                    HfEncodeError::TooLong(t) => too_long(t),
                    HfEncodeError::Library(reason) => reason,
                })
            }
        }));
        let ids = match encoded {
            Ok(Ok(ids)) => ids,
            Ok(Err(reason)) => return Err(self.encode_err(reason)),
            Err(p) => return Err(self.encode_err(panic_text(p.as_ref()))),
        };
        if let Some(bad) = ids.iter().find(|&&id| id >= self.vocab_size) {
            return Err(self.encode_err(format!(
                "it returned id {bad}, not below its vocabulary size {}",
                self.vocab_size
            )));
        }
        Ok(ids)
    }

    pub(super) fn encode_err(&self, reason: String) -> TokenizerError {
        TokenizerError::Encode {
            name: self.name.clone(),
            reason,
        }
    }

    /// The text of `ids` (bytes that are not whole UTF-8 characters, as at a cut in
    /// the middle of a character, show as U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let decode_err = |reason: String| TokenizerError::Decode {
            name: self.name.clone(),
            reason,
        };
        if let Some(bad) = ids.iter().find(|&&id| id >= self.vocab_size) {
            return Err(decode_err(format!(
                "id {bad} is not below its vocabulary size {}",
                self.vocab_size
            )));
        }
        let decoded = catch_unwind(AssertUnwindSafe(|| match &self.inner {
            Inner::OpenAi { core, .. } => core
                .decode_bytes(ids)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .map_err(|e| e.to_string()),
            Inner::Hf { tokenizer, .. } => tokenizer.decode(ids, false).map_err(|e| e.to_string()),
        }));
        match decoded {
            Ok(r) => r.map_err(decode_err),
            Err(p) => Err(decode_err(panic_text(p.as_ref()))),
        }
    }

    /// The built-in encoding, if this is one.
    pub fn openai_encoding(&self) -> Option<OpenAiEncoding> {
        match &self.inner {
            Inner::OpenAi { encoding, .. } => Some(*encoding),
            Inner::Hf { .. } => None,
        }
    }
}

/// The same API without the `tokenizers` feature: every load says so.
#[cfg(not(feature = "tokenizers"))]
impl Tokenizer {
    /// A built-in encoding or a `tokenizer.json`: not in this build.
    pub fn load(spec: &str) -> Result<Tokenizer, TokenizerError> {
        Err(TokenizerError::NotBuilt {
            name: spec.to_string(),
        })
    }

    /// A Hugging Face `tokenizer.json`: not in this build.
    pub fn from_json_file(path: &Path) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::load(&path.display().to_string())
    }

    /// A Hugging Face tokenizer from bytes: not in this build.
    pub fn from_json_bytes(name: &str, _bytes: &[u8]) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::load(name)
    }

    /// The name for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One more than the largest id.
    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// The id of the token `token`.
    pub fn token_id(&self, _token: &str) -> Result<u32, TokenizerError> {
        match self.inner {}
    }

    /// The end-of-text token put before every document.
    pub fn default_eot(&self) -> Result<u32, TokenizerError> {
        match self.inner {}
    }

    /// The ids of `text`.
    pub fn encode(&self, _text: &str) -> Result<Vec<u32>, TokenizerError> {
        match self.inner {}
    }

    /// The text of `ids`.
    pub fn decode(&self, _ids: &[u32]) -> Result<String, TokenizerError> {
        match self.inner {}
    }

    /// The built-in encoding, if this is one.
    pub fn openai_encoding(&self) -> Option<OpenAiEncoding> {
        match self.inner {}
    }
}

#[cfg(all(test, not(feature = "tokenizers")))]
mod not_built_tests {
    use super::*;

    #[test]
    fn naming_any_tokenizer_says_the_feature_is_missing() {
        for name in ["gpt2", "cl100k_base", "tokenizer.json"] {
            let err = Tokenizer::load(name).unwrap_err();
            assert!(matches!(err, TokenizerError::NotBuilt { .. }), "{err}");
            assert!(err.to_string().contains("`tokenizers` feature"), "{err}");
        }
    }
}

#[cfg(all(test, feature = "tokenizers"))]
mod tests {
    use super::*;

    #[test]
    fn vocab_sizes_are_one_past_the_largest_id() {
        for name in ["gpt2", "p50k_base", "cl100k_base", "o200k_base"] {
            let t = Tokenizer::load(name).unwrap();
            let v = t.vocab_size();
            // The largest id decodes, the next does not exist.
            assert!(
                t.openai_encoding()
                    .unwrap()
                    .core()
                    .decode_bytes(&[v - 1])
                    .is_ok(),
                "{name}"
            );
            assert!(
                t.openai_encoding()
                    .unwrap()
                    .core()
                    .decode_bytes(&[v])
                    .is_err(),
                "{name}"
            );
        }
    }

    #[test]
    fn gpt2_basics_and_special_strings_are_text() {
        let t = Tokenizer::load("gpt2").unwrap();
        assert_eq!(t.encode("Hello world").unwrap(), vec![15496, 995]);
        assert_eq!(t.default_eot().unwrap(), 50256);
        let ids = t.encode("<|endoftext|>").unwrap();
        assert!(!ids.contains(&50256), "{ids:?}");
        assert_eq!(t.decode(&ids).unwrap(), "<|endoftext|>");
        assert_eq!(t.decode(&[50256]).unwrap(), "<|endoftext|>");
        assert!(t.decode(&[50257]).is_err());
        assert!(matches!(
            t.token_id("<|nope|>"),
            Err(TokenizerError::NoSuchToken { .. })
        ));
        assert!(matches!(
            Tokenizer::load("no-such-tokenizer"),
            Err(TokenizerError::Unknown(_))
        ));
    }

    #[test]
    fn interval_then_plus_patterns_are_refused() {
        let json = br#"{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}+"}}}"#;
        let err = Tokenizer::from_json_bytes("t.json", json).unwrap_err();
        assert!(err.to_string().contains("interval quantifier"), "{err}");
        // A class repeated is fine (the library then rejects this fragment for other
        // reasons, not ours).
        let json = br#"{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\p{L}+"}}}"#;
        let err = Tokenizer::from_json_bytes("t.json", json).unwrap_err();
        assert!(!err.to_string().contains("interval quantifier"), "{err}");
    }

    #[test]
    fn cl100k_refuses_a_run_longer_than_a_piece_may_be_and_encodes_up_to_it() {
        assert!(regex::Regex::new(RUNS).is_ok());
        let t = Tokenizer::load("cl100k_base").unwrap();
        for (unit, kind) in [("a", "letters"), ("!", "punctuation"), (" ", "spaces")] {
            // A run of exactly the limit passes (encoding it takes seconds: the
            // scan alone is checked).
            let at_limit = format!("x1{}", unit.repeat(MAX_PIECE_BYTES));
            assert!(
                longest_run_within(&at_limit, MAX_PIECE_BYTES).is_ok(),
                "{kind}"
            );
            let over = format!("x1{}", unit.repeat(MAX_PIECE_BYTES + 1));
            let err = t.encode(&over).unwrap_err().to_string();
            assert!(
                err.contains(&format!("{} bytes", MAX_PIECE_BYTES + 1)),
                "{kind}: {err}"
            );
        }
        // Long documents of short runs are scanned and pass.
        let many = "word, 12 ".repeat(MAX_PIECE_BYTES / 8);
        assert!(many.len() > MAX_PIECE_BYTES);
        let core = t.openai_encoding().unwrap().core();
        assert_eq!(t.encode(&many).unwrap(), core.encode_ordinary(&many));
    }

    #[test]
    fn bad_tokenizer_json_is_an_error() {
        for bytes in [&b"{}"[..], b"[1,2]", b"\xff\xfe", b""] {
            assert!(matches!(
                Tokenizer::from_json_bytes("t.json", bytes),
                Err(TokenizerError::Invalid { .. })
            ));
        }
    }
}
