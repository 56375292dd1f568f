//! Unit tests of `core::model` on models built here with the canonical writer: index
//! rules, architecture checks, int4 rules, and the transformations (sharded and single
//! file give the same tensors; nothing is written on error).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::transform::{run, Op};
use super::view::{diff_models, verify_model, ModelView};
use super::*;
use crate::safetensors::{save, Tensor, TensorData};

type Spec = (String, Vec<u64>, Vec<f32>);

fn llama_config(layers: u64, tied: bool) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": layers,
        "vocab_size": 12,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "dtype": "float32"
    })
}

fn llama_tensors(layers: u64, tied: bool, seed: f32) -> Vec<Spec> {
    let (h, i, v, kv) = (8u64, 16u64, 12u64, 4u64);
    let mut shapes = vec![
        ("model.embed_tokens.weight".to_string(), vec![v, h]),
        ("model.norm.weight".to_string(), vec![h]),
    ];
    if !tied {
        shapes.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    for l in 0..layers {
        let p = format!("model.layers.{l}.");
        for (n, s) in [
            ("self_attn.q_proj.weight", vec![h, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, h]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
        ] {
            shapes.push((format!("{p}{n}"), s));
        }
    }
    shapes
        .into_iter()
        .enumerate()
        .map(|(k, (name, shape))| {
            let n: u64 = shape.iter().product();
            let vals = (0..n)
                .map(|j| ((j as f32 * 0.37 + k as f32 * 1.3 + seed).sin()) * 0.5)
                .collect();
            (name, shape, vals)
        })
        .collect()
}

fn write_file(path: &Path, specs: &[&Spec]) {
    let tensors: Vec<Tensor<'_>> = specs
        .iter()
        .map(|(name, shape, vals)| Tensor {
            name: name.clone(),
            dtype: Dtype::F32,
            shape: shape.clone(),
            data: TensorData::F32(vals),
        })
        .collect();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    save(path, &tensors, &meta).unwrap();
}

/// A sharded directory (tensors dealt round-robin to `n` shards) and its single-file
/// twin, both with config.json and a tokenizer.json.
fn llama_pair(root: &Path, n: usize) -> (PathBuf, PathBuf) {
    let specs = llama_tensors(2, false, 0.0);
    let config = serde_json::to_vec_pretty(&llama_config(2, false)).unwrap();
    let sharded = root.join("sharded");
    let single = root.join("single");
    for d in [&sharded, &single] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join(CONFIG_NAME), &config).unwrap();
        std::fs::write(d.join(TOKENIZER_NAME), b"{}").unwrap();
    }
    write_file(&single.join(SINGLE_NAME), &specs.iter().collect::<Vec<_>>());
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    for k in 0..n {
        let name = format!("model-{:05}-of-{:05}.safetensors", k + 1, n);
        let part: Vec<&Spec> = specs.iter().skip(k).step_by(n).collect();
        for (t, _, v) in &part {
            weight_map.insert(t.clone(), name.clone());
            total += v.len() as u64 * 4;
        }
        write_file(&sharded.join(&name), &part);
    }
    write_index(
        &sharded,
        serde_json::json!({"total_size": total}),
        &weight_map,
    );
    (sharded, single)
}

fn write_index(dir: &Path, metadata: serde_json::Value, map: &BTreeMap<String, String>) {
    let doc = serde_json::json!({"metadata": metadata, "weight_map": map});
    std::fs::write(
        dir.join(INDEX_NAME),
        serde_json::to_vec_pretty(&doc).unwrap(),
    )
    .unwrap();
}

fn read_index_map(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join(INDEX_NAME)).unwrap()).unwrap()
}

fn rules(path: &Path) -> Vec<String> {
    let (_, problems) = Model::scan(path).unwrap();
    problems
        .into_parts()
        .0
        .into_iter()
        .map(|f| f.rule)
        .collect()
}

fn all(_: &str) -> bool {
    true
}

