//! Header-only reading: the five reader rules of the format page plus the spec's strict
//! rules (duplicate keys anywhere, exactly three keys per entry, integers only, overflow
//! checks, nothing but whitespace after the object, string-only metadata).
//!
//! Invariants: only `8 + N` bytes are ever read, after N has been checked against the
//! limit and the file size, so a 20 GB file costs what a 1 KB one does; the JSON is
//! parsed by visitors that see every key (a map type would keep the last duplicate);
//! the first broken rule is reported with its tensor.

mod json;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::dtype::{byte_len, Dtype, SizeError};
use super::SafetensorsError;
use crate::text::quote;
use json::RawTensor;

/// Largest header length a reader accepts (rule 1).
pub const MAX_HEADER_SIZE: u64 = 100_000_000;
/// Size of the little-endian u64 header length.
pub const N_LEN: u64 = 8;
/// The reserved key of the metadata map.
pub const METADATA_KEY: &str = "__metadata__";

/// One tensor of a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The name.
    pub name: String,
    /// The dtype.
    pub dtype: Dtype,
    /// The shape, outermost first.
    pub shape: Vec<u64>,
    /// [begin, end) relative to the start of the data buffer.
    pub data_offsets: (u64, u64),
}

impl TensorInfo {
    /// Element count (checked when the header was read).
    pub fn numel(&self) -> u64 {
        super::dtype::numel(&self.shape).unwrap_or(0)
    }

    /// Byte count.
    pub fn byte_len(&self) -> u64 {
        self.data_offsets.1.saturating_sub(self.data_offsets.0)
    }
}

/// A validated header.
///
/// Invariant: `by_name` holds the positions of `tensors` ordered by name, so that
/// [`Header::get`] is a binary search, not a scan (a diff of two 80,000-tensor files
/// looks every name up). The tensors are private so that nothing can reorder or grow
/// them after [`Header::new`]: read them with [`Header::tensors`] (file order),
/// [`Header::get`] (by name) and [`Header::len`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The tensors in data-offset order (zero-size ties in canonical order).
    tensors: Vec<TensorInfo>,
    /// The metadata (empty when absent).
    pub metadata: BTreeMap<String, String>,
    /// N, the header length in bytes.
    pub header_len: u64,
    /// The size of the whole file.
    pub file_size: u64,
    /// Positions into `tensors`, sorted by tensor name.
    by_name: Vec<usize>,
    /// Whether the header has a `__metadata__` key, an empty object included.
    metadata_present: bool,
}

impl Header {
    /// A header over validated parts; indexes the tensors by name.
    pub fn new(
        tensors: Vec<TensorInfo>,
        metadata: BTreeMap<String, String>,
        header_len: u64,
        file_size: u64,
    ) -> Self {
        let mut by_name: Vec<usize> = (0..tensors.len()).collect();
        by_name.sort_by(|&a, &b| match (tensors.get(a), tensors.get(b)) {
            (Some(a), Some(b)) => a.name.cmp(&b.name),
            // Unreachable: every position is below tensors.len().
            _ => std::cmp::Ordering::Equal,
        });
        Header {
            tensors,
            metadata,
            header_len,
            file_size,
            by_name,
            metadata_present: false,
        }
    }

    /// Whether the header has a `__metadata__` key (`"__metadata__":{}` included), the
    /// distinction the reference library's `metadata()` makes between `None` and `{}`.
    pub fn has_metadata(&self) -> bool {
        self.metadata_present || !self.metadata.is_empty()
    }

    /// Offset of the data buffer in the file: 8 + N.
    pub fn data_start(&self) -> u64 {
        N_LEN + self.header_len
    }

