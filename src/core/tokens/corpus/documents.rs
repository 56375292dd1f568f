//! Reading a pack's documents: each input file whole (`-`: standard input; `.gz` and
//! `.zst` decompressed on the fly), one JSONL line at a time (only the document's field
//! is deserialized), the string column of a Parquet file, or a line-aligned byte range
//! of a JSONL file (one part of a partitioned pack). Every document goes to `emit` in
//! input order.
//!
//! Invariants: a document is at most [`MAX_DOCUMENT_BYTES`] (it is tokenized whole);
//! a bad line or row is an error naming the input and the line, or skipped and counted
//! under `skip_bad`; without the `parquet` or `compression` feature such an input is
//! [`TokensError::NotBuilt`], never read as plain text.

use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

#[cfg(feature = "parquet")]
use parquet::basic::Type as PhysicalType;
#[cfg(feature = "parquet")]
use parquet::column::reader::ColumnReader;
#[cfg(feature = "parquet")]
use parquet::data_type::ByteArray;
#[cfg(feature = "parquet")]
use parquet::file::reader::{FileReader, SerializedFileReader};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use super::MAX_DOCUMENT_BYTES;
use crate::tokens::TokensError;

/// Parquet values read per call.
#[cfg(feature = "parquet")]
const PARQUET_BATCH: usize = 1024;

fn bad(input: impl Into<String>, reason: impl Into<String>) -> TokensError {
    TokensError::BadDocument {
        input: input.into(),
        reason: reason.into(),
    }
}

fn read_err(name: &str, error: io::Error) -> TokensError {
    // Corrupt compressed data is bad input (exit 1), like bad UTF-8; a failing file
    // under it is a read error.
    #[cfg(feature = "compression")]
    if let Some(c) = crate::tokens::compressed::corrupt_reason(&error) {
        return bad(name, c);
    }
    TokensError::Read {
        input: name.to_string(),
        error,
    }
}

/// Open `path` (`-`: standard input) for reading, decompressing `.gz` and `.zst`.
fn open_stream(path: &Path) -> Result<Box<dyn BufRead + Send>, TokensError> {
    let name = path.display().to_string();
    if path.as_os_str() == "-" {
        if crate::files::stdin_is_closed() {
            return Err(TokensError::Read {
                input: name,
                error: crate::files::stdin_closed_error(),
            });
        }
        return Ok(Box::new(BufReader::new(io::stdin())));
    }
    let compressed = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("gz" | "zst")
    );
    if compressed && !cfg!(feature = "compression") {
        return Err(TokensError::NotBuilt {
            input: name,
            feature: "compression",
        });
    }
    let file = crate::files::open_regular(path).map_err(|e| read_err(&name, e))?;
    let raw = BufReader::with_capacity(1 << 20, file);
    Ok(match path.extension().and_then(|e| e.to_str()) {
        #[cfg(feature = "compression")]
        Some("gz") => Box::new(BufReader::with_capacity(
            1 << 20,
            crate::tokens::compressed::Gzip(flate2::bufread::MultiGzDecoder::new(raw)),
        )),
        #[cfg(feature = "compression")]
        Some("zst") => Box::new(BufReader::with_capacity(
            1 << 20,
            crate::tokens::compressed::Zstd::new(raw).map_err(|e| read_err(&name, e))?,
        )),
        _ => Box::new(raw),
    })
}

/// Deserializes only the field `name` of a JSON object, as a string, skipping the rest
/// without building them; of a repeated field the last counts. `Ok(None)`: the object
/// has no such field.
struct FieldSeed<'a>(&'a str);

/// Why a JSON line has no usable document.
enum FieldError {
    NotAnObject,
    NotAString,
}

impl<'de> DeserializeSeed<'de> for FieldSeed<'_> {
    type Value = Result<Option<String>, FieldError>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FieldSeed<'_> {
    type Value = Result<Option<String>, FieldError>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found: Option<Result<String, FieldError>> = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            // A repeated field: the last one wins, as in serde_json's Value and Python's
            // json (what wrote or will read the corpus), documented in tokens.md.
            if key == self.0 {
                let value = map.next_value::<serde_json::Value>()?;
                found = Some(match value {
                    serde_json::Value::String(s) => Ok(s),
                    _ => Err(FieldError::NotAString),
                });
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found.transpose())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Err(FieldError::NotAnObject))
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Err(FieldError::NotAnObject))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Err(FieldError::NotAnObject))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Err(FieldError::NotAnObject))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Err(FieldError::NotAnObject))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Err(FieldError::NotAnObject))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Err(FieldError::NotAnObject))
    }
}