#[test]
fn sharded_and_single_open_the_same_logical_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let (sharded, single) = llama_pair(dir.path(), 3);
    let a = Model::open(&sharded).unwrap();
    let b = Model::open(&single).unwrap();
    assert_eq!(a.shards.len(), 3);
    assert_eq!(b.shards.len(), 1);
    let names = |m: &Model| m.logical.iter().map(|l| l.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b));
    assert_eq!(a.logical.len(), 3 + 2 * 9);
    let (va, vb) = (
        ModelView::open(&sharded).unwrap(),
        ModelView::open(&single).unwrap(),
    );
    assert!(diff_models(&va, &vb).identical());
    // The index file itself is a model argument too.
    let idx = Model::open(&sharded.join(INDEX_NAME)).unwrap();
    assert_eq!(idx.kind, Kind::Index);
    assert_eq!(arch::summary(&idx).arch, "llama");
}

#[test]
fn every_index_rule_is_a_finding() {
    let dir = tempfile::tempdir().unwrap();
    let (sharded, _) = llama_pair(dir.path(), 2);
    let good = read_index_map(&sharded);
    let map: BTreeMap<String, String> = serde_json::from_value(good["weight_map"].clone()).unwrap();
    let total = good["metadata"]["total_size"].as_u64().unwrap();
    let case = |meta: serde_json::Value, m: &BTreeMap<String, String>| {
        write_index(&sharded, meta, m);
        rules(&sharded)
    };
    assert!(case(serde_json::json!({"total_size": total}), &map).is_empty());
    assert_eq!(
        case(serde_json::json!({"total_size": total * 2}), &map),
        ["index-total-size"]
    );
    let mut unlisted = map.clone();
    unlisted.remove("model.norm.weight");
    assert_eq!(
        case(serde_json::json!({}), &unlisted),
        ["index-unlisted-tensor"]
    );
    let mut extra = map.clone();
    extra.insert("ghost".into(), "model-00001-of-00002.safetensors".into());
    assert_eq!(
        case(serde_json::json!({}), &extra),
        ["index-missing-tensor"]
    );
    let mut wrong = map.clone();
    let first_in_1 = map
        .iter()
        .find(|(_, s)| s.starts_with("model-00001"))
        .unwrap()
        .0
        .clone();
    wrong.insert(first_in_1, "model-00002-of-00002.safetensors".into());
    assert_eq!(case(serde_json::json!({}), &wrong), ["index-wrong-shard"]);
    let mut missing = map.clone();
    missing.insert("extra".into(), "model-00003-of-00003.safetensors".into());
    assert!(case(serde_json::json!({}), &missing).contains(&"index-missing-shard".to_string()));
    let mut escape = map.clone();
    escape.insert("x".into(), "../single/model.safetensors".into());
    assert!(case(serde_json::json!({}), &escape).contains(&"index-shard-name".to_string()));
    std::fs::write(sharded.join(INDEX_NAME), br#"{"weight_map": {"a": 1}}"#).unwrap();
    assert_eq!(rules(&sharded), ["index-json"]);
    std::fs::write(
        sharded.join(INDEX_NAME),
        br#"{"weight_map": {"a": "x", "a": "y"}}"#,
    )
    .unwrap();
    assert_eq!(rules(&sharded), ["index-json"]);
}

#[test]
fn a_tensor_in_two_shards_is_a_finding() {
    let dir = tempfile::tempdir().unwrap();
    let (sharded, _) = llama_pair(dir.path(), 2);
    let specs = llama_tensors(2, false, 0.0);
    let norm = specs.iter().find(|s| s.0 == "model.norm.weight").unwrap();
    let mut map: BTreeMap<String, String> =
        serde_json::from_value(read_index_map(&sharded)["weight_map"].clone()).unwrap();
    let holder = map["model.norm.weight"].clone();
    let other = if holder.starts_with("model-00001") {
        "model-00002-of-00002.safetensors"
    } else {
        "model-00001-of-00002.safetensors"
    };
    // Rewrite `other` with the norm added.
    let mut part: Vec<&Spec> = specs.iter().filter(|s| map[&s.0] == other).collect();
    part.push(norm);
    write_file(&sharded.join(other), &part);
    map.insert("model.norm.weight".into(), holder);
    write_index(&sharded, serde_json::json!({}), &map);
    assert!(rules(&sharded).contains(&"index-duplicate-tensor".to_string()));
}

#[test]
fn llama_names_and_shapes_follow_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let (_, single) = llama_pair(dir.path(), 2);
    let set = |c: serde_json::Value| {
        std::fs::write(single.join(CONFIG_NAME), serde_json::to_vec(&c).unwrap()).unwrap();
        rules(&single)
    };
    assert!(set(llama_config(2, false)).is_empty());
    let r = set(llama_config(3, false));
    assert_eq!(r.len(), 9);
    assert!(r.iter().all(|x| x == "arch-missing"));
    let r = set(llama_config(1, false));
    assert_eq!(r.len(), 9);
    assert!(r.iter().all(|x| x == "arch-unexpected"));
    assert_eq!(set(llama_config(2, true)), ["arch-unexpected"]);
    let mut c = llama_config(2, false);
    c["intermediate_size"] = 12.into();
    assert_eq!(set(c).iter().filter(|r| *r == "arch-shape").count(), 6);
    let mut c = llama_config(2, false);
    c.as_object_mut().unwrap().remove("hidden_size");
    assert_eq!(set(c), ["arch-config"]);
    let mut c = llama_config(2, false);
    c["num_hidden_layers"] = 1_000_000_000_000u64.into();
    assert_eq!(set(c), ["arch-config"]);
    // tl_arch wins over model_type; unknown architectures get no name check.
    let mut c = llama_config(2, false);
    c["tl_arch"] = "bigram".into();
    assert!(set(c).contains(&"arch-missing".to_string()));
    assert!(set(serde_json::json!({"model_type": "gpt2"})).is_empty());
    // tl_tokenizer: "file" needs tokenizer.json, and any other value forbids it.
    let mut c = llama_config(2, false);
    c["tl_tokenizer"] = "none".into();
    assert_eq!(set(c), ["tokenizer"]);
}

