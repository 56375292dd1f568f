//! The fast path of int4 quantization: raw F32/BF16/F16 bytes of whole groups decoded,
//! scaled and packed in branch-free passes over fixed blocks, compiled twice (for the
//! baseline and, chosen at run time, for AVX2 + FMA) so the loops run on 8-lane
//! vectors where the CPU has them.
//!
//! Invariants: the bytes are exactly those of [`quantize_row`] (the same f32 division
//! per weight, the same F16 rounding of amax / 7, the same nibble rounding); any group
//! with a NaN, an infinity or an F16-overflowing scale sends its block to
//! [`quantize_row`], so errors (and their columns) are the rule's own and the hot
//! loops never branch on a value. Property tests compare both paths on arbitrary bits.

use super::int4::{quantize_row, row_scales, QuantFailure, MIN_GROUP};
use crate::safetensors::kernels::{dec_bf16, dec_f16, enc_f16};
use crate::safetensors::Dtype;

/// Weights per block: the decoded values and their nibbles stay in L1/L2 between the
/// passes (64 KiB of f32).
const BLOCK_ELEMS: usize = 16 << 10;
/// f32's infinity bit pattern (magnitude).
const F32_INF: u32 = 0x7F80_0000;
/// F16's infinity bit pattern (magnitude): a scale at or above it overflowed.
const F16_INF: u32 = 0x7C00;

/// Quantize the raw little-endian weights `raw` of `dtype` (F32, BF16 or F16; a whole
/// number of groups of `group`, which is even) as [`quantize_row`] does, appending the
/// scale bits to `scales` and, when `pack`, the nibbles to `packed`. `None` when the
/// dtype is not one of the three (the caller decodes through the scalar codecs).
pub fn quantize_raw(
    raw: &[u8],
    dtype: Dtype,
    group: usize,
    pack: bool,
    scales: &mut Vec<u16>,
    packed: &mut Vec<u8>,
) -> Option<Result<(), (usize, QuantFailure)>> {
    if !matches!(dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
        return None;
    }
    let group = group.max(MIN_GROUP as usize);
    // The fused AVX2 build takes groups of whole 32-weight runs; a group it cannot
    // finish (an error) is found, with its column, by the passes below.
    #[cfg(target_arch = "x86_64")]
    if super::int4_avx2::quantize(raw, dtype, group, pack, scales, packed) == Some(true) {
        return Some(Ok(()));
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the function only needs AVX2 and FMA, which were detected just now
        // on the CPU running it; it has no other precondition.
        #[allow(unsafe_code, reason = "calling a target_feature function; see SAFETY")]
        return Some(unsafe { quantize_avx2(raw, dtype, group, pack, scales, packed) });
    }
    Some(quantize_sized(raw, dtype, group, pack, scales, packed))
}

/// [`quantize_sized`] compiled for AVX2 + FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn quantize_avx2(
    raw: &[u8],
    dtype: Dtype,
    group: usize,
    pack: bool,
    scales: &mut Vec<u16>,
    packed: &mut Vec<u8>,
) -> Result<(), (usize, QuantFailure)> {
    quantize_sized(raw, dtype, group, pack, scales, packed)
}

/// [`quantize_generic`] with the common group sizes as constants, so their per-group
/// loops are unrolled whole instead of looping over a run-time length.
#[inline(always)]
fn quantize_sized(
    raw: &[u8],
    dtype: Dtype,
    group: usize,
    pack: bool,
    scales: &mut Vec<u16>,
    packed: &mut Vec<u8>,
) -> Result<(), (usize, QuantFailure)> {
    match group {
        32 => quantize_generic::<32>(raw, dtype, group, pack, scales, packed),
        64 => quantize_generic::<64>(raw, dtype, group, pack, scales, packed),
        128 => quantize_generic::<128>(raw, dtype, group, pack, scales, packed),
        _ => quantize_generic::<0>(raw, dtype, group, pack, scales, packed),
    }
}

