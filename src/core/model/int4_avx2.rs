//! The fused AVX2 build of int4 quantization (x86_64, chosen at run time when the CPU
//! has AVX2, FMA and F16C): eight groups at a time, their largest magnitudes reduced in
//! ymm registers and their F16 scales rounded by `vcvtps2ph` eight at once, then every
//! weight decoded, divided, rounded and packed from the raw bytes in one pass, with no
//! decoded copy, no nibble buffer and no scalar work per group.
//!
//! Invariants: the bytes are those of [`quantize_row`](super::int4::quantize_row): the
//! same f32 division per weight, the same round-to-nearest-even F16 scale of amax / 7,
//! the same nibble rounding. A batch with a NaN, an infinity or an F16-overflowing
//! scale makes the whole call give up with nothing appended, so the caller's rule path
//! finds the error and its column. Only groups of whole 32-weight runs are taken (the
//! common sizes 32, 64, 128): a run of 32 nibbles packs to one 16-byte store.
//! BF16 goes two weights to a 32-bit lane ([`run_bf16`]); F32 and F16 one to a lane.
//! Hand-written because the auto-vectorized kernel decodes each block into an f32
//! copy, reduces and rounds the scales one group at a time in scalar code and packs the
//! nibbles in a second pass (quantizing 1 GiB of BF16, perf sampled about 0.65 s of CPU
//! in that kernel and about 0.25 s in this one).

#![cfg(target_arch = "x86_64")]

use crate::safetensors::Dtype;
use std::arch::x86_64::*;

/// Weights per vector (8 lanes of f32).
const LANES: usize = 8;
/// Weights per packing step: four vectors of nibbles make one 16-byte store.
const RUN: usize = 32;
/// BF16 weights per vector in [`run_bf16`]: 16, two to each 32-bit lane.
const PAIR_LANES: usize = 16;
/// Groups whose scales are computed together: one vector of amax values.
const BATCH_GROUPS: usize = 8;
/// f32's infinity bit pattern (magnitude): an amax at or above it is not finite.
const F32_INF: i32 = 0x7F80_0000;
/// F16's infinity bit pattern (magnitude): a scale at or above it overflowed.
const F16_INF: i32 = 0x7C00;
/// 1.5 * 2^23: adding it rounds a value in [-8, 7] to an integer (nearest even) that
/// sits in the low mantissa bits, two's complement, as [`nibble`](super::int4) does.
const MAGIC: f32 = 12_582_912.0;

/// The raw dtypes, as the const parameter that picks each one's decoding at compile
/// time (a run-time choice would branch per vector).
const F32: u8 = 0;
/// See [`F32`].
const BF16: u8 = 1;
/// See [`F32`].
const F16: u8 = 2;

/// Whether this build can run here: AVX2, FMA and F16C.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// Quantize `raw` (whole groups of `group`) as the rule does, appending the scale bits
/// to `scales` and, when `pack`, the nibble pairs to `packed`. `None` when this build
/// does not apply (no AVX2/FMA/F16C, a group that is not whole 32-weight runs, another
/// dtype, bytes that are not whole groups); `Some(false)` when a group is not finite or
/// its scale overflows, with nothing appended; `Some(true)` when done.
pub(super) fn quantize(
    raw: &[u8],
    dtype: Dtype,
    group: usize,
    pack: bool,
    scales: &mut Vec<u16>,
    packed: &mut Vec<u8>,
) -> Option<bool> {
    let size = match dtype {
        Dtype::F32 => 4,
        Dtype::BF16 | Dtype::F16 => 2,
        _ => return None,
    };
    let whole = group
        .checked_mul(size)
        .is_some_and(|b| raw.len().is_multiple_of(b));
    if group == 0 || !group.is_multiple_of(RUN) || !whole || !available() {
        return None;
    }
    let (s0, p0) = (scales.len(), packed.len());
    let per = group / LANES;
    // SAFETY: the function needs AVX2, FMA and F16C, detected just now on the CPU
    // running it; it has no other precondition.
    #[allow(unsafe_code, reason = "calling a target_feature function; see SAFETY")]
    let ok = unsafe {
        match dtype {
            Dtype::F32 => run::<32, F32>(raw, per, pack, scales, packed),
            Dtype::BF16 => run_bf16(raw, group / PAIR_LANES, pack, scales, packed),
            _ => run::<16, F16>(raw, per, pack, scales, packed),
        }
    };
    if !ok {
        scales.truncate(s0);
        packed.truncate(p0);
    }
    Some(ok)
}

