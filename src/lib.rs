//! tlio: strict, fast tools for the files a language-model training run lives on.
//!
//! `core` holds every format rule, algorithm and file-system protocol and never prints
//! or exits; `cmd` turns parsed arguments into one core call plus printing; `output`
//! decides where and how results, progress and chatter appear.

pub mod cmd;
pub mod core;
pub mod error;
pub mod interrupt;
pub mod output;
