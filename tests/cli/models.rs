//! `tlio st` on model directories, sharded indexes and int4 weights, against the
//! fixtures of fixtures/gen_models.py: a transformers-written sharded llama and its
//! single-file twin, broken variants (each index rule, each name/shape rule), BF16
//! bytes from ml_dtypes and int4 outputs of an independent numpy implementation; and the
//! rules every command applies to a model directory: an ambiguous directory, int4 scales,
//! repeated config keys, extra files with odd names or links, bounded failure lists.

use std::fs;
use std::path::{Path, PathBuf};

use super::errors::assert_one_error_line;
use super::{cap_file_size, fixture, sharded_model, stderr_text, tlio, tmp};

fn model(rel: &str) -> std::path::PathBuf {
    fixture(&format!("models/{rel}"))
}

fn stdout_of(args: &[&std::ffi::OsStr]) -> String {
    let out = tlio()
        .args(args)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    String::from_utf8(out).unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_transformers_sharded_llama_goes_through_every_command() {
    let dir = tmp();
    let sharded = model("llama-sharded");
    let single = model("llama-single");
    let text = stdout_of(&["st".as_ref(), "inspect".as_ref(), sharded.as_os_str()]);
    assert!(text.contains("architecture: llama, 2 layers, hidden 32, 4 heads, 2 kv heads, intermediate 64, vocab 64, tied embeddings no"), "{text}");
    assert!(text.contains("in 3 shards"), "{text}");
    tlio()
        .args(["st", "verify"])
        .arg(&sharded)
        .arg(&single)
        .assert()
        .success();
    tlio()
        .args(["st", "diff"])
        .arg(&sharded)
        .arg(&single)
        .assert()
        .success();

    // Convert: a directory out, same sharding, true total_size, config dtype, other
    // files copied; its tensors equal converting the single file, whose bytes equal
    // ml_dtypes' BF16 written by the safetensors library.
    let out = dir.path().join("bf16");
    tlio()
        .args(["st", "convert"])
        .arg(&sharded)
        .arg(&out)
        .args(["--dtype", "BF16"])
        .assert()
        .success();
    assert_eq!(names(&out), names(&sharded));
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    assert_eq!(index["metadata"]["total_size"], 45376);
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["dtype"], "bfloat16");
    assert_eq!(config["torch_dtype"], "bfloat16");
    assert_eq!(
        std::fs::read(out.join("generation_config.json")).unwrap(),
        std::fs::read(sharded.join("generation_config.json")).unwrap()
    );
    let out_single = dir.path().join("bf16-single");
    tlio()
        .args(["st", "convert"])
        .arg(&single)
        .arg(&out_single)
        .args(["--dtype", "BF16"])
        .assert()
        .success();
    assert_eq!(
        std::fs::read(out_single.join("model.safetensors")).unwrap(),
        std::fs::read(model("llama-bf16/model.safetensors")).unwrap()
    );
    tlio()
        .args(["st", "diff"])
        .arg(&out)
        .arg(&out_single)
        .assert()
        .success();
    tlio().args(["st", "verify"]).arg(&out).assert().success();

    // Quantize and dequantize, directories in and out.
    let q = dir.path().join("int4");
    tlio()
        .args(["st", "quantize"])
        .arg(&sharded)
        .arg(&q)
        .arg("--int4")
        .assert()
        .success();
    let text = stdout_of(&["st".as_ref(), "inspect".as_ref(), q.as_os_str()]);
    assert!(text.contains("quantization: int4-g32-sym"), "{text}");
    assert!(text.contains("int4-g32-sym  [64, 32]"), "{text}");
    tlio().args(["st", "verify"]).arg(&q).assert().success();
    let d = dir.path().join("deq");
    tlio()
        .args(["st", "dequantize"])
        .arg(&q)
        .arg(&d)
        .assert()
        .success();
    tlio().args(["st", "verify"]).arg(&d).assert().success();
    // Only the projections differ from the original.
    let out = tlio()
        .args(["--json", "st", "diff"])
        .arg(&sharded)
        .arg(&d)
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let differ = report["different"].as_array().unwrap();
    assert_eq!(differ.len(), 14);
    assert!(differ
        .iter()
        .all(|t| t["name"].as_str().unwrap().ends_with("_proj.weight")));
    assert_eq!(report["equal"].as_array().unwrap().len(), 7);
}

