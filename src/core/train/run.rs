//! The `train bigram` loop: token stream in, optimizer steps, atomic checkpoints out,
//! exact resume after a crash at any instant, and the final line (its fields are in
//! `final_line`).
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

use std::borrow::Cow;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::checks::{
    build_config, check_resume_config, check_spec, decide_vocab, holds_checkpoints, RunLock,
};
use super::counts::{CountsBuilder, CountsFit};
use super::final_line::{sha256_f32, FinalLine};
use super::layout::{CKPT_DIR, CONFIG_FILE, COUNTS_STEP, FINAL_FILE, MODEL_FILE};
use super::spec::{Method, Progress, RunOutcome, RunSpec};
use super::trainer::Trainer;
use super::writers::write_model;
use super::TrainError;
use crate::checkpoint::{self, Loaded, Payload, SaveRequest, TrainerState};
use crate::digest::sha256_hex;
use crate::pcg::{Pcg32, DEFAULT_SEQ};
use crate::tokens::{Ranks, Shard, ShardOrder, StreamOptions, TokenStream};

/// Ids read per chunk when counting a shard.
const CHUNK_IDS: usize = 1 << 20;

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    Ok(crate::atomic::write_file(path, bytes)?)
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
    prepare_out(spec)?;
    let _lock = RunLock::acquire(&spec.out)?;
    let loaded = resume_point(spec, &config, progress)?;
    write_atomic(&spec.out.join(CONFIG_FILE), &config)?;
    match spec.method {
        Method::Gradient => run_gradient(spec, vocab, shards, config, loaded, progress),
        Method::Counts => run_counts(spec, vocab, &shards, &config, progress),
    }
}

/// Refuse outputs that would replace a data shard (compared by device and inode) or
/// are not plain files, then create `--out`.
fn prepare_out(spec: &RunSpec) -> Result<(), TrainError> {
    let inputs: Vec<&Path> = spec.data.iter().map(PathBuf::as_path).collect();
    for name in [CONFIG_FILE, FINAL_FILE, MODEL_FILE] {
        let path = spec.out.join(name);
        crate::atomic::refuse_inputs(&path, &inputs)?;
        crate::atomic::check_target(&path)?;
    }
    crate::files::create_dir_all(&spec.out).map_err(|source| TrainError::Io {
        path: spec.out.clone(),
        source,
    })
}

/// The checkpoint to continue from: the newest good one with `--resume` (`None` when
/// there is none yet), refused without `--resume` when checkpoints exist.
fn resume_point(
    spec: &RunSpec,
    config: &[u8],
    progress: &mut dyn FnMut(Progress),
) -> Result<Option<Loaded>, TrainError> {
    let ckpt = spec.out.join(CKPT_DIR);
    // A `.lock` that is a directory, symlink or FIFO would fail the first save: refuse
    // it now, before any step is computed.
    checkpoint::check_lock_file(&ckpt)?;
    if !holds_checkpoints(&ckpt)? {
        return Ok(None);
    }
    if !spec.resume {
        return Err(TrainError::ExistingCheckpoints { dir: ckpt });
    }
    let loaded = checkpoint::load(&ckpt, None)?;
    for (name, reason) in &loaded.skipped {
        progress(Progress::Skipped {
            name: name.clone(),
            reason: reason.clone(),
        });
    }
    check_resume_config(&loaded, config)?;
    Ok(Some(loaded))
}

fn run_gradient(
    spec: &RunSpec,
    vocab: u32,
    shards: Vec<Shard>,
    config: Vec<u8>,
    loaded: Option<Loaded>,
    progress: &mut dyn FnMut(Progress),
) -> Result<RunOutcome, TrainError> {
    let rng = Pcg32::seed(spec.seed, DEFAULT_SEQ);
    let order = if spec.shuffle {
        ShardOrder::Shuffled
    } else {
        ShardOrder::InOrder
    };
    let options = StreamOptions {
        ranks: Ranks::SINGLE,
        order,
    };
    let stream =
        TokenStream::with_options(shards, spec.seq_len, spec.batch, rng, Some(vocab), options)?;
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
        nothing_to_resume: spec.resume && loaded.is_none(),
    });
    let past = TrainError::PastMaxSteps {
        step: start,
        max_steps: spec.max_steps,
    };
    if start > spec.max_steps {
        return Err(past);
    }
    if start == spec.max_steps {
        let line = finished_line(&trainer, &spec.out.join(FINAL_FILE)).ok_or(past)?;
        return Ok(RunOutcome {
            line,
            checkpoint: loaded.map(|l| l.path),
        });
    }
    train_to_the_end(spec, &mut trainer, progress)
}

