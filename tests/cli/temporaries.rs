//! Temporary files and directories of atomic writes: the next write into a directory
//! sweeps what a killed writer left there, and never what a live writer is still
//! writing.

use std::fs;

use super::{sharded_model, tlio, tmp};

#[test]
fn the_next_write_sweeps_a_dead_process_s_temporary_directory() {
    let d = tmp();
    let m = sharded_model(d.path(), "m");
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
