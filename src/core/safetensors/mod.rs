//! safetensors for every dtype of the library 0.8: header-only reading with the five
//! reader rules and the stricter rules of the spec, memory-mapped zero-copy loading,
//! exact decoding, RNE encoding, and a canonical, streaming, atomic writer.
//!
//! Invariants: a reader never panics, never reads past the end of the file and never
//! allocates in proportion to a header number before checking it against the file
//! size; every rejection names the rule and the tensor; the writer's bytes equal the
//! reference library's for the same tensors (one metadata key; several are sorted).

use std::borrow::Cow;
use std::io;
use std::path::PathBuf;

use crate::atomic::AtomicError;
use crate::failure::{Failure, FailureKind};
use crate::text::quote;

pub mod convert;
pub mod diff;
pub mod dtype;
pub mod float;
pub mod header;
pub mod kernels;
pub mod mmap;
pub mod slice;
pub mod stats;
pub mod verify;
pub mod write;

pub use dtype::Dtype;
pub use header::{parse_header, read_header, Header, TensorInfo, MAX_HEADER_SIZE};
pub use mmap::MappedFile;
pub use write::{canonical_header, save, write};

/// A tensor to write: its values as raw bytes (written untouched) or as numbers encoded
/// to `dtype`.
#[derive(Debug, Clone)]
pub struct Tensor<'a> {
    /// The tensor's name (any UTF-8 except `__metadata__`).
    pub name: String,
    /// The dtype stored in the file.
    pub dtype: Dtype,
    /// The shape, outermost first; `[]` is a scalar.
    pub shape: Vec<u64>,
    /// The data.
    pub data: TensorData<'a>,
}