    /// The tensors in file order: data-offset order, zero-size ties in canonical order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensors in file order, giving the header up.
    pub fn into_tensors(self) -> Vec<TensorInfo> {
        self.tensors
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when the header holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The tensor of that name (a binary search of the name index).
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        let tensor = |i: usize| self.tensors.get(i);
        let at = self
            .by_name
            .binary_search_by(|&i| match tensor(i) {
                Some(t) => t.name.as_str().cmp(name),
                None => std::cmp::Ordering::Less,
            })
            .ok()?;
        self.by_name.get(at).copied().and_then(tensor)
    }

    /// The size of the data buffer.
    pub fn data_len(&self) -> u64 {
        self.file_size.saturating_sub(self.data_start())
    }
}

/// Tensor count, parameters and bytes of one dtype (or of everything).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct Totals {
    /// The dtype (None for the grand total).
    pub dtype: Option<Dtype>,
    /// Number of tensors.
    pub tensors: u64,
    /// Number of elements.
    pub params: u64,
    /// Number of bytes.
    pub bytes: u64,
}

/// Totals by dtype in rank order, then the grand total.
pub fn totals<'a>(tensors: impl IntoIterator<Item = &'a TensorInfo>) -> (Vec<Totals>, Totals) {
    let mut by: BTreeMap<Dtype, Totals> = BTreeMap::new();
    let mut all = Totals::default();
    for t in tensors {
        let e = by.entry(t.dtype).or_insert_with(|| Totals {
            dtype: Some(t.dtype),
            ..Totals::default()
        });
        for acc in [&mut *e, &mut all] {
            acc.tensors += 1;
            acc.params = acc.params.saturating_add(t.numel());
            acc.bytes = acc.bytes.saturating_add(t.byte_len());
        }
    }
    (by.into_values().collect(), all)
}

/// Read and validate the header of the file at `path`, reading only `8 + N` bytes.
pub fn read_header(path: &Path) -> Result<Header, SafetensorsError> {
    let io = |source| SafetensorsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = crate::files::open_regular(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    read_header_from(&mut file, size).map_err(|e| match e {
        ReadFailure::Io(source) => io(source),
        ReadFailure::Invalid(e) => e,
    })
}

pub(crate) enum ReadFailure {
    Io(std::io::Error),
    Invalid(SafetensorsError),
}

/// Read the header from `file` (positioned at 0) whose total size is `size`.
pub(crate) fn read_header_from(file: &mut File, size: u64) -> Result<Header, ReadFailure> {
    check_prefix_len(size).map_err(ReadFailure::Invalid)?;
    let mut prefix = [0u8; N_LEN as usize];
    file.read_exact(&mut prefix).map_err(ReadFailure::Io)?;
    let n = u64::from_le_bytes(prefix);
    check_n(n, size)
        .map_err(|e| with_sniff(e, &prefix))
        .map_err(ReadFailure::Invalid)?;
    // n is at most MAX_HEADER_SIZE and within the file, so this allocation is bounded by
    // both the limit and the file's real size.
    let mut buf = vec![0u8; n as usize];
    file.read_exact(&mut buf).map_err(ReadFailure::Io)?;
    parse_header_bytes(&buf, size).map_err(ReadFailure::Invalid)
}

/// The header length `N` that the 8-byte `prefix` of a file of `size` bytes gives, by
/// the reader rules `read_header` applies before it reads `N` bytes (for a reader that
/// fetches the two parts itself, such as range requests to object storage).
pub fn header_len(prefix: [u8; N_LEN as usize], size: u64) -> Result<u64, SafetensorsError> {
    check_prefix_len(size)?;
    let n = u64::from_le_bytes(prefix);
    check_n(n, size).map_err(|e| with_sniff(e, &prefix))?;
    Ok(n)
}

/// What eight leading bytes look like when they are not a safetensors length prefix:
/// the formats people most often hand to a safetensors tool by mistake.
pub fn sniff(prefix: &[u8; 8]) -> Option<&'static str> {
    let word = i32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    if prefix.starts_with(b"PK\x03\x04") {
        Some("it is a zip archive (a PyTorch .pt or .bin file?)")
    } else if prefix.starts_with(b"GGUF") {
        Some("it is a GGUF file")
    } else if prefix.starts_with(b"\x93NUMPY") {
        Some("it is a NumPy .npy file")
    } else if prefix[0] == 0x80 && (2..=5).contains(&prefix[1]) {
        Some("it is a Python pickle")
    } else if word == 20240520 || word == 20240801 {
        Some("it is a token shard")
    } else if std::str::from_utf8(prefix).is_ok_and(|t| {
        t.chars()
            .all(|c| !c.is_control() || c == '\n' || c == '\r' || c == '\t')
    }) {
        Some("it starts with text")
    } else {
        None
    }
}