#[test]
fn convert_directory_is_atomic_and_equals_converting_the_single_file() {
    let dir = tempfile::tempdir().unwrap();
    let (sharded, single) = llama_pair(dir.path(), 3);
    let op = Op::Convert {
        target: Dtype::BF16,
        saturate: false,
        select: &all,
    };
    let out_a = dir.path().join("out-sharded");
    let out_b = dir.path().join("out-single");
    let ra = run(&Model::open(&sharded).unwrap(), &out_a, &op, 2, &|_, _| {}).unwrap();
    run(&Model::open(&single).unwrap(), &out_b, &op, 1, &|_, _| {}).unwrap();
    assert_eq!(ra.shards, 3);
    assert_eq!(ra.files_copied, vec![TOKENIZER_NAME.to_string()]);
    let (a, b) = (
        ModelView::open(&out_a).unwrap(),
        ModelView::open(&out_b).unwrap(),
    );
    assert!(diff_models(&a, &b).identical());
    let index = read_index_map(&out_a);
    assert_eq!(
        index["metadata"]["total_size"].as_u64().unwrap(),
        a.model.data_bytes()
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_a.join(CONFIG_NAME)).unwrap()).unwrap();
    assert_eq!(config["torch_dtype"], "bfloat16");
    assert_eq!(config["dtype"], "bfloat16");
    assert!(verify_model(&out_a, Default::default(), &mut |_, _| {})
        .unwrap()
        .is_empty());
    // A non-empty output directory is refused; nothing else appears beside it.
    let before: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    let err = run(&Model::open(&sharded).unwrap(), &out_a, &op, 2, &|_, _| {}).unwrap_err();
    assert!(matches!(err, ModelError::OutputExists { .. }), "{err}");
    let after: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(before.len(), after.len());
}