/// The document of one JSONL line, or why there is none.
fn parse_line(line: &[u8], field: &str) -> Result<String, String> {
    let mut de = serde_json::Deserializer::from_slice(line);
    let parsed = FieldSeed(field)
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v));
    match parsed {
        Err(e) => Err(format!("not JSON: {e}")),
        Ok(Err(FieldError::NotAnObject)) => Err("not a JSON object".to_string()),
        Ok(Err(FieldError::NotAString)) => Err(format!("field \"{field}\" is not a string")),
        Ok(Ok(None)) => Err(format!("no field \"{field}\"")),
        Ok(Ok(Some(doc))) => Ok(doc),
    }
}

/// Hands documents to `emit` in order, counting what `skip_bad` skipped.
pub(super) struct Reader<'a> {
    pub(super) field: &'a str,
    pub(super) skip_bad: bool,
    pub(super) skipped: u64,
}

impl Reader<'_> {
    /// Either skip (and count) a bad line or row, or fail with `error`.
    fn bad(&mut self, error: TokensError) -> Result<(), TokensError> {
        if self.skip_bad {
            self.skipped = self.skipped.saturating_add(1);
            Ok(())
        } else {
            Err(error)
        }
    }

    pub(super) fn text(
        &mut self,
        path: &Path,
        emit: &mut dyn FnMut(String) -> Result<(), TokensError>,
    ) -> Result<(), TokensError> {
        let name = path.display().to_string();
        let limit = u64::try_from(MAX_DOCUMENT_BYTES)
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let mut bytes = Vec::new();
        open_stream(path)?
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(|e| read_err(&name, e))?;
        if bytes.len() > MAX_DOCUMENT_BYTES {
            return Err(bad(
                name,
                format!("a document is at most {MAX_DOCUMENT_BYTES} bytes"),
            ));
        }
        let text = String::from_utf8(bytes).map_err(|e| {
            bad(
                name.as_str(),
                format!(
                    "not UTF-8 text: invalid byte at offset {}",
                    e.utf8_error().valid_up_to()
                ),
            )
        })?;
        emit(text)
    }

    pub(super) fn jsonl(
        &mut self,
        path: &Path,
        emit: &mut dyn FnMut(String) -> Result<(), TokensError>,
    ) -> Result<(), TokensError> {
        let name = path.display().to_string();
        self.jsonl_lines(open_stream(path)?, &name, emit)
    }

    /// The documents of the JSONL lines `reader` yields; `name` is shown in errors.
    pub(super) fn jsonl_lines(
        &mut self,
        mut reader: Box<dyn BufRead + Send>,
        name: &str,
        emit: &mut dyn FnMut(String) -> Result<(), TokensError>,
    ) -> Result<(), TokensError> {
        let limit = u64::try_from(MAX_DOCUMENT_BYTES).unwrap_or(u64::MAX);
        let mut line = Vec::new();
        let mut number = 0u64;
        loop {
            line.clear();
            let got = (&mut reader)
                .take(limit.saturating_add(1))
                .read_until(b'\n', &mut line)
                .map_err(|e| read_err(name, e))?;
            if got == 0 {
                return Ok(());
            }
            number = number.saturating_add(1);
            if line.len() > MAX_DOCUMENT_BYTES {
                // Cannot skip a line we cannot hold: always an error.
                return Err(bad(
                    format!("{name}:{number}"),
                    format!("line longer than {MAX_DOCUMENT_BYTES} bytes"),
                ));
            }
            // A blank line (as at the end of a hand-edited file) holds no document.
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match parse_line(&line, self.field) {
                Ok(doc) => emit(doc)?,
                Err(reason) => self.bad(bad(format!("{name}:{number}"), reason))?,
            }
        }
    }

    /// Without the `parquet` feature a Parquet input is refused, never misread.
    #[cfg(not(feature = "parquet"))]
    pub(super) fn parquet(
        &mut self,
        path: &Path,
        _emit: &mut dyn FnMut(String) -> Result<(), TokensError>,
    ) -> Result<(), TokensError> {
        Err(TokensError::NotBuilt {
            input: path.display().to_string(),
            feature: "parquet",
        })
    }

    #[cfg(feature = "parquet")]
    pub(super) fn parquet(
        &mut self,
        path: &Path,
        emit: &mut dyn FnMut(String) -> Result<(), TokensError>,
    ) -> Result<(), TokensError> {
        let name = path.display().to_string();
        let perr = |e: parquet::errors::ParquetError| bad(name.as_str(), e.to_string());
        let file = crate::files::open_regular(path).map_err(|e| read_err(&name, e))?;
        let reader = SerializedFileReader::new(file).map_err(perr)?;
        let schema = reader.metadata().file_metadata().schema_descr_ptr();
        let column = (0..schema.num_columns())
            .find(|&i| {
                let c = schema.column(i);
                c.path().parts() == [self.field.to_string()]
            })
            .ok_or_else(|| {
                bad(
                    name.as_str(),
                    format!("no top-level column \"{}\"", self.field),
                )
            })?;
        let descr = schema.column(column);
        if descr.physical_type() != PhysicalType::BYTE_ARRAY || descr.max_rep_level() != 0 {
            return Err(bad(
                name.as_str(),
                format!(
                    "column \"{}\" is not a string column (physical type {}, repetition level {})",
                    self.field,
                    descr.physical_type(),
                    descr.max_rep_level()
                ),
            ));
        }
        let max_def = descr.max_def_level();
        let mut row = 0u64;
        let mut values: Vec<ByteArray> = Vec::with_capacity(PARQUET_BATCH);
        let mut defs: Vec<i16> = Vec::with_capacity(PARQUET_BATCH);
        for group in 0..reader.num_row_groups() {
            let rg = reader.get_row_group(group).map_err(perr)?;
            let ColumnReader::ByteArrayColumnReader(mut col) =
                rg.get_column_reader(column).map_err(perr)?
            else {
                return Err(bad(name.as_str(), "the column is not a byte-array column"));
            };
            loop {
                values.clear();
                defs.clear();
                let (records, _, _) = col
                    .read_records(PARQUET_BATCH, Some(&mut defs), None, &mut values)
                    .map_err(perr)?;
                if records == 0 {
                    break;
                }
                let mut next_value = values.drain(..);
                for i in 0..records {
                    row = row.saturating_add(1);
                    let present = max_def == 0 || defs.get(i).is_some_and(|&d| d == max_def);
                    let value = if present { next_value.next() } else { None };
                    let Some(value) = value else {
                        self.bad(bad(format!("{name}: row {row}"), "null document"))?;
                        continue;
                    };
                    if value.len() > MAX_DOCUMENT_BYTES {
                        return Err(bad(
                            format!("{name}: row {row}"),
                            format!("a document is at most {MAX_DOCUMENT_BYTES} bytes"),
                        ));
                    }
                    match String::from_utf8(value.data().to_vec()) {
                        Ok(doc) => emit(doc)?,
                        Err(_) => self.bad(bad(format!("{name}: row {row}"), "not UTF-8 text"))?,
                    }
                }
            }
        }
        Ok(())
    }
}