/// The kernel over vectors of `W` raw bytes (8 weights of dtype `K`), `per` vectors
/// (a multiple of 4) per group.
#[target_feature(enable = "avx2,fma,f16c")]
fn run<const W: usize, const K: u8>(
    raw: &[u8],
    per: usize,
    pack: bool,
    scales: &mut Vec<u16>,
    packed: &mut Vec<u8>,
) -> bool {
    let (vecs, _) = raw.as_chunks::<W>();
    let start = packed.len();
    if pack {
        packed.resize(start + vecs.len() * LANES / 2, 0);
    }
    let out = packed.get_mut(start..).unwrap_or_default();
    let (out, _) = out.as_chunks_mut::<16>();
    let mut out = out.iter_mut();
    let abs = _mm256_set1_epi32(0x7FFF_FFFF);
    let seven = _mm256_set1_ps(7.0);
    for batch in vecs.chunks(per * BATCH_GROUPS) {
        let mut lanes = [_mm256_setzero_si256(); BATCH_GROUPS];
        for (m, g) in lanes.iter_mut().zip(batch.chunks_exact(per)) {
            for v in g {
                *m = _mm256_max_epu32(*m, _mm256_and_si256(load::<W, K>(v), abs));
            }
        }
        let Some(h) = batch_scales(reduce_max(lanes), seven) else {
            return false;
        };
        let bits = to_u16(h);
        let groups = batch.len() / per;
        scales.extend_from_slice(bits.get(..groups).unwrap_or_default());
        if !pack {
            continue;
        }
        let sf = to_f32(_mm256_cvtph_ps(h));
        for ((g, &s), &b) in batch.chunks_exact(per).zip(&sf).zip(&bits) {
            let s = _mm256_set1_ps(s);
            // A zero scale quantizes its group to zeros (w / 0 is no number).
            let keep = _mm256_set1_epi32(if b == 0 { 0 } else { -1 });
            let (runs, _) = g.as_chunks::<4>();
            for (r, o) in runs.iter().zip(&mut out) {
                let [a, b, c, d] = r.each_ref().map(|v| nibbles(load::<W, K>(v), s, keep));
                *o = pack_run(a, b, c, d);
            }
        }
    }
    true
}