/// A tensor's data as given to the writer.
#[derive(Debug, Clone)]
pub enum TensorData<'a> {
    /// Little-endian bytes already in `dtype`, written as they are.
    Raw(Cow<'a, [u8]>),
    /// f32 values, encoded to `dtype` (round to nearest even; exact for integers).
    F32(&'a [f32]),
    /// f64 values, encoded to `dtype` with a single rounding.
    F64(&'a [f64]),
}

/// Everything that can go wrong reading, writing or decoding safetensors. Each
/// validation variant's message starts with the rule it enforces.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    /// The file could not be opened or read.
    #[error("cannot read {}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Writing the output failed.
    #[error("write failed")]
    Write(#[source] io::Error),
    /// The atomic output file could not be created or committed.
    #[error(transparent)]
    Atomic(#[from] AtomicError),
    /// Rule 1: the file is shorter than the 8-byte length prefix.
    #[error(
        "rule 1 (header length): the file is {size} bytes, shorter than the 8-byte header length"
    )]
    TooShort {
        /// File size.
        size: u64,
    },
    /// Rule 1: N is larger than 100,000,000 (with what the file looks like instead).
    #[error(
        "rule 1 (header length): {}header length {n} exceeds the limit of {MAX_HEADER_SIZE} bytes",
        .looks_like.map(|w| format!("not a safetensors file: {w}: ")).unwrap_or_default()
    )]
    HeaderTooLarge {
        /// The header length read from the file.
        n: u64,
        /// What the first bytes look like, when they are a well-known other format.
        looks_like: Option<&'static str>,
    },
    /// Rule 1: 8 + N is past the end of the file.
    #[error(
        "rule 1 (header length): a header of {n} bytes runs past the end of the {size}-byte file"
    )]
    HeaderPastEnd {
        /// The header length.
        n: u64,
        /// File size.
        size: u64,
    },
    /// Rule 2: the header is not valid UTF-8.
    #[error("rule 2 (UTF-8): header byte {offset} is not valid UTF-8")]
    NotUtf8 {
        /// Offset inside the header.
        offset: usize,
    },
    /// Rule 2: the header is not valid JSON.
    #[error("rule 2 (JSON): {message}")]
    Json {
        /// The parser's message.
        message: String,
    },
    /// Rule 2: the header is valid JSON but not an object.
    #[error("rule 2 (JSON object): the header is not a JSON object")]
    NotObject,
    /// Rule 2 (strict): a key appears twice.
    #[error("rule 2 (duplicate key): key {} appears twice {place}", quote(.key))]
    DuplicateKey {
        /// The key.
        key: String,
        /// Where: the header, `__metadata__` or a tensor entry.
        place: String,
    },
    /// Strict: something other than whitespace follows the header object.
    #[error("strict (trailing bytes): non-whitespace follows the header object ({detail})")]
    TrailingCharacters {
        /// Where the parser found it.
        detail: String,
    },
    /// Rule 3: `__metadata__` is not an object.
    #[error("rule 3 (metadata): __metadata__ is not an object of strings")]
    MetadataNotObject,
    /// Rule 3: a metadata value is not a string.
    #[error("rule 3 (metadata): the value of key {} is not a string", quote(.key))]
    MetadataNotString {
        /// The metadata key.
        key: String,
    },
    /// Rule 4: a tensor entry is not an object.
    #[error("rule 4 (tensor entry): tensor {}: the entry is not an object", quote(.tensor))]
    EntryNotObject {
        /// Tensor name.
        tensor: String,
    },
    /// Strict: a tensor entry has a key other than dtype, shape, data_offsets.
    #[error("strict (entry keys): tensor {}: unknown key {} (only dtype, shape, data_offsets)", quote(.tensor), quote(.key))]
    UnknownKey {
        /// Tensor name.
        tensor: String,
        /// The extra key.
        key: String,
    },
    /// Rule 4: a tensor entry lacks one of its three keys.
    #[error("rule 4 (tensor entry): tensor {}: missing key {key}", quote(.tensor))]
    MissingKey {
        /// Tensor name.
        tensor: String,
        /// The missing key.
        key: &'static str,
    },
    /// Rule 4: the dtype name is not one of the 22 (case-sensitive).
    #[error("rule 4 (dtype): tensor {}: unknown dtype {}", quote(.tensor), quote(.dtype))]
    UnknownDtype {
        /// Tensor name.
        tensor: String,
        /// The name found (or a description of a non-string).
        dtype: String,
    },
    /// Rule 4: the shape is not a list of non-negative integers.
    #[error("rule 4 (shape): tensor {}: {detail}", quote(.tensor))]
    BadShape {
        /// Tensor name.
        tensor: String,
        /// What is wrong.
        detail: String,
    },
    /// Rule 4: data_offsets is not [begin, end] with integers begin <= end.
    #[error("rule 4 (data_offsets): tensor {}: {detail}", quote(.tensor))]
    BadOffsets {
        /// Tensor name.
        tensor: String,
        /// What is wrong.
        detail: String,
    },
    /// Rule 4: the element or byte count overflows 64 bits.
    #[error("rule 4 (overflow): tensor {}: the size of shape {shape:?} overflows 64 bits", quote(.tensor))]
    Overflow {
        /// Tensor name.
        tensor: String,
        /// The shape.
        shape: Vec<u64>,
    },
    /// Rule 4: a sub-byte dtype whose element count does not fill whole bytes.
    #[error("rule 4 (sub-byte size): tensor {}: {numel} elements of {dtype} are not a whole number of bytes", quote(.tensor))]
    SubByte {
        /// Tensor name.
        tensor: String,
        /// The dtype.
        dtype: Dtype,
        /// Element count.
        numel: u64,
    },
    /// Rule 4: end - begin differs from the byte count of dtype and shape.
    #[error("rule 4 (byte count): tensor {}: data_offsets span {actual} bytes but {dtype} {shape:?} needs {expected}", quote(.tensor))]
    ByteCount {
        /// Tensor name.
        tensor: String,
        /// The dtype.
        dtype: Dtype,
        /// The shape.
        shape: Vec<u64>,
        /// Bytes the dtype and shape need.
        expected: u64,
        /// Bytes the offsets span.
        actual: u64,
    },
    /// Rule 5: the tensors do not tile the data buffer (gap, overlap, past the end,
    /// trailing bytes).
    #[error("rule 5 (tiling): tensor {}: {detail}", quote(.tensor))]
    Tiling {
        /// The tensor where the tiling breaks (`<none>` for an empty header).
        tensor: String,
        /// What is wrong.
        detail: String,
    },
    /// Writer: `__metadata__` cannot be a tensor name.
    #[error("writer: the tensor name __metadata__ is reserved")]
    ReservedName,
    /// Writer: two tensors share a name.
    #[error("writer: tensor {} appears twice", quote(.tensor))]
    DuplicateTensor {
        /// Tensor name.
        tensor: String,
    },
    /// Writer: the data does not match dtype and shape.
    #[error("writer: tensor {}: {actual} {unit} given but {dtype} {shape:?} needs {expected}", quote(.tensor))]
    DataLength {
        /// Tensor name.
        tensor: String,
        /// The dtype.
        dtype: Dtype,
        /// The shape.
        shape: Vec<u64>,
        /// What the dtype and shape need.
        expected: u64,
        /// What was given.
        actual: u64,
        /// "bytes" or "values".
        unit: &'static str,
    },
    /// Writer: the target dtype takes raw bytes only (no encoder from numbers).
    #[error("writer: tensor {}: {dtype} takes raw bytes only, not numbers", quote(.tensor))]
    RawOnly {
        /// Tensor name.
        tensor: String,
        /// The dtype.
        dtype: Dtype,
    },
    /// Encoding: a value beyond the F8_E4M3 range (|x| > 448 or infinite).
    #[error("encode: tensor {}: value {value} at index {index} is beyond the {dtype} range of +-448", quote(.tensor))]
    OutOfRange {
        /// Tensor name.
        tensor: String,
        /// Element index (flat, row-major).
        index: u64,
        /// The value.
        value: f64,
        /// The target dtype.
        dtype: Dtype,
    },
    /// Encoding: a value not exactly representable in an integer or BOOL dtype.
    #[error("encode: tensor {}: value {value} at index {index} is not exactly representable in {dtype}", quote(.tensor))]
    NotExact {
        /// Tensor name.
        tensor: String,
        /// Element index.
        index: u64,
        /// The value.
        value: f64,
        /// The target dtype.
        dtype: Dtype,
    },
    /// Writer: the header would exceed the reader limit.
    #[error("writer: the header would be {n} bytes, over the limit of {MAX_HEADER_SIZE}")]
    HeaderTooLargeToWrite {
        /// The header length.
        n: u64,
    },
    /// No tensor of that name in the file.
    #[error("no tensor named {}", quote(.tensor))]
    NoSuchTensor {
        /// The name asked for.
        tensor: String,
    },
    /// The dtype has no defined decoding (packed sub-byte).
    #[error("tensor {}: {dtype} values cannot be decoded to the requested type (packed sub-byte dtypes are raw bytes only)", quote(.tensor))]
    CannotDecode {
        /// Tensor name.
        tensor: String,
        /// The dtype.
        dtype: Dtype,
    },
    /// `convert` was asked for a dtype it cannot write.
    #[error(
        "cannot convert to {dtype}: the target must be F64, F32, BF16, F16, F8_E4M3 or F8_E5M2"
    )]
    BadTarget {
        /// The dtype asked for.
        dtype: Dtype,
    },
    /// The output would overwrite the input.
    #[error("refusing to write over the input {}", .path.display())]
    SameFile {
        /// The path.
        path: PathBuf,
    },
    /// A layout was applied to a list that does not hold one item per spec it was
    /// computed from (a caller's bug, reported rather than skipped).
    #[error("internal: a layout of {specs} tensors was applied to {items} items")]
    LayoutMismatch {
        /// Specs the layout was computed from.
        specs: usize,
        /// Items given.
        items: usize,
    },
    /// The file changed size between reading its header and mapping it.
    #[error("{} changed size while being read ({expected} then {actual} bytes)", .path.display())]
    Changed {
        /// The file.
        path: PathBuf,
        /// Size when the header was read.
        expected: u64,
        /// Size when mapped.
        actual: u64,
    },
}