/// Where a pack's documents come from: a whole input file, or the byte range
/// `start..end` of an uncompressed JSONL file that begins and ends at line boundaries
/// (one part of a partitioned pack).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::tokens) enum Source {
    /// The whole file (`-`: standard input), decompressed as its name says.
    Whole(PathBuf),
    /// Lines `start..end` (byte offsets) of an uncompressed JSONL file.
    Lines {
        /// The file.
        path: PathBuf,
        /// The first byte, the start of a line.
        start: u64,
        /// One past the last byte, the end of a line (or of the file).
        end: u64,
    },
}

/// The name of a byte range of `path` in messages: line numbers count from its start.
pub(in crate::tokens) fn range_name(path: &Path, start: u64) -> String {
    format!("{} (from byte {start})", path.display())
}

/// Open bytes `start..end` of the regular file `path`, buffered.
pub(in crate::tokens) fn open_range(
    path: &Path,
    start: u64,
    end: u64,
) -> Result<BufReader<io::Take<std::fs::File>>, TokensError> {
    use std::io::{Seek, SeekFrom};
    let name = path.display().to_string();
    let mut file = crate::files::open_regular(path).map_err(|e| read_err(&name, e))?;
    file.seek(SeekFrom::Start(start))
        .map_err(|e| read_err(&name, e))?;
    Ok(BufReader::with_capacity(
        1 << 20,
        file.take(end.saturating_sub(start)),
    ))
}