#[test]
fn inspect_json_has_the_architecture_summary() {
    let out = tlio()
        .args(["--json", "st", "inspect"])
        .arg(model("llama-sharded"))
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let f = &v["files"][0];
    assert_eq!(f["kind"], "directory");
    let a = &f["architecture"];
    assert_eq!(a["arch"], "llama");
    assert_eq!(a["layers"], 2);
    assert_eq!(a["kv_heads"], 2);
    assert_eq!(a["params"], 22688);
    assert_eq!(a["shards"], 3);
    assert_eq!(a["tied_embeddings"], false);
    assert_eq!(a["dtypes"]["F32"], 90752);
    assert_eq!(f["tensors"].as_array().unwrap().len(), 21);
}

#[test]
fn int4_matches_the_numpy_reference_byte_for_byte() {
    let dir = tmp();
    let q = dir.path().join("q.safetensors");
    tlio()
        .args(["st", "quantize"])
        .arg(model("int4/input.safetensors"))
        .arg(&q)
        .args(["--int4", "--group", "8", "--only", "weight$"])
        .assert()
        .success();
    assert_eq!(
        std::fs::read(&q).unwrap(),
        std::fs::read(model("int4/quantized-g8.safetensors")).unwrap()
    );
    let d = dir.path().join("d.safetensors");
    tlio()
        .args(["st", "dequantize"])
        .arg(model("int4/quantized-g8.safetensors"))
        .arg(&d)
        .assert()
        .success();
    assert_eq!(
        std::fs::read(&d).unwrap(),
        std::fs::read(model("int4/dequantized-g8.safetensors")).unwrap()
    );
    // --stats shows the dequantized values of a pair.
    let out = tlio()
        .args(["--json", "st", "inspect", "--stats"])
        .arg(model("int4/quantized-g8.safetensors"))
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let ties = v["files"][0]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "ties.weight")
        .unwrap()
        .clone();
    assert_eq!(ties["dtype"], "int4-g8-sym");
    assert_eq!(ties["shape"], serde_json::json!([2, 8]));
    assert_eq!(ties["stats"]["max"], 7.0);
    assert_eq!(ties["stats"]["min"], -7.0);
}

/// Every broken variant: verify exits 1 with a line naming the rule and what is
/// wrong; inspect and convert exit 1 with one line; nothing is written.
#[test]
fn every_broken_variant_exits_1_naming_the_problem() {
    let cases: &[(&str, &str)] = &[
        ("index-variants/missing_shard.index.json", "index (missing shard): shard \"model-00009-of-00009.safetensors\""),
        ("index-variants/unlisted_tensor.index.json", "index (unlisted tensor): tensor \"model.norm.weight\""),
        ("index-variants/missing_tensor.index.json", "index (missing tensor): tensor \"model.ghost.weight\""),
        ("index-variants/wrong_shard.index.json", "index (wrong shard): tensor \"lm_head.weight\""),
        ("index-variants/stale_total_size.index.json", "index (total_size): metadata.total_size is 181504 but the tensors hold 90752 bytes"),
        ("index-variants/shard_outside.index.json", "index (shard name): shard \"../llama-single/model.safetensors\" is not a plain file name"),
        ("index-variants/not_strings.index.json", "index (document)"),
        ("index-variants/not_object.index.json", "index (document): the index is not a JSON object"),
        ("index-variants/duplicate_key.index.json", "appears twice in weight_map"),
        ("index-variants/tensor_in_two_shards.index.json", "index (duplicate tensor): tensor \"model.norm.weight\" is in both"),
        ("arch-missing-layer", "arch (llama): missing tensor \"model.layers.2.input_layernorm.weight\""),
        ("arch-tied-lm-head", "arch (llama): unexpected tensor \"lm_head.weight\""),
        ("arch-mlp-shape", "arch (llama): tensor \"model.layers.0.mlp.down_proj.weight\" has shape [32, 64], the config needs [32, 48]"),
        ("arch-no-hidden-size", "arch (llama): config: hidden_size is missing"),
        ("bigram-bad-shape", "arch (bigram): tensor \"bigram.weight\" has shape [4, 5]"),
        ("bigram-no-tokenizer", "tokenizer: config.json says \"tl_tokenizer\": \"file\""),
    ];
    for (rel, want) in cases {
        let path = model(rel);
        let out = tlio()
            .args(["st", "verify"])
            .arg(&path)
            .assert()
            .code(1)
            .get_output()
            .stdout
            .clone();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(want), "{rel}: {text}");
        for args in [vec!["st", "inspect"], vec!["st", "convert"]] {
            let dir = tmp();
            let target = dir.path().join("out");
            let mut cmd = tlio();
            cmd.args(&args).arg(&path);
            if args[1] == "convert" {
                cmd.arg(&target).args(["--dtype", "BF16"]);
            }
            let err = cmd.assert().code(1).get_output().stderr.clone();
            let err = String::from_utf8(err).unwrap();
            assert_eq!(err.lines().count(), 1, "{rel} {args:?}: {err}");
            assert!(err.starts_with("tlio: error: "), "{err}");
            assert!(names(dir.path()).is_empty(), "{rel}: something was written");
        }
    }
    // The good index beside symlinked shards (as in the Hugging Face cache) is fine.
    tlio()
        .args(["st", "verify"])
        .arg(model("index-variants/good.index.json"))
        .assert()
        .success();
    tlio()
        .args(["st", "verify"])
        .arg(model("bigram"))
        .assert()
        .success();
}

