//! The strict JSON of a header, parsed by serde visitors that see every key: duplicate
//! keys anywhere, exactly the three keys of an entry, integers only, string-only
//! metadata. The result is the raw entries in file order; the byte rules (counts,
//! tiling) are checked by the caller.
//!
//! Invariants: a map type would keep the last duplicate, so no value goes through one;
//! nothing is allocated in proportion to a number written in the JSON; the first typed
//! error raised inside a visitor is the one reported (serde itself carries strings).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::super::dtype::Dtype;
use super::super::SafetensorsError;
use super::METADATA_KEY;
use crate::text::quote;

/// One tensor entry as the JSON gives it, before the byte rules.
pub(super) struct RawTensor {
    pub(super) name: String,
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<u64>,
    pub(super) offsets: (u64, u64),
}

/// The entries in file order and the metadata.
pub(super) struct RawHeader {
    pub(super) tensors: Vec<RawTensor>,
    pub(super) metadata: BTreeMap<String, String>,
    /// Whether the header has a `__metadata__` key (an empty object included).
    pub(super) metadata_present: bool,
}

/// Parse `text` (a header that starts with `{`) by the strict rules; trailing
/// non-whitespace after the object is an error.
pub(super) fn parse_raw(text: &str) -> Result<RawHeader, SafetensorsError> {
    let ctx = Ctx::default();
    let mut de = serde_json::Deserializer::from_str(text);
    let raw = match TopSeed(&ctx).deserialize(&mut de) {
        Ok(raw) => raw,
        Err(e) => {
            return Err(ctx.err.into_inner().unwrap_or(SafetensorsError::Json {
                message: e.to_string(),
            }))
        }
    };
    de.end().map_err(|e| SafetensorsError::TrailingCharacters {
        detail: format!("line {} column {}", e.line(), e.column()),
    })?;
    Ok(raw)
}

/// Holds the first typed error raised inside the visitors (serde only carries strings).
#[derive(Default)]
struct Ctx {
    err: RefCell<Option<SafetensorsError>>,
}

impl Ctx {
    fn fail<E: de::Error>(&self, e: SafetensorsError) -> E {
        let mut slot = self.err.borrow_mut();
        if slot.is_none() {
            *slot = Some(e);
        }
        E::custom("invalid header")
    }
}

/// A visitor that rejects every JSON value kind except those it overrides, through one
/// function, so that the typed error names what was expected: the scalar methods with
/// their value types, then after `;` the compound kinds (`unit`, `seq`, `map`).
macro_rules! reject_others {
    (@unit) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Err(self.reject())
        }
    };
    (@seq) => {
        fn visit_seq<A: SeqAccess<'de>>(self, _seq: A) -> Result<Self::Value, A::Error> {
            Err(self.reject())
        }
    };
    (@map) => {
        fn visit_map<A: MapAccess<'de>>(self, _map: A) -> Result<Self::Value, A::Error> {
            Err(self.reject())
        }
    };
    ($($method:ident($ty:ty)),* $(,)? ; $($kind:ident),* $(,)?) => {
        $(
            fn $method<E: de::Error>(self, _v: $ty) -> Result<Self::Value, E> {
                Err(self.reject())
            }
        )*
        $(reject_others!(@$kind);)*
    };
}

struct TopSeed<'c>(&'c Ctx);

impl<'de> DeserializeSeed<'de> for TopSeed<'_> {
    type Value = RawHeader;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<RawHeader, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TopSeed<'_> {
    type Value = RawHeader;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader, A::Error> {
        let ctx = self.0;
        let mut seen = HashSet::new();
        let mut tensors = Vec::new();
        let mut metadata = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(ctx.fail(SafetensorsError::DuplicateKey {
                    key,
                    place: "in the header".to_string(),
                }));
            }
            if key == METADATA_KEY {
                metadata = map.next_value_seed(MetaSeed(ctx))?;
            } else {
                let (dtype, shape, offsets) = map.next_value_seed(EntrySeed { ctx, name: &key })?;
                tensors.push(RawTensor {
                    name: key,
                    dtype,
                    shape,
                    offsets,
                });
            }
        }
        let metadata_present = seen.contains(METADATA_KEY);
        Ok(RawHeader {
            tensors,
            metadata,
            metadata_present,
        })
    }
}

