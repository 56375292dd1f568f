//! The `train bigram` loop: token stream in, optimizer steps, atomic checkpoints out,
//! exact resume after a crash at any instant, and the final line.
//!
//! Invariants:
//! - A run is a pure function of its config (config.rs) and data: the step, the
//!   model, the optimizer state and the stream cursor after step n are the same bits
//!   whether the run got there uninterrupted or through any number of kills and
//!   `--resume`s, because a checkpoint holds all four and nothing else is carried.
//! - After every optimizer step the failpoint `train/after-step` is evaluated.
//! - Checkpoints go through the checkpoint core's protocol every `ckpt_every` steps and
//!   after the last step; a step directory that already exists (left newer than
//!   `LATEST` by a crash) is overwritten with the identical content.
//! - `DIR/final.json` is written (atomically) right before the final checkpoint, so a
//!   run killed between the two redoes the last stretch and rewrites the same bytes,
//!   and a run killed after both prints the same line again on `--resume`.
//!
//! The final line, `{"step","tokens_seen","loss","loss_bits","model_sha256",
//! "optimizer_sha256","cursor"}`: `loss` is the last step's training loss (f32,
//! shortest form), `loss_bits` its f32 bits as 8 lowercase hex digits; `model_sha256`
//! and `optimizer_sha256` are the sha256 of the tensor bytes in canonical order, i.e.
//! the concatenated little-endian F32 data of every tensor of the file sorted by name
//! (exactly the data section of the canonical safetensors file, headers excluded):
//! `bigram.weight` for the model; `bigram.weight.exp_avg` then
//! `bigram.weight.exp_avg_sq` for AdamW, `bigram.weight.momentum_buffer` for SGD with
//! momentum, nothing (the sha256 of zero bytes) for plain SGD. The count model has no
//! optimizer and no stream: both fields are null.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::{self, File, TryLockError};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::bigram::{Bigram, Workspace, WEIGHT_NAME};
use super::config::{DataId, RunConfig, CONFIG_FORMAT, CONFIG_VERSION};
use super::counts::CountsBuilder;
use super::TrainError;
use crate::core::checkpoint::{
    self, DataCursor, Loaded, OptimizerFile, OptimizerState, Payload, SaveReport, SaveRequest,
    TrainerState,
};
use crate::core::digest::{hex, sha256_hex, sha256_stream};
use crate::core::optim::{OptimConfig, OptimHeader, Optimizer};
use crate::core::pcg::{Pcg32, DEFAULT_SEQ};
use crate::core::safetensors::{self, Dtype, Tensor, TensorData};
use crate::core::tokens::{self, Cursor, RngState, Shard, TokenStream};

/// The checkpoint directory inside `--out`.
pub const CKPT_DIR: &str = "ckpt";
/// The run's config inside `--out`.
pub const CONFIG_FILE: &str = "config.json";
/// The final line's copy inside `--out`.
pub const FINAL_FILE: &str = "final.json";
/// The count model's weights inside `--out`.
pub const MODEL_FILE: &str = "model.safetensors";
/// The lock a training run holds on `--out` for its whole life.
pub const LOCK_FILE: &str = ".train.lock";
/// The metadata of every model and optimizer file: defined once, with the optimizer
/// file's rules in checkpoint.
pub use crate::core::checkpoint::optimizer::{FORMAT_KEY, FORMAT_VALUE};
/// The step a count model is saved at: one pass over the data.
pub const COUNTS_STEP: u64 = 1;
/// Ids read per chunk when counting or hashing a shard.
const CHUNK_IDS: usize = 1 << 20;
/// f32 values converted per chunk when hashing tensors.
const HASH_FLOATS: usize = 1 << 16;

/// How the model is fitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Optimizer steps on the mean cross-entropy.
    Gradient,
    /// One counting pass: W = ln((c + 1) / (n + V)).
    Counts,
}

impl Method {
    /// The config's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Method::Gradient => "gradient",
            Method::Counts => "counts",
        }
    }
}

/// Everything `tlio train bigram` was asked to do.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The shards, in stream order.
    pub data: Vec<PathBuf>,
    /// The run directory.
    pub out: PathBuf,
    /// Train until this step.
    pub max_steps: u64,
    /// B.
    pub batch: usize,
    /// T.
    pub seq_len: usize,
    /// Checkpoint every this many steps (and after the last).
    pub ckpt_every: u64,
    /// Keep only this many newest checkpoints.
    pub keep: Option<usize>,
    /// The optimizer.
    pub optim: OptimConfig,
    /// `--seed S`: the stream's generator is `seed(S, 54)`.
    pub seed: u64,
    /// Continue from the newest checkpoint (or start at 0 when there is none).
    pub resume: bool,
    /// How the model is fitted.
    pub method: Method,
    /// V, required only when no shard records it.
    pub vocab_size: Option<u32>,
}