impl SafetensorsError {
    /// A short, stable identifier of the rule broken (for `--json` reports); None for
    /// operational failures.
    pub fn rule(&self) -> Option<&'static str> {
        use SafetensorsError as E;
        Some(match self {
            E::Io { .. }
            | E::Write(_)
            | E::Atomic(_)
            | E::Changed { .. }
            | E::LayoutMismatch { .. }
            | E::BadTarget { .. }
            | E::SameFile { .. } => return None,
            E::TooShort { .. } | E::HeaderTooLarge { .. } | E::HeaderPastEnd { .. } => {
                "rule-1-header-length"
            }
            E::NotUtf8 { .. } => "rule-2-utf8",
            E::Json { .. } | E::NotObject => "rule-2-json",
            E::DuplicateKey { .. } => "rule-2-duplicate-key",
            E::TrailingCharacters { .. } => "strict-trailing-bytes",
            E::MetadataNotObject | E::MetadataNotString { .. } => "rule-3-metadata",
            E::EntryNotObject { .. } | E::MissingKey { .. } => "rule-4-tensor-entry",
            E::UnknownKey { .. } => "strict-entry-keys",
            E::UnknownDtype { .. } => "rule-4-dtype",
            E::BadShape { .. } => "rule-4-shape",
            E::BadOffsets { .. } => "rule-4-data-offsets",
            E::Overflow { .. } => "rule-4-overflow",
            E::SubByte { .. } => "rule-4-sub-byte-size",
            E::ByteCount { .. } => "rule-4-byte-count",
            E::Tiling { .. } => "rule-5-tiling",
            E::ReservedName => "writer-reserved-name",
            E::DuplicateTensor { .. } => "writer-duplicate-tensor",
            E::DataLength { .. } => "writer-data-length",
            E::RawOnly { .. } => "writer-raw-only",
            E::OutOfRange { .. } => "encode-out-of-range",
            E::NotExact { .. } => "encode-not-exact",
            E::HeaderTooLargeToWrite { .. } => "writer-header-length",
            E::NoSuchTensor { .. } => "no-such-tensor",
            E::CannotDecode { .. } => "cannot-decode",
        })
    }

    /// The tensor the error is about, when there is one.
    pub fn tensor(&self) -> Option<&str> {
        use SafetensorsError as E;
        match self {
            E::EntryNotObject { tensor }
            | E::UnknownKey { tensor, .. }
            | E::MissingKey { tensor, .. }
            | E::UnknownDtype { tensor, .. }
            | E::BadShape { tensor, .. }
            | E::BadOffsets { tensor, .. }
            | E::Overflow { tensor, .. }
            | E::SubByte { tensor, .. }
            | E::ByteCount { tensor, .. }
            | E::Tiling { tensor, .. }
            | E::DuplicateTensor { tensor }
            | E::DataLength { tensor, .. }
            | E::RawOnly { tensor, .. }
            | E::OutOfRange { tensor, .. }
            | E::NotExact { tensor, .. }
            | E::NoSuchTensor { tensor }
            | E::CannotDecode { tensor, .. } => Some(tensor),
            _ => None,
        }
    }
}

