//! The shard format of tokens.md: a 1024-byte header of 256 little-endian int32
//! (magic, version, id count n, vocabulary size V, then zeros), then n ids as
//! little-endian uint16 (version 1) or uint32 (version 2, or llm.c's Llama-3 layout:
//! magic 20240801 version 7).
//!
//! Invariants: a `Shard` exists only for a file whose header, exact size and every id
//! (against V, when known) were checked; its ids are read by position from the
//! descriptor that was validated (never mapped, so a file shrinking underneath is an
//! error, not SIGBUS) and never copied whole. A `ShardWriter` writes 20240520 version 1 for V <= 65,536 and, above, the
//! Llama-3 layout (or version 2 on request), always recording V; atomically, in bounded
//! memory, refusing any id at or above its vocabulary.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use serde::Serialize;

pub use super::writer::ShardWriter;
use super::TokensError;

mod file;

pub use file::Shard;

/// Bytes in the header.
pub const HEADER_BYTES: usize = 1024;
/// Bytes per header word.
const WORD_BYTES: usize = 4;
/// The first header word that is reserved (must be 0 in 20240520 shards).
const FIRST_RESERVED_WORD: usize = 4;
/// ShardHeader word 0 of the shards tlio reads and writes (llm.c's GPT-2 format).
pub const MAGIC: i32 = 20240520;
/// ShardHeader word 0 of llm.c's Llama-3 shards.
pub const LLAMA3_MAGIC: i32 = 20240801;
/// The only version of llm.c's Llama-3 shards (uint32 ids).
pub const LLAMA3_VERSION: i32 = 7;
/// Version of 20240520 shards with uint16 ids.
const VERSION_U16: i32 = 1;
/// Version of 20240520 shards with uint32 ids.
const VERSION_U32: i32 = 2;
/// The largest vocabulary whose ids all fit in uint16 (ids 0..=65535).
pub const U16_VOCAB_LIMIT: u32 = 65536;
/// The largest id count, and vocabulary size, a signed 32-bit header word records.
pub const MAX_COUNT: u64 = i32::MAX as u64;

/// How the ids of a shard are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum IdDtype {
    /// Little-endian uint16 (version 1).
    #[serde(rename = "uint16")]
    U16,
    /// Little-endian uint32 (version 2, and Llama-3 version 7).
    #[serde(rename = "uint32")]
    U32,
}

impl IdDtype {
    /// Bytes per id.
    pub fn itemsize(self) -> usize {
        match self {
            IdDtype::U16 => 2,
            IdDtype::U32 => 4,
        }
    }

    /// The name shown to users.
    pub fn name(self) -> &'static str {
        match self {
            IdDtype::U16 => "uint16",
            IdDtype::U32 => "uint32",
        }
    }
}

/// Which header a shard of uint32 ids (V > 65,536) is written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// llm.c's Llama-3 layout (magic 20240801, version 7), the default: llm.c's readers
    /// (`dataloader.h`, `train_llama3.py`) accept no other uint32 shard.
    #[default]
    Llama3,
    /// tlio's 20240520 version 2 (`--format v2`).
    V2,
}

/// A validated shard header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardHeader {
    /// Word 0: `MAGIC` or `LLAMA3_MAGIC`.
    pub magic: i32,
    /// Word 1.
    pub version: i32,
    /// How the ids are stored, from magic and version.
    pub dtype: IdDtype,
    /// Word 2: the number of ids.
    pub count: u64,
    /// Word 3: the vocabulary size, `None` when the file records 0 ("not recorded").
    pub vocab: Option<u32>,
}

impl ShardHeader {
    /// The header tlio writes by default for `count` ids of vocabulary `vocab`:
    /// 20240520 version 1 when `vocab <= 65536`, else llm.c's Llama-3 layout.
    pub fn for_ids(count: u64, vocab: u32) -> Result<ShardHeader, TokensError> {
        ShardHeader::for_layout(count, vocab, Layout::default())
    }

