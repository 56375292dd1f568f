//! Fuzzes the token-stream cursor parser (`--cursor` JSON and the stored cursor): any
//! text is refused with a typed error or accepted, never a panic; an accepted cursor's
//! compact JSON parses back to the same cursor and is a fixed point.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tlio_core::tokens::Cursor;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(c) = Cursor::from_json(text) else {
        return;
    };
    let json = c.to_json();
    let back = Cursor::from_json(&json).unwrap_or_else(|e| panic!("{json} refused: {e}"));
    assert_eq!(back, c);
    assert_eq!(back.to_json(), json);
});
