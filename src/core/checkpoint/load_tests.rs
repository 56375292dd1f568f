//! Tests of loading what was verified and of what a save may leave behind: a loader
//! racing a saver with `keep`, a config a load would refuse, cleanup that fails after
//! the commit.

use std::borrow::Cow;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::fsops::{Fill, FsOps, RealFs};
use super::tests::request;
use super::verify::MAX_JSON_BYTES;
use super::*;

/// Saves the racing saver makes.
const RACE_SAVES: u64 = 200;

#[test]
fn a_loader_racing_a_saver_with_keep_1_never_fails() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().to_path_buf();
    save(&ck, request(1)).unwrap();
    let done = AtomicBool::new(false);
    let (loads, failures) = std::thread::scope(|s| {
        let saver = s.spawn(|| {
            for step in 2..=RACE_SAVES {
                let mut req = request(step);
                req.keep = Some(1);
                let r = save(&ck, req);
                if r.is_err() {
                    done.store(true, Ordering::SeqCst);
                    return r.map(|_| ());
                }
            }
            done.store(true, Ordering::SeqCst);
            Ok(())
        });
        let (mut loads, mut failures) = (0u64, Vec::new());
        let mut last = 0;
        while !done.load(Ordering::SeqCst) {
            match load(&ck, None) {
                Ok(l) => {
                    // The bytes are the chosen step's own (its model's bias is the step).
                    let bias = l.model().unwrap().decode_f32("bias").unwrap();
                    assert_eq!(bias, [l.step as f32]);
                    assert!(l.step >= last, "steps never go backwards");
                    last = l.step;
                    loads += 1;
                }
                Err(e) => failures.push(crate::failure::full_text(&e)),
            }
        }
        saver.join().unwrap().unwrap();
        (loads, failures)
    });
    assert!(
        failures.is_empty(),
        "{} of {} loads failed: {:?}",
        failures.len(),
        loads + failures.len() as u64,
        failures.first()
    );
    assert!(loads > 0);
}

#[test]
fn a_config_load_would_refuse_is_never_committed() {
    let dir = tempfile::tempdir().unwrap();
    let mut req = request(1);
    req.keep = Some(1);
    save(dir.path(), req).unwrap();
    let big = MAX_JSON_BYTES as usize + 1;
    let mut config = vec![b' '; big];
    config[0] = b'0';
    let mut req = request(2);
    req.keep = Some(1);
    req.config = Some(Cow::Owned(config));
    let err = save(dir.path(), req).unwrap_err();
    let text = crate::failure::full_text(&err);
    assert!(text.contains(&MAX_JSON_BYTES.to_string()), "{text}");
    assert!(!dir.path().join("step-000002").exists());
    assert!(!dir.path().join("step-000002.tmp").exists());
    assert_eq!(load(dir.path(), None).unwrap().step, 1);
}

/// The real file system, except that removing a directory tree deletes one file of it
/// and then fails (a cleanup interrupted half-way).
struct HalfRemove;

impl FsOps for HalfRemove {
    fn create_dir_all(&mut self, p: &Path) -> std::io::Result<()> {
        RealFs.create_dir_all(p)
    }
    fn create_dir(&mut self, p: &Path) -> std::io::Result<()> {
        RealFs.create_dir(p)
    }
    fn write_file(&mut self, p: &Path, fill: &mut Fill<'_>) -> std::io::Result<()> {
        RealFs.write_file(p, fill)
    }
    fn fsync_file(&mut self, p: &Path) -> std::io::Result<()> {
        RealFs.fsync_file(p)
    }
    fn fsync_dir(&mut self, p: &Path) -> std::io::Result<()> {
        RealFs.fsync_dir(p)
    }
    fn rename(&mut self, a: &Path, b: &Path) -> std::io::Result<()> {
        RealFs.rename(a, b)
    }
    fn exchange(&mut self, a: &Path, b: &Path) -> std::io::Result<()> {
        RealFs.exchange(a, b)
    }
    fn remove_dir_all(&mut self, p: &Path) -> std::io::Result<()> {
        fs::remove_file(p.join(MODEL_NAME))?;
        Err(std::io::Error::from_raw_os_error(libc::EACCES))
    }
    fn remove_file(&mut self, p: &Path) -> std::io::Result<()> {
        RealFs.remove_file(p)
    }
}

#[test]
fn a_cleanup_failing_after_the_commit_is_reported_and_finished_by_the_next_save() {
    let dir = tempfile::tempdir().unwrap();
    save(dir.path(), request(1)).unwrap();
    let mut req = request(2);
    req.keep = Some(1);
    let report = save_with(&mut HalfRemove, dir.path(), req).unwrap();
    assert_eq!(report.step, 2);
    assert!(report.removed.is_empty());
    assert_eq!(
        report.cleanup_problems.len(),
        1,
        "{:?}",
        report.cleanup_problems
    );
    assert!(report.cleanup_problems[0].contains("step-000001"));
    // The half-deleted step is never loadable, and blocks nothing.
    assert_eq!(load(dir.path(), None).unwrap().step, 2);
    assert!(!verify(&dir.path().join("step-000001")).is_empty());
    assert!(load(dir.path(), Some(1)).is_err());
    let mut req = request(3);
    req.keep = Some(1);
    let report = save(dir.path(), req).unwrap();
    assert!(report.cleanup_problems.is_empty());
    assert!(!dir.path().join("step-000001").exists());
    assert!(!dir.path().join("step-000002").exists());
    assert_eq!(load(dir.path(), None).unwrap().step, 3);
}
