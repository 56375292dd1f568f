//! Slice kernels of `convert`: raw little-endian bytes of F32/BF16/F16 re-encoded
//! straight into BF16/F16/F32/F8_E4M3/F8_E5M2 bytes, written as branch-free loops over
//! fixed-size arrays so the compiler vectorizes them.
//!
//! Invariants: every kernel gives, bit for bit, what the scalar codecs of
//! [`float`](super::float) give (decode exactly to f32, then round once, to nearest
//! even, with the canonical NaNs); the tests check every 16-bit pattern and random
//! 32-bit ones against them. F8_E4M3 beyond 448 (infinities included) is detected per
//! slice by an OR-reduction and the first offending index is searched only then, so
//! the hot loop never branches on a value.

use super::dtype::Dtype;
use super::float::{EncodeError, EncodeFailure};

/// F32 bits of 448, F8_E4M3's largest finite magnitude.
const E4M3_MAX_BITS: u32 = 0x43E0_0000;
/// F32 bits of infinity.
const INF_BITS: u32 = 0x7F80_0000;

/// Whether [`convert_slice`] handles `from` -> `to`.
pub fn fast_pair(from: Dtype, to: Dtype) -> bool {
    matches!(from, Dtype::F32 | Dtype::BF16 | Dtype::F16)
        && matches!(
            to,
            Dtype::F32 | Dtype::BF16 | Dtype::F16 | Dtype::F8_E4M3 | Dtype::F8_E5M2
        )
}

/// Re-encode the whole elements of `src` (dtype `from`) into `dst` (dtype `to`), which
/// holds exactly as many elements. `None` when the pair is not a [`fast_pair`] or the
/// lengths disagree; an F8_E4M3 value beyond 448 is the error of the first one.
pub fn convert_slice(
    from: Dtype,
    to: Dtype,
    src: &[u8],
    dst: &mut [u8],
) -> Option<Result<(), EncodeError>> {
    let (fs, ts) = (from.size()?, to.size()?);
    if !fast_pair(from, to) || src.len() / fs != dst.len() / ts || !dst.len().is_multiple_of(ts) {
        return None;
    }
    let bad = encode_dispatch(from, to, src, dst)?;
    if bad == 0 {
        return Some(Ok(()));
    }
    // The error path only: find the first value the OR-reduction saw.
    let index = (0..src.len() / fs).find(|&i| {
        let bits = src
            .get(i * fs..(i + 1) * fs)
            .map_or(0, |b| decode_bits(from, b));
        e4m3_out_of_range(bits & 0x7FFF_FFFF) != 0
    })?;
    let bits = src
        .get(index * fs..(index + 1) * fs)
        .map_or(0, |b| decode_bits(from, b));
    Some(Err(EncodeError {
        index,
        value: f64::from(f32::from_bits(bits)),
        failure: EncodeFailure::OutOfRange,
    }))
}

/// [`encode_any`] on the widest vectors the running CPU has: the AVX2 build where it
/// is detected, else the baseline one.
fn encode_dispatch(from: Dtype, to: Dtype, src: &[u8], dst: &mut [u8]) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the function only needs AVX2 and FMA, which were detected just now
        // on the CPU running it; it has no other precondition.
        #[allow(unsafe_code, reason = "calling a target_feature function; see SAFETY")]
        return unsafe { encode_avx2(from, to, src, dst) };
    }
    encode_any(from, to, src, dst)
}

/// [`encode_any`] compiled for AVX2 + FMA (8 lanes of f32 instead of 4).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn encode_avx2(from: Dtype, to: Dtype, src: &[u8], dst: &mut [u8]) -> Option<u32> {
    encode_any(from, to, src, dst)
}

/// Every fast pair's loop; the OR of the out-of-range flags.
#[inline(always)]
fn encode_any(from: Dtype, to: Dtype, src: &[u8], dst: &mut [u8]) -> Option<u32> {
    match from {
        Dtype::F32 => encode_to(to, src, dst, dec_f32),
        Dtype::BF16 => encode_to(to, src, dst, dec_bf16),
        _ => encode_to(to, src, dst, dec_f16),
    }
}

