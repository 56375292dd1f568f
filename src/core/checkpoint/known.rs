//! What this process already knows verifies: the step directories `keep` counts, so that
//! every save does not re-read and re-hash gigabytes of older steps it checked before.
//!
//! Invariants: a step is remembered only after a complete verification found no
//! problem, together with the identity (device, inode, size, mode, mtime and ctime in
//! nanoseconds) of the directory and of every entry in it, taken before and after the
//! verification and equal both times. It counts as verified again without being read
//! only while all of those are unchanged: a write, truncation, chmod, rename, replaced
//! file or added or removed entry changes an inode, a size or a ctime, which the
//! process cannot set. Identities whose ctime was still within one timestamp tick of
//! the moment they were taken are never remembered ("racy", as git calls it): a change
//! in that same tick could leave the ctime equal. So the step a save has just written
//! is read once more, by a later save, before it is trusted. The memory is bounded
//! ([`MAX_REMEMBERED`] steps, [`MAX_ENTRIES`] entries each).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::verify::inspect;

/// Steps remembered at most (a run keeps a handful; a process touching many
/// checkpoint directories forgets the oldest entries first).
pub const MAX_REMEMBERED: usize = 256;
/// Entries of a step directory beyond which it is verified each time instead.
pub const MAX_ENTRIES: usize = 4096;
/// How recent a ctime may be, on a file system with sub-second timestamps, and still
/// be changed again without the ctime moving (the kernel's coarse clock ticks at least
/// every 10 ms; the margin is generous).
const RACY_FINE: Duration = Duration::from_millis(50);
/// The same for a file system with whole-second timestamps (a ctime whose nanoseconds
/// are 0): FAT keeps 2 s, ext4 with small inodes 1 s.
const RACY_COARSE: Duration = Duration::from_secs(3);

/// What identifies one file system object's content and metadata for this purpose.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Id {
    dev: u64,
    ino: u64,
    size: u64,
    mode: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

#[cfg(unix)]
fn id(meta: &fs::Metadata) -> Id {
    use std::os::unix::fs::MetadataExt;
    Id {
        dev: meta.dev(),
        ino: meta.ino(),
        size: meta.size(),
        mode: meta.mode(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        ctime: (meta.ctime(), meta.ctime_nsec()),
    }
}

#[cfg(not(unix))]
fn id(_meta: &fs::Metadata) -> Id {
    // No ctime to rely on: never equal to a remembered one, so every step is verified.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    Id {
        dev: 0,
        ino: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        size: 0,
        mode: 0,
        mtime: (0, 0),
        ctime: (0, 0),
    }
}

impl Id {
    /// Whether a change made after `taken` could leave this identity as it is.
    fn racy(&self, taken: SystemTime) -> bool {
        let margin = if self.ctime.1 == 0 {
            RACY_COARSE
        } else {
            RACY_FINE
        };
        let ctime = u64::try_from(self.ctime.0)
            .ok()
            .zip(u32::try_from(self.ctime.1).ok())
            .map(|(s, ns)| UNIX_EPOCH + Duration::new(s, ns));
        match (ctime, taken.checked_sub(margin)) {
            (Some(c), Some(safe_before)) => c >= safe_before,
            _ => true,
        }
    }
}

/// The identities of a step directory and of every entry in it, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    dir: Id,
    entries: Vec<(OsString, Id)>,
}

/// The step directory's snapshot; `None` when anything cannot be looked at (the
/// verification then decides, and nothing is remembered).
fn snapshot(step_dir: &Path) -> Option<Snapshot> {
    let meta = fs::symlink_metadata(step_dir).ok()?;
    if !meta.file_type().is_dir() {
        return None;
    }
    let mut entries = Vec::new();
    for entry in fs::read_dir(step_dir).ok()? {
        let entry = entry.ok()?;
        if entries.len() >= MAX_ENTRIES {
            return None;
        }
        let meta = fs::symlink_metadata(entry.path()).ok()?;
        entries.push((entry.file_name(), id(&meta)));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Some(Snapshot {
        dir: id(&meta),
        entries,
    })
}

impl Snapshot {
    fn racy(&self, taken: SystemTime) -> bool {
        self.dir.racy(taken) || self.entries.iter().any(|(_, i)| i.racy(taken))
    }
}

/// The remembered steps, with a counter giving each its age (the oldest goes first).
#[derive(Default)]
struct Memory {
    steps: HashMap<PathBuf, (u64, Snapshot)>,
    clock: u64,
}

static MEMORY: Mutex<Option<Memory>> = Mutex::new(None);

fn memory() -> MutexGuard<'static, Option<Memory>> {
    // A panic while holding the lock leaves at worst a stale entry, which the identity
    // comparison still guards.
    MEMORY.lock().unwrap_or_else(|p| p.into_inner())
}

fn remembered(step_dir: &Path, now: &Snapshot) -> bool {
    memory()
        .as_ref()
        .and_then(|m| m.steps.get(step_dir))
        .is_some_and(|(_, s)| s == now)
}

