//! sha256 digests and their lowercase hex form, shared by checkpoints (manifest
//! hashes) and training (the final line's model and optimizer hashes).
//!
//! Invariant: every digest tlio prints or stores is lowercase hex of exactly
//! [`SHA256_HEX_LEN`] digits, made by [`hex`]; streams are hashed through one buffer of
//! [`HASH_BUFFER_BYTES`], never read whole into memory unless the caller asks to keep
//! the bytes.

use std::io::{self, Read};

use sha2::{Digest, Sha256};

/// Length of a sha256 digest in hex.
pub const SHA256_HEX_LEN: usize = 64;

/// Read size when hashing a stream: large enough that syscalls do not dominate, small
/// enough to stay in cache-friendly territory.
pub const HASH_BUFFER_BYTES: usize = 4 << 20;

/// Lowercase hex of a digest (or any bytes).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len().saturating_mul(2));
    for b in bytes {
        // Writing into a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// sha256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// True when `s` is exactly `len` lowercase hex digits.
pub fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// sha256 of everything `reader` yields, with the byte count, through a large buffer;
/// `keep` collects the bytes too when given; `progress` hears of every chunk.
pub fn sha256_stream(
    reader: &mut dyn Read,
    mut keep: Option<&mut Vec<u8>>,
    progress: &mut dyn FnMut(u64),
) -> io::Result<(u64, [u8; 32])> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; HASH_BUFFER_BYTES];
    let mut total: u64 = 0;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        // A reader that claims more bytes than the buffer holds breaks Read's contract;
        // report it rather than trust it.
        let chunk = buf.get(..n).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "reader returned more bytes than the buffer holds",
            )
        })?;
        hasher.update(chunk);
        if let Some(k) = keep.as_deref_mut() {
            k.extend_from_slice(chunk);
        }
        total = total.saturating_add(n as u64);
        progress(n as u64);
    }
    Ok((total, hasher.finalize().into()))
}

/// Bytes read and hashed per step of [`sha256_read_owned`]: small enough that a chunk
/// is still in the CPU cache when it is hashed right after being copied in.
pub const OWNED_CHUNK_BYTES: usize = 1 << 20;

/// Read all of `reader`, expected to hold `size` bytes, into one owned buffer while
/// hashing it: each chunk is read into its final place and hashed at once (one pass
/// over the bytes, no second copy). Returns the bytes read (fewer than `size` when the
/// source ended early, `size + 1` when it holds more), the digest of the first `size`
/// bytes and the buffer. An allocation that cannot be made is an error, never an abort.
pub fn sha256_read_owned(
    reader: &mut dyn Read,
    size: u64,
    progress: &mut dyn FnMut(u64),
) -> io::Result<(u64, [u8; 32], Vec<u8>)> {
    let len = usize::try_from(size)
        .map_err(|_| io::Error::new(io::ErrorKind::OutOfMemory, "does not fit in memory"))?;
    let mut buf: Vec<u8> = Vec::new();
    buf.try_reserve_exact(len).map_err(|e| {
        io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("cannot allocate {len} bytes to read it: {e}"),
        )
    })?;
    let mut hasher = Sha256::new();
    while buf.len() < len {
        let before = buf.len();
        let want = (len - before).min(OWNED_CHUNK_BYTES) as u64;
        // `read_to_end` fills the reserved capacity in place without zeroing it first
        // and retries interrupted reads; `take` stops it at this chunk.
        let n = Read::take(&mut *reader, want).read_to_end(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(buf.get(before..).unwrap_or_default());
        progress(n as u64);
    }
    let mut total = buf.len() as u64;
    if total == size {
        // One byte more means the file grew after its size was taken.
        let mut probe = [0u8; 1];
        if read_some(reader, &mut probe)? > 0 {
            total = total.saturating_add(1);
        }
    }
    Ok((total, hasher.finalize().into(), buf))
}

/// One `read`, retried when interrupted.
fn read_some(reader: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match reader.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digest_in_lowercase_hex() {
        let h = sha256_hex(b"abc");
        assert_eq!(
            h,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(is_lower_hex(&h, SHA256_HEX_LEN));
        assert!(!is_lower_hex(&h.to_uppercase(), SHA256_HEX_LEN));
        assert!(!is_lower_hex(&h[1..], SHA256_HEX_LEN));
    }

    proptest::proptest! {
        /// Streaming in any chunking equals hashing the whole, and keeps the bytes.
        #[test]
        fn stream_equals_whole(data in proptest::collection::vec(0u8..=255, 0..3000)) {
            let mut kept = Vec::new();
            let mut seen = 0u64;
            let (n, digest) =
                sha256_stream(&mut data.as_slice(), Some(&mut kept), &mut |k| seen += k).unwrap();
            proptest::prop_assert_eq!(n, data.len() as u64);
            proptest::prop_assert_eq!(seen, n);
            proptest::prop_assert_eq!(&kept, &data);
            proptest::prop_assert_eq!(hex(&digest), sha256_hex(&data));
        }
    }
}