struct MetaSeed<'c>(&'c Ctx);

impl MetaSeed<'_> {
    fn reject<E: de::Error>(&self) -> E {
        self.0.fail(SafetensorsError::MetadataNotObject)
    }
}

impl<'de> DeserializeSeed<'de> for MetaSeed<'_> {
    type Value = BTreeMap<String, String>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MetaSeed<'_> {
    type Value = BTreeMap<String, String>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of strings")
    }
    reject_others!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64),
        visit_str(&str);
        unit,
        seq,
    );
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let ctx = self.0;
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(ctx.fail(SafetensorsError::DuplicateKey {
                    key,
                    place: "in __metadata__".to_string(),
                }));
            }
            let value = map.next_value_seed(StrSeed {
                ctx,
                on_other: || SafetensorsError::MetadataNotString { key: key.clone() },
            })?;
            out.insert(key, value);
        }
        Ok(out)
    }
}

/// Accepts a JSON string only; anything else raises `on_other()`.
struct StrSeed<'c, F> {
    ctx: &'c Ctx,
    on_other: F,
}

impl<F: Fn() -> SafetensorsError> StrSeed<'_, F> {
    fn reject<E: de::Error>(&self) -> E {
        self.ctx.fail((self.on_other)())
    }
}

impl<'de, F: Fn() -> SafetensorsError> DeserializeSeed<'de> for StrSeed<'_, F> {
    type Value = String;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, F: Fn() -> SafetensorsError> Visitor<'de> for StrSeed<'_, F> {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
    reject_others!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64);
        unit,
        seq,
        map,
    );
}

type Entry = (Dtype, Vec<u64>, (u64, u64));

struct EntrySeed<'c, 'n> {
    ctx: &'c Ctx,
    name: &'n str,
}

impl EntrySeed<'_, '_> {
    fn reject<E: de::Error>(&self) -> E {
        self.ctx.fail(SafetensorsError::EntryNotObject {
            tensor: self.name.to_string(),
        })
    }
}

impl<'de> DeserializeSeed<'de> for EntrySeed<'_, '_> {
    type Value = Entry;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Entry, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for EntrySeed<'_, '_> {
    type Value = Entry;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a tensor entry object")
    }
    reject_others!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64),
        visit_str(&str);
        unit,
        seq,
    );
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entry, A::Error> {
        let ctx = self.ctx;
        let tensor = || self.name.to_string();
        let mut dtype = None;
        let mut shape = None;
        let mut offsets = None;
        while let Some(key) = map.next_key::<String>()? {
            let dup = match key.as_str() {
                "dtype" => dtype.is_some(),
                "shape" => shape.is_some(),
                "data_offsets" => offsets.is_some(),
                _ => {
                    return Err(ctx.fail(SafetensorsError::UnknownKey {
                        tensor: tensor(),
                        key,
                    }))
                }
            };
            if dup {
                return Err(ctx.fail(SafetensorsError::DuplicateKey {
                    key,
                    place: format!("in the entry of tensor {}", quote(self.name)),
                }));
            }
            match key.as_str() {
                "dtype" => {
                    let name = map.next_value_seed(StrSeed {
                        ctx,
                        on_other: || SafetensorsError::UnknownDtype {
                            tensor: tensor(),
                            dtype: "(not a string)".to_string(),
                        },
                    })?;
                    match Dtype::from_name(&name) {
                        Some(d) => dtype = Some(d),
                        None => {
                            return Err(ctx.fail(SafetensorsError::UnknownDtype {
                                tensor: tensor(),
                                dtype: name,
                            }))
                        }
                    }
                }
                "shape" => {
                    shape = Some(map.next_value_seed(IntsSeed {
                        ctx,
                        tensor: self.name,
                        what: Ints::Shape,
                    })?)
                }
                _ => {
                    let v = map.next_value_seed(IntsSeed {
                        ctx,
                        tensor: self.name,
                        what: Ints::Offsets,
                    })?;
                    match v.as_slice() {
                        [b, e] => offsets = Some((*b, *e)),
                        _ => {
                            return Err(ctx.fail(SafetensorsError::BadOffsets {
                                tensor: tensor(),
                                detail: format!(
                                    "data_offsets has {} entries, not [begin, end]",
                                    v.len()
                                ),
                            }))
                        }
                    }
                }
            }
        }
        let missing = |key| {
            ctx.fail(SafetensorsError::MissingKey {
                tensor: tensor(),
                key,
            })
        };
        let dtype = dtype.ok_or_else(|| missing("dtype"))?;
        let shape = shape.ok_or_else(|| missing("shape"))?;
        let offsets = offsets.ok_or_else(|| missing("data_offsets"))?;
        Ok((dtype, shape, offsets))
    }
}