/// What the loop reports while it runs (the command layer draws it).
#[derive(Debug, Clone)]
pub enum Progress {
    /// About to start: at `step` (0 for a fresh run), towards `max_steps`.
    Start {
        /// The step the run continues from.
        step: u64,
        /// The last step.
        max_steps: u64,
        /// Tokens consumed before this process started.
        tokens_seen: u64,
        /// The checkpoint resumed from.
        resumed_from: Option<PathBuf>,
        /// `--resume` was given but there was no checkpoint yet.
        nothing_to_resume: bool,
    },
    /// A step finished.
    Step {
        /// Its number.
        step: u64,
        /// Its training loss.
        loss: f32,
        /// Tokens consumed so far.
        tokens_seen: u64,
    },
    /// A checkpoint was committed.
    Saved {
        /// Its step.
        step: u64,
        /// Its directory.
        path: PathBuf,
    },
    /// `--resume` refused a checkpoint (or a bad `LATEST`) on its way to an older one.
    Skipped {
        /// The refused entry (`LATEST` or a step directory name), exact.
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// A save has been waiting a while for another save or gc to release the lock.
    WaitingForLock {
        /// The lock file.
        path: PathBuf,
    },
    /// The count model counted one shard.
    Counted {
        /// The shard's index.
        shard: usize,
        /// Positions counted so far.
        positions: u64,
    },
}

/// The final line (see the module documentation for every field).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FinalLine {
    /// The last step.
    pub step: u64,
    /// Tokens consumed (positions counted, for the count model).
    pub tokens_seen: u64,
    /// The last step's training loss.
    pub loss: f32,
    /// Its f32 bits, 8 lowercase hex digits.
    pub loss_bits: String,
    /// sha256 of the model's tensor bytes in canonical order.
    pub model_sha256: String,
    /// sha256 of the optimizer's tensor bytes in canonical order (null: no optimizer).
    pub optimizer_sha256: Option<String>,
    /// The stream's cursor after the last step (null: no stream).
    pub cursor: Option<Cursor>,
}

impl FinalLine {
    /// The compact JSON line with its newline: the bytes of stdout and final.json.
    pub fn to_line(&self) -> String {
        // Integers, strings, an f32 and a cursor of integers and strings always
        // serialize (a NaN loss becomes null; its bits stay in loss_bits).
        let mut s = serde_json::to_string(self).unwrap_or_default();
        s.push('\n');
        s
    }
}

/// How the run ended.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The final line (with its newline), also in `DIR/final.json`.
    pub line: String,
    /// The last checkpoint, when one was written or loaded.
    pub checkpoint: Option<PathBuf>,
}

/// sha256 of f32 tensors' little-endian bytes, tensors in the given order.
pub fn sha256_f32<'a>(tensors: impl IntoIterator<Item = &'a [f32]>) -> String {
    let mut hasher = Sha256::new();
    let mut buf = Vec::with_capacity(HASH_FLOATS * 4);
    for values in tensors {
        for chunk in values.chunks(HASH_FLOATS) {
            buf.clear();
            for v in chunk {
                buf.extend_from_slice(&v.to_le_bytes());
            }
            hasher.update(&buf);
        }
    }
    hex(&hasher.finalize())
}

/// sha256 of a whole file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String, TrainError> {
    let io_err = |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io_err)?;
    let (_, digest) = sha256_stream(&mut file, None, &mut |_| {}).map_err(io_err)?;
    Ok(hex(&digest))
}

/// The metadata of model and optimizer files' `format` key.
fn format_meta() -> BTreeMap<String, String> {
    BTreeMap::from([(FORMAT_KEY.to_string(), FORMAT_VALUE.to_string())])
}

/// Write the model canonically (`bigram.weight`, F32, metadata {"format":"tinyllm"}).
pub fn write_model(out: &mut dyn Write, model: &Bigram) -> io::Result<()> {
    let tensors = [Tensor {
        name: WEIGHT_NAME.to_string(),
        dtype: Dtype::F32,
        shape: model.shape().to_vec(),
        data: TensorData::F32(model.weight()),
    }];
    safetensors::write(out, &tensors, &format_meta())
        .map(|_| ())
        .map_err(io::Error::other)
}

// The optimizer's scalar state crosses into the checkpoint core's on-disk form (which
// must not depend on the optimizer) only through this pair of inverse conversions.

/// The checkpoint core's form of the optimizer's scalar state (SGD's does not
/// depend on the step, so its form has none).
fn optimizer_state(header: OptimHeader) -> OptimizerState {
    let step = header.step;
    match header.config {
        OptimConfig::Adamw {
            lr,
            betas,
            eps,
            weight_decay,
        } => OptimizerState::AdamW {
            step,
            lr,
            betas: [betas.0, betas.1],
            eps,
            weight_decay,
        },
        OptimConfig::Sgd {
            lr,
            momentum,
            dampening,
            nesterov,
            weight_decay,
        } => OptimizerState::Sgd {
            lr,
            momentum,
            dampening,
            nesterov,
            weight_decay,
        },
    }
}

