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

/// E2M1 code to its value (the OCP table, written out here so the test does not lean
/// on the code it checks).
fn e2m1(c: u8) -> f32 {
    let v = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][usize::from(c & 7)];
    if c & 8 != 0 {
        -v
    } else {
        v
    }
}

/// 2^(s - 127).
fn e8m0(s: u8) -> f32 {
    (f64::from(s) - 127.0).exp2() as f32
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// `st dequantize` of an MXFP4 file writes the experts `[E, rows, 64]` as transformers
/// leaves them, `e.gate_up_proj [E, 64, rows]`, each value `2^(s-127) * e2m1` (BF16 and
/// F32 alike: every value is exact in both), the plain norm copied, `quant` dropped.
#[test]
fn st_dequantize_writes_mxfp4_experts_transposed_as_exact_values() {
    use tlio_core::safetensors::MappedFile;
    let d = tmp();
    let src = write(
        &d.path().join("fp4.safetensors"),
        &fp4_tensors(),
        Some("mxfp4"),
    );
    let t = fp4_tensors();
    let (blocks, scales) = (&t[0].3, &t[1].3);
    for (flag, size) in [("f32", 4), ("bf16", 2)] {
        let out = d.path().join(format!("d-{flag}.safetensors"));
        let o = tlio()
            .args(["st", "dequantize"])
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .args(["--dtype", flag])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", super::stderr_text(&o));
        let m = MappedFile::open(&out).unwrap();
        assert!(!m.header().metadata.contains_key("quant"));
        let info = m
            .header()
            .tensors()
            .iter()
            .find(|t| t.name == "e.gate_up_proj")
            .unwrap()
            .clone();
        assert_eq!(info.shape, vec![2, 64, 4], "{flag}");
        let bytes = m.tensor_bytes("e.gate_up_proj").unwrap();
        let got: Vec<f32> = if size == 4 {
            f32s(bytes)
        } else {
            bytes
                .chunks_exact(2)
                .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
                .collect()
        };
        for k in 0..2 {
            for r in 0..4 {
                for j in 0..64 {
                    let byte = blocks[((k * 4 + r) * 2 + j / 32) * 16 + (j % 32) / 2];
                    let code = if j % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                    let want = e2m1(code) * e8m0(scales[(k * 4 + r) * 2 + j / 32]);
                    assert_eq!(got[(k * 64 + j) * 4 + r], want, "{flag} [{k}, {r}, {j}]");
                }
            }
        }
        assert_eq!(m.tensor_bytes("norm.weight").unwrap(), &[0u8; 8][..]);
    }
}

/// A gpt-oss-layout directory (two shards, an index, `quantization_config` in
/// config.json, no `quant` in the shards) dequantizes to a directory of the same
/// sharding whose index names the dequantized tensors and their true total size,
/// config.json without `quantization_config`, other files copied; it verifies clean.
#[test]
fn st_dequantize_of_a_gpt_oss_directory_rewrites_index_and_config() {
    use tlio_core::safetensors::MappedFile;
    let d = tmp();
    let src = d.path().join("gpt-oss");
    std::fs::create_dir(&src).unwrap();
    let t = fp4_tensors();
    write(&src.join("model-00001-of-00002.safetensors"), &t[..2], None);
    write(&src.join("model-00002-of-00002.safetensors"), &t[2..], None);
    let weight_map: serde_json::Map<String, serde_json::Value> = [
        ("e.gate_up_proj_blocks", 1),
        ("e.gate_up_proj_scales", 1),
        ("norm.weight", 2),
    ]
    .iter()
    .map(|(n, s)| {
        (
            n.to_string(),
            format!("model-0000{s}-of-00002.safetensors").into(),
        )
    })
    .collect();
    let index =
        serde_json::json!({"metadata": {"total_size": 8 + 256 + 16}, "weight_map": weight_map});
    std::fs::write(src.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let config = serde_json::json!({
        "model_type": "gpt_oss",
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]},
    });
    std::fs::write(src.join("config.json"), config.to_string()).unwrap();
    std::fs::write(src.join("tokenizer.json"), "{}").unwrap();
    let out = d.path().join("bf16");
    let o = tlio()
        .args(["st", "dequantize"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .args(["--dtype", "bf16"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", super::stderr_text(&o));
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert!(config.get("quantization_config").is_none(), "{config}");
    assert_eq!(config["model_type"], "gpt_oss");
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    let names: Vec<&str> = map.keys().map(String::as_str).collect();
    assert_eq!(names, ["e.gate_up_proj", "norm.weight"]);
    assert_eq!(map["e.gate_up_proj"], "model-00001-of-00002.safetensors");
    let first = MappedFile::open(&out.join("model-00001-of-00002.safetensors")).unwrap();
    // [2, 64, 4] BF16 and [2] F32.
    assert_eq!(first.header().data_len(), 2 * 64 * 4 * 2);
    assert_eq!(index["metadata"]["total_size"], 2 * 64 * 4 * 2 + 8);
    assert_eq!(std::fs::read(out.join("tokenizer.json")).unwrap(), b"{}");
    let (code, text) = verify(&out);
    assert_eq!(code, 0, "{text}");
}
