//! MX block-scaled weights (OCP Microscaling v1.0): the E2M1 and E4M3 element codecs,
//! E8M0 block scales, and quantizing and dequantizing whole blocks of 32 values.
//!
//! Invariants: quantizing is a pure function of the f32 inputs and follows the rule
//! torchao's `to_mx` applies by default (scale mode FLOOR): per block, the scale
//! exponent is the unbiased exponent field of the block's largest magnitude (as f32,
//! so 0 and f32 subnormals give -127) minus the element format's largest exponent,
//! clamped to [-127, 127]; the elements are `w / max(X, 2^-126)` in f32 (torchao
//! divides by the smallest normal f32 where X is 2^-127), rounded to nearest even in
//! the element format and saturated at its largest finite value. A NaN or infinite
//! weight is an error, never a NaN scale. Dequantizing is `X * element`, exact in f32;
//! a NaN scale (255) or a product beyond f32 is an error, never a silent value.

use crate::safetensors::float::{e4m3_to_f32, round_magnitude};

/// Elements sharing one scale.
pub const BLOCK: usize = 32;
/// The E8M0 exponent bias: code c is 2^(c - 127).
pub const E8M0_BIAS: i32 = 127;
/// The E8M0 NaN code (a reader refuses it).
pub const E8M0_NAN: u8 = 255;
/// The metadata value of MXFP4 files.
pub const MXFP4: &str = "mxfp4";
/// The metadata value of MXFP8 files.
pub const MXFP8: &str = "mxfp8";
/// The suffix of an MXFP4 tensor's packed elements (gpt-oss).
pub const BLOCKS_SUFFIX: &str = "_blocks";
/// The suffix of an MXFP4 tensor's scales (gpt-oss).
pub const FP4_SCALES_SUFFIX: &str = "_scales";
/// The suffix of an MXFP8 tensor's scales, next to its `.weight` (the name vLLM and
/// compressed-tensors' MXFP8 checkpoints use).
pub const FP8_SCALE_SUFFIX: &str = ".weight_scale";
/// The suffix of an MXFP8 tensor's elements.
pub const WEIGHT_SUFFIX: &str = ".weight";

/// The largest E2M1 magnitude code (6.0).
const E2M1_MAX_CODE: u64 = 7;
/// The largest finite E4M3 magnitude code (448).
const E4M3_MAX_CODE: u64 = 0x7E;
/// f32's smallest normal value: torchao's floor for the divisor.
const F32_MIN_NORMAL: f32 = f32::MIN_POSITIVE;
/// f32's infinity bit pattern (magnitude).
const F32_INF: u32 = 0x7F80_0000;
/// The E2M1 values by magnitude code.
const E2M1_VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// An MX element format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MxFormat {
    /// E2M1 elements, two a byte (element 2i in the low nibble).
    Fp4,
    /// E4M3 ("fn") elements, one a byte.
    Fp8,
}

impl MxFormat {
    /// The largest exponent of a finite element value (emax_elem of the OCP spec).
    pub fn emax(self) -> i32 {
        match self {
            MxFormat::Fp4 => 2,
            MxFormat::Fp8 => 8,
        }
    }

    /// The `quant` metadata value.
    pub fn quant_name(self) -> &'static str {
        match self {
            MxFormat::Fp4 => MXFP4,
            MxFormat::Fp8 => MXFP8,
        }
    }

    /// The format a `quant` metadata value names, if it is an MX one.
    pub fn from_quant(q: &str) -> Option<MxFormat> {
        match q {
            MXFP4 => Some(MxFormat::Fp4),
            MXFP8 => Some(MxFormat::Fp8),
            _ => None,
        }
    }

    /// Bytes of elements per block.
    pub fn block_bytes(self) -> usize {
        match self {
            MxFormat::Fp4 => BLOCK / 2,
            MxFormat::Fp8 => BLOCK,
        }
    }
}

/// E8M0 code to its value 2^(c - 127) as f32 (2^-127 is an f32 subnormal, exact);
/// None for the NaN code.
pub fn e8m0_value(c: u8) -> Option<f32> {
    if c == E8M0_NAN {
        return None;
    }
    // Built in f64 (every exponent in [-127, 127] is a normal f64), narrowed exactly.
    Some(f64::from_bits(((i64::from(c) - 127 + 1023) as u64) << 52) as f32)
}

/// E2M1 code (4 bits: sign, 2 exponent, 1 mantissa) to its value.
pub fn e2m1_to_f32(c: u8) -> f32 {
    let v = E2M1_VALUES.get(usize::from(c & 7)).copied().unwrap_or(0.0);
    if c & 8 != 0 {
        -v
    } else {
        v
    }
}

