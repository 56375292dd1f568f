//! Region reads of an opened step: each region of a global tensor is planned against
//! the tensor's chunks (`plan`), the pieces it touches become jobs, and the jobs of all
//! the regions of one call run on the thread pool; each reads its piece once from the
//! descriptor opened by `open_step`, checks its digest, and copies the bytes the region
//! needs (a piece that one run covers whole is read straight into the region and
//! hashed there, with no copy at all).
//!
//! A step on object storage reads the same pieces by range requests instead: the pieces
//! that follow each other in an object are coalesced into requests of bounded size,
//! a bounded number in flight, each piece verified before it is placed.
//!
//! Invariants: a region is filled only from verified bytes (a mismatch fails the whole
//! call, naming the file, tensor and piece); no two jobs write the same byte of an
//! output (chunks do not overlap, pieces partition a chunk), which is what makes the
//! shared writes below sound; memory is one piece buffer per thread plus one job per
//! piece.

use std::os::unix::fs::FileExt;

use rayon::prelude::*;

use super::open::{DataFile, ShardedStep, Source, StepChunk, StepTensor};
use super::piece::{piece_digest_bytes, DIGEST_NAME};
use super::plan::{check_region, plan_region, Region, Runs};
use super::table::Group;
use super::ShardedError;

/// One region to read into `out` (row-major, exactly its bytes).
#[derive(Debug)]
pub struct ReadRequest<'a> {
    /// The tensor's group.
    pub group: Group,
    /// The tensor's name.
    pub name: &'a str,
    /// The region's first index per dimension.
    pub offsets: &'a [u64],
    /// The region's extent per dimension.
    pub sizes: &'a [u64],
    /// Where the region goes.
    pub out: &'a mut [u8],
}

/// An output buffer shared by the jobs, each writing its own disjoint ranges.
struct Out {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is only dereferenced through `Out::range`, on ranges that no
// other job touches (module invariant), while the `&mut [u8]` it came from is
// borrowed for the whole call.
#[allow(
    unsafe_code,
    reason = "disjoint writes into one buffer from the thread pool"
)]
unsafe impl Send for Out {}
// SAFETY: as for Send: concurrent jobs never touch the same byte.
#[allow(
    unsafe_code,
    reason = "disjoint writes into one buffer from the thread pool"
)]
unsafe impl Sync for Out {}

impl Out {
    /// The bytes `[at, at + n)`, when they lie inside the buffer.
    #[allow(
        clippy::mut_from_ref,
        reason = "each range is handed to exactly one job"
    )]
    fn range(&self, at: u64, n: u64) -> Option<&mut [u8]> {
        let a = usize::try_from(at).ok()?;
        let n = usize::try_from(n).ok()?;
        if a.checked_add(n)? > self.len {
            return None;
        }
        // SAFETY: the range is inside the buffer (checked above), the buffer outlives
        // the call, and no other job writes or reads these bytes (module invariant).
        #[allow(
            unsafe_code,
            reason = "disjoint writes into one buffer from the thread pool"
        )]
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(a), n) })
    }
}

/// One piece of one chunk for one region.
struct Job<'s> {
    req: usize,
    tensor: &'s StepTensor,
    chunk: &'s StepChunk,
    runs: usize,
    piece: u64,
}

impl ShardedStep {
    /// Read one region of a global tensor into `out`.
    pub fn read(
        &self,
        group: Group,
        name: &str,
        offsets: &[u64],
        sizes: &[u64],
        out: &mut [u8],
    ) -> Result<(), ShardedError> {
        self.read_many(&mut [ReadRequest {
            group,
            name,
            offsets,
            sizes,
            out,
        }])
    }