/// The inverse of [`optimizer_state`] (SGD at step 0).
fn optim_header(state: &OptimizerState) -> OptimHeader {
    match *state {
        OptimizerState::AdamW {
            step,
            lr,
            betas,
            eps,
            weight_decay,
        } => OptimHeader {
            config: OptimConfig::Adamw {
                lr,
                betas: (betas[0], betas[1]),
                eps,
                weight_decay,
            },
            step,
        },
        OptimizerState::Sgd {
            lr,
            momentum,
            dampening,
            nesterov,
            weight_decay,
        } => OptimHeader {
            config: OptimConfig::Sgd {
                lr,
                momentum,
                dampening,
                nesterov,
                weight_decay,
            },
            step: 0,
        },
    }
}

/// Write the optimizer file canonically: its state tensors (each shaped like
/// `bigram.weight`) and metadata {"format":"tinyllm","state":<JSON>}.
pub fn write_optimizer(out: &mut dyn Write, opt: &Optimizer, shape: &[u64]) -> io::Result<()> {
    let meta = OptimizerFile {
        state: optimizer_state(opt.header()),
        tensors: BTreeMap::new(),
    }
    .metadata()
    .map_err(io::Error::other)?;
    let tensors: Vec<Tensor<'_>> = opt
        .state_tensors()
        .into_iter()
        .map(|(name, values)| Tensor {
            name,
            dtype: Dtype::F32,
            shape: shape.to_vec(),
            data: TensorData::F32(values),
        })
        .collect();
    safetensors::write(out, &tensors, &meta)
        .map(|_| ())
        .map_err(io::Error::other)
}

/// The optimizer's tensors sorted by name (the canonical order of an all-F32 file).
fn optimizer_sha256(opt: &Optimizer) -> String {
    let mut tensors = opt.state_tensors();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    sha256_f32(tensors.into_iter().map(|(_, v)| v))
}

/// A gradient-method training run in memory: model, optimizer, stream, position.
#[derive(Debug)]
pub struct Trainer {
    model: Bigram,
    opt: Optimizer,
    stream: TokenStream,
    work: Workspace,
    step: u64,
    tokens_seen: u64,
    tokens_per_step: u64,
    config: Vec<u8>,
    config_sha256: String,
}

impl Trainer {
    /// A run at step 0: zero weights, a fresh optimizer, the stream as constructed.
    pub fn fresh(
        stream: TokenStream,
        vocab: u32,
        optim: OptimConfig,
        config: Vec<u8>,
    ) -> Result<Self, TrainError> {
        let model = Bigram::zeros(vocab)?;
        let opt = Optimizer::new(optim, &model.param_specs())?;
        Self::assemble(model, opt, stream, 0, 0, config)
    }

    fn assemble(
        model: Bigram,
        opt: Optimizer,
        stream: TokenStream,
        step: u64,
        tokens_seen: u64,
        config: Vec<u8>,
    ) -> Result<Self, TrainError> {
        let tokens_per_step = (stream.batch() as u64)
            .checked_mul(stream.seq_len() as u64)
            .ok_or_else(|| TrainError::Usage("--batch times --seq-len overflows".into()))?;
        let config_sha256 = sha256_hex(&config);
        Ok(Trainer {
            model,
            opt,
            stream,
            work: Workspace::new(),
            step,
            tokens_seen,
            tokens_per_step,
            config,
            config_sha256,
        })
    }

