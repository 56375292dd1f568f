//! The token stream's position as it travels in JSON: [`Cursor`] (the stream's whole
//! position, tokens.md) and [`DataCursor`] (the part `trainer_state.json` stores as
//! `data_cursor`, checkpoint.md, beside the generator in `rng_state`).
//!
//! Invariants: each type has one JSON form, derived, read from an object with exactly
//! its keys (unknown and duplicate keys refused), integers non-negative, `global_batch`
//! positive and written only when present, so a single process's cursor bytes never
//! carry it (nor an in-order stream's the shuffled stream's `epoch_rng`); splitting a cursor into the two checkpoint fields and joining them back
//! is the identity.

use std::num::NonZeroU64;

use serde::de::Visitor;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::pcg::RngState;
use crate::wire::ObjectsOnly;

/// The whole position of a token stream: `{"shard": s, "offset": o, "rng": {"state":
/// "<16 hex>", "inc": "<16 hex>"}}`, where `o` is the offset of the NEXT window, plus
/// `"global_batch": B * world_size` when the stream is one rank of several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub struct Cursor {
    /// The index of the current shard.
    #[serde(deserialize_with = "shard")]
    pub shard: u64,
    /// The offset of the next window in that shard.
    #[serde(deserialize_with = "offset")]
    pub offset: u64,
    /// The generator's position.
    pub rng: RngState,
    /// Windows per global batch (B times the world size) of a stream with ranks; a
    /// cursor without it restores into a stream of any batch.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "positive"
    )]
    pub global_batch: Option<NonZeroU64>,
    /// The generator's state at the start of the current epoch, from which that epoch's
    /// shard order was drawn: present only in the cursor of a stream with shuffled shard
    /// order (scale.md), so an in-order cursor's bytes never carry it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "epoch"
    )]
    pub epoch_rng: Option<RngState>,
}

/// `data_cursor` of `trainer_state.json`: `{"shard": s, "offset": o}`, plus
/// `"global_batch"` as in [`Cursor`]; the generator is stored apart, as `rng_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub struct DataCursor {
    /// Index of the shard the next window comes from.
    #[serde(deserialize_with = "shard")]
    pub shard: u64,
    /// Token offset of the next window in that shard.
    #[serde(deserialize_with = "offset")]
    pub offset: u64,
    /// Windows per global batch, as in [`Cursor`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "positive"
    )]
    pub global_batch: Option<NonZeroU64>,
    /// The generator's state at the start of the current epoch, from which that epoch's
    /// shard order was drawn: present only in the cursor of a stream with shuffled shard
    /// order (scale.md), so an in-order cursor's bytes never carry it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "epoch"
    )]
    pub epoch_rng: Option<RngState>,
}

/// A non-negative integer, whose error names the key `0` (serde's own says only
/// "expected u64").
struct Count(&'static str);

impl Visitor<'_> for Count {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a non-negative integer for \"{}\"", self.0)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
    }
}

fn shard<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    deserializer.deserialize_u64(Count("shard"))
}

fn offset<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    deserializer.deserialize_u64(Count("offset"))
}

/// A present `global_batch` is a positive integer (never `null`: absent is the only
/// way to say "no global batch").
fn positive<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<NonZeroU64>, D::Error> {
    NonZeroU64::deserialize(deserializer).map(Some)
}

/// A present `epoch_rng` is a generator state (never `null`).
fn epoch<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<RngState>, D::Error> {
    RngState::deserialize(deserializer).map(Some)
}