    /// The header for `count` ids of vocabulary `vocab`: 20240520 version 1 when
    /// `vocab <= 65536`, else the uint32 layout `layout`. V is recorded in word 3 either
    /// way (llm.c ignores that word).
    pub fn for_layout(count: u64, vocab: u32, layout: Layout) -> Result<ShardHeader, TokensError> {
        check_shard_vocab(u64::from(vocab))?;
        if count > MAX_COUNT {
            return Err(TokensError::BadOptions(format!(
                "{count} ids do not fit one shard (at most {MAX_COUNT})"
            )));
        }
        let (magic, version, dtype) = match layout {
            _ if vocab <= U16_VOCAB_LIMIT => (MAGIC, VERSION_U16, IdDtype::U16),
            Layout::Llama3 => (LLAMA3_MAGIC, LLAMA3_VERSION, IdDtype::U32),
            Layout::V2 => (MAGIC, VERSION_U32, IdDtype::U32),
        };
        Ok(ShardHeader {
            magic,
            version,
            dtype,
            count,
            vocab: Some(vocab),
        })
    }

    /// The exact file size this header implies, `None` if it overflows u64.
    pub fn file_size(&self) -> Option<u64> {
        self.count
            .checked_mul(self.dtype.itemsize() as u64)?
            .checked_add(HEADER_BYTES as u64)
    }

    /// The 1024 header bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_BYTES] {
        let mut bytes = [0u8; HEADER_BYTES];
        // Every field was range-checked when the header was built or parsed, so the
        // conversions to i32 cannot fail; 0 stands for "not recorded".
        let count = i32::try_from(self.count).unwrap_or(0);
        let vocab = self.vocab.and_then(|v| i32::try_from(v).ok()).unwrap_or(0);
        let (words, _) = bytes.as_chunks_mut::<WORD_BYTES>();
        for (word, value) in words
            .iter_mut()
            .zip([self.magic, self.version, count, vocab])
        {
            *word = value.to_le_bytes();
        }
        bytes
    }

    /// Parse and validate the header of `path`, whose size is `size`.
    pub fn parse(
        path: &Path,
        bytes: &[u8; HEADER_BYTES],
        size: u64,
    ) -> Result<ShardHeader, TokensError> {
        let (words, _) = bytes.as_chunks::<WORD_BYTES>();
        let word = |i: usize| words.get(i).map_or(0, |w| i32::from_le_bytes(*w));
        let (magic, version) = (word(0), word(1));
        let bad_version = |expected| TokensError::BadVersion {
            path: path.to_path_buf(),
            magic,
            version,
            expected,
        };
        let dtype = match (magic, version) {
            (MAGIC, VERSION_U16) => IdDtype::U16,
            (MAGIC, VERSION_U32) => IdDtype::U32,
            (LLAMA3_MAGIC, LLAMA3_VERSION) => IdDtype::U32,
            (MAGIC, _) => return Err(bad_version("1 or 2")),
            (LLAMA3_MAGIC, _) => return Err(bad_version("7")),
            _ => {
                return Err(TokensError::BadMagic {
                    path: path.to_path_buf(),
                    magic,
                })
            }
        };
        let count = u64::try_from(word(2)).map_err(|_| TokensError::NegativeCount {
            path: path.to_path_buf(),
            count: word(2),
        })?;
        let vocab = u32::try_from(word(3)).map_err(|_| TokensError::NegativeVocab {
            path: path.to_path_buf(),
            vocab: word(3),
        })?;
        if magic == MAGIC {
            for (index, w) in words.iter().enumerate().skip(FIRST_RESERVED_WORD) {
                let value = i32::from_le_bytes(*w);
                if value != 0 {
                    return Err(TokensError::Reserved {
                        path: path.to_path_buf(),
                        word: index,
                        value,
                    });
                }
            }
        }
        let header = ShardHeader {
            magic,
            version,
            dtype,
            count,
            vocab: (vocab != 0).then_some(vocab),
        };
        let itemsize = dtype.itemsize() as u64;
        match header.file_size() {
            Some(expected) if expected == size => Ok(header),
            expected => Err(TokensError::SizeMismatch {
                path: path.to_path_buf(),
                count,
                itemsize,
                expected: expected.unwrap_or(u64::MAX),
                actual: size,
            }),
        }
    }
}

/// What `tokens header` shows of one file: its size, the first four header words when
/// the file has them (so an invalid file still shows what it claims), and the verdict.
#[derive(Debug)]
pub struct HeaderReport {
    /// The file's size in bytes.
    pub size: u64,
    /// Words 0..4 (magic, version, count, vocabulary) when the file has 16 bytes.
    pub words: Option<[i32; 4]>,
    /// The validated header, or why it does not validate.
    pub header: Result<ShardHeader, TokensError>,
}

