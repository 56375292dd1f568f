//! A stream session of `tokens windows`: the cursor file it resumes from (read whole,
//! bounded) and the one it saves to (created before any batch, committed atomically
//! after the last), so a library caller gets the same checks as the command.
//!
//! Invariants: the save target is refused before any batch when it is one of the
//! stream's shards or a path an atomic write cannot replace; the cursor file read is
//! at most [`MAX_CURSOR_BYTES`], so it may be the save target too (it was read whole);
//! the saved file holds the cursor after the last batch and a newline, or nothing new.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use super::mixture::{Mixture, MixtureCursor};
use super::stream::{TokenStream, MAX_CURSOR_BYTES};
use super::TokensError;
use crate::atomic::{self, AtomicFile};
use crate::cursor::Cursor;

/// Read the cursor file at `path`: at most [`MAX_CURSOR_BYTES`], one JSON cursor.
pub fn read_cursor(path: &Path) -> Result<Cursor, TokensError> {
    read_cursor_of(path)
}

/// Read a cursor of any stream kind (a single stream's or a mixture's) from `path`.
fn read_cursor_of<C: DeserializeOwned>(path: &Path) -> Result<C, TokensError> {
    let bytes =
        crate::files::read_limited(path, MAX_CURSOR_BYTES).map_err(|error| TokensError::Io {
            path: path.to_path_buf(),
            error,
        })?;
    serde_json::from_slice(&bytes).map_err(|e| TokensError::BadCursorFile {
        path: path.to_path_buf(),
        reason: if e.is_syntax() || e.is_eof() {
            format!("not a JSON document: {e}")
        } else {
            format!("not a cursor: {e}")
        },
    })
}

/// What a session drives: a stream with shards it must not write over, a cursor it
/// restores from a file and one it saves.
pub trait Resumable {
    /// The stream's cursor type.
    type Cursor: DeserializeOwned;
    /// The paths of every shard read.
    fn input_paths(&self) -> Vec<&Path>;
    /// Restore `cursor`; `allow_new_mixture` is a mixture's consent to a cursor of
    /// another mixture (a single stream has no such thing and ignores it).
    fn resume(&mut self, cursor: &Self::Cursor, allow_new_mixture: bool)
        -> Result<(), TokensError>;
    /// The current cursor.
    fn current(&self) -> Self::Cursor;
    /// `cursor` as the compact JSON a cursor file holds.
    fn cursor_text(cursor: &Self::Cursor) -> String;
}

impl Resumable for TokenStream {
    type Cursor = Cursor;
    fn input_paths(&self) -> Vec<&Path> {
        self.shards().iter().map(|s| s.path()).collect()
    }
    fn resume(&mut self, cursor: &Cursor, _: bool) -> Result<(), TokensError> {
        self.restore(cursor)
    }
    fn current(&self) -> Cursor {
        self.cursor()
    }
    fn cursor_text(cursor: &Cursor) -> String {
        cursor.to_json()
    }
}

impl Resumable for Mixture {
    type Cursor = MixtureCursor;
    fn input_paths(&self) -> Vec<&Path> {
        self.all_shards().map(|s| s.path()).collect()
    }
    fn resume(&mut self, cursor: &MixtureCursor, allow_new: bool) -> Result<(), TokensError> {
        self.restore(cursor, allow_new)
    }
    fn current(&self) -> MixtureCursor {
        self.cursor()
    }
    fn cursor_text(cursor: &MixtureCursor) -> String {
        cursor.to_json()
    }
}

/// A stream positioned from an optional cursor file, with an optional file to save
/// the final cursor in.
pub struct CursorSession<S: Resumable = TokenStream> {
    stream: S,
    save: Option<(PathBuf, AtomicFile)>,
}

impl<S: Resumable + std::fmt::Debug> std::fmt::Debug for CursorSession<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CursorSession")
            .field("stream", &self.stream)
            .field("save", &self.save.as_ref().map(|(path, _)| path))
            .finish()
    }
}

impl<S: Resumable> CursorSession<S> {
    /// Check the save target against the stream's shards and the atomic-write rules,
    /// restore `stream` from the cursor file `resume`, then create the save target's
    /// temporary file (so an unwritable destination fails before any batch).
    pub fn start(
        stream: S,
        resume: Option<&Path>,
        save_to: Option<&Path>,
    ) -> Result<CursorSession<S>, TokensError> {
        Self::start_with(stream, resume, save_to, false)
    }

    /// [`CursorSession::start`], a mixture accepting a cursor of another mixture when
    /// `allow_new_mixture` (core's rule, [`Mixture::restore`]).
    pub fn start_with(
        mut stream: S,
        resume: Option<&Path>,
        save_to: Option<&Path>,
        allow_new_mixture: bool,
    ) -> Result<CursorSession<S>, TokensError> {
        if let Some(path) = save_to {
            atomic::refuse_inputs(path, &stream.input_paths())?;
            atomic::check_target(path)?;
        }
        if let Some(path) = resume {
            stream
                .resume(&read_cursor_of(path)?, allow_new_mixture)
                .map_err(|e| in_file(path, e))?;
        }
        let save = match save_to {
            Some(path) => Some((path.to_path_buf(), AtomicFile::create(path)?)),
            None => None,
        };
        Ok(CursorSession { stream, save })
    }

    /// The stream, to read batches from.
    pub fn stream(&mut self) -> &mut S {
        &mut self.stream
    }

    /// True when the final cursor will be saved.
    pub fn saves_cursor(&self) -> bool {
        self.save.is_some()
    }

    /// Save the stream's cursor (and a newline) when a target was given, atomically;
    /// returns the cursor.
    pub fn finish(self) -> Result<S::Cursor, TokensError> {
        let cursor = self.stream.current();
        if let Some((path, mut file)) = self.save {
            let text = format!("{}\n", S::cursor_text(&cursor));
            file.write_all(text.as_bytes())
                .map_err(|error| TokensError::Io { path, error })?;
            file.commit()?;
        }
        Ok(cursor)
    }
}

/// A restore error, with the cursor file's name in front.
fn in_file(path: &Path, e: TokensError) -> TokensError {
    match e {
        TokensError::BadCursor { .. } | TokensError::GlobalBatchMismatch { .. } => {
            TokensError::BadCursorFile {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }
        }
        other => other,
    }
}
