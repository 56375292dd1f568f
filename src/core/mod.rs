//! The core: formats, algorithms and file-system protocols with typed errors.
//!
//! Arrows run one way (checked against the sources by `layering`'s test):
//! `train` uses `checkpoint`, `tokens`, `safetensors` and `optim`; `checkpoint` and
//! `model` use `safetensors`; `checkpoint` uses `optim` (whose hyper-parameter type the
//! optimizer file stores; `optim` uses nothing of tlio's but `failure`);
//! `safetensors`, `model`, `tokens` and `checkpoint` use `files` and `atomic`; `files`
//! uses `atomic`. The leaves `failure` (what kind of
//! failure an error is), `text` (escaping names for display), `digest` (sha256 and
//! hex), `pcg` (the generator) and `failpoints` use nothing of tlio's but `failure`,
//! and every area may use them. Nothing here prints, exits, looks at a terminal or
//! imports `cmd`, `error` or `output`: errors say their [`FailureKind`] and the
//! command layer alone turns that into an exit code.

pub mod atomic;
pub mod checkpoint;
pub mod digest;
pub mod failpoints;
pub mod failure;
pub mod files;
mod layering;
pub mod model;
pub mod optim;
pub mod pcg;
pub mod safetensors;
pub mod text;
pub mod tokens;
pub mod train;

pub use failure::{Failure, FailureKind};
