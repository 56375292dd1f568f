//! `convert`: re-encode the float tensors of a file to another float dtype, copying the
//! rest, into a canonical file written atomically, streaming through fixed buffers: one
//! thread reads and converts chunk after chunk (the pieces of a chunk in parallel), a
//! second writes them, a bounded queue between the two.
//!
//! Invariants: memory use is a few MiB whatever the file size (at most
//! `WRITE_DEPTH + 2` chunks alive, a copied one as a mapped window, a re-encoded one
//! as a buffer the writer hands back, its pieces read into a cache-sized buffer per
//! thread); chunks are written in file order whatever the thread count; each value
//! is rounded once, from its source value (F64 sources are encoded from f64, every other
//! float dtype decodes exactly to f32); the output never replaces the input.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::dtype::Dtype;
use super::float::{
    decode_f32, decode_f64, encode_f32, encode_f64, EncodeError, EncodeFailure, E4M3_MAX,
};
use super::header::{read_header_from, Header, ReadFailure, TensorInfo};
use super::kernels::{convert_slice, fast_pair};
use super::mmap::Window;
use super::write::{canonical_header, TensorSpec};
use super::SafetensorsError;
use crate::atomic::{same_file, AtomicFile};

/// Bytes of source data handled per step (a multiple of every element size).
pub const CONVERT_CHUNK: usize = 4 << 20;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct ConvertReport {
    /// Tensors re-encoded to the target dtype.
    pub converted: u64,
    /// Tensors copied unchanged (not float, not selected, or already the target).
    pub copied: u64,
    /// Size of the input file.
    pub bytes_in: u64,
    /// Size of the output file.
    pub bytes_out: u64,
}

/// The float dtypes `convert` can write.
pub fn is_convert_target(d: Dtype) -> bool {
    matches!(
        d,
        Dtype::F64 | Dtype::F32 | Dtype::BF16 | Dtype::F16 | Dtype::F8_E4M3 | Dtype::F8_E5M2
    )
}

/// Convert `input` to `output`: every float tensor for which `select(name)` holds is
/// encoded to `target`; `progress(done, total)` receives the source data bytes done
/// after each step.
pub fn convert(
    input: &Path,
    output: &Path,
    target: Dtype,
    select: &dyn Fn(&str) -> bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertReport, SafetensorsError> {
    convert_saturating(input, output, target, false, select, progress)
}

/// [`convert`], where `saturate` makes F8_E4M3 clamp magnitudes beyond 448 (infinities
/// included) to +-448 as torch's saturating cast does, instead of the default error;
/// NaN stays NaN.
pub fn convert_saturating(
    input: &Path,
    output: &Path,
    target: Dtype,
    saturate: bool,
    select: &dyn Fn(&str) -> bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertReport, SafetensorsError> {
    let saturate = saturate && target == Dtype::F8_E4M3;
    if !is_convert_target(target) {
        return Err(SafetensorsError::BadTarget { dtype: target });
    }
    if same_file(input, output) {
        return Err(SafetensorsError::SameFile {
            path: output.to_path_buf(),
        });
    }
    let io = read_err(input);
    let mut src = crate::files::open_regular(input).map_err(io)?;
    let size = src.metadata().map_err(io)?.len();
    advise_sequential(&src);
    let header = read_header_from(&mut src, size).map_err(|e| match e {
        ReadFailure::Io(source) => io(source),
        ReadFailure::Invalid(e) => e,
    })?;
    let plan = plan_dtypes(&header, target, select)?;
    let specs: Vec<TensorSpec<'_>> = plan
        .iter()
        .map(|&(t, dtype)| TensorSpec::from_info(t, dtype))
        .collect();
    let layout = canonical_header(&specs, &header.metadata)?;

    let mut out = AtomicFile::create(output)?;
    out.write_all(&layout.header)
        .map_err(SafetensorsError::Write)?;
    let mut report = ConvertReport {
        bytes_in: size,
        bytes_out: layout.file_size(),
        ..ConvertReport::default()
    };
    let plan = layout.in_file_order(&plan)?;
    for &&(t, to) in &plan {
        if to == t.dtype {
            report.copied += 1;
        } else {
            report.converted += 1;
        }
    }
    let feed = Feed {
        src: &src,
        size,
        input,
        saturate,
        done: 0,
        total: header.data_len(),
    };
    feed.run(&mut out, &plan, header.data_start(), progress)?;
    out.commit()?;
    Ok(report)
}

/// The error of a failed read of `input`.
fn read_err(input: &Path) -> impl Fn(std::io::Error) -> SafetensorsError + Copy + Sync + '_ {
    move |source| SafetensorsError::Io {
        path: input.to_path_buf(),
        source,
    }
}

/// Each tensor with the dtype it is written as: `target` for the selected float
/// tensors (which must be decodable), its own otherwise.
fn plan_dtypes<'h>(
    header: &'h Header,
    target: Dtype,
    select: &dyn Fn(&str) -> bool,
) -> Result<Vec<(&'h TensorInfo, Dtype)>, SafetensorsError> {
    let mut plan = Vec::with_capacity(header.len());
    for t in header.tensors() {
        let convert = t.dtype.is_float() && t.dtype != target && select(&t.name);
        if convert && !t.dtype.decodable() {
            return Err(SafetensorsError::CannotDecode {
                tensor: t.name.clone(),
                dtype: t.dtype,
            });
        }
        plan.push((t, if convert { target } else { t.dtype }));
    }
    Ok(plan)
}

