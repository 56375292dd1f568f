//! The sharded part of verifying a step directory: the chunk table against the data
//! files' headers (every chunk's key there with its dtype, shape and byte range, every
//! key of a file claimed by a chunk) and every piece digest. `checkpoint::verify`
//! calls [`check_step`] after its own checks pass, so `ckpt verify`, `latest`, `gc`
//! and `load`'s choice all see the same verdict.
//!
//! A step on object storage is checked by the same rules, its pieces fetched by
//! coalesced range requests (`remote::checkpoint::sharded`).
//!
//! Invariants: the pieces of every chunk are read once each, in parallel, through one
//! buffer per thread; problems come in table order whatever the threads did.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rayon::prelude::*;

use super::open::{open_one, Source, StepChunk, StepTensor};
use super::piece::piece_digest_bytes;
use super::table::ShardsTable;
use crate::checkpoint::manifest::Manifest;
use crate::safetensors::Header;

/// The opened step's tensors from the table, each chunk checked against its file's
/// header; `headers` maps each data file to its index among the opened files.
pub(crate) fn step_tensors(
    table: &ShardsTable,
    headers: &BTreeMap<&str, (usize, Header)>,
) -> Result<Vec<StepTensor>, String> {
    let mut claimed: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out = Vec::with_capacity(table.tensors.len());
    for t in &table.tensors {
        let mut chunks = Vec::with_capacity(t.chunks.len());
        for c in &t.chunks {
            let (index, header) = headers.get(c.file.as_str()).ok_or_else(|| {
                format!(
                    "{} names {}, which is not listed",
                    super::SHARDS_NAME,
                    c.file
                )
            })?;
            let start = header.data_start();
            let ok = header.get(&c.key).is_some_and(|info| {
                info.dtype == t.dtype
                    && info.shape == c.sizes
                    && start.checked_add(info.data_offsets.0) == Some(c.begin)
                    && start.checked_add(info.data_offsets.1) == Some(c.end)
            });
            if !ok {
                return Err(format!(
                    "{}: its header does not hold {:?} as {} {:?} at bytes {}..{}, where {} places the chunk at {:?} of {}",
                    c.file,
                    c.key,
                    t.dtype,
                    c.sizes,
                    c.begin,
                    c.end,
                    super::SHARDS_NAME,
                    c.offsets,
                    t.label()
                ));
            }
            *claimed.entry(c.file.as_str()).or_default() += 1;
            let pieces = c
                .pieces
                .iter()
                .map(|p| unhex(p).ok_or_else(|| format!("bad piece digest {p:?}")))
                .collect::<Result<Vec<_>, _>>()?;
            chunks.push(StepChunk {
                offsets: c.offsets.clone(),
                sizes: c.sizes.clone(),
                file: *index,
                begin: c.begin,
                end: c.end,
                pieces,
            });
        }
        out.push(StepTensor {
            group: t.group,
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            longest: super::plan::longest_extent(chunks.iter().map(|c| c.sizes.as_slice())),
            chunks,
        });
    }
    for (name, (_, header)) in headers {
        let n = claimed.get(name).copied().unwrap_or(0);
        if n != header.len() {
            return Err(format!(
                "{name} holds {} tensors, {} of which are chunks of {}",
                header.len(),
                n,
                super::SHARDS_NAME
            ));
        }
    }
    Ok(out)
}