    /// Read every region, all their pieces in parallel.
    pub fn read_many(&self, reqs: &mut [ReadRequest<'_>]) -> Result<(), ShardedError> {
        let mut runs: Vec<Runs> = Vec::new();
        let mut jobs: Vec<Job<'_>> = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            self.plan(i, r, &mut runs, &mut jobs)?;
        }
        let outs: Vec<Out> = reqs
            .iter_mut()
            .map(|r| Out {
                ptr: r.out.as_mut_ptr(),
                len: r.out.len(),
            })
            .collect();
        #[cfg(feature = "s3")]
        let jobs = {
            let (remote, local): (Vec<Job<'_>>, Vec<Job<'_>>) =
                jobs.into_iter().partition(|j| self.is_remote(j.chunk.file));
            self.run_remote(&remote, &runs, &outs)?;
            local
        };
        let results: Vec<Result<(), ShardedError>> = jobs
            .par_iter()
            .map_init(Vec::new, |buf, job| {
                let runs = runs.get(job.runs).ok_or_else(|| internal("a job's runs"))?;
                let out = outs
                    .get(job.req)
                    .ok_or_else(|| internal("a job's output"))?;
                self.run(job, runs, out, buf)
            })
            .collect();
        results.into_iter().collect()
    }

    /// Check one request and add its jobs.
    fn plan<'s>(
        &'s self,
        i: usize,
        r: &ReadRequest<'_>,
        runs: &mut Vec<Runs>,
        jobs: &mut Vec<Job<'s>>,
    ) -> Result<(), ShardedError> {
        let t = self.tensor(r.group, r.name).ok_or_else(|| {
            ShardedError::Request(format!(
                "{}: the step has no {} tensor {:?}",
                self.path.display(),
                r.group,
                r.name
            ))
        })?;
        let elem = t.dtype.size().map(|s| s as u64).ok_or_else(|| {
            ShardedError::Request(format!(
                "{}: dtype {} has no whole byte per element and cannot be read by region",
                t.label(),
                t.dtype
            ))
        })?;
        let region = Region {
            offsets: r.offsets,
            sizes: r.sizes,
        };
        check_region(&t.shape, region)
            .map_err(|e| ShardedError::Request(format!("{}: {e}", t.label())))?;
        let want = crate::safetensors::dtype::byte_len(t.dtype, r.sizes).ok();
        if want != Some(r.out.len() as u64) {
            return Err(ShardedError::Request(format!(
                "{}: the output buffer has {} bytes, the region (sizes {:?}) {}",
                t.label(),
                r.out.len(),
                r.sizes,
                want.map_or_else(|| "overflows".to_string(), |w| format!("{w} bytes"))
            )));
        }
        let (reads, _) = plan_region(elem, self.piece_bytes, &t.chunks, t.longest, region);
        for read in reads {
            let c = t
                .chunks
                .get(read.chunk)
                .ok_or_else(|| internal("a planned chunk"))?;
            for piece in read.pieces {
                jobs.push(Job {
                    req: i,
                    tensor: t,
                    chunk: c,
                    runs: runs.len(),
                    piece,
                });
            }
            runs.push(read.runs);
        }
        Ok(())
    }

    /// Read, verify and place one piece.
    fn run(
        &self,
        job: &Job<'_>,
        runs: &Runs,
        out: &Out,
        buf: &mut Vec<u8>,
    ) -> Result<(), ShardedError> {
        let c = job.chunk;
        let len = c.end.saturating_sub(c.begin);
        let start = job.piece.saturating_mul(self.piece_bytes);
        let n = self.piece_bytes.min(len.saturating_sub(start));
        let file = self
            .files
            .get(c.file)
            .ok_or_else(|| internal("a chunk's file"))?;
        let at = c.begin.saturating_add(start);
        match &file.source {
            #[cfg(feature = "s3")]
            Source::Remote { .. } => Err(internal("a remote piece read as a local one")),
            Source::Owned(bytes) => {
                let piece = usize::try_from(at)
                    .ok()
                    .and_then(|a| bytes.get(a..a.checked_add(usize::try_from(n).ok()?)?))
                    .ok_or_else(|| internal("a chunk past its file"))?;
                place(runs, start, piece, out)
            }
            Source::Verified(f) => {
                buf.resize(usize::try_from(n).map_err(|_| internal("piece size"))?, 0);
                f.read_exact_at(buf, at)
                    .map_err(|e| read_err(self, file, e))?;
                place(runs, start, buf, out)
            }
            Source::File(f) => {
                let direct = whole_segment(runs, start, n).and_then(|to| out.range(to, n));
                if let Some(dst) = direct {
                    f.read_exact_at(dst, at)
                        .map_err(|e| read_err(self, file, e))?;
                    return self.check_piece(job, file, dst, at);
                }
                buf.resize(usize::try_from(n).map_err(|_| internal("piece size"))?, 0);
                f.read_exact_at(buf, at)
                    .map_err(|e| read_err(self, file, e))?;
                self.check_piece(job, file, buf, at)?;
                place(runs, start, buf, out)
            }
        }
    }

    fn check_piece(
        &self,
        job: &Job<'_>,
        file: &DataFile,
        bytes: &[u8],
        at: u64,
    ) -> Result<(), ShardedError> {
        let expected = usize::try_from(job.piece)
            .ok()
            .and_then(|p| job.chunk.pieces.get(p))
            .ok_or_else(|| internal("a piece without its digest"))?;
        if piece_digest_bytes(bytes) != *expected {
            return Err(ShardedError::Digest {
                file: file.name.clone(),
                tensor: job.tensor.label(),
                chunk: job.chunk.offsets.clone(),
                index: job.piece,
                begin: at,
                end: at.saturating_add(bytes.len() as u64),
                digest: DIGEST_NAME,
            });
        }
        Ok(())
    }
}

