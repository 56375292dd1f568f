//! [`Trainer`]: a gradient-method run in memory (model, optimizer, token stream,
//! position), its step, its checkpoint in both directions and its final line.
//!
//! Invariants: a checkpoint holds the whole of a trainer (model, optimizer state,
//! step, tokens seen, the stream's cursor and the run's config), so a trainer rebuilt
//! from one continues bit for bit. The checkpoint schedule and the failpoint after each
//! step are `run`'s, not the trainer's.

use std::borrow::Cow;
use std::io::Write;
use std::path::Path;

use super::bigram::{Bigram, Workspace, WEIGHT_NAME};
use super::final_line::{optimizer_sha256, sha256_f32, FinalLine};
use super::writers::{write_model, write_optimizer};
use super::TrainError;
use crate::checkpoint::{self, Loaded, Payload, SaveReport, SaveRequest, TrainerState};
use crate::digest::sha256_hex;
use crate::optim::{Hyper, OptimConfig, Optimizer};
use crate::safetensors::Dtype;
use crate::tokens::{Cursor, TokenStream};

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
            .ok_or_else(|| TrainError::Usage("batch times seq_len overflows".into()))?;
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
        let model = load_model(loaded, vocab)?;
        let opt = load_optimizer(loaded, optim, &model)?;
        let state = &loaded.state;
        let Some(cursor) = state.cursor() else {
            return Err(bad_checkpoint(
                loaded,
                "trainer_state.json has no data_cursor or rng_state".into(),
            ));
        };
        stream.restore(&cursor)?;
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
        let batch = self.stream.next_batch()?;
        let loss =
            self.model
                .train_step(&mut self.opt, &batch.inputs, &batch.targets, &mut self.work)?;
        self.step = self.step.saturating_add(1);
        self.tokens_seen = self.tokens_seen.saturating_add(self.tokens_per_step);
        Ok(loss)
    }

    /// The trainer state of the current position.
    pub fn trainer_state(&self) -> TrainerState {
        let mut state = TrainerState {
            step: self.step,
            tokens_seen: self.tokens_seen,
            lr: Some(self.opt.config().lr()),
            config_sha256: Some(self.config_sha256.clone()),
            ..TrainerState::new(self.step)
        };
        state.set_cursor(self.stream.cursor());
        state
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
            lock_wait: checkpoint::SAVE_LOCK_WAIT,
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

/// A checkpoint that verifies but does not fit this run.
fn bad_checkpoint(loaded: &Loaded, why: String) -> TrainError {
    TrainError::BadCheckpoint {
        path: loaded.path.clone(),
        why,
    }
}

/// The checkpoint's model: exactly `bigram.weight`, F32 [V, V].
fn load_model(loaded: &Loaded, vocab: u32) -> Result<Bigram, TrainError> {
    let file = loaded.model()?;
    let v = u64::from(vocab);
    match file.header().tensors() {
        [t] if t.name == WEIGHT_NAME && t.dtype == Dtype::F32 && t.shape == [v, v] => {}
        _ => {
            return Err(bad_checkpoint(
                loaded,
                format!(
                    "{} must hold exactly {WEIGHT_NAME}, F32 [{v}, {v}]",
                    checkpoint::MODEL_NAME
                ),
            ))
        }
    }
    Bigram::from_weights(vocab, file.decode_f32(WEIGHT_NAME)?)
}

/// The checkpoint's optimizer: its hyper-parameters must be this run's, AdamW's step
/// the checkpoint's step, and its tensors those of `model`'s parameters.
fn load_optimizer(
    loaded: &Loaded,
    optim: OptimConfig,
    model: &Bigram,
) -> Result<Optimizer, TrainError> {
    let bad = |why: String| bad_checkpoint(loaded, why);
    let opt_file = loaded
        .optimizer()
        .map_err(|e| bad(format!("{}: {e}", checkpoint::OPTIMIZER_NAME)))?
        .ok_or_else(|| bad(format!("it has no {}", checkpoint::OPTIMIZER_NAME)))?;
    let state = opt_file.state;
    if state.config() != optim {
        // The state was read through its strict JSON form, so it writes back; a
        // failure is still reported, never an empty text.
        let json = state
            .to_json()
            .map_err(|e| bad(format!("{}: {e}", checkpoint::OPTIMIZER_NAME)))?;
        return Err(bad(format!(
            "its optimizer state ({json}) disagrees with its config"
        )));
    }
    if matches!(optim, Hyper::AdamW { .. }) && state.step() != loaded.step {
        return Err(bad(format!(
            "the optimizer has taken {} steps, the checkpoint is at step {}",
            state.step(),
            loaded.step
        )));
    }
    let tensors = opt_file
        .tensors
        .into_iter()
        .map(|(name, (_, values))| (name, values))
        .collect();
    Ok(Optimizer::from_state(state, &model.param_specs(), tensors)?)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::PathBuf;

    use super::*;
    use crate::pcg::{Pcg32, DEFAULT_SEQ};
    use crate::tokens::{Shard, ShardWriter};
    use crate::train::config::{RunConfig, CONFIG_FORMAT, CONFIG_VERSION};

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