/// The kernel: block by block (whole groups), decode, reduce, scale, pack. `G` is the
/// group size when it is a constant, 0 when `group` says it at run time.
#[inline(always)]
fn quantize_generic<const G: usize>(
    raw: &[u8],
    dtype: Dtype,
    group: usize,
    pack: bool,
    scales: &mut Vec<u16>,
    packed: &mut Vec<u8>,
) -> Result<(), (usize, QuantFailure)> {
    let group = if G == 0 { group } else { G };
    let size = dtype.size().unwrap_or(4).max(1);
    // A block is whole groups; a group larger than a block is a block of its own.
    let block = (BLOCK_ELEMS / group).max(1) * group;
    let mut vals = vec![0f32; block];
    let mut amax = Vec::with_capacity(block / group);
    let mut nibbles = vec![0u8; block];
    for (b, bytes) in raw.chunks(block * size).enumerate() {
        let n = bytes.len() / size;
        let vals = vals.get_mut(..n).unwrap_or_default();
        match dtype {
            Dtype::F32 => decode::<4>(bytes, vals, u32::from_le_bytes),
            Dtype::BF16 => decode::<2>(bytes, vals, dec_bf16),
            _ => decode::<2>(bytes, vals, dec_f16),
        }
        let first_scale = scales.len();
        let ok = block_scales(vals, group, &mut amax, scales);
        if !ok {
            // The error path only: the rule's own loop finds the failure and its column.
            scales.truncate(first_scale);
            let r = if pack {
                quantize_row(vals, group, scales, packed)
            } else {
                row_scales(vals, group, scales)
            };
            let at = b * block;
            r.map_err(|(col, f)| match f {
                QuantFailure::NonFinite { col: c, value } => {
                    (col + at, QuantFailure::NonFinite { col: c + at, value })
                }
                other => (col + at, other),
            })?;
            continue;
        }
        if pack {
            let nibbles = nibbles.get_mut(..n).unwrap_or_default();
            let block_scales = scales.get(first_scale..).unwrap_or_default();
            block_nibbles(vals, group, block_scales, nibbles);
            pack_pairs(nibbles, packed);
        }
    }
    Ok(())
}

/// Decode `S`-byte elements to f32 with `dec` (which returns the f32 bits).
#[inline(always)]
fn decode<const S: usize>(bytes: &[u8], vals: &mut [f32], dec: impl Fn([u8; S]) -> u32) {
    let (ins, _) = bytes.as_chunks::<S>();
    for (v, &b) in vals.iter_mut().zip(ins) {
        *v = f32::from_bits(dec(b));
    }
}

/// Append the F16 scale bits of every group of `vals`; false (with nothing to trust
/// in what was appended) when a group holds a non-finite weight or its scale overflows.
#[inline(always)]
fn block_scales(vals: &[f32], group: usize, amax: &mut Vec<u32>, scales: &mut Vec<u16>) -> bool {
    amax.clear();
    // The largest magnitude as bits: NaN and infinity land at or above F32_INF.
    amax.extend(
        vals.chunks_exact(group)
            .map(|g| g.iter().fold(0u32, |m, w| m.max(w.to_bits() & 0x7FFF_FFFF))),
    );
    let mut bad = 0u32;
    scales.extend(amax.iter().map(|&a| {
        let s = enc_f16((f32::from_bits(a) / 7.0).to_bits());
        bad |= u32::from(a >= F32_INF) | u32::from(u32::from(s) & 0x7FFF >= F16_INF);
        s
    }));
    bad == 0
}

/// The nibble of every weight of `vals` under its group's scale (bits in `scales`).
#[inline(always)]
fn block_nibbles(vals: &[f32], group: usize, scales: &[u16], nibbles: &mut [u8]) {
    for ((g, n), &s_bits) in vals
        .chunks_exact(group)
        .zip(nibbles.chunks_exact_mut(group))
        .zip(scales)
    {
        let s = f32::from_bits(dec_f16(s_bits.to_le_bytes()));
        if s == 0.0 {
            // A zero scale quantizes its group to zeros (and w / 0 is no number).
            n.fill(0);
            continue;
        }
        for (n, &w) in n.iter_mut().zip(g) {
            *n = super::int4::nibble(w / s);
        }
    }
}

