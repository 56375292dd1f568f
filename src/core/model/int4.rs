//! int4-gN-sym weights: the layout of the format page (`<name>.qweight` U8 `[out, in/2]`,
//! low nibble = even column, two's-complement nibbles; `<name>.scales` F16
//! `[out, in/G]`) and the exact quantization rule of the spec.
//!
//! Invariants: quantizing is a pure function of the f32 inputs (same input, same
//! bytes); every arithmetic step is f32 as the spec fixes it (scale = F16(amax / 7)
//! rounded to nearest even, q = clamp(round_half_even(w / f32(s)), -8, 7)); a group
//! whose scale is 0 quantizes to q = 0; NaN, infinity and a scale that overflows F16
//! are errors, never a silent value.

use super::{finding, Entry, Logical, Shard, Storage};
use crate::safetensors::float::{f16_to_f32, f32_to_f16};
use crate::safetensors::verify::{Finding, Findings};
use crate::safetensors::{Dtype, TensorInfo};
use crate::text::quote;

/// The metadata key naming the quantization.
pub const QUANT_KEY: &str = "quant";
/// Suffix of the packed 4-bit values.
pub const QWEIGHT_SUFFIX: &str = ".qweight";
/// Suffix of the F16 group scales.
pub const SCALES_SUFFIX: &str = ".scales";

/// Smallest allowed group size (a group must fill whole bytes of nibbles).
pub const MIN_GROUP: u64 = 2;
/// The default group size of `st quantize`.
pub const DEFAULT_GROUP: u64 = 32;
/// The largest magnitude a signed 4-bit value reaches on the positive side.
const QMAX: f32 = 7.0;
/// F16's infinity bit pattern (magnitude).
const F16_INF: u16 = 0x7C00;

/// The metadata value for group size `g`: `int4-g<G>-sym`.
pub fn quant_name(group: u64) -> String {
    format!("int4-g{group}-sym")
}

/// Parse `int4-g<G>-sym` with an even G >= 2 (decimal digits only, no sign, no leading
/// zero); None when the value has another form.
pub fn parse_quant(s: &str) -> Option<u64> {
    let digits = s.strip_prefix("int4-g")?.strip_suffix("-sym")?;
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let g: u64 = digits.parse().ok()?;
    (g >= MIN_GROUP && g.is_multiple_of(2)).then_some(g)
}

/// Why a group could not be quantized.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QuantFailure {
    /// A weight is NaN or infinite (column within the row).
    NonFinite {
        /// Column of the offending weight.
        col: usize,
        /// The weight.
        value: f32,
    },
    /// amax / 7 rounds beyond F16's largest finite value.
    ScaleOverflow {
        /// The group's largest magnitude.
        amax: f32,
    },
}

/// The F16 scale of one group: F16(amax / 7), the division in f32, rounded to nearest,
/// ties to even.
pub fn group_scale(group: &[f32]) -> Result<u16, QuantFailure> {
    // The largest magnitude as bits: for finite and infinite magnitudes their order
    // is the order of the values, and any NaN or infinity lands at or above F32_INF, so
    // one branch-free (vectorized) reduction finds both amax and whether it is valid.
    let amax_bits = group
        .iter()
        .fold(0u32, |m, w| m.max(w.to_bits() & 0x7FFF_FFFF));
    if amax_bits >= F32_INF {
        // The error path only: the first non-finite weight.
        let (col, &value) = group
            .iter()
            .enumerate()
            .find(|(_, w)| !w.is_finite())
            .unwrap_or((0, &f32::NAN));
        return Err(QuantFailure::NonFinite { col, value });
    }
    let amax = f32::from_bits(amax_bits);
    let s = f32_to_f16(amax / QMAX);
    if s & 0x7FFF >= F16_INF {
        return Err(QuantFailure::ScaleOverflow { amax });
    }
    Ok(s)
}

/// f32's infinity bit pattern (magnitude).
const F32_INF: u32 = 0x7F80_0000;

/// The 4-bit value of weight `w` under the F16 scale `s` (as f32): 0 when s is 0, else
/// clamp(round_half_even(w / s), -8, 7), all in f32.
pub fn quantize_value(w: f32, s: f32) -> i8 {
    if s == 0.0 {
        return 0;
    }
    let q = (w / s).round_ties_even().clamp(-8.0, QMAX);
    // q is an integer in [-8, 7] here, so the cast is exact.
    q as i8
}

