//! The core: formats, algorithms and file-system protocols with typed errors.
//!
//! Arrows run one way; docs/architecture.md has the table, and `layering`'s test holds
//! the sources to it: `train` uses `checkpoint`, `tokens`, `safetensors` and `optim`;
//! `checkpoint` uses `safetensors` and `optim` (whose hyper-parameter type the
//! optimizer file stores); `model` uses `safetensors` and `files`; every area that
//! writes uses `atomic`, and `files` uses `atomic`. The leaves `failure` (what kind of
//! failure an error is), `text` (escaping names for display), `digest` (sha256 and
//! hex), `pcg` (the generator), `wire` (16-hex words, objects-only JSON), `cursor`
//! (the stream position's JSON) and `failpoints` use nothing of tlio's but each other,
//! and every area may use them. Nothing here prints, exits, looks at a terminal or
//! imports `cmd`, `error` or `output`: errors say their [`FailureKind`] and the
//! command layer alone turns that into an exit code.

pub mod atomic;
pub mod checkpoint;
pub mod cursor;
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
pub mod wire;

pub use failure::{Failure, FailureKind};
