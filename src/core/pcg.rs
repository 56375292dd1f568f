//! PCG32 (XSH-RR, 64-bit state, 32-bit output) exactly as O'Neill's `pcg_basic.c`.
//!
//! Invariant: `inc` is always odd; the state and increment are the generator's whole
//! position, so saving and restoring them continues the sequence bit for bit. Their
//! JSON form, [`RngState`]'s serde, is the one codec of `{"state": "<16 hex>", "inc":
//! "<16 hex>"}` that cursors and checkpoints share.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::wire::{Hex64, ObjectsOnly};

/// The PCG32 generator of tokens.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pcg32 {
    state: u64,
    inc: u64,
}

const MULTIPLIER: u64 = 6364136223846793005;

/// The stream selector the CLI uses with `--seed S` (`seed(S, 54)`).
pub const DEFAULT_SEQ: u64 = 54;

impl Pcg32 {
    /// `pcg32_srandom_r(initstate, initseq)`.
    pub fn seed(initstate: u64, initseq: u64) -> Self {
        let mut rng = Pcg32 {
            state: 0,
            inc: (initseq << 1) | 1,
        };
        rng.next_u32();
        rng.state = rng.state.wrapping_add(initstate);
        rng.next_u32();
        rng
    }

    /// A generator at an exact saved position; `None` when `inc` is even (no PCG32
    /// stream has an even increment).
    pub fn from_parts(state: u64, inc: u64) -> Option<Self> {
        (inc & 1 == 1).then_some(Pcg32 { state, inc })
    }

    /// The 64-bit state.
    pub fn state(&self) -> u64 {
        self.state
    }

    /// The (odd) increment.
    pub fn inc(&self) -> u64 {
        self.inc
    }

    /// `pcg32_random_r`: the next 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        let old = self.state;
        self.state = old.wrapping_mul(MULTIPLIER).wrapping_add(self.inc);
        let xorshifted = (((old >> 18) ^ old) >> 27) as u32;
        let rot = (old >> 59) as u32;
        xorshifted.rotate_right(rot)
    }

    /// `pcg32_boundedrand_r`: uniform in `[0, bound)` without modulo bias.
    ///
    /// `bound` must be at least 1 (callers check; 0 would have no answer).
    pub fn below(&mut self, bound: u32) -> u32 {
        debug_assert!(bound >= 1);
        let bound = bound.max(1);
        let threshold = bound.wrapping_neg() % bound;
        loop {
            let r = self.next_u32();
            if r >= threshold {
                return r % bound;
            }
        }
    }
}

/// The generator's whole position, as checkpoints and data cursors store it. In JSON:
/// `{"state": "<16 hex>", "inc": "<16 hex>"}`, lowercase, zero-padded, exactly those
/// two keys, the increment odd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RngState {
    /// The 64-bit state.
    pub state: u64,
    /// The increment; always odd for a valid generator.
    pub inc: u64,
}

impl RngState {
    /// The position of `rng`.
    pub fn of(rng: &Pcg32) -> RngState {
        RngState {
            state: rng.state(),
            inc: rng.inc(),
        }
    }

    /// A generator at this position; `None` when the increment is even.
    pub fn to_rng(self) -> Option<Pcg32> {
        Pcg32::from_parts(self.state, self.inc)
    }
}

/// The wire form of [`RngState`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RngWire {
    state: Hex64,
    inc: Hex64,
}