/// The scale of the group of `row` that starts at column `start`, with a failure's
/// column counted from the start of the row.
fn scale_at(chunk: &[f32], start: usize) -> Result<u16, (usize, QuantFailure)> {
    group_scale(chunk).map_err(|f| match f {
        QuantFailure::NonFinite { col, value } => (
            start + col,
            QuantFailure::NonFinite {
                col: start + col,
                value,
            },
        ),
        other => (start, other),
    })
}

/// The F16 scale bits of every group of one row, without the values: what the scales
/// tensor needs (the same checks and failures as [`quantize_row`]).
pub fn row_scales(
    row: &[f32],
    group: usize,
    scales: &mut Vec<u16>,
) -> Result<(), (usize, QuantFailure)> {
    let group = group.max(MIN_GROUP as usize);
    for (g, chunk) in row.chunks(group).enumerate() {
        scales.push(scale_at(chunk, g * group)?);
    }
    Ok(())
}

/// Quantize one row of `in` weights with group size `group` (which divides the row
/// length and is even): the F16 scale bits of each group go to `scales`, the packed
/// nibbles to `packed` (in/2 bytes). On failure, the column of the offending group's
/// first element is part of the error.
pub fn quantize_row(
    row: &[f32],
    group: usize,
    scales: &mut Vec<u16>,
    packed: &mut Vec<u8>,
) -> Result<(), (usize, QuantFailure)> {
    let group = group.max(MIN_GROUP as usize);
    for (g, chunk) in row.chunks(group).enumerate() {
        let s_bits = scale_at(chunk, g * group)?;
        scales.push(s_bits);
        pack_group(chunk, f16_to_f32(s_bits), packed);
    }
    Ok(())
}

/// The packed nibbles of one group of finite weights under the scale `s`: written
/// into a slice of whole pairs, no branch per weight, so the divisions vectorize.
fn pack_group(chunk: &[f32], s: f32, packed: &mut Vec<u8>) {
    let start = packed.len();
    packed.resize(start + chunk.len().div_ceil(2), 0);
    if s == 0.0 {
        return;
    }
    let out = packed.get_mut(start..).unwrap_or_default();
    // Blocks of nibbles first (a plain loop over the weights, which the compiler
    // turns into vector divisions), then the pairs packed from them: one loop doing
    // both would have to deinterleave even and odd weights and stays scalar.
    let mut nibbles = [0u8; PACK_BLOCK];
    for (weights, bytes) in chunk.chunks(PACK_BLOCK).zip(out.chunks_mut(PACK_BLOCK / 2)) {
        let nibbles = nibbles.get_mut(..weights.len()).unwrap_or_default();
        for (n, &w) in nibbles.iter_mut().zip(weights) {
            *n = nibble(w / s);
        }
        let (pairs, rest) = nibbles.as_chunks::<2>();
        for (b, &pair) in bytes.iter_mut().zip(pairs) {
            // lo | hi << 8 as one u16; shifting by 4 and or-ing puts hi above lo in the
            // low byte (lo's bits shift out): a form that vectorizes, unlike byte pairs.
            let x = u16::from_le_bytes(pair);
            *b = (x | (x >> 4)) as u8;
        }
        if let (Some(b), [lo]) = (bytes.get_mut(pairs.len()), rest) {
            *b = *lo;
        }
    }
}

/// Weights turned into nibbles per step of [`pack_group`] (even, so blocks hold whole
/// pairs; small enough to stay on the stack and in L1).
const PACK_BLOCK: usize = 64;

/// The two's-complement nibble of clamp(round_half_even(x), -8, 7): the same value as
/// [`quantize_value`]'s arithmetic (a property test compares them on arbitrary
/// inputs) without a libm call or a float-to-int conversion. x86-64's baseline has no
/// rounding instruction, and `round_ties_even` calls `rintf` per weight, which made
/// quantizing several times slower than reading the input. Clamping first is exact
/// (rounding is monotonic and both bounds are integers); adding 1.5 * 2^23 then rounds
/// to an integer, ties to even (the default rounding mode), and leaves it in the low
/// bits of the sum's representation: in [2^23, 2^24) the unit in the last place is 1,
/// so the bits are those of 1.5 * 2^23 plus the integer, whose low four bits are the
/// integer's two's-complement nibble. NaN (impossible for finite weights and a
/// positive finite scale) would give some nibble, never undefined behaviour.
#[inline(always)]
pub(super) fn nibble(x: f32) -> u8 {
    const MAGIC: f32 = 12_582_912.0;
    ((x.clamp(-8.0, QMAX) + MAGIC).to_bits() & 0x0F) as u8
}