#[test]
fn convert_refuses_a_non_empty_output_directory_and_accepts_an_empty_one() {
    let dir = tmp();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), b"mine").unwrap();
    let err = tlio()
        .args(["st", "convert"])
        .arg(model("llama-sharded"))
        .arg(&out)
        .args(["--dtype", "F16"])
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    assert!(String::from_utf8(err)
        .unwrap()
        .contains("already exists and is not an empty directory"));
    assert_eq!(names(&out), ["keep.txt"]);
    assert_eq!(names(dir.path()), ["out"]);
    std::fs::remove_file(out.join("keep.txt")).unwrap();
    tlio()
        .args(["st", "convert"])
        .arg(model("llama-sharded"))
        .arg(&out)
        .args(["--dtype", "F16", "--jobs", "1"])
        .assert()
        .success();
    tlio().args(["st", "verify"]).arg(&out).assert().success();
    // An index argument writes a directory too, with the index under its own name.
    let idx = dir.path().join("from-index");
    tlio()
        .args(["st", "convert"])
        .arg(model("index-variants/good.index.json"))
        .arg(&idx)
        .args(["--dtype", "BF16"])
        .assert()
        .success();
    assert!(idx.join("good.index.json").is_file());
    tlio()
        .args(["st", "diff"])
        .arg(idx.join("good.index.json"))
        .arg(dir.path().join("out"))
        .assert()
        .code(1);
}

#[test]
fn f8_saturate_clamps_and_the_default_refuses() {
    let dir = tmp();
    let src = dir.path().join("big.safetensors");
    let mut data = Vec::new();
    for v in [1.0f32, 500.0, -1e30, f32::NAN] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    let json = r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(json.as_bytes());
    file.extend_from_slice(&data);
    std::fs::write(&src, file).unwrap();
    let out = dir.path().join("o.safetensors");
    tlio()
        .args(["st", "convert"])
        .arg(&src)
        .arg(&out)
        .args(["--dtype", "F8_E4M3"])
        .assert()
        .code(1);
    assert!(!out.exists());
    tlio()
        .args(["st", "convert"])
        .arg(&src)
        .arg(&out)
        .args(["--dtype", "F8_E4M3", "--saturate"])
        .assert()
        .success();
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(&bytes[bytes.len() - 4..], &[0x38, 0x7E, 0xFE, 0x7F]);
}

#[test]
fn quantize_usage_errors() {
    let dir = tmp();
    let out = dir.path().join("q");
    tlio()
        .args(["st", "quantize"])
        .arg(model("llama-sharded"))
        .arg(&out)
        .assert()
        .code(2);
    tlio()
        .args(["st", "quantize"])
        .arg(model("llama-sharded"))
        .arg(&out)
        .args(["--int4", "--group", "5"])
        .assert()
        .code(2);
    // A group that does not divide the columns names the tensor (exit 1).
    let err = tlio()
        .args(["st", "quantize"])
        .arg(model("llama-sharded"))
        .arg(&out)
        .args(["--int4", "--group", "64"])
        .assert()
        .code(1)
        .get_output()
        .stderr
        .clone();
    assert!(String::from_utf8(err)
        .unwrap()
        .contains("columns are not a multiple of the group size 64"));
    assert!(names(dir.path()).is_empty());
}