/// [`run`] for BF16, in pairs: a 32-bit lane holds an even weight (its low half) and
/// the odd one after it (its high half), so decoding is a shift or a mask, the
/// magnitudes reduce as 16-bit lanes (16 weights an instruction) and each lane's two
/// nibbles make one byte in place, leaving one pack and one permute per 32 weights
/// where [`run`] widens every weight and shuffles four times. `per` is the group's
/// vectors of 16 weights (even).
#[target_feature(enable = "avx2,fma,f16c")]
fn run_bf16(
    raw: &[u8],
    per: usize,
    pack: bool,
    scales: &mut Vec<u16>,
    packed: &mut Vec<u8>,
) -> bool {
    let (vecs, _) = raw.as_chunks::<32>();
    let start = packed.len();
    if pack {
        packed.resize(start + vecs.len() * PAIR_LANES / 2, 0);
    }
    let out = packed.get_mut(start..).unwrap_or_default();
    let (out, _) = out.as_chunks_mut::<16>();
    let mut out = out.iter_mut();
    let abs = _mm256_set1_epi16(0x7FFF);
    let low = _mm256_set1_epi32(0xFFFF);
    let seven = _mm256_set1_ps(7.0);
    for batch in vecs.chunks(per * BATCH_GROUPS) {
        let mut lanes = [_mm256_setzero_si256(); BATCH_GROUPS];
        for (m, g) in lanes.iter_mut().zip(batch.chunks_exact(per)) {
            let mut m16 = _mm256_setzero_si256();
            for v in g {
                m16 = _mm256_max_epu16(m16, _mm256_and_si256(load_pairs(v), abs));
            }
            // The larger magnitude of each lane's two, as f32 bits.
            let wide = _mm256_max_epu32(_mm256_and_si256(m16, low), _mm256_srli_epi32::<16>(m16));
            *m = _mm256_slli_epi32::<16>(wide);
        }
        let Some(h) = batch_scales(reduce_max(lanes), seven) else {
            return false;
        };
        let bits = to_u16(h);
        let groups = batch.len() / per;
        scales.extend_from_slice(bits.get(..groups).unwrap_or_default());
        if !pack {
            continue;
        }
        let sf = to_f32(_mm256_cvtph_ps(h));
        let high = _mm256_set1_epi32(!0xFFFF);
        for ((g, &s), &b) in batch.chunks_exact(per).zip(&sf).zip(&bits) {
            let s = _mm256_set1_ps(s);
            // A zero scale quantizes its group to zeros (w / 0 is no number).
            let keep = _mm256_set1_epi32(if b == 0 { 0 } else { -1 });
            let (runs, _) = g.as_chunks::<2>();
            for (r, o) in runs.iter().zip(&mut out) {
                let [a, c] = r.each_ref().map(|v| {
                    let v = load_pairs(v);
                    let even = nibbles(_mm256_slli_epi32::<16>(v), s, keep);
                    let odd = nibbles(_mm256_and_si256(v, high), s, keep);
                    _mm256_or_si256(even, _mm256_slli_epi32::<4>(odd))
                });
                // Bytes in 32-bit lanes: 0-3 of a, of c | 4-7 of a, of c after the
                // packs; the permute puts a's eight before c's.
                let w = _mm256_packus_epi32(a, c);
                let w = _mm256_packus_epi16(w, w);
                let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                *o = to_bytes(_mm256_castsi256_si128(w));
            }
        }
    }
    true
}

/// The F16 bits of the scales of the amax vector `av` (f32 bits): amax / 7, rounded
/// to nearest even; `None` when an amax is not finite or a scale overflows F16.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn batch_scales(av: __m256i, seven: __m256) -> Option<__m128i> {
    // Magnitudes fit in 31 bits, so the signed compares are the unsigned ones.
    let inf = _mm256_cmpgt_epi32(av, _mm256_set1_epi32(F32_INF - 1));
    let s = _mm256_div_ps(_mm256_castsi256_ps(av), seven);
    let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(s);
    let over = _mm256_cmpgt_epi32(_mm256_cvtepu16_epi32(h), _mm256_set1_epi32(F16_INF - 1));
    (_mm256_movemask_epi8(_mm256_or_si256(inf, over)) == 0).then_some(h)
}

/// 16 BF16 weights as 8 32-bit lanes of pairs.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load_pairs(v: &[u8; 32]) -> __m256i {
    // SAFETY: `v` holds 32 bytes, which the unaligned 256-bit load reads.
    #[allow(unsafe_code, reason = "loading a vector from a slice; see SAFETY")]
    unsafe {
        _mm256_loadu_si256(v.as_ptr().cast())
    }
}

/// The 8 weights of `v` (dtype `K`) as f32 bits.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load<const W: usize, const K: u8>(v: &[u8; W]) -> __m256i {
    let p = v.as_ptr();
    // SAFETY: `v` holds W bytes: the 256-bit load reads 32 and the 128-bit loads 16,
    // each only where W covers it; all loads are unaligned.
    #[allow(unsafe_code, reason = "loading a vector from a slice; see SAFETY")]
    unsafe {
        match K {
            F32 if W >= 32 => _mm256_loadu_si256(p.cast()),
            BF16 if W >= 16 => {
                _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())))
            }
            F16 if W >= 16 => _mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128(p.cast()))),
            _ => _mm256_setzero_si256(),
        }
    }
}

