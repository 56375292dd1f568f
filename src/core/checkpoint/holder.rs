//! Who holds a lock file: a process that has just taken a lock (a checkpoint
//! directory's `.lock`, a run's `.train.lock`) writes its pid and host into the file, and
//! one refused the lock reads them back, so the refusal names the live holder.
//!
//! Invariants: the record is information only. Whether a lock is held is decided by the
//! OS lock alone, which the kernel releases when its process ends however it ends; a
//! record left by a dead process is never read as a holder, because a refusal only
//! happens while a live process holds the lock, and the next taker replaces the record.
//! Writing the record is best effort (a full disk must not fail a save that holds its
//! lock), and reading it is bounded ([`RECORD_LIMIT`]) and never trusted beyond its
//! checked fields.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;

use serde::{Deserialize, Serialize};

/// The most bytes of a lock file read back as its holder's record.
pub const RECORD_LIMIT: u64 = 4096;
/// The longest host name a record may carry (POSIX `HOST_NAME_MAX` is 255).
const HOST_LIMIT: usize = 255;
/// Where Linux exposes the host name `gethostname` returns (the UTS namespace's).
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";

/// The process a lock file's record names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Its process id.
    pub pid: u32,
    /// The host it runs on.
    pub host: String,
}

impl Holder {
    /// This process on this host.
    pub fn this_process() -> Self {
        Holder {
            pid: std::process::id(),
            host: host_name(),
        }
    }
}

/// The holder of a lock as a refusal names it: the record read back, or `None` when the
/// file holds none (a holder that has not written it yet, an older tlio, another tool).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldBy(pub Option<Holder>);

impl fmt::Display for HeldBy {
    /// ` (pid N on host H)`, or nothing when the holder is unknown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(h) => write!(f, " (pid {} on host {})", h.pid, h.host),
            None => Ok(()),
        }
    }
}

/// This host's name, or `unknown` when the system does not say.
fn host_name() -> String {
    let name = std::fs::read_to_string(HOSTNAME_FILE).unwrap_or_default();
    let name = name.trim();
    if name.is_empty() || name.len() > HOST_LIMIT {
        return "unknown".to_owned();
    }
    name.to_owned()
}

/// Replace the record in `file` (just locked by this process) with this process's.
/// Best effort: a lock is held whether or not its record could be written.
pub(crate) fn record(file: &File) {
    let Ok(mut text) = serde_json::to_string(&Holder::this_process()) else {
        return;
    };
    text.push('\n');
    // Truncate first: a longer record of an earlier holder must not leave a tail.
    if file.set_len(0).is_ok() {
        let _ = file.write_all_at(text.as_bytes(), 0);
    }
}

/// The holder `file` (a lock file someone else holds) records, if it records one.
pub(crate) fn read(file: &File) -> HeldBy {
    let mut bytes = Vec::new();
    let mut reader = ReadAt { file, at: 0 }.take(RECORD_LIMIT);
    if reader.read_to_end(&mut bytes).is_err() {
        return HeldBy(None);
    }
    let holder = serde_json::from_slice::<Holder>(&bytes)
        .ok()
        .filter(|h| !h.host.is_empty() && h.host.len() <= HOST_LIMIT)
        .filter(|h| !h.host.chars().any(char::is_control));
    HeldBy(holder)
}

/// Reads `file` from offset `at` on without moving its cursor.
struct ReadAt<'a> {
    file: &'a File,
    at: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at = self.at.saturating_add(n as u64);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_this_process_and_garbage_as_no_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        // A longer earlier record leaves no tail.
        std::fs::write(
            &path,
            format!("{{\"pid\":1,\"host\":\"{}\"}}", "h".repeat(200)),
        )
        .unwrap();
        record(&file);
        let held = read(&file);
        assert_eq!(held, HeldBy(Some(Holder::this_process())));
        let text = held.to_string();
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        // A second taker in this process is refused, naming this process.
        let dir2 = tempfile::tempdir().unwrap();
        let _held = super::super::DirLock::acquire(dir2.path()).unwrap();
        let refused = super::super::DirLock::acquire(dir2.path()).unwrap_err();
        let named = format!("(pid {} on host {})", std::process::id(), host_name());
        assert!(refused.to_string().contains(&named), "{refused}");
        for bad in [
            "",
            "not json",
            "{\"pid\":-1,\"host\":\"h\"}",
            "{\"pid\":1,\"host\":\"a\\nb\"}",
        ] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(read(&file), HeldBy(None), "{bad}");
            assert_eq!(HeldBy(None).to_string(), "");
        }
    }
}