/// The f32 bits of one element of `from` (a fast source) held in `b`.
fn decode_bits(from: Dtype, b: &[u8]) -> u32 {
    match (from, b) {
        (Dtype::F32, &[a, b, c, d]) => dec_f32([a, b, c, d]),
        (Dtype::BF16, &[a, b]) => dec_bf16([a, b]),
        (Dtype::F16, &[a, b]) => dec_f16([a, b]),
        _ => 0,
    }
}

/// Encode with the decoder `dec` of an `S`-byte source into `to`; returns the
/// OR-reduction of the out-of-range flags (always 0 but for F8_E4M3).
#[inline(always)]
fn encode_to<const S: usize>(
    to: Dtype,
    src: &[u8],
    dst: &mut [u8],
    dec: impl Fn([u8; S]) -> u32 + Copy,
) -> Option<u32> {
    Some(match to {
        Dtype::F32 => map::<S, 4>(src, dst, |b| (dec(b).to_le_bytes(), 0)),
        Dtype::BF16 => map::<S, 2>(src, dst, |b| (enc_bf16(dec(b)).to_le_bytes(), 0)),
        Dtype::F16 => map::<S, 2>(src, dst, |b| (enc_f16(dec(b)).to_le_bytes(), 0)),
        Dtype::F8_E5M2 => map::<S, 1>(src, dst, |b| ([enc_e5m2(dec(b))], 0)),
        Dtype::F8_E4M3 => map::<S, 1>(src, dst, |b| {
            let (code, bad) = enc_e4m3(dec(b));
            ([code], bad)
        }),
        _ => return None,
    })
}

/// The element loop: arrays in, arrays out, the flags OR-ed (no early exit).
#[inline(always)]
fn map<const S: usize, const D: usize>(
    src: &[u8],
    dst: &mut [u8],
    f: impl Fn([u8; S]) -> ([u8; D], u32),
) -> u32 {
    let (ins, _) = src.as_chunks::<S>();
    let (outs, _) = dst.as_chunks_mut::<D>();
    let mut bad = 0;
    for (o, &i) in outs.iter_mut().zip(ins) {
        let (code, b) = f(i);
        *o = code;
        bad |= b;
    }
    bad
}

#[inline(always)]
fn dec_f32(b: [u8; 4]) -> u32 {
    u32::from_le_bytes(b)
}

#[inline(always)]
pub(crate) fn dec_bf16(b: [u8; 2]) -> u32 {
    u32::from(u16::from_le_bytes(b)) << 16
}

/// F16 bits to f32 bits, exactly; a NaN keeps its payload and becomes quiet (as the
/// `half` crate's decoder does).
#[inline(always)]
pub(crate) fn dec_f16(b: [u8; 2]) -> u32 {
    let h = u32::from(u16::from_le_bytes(b));
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7FFF;
    let exp = em & 0x7C00;
    let normal = (em << 13) + ((127 - 15) << 23);
    // A subnormal is em * 2^-24: the integer converts exactly (< 2^10), the scaling
    // by a power of two is exact.
    let sub = (em as f32 * f32::from_bits(0x3380_0000)).to_bits();
    let quiet = if em & 0x03FF != 0 { 0x0040_0000 } else { 0 };
    let special = (em << 13) | INF_BITS | quiet;
    let mag = if exp == 0 {
        sub
    } else if exp == 0x7C00 {
        special
    } else {
        normal
    };
    sign | mag
}

/// Round the magnitude bits `a` of a finite normal-range f32 to `mant` mantissa bits
/// with exponent bias `bias`, ties to even (the result may run past the largest code).
#[inline(always)]
fn round_normal(a: u32, mant: u32, bias: u32) -> u32 {
    let shift = 23 - mant;
    let t = a.wrapping_sub((127 - bias) << 23);
    t.wrapping_add((1 << (shift - 1)) - 1 + ((t >> shift) & 1)) >> shift
}

