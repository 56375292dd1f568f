//! Sharded checkpoint steps through the CLI: `ckpt verify` and `latest` accept them and
//! name a corrupt piece, `st inspect` shows the global tensors, and `ckpt export`
//! consolidates them into a model directory the safetensors crate reads back bit for
//! bit (one file or shards with an index, tied names written once, config copied).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tlio_core::checkpoint::sharded::{
    begin, write_rank_file, ChunkData, ChunkRequest, CommitRequest, Group, TensorRequest,
};
use tlio_core::checkpoint::TrainerState;
use tlio_core::safetensors::Dtype;

use crate::tlio;

/// A 6x4 F32 tensor `w` (rows split over two ranks) and a 4-element `b` on rank 1,
/// with `lm_head.weight` tied to `w`; returns the step directory and `w`'s bytes.
pub(crate) fn sharded_step(dir: &Path, step: u64) -> (PathBuf, Vec<u8>, Vec<u8>) {
    let w: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    let b: Vec<f32> = vec![1.0, -2.0, 0.25, 8.0];
    let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let bb: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut save = begin(dir, step, false).unwrap();
    let tmp = save.tmp_dir().unwrap().to_path_buf();
    let f0 = write_rank_file(
        &tmp,
        "model-rank00000.safetensors",
        &[ChunkData {
            key: "w@0",
            dtype: Dtype::F32,
            shape: &[3, 4],
            data: &wb[..48],
        }],
        true,
    )
    .unwrap();
    let f1 = write_rank_file(
        &tmp,
        "model-rank00001.safetensors",
        &[
            ChunkData {
                key: "w@3",
                dtype: Dtype::F32,
                shape: &[3, 4],
                data: &wb[48..],
            },
            ChunkData {
                key: "b",
                dtype: Dtype::F32,
                shape: &[4],
                data: &bb,
            },
        ],
        true,
    )
    .unwrap();
    let chunk = |o: Vec<u64>, s: Vec<u64>, file: &str, key: &str| ChunkRequest {
        offsets: o,
        sizes: s,
        file: file.into(),
        key: key.into(),
    };
    let tensors = vec![
        TensorRequest {
            group: Group::Model,
            name: "w".into(),
            dtype: Dtype::F32,
            shape: vec![6, 4],
            chunks: vec![
                chunk(vec![0, 0], vec![3, 4], "model-rank00000.safetensors", "w@0"),
                chunk(vec![3, 0], vec![3, 4], "model-rank00001.safetensors", "w@3"),
            ],
        },
        TensorRequest {
            group: Group::Model,
            name: "b".into(),
            dtype: Dtype::F32,
            shape: vec![4],
            chunks: vec![chunk(vec![0], vec![4], "model-rank00001.safetensors", "b")],
        },
    ];
    let meta = BTreeMap::from([(
        Group::Model,
        BTreeMap::from([("tied".to_string(), r#"{"lm_head.weight":"w"}"#.to_string())]),
    )]);
    let report = save
        .commit(CommitRequest {
            files: vec![f0, f1],
            tensors,
            meta,
            state: TrainerState::new(step),
            config: Some(br#"{"n_embd":4}"#.to_vec()),
            keep: None,
        })
        .unwrap();
    (report.path, wb, bb)
}

#[test]
fn ckpt_verify_and_latest_accept_a_sharded_step_and_name_a_corrupt_piece() {
    let dir = tempfile::tempdir().unwrap();
    let (step, _, _) = sharded_step(dir.path(), 7);
    tlio()
        .args(["ckpt", "verify"])
        .arg(dir.path())
        .assert()
        .success();
    let out = tlio()
        .args(["ckpt", "latest"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        step.display().to_string()
    );
    let victim = step.join("model-rank00001.safetensors");
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&victim, &bytes).unwrap();
    let out = tlio().args(["ckpt", "verify"]).arg(&step).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("model-rank00001.safetensors"), "{text}");
}

#[test]
fn st_inspect_shows_the_global_tensors_of_a_sharded_step() {
    let dir = tempfile::tempdir().unwrap();
    let (step, _, _) = sharded_step(dir.path(), 3);
    let out = tlio().args(["st", "inspect"]).arg(&step).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("2 global tensors"), "{text}");
    assert!(
        text.contains("[6, 4]") && text.contains("2 chunks"),
        "{text}"
    );
}

#[test]
fn ckpt_export_consolidates_a_sharded_step_into_a_model_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (step, wb, bb) = sharded_step(dir.path(), 3);
    let out_dir = dir.path().join("hf");
    tlio()
        .args(["ckpt", "export"])
        .arg(&step)
        .arg("-o")
        .arg(&out_dir)
        .assert()
        .success();
    let bytes = std::fs::read(out_dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("w").unwrap().data(), &wb[..]);
    assert_eq!(st.tensor("w").unwrap().shape(), &[6, 4]);
    assert_eq!(st.tensor("b").unwrap().data(), &bb[..]);
    assert!(
        st.tensor("lm_head.weight").is_err(),
        "a tied name is stored once"
    );
    assert_eq!(
        std::fs::read(out_dir.join("config.json")).unwrap(),
        br#"{"n_embd":4}"#
    );
    // In shards of at most 64 bytes: w (96 bytes) alone, then b.
    let sharded = dir.path().join("hf2");
    tlio()
        .args(["ckpt", "export"])
        .arg(&step)
        .arg("-o")
        .arg(&sharded)
        .args(["--max-shard-size", "64"])
        .assert()
        .success();
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(sharded.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(index["weight_map"]["b"], "model-00001-of-00002.safetensors");
    assert_eq!(index["weight_map"]["w"], "model-00002-of-00002.safetensors");
    assert_eq!(index["metadata"]["total_size"], 112);
    // An existing output is refused and left as it is.
    let out = tlio()
        .args(["ckpt", "export"])
        .arg(&step)
        .arg("-o")
        .arg(&out_dir)
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
}

#[test]
fn exported_and_converted_model_directories_follow_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (step, _, _) = sharded_step(dir.path(), 3);
    let model = crate::fixture("models/llama-sharded");
    let exe = assert_cmd::cargo::cargo_bin("tlio");
    for (mask, mode) in [("022", 0o755), ("027", 0o750)] {
        let status = std::process::Command::new("sh")
            .current_dir(dir.path())
            .env_remove("FAILPOINTS")
            .arg("-c")
            .arg(format!(
                "umask {mask} && \"$0\" -q ckpt export \"$1\" -o hf-{mask} && \
                 exec \"$0\" -q st convert \"$2\" conv-{mask} --dtype F16"
            ))
            .arg(&exe)
            .arg(&step)
            .arg(&model)
            .status()
            .unwrap();
        assert!(status.success(), "umask {mask}");
        for out in [format!("hf-{mask}"), format!("conv-{mask}")] {
            let meta = std::fs::metadata(dir.path().join(&out)).unwrap();
            assert_eq!(meta.permissions().mode() & 0o777, mode, "{out}");
        }
    }
}

#[test]
fn ckpt_export_says_what_it_wrote_on_stderr_and_quiet_silences_it() {
    let dir = tempfile::tempdir().unwrap();
    let (step, _, _) = sharded_step(dir.path(), 3);
    let out = tlio()
        .args(["ckpt", "export"])
        .arg(&step)
        .arg("-o")
        .arg(dir.path().join("hf"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exported 2 tensors"), "{err}");
    // The tied name the files lack, and how to put it back before a strict load.
    assert!(
        err.contains("tied, stored once: lm_head.weight = w;")
            && err.contains(r#"state["lm_head.weight"] = state["w"]"#),
        "{err}"
    );
    let out = tlio()
        .args(["-q", "ckpt", "export"])
        .arg(&step)
        .arg("-o")
        .arg(dir.path().join("hf-quiet"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    assert!(dir.path().join("hf-quiet/model.safetensors").is_file());
}

/// A sharded step of one model tensor `w` and its optimizer state `w.exp_avg`, each in
/// a file of its own; returns the step directory.
fn step_with_optimizer(dir: &Path, step: u64) -> PathBuf {
    let w: Vec<u8> = (0..16u8).collect();
    let m: Vec<u8> = (100..116u8).collect();
    let mut save = begin(dir, step, false).unwrap();
    let tmp = save.tmp_dir().unwrap().to_path_buf();
    let file = |name: &str, key: &str, data: &[u8]| {
        write_rank_file(
            &tmp,
            name,
            &[ChunkData {
                key,
                dtype: Dtype::F32,
                shape: &[4],
                data,
            }],
            true,
        )
        .unwrap()
    };
    let f0 = file("model-rank00000.safetensors", "w", &w);
    let f1 = file("optimizer-rank00000.safetensors", "w.exp_avg", &m);
    let tensor = |group, name: &str, file: &str| TensorRequest {
        group,
        name: name.into(),
        dtype: Dtype::F32,
        shape: vec![4],
        chunks: vec![ChunkRequest {
            offsets: vec![0],
            sizes: vec![4],
            file: file.into(),
            key: name.into(),
        }],
    };
    save.commit(CommitRequest {
        files: vec![f0, f1],
        tensors: vec![
            tensor(Group::Model, "w", "model-rank00000.safetensors"),
            tensor(
                Group::Optimizer,
                "w.exp_avg",
                "optimizer-rank00000.safetensors",
            ),
        ],
        meta: BTreeMap::new(),
        state: TrainerState::new(step),
        config: None,
        keep: None,
    })
    .unwrap()
    .path
}

#[test]
fn ckpt_export_refuses_a_step_whose_optimizer_file_does_not_verify() {
    let dir = tempfile::tempdir().unwrap();
    let step = step_with_optimizer(dir.path(), 4);
    tlio()
        .args(["ckpt", "export"])
        .arg(&step)
        .arg("-o")
        .arg(dir.path().join("sound"))
        .assert()
        .success();
    let victim = step.join("optimizer-rank00000.safetensors");
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&victim, &bytes).unwrap();
    let out = tlio()
        .args(["ckpt", "export"])
        .arg(&step)
        .arg("-o")
        .arg(dir.path().join("hf"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not verify") && err.contains("optimizer-rank00000.safetensors"),
        "{err}"
    );
    assert!(!dir.path().join("hf").exists());
}

#[test]
fn ckpt_export_of_a_missing_step_exits_2_naming_the_step() {
    let dir = tempfile::tempdir().unwrap();
    sharded_step(dir.path(), 3);
    let missing = dir.path().join("step-000500");
    let out = tlio()
        .args(["ckpt", "export"])
        .arg(&missing)
        .arg("-o")
        .arg(dir.path().join("hf"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("step-000500") && err.contains("No such file"),
        "{err}"
    );
    assert!(!err.contains("cannot read ."), "{err}");
}
