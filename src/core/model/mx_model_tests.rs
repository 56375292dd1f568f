//! Unit tests of MX models built here with the canonical writer: the reader rules a
//! whole file is checked by (NaN scales, `quant` without pairs, partial blocks) and
//! the transformations of MX pairs.

use std::collections::BTreeMap;
use std::path::Path;

use super::mx::{self, MxFormat};
use super::view::{verify_model, ModelView};
use super::*;
use crate::safetensors::{save, Tensor, TensorData};

/// An owned tensor to write: name, dtype, shape and its raw bytes.
pub(super) type Raw = (String, Dtype, Vec<u64>, Vec<u8>);

/// Write `tensors` (raw bytes) with `quant` metadata when given.
pub(super) fn write_raw(path: &Path, tensors: &[Raw], quant: Option<&str>) {
    let t: Vec<Tensor<'_>> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| Tensor {
            name: name.clone(),
            dtype: *dtype,
            shape: shape.clone(),
            data: TensorData::Raw(bytes.as_slice().into()),
        })
        .collect();
    let mut meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    if let Some(q) = quant {
        meta.insert("quant".to_string(), q.to_string());
    }
    save(path, &t, &meta).unwrap();
}

/// Values `[rows, n]` of a smooth pattern scaled by `amp`.
pub(super) fn values(rows: u64, n: u64, amp: f32) -> Vec<f32> {
    (0..rows * n)
        .map(|j| (j as f32 * 0.61).sin() * amp)
        .collect()
}

/// The MX pair of `vals` (`shape`, last axis a multiple of 32) under `fmt`, named from
/// `base` as the format's layout names it.
pub(super) fn pair(base: &str, shape: &[u64], vals: &[f32], fmt: MxFormat) -> Vec<Raw> {
    let (mut scales, mut elems) = (Vec::new(), Vec::new());
    mx::quantize(vals, fmt, &mut scales, &mut elems).unwrap();
    let (last, prefix) = shape.split_last().unwrap();
    let mut sshape = prefix.to_vec();
    sshape.push(last / 32);
    match fmt {
        MxFormat::Fp4 => {
            let mut eshape = sshape.clone();
            eshape.push(16);
            vec![
                (format!("{base}_blocks"), Dtype::U8, eshape, elems),
                (format!("{base}_scales"), Dtype::U8, sshape, scales),
            ]
        }
        MxFormat::Fp8 => vec![
            (
                format!("{base}.weight"),
                Dtype::F8_E4M3,
                shape.to_vec(),
                elems,
            ),
            (
                format!("{base}.weight_scale"),
                Dtype::F8_E8M0,
                sshape,
                scales,
            ),
        ],
    }
}

fn rules(path: &Path) -> Vec<(String, String)> {
    let found = verify_model(path, Default::default(), &mut |_, _| {}).unwrap();
    found
        .kept()
        .iter()
        .map(|f| (f.rule.clone(), f.message.clone()))
        .collect()
}

/// A well-formed MXFP4 and MXFP8 file verifies clean and shows one logical tensor a
/// pair, of the format's dtype name.
#[test]
fn mx_files_verify_and_list_pairs_as_one_tensor() {
    let dir = tempfile::tempdir().unwrap();
    for fmt in [MxFormat::Fp4, MxFormat::Fp8] {
        let path = dir.path().join(format!("{}.safetensors", fmt.quant_name()));
        let mut t = pair("l", &[4, 64], &values(4, 64, 3.0), fmt);
        t.push(("norm.weight".into(), Dtype::F32, vec![2], vec![0; 8]));
        write_raw(&path, &t, Some(fmt.quant_name()));
        assert_eq!(rules(&path), vec![]);
        let m = Model::open(&path).unwrap();
        let l = m.logical("l.weight").unwrap();
        assert_eq!(l.shape, vec![4, 64]);
        assert_eq!(m.stored(l).0, fmt.quant_name());
        assert_eq!(m.logical.len(), 2);
    }
}

/// A NaN scale (255) is refused by verify with the rule named, and by every command
/// that reads the data.
#[test]
fn a_nan_scale_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let mut t = pair("l", &[2, 64], &values(2, 64, 1.0), MxFormat::Fp4);
    t[1].3[3] = mx::E8M0_NAN;
    write_raw(&path, &t, Some("mxfp4"));
    let r = rules(&path);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, "mx-scales");
    assert!(r[0].1.contains("scale 3 is 255"), "{r:?}");
    let e = ModelView::open(&path).err().unwrap().to_string();
    assert!(e.contains("mx (scales)"), "{e}");
}