/// What the writer thread writes next: a re-encoded chunk (its buffer goes back to be
/// refilled) or a mapped window of a copied tensor.
enum Block {
    Encoded(Vec<u8>),
    Mapped(Window),
}

impl Block {
    fn bytes(&self) -> &[u8] {
        match self {
            Block::Encoded(v) => v,
            Block::Mapped(w) => w.bytes(),
        }
    }
}

/// Blocks queued between the thread reading and converting and the one writing: the
/// two overlap without waiting for each other at every chunk, and at most
/// `WRITE_DEPTH + 2` chunks are alive (queued, being written, being filled).
const WRITE_DEPTH: usize = 2;

/// The source side of one conversion: it reads and re-encodes chunks in order and
/// queues them for the writer.
struct Feed<'a> {
    src: &'a File,
    /// The input's size when its header was validated: no read reaches past it.
    size: u64,
    input: &'a Path,
    saturate: bool,
    done: u64,
    total: u64,
}

/// The buffers of re-encoding one piece: its raw bytes, and the scalar codecs' values.
#[derive(Default)]
struct Codec {
    raw: Vec<u8>,
    encoded: Vec<u8>,
    v32: Vec<f32>,
    v64: Vec<f64>,
}

impl Feed<'_> {
    /// Write the data of the tensors of `plan` (each with the dtype it is written as;
    /// the file's data starting at `data_start`) to `out`, after its header: this
    /// thread reads and converts, a scoped thread writes. Errors keep the order of a
    /// serial run: a failed write stops the reading, and a failed read or conversion
    /// reports the writer's error first when it failed on an earlier chunk.
    fn run(
        mut self,
        out: &mut AtomicFile,
        plan: &[&(&TensorInfo, Dtype)],
        data_start: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), SafetensorsError> {
        std::thread::scope(|s| {
            let (queue, queued) = std::sync::mpsc::sync_channel::<Block>(WRITE_DEPTH);
            let (recycle, recycled) = std::sync::mpsc::channel::<Vec<u8>>();
            let writer = s.spawn(move || write_blocks(out, queued, recycle));
            let mut fed = Ok(());
            for &&(t, to) in plan {
                let start = data_start + t.data_offsets.0;
                fed = self.tensor(t, start, to, &queue, &recycled, progress);
                if fed.is_err() {
                    break;
                }
            }
            // Closing the queue ends the writer once it has written what was queued.
            drop(queue);
            let wrote = writer
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            match (wrote, fed) {
                (Err(e), _) | (Ok(()), Err(e)) => Err(e),
                (Ok(()), Ok(())) => Ok(()),
            }
        })
    }

    /// Queue tensor `t` (whose data starts at file offset `start`) as `to`, a chunk
    /// at a time: a copied chunk as a mapped window, a re-encoded one through
    /// [`encode_parallel`] into a buffer the writer handed back. A closed queue (the
    /// writer failed) ends the feed quietly: the writer's error is the one reported.
    fn tensor(
        &mut self,
        t: &TensorInfo,
        start: u64,
        to: Dtype,
        queue: &std::sync::mpsc::SyncSender<Block>,
        recycled: &std::sync::mpsc::Receiver<Vec<u8>>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), SafetensorsError> {
        let io = read_err(self.input);
        let src = self.src;
        let mut at = start;
        let mut index = 0u64;
        for n in chunk_lengths(t.byte_len(), CONVERT_CHUNK) {
            let block = if to == t.dtype {
                Block::Mapped(Window::map(src, self.size, at, n).map_err(io)?)
            } else {
                let read = |first: usize, buf: &mut [u8]| {
                    src.read_exact_at(buf, at + first as u64).map_err(io)
                };
                let mut buf = recycled.try_recv().unwrap_or_default();
                index += encode_parallel(n, &read, &mut buf, t, to, index, self.saturate)?;
                Block::Encoded(buf)
            };
            if queue.send(block).is_err() {
                return Ok(());
            }
            self.done += n as u64;
            progress(self.done, self.total);
            at += n as u64;
        }
        Ok(())
    }
}

