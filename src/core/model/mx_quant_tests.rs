//! Unit tests of `transform::run` with `Op::MxQuantize`: the pairs it writes are the
//! block codec's bytes in the layout of the format (gpt-oss experts transposed, across
//! step boundaries), dequantizing gives the weights back in their own layout, and each
//! tensor that cannot be quantized is refused by name.

use std::collections::BTreeMap;
use std::path::Path;

use super::mx::{self, MxFormat};
use super::mx_model_tests::{pair, values, write_raw, Raw};
use super::transform::{run, Op, Report, CHUNK_ELEMS};
use super::view::ModelView;
use super::*;

fn f32_raw(name: &str, shape: &[u64], vals: &[f32]) -> Raw {
    let bytes = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    (name.to_string(), Dtype::F32, shape.to_vec(), bytes)
}

fn bf16_raw(name: &str, shape: &[u64], vals: &[f32]) -> Raw {
    let bytes = vals
        .iter()
        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    (name.to_string(), Dtype::BF16, shape.to_vec(), bytes)
}

/// Every entry of `path`: name to (dtype, shape, bytes).
fn entries(path: &Path) -> BTreeMap<String, (Dtype, Vec<u64>, Vec<u8>)> {
    let v = ModelView::open(path).unwrap();
    (0..v.model.entries.len())
        .map(|i| {
            let info = &v.model.entries[i].info;
            let bytes = v.entry_bytes(i).unwrap().to_vec();
            (info.name.clone(), (info.dtype, info.shape.clone(), bytes))
        })
        .collect()
}

fn quantize(src: &Path, out: &Path, fmt: MxFormat, only: &str) -> Result<Report, ModelError> {
    let re = regex_lite(only);
    let select = move |n: &str| re(n);
    run(
        &Model::open(src).unwrap(),
        out,
        &Op::MxQuantize {
            fmt,
            select: &select,
        },
        1,
        &|_, _| {},
    )
}

/// A substring match (the CLI compiles regexes; the core takes any predicate).
fn regex_lite(s: &str) -> impl Fn(&str) -> bool + Sync {
    let s = s.to_string();
    move |n: &str| n.contains(&s)
}

/// MXFP4 of gpt-oss experts `[E, in, out]` is `_blocks [E, out, in/32, 16]` and
/// `_scales [E, out, in/32]`, the codec's bytes of the transposed weights (columns
/// gathered in bands narrower than the matrix, so bands meet inside it); a 2-D BF16
/// `.weight` is blocked along its rows; the rest is copied, `quant` set; dequantizing
/// gives the experts back in their own layout, each value `X * element`.
#[test]
fn mx_quantize_writes_the_codec_bytes_in_the_gpt_oss_layout() {
    let dir = tempfile::tempdir().unwrap();
    let (e, inn) = (2u64, 32768u64);
    // More columns than one band of CHUNK_ELEMS / in holds.
    let out_cols = (CHUNK_ELEMS as u64 / inn) * 2 + 8;
    let experts = values(e * inn, out_cols, 30.0);
    let linear: Vec<f32> = values(3, 64, 0.02)
        .iter()
        .map(|v| f32::from_bits(v.to_bits() & 0xFFFF_0000))
        .collect();
    let t = vec![
        f32_raw("x.experts.gate_up_proj", &[e, inn, out_cols], &experts),
        bf16_raw("lin.weight", &[3, 64], &linear),
        f32_raw("norm.weight", &[64], &values(1, 64, 1.0)),
    ];
    let src = dir.path().join("m.safetensors");
    write_raw(&src, &t, None);
    let out = dir.path().join("q.safetensors");
    let r = quantize(&src, &out, MxFormat::Fp4, "proj").unwrap();
    assert_eq!((r.transformed, r.copied), (1, 2));
    // Everything of rank >= 2: the 2-D `.weight` too; the norm (rank 1) is copied.
    let r = quantize(&src, &out, MxFormat::Fp4, "").unwrap();
    assert_eq!((r.transformed, r.copied), (2, 1));
    let got = entries(&out);
    // [E, in, out] -> [E, out, in]
    let mut transposed = vec![0f32; experts.len()];
    for k in 0..e {
        for i in 0..inn {
            for c in 0..out_cols {
                transposed[((k * out_cols + c) * inn + i) as usize] =
                    experts[((k * inn + i) * out_cols + c) as usize];
            }
        }
    }
    let want = pair(
        "x.experts.gate_up_proj",
        &[e, out_cols, inn],
        &transposed,
        MxFormat::Fp4,
    );
    let want_lin = pair("lin", &[3, 64], &linear, MxFormat::Fp4);
    for (name, dtype, shape, bytes) in want.iter().chain(&want_lin) {
        let (d, s, b) = &got[name];
        assert_eq!((d, s), (dtype, shape), "{name}");
        assert!(b == bytes, "{name}: bytes differ");
    }
    assert_eq!(got["norm.weight"].2, t[2].3);
    assert_eq!(got.len(), 5);
    let m = Model::open(&out).unwrap();
    assert_eq!(m.quant.as_deref(), Some("mxfp4"));
    // Dequantized: [E, in, out] again, each value X * element of its own block.
    let back = dir.path().join("d.safetensors");
    run(
        &m,
        &back,
        &Op::Dequantize { target: Dtype::F32 },
        1,
        &|_, _| {},
    )
    .unwrap();
    let mut exact = Vec::new();
    mx::dequantize(&want[0].3, &want[1].3, MxFormat::Fp4, &mut exact).unwrap();
    let (d, s, b) = &entries(&back)["x.experts.gate_up_proj"];
    assert_eq!((d, s), (&Dtype::F32, &vec![e, inn, out_cols]));
    for k in 0..e {
        for i in (0..inn).step_by(97) {
            for c in 0..out_cols {
                let at = ((k * inn + i) * out_cols + c) as usize * 4;
                let g = f32::from_le_bytes(b[at..at + 4].try_into().unwrap());
                let w = exact[((k * out_cols + c) * inn + i) as usize];
                assert_eq!(g.to_bits(), w.to_bits(), "[{k}, {i}, {c}]");
            }
        }
    }
}

