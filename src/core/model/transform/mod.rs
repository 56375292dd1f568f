//! Whole-model transformations: `convert` (re-encode floats), `quantize` (int4-gG-sym)
//! and `dequantize`, for a file (file out, atomic) or an index or directory (directory
//! out, atomic as a whole via [`OutDir`]): same sharding, index rewritten with the true
//! `total_size`, `config.json`'s dtype updated by convert, other files copied.
//!
//! Invariants: memory is bounded by fixed chunks per worker whatever the tensor sizes
//! (inputs are read with positioned reads, never mapped, so their pages are not this
//! process's); output bytes depend only on the input and the options (shards may be
//! processed in parallel, each into its own file); nothing appears under the output
//! name unless everything succeeded.
//!
//! The steps live in one file each: this one runs them (shards in parallel, the
//! report, the commit), `plan` decides each output tensor, `write` streams a shard
//! out, `read` is the positioned reads, `out` the places tensors are written to,
//! `quant` the int4 passes and `rewrite` the index, config and other files of a
//! directory.

mod mx;
mod out;
mod plan;
mod quant;
mod read;
mod rewrite;
mod write;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::int4::parse_quant;
use super::outdir::OutDir;
use super::{Kind, Model, ModelError};
use crate::atomic::{same_file, AtomicError};
use crate::safetensors::convert::is_convert_target;
use crate::safetensors::{Dtype, SafetensorsError};
use rewrite::{copy_other_files, tally, write_config, write_index};
use write::shard_to;

/// Elements handled per step and worker (a multiple of every group size up to
/// [`MAX_GROUP`]): a few MiB of buffers.
pub const CHUNK_ELEMS: usize = 1 << 20;
/// Largest group size accepted (a group is quantized in one piece).
pub const MAX_GROUP: u64 = 1 << 20;
/// Most worker threads used for shards.
pub const MAX_JOBS: usize = 16;

/// What to do to each shard.
pub enum Op<'a> {
    /// Re-encode the selected float tensors to `target`.
    Convert {
        /// Target dtype.
        target: Dtype,
        /// Clamp out-of-range F8_E4M3 values instead of failing.
        saturate: bool,
        /// Which tensors.
        select: &'a (dyn Fn(&str) -> bool + Sync),
    },
    /// Quantize the selected 2-D float tensors to int4 pairs with group `group`.
    Quantize {
        /// Group size G.
        group: u64,
        /// Which tensors.
        select: &'a (dyn Fn(&str) -> bool + Sync),
    },
    /// Turn every int4 pair back into one tensor of dtype `target`.
    Dequantize {
        /// Target dtype.
        target: Dtype,
    },
}

/// What a transformation did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// Tensors transformed (converted, quantized or dequantized).
    pub transformed: u64,
    /// Tensors copied unchanged.
    pub copied: u64,
    /// Safetensors files written.
    pub shards: usize,
    /// Other files copied (tokenizer, generation config, ...), by name.
    pub files_copied: Vec<String>,
    /// Bytes of tensor data read.
    pub bytes_in: u64,
    /// Bytes of the safetensors files written.
    pub bytes_out: u64,
    /// Whether the output is a directory.
    pub directory: bool,
}

/// What one shard's writing produced: its counts and what the index records.
pub(super) struct ShardResult {
    pub(super) transformed: u64,
    pub(super) copied: u64,
    pub(super) file_size: u64,
    pub(super) data_len: u64,
    pub(super) params: u64,
    pub(super) names: Vec<String>,
}

/// Run `op` on `model`, writing `output`. `jobs` workers process shards in parallel;
/// `progress(done, total)` receives source data bytes.
pub fn run(
    model: &Model,
    output: &Path,
    op: &Op<'_>,
    jobs: usize,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Report, ModelError> {
    check_op(model, op)?;
    let pairs = model.logical.iter().any(|l| l.storage.pair().is_some());
    if pairs && !matches!(op, Op::Dequantize { .. }) {
        // Convert and quantize copy existing int4 and MX pairs unchanged: their scales are
        // checked first, as every command does (dequantize checks each as it reads).
        super::view::ModelView::map(model.clone())?;
    }
    let total: u64 = model.shards.iter().map(|s| s.header.data_len()).sum();
    let size_in = model
        .shards
        .iter()
        .fold(0u64, |acc, s| acc.saturating_add(s.header.file_size));
    let done = AtomicU64::new(0);
    let shared = Shared {
        done: &done,
        total,
        progress,
    };
    if model.kind == Kind::File {
        return run_file(model, output, op, &shared, size_in);
    }
    let out = OutDir::create(output, model.dir.as_deref())?;
    let results = parallel_shards(model, &out, op, jobs, &shared)?;
    let mut report = Report {
        shards: results.len(),
        bytes_in: size_in,
        directory: true,
        ..Report::default()
    };
    let totals = tally(model, &results, &mut report);
    write_index(model, &out, &totals)?;
    write_config(model, &out, op)?;
    report.files_copied = copy_other_files(model, &out)?;
    // Every file is in the temporary directory, nothing is under the final name yet:
    // the instant an interruption must leave no trace (tests pause here).
    fail::fail_point!("model/before-commit");
    out.commit()?;
    Ok(report)
}

/// A single-file model: one shard written atomically straight to `output`.
fn run_file(
    model: &Model,
    output: &Path,
    op: &Op<'_>,
    shared: &Shared<'_>,
    size_in: u64,
) -> Result<Report, ModelError> {
    let shard = model.shards.first().ok_or_else(|| ModelError::Usage {
        detail: "the model has no safetensors file".to_string(),
    })?;
    if same_file(&shard.path, output) {
        return Err(ModelError::SameAsInput {
            path: output.to_path_buf(),
        });
    }
    let r = shard_to(model, 0, output, op, shared, true)?;
    Ok(Report {
        transformed: r.transformed,
        copied: r.copied,
        shards: 1,
        files_copied: Vec::new(),
        bytes_in: size_in,
        bytes_out: r.file_size,
        directory: false,
    })
}

/// The byte counter all shard workers add to and its consumer.
pub(super) struct Shared<'a> {
    /// Source data bytes done so far, over every worker.
    pub(super) done: &'a AtomicU64,
    /// Source data bytes in all.
    pub(super) total: u64,
    /// Receives (done, total).
    pub(super) progress: &'a (dyn Fn(u64, u64) + Sync),
}

