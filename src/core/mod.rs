//! The core: formats, algorithms and file-system protocols with typed errors.
//!
//! Arrows run one way: `train` uses `checkpoint`, `tokens` and `safetensors`;
//! `checkpoint` uses `safetensors`; `tokens` uses `pcg`; `safetensors` uses nothing of
//! tlio's. Nothing here prints, exits, looks at a terminal or imports `cmd`.

use crate::error::ExitClass;

pub mod atomic;
pub mod checkpoint;
pub mod failpoints;
pub mod files;
pub mod optim;
pub mod pcg;
pub mod safetensors;
pub mod text;
pub mod tokens;
pub mod train;

/// The exit class of a core error, when `err` is one of core's error types.
pub fn classify_error(err: &(dyn std::error::Error + 'static)) -> Option<ExitClass> {
    use crate::error::Classify;
    if let Some(e) = err.downcast_ref::<atomic::AtomicError>() {
        return Some(e.exit_class());
    }
    if let Some(e) = err.downcast_ref::<failpoints::FailpointsError>() {
        return Some(e.exit_class());
    }
    if let Some(e) = err.downcast_ref::<checkpoint::CheckpointError>() {
        return Some(e.exit_class());
    }
    if let Some(e) = err.downcast_ref::<checkpoint::optimizer::OptimizerError>() {
        return Some(e.exit_class());
    }
    if let Some(e) = err.downcast_ref::<optim::OptimError>() {
        return Some(e.exit_class());
    }
    if let Some(e) = err.downcast_ref::<safetensors::SafetensorsError>() {
        return Some(e.exit_class());
    }
    if let Some(e) = err.downcast_ref::<tokens::TokensError>() {
        return Some(e.exit_class());
    }
    if let Some(e) = err.downcast_ref::<train::TrainError>() {
        return Some(e.exit_class());
    }
    None
}