fn remember(step_dir: &Path, snap: Snapshot) {
    let mut guard = memory();
    let m = guard.get_or_insert_with(Memory::default);
    m.clock = m.clock.wrapping_add(1);
    if m.steps.len() >= MAX_REMEMBERED && !m.steps.contains_key(step_dir) {
        let oldest = m
            .steps
            .iter()
            .min_by_key(|(_, (age, _))| *age)
            .map(|(p, _)| p.clone());
        if let Some(p) = oldest {
            m.steps.remove(&p);
        }
    }
    let clock = m.clock;
    m.steps.insert(step_dir.to_path_buf(), (clock, snap));
}

fn forget(step_dir: &Path) {
    if let Some(m) = memory().as_mut() {
        m.steps.remove(step_dir);
    }
}

/// Whether `step_dir` verifies (as `verify(step_dir).is_empty()`), without reading it
/// again when this process verified it before and nothing in it changed since.
pub(crate) fn verifies(step_dir: &Path) -> bool {
    let taken = SystemTime::now();
    let before = snapshot(step_dir);
    if let Some(b) = &before {
        if remembered(step_dir, b) {
            return true;
        }
    }
    let ok = inspect(step_dir).problems.is_empty();
    match before {
        Some(b) if ok && !b.racy(taken) && snapshot(step_dir).as_ref() == Some(&b) => {
            remember(step_dir, b);
        }
        _ => forget(step_dir),
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::super::tests::request;
    use super::super::verify::INSPECTIONS;
    use super::super::{save, step_name, MODEL_NAME};
    use super::*;

    /// Longer than [`RACY_FINE`]: what was written before it is no longer racy.
    const PAUSE: Duration = Duration::from_millis(120);

    fn inspections() -> usize {
        INSPECTIONS.with(|n| n.get())
    }

    /// Save `step` with `keep`; returns the step directories it read.
    fn save_counting(dir: &Path, step: u64, keep: usize) -> usize {
        let before = inspections();
        let mut req = request(step);
        req.keep = Some(keep);
        let report = save(dir, req).unwrap();
        assert!(
            report.cleanup_problems.is_empty(),
            "{:?}",
            report.cleanup_problems
        );
        inspections() - before
    }

    fn steps(dir: &Path) -> Vec<u64> {
        let mut out: Vec<u64> = fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| super::super::parse_step_name(e.unwrap().file_name().to_str()?))
            .collect();
        out.sort_unstable();
        out
    }

    #[test]
    fn keep_reads_each_older_step_once_not_on_every_save() {
        let dir = tempfile::tempdir().unwrap();
        let mut reads = Vec::new();
        for step in 1..=8 {
            reads.push(save_counting(dir.path(), step, 4));
            std::thread::sleep(PAUSE);
        }
        // Re-verifying every save would read min(step - 1, 3) older steps each time
        // (0, 1, 2, 3, 3, 3, 3, 3); each step is read once, by the save after it.
        assert_eq!(reads, [0, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(steps(dir.path()), [5, 6, 7, 8]);
    }

    #[test]
    fn a_step_changed_in_place_is_read_again_and_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        for step in 1..=3 {
            save_counting(dir.path(), step, 3);
            std::thread::sleep(PAUSE);
        }
        // Steps 1 and 2 are remembered as verified. One byte of step 2 flips in place,
        // the size unchanged, right away.
        assert_eq!(save_counting(dir.path(), 4, 4), 1);
        let model = dir.path().join(step_name(2)).join(MODEL_NAME);
        let mut bytes = fs::read(&model).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&model, &bytes).unwrap();
        // keep 4 counts 5, 4, 3 and then must not count step 2: step 1 stays.
        let reads = save_counting(dir.path(), 5, 4);
        assert_eq!(steps(dir.path()), [1, 2, 3, 4, 5]);
        // Step 4 (just written by the last save) and the changed step 2 were read.
        assert_eq!(reads, 2);
        // An added file is a change too: step 1, remembered, is read again and fails.
        let one = dir.path().join(step_name(1));
        let before = inspections();
        assert!(verifies(&one));
        assert_eq!(inspections(), before, "remembered, not read");
        fs::write(one.join("extra"), b"x").unwrap();
        assert!(!verifies(&one));
        assert_eq!(inspections(), before + 1);
    }

    fn old_id(ctime_ns: i64) -> Id {
        Id {
            dev: 1,
            ino: 2,
            size: 3,
            mode: 0o100644,
            mtime: (1_000, ctime_ns),
            ctime: (1_000, ctime_ns),
        }
    }

    #[test]
    fn an_identity_is_racy_within_a_tick_of_being_taken() {
        let at = |s: u64, ms: u64| UNIX_EPOCH + Duration::from_secs(s) + Duration::from_millis(ms);
        let fine = old_id(5_000_000); // 1000.005 s
        assert!(fine.racy(at(1_000, 20)));
        assert!(!fine.racy(at(1_000, 60)));
        // Whole-second timestamps: a change up to a few seconds later may keep them.
        let coarse = old_id(0);
        assert!(coarse.racy(at(1_002, 0)));
        assert!(!coarse.racy(at(1_004, 0)));
        // A ctime in the future (a clock stepped back, a server's clock) is racy.
        assert!(fine.racy(at(999, 0)));
    }
}