#[test]
fn a_failing_shard_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (sharded, _) = llama_pair(dir.path(), 3);
    // Values beyond 448 make F8_E4M3 fail without --saturate.
    let mut specs = llama_tensors(2, false, 0.0);
    for s in &mut specs {
        if s.0 == "model.norm.weight" {
            s.2[3] = 1000.0;
        }
    }
    let map: BTreeMap<String, String> =
        serde_json::from_value(read_index_map(&sharded)["weight_map"].clone()).unwrap();
    let holder = map["model.norm.weight"].clone();
    let part: Vec<&Spec> = specs.iter().filter(|s| map[&s.0] == holder).collect();
    write_file(&sharded.join(&holder), &part);
    let out = dir.path().join("out");
    let op = Op::Convert {
        target: Dtype::F8_E4M3,
        saturate: false,
        select: &all,
    };
    let err = run(&Model::open(&sharded).unwrap(), &out, &op, 2, &|_, _| {}).unwrap_err();
    // The shard names itself; the tensor is named by its cause.
    let chain: Vec<String> =
        std::iter::successors(Some(&err as &dyn std::error::Error), |e| e.source())
            .map(ToString::to_string)
            .collect();
    assert!(chain.join(": ").contains("model.norm.weight"), "{chain:?}");
    assert!(!out.exists());
    let leftovers: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tlio-") || n.contains(".tlio-tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let sat = Op::Convert {
        target: Dtype::F8_E4M3,
        saturate: true,
        select: &all,
    };
    run(&Model::open(&sharded).unwrap(), &out, &sat, 2, &|_, _| {}).unwrap();
    let v = ModelView::open(&out).unwrap();
    let e = v
        .model
        .entries
        .iter()
        .position(|e| e.info.name == "model.norm.weight")
        .unwrap();
    assert_eq!(v.entry_bytes(e).unwrap()[3], 0x7E, "448 is 0x7E");
}

#[test]
fn quantize_then_dequantize_a_sharded_model() {
    let dir = tempfile::tempdir().unwrap();
    let (sharded, single) = llama_pair(dir.path(), 3);
    let sel = |n: &str| n.ends_with("_proj.weight");
    let q = Op::Quantize {
        group: 4,
        select: &sel,
    };
    let qa = dir.path().join("qa");
    let qb = dir.path().join("qb.safetensors");
    let r = run(&Model::open(&sharded).unwrap(), &qa, &q, 2, &|_, _| {}).unwrap();
    assert_eq!(r.transformed, 14);
    assert!(verify_model(&qa, Default::default(), &mut |_, _| {})
        .unwrap()
        .is_empty());
    let qm = Model::open(&qa).unwrap();
    assert_eq!(qm.quant.as_deref(), Some("int4-g4-sym"));
    let l = qm.logical("model.layers.0.mlp.down_proj.weight").unwrap();
    assert_eq!(l.shape, vec![8, 16]);
    assert!(matches!(l.storage, Storage::Int4 { group: 4, .. }));
    // The single file quantizes to the same tensors.
    let single_file = single.join(SINGLE_NAME);
    run(&Model::open(&single_file).unwrap(), &qb, &q, 1, &|_, _| {}).unwrap();
    assert!(diff_models(
        &ModelView::open(&qa).unwrap(),
        &ModelView::open(&qb).unwrap()
    )
    .identical());
    let d = Op::Dequantize { target: Dtype::F32 };
    let da = dir.path().join("da");
    run(&qm, &da, &d, 2, &|_, _| {}).unwrap();
    let dm = ModelView::open(&da).unwrap();
    assert!(dm.model.quant.is_none());
    let orig = ModelView::open(&sharded).unwrap();
    let report = diff_models(&orig, &dm);
    assert!(report.only_in_a.is_empty() && report.only_in_b.is_empty());
    // Only the projections changed, each within half a scale of amax/7 <= 0.5/7.
    for d in &report.different {
        assert!(d.name.ends_with("_proj.weight"), "{}", d.name);
        let m = d.values.unwrap().max_abs_diff.unwrap();
        assert!(m <= 0.5 / 7.0 / 2.0 + 1e-3, "{} {m}", d.name);
    }
    // Converting a quantized model leaves the int4 pairs alone.
    let c = Op::Convert {
        target: Dtype::BF16,
        saturate: false,
        select: &all,
    };
    let ca = dir.path().join("ca");
    run(&qm, &ca, &c, 2, &|_, _| {}).unwrap();
    assert!(verify_model(&ca, Default::default(), &mut |_, _| {})
        .unwrap()
        .is_empty());
}