/// The largest lane of each of 8 vectors, as the lanes of one (lane j from vector j):
/// a transposing reduction, 7 merges of three instructions where reducing each vector
/// on its own would take six instructions per vector.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn reduce_max(v: [__m256i; 8]) -> __m256i {
    // After a merge of 32-bit pairs, each 128-bit lane holds two partial maxima of
    // both vectors (a, b, a, b); after one of 64-bit pairs, one of each of four.
    let pairs = |a, b| _mm256_max_epu32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    let quads = |a, b| _mm256_max_epu32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
    let [v0, v1, v2, v3, v4, v5, v6, v7] = v;
    let q0 = quads(pairs(v0, v1), pairs(v2, v3));
    let q1 = quads(pairs(v4, v5), pairs(v6, v7));
    // Then the 128-bit halves: q0's two halves meet in the low one, q1's in the high.
    _mm256_max_epu32(
        _mm256_permute2x128_si256::<0x20>(q0, q1),
        _mm256_permute2x128_si256::<0x31>(q0, q1),
    )
}

/// The nibbles (0..=15, one per 32-bit lane) of 8 weights (bits `w`) under the scale
/// `s`, zero where `keep` is clear.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn nibbles(w: __m256i, s: __m256, keep: __m256i) -> __m256i {
    let x = _mm256_div_ps(_mm256_castsi256_ps(w), s);
    let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-8.0)), _mm256_set1_ps(7.0));
    let q = _mm256_castps_si256(_mm256_add_ps(x, _mm256_set1_ps(MAGIC)));
    _mm256_and_si256(_mm256_and_si256(q, _mm256_set1_epi32(0x0F)), keep)
}

/// The 16 packed bytes of 32 nibbles (four vectors in weight order): each pair's even
/// weight in the low nibble.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn pack_run(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> [u8; 16] {
    // The saturating packs work within 128-bit halves: the 32 bytes come out in the
    // order a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7, which the dword permute undoes.
    let bytes = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
    let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // Each 16-bit lane is (even, odd): even * 1 + odd * 16 is the packed byte.
    let pairs = _mm256_maddubs_epi16(bytes, _mm256_set1_epi16(0x1001));
    let packed = _mm256_packus_epi16(pairs, pairs);
    let packed = _mm256_permute4x64_epi64::<0b10_00>(packed);
    to_bytes(_mm256_castsi256_si128(packed))
}

/// A vector of 8 F16 values as their bits.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn to_u16(h: __m128i) -> [u16; 8] {
    // SAFETY: both are 16 bytes, and every bit pattern is valid for either.
    #[allow(unsafe_code, reason = "a plain-data reinterpretation; see SAFETY")]
    unsafe {
        std::mem::transmute::<__m128i, [u16; 8]>(h)
    }
}

/// A vector of 16 bytes as an array.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn to_bytes(v: __m128i) -> [u8; 16] {
    // SAFETY: both are 16 bytes, and every bit pattern is valid for either.
    #[allow(unsafe_code, reason = "a plain-data reinterpretation; see SAFETY")]
    unsafe {
        std::mem::transmute::<__m128i, [u8; 16]>(v)
    }
}