    /// Continue from a loaded checkpoint: the model, the optimizer, the step, the
    /// tokens seen and the cursor (restored into `stream`, built over the same shards).
    pub fn from_checkpoint(
        mut stream: TokenStream,
        vocab: u32,
        optim: OptimConfig,
        config: Vec<u8>,
        loaded: &Loaded,
    ) -> Result<Self, TrainError> {
        let bad = |why: String| TrainError::BadCheckpoint {
            path: loaded.path.clone(),
            why,
        };
        let file = loaded.model()?;
        let v = u64::from(vocab);
        match file.header().tensors() {
            [t] if t.name == WEIGHT_NAME && t.dtype == Dtype::F32 && t.shape == [v, v] => {}
            _ => {
                return Err(bad(format!(
                    "{} must hold exactly {WEIGHT_NAME}, F32 [{v}, {v}]",
                    checkpoint::MODEL_NAME
                )))
            }
        }
        let model = Bigram::from_weights(vocab, file.decode_f32(WEIGHT_NAME)?)?;
        drop(file);
        let opt_file = loaded
            .optimizer()
            .map_err(|e| bad(format!("{}: {e}", checkpoint::OPTIMIZER_NAME)))?
            .ok_or_else(|| bad(format!("it has no {}", checkpoint::OPTIMIZER_NAME)))?;
        let header = optim_header(&opt_file.state);
        if header.config != optim {
            return Err(bad(format!(
                "its optimizer state ({}) disagrees with its config",
                opt_file.state.to_json().unwrap_or_default()
            )));
        }
        if matches!(optim, OptimConfig::Adamw { .. }) && header.step != loaded.step {
            return Err(bad(format!(
                "the optimizer has taken {} steps, the checkpoint is at step {}",
                header.step, loaded.step
            )));
        }
        let tensors = opt_file
            .tensors
            .into_iter()
            .map(|(name, (_, values))| (name, values))
            .collect();
        let opt = Optimizer::from_state(header, &model.param_specs(), tensors)?;
        let state = &loaded.state;
        let (Some(dc), Some(rng)) = (state.data_cursor, state.rng_state) else {
            return Err(bad(
                "trainer_state.json has no data_cursor or rng_state".into()
            ));
        };
        stream.restore(&Cursor {
            shard: dc.shard,
            offset: dc.offset,
            rng: RngState {
                state: rng.state,
                inc: rng.inc,
            },
        })?;
        Self::assemble(model, opt, stream, loaded.step, state.tokens_seen, config)
    }

    /// The step reached.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Tokens consumed so far.
    pub fn tokens_seen(&self) -> u64 {
        self.tokens_seen
    }

