//! The 22 dtypes of the safetensors library 0.8: names, bit sizes, the canonical
//! writer's rank, the byte-count rule, and the one list each of the dtypes without an
//! element decoder and of the raw-only write targets.
//!
//! Invariant: names are exact and case-sensitive (`bf16` is not `BF16`); the rank is the
//! reverse of the library's `Dtype` enumeration, so sorting by rank reproduces its layout.

use std::fmt;

/// A tensor element type, in canonical writer order (rank 1 first).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 64-bit integer.
    I64,
    /// IEEE binary64.
    F64,
    /// Complex number made of two F32 (real, imaginary).
    C64,
    /// IEEE binary32.
    F32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 32-bit integer.
    I32,
    /// bfloat16: the top half of a binary32.
    BF16,
    /// IEEE binary16.
    F16,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 16-bit integer.
    I16,
    /// fp8 E5M2, bias 16, no negative zero, NaN = 0x80.
    F8_E5M2FNUZ,
    /// fp8 E4M3, bias 8, no negative zero, NaN = 0x80.
    F8_E4M3FNUZ,
    /// fp8 exponent-only scale: 2^(code - 127), NaN = 0xFF.
    F8_E8M0,
    /// fp8 E4M3 "fn": bias 7, max 448, no infinity, NaN = 0x7F / 0xFF.
    F8_E4M3,
    /// fp8 E5M2: bias 15, IEEE-like with infinities.
    F8_E5M2,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// MX fp6 E3M2, packed sub-byte.
    F6_E3M2,
    /// MX fp6 E2M3, packed sub-byte.
    F6_E2M3,
    /// MX fp4 E2M1, packed sub-byte.
    F4,
    /// Boolean, one byte, 0 or 1.
    BOOL,
}

impl Dtype {
    /// Every dtype, in rank order.
    pub const ALL: [Dtype; 22] = [
        Dtype::U64,
        Dtype::I64,
        Dtype::F64,
        Dtype::C64,
        Dtype::F32,
        Dtype::U32,
        Dtype::I32,
        Dtype::BF16,
        Dtype::F16,
        Dtype::U16,
        Dtype::I16,
        Dtype::F8_E5M2FNUZ,
        Dtype::F8_E4M3FNUZ,
        Dtype::F8_E8M0,
        Dtype::F8_E4M3,
        Dtype::F8_E5M2,
        Dtype::I8,
        Dtype::U8,
        Dtype::F6_E3M2,
        Dtype::F6_E2M3,
        Dtype::F4,
        Dtype::BOOL,
    ];

    /// The dtype with exactly this name (case-sensitive, no surrounding spaces).
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.iter().copied().find(|d| d.name() == name)
    }

    /// The name written in the header.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::U64 => "U64",
            Dtype::I64 => "I64",
            Dtype::F64 => "F64",
            Dtype::C64 => "C64",
            Dtype::F32 => "F32",
            Dtype::U32 => "U32",
            Dtype::I32 => "I32",
            Dtype::BF16 => "BF16",
            Dtype::F16 => "F16",
            Dtype::U16 => "U16",
            Dtype::I16 => "I16",
            Dtype::F8_E5M2FNUZ => "F8_E5M2FNUZ",
            Dtype::F8_E4M3FNUZ => "F8_E4M3FNUZ",
            Dtype::F8_E8M0 => "F8_E8M0",
            Dtype::F8_E4M3 => "F8_E4M3",
            Dtype::F8_E5M2 => "F8_E5M2",
            Dtype::I8 => "I8",
            Dtype::U8 => "U8",
            Dtype::F6_E3M2 => "F6_E3M2",
            Dtype::F6_E2M3 => "F6_E2M3",
            Dtype::F4 => "F4",
            Dtype::BOOL => "BOOL",
        }
    }

    /// Bits per element.
    pub fn bits(self) -> u64 {
        match self {
            Dtype::U64 | Dtype::I64 | Dtype::F64 | Dtype::C64 => 64,
            Dtype::F32 | Dtype::U32 | Dtype::I32 => 32,
            Dtype::BF16 | Dtype::F16 | Dtype::U16 | Dtype::I16 => 16,
            Dtype::F8_E5M2FNUZ
            | Dtype::F8_E4M3FNUZ
            | Dtype::F8_E8M0
            | Dtype::F8_E4M3
            | Dtype::F8_E5M2
            | Dtype::I8
            | Dtype::U8
            | Dtype::BOOL => 8,
            Dtype::F6_E3M2 | Dtype::F6_E2M3 => 6,
            Dtype::F4 => 4,
        }
    }

    /// Canonical writer rank, 1 (U64) to 22 (BOOL).
    pub fn rank(self) -> u8 {
        // `ALL` is in rank order and has 22 entries, so the position always fits.
        let pos = Dtype::ALL.iter().position(|d| *d == self).unwrap_or(0);
        pos as u8 + 1
    }

    /// True for real floating-point kinds (every F* dtype; not C64, not integers).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            Dtype::F64
                | Dtype::F32
                | Dtype::BF16
                | Dtype::F16
                | Dtype::F8_E5M2FNUZ
                | Dtype::F8_E4M3FNUZ
                | Dtype::F8_E8M0
                | Dtype::F8_E4M3
                | Dtype::F8_E5M2
                | Dtype::F6_E3M2
                | Dtype::F6_E2M3
                | Dtype::F4
        )
    }

    /// True when `tlio` can encode float values into this dtype (with rounding for
    /// floats, exactly for integers and BOOL); the others take raw bytes only. This is
    /// the one list of raw-only write targets: the encoders consult it.
    pub fn encodable(self) -> bool {
        !matches!(
            self,
            Dtype::C64
                | Dtype::F8_E5M2FNUZ
                | Dtype::F8_E4M3FNUZ
                | Dtype::F8_E8M0
                | Dtype::F6_E3M2
                | Dtype::F6_E2M3
                | Dtype::F4
        )
    }

    /// Real values per element: 2 for complex dtypes (real, imaginary), else 1.
    pub fn lanes(self) -> usize {
        match self {
            Dtype::C64 => 2,
            _ => 1,
        }
    }

    /// True when values of this dtype can be decoded to numbers. The packed sub-byte
    /// dtypes (F6_E3M2, F6_E2M3, F4) are raw bytes only: the library defines no element
    /// order inside a byte, so any decoding would be a guess. This is the one list of
    /// dtypes without an element decoder: the decoders consult it.
    pub fn decodable(self) -> bool {
        !matches!(self, Dtype::F6_E3M2 | Dtype::F6_E2M3 | Dtype::F4)
    }

    /// Bytes per element for whole-byte dtypes (None for the sub-byte ones).
    pub fn size(self) -> Option<usize> {
        let bits = self.bits();
        bits.is_multiple_of(8).then_some((bits / 8) as usize)
    }
}

