//! The names inside a run directory (`--out`) and the fixed numbers of a run's
//! layout.
//!
//! Invariant: these names are the whole of what a run writes at the top of `--out`
//! (besides the checkpoint directory's own content, which the checkpoint core owns);
//! every writer and every check uses them from here.

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
pub use crate::checkpoint::optimizer::{FORMAT_KEY, FORMAT_VALUE};
/// The step a count model is saved at: one pass over the data.
pub const COUNTS_STEP: u64 = 1;
