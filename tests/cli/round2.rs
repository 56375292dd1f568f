//! Reproducers of the second hardening round (issue 21) on model directories and
//! transforms: swept temporary directories, ambiguous directories, int4 scales checked
//! by every command, extra files' names and links, ranges checked when parsing.

use std::fs;
use std::path::{Path, PathBuf};

use crate::errors::assert_one_error_line;
use crate::{cap_file_size, fixture, tlio, tmp};

/// A copy of the sharded llama fixture at `dir/name`.
fn sharded(dir: &Path, name: &str) -> PathBuf {
    let m = dir.join(name);
    fs::create_dir(&m).unwrap();
    for e in fs::read_dir(fixture("models/llama-sharded")).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), m.join(e.file_name())).unwrap();
    }
    m
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_next_write_sweeps_a_dead_process_s_temporary_directory() {
    let d = tmp();
    let m = sharded(d.path(), "m");
    // What a kill -9 of `st convert m -o out` leaves: a directory named for a pid no
    // process can have, holding part of the output; and one of a live process.
    let dead = d.path().join(".out.tlio-tmp-2147483646-abcdef");
    fs::create_dir(&dead).unwrap();
    fs::write(
        dead.join("model-00001-of-00003.safetensors"),
        vec![0u8; 4096],
    )
    .unwrap();
    let live = d
        .path()
        .join(format!(".out.tlio-tmp-{}-abcdef", std::process::id()));
    fs::create_dir(&live).unwrap();
    tlio()
        .args(["-q", "st", "convert"])
        .arg(&m)
        .arg("-o")
        .arg(d.path().join("out2"))
        .args(["--dtype", "bf16"])
        .assert()
        .success();
    assert!(!dead.exists(), "the dead process's directory is swept");
    assert!(live.exists(), "a live process's directory is left alone");
    // The convert's own temporary directory was renamed into place: nothing of it
    // is left, and its name carried the pid (so a kill -9 would be swept in turn).
    let left: Vec<String> = fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tlio"))
        .collect();
    assert_eq!(left, [live.file_name().unwrap().to_string_lossy()]);
}

#[test]
fn a_directory_with_both_an_index_and_a_single_file_is_refused_unless_one_is_named() {
    let d = tmp();
    let m = sharded(d.path(), "m");
    fs::copy(
        fixture("models/llama-single/model.safetensors"),
        m.join("model.safetensors"),
    )
    .unwrap();
    for cmd in [&["st", "verify"][..], &["st", "inspect"]] {
        let out = tlio().args(cmd).arg(&m).output().unwrap();
        assert_one_error_line(&out, 1, "ambiguous");
        let err = stderr(&out);
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
fn bad_scale(dir: &Path, bits: u16) -> PathBuf {
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
            assert!(stderr(&out).contains("finite and >= 0"), "{args:?}");
        }
        assert!(!out_path.exists());
    }
}

#[test]
fn extra_files_with_non_utf8_names_are_copied_and_symlinks_are_not_followed() {
    use std::os::unix::ffi::OsStrExt;
    let d = tmp();
    let m = sharded(d.path(), "m");
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
fn zero_group_and_zero_jobs_are_refused_when_parsing_naming_the_flag() {
    // The input does not exist: a range error must come before any read.
    let missing = "missing.safetensors";
    let cases: [&[&str]; 4] = [
        &[
            "st", "quantize", missing, "-o", "q", "--int4", "--group", "0",
        ],
        &[
            "st", "convert", missing, "-o", "c", "--dtype", "bf16", "--jobs", "0",
        ],
        &[
            "st", "quantize", missing, "-o", "q", "--int4", "--jobs", "0",
        ],
        &["st", "dequantize", missing, "-o", "d", "--jobs", "0"],
    ];
    for args in cases {
        let flag = args[args.len() - 2];
        let out = tlio().args(args).output().unwrap();
        assert_one_error_line(&out, 2, flag);
        assert!(
            !stderr(&out).contains(missing),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn a_write_failure_names_the_output_the_user_gave_not_a_temporary_path() {
    let d = tmp();
    let m = sharded(d.path(), "m");
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
        let err = stderr(&out);
        assert!(!err.contains("tlio-tmp"), "{err}");
        let named = format!("cannot write {}/model-0000", out_dir.display());
        assert!(err.contains(&named), "{err}");
        assert!(!out_dir.exists());
    }
}

#[test]
fn verify_lists_the_first_thousand_failures_of_a_file_and_counts_the_rest() {
    let d = tmp();
    let m = sharded(d.path(), "m");
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
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
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
    let m = sharded(d.path(), "m");
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
