//! JSON wire forms shared by the areas that store a generator or a stream position:
//! a 64-bit word as exactly 16 lowercase hex digits, and structs read from objects only.
//!
//! Invariants: [`Hex64`] writes every word zero-padded to 16 lowercase digits and reads
//! nothing else (no JSON reader rounds a string, as it may a 64-bit number);
//! [`ObjectsOnly`] refuses the array form that serde's derive also accepts for a struct,
//! so a wire struct has exactly one JSON form; [`parse_strict`] reads any JSON document
//! refusing a key repeated in one object (a `serde_json::Value` keeps the last silently).

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

/// Parse one JSON document as a `serde_json::Value`, refusing a key that appears twice
/// in one object at any depth (the error names the key and where it is).
pub fn parse_strict(bytes: &[u8]) -> Result<serde_json::Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Strict::deserialize(&mut de)?.0;
    de.end()?;
    Ok(value)
}

/// A JSON value whose objects have no repeated key.
struct Strict(serde_json::Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Strict, E> {
        // JSON text has no NaN or infinity, so every parsed float is a number.
        Ok(Strict(
            serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, Into::into),
        ))
    }

    fn visit_str<E>(self, v: &str) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }

    fn visit_string<E>(self, v: String) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }

    fn visit_unit<E>(self) -> Result<Strict, E> {
        Ok(Strict(serde_json::Value::Null))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Strict(serde_json::Value::Array(items)))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(A::Error::custom(format!(
                    "duplicate key {}",
                    crate::text::quote(&key)
                )));
            }
            let Strict(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Strict(serde_json::Value::Object(out)))
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
    fn strict_documents_refuse_a_repeated_key_at_any_depth() {
        let ok = parse_strict(br#"{"a":[1,-2,3.5,"x",null,true,{"a":1}],"b":{"a":{}}}"#).unwrap();
        let same: serde_json::Value =
            serde_json::from_str(r#"{"a":[1,-2,3.5,"x",null,true,{"a":1}],"b":{"a":{}}}"#).unwrap();
        assert_eq!(ok, same);
        for (bad, key) in [
            (r#"{"a":1,"a":2}"#, "\"a\""),
            (
                r#"{"x":{"num_hidden_layers":1,"num_hidden_layers":2}}"#,
                "\"num_hidden_layers\"",
            ),
            (r#"[{"k":1},{"k":1,"k":1}]"#, "\"k\""),
        ] {
            let e = parse_strict(bad.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(&format!("duplicate key {key}")), "{bad}: {e}");
        }
        assert!(parse_strict(b"{} {}").is_err(), "trailing text");
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