/// Bytes one range request of a remote read asks for at most: pieces that follow
/// each other in an object are fetched together up to this size.
#[cfg(feature = "s3")]
pub const FETCH_RANGE_BYTES: u64 = 8 << 20;
/// Range requests in flight at once during a remote read: the memory a read holds is
/// at most this many ranges of [`FETCH_RANGE_BYTES`] (64 MiB), whatever the regions.
#[cfg(feature = "s3")]
pub const FETCHES_IN_FLIGHT: usize = 8;

/// What a remote read does with each fetched span's bytes (its index, its bytes).
#[cfg(feature = "s3")]
pub(crate) type OnSpan<'a> = dyn Fn(usize, &[u8]) -> Result<(), ShardedError> + Sync + 'a;

#[cfg(feature = "s3")]
impl ShardedStep {
    /// Whether data file `file` is an object on object storage.
    fn is_remote(&self, file: usize) -> bool {
        self.files
            .get(file)
            .is_some_and(|f| matches!(f.source, Source::Remote { .. }))
    }

    /// The bytes of one piece of a chunk in its file.
    pub(crate) fn piece_span(&self, c: &StepChunk, piece: u64) -> super::plan::Span {
        let len = c.end.saturating_sub(c.begin);
        let start = piece.saturating_mul(self.piece_bytes);
        super::plan::Span {
            file: c.file,
            at: c.begin.saturating_add(start),
            len: self.piece_bytes.min(len.saturating_sub(start)),
        }
    }