#[derive(Clone, Copy)]
enum Ints {
    Shape,
    Offsets,
}

/// A JSON array of non-negative integers that fit in u64.
struct IntsSeed<'c, 'n> {
    ctx: &'c Ctx,
    tensor: &'n str,
    what: Ints,
}

impl IntsSeed<'_, '_> {
    fn bad(&self, detail: String) -> SafetensorsError {
        let tensor = self.tensor.to_string();
        match self.what {
            Ints::Shape => SafetensorsError::BadShape { tensor, detail },
            Ints::Offsets => SafetensorsError::BadOffsets { tensor, detail },
        }
    }
    fn field(&self) -> &'static str {
        match self.what {
            Ints::Shape => "shape",
            Ints::Offsets => "data_offsets",
        }
    }
    fn reject<E: de::Error>(&self) -> E {
        self.ctx
            .fail(self.bad(format!("{} is not a list of integers", self.field())))
    }
}

impl<'de> DeserializeSeed<'de> for IntsSeed<'_, '_> {
    type Value = Vec<u64>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<u64>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for IntsSeed<'_, '_> {
    type Value = Vec<u64>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of non-negative integers")
    }
    reject_others!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64),
        visit_str(&str);
        unit,
        map,
    );
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u64>, A::Error> {
        // Grows with the JSON text, never with a number written in it.
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(IntSeed(self.field()))? {
            match v {
                Ok(n) => out.push(n),
                Err(detail) => return Err(self.ctx.fail(self.bad(detail))),
            }
        }
        // Doubling leaves up to half the capacity unused: for a shape of 45 million
        // dimensions (a 90 MB header) that is 180 MB held for the life of the header.
        out.shrink_to_fit();
        Ok(out)
    }
}

/// One element: Ok(n) for a JSON non-negative integer, Err(description) otherwise
/// (reported by the enclosing list with its tensor).
struct IntSeed(&'static str);

impl<'de> DeserializeSeed<'de> for IntSeed {
    type Value = Result<u64, String>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for IntSeed {
    type Value = Result<u64, String>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a non-negative integer")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Ok(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Err(format!("{} entry {v} is negative", self.0)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Err(format!(
            "{} entry {v} is not an integer that fits in 64 bits",
            self.0
        )))
    }
    fn visit_bool<E: de::Error>(self, _v: bool) -> Result<Self::Value, E> {
        Ok(Err(format!(
            "{} entry is a boolean, not an integer",
            self.0
        )))
    }
    fn visit_str<E: de::Error>(self, _v: &str) -> Result<Self::Value, E> {
        Ok(Err(format!("{} entry is a string, not an integer", self.0)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Err(format!("{} entry is null, not an integer", self.0)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<de::IgnoredAny>()?.is_some() {}
        Ok(Err(format!("{} entry is a list, not an integer", self.0)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map
            .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
            .is_some()
        {}
        Ok(Err(format!(
            "{} entry is an object, not an integer",
            self.0
        )))
    }
}
