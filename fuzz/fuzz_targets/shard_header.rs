//! Fuzzes the token shard header: any 1024 bytes and any file size are refused with a
//! typed error or accepted, never a panic; an accepted header's bytes parse back to
//! the same header, and for llm.c shards (reserved words zero) they are the input.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tlio_core::tokens::{ShardHeader, HEADER_BYTES, MAGIC};

fuzz_target!(|data: &[u8]| {
    let mut bytes = [0u8; HEADER_BYTES];
    let n = data.len().min(HEADER_BYTES);
    bytes[..n].copy_from_slice(&data[..n]);
    let path = Path::new("fuzz.bin");
    // As a file would be: these bytes followed by the rest of the input.
    let _ = ShardHeader::parse(path, &bytes, data.len() as u64);
    // With the size the header implies, so the accepting path is reached too.
    let word = |i: usize| {
        i32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ])
    };
    let itemsize: u64 = if word(1) == 1 { 2 } else { 4 };
    let implied = u64::try_from(word(2))
        .unwrap_or(0)
        .saturating_mul(itemsize)
        .saturating_add(HEADER_BYTES as u64);
    let Ok(h) = ShardHeader::parse(path, &bytes, implied) else {
        return;
    };
    assert_eq!(h.file_size(), Some(implied));
    let out = h.to_bytes();
    let back = ShardHeader::parse(path, &out, implied)
        .unwrap_or_else(|e| panic!("written header refused: {e}"));
    assert_eq!(back, h);
    if h.magic == MAGIC {
        assert_eq!(
            out, bytes,
            "an llm.c header must be written back byte for byte"
        );
    }
});
