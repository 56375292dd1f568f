//! Conditional puts whose reply may be lost: every commit of the protocols on object
//! storage (a checkpoint's manifest, `LATEST`, a pack's manifest and shards, a part's
//! marker) is one conditional put, and a reply lost after the server applied it (a
//! dropped connection, a 500 sent after the write) must not be taken for a refusal.
//!
//! The rule: a conditional put is sent once ([`crate::s3::Store::put_if`] never
//! retries it); when it fails, or when its condition fails, the object is read back
//! and its content decides. Content that is this writer's means the put was applied;
//! the state the condition expected (no object, or the entity tag it named) means it
//! was not, and it is sent again (a bounded number of times); anything else is another
//! writer's. When the object cannot be read back the outcome is unknown, and the
//! caller must keep everything a committed object could name.
//!
//! Invariant: [`Outcome::Theirs`] and [`Outcome::Gone`] are only given when the
//! object was read back and is not this writer's, so a caller that removes its own
//! objects on them never removes what a committed object names.

use std::io;

use crate::s3::{Conditional, S3Error, Store};

/// How many times a conditional put is sent while reading back shows it was not
/// applied (the first error each time was a lost request, never a refusal).
pub const PUT_TRIES: usize = 3;

/// What a conditional put did, decided by reading the object back when needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The object holds this writer's content: the put was applied (its reply may
    /// have been lost).
    Ours,
    /// Another writer's object is there: the put was not applied and never will be.
    /// Its bytes (empty when it is larger than the read limit) and entity tag.
    Theirs(Vec<u8>, Option<String>),
    /// The object an `If-Match` named is gone: the put was not applied.
    Gone,
}

/// Put `data` at `key` if the condition holds (`etag` `None`: the key must not exist;
/// `Some(tag)`: it must still have that tag; `url` names it in errors), learning the outcome by reading the
/// object back (at most `limit` bytes) when the reply is an error or a refusal;
/// `mine` says whether content read back is this writer's. An error means the outcome
/// is unknown (the object could not be read back, or every try was lost).
pub fn put_once(
    store: &Store,
    url: &str,
    key: &str,
    data: &[u8],
    etag: Option<&str>,
    limit: u64,
    mine: &dyn Fn(&[u8]) -> bool,
) -> Result<Outcome, S3Error> {
    let mut last = None;
    for _ in 0..PUT_TRIES {
        let sent = store.put_if(key, data.to_vec(), etag, &[]);
        let refused = match sent {
            Ok(Conditional::Written(_)) => return Ok(Outcome::Ours),
            Ok(Conditional::Lost) => true,
            Err(e) => {
                last = Some(e);
                false
            }
        };
        // A refusal answered cleanly while no earlier try of this put is in doubt
        // was another writer's doing (nothing retries a put here), even when that
        // writer's bytes equal these.
        let in_doubt = last.is_some();
        let back = match store.get_if_exists(key, limit) {
            Ok(found) => found,
            Err(S3Error::TooLarge { .. }) => return Ok(Outcome::Theirs(Vec::new(), None)),
            Err(read) => return Err(unknown(url, last, &read)),
        };
        match (back, etag) {
            (Some((bytes, _)), _) if in_doubt && mine(&bytes) => return Ok(Outcome::Ours),
            (Some((bytes, tag)), _) if refused => return Ok(Outcome::Theirs(bytes, tag)),
            // The state the condition expected: the put was not applied; send it again.
            (None, None) => {}
            (Some((_, tag)), Some(want)) if tag.as_deref() == Some(want) && !refused => {}
            (Some((bytes, tag)), _) => return Ok(Outcome::Theirs(bytes, tag)),
            (None, Some(_)) => return Ok(Outcome::Gone),
        }
    }
    Err(last.unwrap_or_else(|| {
        S3Error::request(
            url.to_string(),
            io::ErrorKind::Other,
            format!("its conditional put was refused {PUT_TRIES} times, yet the object read back is in the state the condition expected"),
        )
    }))
}

/// The error of a put whose outcome is unknown: the put failed (`put`, or it was
/// refused) and reading the object back failed too (`read`).
fn unknown(url: &str, put: Option<S3Error>, read: &S3Error) -> S3Error {
    let why = put.map_or_else(
        || "its conditional put was refused".to_string(),
        |e| crate::failure::full_text(&e),
    );
    S3Error::request(
        url.to_string(),
        read_kind(read),
        format!(
            "{why}; reading it back to learn whether it was written failed too ({}): the outcome is unknown",
            crate::failure::full_text(read)
        ),
    )
}

/// The I/O kind of a failed read (a network failure stays one).
fn read_kind(err: &S3Error) -> io::ErrorKind {
    match err {
        S3Error::Request { source, .. } => source.kind(),
        _ => io::ErrorKind::Other,
    }
}