/// The writer thread: write every queued block to `out` in order, starting writeback
/// every [`WRITEBACK_STEP`] bytes so the final fsync finds little left to do (a hint
/// only: durability comes from the fsync of the commit), and hand encoded buffers back.
fn write_blocks(
    out: &mut AtomicFile,
    queued: std::sync::mpsc::Receiver<Block>,
    recycle: std::sync::mpsc::Sender<Vec<u8>>,
) -> Result<(), SafetensorsError> {
    let (mut written, mut synced) = (0u64, 0u64);
    for block in queued {
        let bytes = block.bytes();
        out.write_all(bytes).map_err(SafetensorsError::Write)?;
        written += bytes.len() as u64;
        if written - synced >= WRITEBACK_STEP {
            let w = out.writer();
            w.flush().map_err(SafetensorsError::Write)?;
            sync_range(w.get_ref(), synced);
            synced = written;
        }
        if let Block::Encoded(buf) = block {
            // The feed may have finished already; the buffer is then just freed.
            let _ = recycle.send(buf);
        }
    }
    Ok(())
}

/// Output bytes between two writeback starts.
const WRITEBACK_STEP: u64 = 8 << 20;

/// Start writeback of the file's pages from `from` (data offset; the header's few
/// bytes before it are included by the next call or the fsync) to its end.
#[cfg(target_os = "linux")]
fn sync_range(file: &File, from: u64) {
    use std::os::fd::AsRawFd;
    let Ok(offset) = libc::off64_t::try_from(from) else {
        return;
    };
    // SAFETY: sync_file_range only reads the descriptor, which `file` keeps open for
    // the call; its result is ignored on purpose (a hint: the commit fsyncs anyway).
    #[allow(
        unsafe_code,
        reason = "sync_file_range has no safe wrapper; see SAFETY"
    )]
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(not(target_os = "linux"))]
fn sync_range(_file: &File, _from: u64) {}