/// Add what the file looks like to a too-large header length.
fn with_sniff(err: SafetensorsError, prefix: &[u8; 8]) -> SafetensorsError {
    match err {
        SafetensorsError::HeaderTooLarge { n, .. } => SafetensorsError::HeaderTooLarge {
            n,
            looks_like: sniff(prefix),
        },
        other => other,
    }
}

fn check_prefix_len(size: u64) -> Result<(), SafetensorsError> {
    if size < N_LEN {
        return Err(SafetensorsError::TooShort { size });
    }
    Ok(())
}

fn check_n(n: u64, size: u64) -> Result<(), SafetensorsError> {
    if n > MAX_HEADER_SIZE {
        return Err(SafetensorsError::HeaderTooLarge {
            n,
            looks_like: None,
        });
    }
    match n.checked_add(N_LEN) {
        Some(end) if end <= size => Ok(()),
        _ => Err(SafetensorsError::HeaderPastEnd { n, size }),
    }
}

/// Validate a whole file held in memory (the header and the data).
pub fn parse_header(file: &[u8]) -> Result<Header, SafetensorsError> {
    let size = file.len() as u64;
    check_prefix_len(size)?;
    let prefix: [u8; N_LEN as usize] = file
        .get(..N_LEN as usize)
        .and_then(|p| p.try_into().ok())
        .ok_or(SafetensorsError::TooShort { size })?;
    let n = u64::from_le_bytes(prefix);
    check_n(n, size).map_err(|e| with_sniff(e, &prefix))?;
    let end = (N_LEN + n) as usize;
    let header = file
        .get(N_LEN as usize..end)
        .ok_or(SafetensorsError::HeaderPastEnd { n, size })?;
    parse_header_bytes(header, size)
}