#[test]
fn directory_outputs_create_parents_and_never_land_inside_the_input() {
    let dir = tmp();
    let d = dir.path();
    tlio()
        .current_dir(d)
        .args(["-q", "st", "convert"])
        .arg(model("llama-sharded"))
        .args(["-o", "a/b/bf16", "--dtype", "bf16"])
        .assert()
        .success();
    assert_eq!(names(&d.join("a/b/bf16")), names(&model("llama-sharded")));
    // A copy of the model, so that a wrong answer could not touch the fixtures.
    let input = d.join("in");
    std::fs::create_dir(&input).unwrap();
    for n in names(&model("llama-sharded")) {
        std::fs::copy(model("llama-sharded").join(&n), input.join(&n)).unwrap();
    }
    let before = names(&input);
    for out in ["in/new/deep", "in/x"] {
        let assert = tlio()
            .current_dir(d)
            .args(["st", "convert", "in", "-o", out, "--dtype", "bf16"])
            .assert()
            .code(2);
        let err = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
        assert!(err.contains("inside the input"), "{err}");
        assert_eq!(names(&input), before, "{out}: the input directory changed");
    }
}

#[test]
fn an_interrupted_directory_conversion_leaves_nothing() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    for (sig, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let dir = tmp();
        let d = dir.path();
        // The conversion pauses with every file in its temporary directory.
        let child = Command::new(assert_cmd::cargo::cargo_bin("tlio"))
            .current_dir(d)
            .env("FAILPOINTS", "model/before-commit=sleep(20000)")
            .args(["-q", "st", "convert"])
            .arg(model("llama-sharded"))
            .args(["-o", "out", "--dtype", "bf16"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let temp_holds_index = || {
            std::fs::read_dir(d).unwrap().any(|e| {
                e.unwrap()
                    .path()
                    .join("model.safetensors.index.json")
                    .exists()
            })
        };
        while !temp_holds_index() {
            assert!(start.elapsed() < Duration::from_secs(30), "never paused");
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: signalling our own child process by its id.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        let out = child.wait_with_output().unwrap();
        crate::errors::assert_one_error_line(&out, code, "interrupted convert");
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the signal ended it"
        );
        assert_eq!(names(d), Vec::<String>::new(), "nothing left behind");
    }
}

/// A weight that cannot be quantized is named by its row and column (an overflowing
/// scale by its row and group) wherever it falls: here past the first chunks of a
/// tensor that spans several, inside one of the pieces quantized in parallel, so the
/// position survives the pipeline; of two, the first is named; nothing is written.
#[test]
fn quantize_names_the_first_bad_weight_of_a_large_tensor_by_row_and_column() {
    use tlio_core::safetensors::{save, Dtype, Tensor, TensorData};
    let (rows, cols) = (40u64, 65_536u64);
    let dir = tmp();
    // A bad weight: its row, its column, its BF16 bits.
    type Bad = (u64, u64, u16);
    // The bad weights of each case and what the message says.
    let cases: [(&[Bad], &str); 4] = [
        (
            &[(33, 1234, 0x7FC0)],
            "row 33, column 1234: the weight NaN is not finite",
        ),
        (
            &[(21, 4097, 0xFF80)],
            "row 21, column 4097: the weight -inf is not finite",
        ),
        // 999424 / 7 is beyond F16's largest finite value.
        (
            &[(38, 650, 0x4974)],
            "row 38, group 20: the scale 999424/7 overflows F16",
        ),
        (
            &[(33, 60_000, 0x7F80), (33, 1234, 0xFFC0), (39, 5, 0x7FC0)],
            "row 33, column 1234: the weight NaN is not finite",
        ),
    ];
    for (k, (bad, says)) in cases.iter().enumerate() {
        let mut raw: Vec<u8> = (0..rows * cols)
            .flat_map(|i| (0x3E00u16 | (i % 251) as u16).to_le_bytes())
            .collect();
        for &(r, c, bits) in *bad {
            let at = ((r * cols + c) * 2) as usize;
            raw[at..at + 2].copy_from_slice(&bits.to_le_bytes());
        }
        let src = dir.path().join(format!("in{k}.safetensors"));
        let t = Tensor {
            name: "model.layers.0.mlp.up_proj.weight".to_string(),
            dtype: Dtype::BF16,
            shape: vec![rows, cols],
            data: TensorData::Raw(raw.into()),
        };
        save(&src, &[t], &Default::default()).unwrap();
        let out = dir.path().join(format!("out{k}.safetensors"));
        let err = tlio()
            .args(["-q", "st", "quantize"])
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .arg("--int4")
            .assert()
            .code(1)
            .get_output()
            .stderr
            .clone();
        let err = String::from_utf8(err).unwrap();
        assert!(err.contains(says), "{err}");
        assert!(!out.exists());
    }
    assert_eq!(names(dir.path()).len(), cases.len());
}

/// Quantize and convert write the same bytes whatever the thread count, and each
/// quantized tensor (several chunks and pieces long, both halves from one pass) holds
/// the scalar rule's scales and nibbles.
#[test]
fn quantize_and_convert_bytes_do_not_depend_on_the_thread_count() {
    use tlio_core::model::int4::{group_scale, quantize_value};
    use tlio_core::safetensors::{save, Dtype, MappedFile, Tensor, TensorData};
    let dir = tmp();
    let (rows, cols) = (40u64, 65_536u64);
    // Ordinary magnitudes, a zero group, ties and tiny values, from a fixed sequence.
    let weight = |i: u64| -> f32 {
        let x = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as f32 / (1u64 << 24) as f32;
        match i % 1000 {
            0..=31 if (i / 1000).is_multiple_of(7) => 0.0,
            _ => (x - 0.5) * 6.0,
        }
    };
    let bf16: Vec<u8> = (0..rows * cols)
        .flat_map(|i| ((weight(i).to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    let f32s: Vec<u8> = (0..24 * cols)
        .flat_map(|i| weight(i + 7).to_le_bytes())
        .collect();
    let src = dir.path().join("in.safetensors");
    let tensors = vec![
        Tensor {
            name: "model.layers.0.mlp.up_proj.weight".to_string(),
            dtype: Dtype::BF16,
            shape: vec![rows, cols],
            data: TensorData::Raw(bf16.clone().into()),
        },
        Tensor {
            name: "model.layers.0.mlp.down_proj.weight".to_string(),
            dtype: Dtype::F32,
            shape: vec![24, cols],
            data: TensorData::Raw(f32s.into()),
        },
        Tensor {
            name: "model.norm.weight".to_string(),
            dtype: Dtype::F32,
            shape: vec![3],
            data: TensorData::Raw(vec![0u8; 12].into()),
        },
    ];
    save(&src, &tensors, &Default::default()).unwrap();
    let run = |op: &[&str], threads: &str| -> Vec<u8> {
        let out = dir.path().join(format!("{}-{threads}.safetensors", op[0]));
        tlio()
            .env("RAYON_NUM_THREADS", threads)
            .args(["-q", "st"])
            .arg(op[0])
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .args(&op[1..])
            .assert()
            .success();
        std::fs::read(&out).unwrap()
    };
    for op in [&["quantize", "--int4"][..], &["convert", "--dtype", "f16"]] {
        let one = run(op, "1");
        for threads in ["2", "3"] {
            assert!(one == run(op, threads), "{op:?} with {threads} threads");
        }
    }
    // The BF16 tensor's halves against the scalar rule, every row.
    let q = MappedFile::open(&dir.path().join("quantize-1.safetensors")).unwrap();
    let name = "model.layers.0.mlp.up_proj.weight";
    let scales = q.tensor_bytes(&format!("{name}.scales")).unwrap();
    let packed = q.tensor_bytes(&format!("{name}.qweight")).unwrap();
    let w: Vec<f32> = bf16
        .chunks_exact(2)
        .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
        .collect();
    for (g, group) in w.chunks_exact(32).enumerate() {
        let s = group_scale(group).unwrap();
        assert_eq!(
            scales[g * 2..g * 2 + 2],
            s.to_le_bytes(),
            "scale of group {g}"
        );
        let mut sf = Vec::new();
        tlio_core::safetensors::float::decode_f32(Dtype::F16, &s.to_le_bytes(), &mut sf);
        let sf = sf[0];
        for (j, pair) in group.chunks_exact(2).enumerate() {
            let lo = quantize_value(pair[0], sf) as u8 & 0x0F;
            let hi = quantize_value(pair[1], sf) as u8 & 0x0F;
            assert_eq!(packed[g * 16 + j], lo | hi << 4, "group {g}, pair {j}");
        }
    }
}

#[test]
fn a_directory_with_both_an_index_and_a_single_file_is_refused_unless_one_is_named() {
    let d = tmp();
    let m = sharded_model(d.path(), "m");
    fs::copy(
        fixture("models/llama-single/model.safetensors"),
        m.join("model.safetensors"),
    )
    .unwrap();
    for cmd in [&["st", "verify"][..], &["st", "inspect"]] {
        let out = tlio().args(cmd).arg(&m).output().unwrap();
        assert_one_error_line(&out, 1, "ambiguous");
        let err = stderr_text(&out);
        assert!(err.contains("model.safetensors.index.json"), "{err}");
        assert!(err.contains("m/model.safetensors)"), "{err}");
    }
    let out = tlio()
        .args(["st", "convert"])
        .arg(&m)
        .arg("-o")
        .arg(d.path().join("o"))
        .args(["--dtype", "bf16"])
        .output()
        .unwrap();
    assert_one_error_line(&out, 1, "ambiguous");
    assert!(!d.path().join("o").exists());
    for pick in ["model.safetensors", "model.safetensors.index.json"] {
        tlio()
            .args(["st", "verify"])
            .arg(m.join(pick))
            .assert()
            .success();
    }
}

/// The int4 fixture with the first scale of `brain.weight` set to `bits`.
pub(crate) fn bad_scale(dir: &Path, bits: u16) -> PathBuf {
    let mut bytes = fs::read(fixture("models/int4/quantized-g8.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let start = header["brain.weight.scales"]["data_offsets"][0]
        .as_u64()
        .unwrap() as usize;
    bytes[8 + n + start..8 + n + start + 2].copy_from_slice(&bits.to_le_bytes());
    let p = dir.join(format!("bad-{bits:04x}.safetensors"));
    fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn every_command_refuses_a_nan_infinite_or_negative_int4_scale() {
    let d = tmp();
    let good = fixture("models/int4/quantized-g8.safetensors");
    // NaN, +inf, -inf, -1.0.
    for bits in [0x7e00u16, 0x7c00, 0xfc00, 0xbc00] {
        let bad = bad_scale(d.path(), bits);
        let out_path = d.path().join(format!("o-{bits:04x}.safetensors"));
        let runs: Vec<Vec<std::ffi::OsString>> = vec![
            vec![
                "st".into(),
                "inspect".into(),
                "--stats".into(),
                bad.clone().into(),
            ],
            vec![
                "st".into(),
                "diff".into(),
                bad.clone().into(),
                good.clone().into(),
            ],
            vec![
                "st".into(),
                "diff".into(),
                good.clone().into(),
                bad.clone().into(),
            ],
            vec![
                "st".into(),
                "convert".into(),
                bad.clone().into(),
                "-o".into(),
                out_path.clone().into(),
                "--dtype".into(),
                "bf16".into(),
            ],
        ];
        for args in runs {
            let out = tlio().args(&args).output().unwrap();
            assert_one_error_line(&out, 1, "brain.weight.scales");
            assert!(stderr_text(&out).contains("finite and >= 0"), "{args:?}");
        }
        assert!(!out_path.exists());
    }
}

#[test]
fn extra_files_with_non_utf8_names_are_copied_and_symlinks_are_not_followed() {
    use std::os::unix::ffi::OsStrExt;
    let d = tmp();
    let m = sharded_model(d.path(), "m");
    let odd = std::ffi::OsStr::from_bytes(b"notes-\xff.txt");
    fs::write(m.join(odd), b"odd name").unwrap();
    let secret = d.path().join("outside.txt");
    fs::write(&secret, b"not part of the model").unwrap();
    std::os::unix::fs::symlink(&secret, m.join("notes.txt")).unwrap();
    let o = d.path().join("o");
    tlio()
        .args(["-q", "st", "convert"])
        .arg(&m)
        .arg("-o")
        .arg(&o)
        .args(["--dtype", "bf16"])
        .assert()
        .success();
    assert_eq!(fs::read(o.join(odd)).unwrap(), b"odd name");
    let link = o.join("notes.txt");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        fs::read_link(&link).unwrap(),
        fs::canonicalize(&secret).unwrap()
    );
}

#[test]
fn a_write_failure_names_the_output_the_user_gave_not_a_temporary_path() {
    let d = tmp();
    let m = sharded_model(d.path(), "m");
    for op in [&["convert", "--dtype", "f64"][..], &["quantize", "--int4"]] {
        let out_dir = d.path().join(format!("out-{}", op[0]));
        let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("tlio"));
        cmd.args(["-q", "st", op[0]])
            .arg(&m)
            .arg("-o")
            .arg(&out_dir)
            .args(&op[1..])
            .env_remove("FAILPOINTS");
        cap_file_size(&mut cmd, 2048);
        let out = cmd.output().unwrap();
        assert_one_error_line(&out, 2, op[0]);
        let err = stderr_text(&out);
        assert!(!err.contains("tlio-tmp"), "{err}");
        let named = format!("cannot write {}/model-0000", out_dir.display());
        assert!(err.contains(&named), "{err}");
        assert!(!out_dir.exists());
    }
}

#[test]
fn verify_lists_the_first_thousand_failures_of_a_file_and_counts_the_rest() {
    let d = tmp();
    let m = sharded_model(d.path(), "m");
    let config = fs::read_to_string(m.join("config.json")).unwrap();
    fs::write(
        m.join("config.json"),
        config.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 2000"),
    )
    .unwrap();
    // 1998 missing layers of 9 tensors each: 17,982 failures, 1,000 listed.
    let out = tlio()
        .args(["--json", "st", "verify"])
        .arg(&m)
        .arg(&m)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr_text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], false);
    let files = doc["files"].as_array().unwrap();
    assert_eq!(files.len(), 2);
    for f in files {
        assert_eq!(f["failures"].as_array().unwrap().len(), 1000);
        assert_eq!(f["more_failures"], 16_982);
    }
    let out = tlio().args(["st", "verify"]).arg(&m).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1001);
    assert!(
        text.lines()
            .last()
            .unwrap()
            .ends_with(": and 16982 more failures (only the first 1000 of a file are listed)"),
        "{text}"
    );
}

#[test]
fn a_json_verify_that_meets_an_unreadable_file_still_prints_a_whole_document() {
    let d = tmp();
    let m = sharded_model(d.path(), "m");
    let out = tlio()
        .args(["--json", "st", "verify"])
        .arg(&m)
        .arg(d.path().join("missing"))
        .output()
        .unwrap();
    assert_one_error_line(&out, 2, "missing");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["files"].as_array().unwrap().len(), 1);
    assert_eq!(doc["files"][0]["ok"], true);
}

#[test]
fn a_config_json_with_a_repeated_key_is_refused_naming_the_key_and_the_file() {
    let d = tmp();
    let m = sharded_model(d.path(), "m");
    let config = fs::read_to_string(m.join("config.json")).unwrap();
    let twice = config.replacen('{', "{\"num_hidden_layers\": 9,", 1);
    assert_ne!(twice, config);
    fs::write(m.join("config.json"), twice).unwrap();
    let out = tlio().args(["st", "verify"]).arg(&m).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        all.contains("config.json") && all.contains("duplicate key \"num_hidden_layers\""),
        "{all}"
    );
    let out = tlio()
        .args(["-q", "st", "convert"])
        .arg(&m)
        .arg("-o")
        .arg(d.path().join("o"))
        .args(["--dtype", "bf16"])
        .output()
        .unwrap();
    assert_one_error_line(&out, 1, "convert of a config with a repeated key");
    assert!(!d.path().join("o").exists());
}

#[test]
fn a_model_named_by_its_index_copies_generation_config_json_as_its_directory_does() {
    let d = tmp();
    let m = sharded_model(d.path(), "m");
    let o = d.path().join("o");
    tlio()
        .args(["-q", "st", "convert"])
        .arg(m.join("model.safetensors.index.json"))
        .arg("-o")
        .arg(&o)
        .args(["--dtype", "bf16"])
        .assert()
        .success();
    assert_eq!(
        fs::read(o.join("generation_config.json")).unwrap(),
        fs::read(m.join("generation_config.json")).unwrap()
    );
}