/// A vector of 8 f32 as an array.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn to_f32(v: __m256) -> [f32; 8] {
    // SAFETY: both are 32 bytes, and every bit pattern is valid for either.
    #[allow(unsafe_code, reason = "a plain-data reinterpretation; see SAFETY")]
    unsafe {
        std::mem::transmute::<__m256, [f32; 8]>(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::int4_kernel::tests::{by_the_rule, encode, shaped};
    use crate::safetensors::kernels::{dec_f16, enc_f16};
    use proptest::prelude::*;

    /// The machines tlio is tested on have AVX2, FMA and F16C: a test that found them
    /// missing would test nothing, so it says so by failing.
    fn require() {
        assert!(
            available(),
            "this CPU lacks AVX2, FMA or F16C: the kernel is untested"
        );
    }

    /// The F16 rounding of `vcvtps2ph` is `enc_f16`'s at every F16 value, at every
    /// midpoint between neighbours and one ulp either side of it (where ties decide),
    /// for both signs; and `vcvtph2ps` is `dec_f16` on every F16 pattern.
    #[test]
    fn the_vector_f16_conversions_are_the_scalar_ones() {
        require();
        let mut xs = Vec::new();
        for h in 0u32..0x7C00 {
            let lo = dec_f16((h as u16).to_le_bytes());
            let hi = dec_f16(((h + 1) as u16).to_le_bytes());
            let mid =
                ((f64::from(f32::from_bits(lo)) + f64::from(f32::from_bits(hi))) / 2.0) as f32;
            for x in [lo, mid.to_bits(), mid.to_bits() - 1, mid.to_bits() + 1] {
                xs.extend([x, x | 0x8000_0000]);
            }
        }
        xs.extend([
            0x7F80_0000,
            0x7F7F_FFFF,
            0x477F_F000,
            0x477F_EFFF,
            1,
            0x3300_0000,
        ]);
        for chunk in xs.chunks(8) {
            let mut a = [0u32; 8];
            a[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: the features were required above.
            #[allow(unsafe_code, reason = "calling a target_feature function; see SAFETY")]
            let got = unsafe { round_f16(a) };
            for (x, h) in a.iter().zip(got) {
                assert_eq!(h, enc_f16(*x), "{x:#010x}");
            }
        }
        for h in 0..=u16::MAX {
            let mut a = [0u16; 8];
            a[0] = h;
            // SAFETY: the features were required above.
            #[allow(unsafe_code, reason = "calling a target_feature function; see SAFETY")]
            let got = unsafe { widen_f16(a) };
            let want = dec_f16(h.to_le_bytes());
            // NaNs: both quiet them; compare as NaN-or-bits.
            let g = got[0].to_bits();
            assert!(
                g == want || (got[0].is_nan() && f32::from_bits(want).is_nan()),
                "{h:#06x}"
            );
        }
    }

    /// Lane j of the reduction is the largest lane of vector j.
    #[test]
    fn the_transposing_reduction_takes_each_vectors_max() {
        require();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..500 {
            let mut rows = [[0u32; 8]; 8];
            for x in rows.iter_mut().flatten() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *x = state as u32;
            }
            // SAFETY: the features were required above.
            #[allow(unsafe_code, reason = "calling a target_feature function; see SAFETY")]
            let got = unsafe { reduce_rows(rows) };
            let want: Vec<u32> = rows
                .iter()
                .map(|r| r.iter().copied().max().unwrap())
                .collect();
            assert_eq!(got.to_vec(), want);
        }
    }

    /// Nibbles in weight order pack as the rule packs them (even weight low).
    #[test]
    fn a_run_packs_in_weight_order() {
        require();
        let nib: Vec<u32> = (0..32u32).map(|i| (i * 7 + i / 5) % 16).collect();
        // SAFETY: the features were required above.
        #[allow(unsafe_code, reason = "calling a target_feature function; see SAFETY")]
        let got = unsafe { pack_rows(&nib) };
        let want: Vec<u8> = nib.chunks(2).map(|p| (p[0] | p[1] << 4) as u8).collect();
        assert_eq!(got.to_vec(), want);
    }

    /// The kernel against the rule on the same bytes: the same scales and nibbles, or
    /// (where the rule fails) nothing appended.
    fn same_as_the_rule(dtype: Dtype, raw: &[u8], group: usize, pack: bool) {
        let (want, s1, p1) = by_the_rule(dtype, raw, group, pack);
        // Something already in the outputs stays as it is.
        let (mut s2, mut p2) = (vec![7u16], vec![9u8]);
        let got = quantize(raw, dtype, group, pack, &mut s2, &mut p2).unwrap();
        if want.is_ok() {
            assert!(got);
            assert_eq!(&s2[1..], &s1[..]);
            assert_eq!(&p2[1..], &p1[..]);
        } else {
            assert!(!got);
            assert_eq!((s2, p2), (vec![7], vec![9]));
        }
    }

    proptest! {
        #[test]
        fn the_fused_kernel_is_the_rule(
            bits in proptest::collection::vec(any::<u32>(), 0..2400usize),
            small in 0u8..4,
            runs in 1usize..5,
            pack in any::<bool>(),
        ) {
            require();
            let bits = shaped(&bits, small, 40);
            let group = runs * RUN;
            let len = bits.len() - bits.len() % group;
            for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
                same_as_the_rule(dtype, &encode(dtype, &bits[..len]), group, pack);
            }
        }
    }

    /// Every 16-bit pattern as a BF16 and as an F16 weight, in groups of 32 whose other
    /// weights set the scale from tiny to the largest finite one.
    #[test]
    fn every_16_bit_weight_is_the_rules() {
        require();
        for dtype in [Dtype::BF16, Dtype::F16] {
            for amax in [0x0001u16, 0x0400, 0x3C00, 0x4780, 0x7BFF, 0x7F7F] {
                let mut raw = Vec::new();
                for h in 0..=u16::MAX {
                    let mut g = [amax; 32];
                    g[5] = h;
                    g[6] = h ^ 0x8000;
                    raw.extend(g.iter().flat_map(|x| x.to_le_bytes()));
                }
                for chunk in raw.chunks(64 * 1024) {
                    same_as_the_rule(dtype, chunk, 32, true);
                }
            }
        }
    }

    /// Other dtypes, groups that are not whole runs and ragged bytes are left to the
    /// caller.
    #[test]
    fn what_it_does_not_take() {
        let (mut s, mut p) = (Vec::new(), Vec::new());
        assert!(quantize(&[0; 256], Dtype::F64, 32, true, &mut s, &mut p).is_none());
        assert!(quantize(&[0; 96], Dtype::BF16, 48, true, &mut s, &mut p).is_none());
        assert!(quantize(&[0; 66], Dtype::BF16, 32, true, &mut s, &mut p).is_none());
        assert!(s.is_empty() && p.is_empty());
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn pack_rows(nib: &[u32]) -> [u8; 16] {
        let v: Vec<__m256i> = nib
            .chunks(8)
            // SAFETY: each chunk is 8 u32s, 32 bytes; the load is unaligned.
            .map(|c| {
                #[allow(unsafe_code, reason = "loading a vector from a slice; see SAFETY")]
                unsafe {
                    _mm256_loadu_si256(c.as_ptr().cast())
                }
            })
            .collect();
        pack_run(v[0], v[1], v[2], v[3])
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn reduce_rows(rows: [[u32; 8]; 8]) -> [u32; 8] {
        // SAFETY: both are 32 bytes of plain data, each way.
        #[allow(unsafe_code, reason = "a plain-data reinterpretation; see SAFETY")]
        unsafe {
            let v = reduce_max(rows.map(|r| std::mem::transmute::<[u32; 8], __m256i>(r)));
            std::mem::transmute::<__m256i, [u32; 8]>(v)
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn round_f16(a: [u32; 8]) -> [u16; 8] {
        // SAFETY: both are 32 bytes of plain data.
        #[allow(unsafe_code, reason = "a plain-data reinterpretation; see SAFETY")]
        let s = unsafe { std::mem::transmute::<[u32; 8], __m256>(a) };
        to_u16(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(s))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn widen_f16(a: [u16; 8]) -> [f32; 8] {
        // SAFETY: both are 16 bytes of plain data.
        #[allow(unsafe_code, reason = "a plain-data reinterpretation; see SAFETY")]
        let h = unsafe { std::mem::transmute::<[u16; 8], __m128i>(a) };
        to_f32(_mm256_cvtph_ps(h))
    }
}