pub(super) fn io_err(path: &Path) -> impl Fn(io::Error) -> TokensError + '_ {
    move |error| TokensError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Check a vocabulary size given by a caller: 1 to `MAX_COUNT`.
pub(crate) fn check_shard_vocab(vocab: u64) -> Result<u32, TokensError> {
    match u32::try_from(vocab) {
        Ok(v) if v >= 1 && u64::from(v) <= MAX_COUNT => Ok(v),
        _ => Err(TokensError::BadVocab { vocab }),
    }
}

/// Read up to 1024 header bytes of an open file; returns how many were read.
fn read_header_bytes(
    file: &mut File,
    path: &Path,
    buf: &mut [u8; HEADER_BYTES],
) -> Result<usize, TokensError> {
    let mut got = 0;
    while let Some(rest) = buf.get_mut(got..) {
        if rest.is_empty() {
            break;
        }
        match file.read(rest) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(path)(e)),
        }
    }
    Ok(got)
}

/// Open `file` and validate its header against the file size, reading only the header;
/// errors name `shown`.
fn open_and_parse(file: &Path, shown: &Path) -> Result<(File, u64, ShardHeader), TokensError> {
    let (file, report) = read_report(file, shown)?;
    let header = report.header?;
    Ok((file, report.size, header))
}

/// The header report of the file at `path`, errors naming `shown` (the same path, or
/// the URL a local copy was made from).
fn read_report(path: &Path, shown: &Path) -> Result<(File, HeaderReport), TokensError> {
    let mut file = crate::files::open_regular(path).map_err(io_err(shown))?;
    let size = file.metadata().map_err(io_err(shown))?.len();
    let mut buf = [0u8; HEADER_BYTES];
    let got = read_header_bytes(&mut file, shown, &mut buf)?;
    Ok((file, report_from_bytes(shown, &buf, got, size)))
}

/// The report of a shard of `size` bytes whose first `got` bytes (at most 1024) are in
/// `buf` (the rest zero): for a reader that fetched them itself (a range request).
pub fn report_from_bytes(
    path: &Path,
    buf: &[u8; HEADER_BYTES],
    got: usize,
    size: u64,
) -> HeaderReport {
    let words = buf.get(..16).filter(|_| got >= 16).map(|w| {
        let (chunks, _) = w.as_chunks::<WORD_BYTES>();
        let mut out = [0i32; 4];
        for (o, c) in out.iter_mut().zip(chunks) {
            *o = i32::from_le_bytes(*c);
        }
        out
    });
    let header = if got < HEADER_BYTES {
        Err(TokensError::Short {
            path: path.to_path_buf(),
            size: got as u64,
        })
    } else {
        ShardHeader::parse(path, buf, size)
    };
    HeaderReport {
        size,
        words,
        header,
    }
}

/// Read and validate the header of `path` (1024 bytes read, whatever the file's size).
/// `Err` only when the file cannot be opened or read; a file that does not validate is
/// a report whose `header` is the error.
pub fn inspect_header(path: &Path) -> Result<HeaderReport, TokensError> {
    read_report(path, path).map(|(_, report)| report)
}