/// Validate the N header bytes of a file of `file_size` bytes.
pub fn parse_header_bytes(header: &[u8], file_size: u64) -> Result<Header, SafetensorsError> {
    let header_len = header.len() as u64;
    let text = std::str::from_utf8(header).map_err(|e| SafetensorsError::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    let first = text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .chars()
        .next();
    if first != Some('{') {
        // Either another JSON value or no JSON at all: tell them apart for the message.
        return Err(match serde_json::from_str::<serde::de::IgnoredAny>(text) {
            Ok(_) => SafetensorsError::NotObject,
            Err(e) => SafetensorsError::Json {
                message: e.to_string(),
            },
        });
    }
    let raw = json::parse_raw(text)?;
    validate(raw, header_len, file_size)
}

fn validate(
    raw: json::RawHeader,
    header_len: u64,
    file_size: u64,
) -> Result<Header, SafetensorsError> {
    let data_len = file_size.saturating_sub(N_LEN + header_len);
    let mut tensors = raw
        .tensors
        .into_iter()
        .map(check_entry)
        .collect::<Result<Vec<_>, _>>()?;
    tensors.sort_by(|a, b| {
        a.data_offsets
            .cmp(&b.data_offsets)
            .then(a.dtype.rank().cmp(&b.dtype.rank()))
            .then(a.name.as_bytes().cmp(b.name.as_bytes()))
    });
    check_tiling(&tensors, data_len)?;
    let mut header = Header::new(tensors, raw.metadata, header_len, file_size);
    header.metadata_present = raw.metadata_present;
    Ok(header)
}

/// Rule 4 for one entry: a byte count that fits and matches its offsets.
fn check_entry(t: RawTensor) -> Result<TensorInfo, SafetensorsError> {
    let (begin, end) = t.offsets;
    let expected = match byte_len(t.dtype, &t.shape) {
        Ok(n) => n,
        Err(SizeError::Overflow) => {
            return Err(SafetensorsError::Overflow {
                tensor: t.name,
                shape: t.shape,
            })
        }
        Err(SizeError::SubByte { numel }) => {
            return Err(SafetensorsError::SubByte {
                tensor: t.name,
                dtype: t.dtype,
                numel,
            })
        }
    };
    if end < begin {
        return Err(SafetensorsError::BadOffsets {
            tensor: t.name,
            detail: format!("end {end} is before begin {begin}"),
        });
    }
    let actual = end - begin;
    if actual != expected {
        return Err(SafetensorsError::ByteCount {
            tensor: t.name,
            dtype: t.dtype,
            shape: t.shape,
            expected,
            actual,
        });
    }
    Ok(TensorInfo {
        name: t.name,
        dtype: t.dtype,
        shape: t.shape,
        data_offsets: t.offsets,
    })
}

/// Rule 5: the tensors, in data-offset order, tile the data buffer exactly.
fn check_tiling(tensors: &[TensorInfo], data_len: u64) -> Result<(), SafetensorsError> {
    let mut cursor = 0u64;
    let mut previous: Option<&str> = None;
    for t in tensors {
        let (begin, end) = t.data_offsets;
        if end > data_len {
            return Err(SafetensorsError::Tiling {
                tensor: t.name.clone(),
                detail: format!(
                    "data ends at {end}, past the end of the {data_len}-byte data buffer"
                ),
            });
        }
        if begin < cursor {
            return Err(SafetensorsError::Tiling {
                tensor: t.name.clone(),
                detail: format!(
                    "begins at {begin}, overlapping tensor {} which ends at {cursor}",
                    quote(previous.unwrap_or("<none>"))
                ),
            });
        }
        if begin > cursor {
            return Err(SafetensorsError::Tiling {
                tensor: t.name.clone(),
                detail: format!("begins at {begin}, leaving a gap after byte {cursor}"),
            });
        }
        cursor = end;
        previous = Some(&t.name);
    }
    if cursor != data_len {
        return Err(SafetensorsError::Tiling {
            tensor: previous.unwrap_or("<none>").to_string(),
            detail: format!(
                "{} trailing bytes after the last tensor (data ends at {cursor}, the buffer holds {data_len})",
                data_len - cursor
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod index_tests {
    use super::*;

    fn info(name: &str, begin: u64) -> TensorInfo {
        TensorInfo {
            name: name.to_string(),
            dtype: Dtype::U8,
            shape: vec![1],
            data_offsets: (begin, begin + 1),
        }
    }

    proptest::proptest! {
        /// The name index finds exactly what a scan finds, present or absent.
        #[test]
        fn get_agrees_with_a_scan(
            names in proptest::collection::btree_set("[a-z.]{0,6}", 0..40),
            probe in "[a-z.]{0,6}",
        ) {
            // Data-offset order is not name order: reverse the sorted names.
            let tensors: Vec<TensorInfo> = names
                .iter()
                .rev()
                .zip(0u64..)
                .map(|(n, i)| info(n, i))
                .collect();
            let header = Header::new(tensors.clone(), BTreeMap::new(), 0, 0);
            for t in &tensors {
                proptest::prop_assert_eq!(header.get(&t.name), Some(t));
            }
            let scan = tensors.iter().find(|t| t.name == probe);
            proptest::prop_assert_eq!(header.get(&probe), scan);
        }
    }
}
