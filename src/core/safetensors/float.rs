//! Value codecs: exact decoding of every numeric dtype to f32/f64 and encoding from
//! f32/f64 with round-to-nearest, ties-to-even, done once from the source value.
//!
//! Invariants: decoding is exact for every float dtype narrower than the target; an
//! encoder rounds exactly once (f32 inputs are widened to f64 exactly before rounding,
//! never narrowed twice); NaN encodes to the canonical quiet NaN with its sign (BF16
//! 0x7FC0, F16 0x7E00, F8_E4M3 0x7F, F8_E5M2 0x7E); F8_E4M3 refuses magnitudes beyond
//! 448 (and infinities) instead of saturating; integers are encoded only when exact;
//! which dtypes have no decoder or encoder is said once, by `Dtype::decodable` and
//! `Dtype::encodable`, and the codecs refuse exactly those.
//!
//! Why not crates for everything: `half` rounds f32 to BF16/F16 correctly and is used
//! for that hot path, but its f64 conversions drop the low 32 bits of the f64 before
//! rounding (a value just above a tie rounds down), so f64 inputs go through the
//! generic encoder below; the `float8` crate saturates F8_E4M3 at 448 where the spec
//! requires an error, so the F8 encoders are written here too.

use super::dtype::Dtype;

/// Largest finite F8_E4M3 magnitude.
pub const E4M3_MAX: f64 = 448.0;

/// Why a value could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EncodeFailure {
    /// A float beyond the target's range where the target has no infinity (F8_E4M3).
    OutOfRange,
    /// An integer or BOOL target and a value that is not exactly representable.
    NotExact,
    /// The target dtype takes raw bytes only.
    RawOnly,
}

/// The first value of a chunk that could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncodeError {
    /// Index of the value inside the chunk.
    pub index: usize,
    /// The value.
    pub value: f64,
    /// Why.
    pub failure: EncodeFailure,
}

/// Round a finite, non-zero magnitude (the bits of a positive f64) to a small binary
/// float with `mant_bits` stored mantissa bits and exponent bias `bias`, ties to even.
/// Returns the magnitude code `(biased exponent << mant_bits) | mantissa`, which may run
/// past the format's largest finite code: the caller decides between infinity and error.
pub(crate) fn round_magnitude(abs_bits: u64, mant_bits: u32, bias: i32) -> u64 {
    let exp_field = ((abs_bits >> 52) & 0x7ff) as i32;
    if exp_field == 0 {
        // f64 subnormals are below 2^-1022, far under half the smallest subnormal of any
        // format handled here.
        return 0;
    }
    let mant = (abs_bits & ((1u64 << 52) - 1)) | (1u64 << 52);
    let e = exp_field - 1023;
    let emin = 1 - bias;
    let eq = e.max(emin);
    // The quantum of the target binade is 2^(eq - mant_bits); the value is
    // mant * 2^(e - 52), so the count of quanta is mant >> shift with this shift.
    let shift = (eq - mant_bits as i32) - (e - 52);
    if shift >= 64 {
        return 0;
    }
    let shift = shift as u32;
    let q = mant >> shift;
    let rem = mant & ((1u64 << shift) - 1);
    let half = 1u64 << (shift - 1);
    let q = if rem > half || (rem == half && q & 1 == 1) {
        q + 1
    } else {
        q
    };
    (((eq - emin) as u64) << mant_bits) + q
}

/// f64 to BF16 bits: one rounding, NaN to 0x7FC0 with the sign, overflow to infinity.
pub fn f64_to_bf16(x: f64) -> u16 {
    ieee_small(x, 7, 127, 0x7F80, 0x7FC0, 15)
}

/// f32 to BF16 bits (the `half` crate's RNE, with the canonical NaN of the spec).
pub fn f32_to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return sign16(x.is_sign_negative()) | 0x7FC0;
    }
    half::bf16::from_f32(x).to_bits()
}