/// The validated header of `path`, reading only its 1024 header bytes.
pub fn read_shard_header(path: &Path) -> Result<ShardHeader, TokensError> {
    inspect_header(path)?.header
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A shard file with an arbitrary header and payload.
    pub(crate) fn raw_shard(dir: &Path, name: &str, words: &[i32], payload: &[u8]) -> PathBuf {
        let mut bytes = vec![0u8; HEADER_BYTES];
        for (i, w) in words.iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        bytes.extend_from_slice(payload);
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn u16_payload(ids: &[u16]) -> Vec<u8> {
        ids.iter().flat_map(|i| i.to_le_bytes()).collect()
    }

    fn u32_payload(ids: &[u32]) -> Vec<u8> {
        ids.iter().flat_map(|i| i.to_le_bytes()).collect()
    }

    fn write_shard(path: &Path, ids: &[u32], vocab: u32) -> ShardHeader {
        let mut w = ShardWriter::create(path, vocab).unwrap();
        w.push(ids).unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn test_header_worked_example() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ex.bin");
        let header = write_shard(&path, &[1, 2, 3], 256);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 1030);
        assert_eq!(
            &bytes[..16],
            &[0x88, 0xd8, 0x34, 0x01, 0x01, 0, 0, 0, 0x03, 0, 0, 0, 0x00, 0x01, 0, 0]
        );
        assert!(bytes[16..1024].iter().all(|&b| b == 0), "1008 zero bytes");
        assert_eq!(&bytes[1024..], &[1, 0, 2, 0, 3, 0]);
        assert_eq!(header.version, 1);
        assert_eq!(read_shard_header(&path).unwrap(), header);
        let shard = Shard::open(&path, None).unwrap();
        assert_eq!(shard.ids(0..3).unwrap(), [1, 2, 3]);
        assert_eq!(shard.vocab(), Some(256));
    }

    #[test]
    fn test_version_2_reads_uint32() {
        let dir = tempfile::tempdir().unwrap();
        let ids = [0u32, 65535, 65536, 70000, 99_999];
        let path = dir.path().join("v2.bin");
        let mut w = ShardWriter::create_with(&path, 100_000, Layout::V2).unwrap();
        w.push(&ids).unwrap();
        let header = w.finish().unwrap();
        assert_eq!(
            (header.magic, header.version, header.dtype),
            (MAGIC, 2, IdDtype::U32)
        );
        // By default, V > 65536 takes llm.c's Llama-3 layout, read back the same way.
        let llama = dir.path().join("llama3.bin");
        let h = write_shard(&llama, &ids, 100_000);
        assert_eq!(
            (h.magic, h.version, h.dtype),
            (LLAMA3_MAGIC, 7, IdDtype::U32)
        );
        let bytes = std::fs::read(&llama).unwrap();
        assert_eq!(
            bytes[12..16],
            100_000i32.to_le_bytes(),
            "V recorded in word 3"
        );
        let s = Shard::open(&llama, None).unwrap();
        assert_eq!(
            (s.ids(0..5).unwrap(), s.vocab()),
            (ids.to_vec(), Some(100_000))
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1024 + 5 * 4);
        let shard = Shard::open(&path, None).unwrap();
        assert_eq!(shard.len(), 5);
        assert_eq!(shard.ids(0..5).unwrap(), ids);
        assert_eq!(shard.get(3).unwrap(), 70000);
        let (mut x, mut y, mut scratch) = ([0i64; 2], [0i64; 2], Vec::new());
        shard.read_window(2, &mut x, &mut y, &mut scratch).unwrap();
        assert_eq!((x, y), ([65536, 70000], [70000, 99_999]));
        // A vocabulary up to 65536 still fits uint16.
        let h = write_shard(&dir.path().join("v1.bin"), &[65535], 65536);
        assert_eq!((h.version, h.dtype), (1, IdDtype::U16));
        // llm.c's Llama-3 shards: magic 20240801, version 7, uint32, V not recorded.
        let path = raw_shard(
            dir.path(),
            "llama3.bin",
            &[LLAMA3_MAGIC, 7, 2],
            &u32_payload(&[128_000, 5]),
        );
        let shard = Shard::open(&path, None).unwrap();
        assert_eq!(shard.header().dtype, IdDtype::U32);
        assert_eq!(shard.vocab(), None);
        assert_eq!(shard.ids(0..2).unwrap(), [128_000, 5]);
        // The caller's vocabulary is checked when the file records none.
        let err = Shard::open(&path, Some(128_000)).unwrap_err();
        assert!(matches!(
            err,
            TokensError::IdOutOfVocab {
                index: 0,
                id: 128_000,
                ..
            }
        ));
    }

    #[test]
    fn shard_reads_ids_by_position_and_refuses_ranges_past_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.bin");
        let ids: Vec<u32> = (0..1000).map(|i| i % 256).collect();
        write_shard(&path, &ids, 256);
        let shard = Shard::open(&path, Some(256)).unwrap();
        assert_eq!(shard.len(), 1000);
        assert_eq!(
            shard.ids(250..260).unwrap(),
            (250..260).map(|i| i % 256).collect::<Vec<_>>()
        );
        assert_eq!(shard.get(999).unwrap(), 999 % 256);
        assert!(matches!(
            shard.get(1000),
            Err(TokensError::RangePastEnd { start: 1000, .. })
        ));
        assert!(shard.ids(999..1001).is_err());
        let (mut x, mut y, mut scratch) = ([0i64; 2], [0i64; 2], Vec::new());
        shard
            .read_window(997, &mut x, &mut y, &mut scratch)
            .unwrap();
        assert_eq!((x, y), ([997 % 256, 998 % 256], [998 % 256, 999 % 256]));
        assert!(shard
            .read_window(998, &mut x, &mut y, &mut scratch)
            .is_err());
        // Reading never writes: the file is unchanged after use.
        drop(shard);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 3024);
    }

    /// A shard truncated or rewritten after it was opened is an error naming it at the
    /// next read, never a signal (a memory map would raise SIGBUS on the lost pages).
    #[test]
    fn a_shard_changed_underneath_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("live.bin");
        write_shard(&path, &(0..5000).map(|i| i % 300).collect::<Vec<_>>(), 300);
        let shard = Shard::open(&path, None).unwrap();
        shard.check_unchanged().unwrap();
        // Truncate in place, as `open(p, "wb")` does before a rewrite.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(2000)
            .unwrap();
        let (mut x, mut y, mut scratch) = ([0i64; 4], [0i64; 4], Vec::new());
        let e = shard
            .read_window(4000, &mut x, &mut y, &mut scratch)
            .unwrap_err();
        assert!(matches!(e, TokensError::ShardChanged { .. }), "{e}");
        assert!(e.to_string().contains("live.bin"), "{e}");
        let e = shard.check_unchanged().unwrap_err();
        assert!(
            e.to_string().contains("live.bin") && e.to_string().contains("size"),
            "{e}"
        );
        // Ids past the vocabulary written in place are caught at the read.
        std::fs::write(&path, [vec![0u8; 1024], vec![0xff; 9000]].concat()).unwrap();
        let e = shard
            .read_window(0, &mut x, &mut y, &mut scratch)
            .unwrap_err();
        assert!(
            e.to_string().contains("65535") && e.to_string().contains("300"),
            "{e}"
        );
    }

    #[test]
    #[allow(
        clippy::too_many_lines,
        reason = "a table of bad files, one row per rule (a seed test name)"
    )]
    fn test_rejects_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ok = u16_payload(&[1, 2, 3]);
        let cases: Vec<(PathBuf, &str)> = vec![
            (
                raw_shard(d, "magic.bin", &[20240521, 1, 3, 256], &ok),
                "bad magic 20240521",
            ),
            (
                raw_shard(d, "version.bin", &[MAGIC, 3, 3, 256], &ok),
                "unsupported version 3",
            ),
            (
                raw_shard(d, "llama.bin", &[LLAMA3_MAGIC, 1, 3], &ok),
                "unsupported version 1",
            ),
            (
                raw_shard(
                    d,
                    "long.bin",
                    &[MAGIC, 1, 3, 256],
                    &[ok.clone(), vec![0]].concat(),
                ),
                "size mismatch",
            ),
            (
                raw_shard(d, "shortids.bin", &[MAGIC, 1, 3, 256], &ok[..4]),
                "size mismatch",
            ),
            (
                raw_shard(d, "vocab.bin", &[MAGIC, 1, 3, 3], &ok),
                "id 3 at index 2 is not below the vocabulary size 3",
            ),
            (
                raw_shard(d, "negcount.bin", &[MAGIC, 1, -1, 256], &ok),
                "negative id count -1",
            ),
            (
                raw_shard(d, "hugecount.bin", &[MAGIC, 2, i32::MAX, 256], &ok),
                "size mismatch",
            ),
            (
                raw_shard(d, "negvocab.bin", &[MAGIC, 1, 3, -5], &ok),
                "negative vocabulary size -5",
            ),
            (
                raw_shard(d, "reserved.bin", &[MAGIC, 1, 3, 256, 0, 0, 0, 7], &ok),
                "reserved header word 7 is 7",
            ),
        ];
        for (path, want) in &cases {
            let err = Shard::open(path, None).unwrap_err().to_string();
            assert!(err.contains(want), "{}: {err}", path.display());
            assert!(err.contains(&path.display().to_string()), "{err}");
        }
        // A short file: less than the header.
        let short = d.join("short.bin");
        std::fs::write(&short, [0x88, 0xd8, 0x34, 0x01, 1, 0]).unwrap();
        let err = Shard::open(&short, None).unwrap_err();
        assert!(matches!(err, TokensError::Short { size: 6, .. }), "{err}");
        let report = inspect_header(&short).unwrap();
        assert_eq!((report.size, report.words), (6, None));
        // ShardHeader-only reading does not scan ids: the out-of-vocabulary file's header is
        // fine, its ids are not.
        assert!(read_shard_header(&cases[5].0).is_ok());
        // A missing file is an I/O error, not a validation failure.
        let missing = Shard::open(&d.join("missing.bin"), None).unwrap_err();
        assert!(matches!(missing, TokensError::Io { .. }));
        use crate::failure::{Failure, FailureKind};
        assert_eq!(missing.kind(), FailureKind::Operational);
        assert_eq!(
            Shard::open(&short, None).unwrap_err().kind(),
            FailureKind::Invalid
        );
        // A given vocabulary must equal the recorded one.
        let good = raw_shard(d, "good.bin", &[MAGIC, 1, 3, 256], &ok);
        let err = Shard::open(&good, Some(255)).unwrap_err();
        assert!(matches!(
            err,
            TokensError::VocabMismatch {
                recorded: 256,
                expected: 255,
                ..
            }
        ));
        assert!(Shard::open(&good, Some(256)).is_ok());
        assert!(matches!(
            Shard::open(&good, Some(0)),
            Err(TokensError::BadVocab { .. })
        ));
    }

    #[test]
    fn header_word_zero_vocab_is_not_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let path = raw_shard(
            dir.path(),
            "gpt2.bin",
            &[MAGIC, 1, 2],
            &u16_payload(&[50256, 7]),
        );
        let shard = Shard::open(&path, None).unwrap();
        assert_eq!(shard.vocab(), None);
        assert!(Shard::open(&path, Some(50257)).is_ok());
        assert!(Shard::open(&path, Some(50256)).is_err());
    }

    #[test]
    fn writer_refuses_bad_ids_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bin");
        let mut w = ShardWriter::create(&path, 10).unwrap();
        w.push(&[1, 2]).unwrap();
        let err = w.push(&[3, 10, 4]).unwrap_err();
        assert!(matches!(
            err,
            TokensError::IdOutOfVocab {
                index: 3,
                id: 10,
                vocab: 10,
                ..
            }
        ));
        assert_eq!(w.count(), 2);
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert!(ShardWriter::create(&path, 0).is_err());
        assert!(ShardWriter::create(&path, 1 << 31).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Any bytes at all: open either refuses them with an error or yields a shard
        /// whose every id can be read and is below its vocabulary. Never a panic.
        #[test]
        fn arbitrary_files_never_panic(
            words in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::prelude::Just(MAGIC),
                    proptest::prelude::Just(LLAMA3_MAGIC),
                    0i32..8,
                    proptest::prelude::any::<i32>(),
                ],
                0..6,
            ),
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            cut in proptest::option::of(0usize..1100),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = raw_shard(dir.path(), "f.bin", &words, &payload);
            if let Some(cut) = cut {
                let bytes = std::fs::read(&path).unwrap();
                std::fs::write(&path, &bytes[..cut.min(bytes.len())]).unwrap();
            }
            let _ = inspect_header(&path).unwrap();
            if let Ok(shard) = Shard::open(&path, None) {
                let ids = shard.ids(0..shard.len()).unwrap();
                proptest::prop_assert_eq!(ids.len() as u64, shard.header().count);
                if let Some(v) = shard.vocab() {
                    proptest::prop_assert!(ids.iter().all(|&id| id < v));
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        #[test]
        fn write_then_open_roundtrips(
            ids in proptest::collection::vec(0u32..200_000, 0..300),
            vocab in 200_000u32..300_000,
            small in proptest::bool::ANY,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("p.bin");
            let (ids, vocab) = if small {
                (ids.iter().map(|i| i % 1000).collect::<Vec<_>>(), 1000)
            } else {
                (ids, vocab)
            };
            let mut w = ShardWriter::create(&path, vocab).unwrap();
            for chunk in ids.chunks(7) {
                w.push(chunk).unwrap();
            }
            let header = w.finish().unwrap();
            let shard = Shard::open(&path, Some(vocab)).unwrap();
            proptest::prop_assert_eq!(*shard.header(), header);
            proptest::prop_assert_eq!(shard.ids(0..ids.len()).unwrap(), ids.clone());
            proptest::prop_assert_eq!(
                std::fs::metadata(&path).unwrap().len(),
                header.file_size().unwrap()
            );
        }
    }
}