/// The finding for half of an int4 pair whose other half, `partner`, is missing.
fn unpaired(name: &str, partner: &str) -> Finding {
    finding(
        "int4-pair",
        Some(name),
        format!(
            "int4 (pair): tensor {} has no {}",
            quote(name),
            quote(partner)
        ),
    )
}

/// Pack two signed 4-bit values: `lo` (even column) in bits 0-3, `hi` in bits 4-7.
pub fn pack(lo: i8, hi: i8) -> u8 {
    ((lo as u8) & 0x0F) | (((hi as u8) & 0x0F) << 4)
}

/// The two signed 4-bit values of a byte: (low nibble, high nibble).
pub fn unpack(b: u8) -> (i8, i8) {
    // Shift the nibble into the top of an i8, then arithmetic-shift back: sign-extends.
    let lo = ((b << 4) as i8) >> 4;
    let hi = (b as i8) >> 4;
    (lo, hi)
}

/// Dequantize one row: `packed` (in/2 bytes) with F16 scale bits `scales` (in/G) into
/// `out` as f32, w = f32(q) * f32(scale), exact in f32.
pub fn dequantize_row(packed: &[u8], scales: &[u16], group: usize, out: &mut Vec<f32>) {
    let per_group = (group / 2).max(1);
    for (bytes, &s_bits) in packed.chunks(per_group).zip(scales) {
        let s = f16_to_f32(s_bits);
        let start = out.len();
        out.resize(start + bytes.len() * 2, 0.0);
        let (pairs, _) = out
            .get_mut(start..)
            .unwrap_or_default()
            .as_chunks_mut::<2>();
        for (o, &b) in pairs.iter_mut().zip(bytes) {
            let (lo, hi) = unpack(b);
            *o = [f32::from(lo) * s, f32::from(hi) * s];
        }
    }
}

/// The `quant` metadata value of the model: every shard that sets it must agree, and
/// it must have the form `int4-g<G>-sym`.
pub fn quant_of(shards: &[Shard], problems: &mut Findings) -> Option<String> {
    let mut seen: Option<(&str, &str)> = None;
    for shard in shards {
        let Some(q) = shard.header.metadata.get(QUANT_KEY) else {
            continue;
        };
        match seen {
            None => seen = Some((q, &shard.name)),
            Some((first, first_shard)) if first != q => problems.push(finding(
                "int4-quant",
                None,
                format!(
                    "int4 (quant): shards disagree: {} says {} but {} says {}",
                    quote(first_shard),
                    quote(first),
                    quote(&shard.name),
                    quote(q)
                ),
            )),
            Some(_) => {}
        }
    }
    let (q, _) = seen?;
    if parse_quant(q).is_none() && super::mx::MxFormat::from_quant(q).is_none() {
        problems.push(finding(
            "int4-quant",
            None,
            format!(
                "int4 (quant): metadata quant is {}, not int4-g<G>-sym with an even G >= 2, mxfp4 or mxfp8",
                quote(q)
            ),
        ));
    }
    Some(q.to_string())
}