/// The first finite f64 value that rounds to an infinite f32 (beyond f32::MAX after
/// rounding), if any: F64 to F32 must fail there rather than store an infinity.
pub fn first_f32_overflow(values: &[f64]) -> Option<usize> {
    values
        .iter()
        .position(|&v| v.is_finite() && (v as f32).is_infinite())
}

/// f64 to F16 bits: one rounding, NaN to 0x7E00 with the sign, overflow to infinity.
pub fn f64_to_f16(x: f64) -> u16 {
    ieee_small(x, 10, 15, 0x7C00, 0x7E00, 15)
}

/// f32 to F16 bits (the `half` crate's RNE, with the canonical NaN).
pub fn f32_to_f16(x: f32) -> u16 {
    if x.is_nan() {
        return sign16(x.is_sign_negative()) | 0x7E00;
    }
    half::f16::from_f32(x).to_bits()
}

fn sign16(neg: bool) -> u16 {
    if neg {
        0x8000
    } else {
        0
    }
}

/// An IEEE-style format with infinities: `inf` is the magnitude code of infinity,
/// `qnan` the canonical NaN, `sign_shift` the position of the sign bit.
fn ieee_small(x: f64, mant_bits: u32, bias: i32, inf: u16, qnan: u16, sign_shift: u32) -> u16 {
    let sign = (u16::from(x.is_sign_negative())) << sign_shift;
    if x.is_nan() {
        return sign | qnan;
    }
    if x.is_infinite() {
        return sign | inf;
    }
    let m = round_magnitude(x.abs().to_bits(), mant_bits, bias);
    if m >= u64::from(inf) {
        sign | inf
    } else {
        sign | m as u16
    }
}

/// f64 to F8_E4M3 ("fn"): None when |x| > 448 or x is infinite (never saturates);
/// NaN is 0x7F (0xFF when negative).
pub fn f64_to_e4m3(x: f64) -> Option<u8> {
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_nan() {
        return Some(sign | 0x7F);
    }
    let a = x.abs();
    if a > E4M3_MAX {
        return None;
    }
    // |x| <= 448 rounds to at most 0x7E (448 itself); it can never reach the NaN code.
    let m = round_magnitude(a.to_bits(), 3, 7);
    Some(sign | m as u8)
}

/// f64 to F8_E5M2: one rounding, overflow to infinity (0x7C), NaN 0x7E with the sign.
pub fn f64_to_e5m2(x: f64) -> u8 {
    ieee_small(x, 2, 15, 0x7C, 0x7E, 7) as u8
}

/// BF16 bits to f32, exactly (the 16 bits become the top half).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// F16 bits to f32, exactly.
pub fn f16_to_f32(b: u16) -> f32 {
    half::f16::from_bits(b).to_f32()
}

/// A small float's value from its fields, exactly (no special codes).
fn small_value(mag: u32, mant_bits: u32, bias: i32) -> f32 {
    let e = (mag >> mant_bits) as i32;
    let m = (mag & ((1 << mant_bits) - 1)) as f32;
    let scale = (1u32 << mant_bits) as f32;
    if e == 0 {
        m / scale * pow2(1 - bias)
    } else {
        (1.0 + m / scale) * pow2(e - bias)
    }
}

fn pow2(e: i32) -> f32 {
    // Every exponent used here lies in [-127, 127], a normal f64 whose bits are built
    // directly; the narrowing to f32 is exact (2^-127 is an f32 subnormal).
    f64::from_bits(((e + 1023) as u64) << 52) as f32
}

/// F8_E4M3 ("fn") code to f32: 0x7F/0xFF NaN, everything else a number up to 448.
pub fn e4m3_to_f32(c: u8) -> f32 {
    let neg = c & 0x80 != 0;
    let mag = u32::from(c & 0x7F);
    let v = if mag == 0x7F {
        f32::NAN
    } else {
        small_value(mag, 3, 7)
    };
    if neg {
        -v
    } else {
        v
    }
}

/// F8_E5M2 code to f32: it is the top byte of an F16.
pub fn e5m2_to_f32(c: u8) -> f32 {
    f16_to_f32(u16::from(c) << 8)
}