impl serde::Serialize for Dtype {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a (dtype, shape) pair has no byte count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeError {
    /// The product of the shape (or times the bit size) overflows 64 bits.
    Overflow,
    /// `numel * bits` is not a multiple of 8.
    SubByte {
        /// The element count.
        numel: u64,
    },
}

/// The element count of a shape (1 for a scalar), checked for overflow.
pub fn numel(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// The byte count of a tensor: `numel * bits / 8`, refusing overflow and sub-byte
/// remainders.
pub fn byte_len(dtype: Dtype, shape: &[u64]) -> Result<u64, SizeError> {
    let n = numel(shape).ok_or(SizeError::Overflow)?;
    let bits = n.checked_mul(dtype.bits()).ok_or(SizeError::Overflow)?;
    if !bits.is_multiple_of(8) {
        return Err(SizeError::SubByte { numel: n });
    }
    Ok(bits / 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_case_sensitive() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::from_name(d.name()), Some(d));
        }
        for bad in ["bf16", "F64 ", "FLOAT", "f32", "", "F8_E4M3FN", "Bool"] {
            assert_eq!(Dtype::from_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn rank_is_the_reverse_of_the_library_enum() {
        let library_order = [
            "BOOL",
            "F4",
            "F6_E2M3",
            "F6_E3M2",
            "U8",
            "I8",
            "F8_E5M2",
            "F8_E4M3",
            "F8_E8M0",
            "F8_E4M3FNUZ",
            "F8_E5M2FNUZ",
            "I16",
            "U16",
            "F16",
            "BF16",
            "I32",
            "U32",
            "F32",
            "C64",
            "F64",
            "I64",
            "U64",
        ];
        for (i, name) in library_order.iter().enumerate() {
            let d = Dtype::from_name(name).unwrap();
            assert_eq!(d.rank() as usize, 22 - i, "{name}");
        }
    }

    #[test]
    fn byte_len_rules() {
        assert_eq!(byte_len(Dtype::F32, &[2, 2]), Ok(16));
        assert_eq!(byte_len(Dtype::F32, &[]), Ok(4));
        assert_eq!(byte_len(Dtype::F32, &[0, 7]), Ok(0));
        assert_eq!(byte_len(Dtype::F4, &[2]), Ok(1));
        assert_eq!(
            byte_len(Dtype::F4, &[3]),
            Err(SizeError::SubByte { numel: 3 })
        );
        assert_eq!(byte_len(Dtype::F6_E2M3, &[4]), Ok(3));
        assert_eq!(
            byte_len(Dtype::F6_E2M3, &[2]),
            Err(SizeError::SubByte { numel: 2 })
        );
        assert_eq!(
            byte_len(Dtype::U8, &[u64::MAX, 2]),
            Err(SizeError::Overflow)
        );
        assert_eq!(
            byte_len(Dtype::F64, &[u64::MAX / 4]),
            Err(SizeError::Overflow)
        );
    }
}
