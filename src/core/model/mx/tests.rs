use super::*;
use proptest::prelude::*;

/// The largest element magnitude code and value of each format.
fn max_code(fmt: MxFormat) -> (u8, f32) {
    match fmt {
        MxFormat::Fp4 => (7, 6.0),
        MxFormat::Fp8 => (0x7E, 448.0),
    }
}

fn decode_code(fmt: MxFormat, c: u8) -> f32 {
    match fmt {
        MxFormat::Fp4 => e2m1_to_f32(c),
        MxFormat::Fp8 => e4m3_to_f32(c),
    }
}

/// Every finite code of the format (sign included; E4M3's NaN codes left out).
fn codes(fmt: MxFormat) -> Vec<u8> {
    match fmt {
        MxFormat::Fp4 => (0..16).collect(),
        MxFormat::Fp8 => (0..=255u8).filter(|c| c & 0x7F != 0x7F).collect(),
    }
}

/// The element codes of one quantized block, one per value.
fn element_codes(fmt: MxFormat, bytes: &[u8]) -> Vec<u8> {
    match fmt {
        MxFormat::Fp8 => bytes.to_vec(),
        MxFormat::Fp4 => bytes.iter().flat_map(|b| [b & 0x0F, b >> 4]).collect(),
    }
}

/// Every element code through every E8M0 scale 1..=254: a block holding the largest
/// code (so its scale comes out as that scale) and the code quantizes to exactly that
/// scale and those codes, and dequantizes to `X * element` exactly; where the
/// largest value times X is beyond f32, dequantizing is an error, never infinity.
#[test]
fn every_code_through_every_scale_round_trips() {
    for fmt in [MxFormat::Fp4, MxFormat::Fp8] {
        let (top, top_value) = max_code(fmt);
        for s in 1..=254u8 {
            let x = e8m0_value(s).unwrap();
            for c in codes(fmt) {
                let mut block_codes = vec![c; BLOCK];
                block_codes[0] = top;
                let want: Vec<f32> = block_codes
                    .iter()
                    .map(|&k| decode_code(fmt, k) * x)
                    .collect();
                let packed: Vec<u8> = match fmt {
                    MxFormat::Fp8 => block_codes.clone(),
                    MxFormat::Fp4 => block_codes.chunks(2).map(|p| p[0] | (p[1] << 4)).collect(),
                };
                let mut out = Vec::new();
                let r = dequantize(&packed, &[s], fmt, &mut out);
                if (f64::from(top_value) * f64::from(x)) > f64::from(f32::MAX) {
                    assert_eq!(
                        r,
                        Err(DequantFailure::Overflow { block: 0 }),
                        "{fmt:?} s={s}"
                    );
                    continue;
                }
                r.unwrap();
                assert_eq!(out, want, "{fmt:?} s={s} c={c:#x}");
                let (mut sc, mut el) = (Vec::new(), Vec::new());
                quantize(&want, fmt, &mut sc, &mut el).unwrap();
                assert_eq!(sc, vec![s], "{fmt:?} s={s} c={c:#x}");
                let got = element_codes(fmt, &el);
                // -0 and +0 both quantize as they are, sign kept (torchao does too).
                assert_eq!(got, block_codes, "{fmt:?} s={s} c={c:#x}");
            }
        }
    }
}

/// Scale 255 is NaN: dequantizing refuses it; the smallest scale is 2^-127.
#[test]
fn nan_scale_is_refused_and_the_smallest_scale_is_2_to_minus_127() {
    let mut out = Vec::new();
    let r = dequantize(&[0u8; 64], &[1, E8M0_NAN], MxFormat::Fp8, &mut out);
    assert_eq!(r, Err(DequantFailure::NanScale { block: 1 }));
    assert_eq!(e8m0_value(0), Some(f32::from_bits(1 << 22)));
    assert_eq!(e8m0_value(127), Some(1.0));
    assert_eq!(e8m0_value(254), Some(2f32.powi(127)));
}