/// Round a magnitude below the smallest normal to a subnormal code: adding `magic`
/// (a power of two whose f32 ulp is the target's subnormal quantum) makes the hardware
/// round to nearest even at that quantum.
#[inline(always)]
fn round_sub(a: u32, magic: u32) -> u32 {
    (f32::from_bits(a) + f32::from_bits(magic))
        .to_bits()
        .wrapping_sub(magic)
}

#[inline(always)]
fn enc_bf16(x: u32) -> u16 {
    let a = x & 0x7FFF_FFFF;
    let rounded = (x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16) as u16;
    let nan = ((x >> 16) & 0x8000) as u16 | 0x7FC0;
    if a > INF_BITS {
        nan
    } else {
        rounded
    }
}

#[inline(always)]
pub(crate) fn enc_f16(x: u32) -> u16 {
    let sign = (x >> 16) & 0x8000;
    let a = x & 0x7FFF_FFFF;
    let normal = round_normal(a, 10, 15).min(0x7C00);
    let sub = round_sub(a, 0x3F00_0000);
    let mag = if a > INF_BITS {
        0x7E00
    } else if a < 0x3880_0000 {
        sub
    } else {
        normal
    };
    (sign | mag) as u16
}

#[inline(always)]
fn enc_e5m2(x: u32) -> u8 {
    let sign = (x >> 24) & 0x80;
    let a = x & 0x7FFF_FFFF;
    let normal = round_normal(a, 2, 15).min(0x7C);
    let sub = round_sub(a, 0x4300_0000);
    let mag = if a > INF_BITS {
        0x7E
    } else if a < 0x3880_0000 {
        sub
    } else {
        normal
    };
    (sign | mag) as u8
}

/// 1 when the magnitude bits `a` are beyond 448 but not NaN (infinity included).
#[inline(always)]
fn e4m3_out_of_range(a: u32) -> u32 {
    u32::from(a > E4M3_MAX_BITS) & u32::from(a <= INF_BITS)
}

