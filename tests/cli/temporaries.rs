//! Temporary files and directories of atomic writes: the next write into a directory
//! sweeps what a killed writer left there, and never what a live writer is still
//! writing. Liveness is the writer's lock on its temporary entry, not the process id in
//! its name: a writer in another PID namespace (a container) or on another host sharing
//! the directory has a pid that means nothing here. A checkpoint's `step-N.tmp` and
//! `LATEST.tmp` follow the same rule through the directory's `.lock`.

use std::fs::{self, File};
use std::path::Path;

use super::{sharded_model, tlio, tmp};

/// What a live writer elsewhere holds on its temporary file or directory.
fn held_by_a_writer(path: &Path) -> File {
    let f = File::open(path).unwrap();
    f.lock().unwrap();
    f
}

#[test]
fn the_next_write_sweeps_a_dead_writer_s_temporary_directory_and_keeps_a_live_one() {
    let d = tmp();
    let m = sharded_model(d.path(), "m");
    // What a kill -9 of `st convert m -o out` leaves: a directory holding part of the
    // output that nobody holds a lock on.
    let dead = d.path().join(".out.tlio-tmp-2147483646-abcdef");
    fs::create_dir(&dead).unwrap();
    fs::write(
        dead.join("model-00001-of-00003.safetensors"),
        vec![0u8; 4096],
    )
    .unwrap();
    // A convert still running in another PID namespace: its pid does not exist here.
    let live = d.path().join(".out.tlio-tmp-2147483645-abcdef");
    fs::create_dir(&live).unwrap();
    let _held = held_by_a_writer(&live);
    tlio()
        .args(["-q", "st", "convert"])
        .arg(&m)
        .arg("-o")
        .arg(d.path().join("out2"))
        .args(["--dtype", "bf16"])
        .assert()
        .success();
    assert!(!dead.exists(), "the dead writer's directory is swept");
    assert!(live.exists(), "a live writer's directory is left alone");
    // The convert's own temporary directory was renamed into place: nothing of it
    // is left.
    let left: Vec<String> = fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tlio"))
        .collect();
    assert_eq!(left, [live.file_name().unwrap().to_string_lossy()]);
}

#[test]
fn the_next_write_removes_unlocked_temporary_files_whatever_their_pid() {
    let dir = tmp();
    let d = dir.path();
    fs::write(d.join("in.txt"), b"hello").unwrap();
    // What a kill -9 of an earlier writer leaves: the target's name and a pid that is
    // dead here, or one that an unrelated live process has here (1).
    let dead_pid = d.join(".out.bin.tlio-tmp-2147483646-abcdef");
    let unrelated_pid = d.join(".out.bin.tlio-tmp-1-abcdef");
    // A live writer on another host or in another PID namespace: its pid is dead
    // here, but it holds its lock.
    let live = d.join(".out.bin.tlio-tmp-2147483645-abcdef");
    for f in [&dead_pid, &unrelated_pid, &live] {
        fs::write(f, vec![0u8; 4096]).unwrap();
    }
    let _held = held_by_a_writer(&live);
    tlio()
        .current_dir(d)
        .args(["-q", "tokens", "pack", "in.txt", "-o", "out.bin"])
        .assert()
        .success();
    assert!(!dead_pid.exists());
    assert!(!unrelated_pid.exists(), "a pid alive here proves nothing");
    assert!(live.exists(), "a locked temporary file is a live writer's");
}

#[test]
fn a_checkpoint_save_in_progress_elsewhere_keeps_its_temporaries() {
    let dir = tmp();
    let ck = dir.path().join("ck");
    fs::create_dir(&ck).unwrap();
    // A save on another host: it holds the directory's lock while its step and
    // LATEST are written under their temporary names.
    let held = tlio_core::checkpoint::DirLock::acquire(&ck).unwrap();
    fs::create_dir(ck.join("step-000009.tmp")).unwrap();
    fs::write(ck.join("step-000009.tmp/model.safetensors"), b"partial").unwrap();
    fs::write(ck.join("LATEST.tmp"), b"step-000009\n").unwrap();
    tlio()
        .args(["ckpt", "gc", "--keep", "1"])
        .arg(&ck)
        .assert()
        .code(2);
    assert!(ck.join("step-000009.tmp/model.safetensors").exists());
    assert!(ck.join("LATEST.tmp").exists());
    // Once the writer is gone, they are stale and gc removes them.
    drop(held);
    tlio()
        .args(["-q", "ckpt", "gc", "--keep", "1"])
        .arg(&ck)
        .assert()
        .success();
    assert!(!ck.join("step-000009.tmp").exists());
    assert!(!ck.join("LATEST.tmp").exists());
}