/// A block of zeros gets the smallest scale and zero elements; a block whose largest
/// magnitude is an f32 subnormal also gets scale 0 and its elements are divided by
/// 2^-126, as torchao's `to_mx` does.
#[test]
fn zero_and_subnormal_blocks_take_the_smallest_scale() {
    for fmt in [MxFormat::Fp4, MxFormat::Fp8] {
        let (mut s, mut e) = (Vec::new(), Vec::new());
        quantize(&[0.0; BLOCK], fmt, &mut s, &mut e).unwrap();
        assert_eq!(s, vec![0]);
        assert!(e.iter().all(|&b| b == 0));
    }
    let mut block = [0.0f32; BLOCK];
    block[3] = f32::from_bits(1 << 22); // 2^-127
    let (mut s, mut e) = (Vec::new(), Vec::new());
    quantize(&block, MxFormat::Fp8, &mut s, &mut e).unwrap();
    assert_eq!(s, vec![0]);
    assert_eq!(e[3], f32_to_e4m3_sat(0.5));
}

/// NaN and infinite weights are refused with the index of the first one.
#[test]
fn non_finite_weights_are_refused_by_index() {
    let mut v = vec![1.0f32; 64];
    v[40] = f32::NAN;
    v[50] = f32::INFINITY;
    let (mut s, mut e) = (Vec::new(), Vec::new());
    assert_eq!(quantize(&v, MxFormat::Fp4, &mut s, &mut e), Err(40));
    v[40] = 0.0;
    assert_eq!(quantize(&v, MxFormat::Fp8, &mut s, &mut e), Err(50));
}

/// E2M1 rounds to nearest, ties to the even code, and saturates at 6.
#[test]
fn e2m1_rounds_half_even_and_saturates() {
    let cases = [
        (0.25, 0),
        (0.75, 2),
        (1.25, 2),
        (1.75, 4),
        (2.5, 4),
        (3.5, 6),
        (5.0, 6),
        (5.5, 7),
        (7.9, 7),
        (1e30, 7),
        (-0.0, 8),
        (-0.2, 8),
        (-3.0, 13),
    ];
    for (x, c) in cases {
        assert_eq!(f32_to_e2m1(x), c, "{x}");
    }
    assert_eq!(f32_to_e4m3_sat(500.0), 0x7E);
    assert_eq!(f32_to_e4m3_sat(-1e20), 0xFE);
}

/// The element spacing at magnitude `a` (in element units) of the format.
fn spacing(fmt: MxFormat, a: f32) -> f32 {
    let (emin, mbits) = match fmt {
        MxFormat::Fp4 => (0, 1),
        MxFormat::Fp8 => (-6, 3),
    };
    let e = if a > 0.0 {
        a.log2().floor() as i32
    } else {
        emin
    };
    2f32.powi(e.max(emin) - mbits)
}

proptest! {
    /// dequantize(quantize(w)) is within half an element step (times the block's
    /// scale) of w, or the largest element when w / X lies beyond it (saturation).
    #[test]
    fn round_trip_is_within_half_a_step(
        vals in proptest::collection::vec(-1000.0f32..1000.0, 32..=96usize),
        k in -90i32..90,
        fp4 in any::<bool>(),
    ) {
        let fmt = if fp4 { MxFormat::Fp4 } else { MxFormat::Fp8 };
        let n = vals.len() / BLOCK * BLOCK;
        let w: Vec<f32> = vals[..n].iter().map(|v| v * 2f32.powi(k)).collect();
        let (mut s, mut e) = (Vec::new(), Vec::new());
        quantize(&w, fmt, &mut s, &mut e).unwrap();
        prop_assert_eq!(s.len(), n / BLOCK);
        prop_assert_eq!(e.len(), n / BLOCK * fmt.block_bytes());
        let mut d = Vec::new();
        dequantize(&e, &s, fmt, &mut d).unwrap();
        let (_, top) = max_code(fmt);
        for (i, (&wi, &di)) in w.iter().zip(&d).enumerate() {
            let x = e8m0_value(s[i / BLOCK]).unwrap();
            prop_assume!(x >= f32::MIN_POSITIVE);
            let a = (wi / x).abs();
            if a <= top {
                let bound = spacing(fmt, a) / 2.0 * x;
                prop_assert!((di - wi).abs() <= bound, "i={} w={} d={} x={}", i, wi, di, x);
            } else {
                prop_assert_eq!(di, top.copysign(wi) * x);
            }
        }
    }
}