/// F8_E4M3FNUZ code to f32: bias 8, 0x80 the only NaN, no negative zero, no infinity.
pub fn e4m3fnuz_to_f32(c: u8) -> f32 {
    fnuz(c, 3, 8)
}

/// F8_E5M2FNUZ code to f32: bias 16, 0x80 the only NaN, no negative zero, no infinity.
pub fn e5m2fnuz_to_f32(c: u8) -> f32 {
    fnuz(c, 2, 16)
}

fn fnuz(c: u8, mant_bits: u32, bias: i32) -> f32 {
    if c == 0x80 {
        return f32::NAN;
    }
    let v = small_value(u32::from(c & 0x7F), mant_bits, bias);
    if c & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// F8_E8M0 code to f32: 2^(c - 127), 0xFF NaN.
pub fn e8m0_to_f32(c: u8) -> f32 {
    if c == 0xFF {
        f32::NAN
    } else {
        pow2(i32::from(c) - 127)
    }
}

/// Append `f` of each whole `N`-byte chunk of `bytes` to `out` (a trailing partial
/// chunk is ignored; callers pass whole elements).
#[inline]
fn each<const N: usize, T>(bytes: &[u8], out: &mut Vec<T>, f: impl Fn([u8; N]) -> T) {
    out.extend(bytes.chunks_exact(N).map(|c| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        f(a)
    }));
}

/// Decode raw little-endian bytes of `dtype` into `out` (appending). C64 yields two
/// values per element (real, imaginary); integers convert with `as` (I64/U64 beyond
/// 2^24 round in f32); BOOL yields its byte. Returns false for the raw-only sub-byte
/// dtypes. `bytes` must hold whole elements.
pub fn decode_f32(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>) -> bool {
    // `Dtype::decodable` is the one list of dtypes without an element decoder.
    if !dtype.decodable() {
        return false;
    }
    match dtype {
        Dtype::F32 | Dtype::C64 => each(bytes, out, f32::from_le_bytes),
        Dtype::F64 => each(bytes, out, |a| f64::from_le_bytes(a) as f32),
        Dtype::BF16 => each(bytes, out, |a| bf16_to_f32(u16::from_le_bytes(a))),
        Dtype::F16 => each(bytes, out, |a| f16_to_f32(u16::from_le_bytes(a))),
        Dtype::U64 => each(bytes, out, |a| u64::from_le_bytes(a) as f32),
        Dtype::I64 => each(bytes, out, |a| i64::from_le_bytes(a) as f32),
        Dtype::U32 => each(bytes, out, |a| u32::from_le_bytes(a) as f32),
        Dtype::I32 => each(bytes, out, |a| i32::from_le_bytes(a) as f32),
        Dtype::U16 => each(bytes, out, |a| f32::from(u16::from_le_bytes(a))),
        Dtype::I16 => each(bytes, out, |a| f32::from(i16::from_le_bytes(a))),
        Dtype::F8_E4M3 => out.extend(bytes.iter().map(|&c| e4m3_to_f32(c))),
        Dtype::F8_E5M2 => out.extend(bytes.iter().map(|&c| e5m2_to_f32(c))),
        Dtype::F8_E4M3FNUZ => out.extend(bytes.iter().map(|&c| e4m3fnuz_to_f32(c))),
        Dtype::F8_E5M2FNUZ => out.extend(bytes.iter().map(|&c| e5m2fnuz_to_f32(c))),
        Dtype::F8_E8M0 => out.extend(bytes.iter().map(|&c| e8m0_to_f32(c))),
        Dtype::I8 => out.extend(bytes.iter().map(|&c| f32::from(c as i8))),
        Dtype::U8 | Dtype::BOOL => out.extend(bytes.iter().map(|&c| f32::from(c))),
        // Only the raw-only dtypes, refused above (a test checks the two agree).
        _ => return false,
    }
    true
}

