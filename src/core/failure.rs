//! What kind of failure a core error is: bad input, or an operation that could not be
//! done. Core owns the vocabulary; the command layer alone turns a kind into an exit
//! code.
//!
//! Invariant: every error type core defines implements [`Failure`], matching each of its
//! variants explicitly. This module names no other module of core: whoever needs to
//! classify an error chain of unknown types (the CLI's `error.rs`) keeps its own list
//! of core's error types, and tests there that the list is complete.

use std::error::Error;

/// The two kinds of failure the CLI contract tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The input is invalid: a malformed file, a value out of range, a failed check.
    Invalid,
    /// The operation could not be done: a missing file, a permission, a full disk, a
    /// lock held by another process, or a request that makes no sense.
    Operational,
}

/// Implemented by every error type of core: which kind of failure the value is.
///
/// Implementations match every variant explicitly (no `_` arm), so adding a variant
/// makes the compiler ask which kind it is.
pub trait Failure: Error {
    /// Whether this error means bad input or a failed operation.
    fn kind(&self) -> FailureKind;
}

/// `err` and its sources on one line, outermost first, joined with ": ": the text for
/// places that keep an error as a string (a verification finding, a problem list), so
/// the cause an error returns from `source()` instead of printing is never lost.
pub fn full_text(err: &(dyn Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