/// The logical tensors of `entries` (sorted by name): int4 pairs whose layout holds
/// become one `[out, in]` tensor; everything else stays as stored. Broken int4 rules
/// are pushed to `problems` (the tensors concerned stay plain).
pub fn logical(entries: &[Entry], quant: Option<&str>, problems: &mut Findings) -> Vec<Logical> {
    if let Some((q, fmt)) = quant.and_then(|q| Some((q, super::mx::MxFormat::from_quant(q)?))) {
        let (mut out, paired) = super::mx_pairs::logical(entries, q, fmt, problems);
        out.extend(plain(entries, &paired));
        out.sort_by(|a, b| a.name.cmp(&b.name));
        return out;
    }
    let group = quant.and_then(parse_quant);
    let find = |name: &str| {
        entries
            .binary_search_by(|e| e.info.name.as_str().cmp(name))
            .ok()
    };
    let mut paired = vec![false; entries.len()];
    let mut out = Vec::with_capacity(entries.len());
    let mut pairs = 0usize;
    for (i, e) in entries.iter().enumerate() {
        let name = &e.info.name;
        if let Some(base) = name.strip_suffix(SCALES_SUFFIX) {
            let partner = format!("{base}{QWEIGHT_SUFFIX}");
            if find(&partner).is_none() {
                problems.push(unpaired(name, &partner));
            }
            continue;
        }
        let Some(base) = name.strip_suffix(QWEIGHT_SUFFIX) else {
            continue;
        };
        let scales_name = format!("{base}{SCALES_SUFFIX}");
        let Some(si) = find(&scales_name) else {
            problems.push(unpaired(name, &scales_name));
            continue;
        };
        pairs += 1;
        let Some(s) = entries.get(si) else { continue };
        let Some(group) = group else { continue };
        match pair_shape(&e.info, &s.info, group) {
            Ok(shape) => {
                if find(base).is_some() {
                    problems.push(finding(
                        "int4-pair",
                        Some(base),
                        format!(
                            "int4 (pair): tensor {} is stored both plain and as an int4 pair",
                            quote(base)
                        ),
                    ));
                    continue;
                }
                if let Some(a) = paired.get_mut(i) {
                    *a = true;
                }
                if let Some(b) = paired.get_mut(si) {
                    *b = true;
                }
                out.push(Logical {
                    name: base.to_string(),
                    shape,
                    storage: Storage::Int4 {
                        qweight: i,
                        scales: si,
                        group,
                    },
                });
            }
            Err(detail) => problems.push(finding(
                "int4-layout",
                Some(base),
                format!("int4 (layout): tensor {}: {detail}", quote(base)),
            )),
        }
    }
    check_quant_use(pairs > 0, quant, problems);
    out.extend(plain(entries, &paired));
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Every entry not marked in `paired` as a plain logical tensor.
fn plain(entries: &[Entry], paired: &[bool]) -> Vec<Logical> {
    entries
        .iter()
        .enumerate()
        .filter(|(i, _)| !paired.get(*i).copied().unwrap_or(false))
        .map(|(i, e)| Logical {
            name: e.info.name.clone(),
            shape: e.info.shape.clone(),
            storage: Storage::Plain(i),
        })
        .collect()
}

/// The quant metadata is there exactly when the model has int4 pairs.
fn check_quant_use(has_pairs: bool, quant: Option<&str>, problems: &mut Findings) {
    match (has_pairs, quant) {
        (true, None) => problems.push(finding(
            "int4-quant",
            None,
            "int4 (quant): the model has int4 pairs but no quant metadata".to_string(),
        )),
        (false, Some(q)) => problems.push(finding(
            "int4-quant",
            None,
            format!(
                "int4 (quant): metadata quant is {} but the model has no int4 pair",
                quote(q)
            ),
        )),
        _ => {}
    }
}

/// The logical `[out, in]` of a pair, or what is wrong with its layout.
fn pair_shape(q: &TensorInfo, s: &TensorInfo, group: u64) -> Result<Vec<u64>, String> {
    if q.dtype != Dtype::U8 {
        return Err(format!("qweight is {}, not U8", q.dtype));
    }
    if s.dtype != Dtype::F16 {
        return Err(format!("scales is {}, not F16", s.dtype));
    }
    let (&[out, half], &[s_out, s_cols]) = (q.shape.as_slice(), s.shape.as_slice()) else {
        return Err(format!(
            "qweight {:?} and scales {:?} must both be 2-D",
            q.shape, s.shape
        ));
    };
    let cols = half
        .checked_mul(2)
        .ok_or_else(|| format!("qweight {:?} is too large", q.shape))?;
    if s_out != out || cols % group != 0 || s_cols != cols / group {
        return Err(format!(
            "qweight {:?} means [out, in] = [{out}, {cols}], so scales must be [{out}, in/{group}] with {group} dividing {cols}, but scales is {:?}",
            q.shape, s.shape
        ));
    }
    Ok(vec![out, cols])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn quant_names_parse_strictly() {
        assert_eq!(parse_quant("int4-g32-sym"), Some(32));
        assert_eq!(parse_quant("int4-g2-sym"), Some(2));
        for bad in [
            "int4-g3-sym",
            "int4-g0-sym",
            "int4-g-sym",
            "int4-g032-sym",
            "int4-g+32-sym",
            "int4-g32-asym",
            "int8-g32-sym",
            "int4-g99999999999999999999999-sym",
        ] {
            assert_eq!(parse_quant(bad), None, "{bad}");
        }
        assert_eq!(quant_name(128), "int4-g128-sym");
    }

    #[test]
    fn worked_group() {
        // amax 7 -> scale exactly 1; 2.5 ties to 2, -2.5 to -2, 3.5 to 4, -8.4 clamps.
        let row = [7.0f32, 2.5, -2.5, 3.5, 0.49, -7.0, 1.5, -0.5];
        let (mut s, mut p) = (Vec::new(), Vec::new());
        quantize_row(&row, 8, &mut s, &mut p).unwrap();
        assert_eq!(s, vec![0x3C00]);
        let mut out = Vec::new();
        dequantize_row(&p, &s, 8, &mut out);
        assert_eq!(out, vec![7.0, 2.0, -2.0, 4.0, 0.0, -7.0, 2.0, -0.0]);
    }

    #[test]
    fn zero_group_is_all_zero_and_nan_is_refused() {
        let (mut s, mut p) = (Vec::new(), Vec::new());
        quantize_row(&[0.0, -0.0, 0.0, 0.0], 4, &mut s, &mut p).unwrap();
        assert_eq!((s, p), (vec![0], vec![0, 0]));
        let err = quantize_row(
            &[1.0, 2.0, f32::NAN, 0.0],
            2,
            &mut Vec::new(),
            &mut Vec::new(),
        )
        .unwrap_err();
        assert_eq!(err.0, 2);
        let big = quantize_row(&[1e9, 0.0], 2, &mut Vec::new(), &mut Vec::new()).unwrap_err();
        assert!(matches!(big.1, QuantFailure::ScaleOverflow { .. }));
    }

    #[test]
    fn subnormal_scale() {
        // amax/7 far below F16's smallest normal still gives a non-zero subnormal scale.
        let w = 1e-6f32;
        let s = group_scale(&[w, -w]).unwrap();
        assert!(s != 0 && s < 0x0400, "{s:#x}");
        assert_eq!(quantize_value(w, f16_to_f32(s)), 7);
    }

    /// Today's scalar scale rule, the reference of the branch-free one.
    fn group_scale_scalar(group: &[f32]) -> Result<u16, QuantFailure> {
        let mut amax = 0.0f32;
        for (col, &w) in group.iter().enumerate() {
            if !w.is_finite() {
                return Err(QuantFailure::NonFinite { col, value: w });
            }
            amax = amax.max(w.abs());
        }
        let s = f32_to_f16(amax / QMAX);
        if s & 0x7FFF >= F16_INF {
            return Err(QuantFailure::ScaleOverflow { amax });
        }
        Ok(s)
    }

    fn same_failure(a: &Result<u16, QuantFailure>, b: &Result<u16, QuantFailure>) -> bool {
        match (a, b) {
            (
                Err(QuantFailure::NonFinite { col: c1, value: v1 }),
                Err(QuantFailure::NonFinite { col: c2, value: v2 }),
            ) => c1 == c2 && v1.to_bits() == v2.to_bits(),
            _ => a == b,
        }
    }

    proptest! {
        #[test]
        fn the_branch_free_scale_is_the_scalar_one(
            bits in proptest::collection::vec(any::<u32>(), 1..40usize),
            small in any::<bool>(),
        ) {
            // Arbitrary bit patterns (NaN, infinities, huge) and, half the time,
            // magnitudes that give ordinary scales.
            let group: Vec<f32> = bits
                .iter()
                .map(|&b| f32::from_bits(if small { b & 0xC7FF_FFFF } else { b }))
                .collect();
            let (a, b) = (group_scale(&group), group_scale_scalar(&group));
            prop_assert!(same_failure(&a, &b), "{:?} {:?}", a, b);
        }

        #[test]
        fn packing_is_the_scalar_rule(
            row in proptest::collection::vec(-1e4f32..1e4, 1..64usize),
            s_bits in 0u16..0x7C00,
        ) {
            let s = f16_to_f32(s_bits);
            let mut packed = vec![0xAA];
            pack_group(&row, s, &mut packed);
            let q: Vec<i8> = row.iter().map(|&w| quantize_value(w, s)).collect();
            let want: Vec<u8> = std::iter::once(0xAA)
                .chain(q.chunks(2).map(|p| pack(p[0], p.get(1).copied().unwrap_or(0))))
                .collect();
            prop_assert_eq!(packed, want);
        }

        #[test]
        fn dequantizing_is_q_times_s(
            packed in proptest::collection::vec(any::<u8>(), 1..64usize),
            s_bits in 0u16..0x7C00,
        ) {
            let mut out = vec![1.5];
            dequantize_row(&packed, &[s_bits], packed.len() * 2, &mut out);
            let s = f16_to_f32(s_bits);
            let want: Vec<f32> = std::iter::once(1.5)
                .chain(packed.iter().flat_map(|&b| {
                    let (lo, hi) = unpack(b);
                    [f32::from(lo) * s, f32::from(hi) * s]
                }))
                .collect();
            prop_assert_eq!(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }

        #[test]
        fn nibbles_round_trip(lo in -8i8..=7, hi in -8i8..=7) {
            prop_assert_eq!(unpack(pack(lo, hi)), (lo, hi));
        }

        #[test]
        fn bytes_round_trip(b in any::<u8>()) {
            let (lo, hi) = unpack(b);
            prop_assert_eq!(pack(lo, hi), b);
        }

        #[test]
        fn the_fast_rounding_is_the_rule(w in any::<f32>(), s_bits in 1u16..0x7C00) {
            let s = f16_to_f32(s_bits);
            prop_assume!(w.is_finite());
            prop_assert_eq!(nibble(w / s), pack(quantize_value(w, s), 0));
        }

        #[test]
        fn the_fast_rounding_is_the_rule_near_ties(k in -40i32..40, tweak in -2i32..=2) {
            // Values at and one ulp around every half-integer, where rounding decides.
            let x = f32::from_bits(((k as f32) / 2.0).to_bits().wrapping_add_signed(tweak));
            // One ulp below +0.0 is a NaN bit pattern: weights are finite by then.
            prop_assume!(x.is_finite());
            prop_assert_eq!(nibble(x), pack(quantize_value(x, 1.0), 0));
        }

        #[test]
        fn row_scales_are_quantize_rows_scales(
            row in proptest::collection::vec(-1e4f32..1e4, 8..64usize),
        ) {
            let len = row.len() - row.len() % 8;
            let (mut a, mut b, mut p) = (Vec::new(), Vec::new(), Vec::new());
            row_scales(&row[..len], 8, &mut a).unwrap();
            quantize_row(&row[..len], 8, &mut b, &mut p).unwrap();
            prop_assert_eq!(a, b);
        }

        #[test]
        fn error_within_half_a_scale(
            row in proptest::collection::vec(-1000.0f32..1000.0, 1..8usize)
                .prop_map(|v| v.repeat(4)),
            g_half in 1usize..4,
        ) {
            let group = g_half * 2;
            let len = row.len() - row.len() % group;
            let row = &row[..len];
            let (mut s, mut p) = (Vec::new(), Vec::new());
            quantize_row(row, group, &mut s, &mut p).unwrap();
            let mut out = Vec::new();
            dequantize_row(&p, &s, group, &mut out);
            prop_assert_eq!(out.len(), row.len());
            for (i, (&w, &d)) in row.iter().zip(&out).enumerate() {
                let scale = f16_to_f32(s[i / group]);
                let q = w / scale;
                if scale > 0.0 && (-8.0..=7.0).contains(&q.round_ties_even()) {
                    // Exact rounding to the nearest multiple of the scale, plus the
                    // f32 rounding of the division and of q * s.
                    let tol = scale / 2.0 + (w.abs() + scale) * 4.0 * f32::EPSILON;
                    prop_assert!((w - d).abs() <= tol, "w {} d {} s {}", w, d, scale);
                }
            }
        }
    }
}