/// Like [`decode_f32`] into f64: exact for every dtype except I64/U64 beyond 2^53.
pub fn decode_f64(dtype: Dtype, bytes: &[u8], out: &mut Vec<f64>) -> bool {
    match dtype {
        Dtype::F64 => each(bytes, out, f64::from_le_bytes),
        Dtype::U64 => each(bytes, out, |a| u64::from_le_bytes(a) as f64),
        Dtype::I64 => each(bytes, out, |a| i64::from_le_bytes(a) as f64),
        Dtype::U32 => each(bytes, out, |a| f64::from(u32::from_le_bytes(a))),
        Dtype::I32 => each(bytes, out, |a| f64::from(i32::from_le_bytes(a))),
        _ => {
            // Every other dtype decodes exactly to f32, and f32 widens exactly.
            let start = out.len();
            let mut tmp = Vec::with_capacity(bytes.len());
            if !decode_f32(dtype, bytes, &mut tmp) {
                return false;
            }
            out.reserve(tmp.len());
            out.extend(tmp.iter().map(|&v| f64::from(v)));
            debug_assert!(out.len() >= start);
        }
    }
    true
}

/// Decode integer and BOOL dtypes exactly (every I64/U64 value fits an i128). Returns
/// false for other dtypes.
pub fn decode_ints(dtype: Dtype, bytes: &[u8], out: &mut Vec<i128>) -> bool {
    match dtype {
        Dtype::U64 => each(bytes, out, |a| i128::from(u64::from_le_bytes(a))),
        Dtype::I64 => each(bytes, out, |a| i128::from(i64::from_le_bytes(a))),
        Dtype::U32 => each(bytes, out, |a| i128::from(u32::from_le_bytes(a))),
        Dtype::I32 => each(bytes, out, |a| i128::from(i32::from_le_bytes(a))),
        Dtype::U16 => each(bytes, out, |a| i128::from(u16::from_le_bytes(a))),
        Dtype::I16 => each(bytes, out, |a| i128::from(i16::from_le_bytes(a))),
        Dtype::I8 => each(bytes, out, |a| i128::from(i8::from_le_bytes(a))),
        Dtype::U8 | Dtype::BOOL => each(bytes, out, |a| i128::from(u8::from_le_bytes(a))),
        _ => return false,
    }
    true
}

fn exact_int(v: f64, min: f64, max_exclusive: f64) -> bool {
    v.is_finite() && v.fract() == 0.0 && v >= min && v < max_exclusive
}

/// Encode f64 values to `dtype`, appending little-endian bytes to `out`. On failure
/// `out` may hold the codes of the values before the failing one.
pub fn encode_f64(dtype: Dtype, values: &[f64], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    encode_with(
        dtype,
        values.len(),
        |i| values.get(i).copied().unwrap_or(0.0),
        out,
    )
}

/// Encode f32 values to `dtype`. Widening to f64 is exact, so this rounds exactly once;
/// BF16 and F16 take the `half` crate's f32 path, which is faster and identical.
pub fn encode_f32(dtype: Dtype, values: &[f32], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    match dtype {
        Dtype::F32 => {
            // Into a zeroed tail, four bytes per value: a loop the compiler turns into
            // a copy on a little-endian machine (pushing four bytes at a time checks
            // the capacity per value and ran at a tenth of memory speed).
            let start = out.len();
            out.resize(start.saturating_add(values.len().saturating_mul(4)), 0);
            let tail = out.get_mut(start..).unwrap_or_default();
            for (dst, v) in tail.chunks_exact_mut(4).zip(values) {
                dst.copy_from_slice(&v.to_le_bytes());
            }
            Ok(())
        }
        Dtype::BF16 => {
            out.reserve(values.len() * 2);
            for &v in values {
                out.extend_from_slice(&f32_to_bf16(v).to_le_bytes());
            }
            Ok(())
        }
        Dtype::F16 => {
            out.reserve(values.len() * 2);
            for &v in values {
                out.extend_from_slice(&f32_to_f16(v).to_le_bytes());
            }
            Ok(())
        }
        _ => encode_with(
            dtype,
            values.len(),
            |i| values.get(i).map_or(0.0, |&v| f64::from(v)),
            out,
        ),
    }
}