/// MXFP8 keeps `NAME.weight` (F8_E4M3) and adds `NAME.weight_scale` (F8_E8M0), the
/// codec's bytes, blocks along the last axis whatever the rank.
#[test]
fn mx_quantize_fp8_writes_weight_and_weight_scale() {
    let dir = tempfile::tempdir().unwrap();
    let w = values(2 * 3, 64, 500.0);
    let src = dir.path().join("m.safetensors");
    write_raw(&src, &[f32_raw("a.weight", &[2, 3, 64], &w)], None);
    let out = dir.path().join("q.safetensors");
    quantize(&src, &out, MxFormat::Fp8, "").unwrap();
    let got = entries(&out);
    for (name, dtype, shape, bytes) in pair("a", &[2, 3, 64], &w, MxFormat::Fp8) {
        let (d, s, b) = &got[&name];
        assert_eq!((d, s, b), (&dtype, &shape, &bytes), "{name}");
    }
    assert_eq!(Model::open(&out).unwrap().quant.as_deref(), Some("mxfp8"));
}

/// A NaN weight (named with its source row and column, experts transposed or not), a
/// blocked axis that is not a multiple of 32, F64, a name the layout cannot carry, a
/// second format and an empty selection are each refused, nothing written.
#[test]
fn mx_quantize_refuses_what_it_cannot_quantize() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Raw, MxFormat, &str)> = vec![
        (
            {
                let mut v = values(2 * 64, 8, 1.0);
                v[(64 + 33) * 8 + 5] = f32::NAN;
                f32_raw("x.experts.down_proj", &[2, 64, 8], &v)
            },
            MxFormat::Fp4,
            "tensor \"x.experts.down_proj\": row 97, column 5: the weight NaN is not finite",
        ),
        (
            {
                let mut v = values(2, 64, 1.0);
                v[64 + 40] = f32::INFINITY;
                f32_raw("l.weight", &[2, 64], &v)
            },
            MxFormat::Fp8,
            "tensor \"l.weight\": row 1, column 40: the weight inf is not finite",
        ),
        (
            f32_raw("l.weight", &[2, 48], &values(2, 48, 1.0)),
            MxFormat::Fp8,
            "the blocked axis has 48 values, not a multiple of 32",
        ),
        (
            f32_raw("x.experts.up_proj", &[2, 48, 64], &values(96, 64, 1.0)),
            MxFormat::Fp4,
            "the blocked axis has 48 values",
        ),
        (
            ("l.weight".into(), Dtype::F64, vec![1, 32], vec![0; 256]),
            MxFormat::Fp4,
            "F64 weights cannot be MX-quantized",
        ),
        (
            f32_raw("l.bias2d", &[1, 32], &values(1, 32, 1.0)),
            MxFormat::Fp8,
            "must be named NAME.weight",
        ),
        (
            f32_raw("e.w.weight", &[2, 32, 32], &values(64, 32, 1.0)),
            MxFormat::Fp4,
            "named without .weight",
        ),
    ];
    for (k, (raw, fmt, want)) in cases.into_iter().enumerate() {
        let src = dir.path().join(format!("{k}.safetensors"));
        write_raw(&src, &[raw], None);
        let out = dir.path().join(format!("{k}-q.safetensors"));
        let e = quantize(&src, &out, fmt, "").unwrap_err();
        assert!(format!("{e}").contains(want), "case {k}: {e}");
        assert!(!out.exists(), "case {k}");
    }
    // A model quantized as one format takes no pairs of another; a selection that
    // picks nothing is refused (the output would be `quant` without pairs).
    let src = dir.path().join("fp8.safetensors");
    write_raw(
        &src,
        &pair("l", &[1, 32], &values(1, 32, 1.0), MxFormat::Fp8),
        Some("mxfp8"),
    );
    let e = quantize(&src, &dir.path().join("x.safetensors"), MxFormat::Fp4, "").unwrap_err();
    assert!(format!("{e:#}").contains("would mix formats"), "{e:#}");
    let e = quantize(&src, &dir.path().join("y.safetensors"), MxFormat::Fp8, "").unwrap_err();
    assert!(format!("{e:#}").contains("nothing to quantize"), "{e:#}");
}