#[test]
fn quantize_refuses_what_the_rule_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let (_, single) = llama_pair(dir.path(), 1);
    let m = Model::open(&single).unwrap();
    let sel = |n: &str| n.ends_with("_proj.weight");
    let bad_group = Op::Quantize {
        group: 3,
        select: &sel,
    };
    let out = dir.path().join("o");
    assert!(matches!(
        run(&m, &out, &bad_group, 1, &|_, _| {}),
        Err(ModelError::BadGroup { group: 3 })
    ));
    let not_dividing = Op::Quantize {
        group: 32,
        select: &sel,
    };
    let err = run(&m, &out, &not_dividing, 1, &|_, _| {}).unwrap_err();
    assert!(matches!(err, ModelError::CannotQuantize { .. }), "{err}");
    assert!(!out.exists());
}

#[test]
fn int4_reader_rules() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("q.safetensors");
    let put = |tensors: Vec<Tensor<'_>>, quant: Option<&str>| {
        let meta: BTreeMap<String, String> = quant
            .map(|q| BTreeMap::from([("quant".to_string(), q.to_string())]))
            .unwrap_or_default();
        save(&p, &tensors, &meta).unwrap();
        rules(&p)
    };
    let raw = |name: &str, dtype: Dtype, shape: Vec<u64>, bytes: Vec<u8>| Tensor {
        name: name.to_string(),
        dtype,
        shape,
        data: TensorData::Raw(bytes.into()),
    };
    let pair = || {
        vec![
            raw("w.qweight", Dtype::U8, vec![2, 2], vec![0; 4]),
            raw("w.scales", Dtype::F16, vec![2, 1], vec![0; 4]),
        ]
    };
    assert!(put(pair(), Some("int4-g4-sym")).is_empty());
    assert_eq!(put(pair(), None), ["int4-quant"]);
    assert_eq!(put(pair(), Some("int4-g3-sym")), ["int4-quant"]);
    assert_eq!(put(pair(), Some("int4-g2-sym")), ["int4-layout"]);
    assert_eq!(
        put(
            vec![raw("x", Dtype::U8, vec![1], vec![0])],
            Some("int4-g4-sym")
        ),
        ["int4-quant"]
    );
    assert_eq!(
        put(pair().into_iter().take(1).collect(), Some("int4-g4-sym")),
        ["int4-pair", "int4-quant"]
    );
    // Negative and infinite scales are caught by verify (it reads the data).
    let mut bad = pair();
    bad[1] = raw("w.scales", Dtype::F16, vec![2, 1], vec![0, 0, 0, 0xBC]);
    put(bad, Some("int4-g4-sym"));
    let f = verify_model(&p, Default::default(), &mut |_, _| {}).unwrap();
    assert_eq!(f.len(), 1);
    assert_eq!(f.kept()[0].rule, "int4-scales");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Converting a sharded model equals converting its single-file twin, tensor by
    /// tensor, for any sharding and target.
    #[test]
    fn convert_sharded_equals_convert_single(
        n in 1usize..5,
        target in prop::sample::select(vec![Dtype::BF16, Dtype::F16, Dtype::F64, Dtype::F8_E5M2]),
        jobs in 1usize..3,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (sharded, single) = llama_pair(dir.path(), n);
        let op = Op::Convert { target, saturate: false, select: &all };
        let (oa, ob) = (dir.path().join("a"), dir.path().join("b"));
        run(&Model::open(&sharded).unwrap(), &oa, &op, jobs, &|_, _| {}).unwrap();
        run(&Model::open(&single).unwrap(), &ob, &op, 1, &|_, _| {}).unwrap();
        let r = diff_models(&ModelView::open(&oa).unwrap(), &ModelView::open(&ob).unwrap());
        prop_assert!(r.identical(), "{:?}", r);
        prop_assert_eq!(Model::open(&oa).unwrap().shards.len(), n);
    }
}