/// A run that finished before: its line is in final.json, which was written before
/// the final checkpoint; it must describe exactly the loaded state (else `None`).
fn finished_line(trainer: &Trainer, final_path: &Path) -> Option<String> {
    let bytes = fs::read(final_path).ok()?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let bits = u32::from_str_radix(value.get("loss_bits")?.as_str()?, 16).ok()?;
    let line = trainer.final_line(f32::from_bits(bits)).to_line();
    (line.as_bytes() == bytes.as_slice()).then_some(line)
}

/// Step until `max_steps` (start < max_steps), checkpointing every `ckpt_every` steps
/// and after the last, whose final line goes to final.json first.
fn train_to_the_end(
    spec: &RunSpec,
    trainer: &mut Trainer,
    progress: &mut dyn FnMut(Progress),
) -> Result<RunOutcome, TrainError> {
    let ckpt = spec.out.join(CKPT_DIR);
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
            write_atomic(&spec.out.join(FINAL_FILE), text.as_bytes())?;
            line = Some(text);
        }
        if is_last || step.is_multiple_of(spec.ckpt_every) {
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
    config: &[u8],
    progress: &mut dyn FnMut(Progress),
) -> Result<RunOutcome, TrainError> {
    progress(Progress::Start {
        step: 0,
        max_steps: COUNTS_STEP,
        tokens_seen: 0,
        resumed_from: None,
        nothing_to_resume: false,
    });
    let fit = count_shards(vocab, shards, progress)?;
    let line = FinalLine {
        step: COUNTS_STEP,
        tokens_seen: fit.positions,
        loss: fit.loss,
        loss_bits: format!("{:08x}", fit.loss.to_bits()),
        model_sha256: sha256_f32([fit.model.weight()]),
        optimizer_sha256: None,
        cursor: None,
    }
    .to_line();
    let model_path = spec.out.join(MODEL_FILE);
    let mut file = crate::atomic::AtomicFile::create(&model_path)?;
    write_model(&mut file, &fit.model).map_err(|source| TrainError::Io {
        path: model_path.clone(),
        source,
    })?;
    file.commit()?;
    write_atomic(&spec.out.join(FINAL_FILE), line.as_bytes())?;
    let path = save_counts(spec, &fit, config, progress)?;
    Ok(RunOutcome {
        line,
        checkpoint: Some(path),
    })
}

/// One counting pass over every shard, in chunks, reporting after each shard.
fn count_shards(
    vocab: u32,
    shards: &[Shard],
    progress: &mut dyn FnMut(Progress),
) -> Result<CountsFit, TrainError> {
    let mut counts = CountsBuilder::new(vocab)?;
    for (index, shard) in shards.iter().enumerate() {
        let n = shard.len();
        let mut start = 0usize;
        while start < n {
            let end = start.saturating_add(CHUNK_IDS).min(n);
            let ids = shard.ids(start..end)?;
            counts.feed(ids)?;
            start = end;
        }
        counts.end_sequence();
        progress(Progress::Counted {
            shard: index,
            positions: counts.positions(),
        });
    }
    counts.finish()
}

/// The count model's one checkpoint, at [`COUNTS_STEP`]; returns its directory.
fn save_counts(
    spec: &RunSpec,
    fit: &CountsFit,
    config: &[u8],
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, TrainError> {
    let mut state = TrainerState::new(COUNTS_STEP);
    state.tokens_seen = fit.positions;
    state.config_sha256 = Some(sha256_hex(config));
    let model = &fit.model;
    let req = SaveRequest {
        step: COUNTS_STEP,
        model: Payload::Writer(Box::new(move |out: &mut dyn Write| write_model(out, model))),
        optimizer: None,
        state,
        config: Some(Cow::Borrowed(config)),
        keep: spec.keep,
        overwrite: true,
        force: false,
        lock_wait: checkpoint::SAVE_LOCK_WAIT,
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
    Ok(report.path)
}