fn check_op(model: &Model, op: &Op<'_>) -> Result<(), ModelError> {
    match op {
        Op::Convert { target, .. } | Op::Dequantize { target } => {
            if !is_convert_target(*target) {
                return Err(ModelError::Safetensors(SafetensorsError::BadTarget {
                    dtype: *target,
                }));
            }
        }
        Op::Quantize { group, .. } => {
            if *group < 2 || group % 2 != 0 || *group > MAX_GROUP {
                return Err(ModelError::BadGroup { group: *group });
            }
            if let Some(q) = &model.quant {
                if parse_quant(q) != Some(*group) {
                    return Err(ModelError::Usage {
                        detail: format!(
                            "the model is already quantized as {q}; quantizing more tensors with group {group} would mix group sizes"
                        ),
                    });
                }
            }
        }
    }
    Ok(())
}

fn parallel_shards(
    model: &Model,
    out: &OutDir,
    op: &Op<'_>,
    jobs: usize,
    shared: &Shared<'_>,
) -> Result<Vec<ShardResult>, ModelError> {
    let n = model.shards.len();
    let jobs = jobs.clamp(1, MAX_JOBS).min(n.max(1));
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let slots: Mutex<Vec<Option<Result<ShardResult, ModelError>>>> =
        Mutex::new((0..n).map(|_| None).collect());
    let work = || loop {
        if failed.load(Ordering::Relaxed) {
            return;
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(shard) = model.shards.get(i) else {
            return;
        };
        let target = out.path().join(&shard.name);
        let r = shard_to(model, i, &target, op, shared, false);
        if r.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        if let Ok(mut s) = slots.lock() {
            if let Some(slot) = s.get_mut(i) {
                *slot = Some(r);
            }
        }
    };
    if jobs == 1 {
        work();
    } else {
        std::thread::scope(|scope| {
            for _ in 0..jobs {
                scope.spawn(work);
            }
        });
    }
    // A worker that panicked poisons the lock: its shard has no result, reported below.
    let slots = slots
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut results = Vec::with_capacity(n);
    let mut first_err = None;
    for (shard, slot) in model.shards.iter().zip(slots) {
        match slot {
            Some(Ok(r)) => results.push(r),
            Some(Err(e)) => {
                let e = at_target(e, out.path(), out.target());
                first_err.get_or_insert(with_shard(e, &shard.name, model));
            }
            None => {}
        }
    }
    match first_err {
        Some(e) => Err(e),
        None if results.len() == n => Ok(results),
        None => Err(ModelError::Usage {
            detail: "a shard worker stopped without a result".to_string(),
        }),
    }
}

/// `e` with every path inside the temporary directory `tmp` shown under `target`, the
/// directory the user named: a full disk is reported as `cannot write OUT/model-…`,
/// never under a temporary name (docs/cli.md).
fn at_target(e: ModelError, tmp: &Path, target: &Path) -> ModelError {
    let shown = |path: PathBuf| match path.strip_prefix(tmp) {
        Ok(rest) => target.join(rest),
        Err(_) => path,
    };
    let atomic = |a: AtomicError| match a {
        AtomicError::Create { dir, source } => AtomicError::Create {
            dir: shown(dir),
            source,
        },
        AtomicError::Write { path, source } => AtomicError::Write {
            path: shown(path),
            source,
        },
        other => other,
    };
    let tensors = |e: SafetensorsError| match e {
        SafetensorsError::Io { path, source } => SafetensorsError::Io {
            path: shown(path),
            source,
        },
        SafetensorsError::Atomic(a) => SafetensorsError::Atomic(atomic(a)),
        other => other,
    };
    match e {
        ModelError::Write { path, source } => ModelError::Write {
            path: shown(path),
            source,
        },
        ModelError::Io { path, source } => ModelError::Io {
            path: shown(path),
            source,
        },
        ModelError::Atomic(a) => ModelError::Atomic(atomic(a)),
        ModelError::Shard { shard, source } => ModelError::Shard {
            shard,
            source: tensors(source),
        },
        ModelError::Safetensors(source) => ModelError::Safetensors(tensors(source)),
        other => other,
    }
}

fn with_shard(e: ModelError, shard: &str, model: &Model) -> ModelError {
    match e {
        ModelError::Safetensors(source) if model.shards.len() > 1 => ModelError::Shard {
            shard: shard.to_string(),
            source,
        },
        other => other,
    }
}

/// A safetensors failure of the shard being written (named by the caller).
pub(super) fn shard_err(source: SafetensorsError) -> ModelError {
    ModelError::Safetensors(source)
}