/// 64 lowercase hex digits as 32 bytes.
fn unhex(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if s.len() != 64 {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        let pair = s.get(2 * i..2 * i + 2)?;
        *o = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

/// The sharded problems of a step directory whose other checks passed: the table and
/// the headers (as `open_step` checks them), then every piece digest. Each problem
/// names the file, the tensor and the piece.
pub fn check_step(step_dir: &Path, manifest: &Manifest) -> Vec<String> {
    let step = match open_one(step_dir, manifest.step) {
        Ok(s) => s,
        Err(why) => return vec![why],
    };
    check_pieces(&step)
}

/// Every piece digest of an opened sharded step, read once each (a step on object
/// storage: by coalesced range requests); the problems in table order.
pub(crate) fn check_pieces(step: &super::ShardedStep) -> Vec<String> {
    let mut jobs = Vec::new();
    for t in &step.tensors {
        for c in &t.chunks {
            let len = c.end.saturating_sub(c.begin);
            for p in 0..super::table::piece_count(len, step.piece_bytes) {
                jobs.push((t, c, p));
            }
        }
    }
    #[cfg(feature = "s3")]
    if step
        .files
        .iter()
        .any(|f| matches!(f.source, Source::Remote { .. }))
    {
        return check_remote(step, &jobs);
    }
    let found: Vec<Option<String>> = jobs
        .par_iter()
        .map_init(Vec::new, |buf: &mut Vec<u8>, &(t, c, p)| {
            check_piece(step, t, c, p, buf)
        })
        .collect();
    found.into_iter().flatten().collect()
}

/// [`check_pieces`] of a step on object storage: a mismatch is a problem and the check
/// goes on; a failed request stops it with one problem naming the object.
#[cfg(feature = "s3")]
fn check_remote(step: &super::ShardedStep, jobs: &[(&StepTensor, &StepChunk, u64)]) -> Vec<String> {
    let spans: Vec<super::plan::Span> = jobs
        .iter()
        .map(|&(_, c, p)| step.piece_span(c, p))
        .collect();
    let found = std::sync::Mutex::new(Vec::new());
    let fetched = step.fetch_spans(&spans, &|i, bytes| {
        if let (Some(&(t, c, p)), Some(span)) = (jobs.get(i), spans.get(i)) {
            let expected = usize::try_from(p).ok().and_then(|k| c.pieces.get(k));
            if expected != Some(&piece_digest_bytes(bytes)) {
                let name = step.files.get(c.file).map_or("?", |f| f.name.as_str());
                let problem = mismatch(name, p, span.at, span.len, t);
                found
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((i, problem));
            }
        }
        Ok(())
    });
    let mut found = found.into_inner().unwrap_or_else(|e| e.into_inner());
    found.sort_by_key(|(i, _)| *i);
    let mut out: Vec<String> = found.into_iter().map(|(_, p)| p).collect();
    if let Err(e) = fetched {
        out.push(format!(
            "cannot read {}: {}",
            step.path.display(),
            crate::failure::full_text(&e)
        ));
    }
    out
}

/// The piece checks of one data file of an opened step, fed the file's bytes once, in
/// order, as they stream past: a remote verify hashes the file's sha256 from the same
/// bytes, so the file is downloaded once, not once for each digest. Every chunk in the
/// file is hashed piece by piece and compared with the table's digest as soon as its
/// last byte has passed.
#[cfg_attr(
    not(feature = "s3"),
    allow(dead_code, reason = "the remote verify (feature s3) uses it")
)]
pub(crate) struct FilePieces<'s> {
    step: &'s super::ShardedStep,
    file: usize,
    /// (tensor, chunk) indices of the chunks in the file, by their first byte.
    order: Vec<(usize, usize)>,
    next: usize,
    pos: u64,
    hasher: blake3::Hasher,
    /// Mismatches: ((tensor, chunk, piece), problem), the key giving table order.
    found: Vec<((usize, usize, u64), String)>,
}

#[cfg_attr(
    not(feature = "s3"),
    allow(dead_code, reason = "the remote verify (feature s3) uses it")
)]
impl<'s> FilePieces<'s> {
    /// The checks of the data file named `name`; `None` when the step has no such file.
    pub(crate) fn new(step: &'s super::ShardedStep, name: &str) -> Option<Self> {
        let file = step.files.iter().position(|f| f.name == name)?;
        let mut order: Vec<(usize, usize)> = Vec::new();
        for (ti, t) in step.tensors.iter().enumerate() {
            for (ci, c) in t.chunks.iter().enumerate() {
                if c.file == file {
                    order.push((ti, ci));
                }
            }
        }
        order.sort_by_key(|&(ti, ci)| {
            step.tensors
                .get(ti)
                .and_then(|t| t.chunks.get(ci))
                .map(|c| c.begin)
        });
        Some(FilePieces {
            step,
            file,
            order,
            next: 0,
            pos: 0,
            hasher: blake3::Hasher::new(),
            found: Vec::new(),
        })
    }