/// f32 to E2M1, nearest even, saturating at ±6; the sign is kept (−0 is 0x8). The
/// input is finite (quantizing refuses the rest first).
pub fn f32_to_e2m1(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 8 } else { 0 };
    let a = f64::from(x.abs());
    let m = if a == 0.0 {
        0
    } else {
        round_magnitude(a.to_bits(), 1, 1).min(E2M1_MAX_CODE)
    };
    sign | m as u8
}

/// f32 to E4M3 ("fn"), nearest even, saturating at ±448 (never the NaN code); the
/// input is finite.
pub fn f32_to_e4m3_sat(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = f64::from(x.abs());
    let m = if a == 0.0 {
        0
    } else {
        round_magnitude(a.to_bits(), 3, 7).min(E4M3_MAX_CODE)
    };
    sign | m as u8
}

/// The E8M0 scale code of one block under `fmt`, or the index of its first weight
/// that is NaN or infinite.
pub fn block_scale(block: &[f32], fmt: MxFormat) -> Result<u8, usize> {
    let amax_bits = block
        .iter()
        .fold(0u32, |m, w| m.max(w.to_bits() & 0x7FFF_FFFF));
    if amax_bits >= F32_INF {
        return Err(block.iter().position(|w| !w.is_finite()).unwrap_or(0));
    }
    // The unbiased exponent field: floor(log2(amax)) for normal values, -127 for 0 and
    // f32 subnormals (torchao reads the field the same way).
    let e = (amax_bits >> 23) as i32 - E8M0_BIAS;
    let unbiased = (e - fmt.emax()).clamp(-E8M0_BIAS, E8M0_BIAS);
    Ok((unbiased + E8M0_BIAS) as u8)
}

/// Quantize one block (exactly [`BLOCK`] values, finite) under scale code `scale`,
/// appending its element bytes to `out` ([`MxFormat::block_bytes`] of them).
pub fn quantize_block(block: &[f32], scale: u8, fmt: MxFormat, out: &mut Vec<u8>) {
    let x = e8m0_value(scale)
        .unwrap_or(F32_MIN_NORMAL)
        .max(F32_MIN_NORMAL);
    match fmt {
        MxFormat::Fp8 => out.extend(block.iter().map(|&w| f32_to_e4m3_sat(w / x))),
        MxFormat::Fp4 => {
            let (pairs, _) = block.as_chunks::<2>();
            out.extend(
                pairs
                    .iter()
                    .map(|&[lo, hi]| f32_to_e2m1(lo / x) | (f32_to_e2m1(hi / x) << 4)),
            );
        }
    }
}

/// Quantize `values` (a whole number of blocks) under `fmt`, appending one scale code
/// per block to `scales` and the element bytes to `elems`; the error is the index of
/// the first NaN or infinite value.
pub fn quantize(
    values: &[f32],
    fmt: MxFormat,
    scales: &mut Vec<u8>,
    elems: &mut Vec<u8>,
) -> Result<(), usize> {
    let (blocks, _) = values.as_chunks::<BLOCK>();
    for (k, block) in blocks.iter().enumerate() {
        let s = block_scale(block, fmt).map_err(|i| k * BLOCK + i)?;
        scales.push(s);
        quantize_block(block, s, fmt, elems);
    }
    Ok(())
}

/// Why a block could not be dequantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DequantFailure {
    /// The block's scale is the NaN code 255.
    NanScale {
        /// The block, counted from the first one given.
        block: usize,
    },
    /// A value of the block is beyond f32 (a scale above what quantizing writes).
    Overflow {
        /// The block, counted from the first one given.
        block: usize,
    },
}

/// Dequantize whole blocks: `elems` holds [`MxFormat::block_bytes`] per scale of
/// `scales`; the values are appended to `out`, each `X * element` exact in f32.
pub fn dequantize(
    elems: &[u8],
    scales: &[u8],
    fmt: MxFormat,
    out: &mut Vec<f32>,
) -> Result<(), DequantFailure> {
    let per = fmt.block_bytes();
    for (block, (bytes, &s)) in elems.chunks_exact(per).zip(scales).enumerate() {
        let x = e8m0_value(s).ok_or(DequantFailure::NanScale { block })?;
        let start = out.len();
        match fmt {
            MxFormat::Fp8 => out.extend(bytes.iter().map(|&c| e4m3_to_f32(c) * x)),
            MxFormat::Fp4 => {
                for &b in bytes {
                    out.push(e2m1_to_f32(b & 0x0F) * x);
                    out.push(e2m1_to_f32(b >> 4) * x);
                }
            }
        }
        // Only a NaN element (E4M3 0x7F) or a product past f32 is not finite here.
        if out
            .get(start..)
            .unwrap_or_default()
            .iter()
            .any(|v| v.is_infinite())
        {
            return Err(DequantFailure::Overflow { block });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