/// Tell the kernel the input is read once, front to back (a larger read-ahead).
#[cfg(target_os = "linux")]
fn advise_sequential(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise only reads the descriptor, open for the call; the advice
    // changes caching, never the bytes read, so its result is ignored.
    #[allow(unsafe_code, reason = "posix_fadvise has no safe wrapper; see SAFETY")]
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_sequential(_file: &File) {}

/// Source bytes of one parallel piece (a multiple of every element size): small
/// enough that a 4 MiB chunk feeds every core, large enough to amortize a task.
const PIECE: usize = 256 << 10;

/// How [`encode_parallel`] reads a piece: `read(first byte, buffer)` fills the buffer
/// with the chunk's bytes from that one on.
type ReadPiece<'r> = dyn Fn(usize, &mut [u8]) -> Result<(), SafetensorsError> + Sync + 'r;

/// Re-encode the `len` raw bytes of a chunk of `t`, read by `read`, to `to` into
/// `encoded`, in fixed pieces each read into its thread's buffer and converted in
/// parallel into its own place of the output (so the bytes never depend on the thread
/// count); the first error is the one of the lowest piece (its read first), then the
/// lowest index. Returns the number of values, the chunk's first being value `index`
/// of the tensor.
fn encode_parallel(
    len: usize,
    read: &ReadPiece<'_>,
    encoded: &mut Vec<u8>,
    t: &TensorInfo,
    to: Dtype,
    index: u64,
    saturate: bool,
) -> Result<u64, SafetensorsError> {
    use rayon::prelude::*;
    let (Some(fs), Some(ts)) = (t.dtype.size(), to.size()) else {
        return Err(SafetensorsError::RawOnly {
            tensor: t.name.clone(),
            dtype: to,
        });
    };
    let count = len / fs;
    // Every byte is overwritten by its piece: resizing alone (no clearing) spares
    // zeroing the buffer at every chunk.
    encoded.resize(count * ts, 0);
    let fast = !saturate && fast_pair(t.dtype, to);
    let piece_values = PIECE / fs;
    let work = |k: usize, dst: &mut [u8], codec: &mut Codec| -> Result<(), SafetensorsError> {
        let first = k * PIECE;
        codec.raw.resize(dst.len() / ts * fs, 0);
        read(first, &mut codec.raw)?;
        let fast = if fast {
            convert_slice(t.dtype, to, &codec.raw, dst)
        } else {
            None
        };
        let r = match fast {
            Some(r) => r,
            None => {
                let raw = std::mem::take(&mut codec.raw);
                let r = codec.encode(&raw, dst, t.dtype, to, saturate);
                codec.raw = raw;
                r
            }
        };
        r.map_err(|e| {
            let e = EncodeError {
                index: e.index + k * piece_values,
                ..e
            };
            encode_error(t, to, index, e)
        })
    };
    let results: Vec<Result<(), SafetensorsError>> = encoded
        .par_chunks_mut(piece_values * ts)
        .enumerate()
        .map(|(k, dst)| {
            // Each worker thread keeps its buffers from piece to piece and call to call.
            CODECS.with(|c| match c.try_borrow_mut() {
                Ok(mut c) => work(k, dst, &mut c),
                // A worker runs one piece at a time; this is only for safety's sake.
                Err(_) => work(k, dst, &mut Codec::default()),
            })
        })
        .collect();
    results.into_iter().collect::<Result<(), _>>()?;
    Ok(count as u64)
}

thread_local! {
    /// This thread's [`Codec`] buffers.
    static CODECS: std::cell::RefCell<Codec> = std::cell::RefCell::default();
}

/// The error of a value of `t` (the chunk's first being value `index`) that `to`
/// cannot hold.
fn encode_error(t: &TensorInfo, to: Dtype, index: u64, e: EncodeError) -> SafetensorsError {
    let tensor = t.name.clone();
    let at = index + e.index as u64;
    match e.failure {
        EncodeFailure::OutOfRange => SafetensorsError::OutOfRange {
            tensor,
            index: at,
            value: e.value,
            dtype: to,
        },
        EncodeFailure::NotExact => SafetensorsError::NotExact {
            tensor,
            index: at,
            value: e.value,
            dtype: to,
        },
        EncodeFailure::RawOnly => SafetensorsError::RawOnly { tensor, dtype: to },
    }
}

impl Codec {
    /// Re-encode the raw piece `src` of dtype `from` to `to` into `dst` through the
    /// scalar codecs (F64 sources from f64, every other dtype from exact f32).
    fn encode(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        from: Dtype,
        to: Dtype,
        saturate: bool,
    ) -> Result<(), EncodeError> {
        self.encoded.clear();
        if from == Dtype::F64 {
            self.v64.clear();
            decode_f64(from, src, &mut self.v64);
            if saturate {
                saturate_f64(&mut self.v64);
            }
            encode_f64(to, &self.v64, &mut self.encoded)?;
        } else {
            self.v32.clear();
            decode_f32(from, src, &mut self.v32);
            if saturate {
                saturate_f32(&mut self.v32);
            }
            encode_f32(to, &self.v32, &mut self.encoded)?;
        }
        // Whole elements in, whole elements out: the lengths agree.
        if let Some(d) = dst.get_mut(..self.encoded.len()) {
            d.copy_from_slice(&self.encoded);
        }
        Ok(())
    }
}

/// The lengths of the chunks `len` bytes are read in, each at most `chunk` bytes.
fn chunk_lengths(len: u64, chunk: usize) -> impl Iterator<Item = usize> {
    let chunk = chunk.max(1) as u64;
    let mut left = len;
    std::iter::from_fn(move || {
        (left > 0).then(|| {
            let n = left.min(chunk);
            left -= n;
            n as usize
        })
    })
}

/// Clamp |x| > 448 to +-448 (F8_E4M3's largest finite value), leaving NaN alone.
pub fn saturate_f32(values: &mut [f32]) {
    let max = E4M3_MAX as f32;
    for v in values {
        if v.abs() > max {
            *v = max.copysign(*v);
        }
    }
}

/// [`saturate_f32`] for f64 values.
pub fn saturate_f64(values: &mut [f64]) {
    for v in values {
        if v.abs() > E4M3_MAX {
            *v = E4M3_MAX.copysign(*v);
        }
    }
}