    /// The remote jobs of a read: their pieces fetched by coalesced range requests,
    /// each verified before its bytes are placed.
    fn run_remote(
        &self,
        jobs: &[Job<'_>],
        runs: &[Runs],
        outs: &[Out],
    ) -> Result<(), ShardedError> {
        if jobs.is_empty() {
            return Ok(());
        }
        let spans: Vec<super::plan::Span> = jobs
            .iter()
            .map(|j| self.piece_span(j.chunk, j.piece))
            .collect();
        self.fetch_spans(&spans, &|i, bytes| {
            let job = jobs
                .get(i)
                .ok_or_else(|| internal("a fetched span's job"))?;
            let runs = runs.get(job.runs).ok_or_else(|| internal("a job's runs"))?;
            let out = outs
                .get(job.req)
                .ok_or_else(|| internal("a job's output"))?;
            let file = self
                .files
                .get(job.chunk.file)
                .ok_or_else(|| internal("a chunk's file"))?;
            let at = spans.get(i).map_or(0, |s| s.at);
            self.check_piece(job, file, bytes, at)?;
            place(runs, job.piece.saturating_mul(self.piece_bytes), bytes, out)
        })
    }

    /// Fetch every span from its object, coalesced into range requests of at most
    /// [`FETCH_RANGE_BYTES`], [`FETCHES_IN_FLIGHT`] at a time, and hand each span's
    /// bytes to `each` with its index. Stops at the first error (the one of the
    /// earliest request, whatever the threads did).
    pub(crate) fn fetch_spans(
        &self,
        spans: &[super::plan::Span],
        each: &OnSpan<'_>,
    ) -> Result<(), ShardedError> {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let fetches = super::plan::coalesce(spans, FETCH_RANGE_BYTES);
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let failures = std::sync::Mutex::new(Vec::new());
        let threads = FETCHES_IN_FLIGHT.min(fetches.len());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(f) = fetches.get(i) else {
                        return;
                    };
                    if let Err(e) = self.fetch_one(f, spans, each) {
                        stop.store(true, Ordering::Relaxed);
                        failures
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((i, e));
                        return;
                    }
                });
            }
        });
        let mut failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
        failures.sort_by_key(|(i, _)| *i);
        match failures.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    /// One range request and its spans.
    fn fetch_one(
        &self,
        f: &super::plan::Fetch,
        spans: &[super::plan::Span],
        each: &OnSpan<'_>,
    ) -> Result<(), ShardedError> {
        let file = self
            .files
            .get(f.file)
            .ok_or_else(|| internal("a fetch's file"))?;
        let Source::Remote { store, key } = &file.source else {
            return Err(internal("a local file fetched by range"));
        };
        let bytes = store
            .get_range(key, f.begin..f.end)
            .map_err(|e| ShardedError::Checkpoint(e.into()))?;
        if bytes.len() as u64 != f.end.saturating_sub(f.begin) {
            return Err(read_err(
                self,
                file,
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "bytes {}..{} gave {} bytes (the object changed since it was opened)",
                        f.begin,
                        f.end,
                        bytes.len()
                    ),
                ),
            ));
        }
        for &m in &f.members {
            let span = spans.get(m).ok_or_else(|| internal("a fetch's span"))?;
            let from = usize::try_from(span.at.saturating_sub(f.begin))
                .map_err(|_| internal("a span's offset"))?;
            let n = usize::try_from(span.len).map_err(|_| internal("a span's size"))?;
            let piece = from
                .checked_add(n)
                .and_then(|end| bytes.get(from..end))
                .ok_or_else(|| internal("a span outside its fetch"))?;
            each(m, piece)?;
        }
        Ok(())
    }
}

/// Where in the region the piece goes when one run covers all of it.
fn whole_segment(runs: &Runs, start: u64, n: u64) -> Option<u64> {
    let mut segs = runs.segments(start, n);
    match (segs.next(), segs.next()) {
        (Some((0, to, len)), None) if len == n => Some(to),
        _ => None,
    }
}

/// Copy the parts of a verified piece that the region needs.
fn place(runs: &Runs, start: u64, piece: &[u8], out: &Out) -> Result<(), ShardedError> {
    for (from, to, n) in runs.segments(start, piece.len() as u64) {
        let src = usize::try_from(from)
            .ok()
            .and_then(|a| piece.get(a..a.checked_add(usize::try_from(n).ok()?)?));
        match (src, out.range(to, n)) {
            (Some(s), Some(d)) => d.copy_from_slice(s),
            _ => return Err(internal("a planned copy outside its buffers")),
        }
    }
    Ok(())
}

fn read_err(step: &ShardedStep, file: &DataFile, e: std::io::Error) -> ShardedError {
    ShardedError::Io {
        path: step.path.join(&file.name),
        source: e,
    }
}

fn internal(what: &str) -> ShardedError {
    ShardedError::Request(format!("internal error of the read plan: {what}"))
}
