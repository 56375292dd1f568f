//! The core: formats, algorithms and file-system protocols with typed errors.
//!
//! Arrows run one way; docs/architecture.md has the table, and `layering`'s test holds
//! the sources to it: `train` uses `checkpoint`, `tokens`, `safetensors` and `optim`;
//! `checkpoint` uses `safetensors` and `optim` (whose hyper-parameter type the
//! optimizer file stores); `model` uses `safetensors` and `files`; every area that
//! writes uses `atomic`, and `files` uses `atomic`. The leaves `failure` (what kind of
//! failure an error is), `text` (escaping names for display), `digest` (sha256 and
//! hex), `pcg` (the generator) and `failpoints` use nothing of tlio's but each other,
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

#[cfg(test)]
mod tests {
    use std::error::Error;
    use std::io;
    use std::path::PathBuf;

    use crate::atomic::AtomicError;
    use crate::checkpoint::{state::StateError, CheckpointError};
    use crate::model::ModelError;
    use crate::safetensors::SafetensorsError;
    use crate::train::TrainError;

    fn io() -> io::Error {
        io::Error::new(io::ErrorKind::NotFound, "No such file or directory")
    }

    fn path() -> PathBuf {
        PathBuf::from("x.bin")
    }

    /// An error prints its source or returns it, never both: the CLI joins the chain
    /// with ": " and nothing else, so a source in the message would print twice.
    #[test]
    fn no_error_prints_the_source_it_returns() {
        let errors: Vec<Box<dyn Error>> = vec![
            Box::new(AtomicError::Create {
                dir: path(),
                source: io(),
            }),
            Box::new(AtomicError::Parent {
                dir: path(),
                source: io(),
            }),
            Box::new(AtomicError::Write {
                path: path(),
                source: io(),
            }),
            Box::new(SafetensorsError::Io {
                path: path(),
                source: io(),
            }),
            Box::new(SafetensorsError::Write(io())),
            Box::new(ModelError::Io {
                path: path(),
                source: io(),
            }),
            Box::new(ModelError::Write {
                path: path(),
                source: io(),
            }),
            Box::new(ModelError::Shard {
                shard: "a.safetensors".into(),
                source: SafetensorsError::Io {
                    path: path(),
                    source: io(),
                },
            }),
            Box::new(ModelError::Safetensors(SafetensorsError::Io {
                path: path(),
                source: io(),
            })),
            Box::new(TrainError::Io {
                path: path(),
                source: io(),
            }),
            Box::new(CheckpointError::Io {
                path: path(),
                source: io(),
            }),
            Box::new(CheckpointError::State(StateError::Schema(
                "unknown key `x`".into(),
            ))),
        ];
        let mut with_source = 0;
        for err in &errors {
            let text = err.to_string();
            let mut cause = err.source();
            while let Some(c) = cause {
                with_source += 1;
                assert!(
                    !text.contains(&c.to_string()),
                    "{text:?} prints its source {:?}",
                    c.to_string()
                );
                cause = c.source();
            }
        }
        assert!(with_source >= errors.len());
    }
}
