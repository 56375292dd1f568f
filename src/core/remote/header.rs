//! A safetensors header read from object storage by range requests: the one reader
//! behind `st inspect`/`st verify` of an object and the sharded checkpoint's rank
//! files. Every rule is the local reader's ([`header_len`], [`parse_header_bytes`]),
//! called on the bytes fetched.
//!
//! Invariants: at most two range requests (the first `first_request` bytes, then the
//! rest of the header when it is longer), never the whole object unless the object is
//! no longer than the first request; a server that answers a range with fewer bytes
//! than asked is a request error, never a header rule.

use crate::s3::{S3Error, Store};
use crate::safetensors::header::{header_len, parse_header_bytes, N_LEN};
use crate::safetensors::{Header, SafetensorsError};

/// Why a remote header could not be read.
#[derive(Debug)]
pub(crate) enum HeaderFailure {
    /// The request failed, or the server returned fewer bytes than the range.
    Remote(S3Error),
    /// The bytes break a reader rule.
    Invalid(SafetensorsError),
}

/// A header read by [`read_header`], with the raw bytes it was parsed from (the 8-byte
/// prefix and the header text).
pub(crate) struct RemoteHeader {
    pub(crate) header: Header,
    pub(crate) raw: Vec<u8>,
}

/// The safetensors header of the object `key` of `size` bytes (`url` names it in
/// errors). The first request asks for `first_request` bytes (at least the 8-byte
/// prefix): a guess that holds a usual header whole saves the second request.
pub(crate) fn read_header(
    store: &Store,
    key: &str,
    url: &str,
    size: u64,
    first_request: u64,
) -> Result<RemoteHeader, HeaderFailure> {
    // Too small to hold the length prefix: the reader rule's error, without a request.
    let mut raw = Vec::new();
    if size >= N_LEN {
        let asked = size.min(first_request.max(N_LEN));
        raw = store
            .get_range(key, 0..asked)
            .map_err(HeaderFailure::Remote)?;
        if (raw.len() as u64) != asked {
            return Err(HeaderFailure::Remote(short_read(url, asked, raw.len())));
        }
    }
    let asked = raw.len() as u64;
    let mut prefix = [0u8; N_LEN as usize];
    if let Some(p) = raw.get(..N_LEN as usize) {
        prefix.copy_from_slice(p);
    }
    let n = header_len(prefix, size).map_err(HeaderFailure::Invalid)?;
    let end = N_LEN.saturating_add(n);
    if end > asked {
        let rest = store
            .get_range(key, asked..end)
            .map_err(HeaderFailure::Remote)?;
        let want = end.saturating_sub(asked);
        if (rest.len() as u64) != want {
            return Err(HeaderFailure::Remote(short_read(url, want, rest.len())));
        }
        raw.extend_from_slice(&rest);
    }
    raw.truncate(usize::try_from(end).unwrap_or(usize::MAX));
    let header = parse_header_bytes(raw.get(N_LEN as usize..).unwrap_or_default(), size)
        .map_err(HeaderFailure::Invalid)?;
    Ok(RemoteHeader { header, raw })
}

/// A server that answered a range request with another number of bytes.
pub(crate) fn short_read(url: &str, expected: u64, got: usize) -> S3Error {
    S3Error::request(
        url.to_string(),
        std::io::ErrorKind::UnexpectedEof,
        format!("a range request for {expected} bytes returned {got}"),
    )
}
