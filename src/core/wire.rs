//! JSON wire forms shared by the areas that store a generator or a stream position:
//! a 64-bit word as exactly 16 lowercase hex digits, and structs read from objects only.
//!
//! Invariants: [`Hex64`] writes every word zero-padded to 16 lowercase digits and reads
//! nothing else (no JSON reader rounds a string, as it may a 64-bit number);
//! [`ObjectsOnly`] refuses the array form that serde's derive also accepts for a struct,
//! so a wire struct has exactly one JSON form.

use serde::de::{Error as _, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Hex digits of one 64-bit word.
pub const HEX64_DIGITS: usize = 16;

/// A 64-bit word in JSON: a string of exactly 16 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hex64(pub u64);

impl Hex64 {
    /// `text` as a word when it is exactly 16 digits of `0-9a-f`.
    pub fn parse(text: &str) -> Option<Hex64> {
        let ok = text.len() == HEX64_DIGITS
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !ok {
            return None;
        }
        u64::from_str_radix(text, 16).ok().map(Hex64)
    }
}

impl Serialize for Hex64 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&format_args!("{:016x}", self.0))
    }
}

impl<'de> Deserialize<'de> for Hex64 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Hex64::parse(&text).ok_or_else(|| {
            D::Error::custom(format!(
                "{text:?} is not exactly {HEX64_DIGITS} lowercase hex digits"
            ))
        })
    }
}

/// A deserializer that reads a struct from a JSON object only: serde's derive would
/// also take `[1, 2]` for a struct of two fields, a second form the wire never has.
pub struct ObjectsOnly<D>(pub D);

impl<'de, D: Deserializer<'de>> Deserializer<'de> for ObjectsOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields, remote = "Self")]
    struct Pair {
        a: u64,
        b: Hex64,
    }

    impl<'de> Deserialize<'de> for Pair {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            Pair::deserialize(ObjectsOnly(d))
        }
    }

    #[test]
    fn hex_words_are_exactly_sixteen_lowercase_digits() {
        assert_eq!(Hex64::parse("000000000000006d"), Some(Hex64(0x6d)));
        for bad in [
            "6d",
            "000000000000006D",
            "0x0000000000006d",
            "+00000000000006d",
            "000000000000006d0",
            "",
        ] {
            assert_eq!(Hex64::parse(bad), None, "{bad}");
        }
        assert_eq!(
            serde_json::to_string(&Hex64(0x6d)).unwrap(),
            "\"000000000000006d\""
        );
        assert!(serde_json::from_str::<Hex64>("109").is_err());
    }

    #[test]
    fn structs_come_from_objects_only() {
        let ok: Pair = serde_json::from_str(r#"{"a":1,"b":"0000000000000002"}"#).unwrap();
        assert_eq!(ok, Pair { a: 1, b: Hex64(2) });
        for bad in [
            r#"[1,"0000000000000002"]"#,
            r#"{"a":1,"b":"0000000000000002","c":3}"#,
            r#"{"a":1,"a":1,"b":"0000000000000002"}"#,
            r#"{"a":1}"#,
        ] {
            assert!(serde_json::from_str::<Pair>(bad).is_err(), "{bad}");
        }
    }
}
