//! Fuzzes trainer_state.json, both as stored (every key required) and as given to
//! `ckpt save --state` (defaults allowed): any bytes are refused with a typed error or
//! accepted, never a panic; an accepted state writes, and its bytes parse back (as a
//! stored state) to the same state and are a fixed point.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tlio_core::checkpoint::TrainerState;

fn round_trip(s: &TrainerState) {
    let bytes = s
        .to_json()
        .unwrap_or_else(|e| panic!("an accepted state must write: {e}"));
    let back =
        TrainerState::from_json(&bytes).unwrap_or_else(|e| panic!("written state refused: {e}"));
    assert_eq!(&back, s);
    assert_eq!(back.to_json().ok(), Some(bytes));
}

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = TrainerState::from_json(data) {
        round_trip(&s);
    }
    if let Ok(s) = TrainerState::from_json_with_defaults(data) {
        round_trip(&s);
    }
});
