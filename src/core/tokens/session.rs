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

use super::stream::{TokenStream, MAX_CURSOR_BYTES};
use super::TokensError;
use crate::atomic::{self, AtomicFile};
use crate::cursor::Cursor;

/// Read the cursor file at `path`: at most [`MAX_CURSOR_BYTES`], one JSON cursor.
pub fn read_cursor(path: &Path) -> Result<Cursor, TokensError> {
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

/// A stream positioned from an optional cursor file, with an optional file to save
/// the final cursor in.
pub struct CursorSession {
    stream: TokenStream,
    save: Option<(PathBuf, AtomicFile)>,
}

impl std::fmt::Debug for CursorSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CursorSession")
            .field("stream", &self.stream)
            .field("save", &self.save.as_ref().map(|(path, _)| path))
            .finish()
    }
}

impl CursorSession {
    /// Check the save target against the stream's shards and the atomic-write rules,
    /// restore `stream` from the cursor file `resume`, then create the save target's
    /// temporary file (so an unwritable destination fails before any batch).
    pub fn start(
        mut stream: TokenStream,
        resume: Option<&Path>,
        save_to: Option<&Path>,
    ) -> Result<CursorSession, TokensError> {
        if let Some(path) = save_to {
            let inputs: Vec<&Path> = stream.shards().iter().map(|s| s.path()).collect();
            atomic::refuse_inputs(path, &inputs)?;
            atomic::check_target(path)?;
        }
        if let Some(path) = resume {
            stream
                .restore(&read_cursor(path)?)
                .map_err(|e| in_file(path, e))?;
        }
        let save = match save_to {
            Some(path) => Some((path.to_path_buf(), AtomicFile::create(path)?)),
            None => None,
        };
        Ok(CursorSession { stream, save })
    }

    /// The stream, to read batches from.
    pub fn stream(&mut self) -> &mut TokenStream {
        &mut self.stream
    }

    /// True when the final cursor will be saved.
    pub fn saves_cursor(&self) -> bool {
        self.save.is_some()
    }

    /// Save the stream's cursor (and a newline) when a target was given, atomically;
    /// returns the cursor.
    pub fn finish(self) -> Result<Cursor, TokensError> {
        let cursor = self.stream.cursor();
        if let Some((path, mut file)) = self.save {
            let text = format!("{}\n", cursor.to_json());
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
