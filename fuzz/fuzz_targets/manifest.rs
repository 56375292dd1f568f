//! Fuzzes the checkpoint MANIFEST.json parser: any bytes are refused with a typed error
//! or accepted, never a panic; an accepted manifest's canonical bytes parse back to the
//! same manifest and are a fixed point.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tlio_core::checkpoint::Manifest;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = Manifest::from_json(data) else {
        return;
    };
    let bytes = m.to_json();
    let back =
        Manifest::from_json(&bytes).unwrap_or_else(|e| panic!("canonical manifest refused: {e}"));
    assert_eq!(back, m);
    assert_eq!(back.to_json(), bytes);
});