    fn chunk(&self, k: usize) -> Option<(usize, usize, &'s StepTensor, &'s StepChunk)> {
        let &(ti, ci) = self.order.get(k)?;
        let t = self.step.tensors.get(ti)?;
        Some((ti, ci, t, t.chunks.get(ci)?))
    }

    /// The next bytes of the file.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) {
        let piece_bytes = self.step.piece_bytes.max(1);
        while !bytes.is_empty() {
            let Some((ti, ci, t, c)) = self.chunk(self.next) else {
                self.pos = self.pos.saturating_add(bytes.len() as u64);
                return;
            };
            if self.pos >= c.end {
                // Done (or empty): its pieces were judged as they closed.
                self.next = self.next.saturating_add(1);
                continue;
            }
            if self.pos < c.begin {
                let gap = usize::try_from(c.begin.saturating_sub(self.pos)).unwrap_or(usize::MAX);
                let skip = gap.min(bytes.len());
                bytes = bytes.get(skip..).unwrap_or_default();
                self.pos = self.pos.saturating_add(skip as u64);
                continue;
            }
            let piece = self.pos.saturating_sub(c.begin) / piece_bytes;
            let at = c.begin.saturating_add(piece.saturating_mul(piece_bytes));
            let piece_end = at.saturating_add(piece_bytes).min(c.end);
            let room = usize::try_from(piece_end.saturating_sub(self.pos)).unwrap_or(usize::MAX);
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            self.hasher.update(now);
            self.pos = self.pos.saturating_add(now.len() as u64);
            bytes = rest;
            if self.pos == piece_end {
                let digest = *self.hasher.finalize().as_bytes();
                self.hasher.reset();
                let expected = usize::try_from(piece).ok().and_then(|k| c.pieces.get(k));
                if expected != Some(&digest) {
                    let name = self
                        .step
                        .files
                        .get(self.file)
                        .map_or("?", |f| f.name.as_str());
                    let n = piece_end.saturating_sub(at);
                    self.found
                        .push(((ti, ci, piece), mismatch(name, piece, at, n, t)));
                }
            }
        }
    }

    /// The mismatches found, keyed for table order; a chunk whose bytes did not all
    /// arrive is not judged (the file's size check reports a short file).
    pub(crate) fn finish(self) -> Vec<((usize, usize, u64), String)> {
        self.found
    }
}

/// A piece that does not match its digest, in the words every check uses.
fn mismatch(file: &str, p: u64, at: u64, n: u64, t: &StepTensor) -> String {
    format!(
        "{file}: piece {p} (bytes {at}..{}) of {} does not match its {} digest in {}",
        at.saturating_add(n),
        t.label(),
        super::piece::DIGEST_NAME,
        super::SHARDS_NAME
    )
}

fn check_piece(
    step: &super::ShardedStep,
    t: &StepTensor,
    c: &StepChunk,
    p: u64,
    buf: &mut Vec<u8>,
) -> Option<String> {
    let file = step.files.get(c.file)?;
    let Source::File(f) = &file.source else {
        return None;
    };
    let start = p.saturating_mul(step.piece_bytes);
    let n = step
        .piece_bytes
        .min(c.end.saturating_sub(c.begin).saturating_sub(start));
    let at = c.begin.saturating_add(start);
    buf.resize(usize::try_from(n).ok()?, 0);
    if let Err(e) = f.read_exact_at(buf, at) {
        return Some(format!("cannot read {}: {e}", file.name));
    }
    let expected = usize::try_from(p).ok().and_then(|i| c.pieces.get(i))?;
    (piece_digest_bytes(buf) != *expected).then(|| mismatch(&file.name, p, at, n, t))
}