const TWO_63: f64 = 9_223_372_036_854_775_808.0;
const TWO_64: f64 = 18_446_744_073_709_551_616.0;

fn encode_with(
    dtype: Dtype,
    len: usize,
    get: impl Fn(usize) -> f64,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    // `Dtype::encodable` is the one list of raw-only targets; like every other
    // failure, it is reported at the first value (no values, no failure).
    if len > 0 && !dtype.encodable() {
        return Err(EncodeError {
            index: 0,
            value: get(0),
            failure: EncodeFailure::RawOnly,
        });
    }
    let size = dtype.size().unwrap_or(1);
    out.reserve(len.saturating_mul(size));
    for i in 0..len {
        let v = get(i);
        let fail = |failure| EncodeError {
            index: i,
            value: v,
            failure,
        };
        // An integer dtype (or BOOL) takes `v` only when it is an integer in its range.
        let exact = |min, max_exclusive| {
            if exact_int(v, min, max_exclusive) {
                Ok(v)
            } else {
                Err(fail(EncodeFailure::NotExact))
            }
        };
        match dtype {
            Dtype::F64 => out.extend_from_slice(&v.to_le_bytes()),
            Dtype::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            Dtype::BF16 => out.extend_from_slice(&f64_to_bf16(v).to_le_bytes()),
            Dtype::F16 => out.extend_from_slice(&f64_to_f16(v).to_le_bytes()),
            Dtype::F8_E4M3 => out.push(f64_to_e4m3(v).ok_or(fail(EncodeFailure::OutOfRange))?),
            Dtype::F8_E5M2 => out.push(f64_to_e5m2(v)),
            Dtype::U64 => out.extend_from_slice(&(exact(0.0, TWO_64)? as u64).to_le_bytes()),
            Dtype::I64 => out.extend_from_slice(&(exact(-TWO_63, TWO_63)? as i64).to_le_bytes()),
            Dtype::U32 => {
                out.extend_from_slice(&(exact(0.0, 4_294_967_296.0)? as u32).to_le_bytes())
            }
            Dtype::I32 => out.extend_from_slice(
                &(exact(-2_147_483_648.0, 2_147_483_648.0)? as i32).to_le_bytes(),
            ),
            Dtype::U16 => out.extend_from_slice(&(exact(0.0, 65_536.0)? as u16).to_le_bytes()),
            Dtype::I16 => {
                out.extend_from_slice(&(exact(-32_768.0, 32_768.0)? as i16).to_le_bytes())
            }
            Dtype::U8 => out.push(exact(0.0, 256.0)? as u8),
            Dtype::I8 => out.push(exact(-128.0, 128.0)? as i8 as u8),
            Dtype::BOOL => out.push(exact(0.0, 2.0)? as u8),
            // Only the raw-only targets, refused above (a test checks the two agree).
            _ => return Err(fail(EncodeFailure::RawOnly)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_f32_overflow_finds_finite_values_only() {
        let max = f64::from(f32::MAX);
        assert_eq!(
            first_f32_overflow(&[1.0, max, f64::INFINITY, f64::NAN]),
            None
        );
        assert_eq!(first_f32_overflow(&[0.0, 1e39, -1e39]), Some(1));
        assert_eq!(first_f32_overflow(&[-1e300]), Some(0));
    }

    /// The codec tables and the raw-only lists of `Dtype` agree: a decodable or
    /// encodable dtype always has its arm, never the catch-all.
    #[test]
    fn codecs_agree_with_the_raw_only_lists() {
        for d in Dtype::ALL {
            let whole = vec![0u8; d.size().unwrap_or(3) * 2];
            assert_eq!(decode_f32(d, &whole, &mut Vec::new()), d.decodable(), "{d}");
            let encoded = encode_f64(d, &[0.0], &mut Vec::new());
            assert_eq!(encoded.is_ok(), d.encodable(), "{d}");
            if let Err(e) = encoded {
                assert_eq!(e.failure, EncodeFailure::RawOnly, "{d}");
            }
            assert_eq!(encode_f64(d, &[], &mut Vec::new()), Ok(()), "{d}");
        }
    }
}
