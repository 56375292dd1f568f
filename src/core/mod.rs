//! The core: formats, algorithms and file-system protocols with typed errors.
//!
//! Arrows run one way: `train` uses `checkpoint`, `tokens` and `safetensors`;
//! `checkpoint` uses `safetensors`; `tokens` uses `pcg`; `safetensors` uses `atomic`.
//! Every area may use the small leaf modules `failure` (what kind of failure an error
//! is), `text` (escaping names for display) and `digest` (sha256 and hex). Nothing here prints, exits, looks at a
//! terminal or imports `cmd`, `error` or `output`: errors say their [`FailureKind`] and
//! the command layer alone turns that into an exit code.

pub mod atomic;
pub mod checkpoint;
pub mod digest;
pub mod failpoints;
pub mod failure;
pub mod files;
pub mod model;
pub mod optim;
pub mod pcg;
pub mod safetensors;
pub mod text;
pub mod tokens;
pub mod train;

pub use failure::{Failure, FailureKind};
