//! `tlio st` on MX block-scaled models built here: gpt-oss-style MXFP4 pairs
//! (`_blocks` + `_scales`) and MXFP8 pairs (`.weight` + `.weight_scale`), well formed
//! and broken one rule at a time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{tlio, tmp};
use tlio_core::safetensors::{self as st, Dtype, Tensor, TensorData};

/// name, dtype, shape, raw bytes.
type Raw = (&'static str, Dtype, Vec<u64>, Vec<u8>);

fn write(path: &Path, tensors: &[Raw], quant: Option<&str>) -> PathBuf {
    let t: Vec<Tensor<'_>> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| Tensor {
            name: name.to_string(),
            dtype: *dtype,
            shape: shape.clone(),
            data: TensorData::Raw(bytes.as_slice().into()),
        })
        .collect();
    let mut meta = BTreeMap::new();
    if let Some(q) = quant {
        meta.insert("quant".to_string(), q.to_string());
    }
    st::save(path, &t, &meta).unwrap();
    path.to_path_buf()
}

/// An MXFP4 experts pair `[2 experts, 4 rows, 64]` and a plain norm.
fn fp4_tensors() -> Vec<Raw> {
    let blocks: Vec<u8> = (0..2 * 4 * 2 * 16).map(|i| (i * 37 % 256) as u8).collect();
    let scales: Vec<u8> = (0..2 * 4 * 2).map(|i| 120 + (i % 9) as u8).collect();
    vec![
        (
            "e.gate_up_proj_blocks",
            Dtype::U8,
            vec![2, 4, 2, 16],
            blocks,
        ),
        ("e.gate_up_proj_scales", Dtype::U8, vec![2, 4, 2], scales),
        ("norm.weight", Dtype::F32, vec![2], vec![0; 8]),
    ]
}

/// An MXFP8 pair `[3, 64]` (no E4M3 NaN code 0x7F/0xFF in it).
fn fp8_tensors() -> Vec<Raw> {
    let elems: Vec<u8> = (0..3 * 64).map(|i| (i * 11 % 0x7E) as u8).collect();
    vec![
        ("l.weight", Dtype::F8_E4M3, vec![3, 64], elems),
        (
            "l.weight_scale",
            Dtype::F8_E8M0,
            vec![3, 2],
            vec![127, 126, 130, 1, 0, 254],
        ),
    ]
}

fn verify(path: &Path) -> (i32, String) {
    let out = tlio().args(["st", "verify"]).arg(path).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
    )
}

#[test]
fn st_verify_accepts_well_formed_mx_pairs() {
    let d = tmp();
    let fp4 = write(
        &d.path().join("fp4.safetensors"),
        &fp4_tensors(),
        Some("mxfp4"),
    );
    let fp8 = write(
        &d.path().join("fp8.safetensors"),
        &fp8_tensors(),
        Some("mxfp8"),
    );
    for p in [fp4, fp8] {
        let (code, text) = verify(&p);
        assert_eq!(code, 0, "{}: {text}", p.display());
    }
}

/// A missing half, scales of the wrong shape or dtype, a NaN scale, `quant` without
/// pairs and a partial block: each exits 1 with a line naming the rule and the tensor.
#[test]
fn st_verify_names_each_broken_mx_rule() {
    let d = tmp();
    let mut cases: Vec<(&str, Vec<Raw>, &str, &str)> = Vec::new();
    let mut t = fp4_tensors();
    t.remove(1);
    cases.push((
        "no-scales",
        t,
        "mxfp4",
        "mx (pair): elements \"e.gate_up_proj_blocks\" have no scales",
    ));
    let mut t = fp4_tensors();
    t.remove(0);
    cases.push((
        "no-blocks",
        t,
        "mxfp4",
        "mx (pair): scales \"e.gate_up_proj_scales\" have no elements",
    ));
    let mut t = fp4_tensors();
    t[1] = (
        "e.gate_up_proj_scales",
        Dtype::U8,
        vec![2, 4, 1],
        vec![127; 8],
    );
    cases.push((
        "scale-shape",
        t,
        "mxfp4",
        "scales must be [2, 4, 2] (one per 32 values), but scales are [2, 4, 1]",
    ));
    let mut t = fp4_tensors();
    t[1] = (
        "e.gate_up_proj_scales",
        Dtype::F16,
        vec![2, 4, 2],
        vec![0; 32],
    );
    cases.push((
        "scale-dtype",
        t,
        "mxfp4",
        "scales are F16, not U8 or F8_E8M0",
    ));
    let mut t = fp4_tensors();
    t[1].3[5] = 255;
    cases.push((
        "nan-scale",
        t,
        "mxfp4",
        "mx (scales): tensor \"e.gate_up_proj\": scale 5 is 255",
    ));
    let t = vec![fp4_tensors().remove(2)];
    cases.push((
        "no-pairs",
        t,
        "mxfp4",
        "mx (quant): metadata quant is \"mxfp4\" but the model has no MX pair",
    ));
    let mut t = fp8_tensors();
    t[0] = ("l.weight", Dtype::F8_E4M3, vec![3, 48], vec![0; 144]);
    cases.push((
        "partial",
        t,
        "mxfp8",
        "the last axis must be a multiple of 32",
    ));
    for (name, tensors, quant, want) in cases {
        let p = write(
            &d.path().join(format!("{name}.safetensors")),
            &tensors,
            Some(quant),
        );
        let (code, text) = verify(&p);
        assert_eq!(code, 1, "{name}: {text}");
        assert!(text.contains(want), "{name}: {text}");
    }
}