/// Pack nibble pairs (even column low) and append the bytes.
#[inline(always)]
fn pack_pairs(nibbles: &[u8], packed: &mut Vec<u8>) {
    let (pairs, rest) = nibbles.as_chunks::<2>();
    // lo | hi << 8 as one u16; or-ing it with itself shifted by 4 puts hi above lo in
    // the low byte: a form that vectorizes, unlike byte pairs.
    packed.extend(pairs.iter().map(|&p| {
        let x = u16::from_le_bytes(p);
        (x | (x >> 4)) as u8
    }));
    if let [lo] = rest {
        packed.push(*lo);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The f32 bits of a property test's weights in one of four shapes: `small` 0 keeps
    /// arbitrary bits (NaNs, infinities, overflowing scales), 1 magnitudes that give
    /// ordinary scales, 2 a mix with zero runs of `zero_every` weights, 3 tiny
    /// magnitudes whose scales are F16 subnormals or zero.
    pub(crate) fn shaped(bits: &[u32], small: u8, zero_every: usize) -> Vec<u32> {
        bits.iter()
            .enumerate()
            .map(|(i, &b)| match small {
                0 => b,
                1 => b & 0xC7FF_FFFF,
                2 if (i / zero_every.max(1)).is_multiple_of(3) => b & 0x8000_0000,
                2 => b & 0xBFFF_FFFF,
                _ => b & 0x83FF_FFFF,
            })
            .collect()
    }

    /// Little-endian bytes of `bits` as `dtype` (F32, or the top halves as BF16/F16
    /// bits), for the kernels' tests here and in `int4_avx2`.
    pub(crate) fn encode(dtype: Dtype, bits: &[u32]) -> Vec<u8> {
        match dtype {
            Dtype::F32 => bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
            // The top half, so the masks below shape the 16-bit exponent too.
            _ => bits
                .iter()
                .flat_map(|&b| ((b >> 16) as u16).to_le_bytes())
                .collect(),
        }
    }

    /// The rule's result, scales and packed nibbles.
    pub(crate) type RuleOutput = (Result<(), (usize, QuantFailure)>, Vec<u16>, Vec<u8>);

    /// What the rule makes of `raw`: its result, scales and (when `pack`) nibbles.
    pub(crate) fn by_the_rule(dtype: Dtype, raw: &[u8], group: usize, pack: bool) -> RuleOutput {
        let mut vals = Vec::new();
        crate::safetensors::float::decode_f32(dtype, raw, &mut vals);
        let (mut s, mut p) = (Vec::new(), Vec::new());
        let r = if pack {
            quantize_row(&vals, group, &mut s, &mut p)
        } else {
            row_scales(&vals, group, &mut s)
        };
        (r, s, p)
    }

    /// Both paths on the same bytes: same result, same scales and nibbles.
    fn same_as_the_rule(dtype: Dtype, raw: &[u8], group: usize, pack: bool) {
        let (want, s1, p1) = by_the_rule(dtype, raw, group, pack);
        // The dispatched kernel, then the baseline build of it (which a CPU with AVX2
        // would otherwise never run here).
        let (mut s2, mut p2) = (Vec::new(), Vec::new());
        let got = quantize_raw(raw, dtype, group, pack, &mut s2, &mut p2).unwrap();
        let (mut s3, mut p3) = (Vec::new(), Vec::new());
        let baseline = quantize_sized(raw, dtype, group, pack, &mut s3, &mut p3);
        // Debug text, since a NaN in a failure is never equal to itself.
        assert_eq!(format!("{got:?}"), format!("{baseline:?}"));
        assert_eq!((&s2, &p2), (&s3, &p3));
        match (&want, &got) {
            (Ok(()), Ok(())) => {
                assert_eq!(s1, s2);
                assert_eq!(p1, p2);
            }
            (Err((c1, QuantFailure::NonFinite { col, value })), Err((c2, f2))) => {
                assert_eq!(c1, c2);
                let QuantFailure::NonFinite {
                    col: col2,
                    value: v2,
                } = f2
                else {
                    panic!("{want:?} {got:?}");
                };
                assert_eq!((col, value.to_bits()), (col2, v2.to_bits()));
            }
            _ => assert_eq!(want, got),
        }
    }

    proptest! {
        #[test]
        fn the_fast_quantizer_is_the_rule(
            bits in proptest::collection::vec(any::<u32>(), 0..600usize),
            small in 0u8..3,
            g_half in 1usize..40,
            pack in any::<bool>(),
        ) {
            let bits = shaped(&bits, small, 8);
            let group = g_half * 2;
            let len = bits.len() - bits.len() % group;
            for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
                let raw = encode(dtype, &bits[..len]);
                same_as_the_rule(dtype, &raw, group, pack);
            }
        }
    }

    /// Several blocks, and an error in a later block, whose column counts from the
    /// start of the input.
    #[test]
    fn blocks_and_a_late_error_match_the_rule() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut bits: Vec<u32> = (0..3 * BLOCK_ELEMS + 384)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state as u32) & 0xC7FF_FFFF
            })
            .collect();
        for group in [2, 32, 128, 3 * BLOCK_ELEMS + 384] {
            for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
                same_as_the_rule(dtype, &encode(dtype, &bits), group, true);
            }
        }
        bits[2 * BLOCK_ELEMS + 37] = 0x7FC0_0000;
        bits[2 * BLOCK_ELEMS + 90] = 0x7F80_0000;
        for dtype in [Dtype::F32, Dtype::BF16] {
            same_as_the_rule(dtype, &encode(dtype, &bits), 32, true);
            same_as_the_rule(dtype, &encode(dtype, &bits), 32, false);
        }
    }

    #[test]
    fn other_dtypes_are_not_handled() {
        let (mut s, mut p) = (Vec::new(), Vec::new());
        assert!(quantize_raw(&[0; 16], Dtype::F64, 2, true, &mut s, &mut p).is_none());
    }
}