/// The F8_E4M3 code and 1 when the value is out of range (its code is then 0).
#[inline(always)]
fn enc_e4m3(x: u32) -> (u8, u32) {
    let sign = (x >> 24) & 0x80;
    let a = x & 0x7FFF_FFFF;
    let bad = e4m3_out_of_range(a);
    let normal = round_normal(a, 3, 7);
    let sub = round_sub(a, 0x4680_0000);
    let mag = if a > INF_BITS {
        0x7F
    } else if bad != 0 {
        0
    } else if a < 0x3C80_0000 {
        sub
    } else {
        normal
    };
    ((sign | mag) as u8, bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safetensors::float::{decode_f32, encode_f32};

    const TARGETS: [Dtype; 5] = [
        Dtype::F32,
        Dtype::BF16,
        Dtype::F16,
        Dtype::F8_E4M3,
        Dtype::F8_E5M2,
    ];

    /// The scalar reference: decode to f32, encode with today's codecs.
    fn reference(from: Dtype, to: Dtype, src: &[u8]) -> Result<Vec<u8>, EncodeError> {
        let mut vals = Vec::new();
        assert!(decode_f32(from, src, &mut vals));
        let mut out = Vec::new();
        encode_f32(to, &vals, &mut out).map(|()| out)
    }

    fn check(from: Dtype, src: &[u8]) {
        let fs = from.size().unwrap();
        for to in TARGETS {
            let ts = to.size().unwrap();
            let mut dst = vec![0u8; src.len() / fs * ts];
            let got = convert_slice(from, to, src, &mut dst).unwrap();
            // The baseline build gives the same bytes and flags as the dispatched one.
            let mut base = vec![0u8; dst.len()];
            let flags = encode_any(from, to, src, &mut base).unwrap();
            assert_eq!(flags != 0, got.is_err(), "{from} -> {to}");
            if got.is_ok() {
                assert_eq!(base, dst, "{from} -> {to} (baseline build)");
            }
            match reference(from, to, src) {
                Ok(want) => {
                    assert_eq!(got, Ok(()), "{from} -> {to}");
                    // Compare element by element for a useful message.
                    for (i, (w, g)) in want.chunks(ts).zip(dst.chunks(ts)).enumerate() {
                        assert_eq!(
                            w,
                            g,
                            "{from} -> {to} element {i}: {:?}",
                            &src[i * fs..][..fs]
                        );
                    }
                }
                Err(e) => {
                    let g = got.unwrap_err();
                    assert_eq!(g.index, e.index, "{from} -> {to}");
                    assert_eq!(g.failure, e.failure);
                    assert!(g.value == e.value || (g.value.is_nan() && e.value.is_nan()));
                }
            }
        }
    }

    /// Every 16-bit pattern of BF16 and F16 (the E4M3-valid ones together, the
    /// out-of-range ones one at a time so each index is checked).
    #[test]
    fn every_16_bit_pattern_matches_the_scalar_codecs() {
        for from in [Dtype::BF16, Dtype::F16] {
            let all: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
            let mut vals = Vec::new();
            decode_f32(from, &all, &mut vals);
            let (ok, bad): (Vec<u16>, Vec<u16>) = (0..=u16::MAX).partition(|&b| {
                let v = vals[usize::from(b)];
                v.is_nan() || v.abs() <= 448.0
            });
            let ok: Vec<u8> = ok.into_iter().flat_map(u16::to_le_bytes).collect();
            check(from, &ok);
            for to in [Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::F8_E5M2] {
                let mut dst = vec![0u8; all.len() / 2 * to.size().unwrap()];
                assert_eq!(convert_slice(from, to, &all, &mut dst), Some(Ok(())));
                assert_eq!(dst, reference(from, to, &all).unwrap(), "{from} -> {to}");
            }
            for b in bad.iter().step_by(97) {
                let mut src = ok[..64].to_vec();
                src.extend_from_slice(&b.to_le_bytes());
                src.extend_from_slice(&ok[..64]);
                check(from, &src);
            }
        }
    }

    /// Random 32-bit patterns (all exponents, both signs, NaNs, infinities).
    #[test]
    fn random_32_bit_patterns_match_the_scalar_codecs() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u32
        };
        for round in 0..64 {
            let mut words: Vec<u32> = (0..16_384).map(|_| next()).collect();
            // Round 0..31: magnitudes within E4M3 range mostly (clear the top exponent
            // bits), so the F8 kernels are exercised beyond the error path.
            if round < 32 {
                for w in &mut words {
                    let a = *w & 0x7FFF_FFFF;
                    if a > E4M3_MAX_BITS && a <= INF_BITS {
                        *w &= 0xC3FF_FFFF;
                        if *w & 0x7FFF_FFFF > E4M3_MAX_BITS {
                            *w &= 0xBFFF_FFFF;
                        }
                    }
                }
            }
            let src: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            check(Dtype::F32, &src);
        }
        // Ties and boundaries: every value near each target's rounding points.
        let special: Vec<u32> = [
            0u32,
            0x8000_0000,
            0x7F80_0000,
            0xFF80_0000,
            0x7F80_0001,
            0xFFC0_0000,
            0x0000_0001,
            0x0080_0000,
            0x3880_0000,
            0x387F_FFFF,
            0x3C80_0000,
            0x3C7F_FFFF,
            0x477F_EFFF,
            0x477F_F000,
            0x477F_F001,
            0x4780_0000,
            0x7F7F_FFFF,
            0x43E0_0000,
            0x43DF_FFFF,
            0x3380_0000,
            0x3300_0000,
            0x3300_0001,
            0x3B00_0000,
            0x3B00_0001,
            0x3780_0000,
        ]
        .iter()
        .flat_map(|&w| [w.wrapping_sub(1), w, w.wrapping_add(1)])
        .collect();
        for w in special {
            check(Dtype::F32, &w.to_le_bytes());
        }
    }

    #[test]
    fn other_pairs_and_bad_lengths_are_not_handled() {
        assert!(convert_slice(Dtype::F64, Dtype::BF16, &[0; 8], &mut [0; 2]).is_none());
        assert!(convert_slice(Dtype::F32, Dtype::I32, &[0; 4], &mut [0; 4]).is_none());
        assert!(convert_slice(Dtype::F32, Dtype::BF16, &[0; 8], &mut [0; 2]).is_none());
    }
}