impl Serialize for RngState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RngWire {
            state: Hex64(self.state),
            inc: Hex64(self.inc),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RngState {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = RngWire::deserialize(ObjectsOnly(deserializer))?;
        if wire.inc.0 & 1 == 0 {
            return Err(D::Error::custom(format!(
                "inc {:016x} is even; a PCG32 increment is always odd",
                wire.inc.0
            )));
        }
        Ok(RngState {
            state: wire.state.0,
            inc: wire.inc.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_vectors() {
        let mut rng = Pcg32::seed(42, 54);
        assert_eq!(rng.state(), 0x185706b82c2e03f8);
        assert_eq!(rng.inc(), 0x6d);
        let got: Vec<u32> = (0..6).map(|_| rng.next_u32()).collect();
        assert_eq!(
            got,
            [0xa15c02b7, 0x7b47f409, 0xba1d3330, 0x83d2f293, 0xbfa4784b, 0xcbed606e]
        );
        let mut rng = Pcg32::seed(42, 54);
        let below: Vec<u32> = (0..10).map(|_| rng.below(3)).collect();
        assert_eq!(below, [0, 0, 2, 1, 1, 1, 2, 0, 0, 2]);
    }

    #[test]
    fn even_increment_is_refused() {
        assert!(Pcg32::from_parts(1, 2).is_none());
        assert!(Pcg32::from_parts(1, 3).is_some());
    }

    #[test]
    fn rng_state_json_is_strict() {
        let ok = r#"{"state":"185706b82c2e03f8","inc":"000000000000006d"}"#;
        let s: RngState = serde_json::from_str(ok).unwrap();
        assert_eq!(s, RngState::of(&Pcg32::seed(42, 54)));
        assert_eq!(serde_json::to_string(&s).unwrap(), ok);
        for bad in [
            r#"{"state":"185706b82c2e03f8","inc":"000000000000006c"}"#,
            r#"{"state":"185706B82C2E03F8","inc":"000000000000006d"}"#,
            r#"{"state":"85706b82c2e03f8","inc":"000000000000006d"}"#,
            r#"{"state":"185706b82c2e03f8","inc":109}"#,
            r#"{"state":"185706b82c2e03f8","inc":"000000000000006d","x":1}"#,
            r#"{"state":"185706b82c2e03f8","state":"185706b82c2e03f8","inc":"000000000000006d"}"#,
            r#"["185706b82c2e03f8","000000000000006d"]"#,
            r#"{"state":"185706b82c2e03f8"}"#,
            "null",
        ] {
            assert!(serde_json::from_str::<RngState>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn matches_rand_pcg() {
        use rand_core::RngCore;
        for (seed, seq) in [
            (42u64, 54u64),
            (0, 0),
            (u64::MAX, 7),
            (123456789, 987654321),
        ] {
            let mut ours = Pcg32::seed(seed, seq);
            let mut theirs = rand_pcg::Pcg32::new(seed, seq);
            for _ in 0..1000 {
                assert_eq!(ours.next_u32(), theirs.next_u32());
            }
        }
    }

    proptest::proptest! {
        /// `below` is pcg_basic's rejection sampling over the same output stream as
        /// rand_pcg: always in range, and exactly the reference's draws.
        #[test]
        fn below_matches_the_reference(seed: u64, bound in 1u32..=u32::MAX, n in 1usize..20) {
            use rand_core::RngCore;
            let mut ours = Pcg32::seed(seed, DEFAULT_SEQ);
            let mut theirs = rand_pcg::Pcg32::new(seed, DEFAULT_SEQ);
            let threshold = bound.wrapping_neg() % bound;
            for _ in 0..n {
                let want = loop {
                    let r = theirs.next_u32();
                    if r >= threshold {
                        break r % bound;
                    }
                };
                let got = ours.below(bound);
                proptest::prop_assert!(got < bound);
                proptest::prop_assert_eq!(got, want);
            }
        }

        #[test]
        fn restore_continues_bit_for_bit(seed: u64, seq: u64, skip in 0usize..100, n in 1usize..100) {
            let mut a = Pcg32::seed(seed, seq);
            for _ in 0..skip { a.next_u32(); }
            let mut b = Pcg32::from_parts(a.state(), a.inc()).unwrap();
            for _ in 0..n { proptest::prop_assert_eq!(a.next_u32(), b.next_u32()); }
        }
    }
}
