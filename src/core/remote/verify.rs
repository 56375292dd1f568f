//! `st verify` of a safetensors object, or of a model directory or index in storage
//! (scale.md section 3): the reader rules and the model rules from the headers (range
//! requests) and the JSON files, `canonical` from the same header bytes, the int4 scale
//! rule from a range request of each pair's scales, and `finite` by streaming each
//! object's data once through a fixed buffer.
//!
//! Invariants: the findings are the ones a local verify of the same bytes gives (same
//! rules, same messages, the URL in place of the path); memory stays bounded whatever
//! the object's size (the data is scanned in [`SCAN_BUFFER_BYTES`] pieces, an element
//! split between two pieces carried over); a download that ends short is an error.

use crate::s3::S3Url;
use crate::safetensors::verify::{Finding, Findings, VerifyOptions};

use super::RemoteError;

/// Bytes of the object's data scanned at a time by `finite`.
pub const SCAN_BUFFER_BYTES: usize = 4 << 20;

/// The findings of the safetensors object at `url`, or of the model directory or
/// index it names (an empty list: every rule asked for holds), `progress(done, total)`
/// in data bytes while `finite` streams.
#[cfg(feature = "s3")]
pub fn verify_object(
    url: &S3Url,
    opts: VerifyOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Findings, RemoteError> {
    let store = crate::s3::connect(url)?;
    if url.key().ends_with(".safetensors")
        || store.head(url.key())?.is_some() && !url.key().ends_with(".json")
    {
        verify_file(&store, url, opts, progress)
    } else {
        verify_model(&store, url, opts, progress)
    }
}

/// [`verify_object`] of one safetensors object.
#[cfg(feature = "s3")]
fn verify_file(
    store: &crate::s3::Store,
    url: &S3Url,
    opts: VerifyOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Findings, RemoteError> {
    use crate::model::Model;

    let (header, size, raw) = match super::header_of(store, url) {
        Ok(got) => got,
        Err(RemoteError::Safetensors { url: u, source }) => {
            return match Finding::from_error(&source) {
                Some(f) => {
                    let mut findings = Findings::new();
                    findings.push(f);
                    Ok(findings)
                }
                None => Err(RemoteError::Safetensors { url: u, source }),
            }
        }
        Err(e) => return Err(e),
    };
    // Canonical and finite findings follow the model rules, as a local verify lists them.
    let data = data_findings(store, url, &header, size, &raw, opts, progress)?;
    let (model, mut findings) = Model::header_findings(&super::url_path(url), header);
    findings.extend(data);
    findings.extend(scale_findings(store, &model)?);
    Ok(findings)
}

/// [`verify_object`] of a model directory (a prefix) or an index in storage: the rules
/// of a local `st verify` of the same files, each shard's data findings prefixed with
/// its name as there.
#[cfg(feature = "s3")]
fn verify_model(
    store: &crate::s3::Store,
    url: &S3Url,
    opts: VerifyOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Findings, RemoteError> {
    let files = super::RemoteFiles { store };
    let (model, mut findings) = crate::model::Model::scan_with(&super::url_path(url), &files)
        .map_err(|source| RemoteError::Model {
            url: url.to_string(),
            source: Box::new(source),
        })?;
    if opts.canonical || opts.finite {
        for shard in &model.shards {
            let shard_url = super::path_url(&shard.path)?;
            let (header, size, raw) = super::header_of(store, &shard_url)?;
            for mut f in data_findings(store, &shard_url, &header, size, &raw, opts, progress)? {
                f.message = format!("shard {}: {}", crate::text::quote(&shard.name), f.message);
                findings.push(f);
            }
        }
    }
    findings.extend(scale_findings(store, &model)?);
    Ok(findings)
}

/// The `canonical` and `finite` findings of one object whose header (and its raw bytes)
/// were read: the data streamed once for `finite`.
#[cfg(feature = "s3")]
fn data_findings(
    store: &crate::s3::Store,
    url: &S3Url,
    header: &crate::safetensors::Header,
    size: u64,
    raw: &[u8],
    opts: VerifyOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<Finding>, RemoteError> {
    use crate::safetensors::verify::canonical_mismatch;
    let invalid = |source| RemoteError::Safetensors {
        url: url.to_string(),
        source: Box::new(source),
    };
    let mut data_findings = Vec::new();
    if opts.canonical {
        data_findings.extend(canonical_mismatch(header, raw).map_err(invalid)?);
    }
    if opts.finite {
        let mut scan = FiniteScan::new(header.tensors(), header.data_start(), header.data_len());
        let mut out = std::io::BufWriter::with_capacity(
            SCAN_BUFFER_BYTES,
            Feed {
                scan: &mut scan,
                progress,
            },
        );
        let got = store.download(url.key(), &mut out, &mut |_| {})?;
        std::io::Write::flush(&mut out)
            .map_err(|e| crate::s3::S3Error::request(url.to_string(), e.kind(), e.to_string()))?;
        drop(out);
        if got != size {
            return Err(crate::s3::S3Error::request(
                url.to_string(),
                std::io::ErrorKind::UnexpectedEof,
                format!("the download has {got} bytes, the object {size}"),
            )
            .into());
        }
        data_findings.extend(scan.finish());
    }
    Ok(data_findings)
}

/// The int4 scale rule of `model` (its shards in storage): each pair's scales read by
/// one range request.
#[cfg(feature = "s3")]
fn scale_findings(
    store: &crate::s3::Store,
    model: &crate::model::Model,
) -> Result<Vec<Finding>, RemoteError> {
    let mut found = Vec::new();
    for l in &model.logical {
        let crate::model::Storage::Int4 { scales, .. } = l.storage else {
            continue;
        };
        let Some((entry, shard)) = model
            .entry(scales)
            .and_then(|e| Some((e, model.shards.get(e.shard)?)))
        else {
            continue;
        };
        let url = super::path_url(&shard.path)?;
        let start = shard.header.data_start();
        let (begin, end) = entry.info.data_offsets;
        let (Some(begin), Some(end)) = (start.checked_add(begin), start.checked_add(end)) else {
            continue;
        };
        let bytes = store.get_range(url.key(), begin..end)?;
        if bytes.len() as u64 != end.saturating_sub(begin) {
            return Err(super::short_read(&url, end.saturating_sub(begin), bytes.len()).into());
        }
        if let Some(message) = crate::model::view::bad_scale(&l.name, &bytes) {
            found.push(crate::model::finding("int4-scales", Some(&l.name), message));
        }
    }
    Ok(found)
}

/// Without the `s3` feature an object cannot be reached.
#[cfg(not(feature = "s3"))]
pub fn verify_object(
    url: &S3Url,
    _opts: VerifyOptions,
    _progress: &mut dyn FnMut(u64, u64),
) -> Result<Findings, RemoteError> {
    Err(super::not_built(url))
}

/// The writer the download goes into: each buffered piece is scanned.
#[cfg(feature = "s3")]
struct Feed<'a, 'b> {
    scan: &'a mut FiniteScan<'b>,
    progress: &'a mut dyn FnMut(u64, u64),
}

#[cfg(feature = "s3")]
impl std::io::Write for Feed<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.scan.feed(buf);
        (self.progress)(self.scan.data_done(), self.scan.data_len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The `finite` rule over an object's bytes as they arrive, in order: header bytes
/// skipped, each float tensor's values decoded in element-aligned pieces, one finding
/// per tensor with a NaN or an infinity (the local rule's message).
pub struct FiniteScan<'a> {
    tensors: &'a [crate::safetensors::TensorInfo],
    data_start: u64,
    data_len: u64,
    /// Offset in the object of the next byte fed.
    pos: u64,
    /// The tensor being scanned (file order is data-offset order).
    index: usize,
    /// The bytes of an element split between two pieces.
    carry: Vec<u8>,
    nan: u64,
    inf: u64,
    first: Option<u64>,
    seen: u64,
    found: Vec<Finding>,
}

impl<'a> FiniteScan<'a> {
    /// A scan of the tensors of a header whose data starts at `data_start` and holds
    /// `data_len` bytes.
    pub fn new(
        tensors: &'a [crate::safetensors::TensorInfo],
        data_start: u64,
        data_len: u64,
    ) -> FiniteScan<'a> {
        FiniteScan {
            tensors,
            data_start,
            data_len,
            pos: 0,
            index: 0,
            carry: Vec::new(),
            nan: 0,
            inf: 0,
            first: None,
            seen: 0,
            found: Vec::new(),
        }
    }

    /// The data bytes of the object.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    /// Data bytes scanned so far.
    pub fn data_done(&self) -> u64 {
        self.pos.saturating_sub(self.data_start)
    }

    /// Scan the next bytes of the object.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.pos < self.data_start {
                let skip = usize::try_from(self.data_start - self.pos)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                bytes = bytes.get(skip..).unwrap_or(&[]);
                self.pos = self.pos.saturating_add(skip as u64);
                continue;
            }
            let Some(t) = self.tensors.get(self.index) else {
                // Past the last tensor: nothing left to check.
                self.pos = self.pos.saturating_add(bytes.len() as u64);
                return;
            };
            let start = self.data_start.saturating_add(t.data_offsets.0);
            let end = self.data_start.saturating_add(t.data_offsets.1);
            if self.pos >= end {
                self.finish_tensor();
                continue;
            }
            if self.pos < start {
                // Rule 5 leaves no gap; skipped all the same rather than misread.
                let skip = usize::try_from(start - self.pos)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                bytes = bytes.get(skip..).unwrap_or(&[]);
                self.pos = self.pos.saturating_add(skip as u64);
                continue;
            }
            let take = usize::try_from(end - self.pos)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            let (now, rest) = bytes.split_at(take);
            self.scan(t.dtype, now);
            self.pos = self.pos.saturating_add(take as u64);
            bytes = rest;
        }
    }

    /// Decode `bytes` of the current tensor (whole elements; a split one is carried).
    fn scan(&mut self, dtype: crate::safetensors::Dtype, mut bytes: &[u8]) {
        if !dtype.is_float() || !dtype.decodable() {
            return;
        }
        let size = dtype.size().unwrap_or(1).max(1);
        if !self.carry.is_empty() {
            let need = size.saturating_sub(self.carry.len()).min(bytes.len());
            let (head, rest) = bytes.split_at(need);
            self.carry.extend_from_slice(head);
            bytes = rest;
            if self.carry.len() < size {
                return;
            }
            let element = std::mem::take(&mut self.carry);
            self.values(dtype, &element);
        }
        let whole = bytes.len() / size * size;
        let (aligned, tail) = bytes.split_at(whole);
        self.values(dtype, aligned);
        self.carry.extend_from_slice(tail);
    }

    fn values(&mut self, dtype: crate::safetensors::Dtype, bytes: &[u8]) {
        let (mut nan, mut inf, mut first, mut seen) = (self.nan, self.inf, self.first, self.seen);
        crate::safetensors::stats::for_each_chunk(dtype, bytes, |values| {
            for (i, v) in values.iter().enumerate() {
                if !v.is_finite() {
                    if v.is_nan() {
                        nan += 1;
                    } else {
                        inf += 1;
                    }
                    first.get_or_insert(seen.saturating_add(i as u64));
                }
            }
            seen = seen.saturating_add(values.len() as u64);
        });
        (self.nan, self.inf, self.first, self.seen) = (nan, inf, first, seen);
    }

    /// Close the current tensor: its finding, if any, and the counters reset.
    fn finish_tensor(&mut self) {
        if let (Some(first), Some(t)) = (self.first, self.tensors.get(self.index)) {
            self.found.push(Finding {
                rule: "finite".to_string(),
                tensor: Some(t.name.clone()),
                message: format!(
                    "finite: tensor {}: {} NaN and {} infinite values, the first at index {first}",
                    crate::text::quote(&t.name),
                    self.nan,
                    self.inf
                ),
            });
        }
        self.index = self.index.saturating_add(1);
        (self.nan, self.inf, self.first, self.seen) = (0, 0, None, 0);
        self.carry.clear();
    }

    /// The findings, once every byte was fed (tensors not yet closed are closed).
    pub fn finish(mut self) -> Vec<Finding> {
        while self.index < self.tensors.len() {
            self.finish_tensor();
        }
        self.found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safetensors::verify::{verify, VerifyOptions};

    /// A file with float tensors holding NaN and infinities at known places, and an
    /// integer one (never checked).
    fn sample() -> Vec<u8> {
        let f32s: Vec<f32> = vec![1.0, f32::NAN, 2.0, f32::INFINITY, f32::NAN];
        let f64s: Vec<f64> = vec![0.5, f64::NEG_INFINITY, 3.0];
        let mut data: Vec<u8> = f32s.iter().flat_map(|v| v.to_le_bytes()).collect();
        let a_end = data.len();
        data.extend(f64s.iter().flat_map(|v| v.to_le_bytes()));
        let b_end = data.len();
        data.extend([1u8, 2, 3, 4]);
        let c_end = data.len();
        let header = format!(
            r#"{{"a":{{"dtype":"F32","shape":[5],"data_offsets":[0,{a_end}]}},"b":{{"dtype":"F64","shape":[3],"data_offsets":[{a_end},{b_end}]}},"c":{{"dtype":"U8","shape":[4],"data_offsets":[{b_end},{c_end}]}},"z":{{"dtype":"F16","shape":[0],"data_offsets":[{c_end},{c_end}]}}}}"#
        );
        let mut header = header.into_bytes();
        while (header.len() + 8) % 8 != 0 {
            header.push(b' ');
        }
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend(header);
        file.extend(data);
        file
    }

    proptest::proptest! {
        /// Fed in any pieces, the scan finds what the local verify finds.
        #[test]
        fn streamed_finite_equals_local(cuts in proptest::collection::vec(0usize..200, 0..12)) {
            let bytes = sample();
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("s.safetensors");
            std::fs::write(&path, &bytes).unwrap();
            let opts = VerifyOptions { canonical: false, finite: true };
            let local = verify(&path, opts).unwrap();
            let header = crate::safetensors::read_header(&path).unwrap();
            let mut scan = FiniteScan::new(header.tensors(), header.data_start(), header.data_len());
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort_unstable();
            let mut at = 0;
            for c in cuts.into_iter().chain([bytes.len()]) {
                scan.feed(&bytes[at..c]);
                at = c;
            }
            let streamed = scan.finish();
            proptest::prop_assert_eq!(streamed.len(), 2);
            proptest::prop_assert_eq!(streamed, local);
        }
    }
}