/// `quant` naming an MX format in a model without any pair is refused.
#[test]
fn mx_quant_without_pairs_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let t = vec![("a.weight".into(), Dtype::F32, vec![2], vec![0; 8])];
    write_raw(&path, &t, Some("mxfp8"));
    let r = rules(&path);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, "mx-quant");
    assert!(r[0].1.contains("no MX pair"), "{r:?}");
}

/// MXFP8 elements whose last axis is not a whole number of blocks are refused.
#[test]
fn a_partial_block_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let t = vec![
        ("l.weight".into(), Dtype::F8_E4M3, vec![2, 40], vec![0; 80]),
        (
            "l.weight_scale".into(),
            Dtype::F8_E8M0,
            vec![2, 1],
            vec![127; 2],
        ),
    ];
    write_raw(&path, &t, Some("mxfp8"));
    let r = rules(&path);
    assert_eq!(r[0].0, "mx-pair", "{r:?}");
    assert!(r[0].1.contains("multiple of 32"), "{r:?}");
}

/// The f32 values of entry `name` of `path` (an F32 tensor).
fn f32_values(path: &Path, name: &str) -> (Vec<u64>, Vec<f32>) {
    let v = ModelView::open(path).unwrap();
    let i = v
        .model
        .entries
        .iter()
        .position(|e| e.info.name == name)
        .unwrap();
    let shape = v.model.entries[i].info.shape.clone();
    let bytes = v.entry_bytes(i).unwrap();
    let vals = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (shape, vals)
}

/// Dequantizing writes each pair as `X * element` exactly: gpt-oss experts `[E, out,
/// n]` come out `[E, n, out]` without `_blocks`, a 2-D MXFP4 pair and an MXFP8 pair as
/// `NAME.weight`, plain tensors copied, `quant` gone; more rows than one step holds
/// cross step boundaries inside a matrix.
#[test]
fn dequantize_writes_each_pair_as_its_exact_values() {
    use super::transform::{run, Op};
    let dir = tempfile::tempdir().unwrap();
    let (e, rows, n) = (3u64, 5u64, 96u64);
    let experts = values(e * rows, n, 40.0);
    let linear = values(4, 64, 0.01);
    let mut t = pair(
        "x.experts.down_proj",
        &[e, rows, n],
        &experts,
        MxFormat::Fp4,
    );
    t.extend(pair("lin", &[4, 64], &linear, MxFormat::Fp4));
    t.push(("norm.weight".into(), Dtype::F32, vec![2], vec![0; 8]));
    let src = dir.path().join("m.safetensors");
    write_raw(&src, &t, Some("mxfp4"));
    let out = dir.path().join("d.safetensors");
    let r = run(
        &Model::open(&src).unwrap(),
        &out,
        &Op::Dequantize { target: Dtype::F32 },
        1,
        &|_, _| {},
    )
    .unwrap();
    assert_eq!((r.transformed, r.copied), (2, 1));
    let exact = |pair: &[Raw]| {
        let mut v = Vec::new();
        mx::dequantize(&pair[0].3, &pair[1].3, MxFormat::Fp4, &mut v).unwrap();
        v
    };
    let want = exact(&t[0..2]);
    let (shape, got) = f32_values(&out, "x.experts.down_proj");
    assert_eq!(shape, vec![e, n, rows]);
    for k in 0..e {
        for r in 0..rows {
            for j in 0..n {
                let w = want[((k * rows + r) * n + j) as usize];
                let g = got[((k * n + j) * rows + r) as usize];
                assert_eq!(w.to_bits(), g.to_bits(), "[{k}, {r}, {j}]");
            }
        }
    }
    let (shape, got) = f32_values(&out, "lin.weight");
    assert_eq!(shape, vec![4, 64]);
    assert_eq!(got, exact(&t[2..4]));
    let m = Model::open(&out).unwrap();
    assert!(m.quant.is_none());
    assert_eq!(m.logical.len(), 3);
    // MXFP8 keeps its `.weight` name and shape.
    let t8 = pair("l", &[2, 64], &linear[..128], MxFormat::Fp8);
    let src8 = dir.path().join("m8.safetensors");
    write_raw(&src8, &t8, Some("mxfp8"));
    let out8 = dir.path().join("d8.safetensors");
    run(
        &Model::open(&src8).unwrap(),
        &out8,
        &Op::Dequantize { target: Dtype::F32 },
        1,
        &|_, _| {},
    )
    .unwrap();
    let mut want = Vec::new();
    mx::dequantize(&t8[0].3, &t8[1].3, MxFormat::Fp8, &mut want).unwrap();
    assert_eq!(f32_values(&out8, "l.weight"), (vec![2, 64], want));
}