impl Failure for SafetensorsError {
    fn kind(&self) -> FailureKind {
        match self {
            SafetensorsError::Io { .. }
            | SafetensorsError::Write(_)
            | SafetensorsError::Atomic(_)
            | SafetensorsError::Changed { .. }
            | SafetensorsError::LayoutMismatch { .. }
            | SafetensorsError::BadTarget { .. }
            | SafetensorsError::SameFile { .. } => FailureKind::Operational,
            SafetensorsError::TooShort { .. }
            | SafetensorsError::HeaderTooLarge { .. }
            | SafetensorsError::HeaderPastEnd { .. }
            | SafetensorsError::Json { .. }
            | SafetensorsError::NotUtf8 { .. }
            | SafetensorsError::NotObject
            | SafetensorsError::DuplicateKey { .. }
            | SafetensorsError::TrailingCharacters { .. }
            | SafetensorsError::MetadataNotObject
            | SafetensorsError::MetadataNotString { .. }
            | SafetensorsError::EntryNotObject { .. }
            | SafetensorsError::UnknownKey { .. }
            | SafetensorsError::MissingKey { .. }
            | SafetensorsError::UnknownDtype { .. }
            | SafetensorsError::BadShape { .. }
            | SafetensorsError::BadOffsets { .. }
            | SafetensorsError::Overflow { .. }
            | SafetensorsError::SubByte { .. }
            | SafetensorsError::ByteCount { .. }
            | SafetensorsError::Tiling { .. }
            | SafetensorsError::ReservedName
            | SafetensorsError::DuplicateTensor { .. }
            | SafetensorsError::DataLength { .. }
            | SafetensorsError::RawOnly { .. }
            | SafetensorsError::OutOfRange { .. }
            | SafetensorsError::NotExact { .. }
            | SafetensorsError::HeaderTooLargeToWrite { .. }
            | SafetensorsError::NoSuchTensor { .. }
            | SafetensorsError::CannotDecode { .. } => FailureKind::Invalid,
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod golden_tests;