    /// The model.
    pub fn model(&self) -> &Bigram {
        &self.model
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &Optimizer {
        &self.opt
    }

    /// The stream's cursor (the next window).
    pub fn cursor(&self) -> Cursor {
        self.stream.cursor()
    }

    /// One optimizer step on the next batch; returns its loss (before the update).
    pub fn train_step(&mut self) -> Result<f32, TrainError> {
        let batch = self.stream.next_batch();
        let loss =
            self.model
                .train_step(&mut self.opt, &batch.inputs, &batch.targets, &mut self.work)?;
        self.step = self.step.saturating_add(1);
        self.tokens_seen = self.tokens_seen.saturating_add(self.tokens_per_step);
        Ok(loss)
    }

    /// The trainer state of the current position.
    pub fn trainer_state(&self) -> TrainerState {
        let c = self.stream.cursor();
        TrainerState {
            step: self.step,
            tokens_seen: self.tokens_seen,
            data_cursor: Some(DataCursor {
                shard: c.shard,
                offset: c.offset,
            }),
            rng_state: Some(checkpoint::RngState {
                state: c.rng.state,
                inc: c.rng.inc,
            }),
            lr: Some(self.opt.config().lr()),
            config_sha256: Some(self.config_sha256.clone()),
            git_sha: None,
        }
    }

    /// Save the current position as a checkpoint in `dir` (overwriting a leftover
    /// directory of the same step: its content would be identical).
    pub fn save(&self, dir: &Path, keep: Option<usize>) -> Result<SaveReport, TrainError> {
        self.save_waiting(dir, keep, &mut |_| {})
    }

    /// `save`, calling `on_wait` when the save has to wait for the directory's lock.
    pub fn save_waiting(
        &self,
        dir: &Path,
        keep: Option<usize>,
        on_wait: &mut dyn FnMut(&Path),
    ) -> Result<SaveReport, TrainError> {
        let shape = self.model.shape();
        let model = &self.model;
        let opt = &self.opt;
        let req = SaveRequest {
            step: self.step,
            model: Payload::Writer(Box::new(move |out: &mut dyn Write| write_model(out, model))),
            optimizer: Some(Payload::Writer(Box::new(move |out: &mut dyn Write| {
                write_optimizer(out, opt, &shape)
            }))),
            state: self.trainer_state(),
            config: Some(Cow::Borrowed(&self.config)),
            keep,
            overwrite: true,
            force: false,
        };
        Ok(checkpoint::save_waiting(dir, req, on_wait)?)
    }

    /// The final line at the current position with the last step's loss.
    pub fn final_line(&self, loss: f32) -> FinalLine {
        FinalLine {
            step: self.step,
            tokens_seen: self.tokens_seen,
            loss,
            loss_bits: format!("{:08x}", loss.to_bits()),
            model_sha256: sha256_f32([self.model.weight()]),
            optimizer_sha256: Some(optimizer_sha256(&self.opt)),
            cursor: Some(self.stream.cursor()),
        }
    }
}

/// Holds `DIR/.train.lock` for the run's life so that two runs never share a
/// directory; released by the OS when the process ends, however it ends.
#[derive(Debug)]
struct RunLock {
    _file: File,
}

impl RunLock {
    fn acquire(out: &Path) -> Result<Self, TrainError> {
        let path = out.join(LOCK_FILE);
        let io = |source| TrainError::Io {
            path: path.clone(),
            source,
        };
        // Never follow a symlink or block on a FIFO planted at the lock's name, and
        // lock only a regular file.
        let file = checkpoint::fsops::open_lock_file(&path).map_err(io)?;
        match file.try_lock() {
            Ok(()) => Ok(RunLock { _file: file }),
            Err(TryLockError::WouldBlock) => Err(TrainError::Locked { path }),
            Err(TryLockError::Error(source)) => Err(TrainError::Io { path, source }),
        }
    }
}

fn check_spec(spec: &RunSpec) -> Result<(), TrainError> {
    let usage = |m: &str| Err(TrainError::Usage(m.to_string()));
    if spec.data.is_empty() {
        return usage("at least one --data shard is required");
    }
    if spec.method == Method::Gradient {
        if spec.max_steps == 0 {
            return usage("--max-steps must be at least 1");
        }
        if spec.ckpt_every == 0 {
            return usage("--ckpt-every must be at least 1");
        }
        if spec.batch == 0 {
            return usage("--batch must be at least 1");
        }
        if spec.seq_len == 0 {
            return usage("--seq-len must be at least 1");
        }
        // Before anything is created or allocated: a huge --batch is one error line.
        tokens::check_batch_shape(spec.seq_len, spec.batch)?;
    }
    if spec.keep == Some(0) {
        return usage("--keep must be at least 1");
    }
    spec.optim.validate()?;
    Ok(())
}

/// V from `--vocab-size` or the first shard that records one (the others are checked
/// against it when opened); refused when the state would not fit the memory limit.
fn decide_vocab(spec: &RunSpec) -> Result<u32, TrainError> {
    let vocab = match spec.vocab_size {
        Some(v) => v,
        None => {
            let mut found = None;
            for path in &spec.data {
                if let Some(v) = tokens::read_shard_header(path)?.vocab {
                    found = Some(v);
                    break;
                }
            }
            found.ok_or(TrainError::NoVocab)?
        }
    };
    super::check_model_vocab(vocab)?;
    Ok(vocab)
}

fn build_config(spec: &RunSpec, vocab: u32, shards: &[Shard]) -> Result<Vec<u8>, TrainError> {
    let mut data = Vec::with_capacity(shards.len());
    for shard in shards {
        data.push(DataId {
            sha256: sha256_file(shard.path())?,
            tokens: shard.len() as u64,
        });
    }
    let gradient = spec.method == Method::Gradient;
    let config = RunConfig {
        format: CONFIG_FORMAT.to_string(),
        version: CONFIG_VERSION,
        model: "bigram".to_string(),
        method: spec.method.name().to_string(),
        vocab_size: vocab,
        data,
        batch: gradient.then_some(spec.batch as u64),
        seq_len: gradient.then_some(spec.seq_len as u64),
        seed: gradient.then_some(spec.seed),
        optimizer: gradient.then_some(spec.optim),
    };
    Ok(config.to_bytes())
}

/// Whether `ckpt` holds any checkpoint (a step directory or a `LATEST`).
fn holds_checkpoints(ckpt: &Path) -> Result<bool, TrainError> {
    if !ckpt.exists() {
        return Ok(false);
    }
    let listing = checkpoint::list(ckpt)?;
    Ok(!listing.steps.is_empty() || listing.latest.is_some())
}

/// Refuse a config that disagrees with the checkpoint's, naming the field.
fn check_resume_config(loaded: &Loaded, config: &[u8]) -> Result<(), TrainError> {
    let bad = |why: String| TrainError::BadCheckpoint {
        path: loaded.path.clone(),
        why,
    };
    let stored = loaded
        .config
        .as_deref()
        .ok_or_else(|| bad("it has no config.json: not a train bigram checkpoint".into()))?;
    let theirs = RunConfig::from_bytes(stored).map_err(|e| bad(format!("config.json: {e}")))?;
    let ours = RunConfig::from_bytes(config).map_err(|e| bad(format!("config: {e}")))?;
    if let Some(m) = theirs.first_mismatch(&ours) {
        return Err(TrainError::ConfigMismatch {
            field: m.field,
            checkpoint: m.checkpoint,
            given: m.given,
        });
    }
    if stored != config {
        return Err(bad(
            "config.json is not in this version's canonical form".into()
        ));
    }
    Ok(())
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    Ok(crate::core::atomic::write_file(path, bytes)?)
}

/// Run `tlio train bigram` as `spec` says, reporting through `progress`. Returns the
/// final line (also written to `DIR/final.json`).
pub fn run(spec: &RunSpec, progress: &mut dyn FnMut(Progress)) -> Result<RunOutcome, TrainError> {
    check_spec(spec)?;
    let vocab = decide_vocab(spec)?;
    let mut shards = Vec::with_capacity(spec.data.len());
    for path in &spec.data {
        shards.push(Shard::open(path, Some(vocab))?);
    }
    let config = build_config(spec, vocab, &shards)?;
    // No output may replace a data shard (compared by device and inode).
    let inputs: Vec<&Path> = spec.data.iter().map(PathBuf::as_path).collect();
    for name in [CONFIG_FILE, FINAL_FILE, MODEL_FILE] {
        let path = spec.out.join(name);
        crate::core::atomic::refuse_inputs(&path, &inputs)?;
        crate::core::atomic::check_target(&path)?;
    }
    fs::create_dir_all(&spec.out).map_err(|source| TrainError::Io {
        path: spec.out.clone(),
        source,
    })?;
    let _lock = RunLock::acquire(&spec.out)?;
    let ckpt = spec.out.join(CKPT_DIR);
    // A `.lock` that is a directory, symlink or FIFO would fail the first save: refuse
    // it now, before any step is computed.
    checkpoint::check_lock_file(&ckpt)?;
    let loaded = if spec.resume && holds_checkpoints(&ckpt)? {
        let loaded = checkpoint::load(&ckpt, None)?;
        for (name, reason) in &loaded.skipped {
            progress(Progress::Skipped {
                name: name.clone(),
                reason: reason.clone(),
            });
        }
        check_resume_config(&loaded, &config)?;
        Some(loaded)
    } else {
        if holds_checkpoints(&ckpt)? {
            return Err(TrainError::ExistingCheckpoints { dir: ckpt });
        }
        None
    };
    write_atomic(&spec.out.join(CONFIG_FILE), &config)?;
    match spec.method {
        Method::Gradient => run_gradient(spec, vocab, shards, config, loaded, progress),
        Method::Counts => run_counts(spec, vocab, &shards, config, loaded, progress),
    }
}

fn run_gradient(
    spec: &RunSpec,
    vocab: u32,
    shards: Vec<Shard>,
    config: Vec<u8>,
    loaded: Option<Loaded>,
    progress: &mut dyn FnMut(Progress),
) -> Result<RunOutcome, TrainError> {
    let ckpt = spec.out.join(CKPT_DIR);
    let final_path = spec.out.join(FINAL_FILE);
    let rng = Pcg32::seed(spec.seed, DEFAULT_SEQ);
    let stream = TokenStream::new(shards, spec.seq_len, spec.batch, rng, Some(vocab))?;
    let nothing_to_resume = spec.resume && loaded.is_none();
    let mut trainer = match &loaded {
        Some(l) => Trainer::from_checkpoint(stream, vocab, spec.optim, config, l)?,
        None => Trainer::fresh(stream, vocab, spec.optim, config)?,
    };
    let start = trainer.step_count();
    progress(Progress::Start {
        step: start,
        max_steps: spec.max_steps,
        tokens_seen: trainer.tokens_seen(),
        resumed_from: loaded.as_ref().map(|l| l.path.clone()),
        nothing_to_resume,
    });
    if start > spec.max_steps {
        return Err(TrainError::PastMaxSteps {
            step: start,
            max_steps: spec.max_steps,
        });
    }
    if start == spec.max_steps {
        // Finished before: the line is in final.json, which was written before the
        // final checkpoint; it must describe exactly the loaded state.
        let existing = fs::read(&final_path).ok();
        let line = existing
            .as_deref()
            .and_then(|bytes| {
                let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
                let bits = u32::from_str_radix(value.get("loss_bits")?.as_str()?, 16).ok()?;
                let line = trainer.final_line(f32::from_bits(bits)).to_line();
                (line.as_bytes() == bytes).then_some(line)
            })
            .ok_or(TrainError::PastMaxSteps {
                step: start,
                max_steps: spec.max_steps,
            })?;
        return Ok(RunOutcome {
            line,
            checkpoint: loaded.map(|l| l.path),
        });
    }
    let mut last = None;
    while trainer.step_count() < spec.max_steps {
        let loss = trainer.train_step()?;
        fail::fail_point!("train/after-step", |_| std::process::abort());
        let step = trainer.step_count();
        // A diverged run must not end in success with "loss": null, nor save NaN
        // weights over good checkpoints.
        if !loss.is_finite() {
            return Err(TrainError::NonFiniteLoss { step, loss });
        }
        progress(Progress::Step {
            step,
            loss,
            tokens_seen: trainer.tokens_seen(),
        });
        let is_last = step == spec.max_steps;
        let mut line = None;
        if is_last {
            let text = trainer.final_line(loss).to_line();
            write_atomic(&final_path, text.as_bytes())?;
            line = Some(text);
        }
        if is_last || step % spec.ckpt_every == 0 {
            let report = trainer.save_waiting(&ckpt, spec.keep, &mut |path| {
                progress(Progress::WaitingForLock {
                    path: path.to_path_buf(),
                })
            })?;
            progress(Progress::Saved {
                step,
                path: report.path.clone(),
            });
            last = Some(report.path);
        }
        if let Some(line) = line {
            return Ok(RunOutcome {
                line,
                checkpoint: last,
            });
        }
    }
    // The loop always ends through the last step above (start < max_steps).
    Err(TrainError::PastMaxSteps {
        step: trainer.step_count(),
        max_steps: spec.max_steps,
    })
}

fn run_counts(
    spec: &RunSpec,
    vocab: u32,
    shards: &[Shard],
    config: Vec<u8>,
    _loaded: Option<Loaded>,
    progress: &mut dyn FnMut(Progress),
) -> Result<RunOutcome, TrainError> {
    progress(Progress::Start {
        step: 0,
        max_steps: COUNTS_STEP,
        tokens_seen: 0,
        resumed_from: None,
        nothing_to_resume: false,
    });
    let mut counts = CountsBuilder::new(vocab)?;
    for (index, shard) in shards.iter().enumerate() {
        let n = shard.len();
        let mut start = 0usize;
        while start < n {
            let end = start.saturating_add(CHUNK_IDS).min(n);
            let ids = shard.ids(start..end).ok_or_else(|| {
                TrainError::Shape(format!(
                    "{}: ids {start}..{end} past the end",
                    shard.path().display()
                ))
            })?;
            counts.feed(ids)?;
            start = end;
        }
        counts.end_sequence();
        progress(Progress::Counted {
            shard: index,
            positions: counts.positions(),
        });
    }
    let fit = counts.finish()?;
    let model_sha256 = sha256_f32([fit.model.weight()]);
    let line = FinalLine {
        step: COUNTS_STEP,
        tokens_seen: fit.positions,
        loss: fit.loss,
        loss_bits: format!("{:08x}", fit.loss.to_bits()),
        model_sha256,
        optimizer_sha256: None,
        cursor: None,
    }
    .to_line();
    let model_path = spec.out.join(MODEL_FILE);
    let mut file = crate::core::atomic::AtomicFile::create(&model_path)?;
    write_model(&mut file, &fit.model).map_err(|source| TrainError::Io {
        path: model_path.clone(),
        source,
    })?;
    file.commit()?;
    write_atomic(&spec.out.join(FINAL_FILE), line.as_bytes())?;
    let mut state = TrainerState::new(COUNTS_STEP);
    state.tokens_seen = fit.positions;
    state.config_sha256 = Some(sha256_hex(&config));
    let model = &fit.model;
    let req = SaveRequest {
        step: COUNTS_STEP,
        model: Payload::Writer(Box::new(move |out: &mut dyn Write| write_model(out, model))),
        optimizer: None,
        state,
        config: Some(Cow::Borrowed(&config)),
        keep: spec.keep,
        overwrite: true,
        force: false,
    };
    let report = checkpoint::save_waiting(&spec.out.join(CKPT_DIR), req, &mut |path| {
        progress(Progress::WaitingForLock {
            path: path.to_path_buf(),
        })
    })?;
    progress(Progress::Saved {
        step: COUNTS_STEP,
        path: report.path.clone(),
    });
    Ok(RunOutcome {
        line,
        checkpoint: Some(report.path),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tokens::ShardWriter;

    #[test]
    fn optimizer_state_conversions_are_inverse() {
        let adamw = OptimHeader {
            config: OptimConfig::Adamw {
                lr: 0.003,
                betas: (0.8, 0.95),
                eps: 1e-6,
                weight_decay: 0.0,
            },
            step: 7,
        };
        let sgd = OptimHeader {
            config: OptimConfig::Sgd {
                lr: 0.1,
                momentum: 0.9,
                dampening: 0.25,
                nesterov: false,
                weight_decay: 1e-4,
            },
            step: 0,
        };
        for header in [adamw, sgd] {
            assert_eq!(optim_header(&optimizer_state(header)), header);
        }
        assert_eq!(
            optimizer_state(adamw),
            OptimizerState::AdamW {
                step: 7,
                lr: 0.003,
                betas: [0.8, 0.95],
                eps: 1e-6,
                weight_decay: 0.0,
            }
        );
        // SGD's on-disk state has no step: it reads back at step 0.
        let later = OptimHeader { step: 5, ..sgd };
        assert_eq!(optim_header(&optimizer_state(later)), sgd);
    }

    const TEXT: &str = "a bigram model predicts the next byte from the current one; \
        a run killed at any instant resumes from its newest checkpoint and ends \
        bitwise equal to a run that was never interrupted. ";

    fn shard(dir: &Path) -> PathBuf {
        let path = dir.join("text.bin");
        let mut w = ShardWriter::create(&path, 256).unwrap();
        let ids: Vec<u32> = TEXT.repeat(8).bytes().map(u32::from).collect();
        w.push(&ids).unwrap();
        w.finish().unwrap();
        path
    }

    fn stream(path: &Path) -> TokenStream {
        let shard = Shard::open(path, None).unwrap();
        TokenStream::new(vec![shard], 8, 4, Pcg32::seed(11, DEFAULT_SEQ), Some(256)).unwrap()
    }

    fn config(optim: OptimConfig) -> Vec<u8> {
        RunConfig {
            format: CONFIG_FORMAT.into(),
            version: CONFIG_VERSION,
            model: "bigram".into(),
            method: "gradient".into(),
            vocab_size: 256,
            data: vec![],
            batch: Some(4),
            seq_len: Some(8),
            seed: Some(11),
            optimizer: Some(optim),
        }
        .to_bytes()
    }

    #[test]
    fn test_resume_is_bitwise() {
        let dir = tempfile::tempdir().unwrap();
        let data = shard(dir.path());
        for (k, optim) in [
            OptimConfig::adamw(0.05),
            OptimConfig::sgd(0.5, 0.9),
            OptimConfig::sgd(0.5, 0.0),
        ]
        .into_iter()
        .enumerate()
        {
            let cfg = config(optim);
            // Six steps in one go.
            let mut whole = Trainer::fresh(stream(&data), 256, optim, cfg.clone()).unwrap();
            let losses: Vec<u32> = (0..6)
                .map(|_| whole.train_step().unwrap().to_bits())
                .collect();
            // Three steps, a checkpoint, a fresh process's worth of state, three more.
            let ckpt = dir.path().join(format!("ckpt-{k}"));
            let mut first = Trainer::fresh(stream(&data), 256, optim, cfg.clone()).unwrap();
            for want in &losses[..3] {
                assert_eq!(first.train_step().unwrap().to_bits(), *want);
            }
            first.save(&ckpt, None).unwrap();
            drop(first);
            let loaded = checkpoint::load(&ckpt, None).unwrap();
            assert_eq!(loaded.step, 3);
            let mut second =
                Trainer::from_checkpoint(stream(&data), 256, optim, cfg.clone(), &loaded).unwrap();
            assert_eq!(second.tokens_seen(), 3 * 32);
            let mut last = 0.0;
            for want in &losses[3..] {
                last = second.train_step().unwrap();
                assert_eq!(last.to_bits(), *want, "{optim:?}");
            }
            assert_eq!(second.model(), whole.model());
            assert_eq!(second.final_line(last), whole.final_line(last));
            // The saved files are byte-identical too.
            let a = dir.path().join(format!("a-{k}"));
            let b = dir.path().join(format!("b-{k}"));
            whole.save(&a, None).unwrap();
            second.save(&b, None).unwrap();
            for name in [
                checkpoint::MODEL_NAME,
                checkpoint::OPTIMIZER_NAME,
                checkpoint::STATE_NAME,
            ] {
                let step = checkpoint::step_name(6);
                assert_eq!(
                    fs::read(a.join(&step).join(name)).unwrap(),
                    fs::read(b.join(&step).join(name)).unwrap(),
                    "{name} {optim:?}"
                );
            }
        }
    }

    #[test]
    fn final_line_hashes_the_canonical_data_section() {
        let dir = tempfile::tempdir().unwrap();
        let data = shard(dir.path());
        let optim = OptimConfig::adamw(0.05);
        let mut t = Trainer::fresh(stream(&data), 256, optim, config(optim)).unwrap();
        let loss = t.train_step().unwrap();
        let line = t.final_line(loss);
        let ckpt = dir.path().join("ckpt");
        let report = t.save(&ckpt, None).unwrap();
        for (file, sha) in [
            (checkpoint::MODEL_NAME, &line.model_sha256),
            (
                checkpoint::OPTIMIZER_NAME,
                line.optimizer_sha256.as_ref().unwrap(),
            ),
        ] {
            let bytes = fs::read(report.path.join(file)).unwrap();
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            assert_eq!(&sha256_hex(&bytes[8 + n..]), sha, "{file}");
        }
        let text = line.to_line();
        assert!(
            text.starts_with("{\"step\":1,\"tokens_seen\":32,\"loss\":"),
            "{text}"
        );
        assert!(
            text.ends_with("\"inc\":\"000000000000006d\"}}}\n"),
            "{text}"
        );
        assert_eq!(line.loss_bits, format!("{:08x}", loss.to_bits()));
        // Plain SGD has no state tensors: the sha256 of nothing.
        let plain = OptimConfig::sgd(0.1, 0.0);
        let t = Trainer::fresh(stream(&data), 256, plain, config(plain)).unwrap();
        assert_eq!(
            t.final_line(0.0).optimizer_sha256.unwrap(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