impl Cursor {
    /// Parse a cursor strictly (see the type): a JSON document of exactly this form.
    pub fn from_json(text: &str) -> Result<Cursor, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The compact JSON form, keys in the order of tokens.md.
    pub fn to_json(&self) -> String {
        #[allow(
            clippy::expect_used,
            reason = "integers and fixed-width strings always serialize"
        )]
        serde_json::to_string(self).expect("invariant: a cursor always serializes")
    }

    /// The position without the generator, as a checkpoint's `data_cursor` stores it.
    pub fn data(&self) -> DataCursor {
        DataCursor {
            shard: self.shard,
            offset: self.offset,
            global_batch: self.global_batch,
            epoch_rng: self.epoch_rng,
        }
    }

    /// The cursor of a checkpoint's `data_cursor` and `rng_state`.
    pub fn from_parts(data: DataCursor, rng: RngState) -> Cursor {
        Cursor {
            shard: data.shard,
            offset: data.offset,
            rng,
            global_batch: data.global_batch,
            epoch_rng: data.epoch_rng,
        }
    }
}

impl Serialize for Cursor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Cursor::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for Cursor {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Cursor::deserialize(ObjectsOnly(deserializer))
    }
}

impl Serialize for DataCursor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        DataCursor::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for DataCursor {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        DataCursor::deserialize(ObjectsOnly(deserializer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pcg::Pcg32;
    use proptest::prelude::*;

    const RNG: &str = r#"{"state":"185706b82c2e03f8","inc":"000000000000006d"}"#;

    #[test]
    fn the_bytes_of_tokens_md() {
        let ok = format!(r#"{{"shard":1,"offset":6,"rng":{RNG}}}"#);
        let c = Cursor::from_json(&ok).unwrap();
        assert_eq!(c.to_json(), ok);
        assert_eq!(c.rng.to_rng().unwrap(), Pcg32::seed(42, 54));
        assert_eq!(c.global_batch, None);
        let ranked = format!(r#"{{"shard":1,"offset":6,"rng":{RNG},"global_batch":16}}"#);
        let r = Cursor::from_json(&ranked).unwrap();
        assert_eq!(r.global_batch, NonZeroU64::new(16));
        assert_eq!(r.to_json(), ranked);
        assert_eq!(
            serde_json::to_string(&r.data()).unwrap(),
            r#"{"shard":1,"offset":6,"global_batch":16}"#
        );
        assert_eq!(
            serde_json::to_string(&c.data()).unwrap(),
            r#"{"shard":1,"offset":6}"#
        );
        assert_eq!(Cursor::from_parts(r.data(), r.rng), r);
    }

    /// A shuffled stream's cursor carries the epoch's generator after the other keys,
    /// and so does the checkpoint's `data_cursor`; splitting and joining keeps it.
    #[test]
    fn a_shuffled_cursor_carries_the_epoch_generator() {
        let text =
            format!(r#"{{"shard":2,"offset":6,"rng":{RNG},"global_batch":16,"epoch_rng":{RNG}}}"#);
        let c = Cursor::from_json(&text).unwrap();
        assert_eq!(c.epoch_rng, Some(c.rng));
        assert_eq!(c.to_json(), text);
        assert_eq!(
            serde_json::to_string(&c.data()).unwrap(),
            format!(r#"{{"shard":2,"offset":6,"global_batch":16,"epoch_rng":{RNG}}}"#)
        );
        assert_eq!(Cursor::from_parts(c.data(), c.rng), c);
        for bad in [
            format!(r#"{{"shard":2,"offset":6,"rng":{RNG},"epoch_rng":null}}"#),
            format!(r#"{{"shard":2,"offset":6,"rng":{RNG},"epoch_rng":7}}"#),
            format!(r#"{{"shard":2,"offset":6,"rng":{RNG},"epoch_rng":{RNG},"epoch_rng":{RNG}}}"#),
        ] {
            assert!(Cursor::from_json(&bad).is_err(), "accepted {bad}");
        }
    }

    #[test]
    fn cursor_json_is_strict() {
        let cases = [
            format!(r#"{{"shard":1,"offset":-1,"rng":{RNG}}}"#),
            format!(r#"{{"shard":1.0,"offset":6,"rng":{RNG}}}"#),
            format!(r#"{{"shard":"1","offset":6,"rng":{RNG}}}"#),
            format!(r#"{{"offset":6,"rng":{RNG}}}"#),
            format!(r#"{{"shard":1,"offset":6,"step":3,"rng":{RNG}}}"#),
            format!(r#"{{"shard":1,"offset":6,"rng":{RNG},"global_batch":0}}"#),
            format!(r#"{{"shard":1,"offset":6,"rng":{RNG},"global_batch":-2}}"#),
            format!(r#"{{"shard":1,"offset":6,"rng":{RNG},"global_batch":null}}"#),
            format!(r#"{{"shard":1,"offset":6,"rng":{RNG},"global_batch":"16"}}"#),
            format!(r#"[1,6,{RNG}]"#),
            r#"{"shard":1,"offset":6,"rng":["185706b82c2e03f8","000000000000006d"]}"#.into(),
            r#"{"shard":1,"offset":6,"rng":{"state":"185706B82C2E03F8","inc":"000000000000006d"}}"#
                .into(),
            r#"{"shard":1,"offset":6,"rng":{"state":"185706b82c2e03f8","inc":"000000000000006c"}}"#
                .into(),
            r#"{"shard":1,"offset":6,"rng":null}"#.into(),
            r#"{"shard":1,"#.into(),
        ];
        for text in cases {
            assert!(Cursor::from_json(&text).is_err(), "accepted {text}");
        }
        let e = Cursor::from_json(&format!(r#"{{"shard":1,"offset":-1,"rng":{RNG}}}"#));
        let e = e.unwrap_err().to_string();
        assert!(e.contains("\"offset\"") && e.contains("-1"), "{e}");
    }

    /// serde's derive refuses a repeated field only when it reads the text itself (a
    /// detour through `serde_json::Value` keeps the last one silently): every level of
    /// the cursor refuses duplicates, whatever the values.
    #[test]
    fn duplicate_keys_are_refused() {
        let cases = [
            format!(r#"{{"shard":1,"shard":1,"offset":6,"rng":{RNG}}}"#),
            format!(r#"{{"shard":1,"offset":6,"offset":7,"rng":{RNG}}}"#),
            format!(r#"{{"shard":1,"offset":6,"rng":{RNG},"rng":{RNG}}}"#),
            format!(r#"{{"shard":1,"offset":6,"rng":{RNG},"global_batch":2,"global_batch":2}}"#),
            r#"{"shard":1,"offset":6,"rng":{"state":"185706b82c2e03f8","inc":"000000000000006d","inc":"000000000000006d"}}"#.into(),
        ];
        for text in cases {
            let e = Cursor::from_json(&text).unwrap_err();
            assert!(e.to_string().contains("duplicate field"), "{text}: {e}");
        }
        let e =
            serde_json::from_str::<DataCursor>(r#"{"shard":1,"offset":6,"shard":1}"#).unwrap_err();
        assert!(e.to_string().contains("duplicate field"), "{e}");
    }

    proptest! {
        #[test]
        fn cursor_json_roundtrips(shard: u64, offset: u64, state: u64,
                                  inc in any::<u64>().prop_map(|i| i | 1),
                                  global in proptest::option::of(1u64..),
                                  epoch in proptest::option::of(any::<u64>())) {
            let c = Cursor {
                shard,
                offset,
                rng: RngState { state, inc },
                global_batch: global.and_then(NonZeroU64::new),
                epoch_rng: epoch.map(|e| RngState { state: e, inc }),
            };
            let text = c.to_json();
            prop_assert_eq!(Cursor::from_json(&text).unwrap(), c);
            let even = Cursor { rng: RngState { state, inc: inc ^ 1 }, ..c };
            prop_assert!(Cursor::from_json(&even.to_json()).is_err());
            let data = serde_json::to_string(&c.data()).unwrap();
            prop_assert_eq!(serde_json::from_str::<DataCursor>(&data).unwrap(), c.data());
        }
    }
}
