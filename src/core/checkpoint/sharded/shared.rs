//! The check that every rank of a sharded save sees the directory rank 0 writes in. A
//! multi-host job whose checkpoint directory is local to each host (node-local disk, a
//! tmpfs, a path that only looks the same everywhere) would otherwise write each host's
//! files where rank 0 never sees them. At `begin` rank 0 puts a probe file holding a
//! token unique to the save into `step-N.tmp/`; before writing anything every rank
//! reads it back with [`check_shared`], so such a save fails at once, on every rank,
//! with an error naming the directory as not shared, and nothing is committed.
//!
//! Invariants: the probe is written before any rank's file and removed by the commit
//! before the step's files are listed, so no committed step holds it; the token is
//! unique per save (a stale `step-N.tmp/` of the same name on another host holds
//! another token, or none) and never enters anything compared byte for byte.

use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use super::{io_at, ShardedError};
use crate::checkpoint::fsops::{no_follow, open_no_follow};

/// The probe's name inside `step-N.tmp/`.
pub const PROBE_NAME: &str = ".shared-probe";
/// Most bytes of a probe read back: the token and a little more, so a file of another
/// kind at its name is recognised without reading it whole.
const MAX_PROBE_BYTES: u64 = 256;

/// A token no other save draws: a digest of the process, the thread, the clock, a
/// counter and the tmp directory.
fn new_token(tmp: &Path) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    h.update(format!("{:?}", std::thread::current().id()).as_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.update(&now.as_nanos().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update(tmp.as_os_str().as_encoded_bytes());
    crate::digest::hex(&h.finalize().as_bytes()[..16])
}

/// Write the probe of a fresh `tmp` (rank 0, at `begin`); returns its token. Not
/// fsynced: it only has to be visible to the other ranks while the save runs.
pub(crate) fn write_probe(tmp: &Path) -> Result<String, ShardedError> {
    let token = new_token(tmp);
    let path = tmp.join(PROBE_NAME);
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true);
    no_follow(&mut opts);
    let mut file = opts.open(&path).map_err(io_at(&path))?;
    file.write_all(token.as_bytes()).map_err(io_at(&path))?;
    Ok(token)
}

/// Remove the probe (the commit, before it lists the step's files). A probe already
/// gone is no error: nothing of the step depends on it.
pub(crate) fn remove_probe(tmp: &Path) -> Result<(), ShardedError> {
    let path = tmp.join(PROBE_NAME);
    match fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_at(&path)(e)),
        _ => Ok(()),
    }
}

/// The error of a rank that does not see rank 0's `tmp`: it names the checkpoint
/// directory (the parent of `tmp`).
fn not_shared(tmp: &Path, seen: String) -> ShardedError {
    ShardedError::NotShared {
        dir: tmp
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(tmp)),
        seen,
    }
}

/// Check, on any rank, that `tmp` is the directory rank 0 created for the save whose
/// probe holds `token`: the same directory, not one of this host's own.
pub fn check_shared(tmp: &Path, token: &str) -> Result<(), ShardedError> {
    let path = tmp.join(PROBE_NAME);
    let name = tmp
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut file = match open_no_follow(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let seen = if fs::symlink_metadata(tmp).is_ok() {
                format!("its {name}/ here holds no {PROBE_NAME} of rank 0's")
            } else {
                format!("rank 0 created {name}/ in it, which does not exist here")
            };
            return Err(not_shared(tmp, seen));
        }
        Err(e) => return Err(io_at(&path)(e)),
    };
    let mut text = Vec::new();
    (&mut file)
        .take(MAX_PROBE_BYTES)
        .read_to_end(&mut text)
        .map_err(io_at(&path))?;
    if text != token.as_bytes() {
        return Err(not_shared(
            tmp,
            format!("its {name}/{PROBE_NAME} here is another save's, not rank 0's"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_rank_0_wrote_in_passes() {
        let d = tempfile::tempdir().unwrap();
        let tmp = d.path().join("step-000001.tmp");
        fs::create_dir(&tmp).unwrap();
        let token = write_probe(&tmp).unwrap();
        assert_eq!(token.len(), 32);
        check_shared(&tmp, &token).unwrap();
        remove_probe(&tmp).unwrap();
        remove_probe(&tmp).unwrap();
        assert_eq!(fs::read_dir(&tmp).unwrap().count(), 0);
    }

    #[test]
    fn a_directory_of_another_host_is_not_shared_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let tmp = d.path().join("step-000001.tmp");
        // Missing here: rank 0's host created it, this one never saw it.
        let e = check_shared(&tmp, "0123").unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{} is not shared", d.path().display())),
            "{e}"
        );
        assert!(
            e.contains("step-000001.tmp/, which does not exist here"),
            "{e}"
        );
        // A directory of this host's own by the same name: empty, or another save's.
        fs::create_dir(&tmp).unwrap();
        let e = check_shared(&tmp, "0123").unwrap_err().to_string();
        assert!(e.contains("holds no .shared-probe"), "{e}");
        let other = write_probe(&tmp).unwrap();
        let token = new_token(&tmp);
        assert_ne!(other, token);
        let e = check_shared(&tmp, &token).unwrap_err().to_string();
        assert!(e.contains("another save's"), "{e}");
        assert!(e.contains("s3://"), "{e}");
    }
}
