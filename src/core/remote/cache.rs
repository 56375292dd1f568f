//! The local cache of objects the stream reads (scale.md section 3): a private
//! directory of copies, each used only after it is proven to be the object's bytes.
//!
//! Invariants: the directory holding the copies is created mode 0700 and used only
//! when it is a directory (not a symlink) owned by the user and writable by nobody
//! else, so no other user can plant or swap an entry; a copy is opened without
//! following a symlink and used only when it is a regular file owned by the user, of
//! the object's size, whose digest matches in one streaming pass over it: the sha256 a
//! manifest records, else the blake3 the cache wrote beside the copy when it
//! downloaded it. Anything else is not used (the caller removes it and fetches again).

use std::fs::{File, Metadata};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::files::{open_checked, Follow};

/// The suffix of the file beside a copy that holds the blake3 of its bytes (hex).
pub(crate) const DIGEST_SUFFIX: &str = ".blake3";
/// Bytes read per step while hashing a copy.
const HASH_CHUNK_BYTES: usize = 4 << 20;
/// The mode of a directory the cache creates: the user's alone.
const PRIVATE_DIR_MODE: u32 = 0o700;
/// Mode bits that let others than the owner create, rename or remove entries.
const SHARED_WRITE_BITS: u32 = 0o022;
/// The longest digest file read (64 hex digits and a little slack).
const MAX_DIGEST_FILE_BYTES: u64 = 128;

/// The digest a copy must have to be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expected<'a> {
    /// The sha256 (hex) a pack's manifest records for the object.
    Sha256(&'a str),
    /// The blake3 the cache recorded beside the copy when it wrote it.
    Recorded,
}

/// The effective user id of this process.
#[allow(unsafe_code, reason = "geteuid has no safe wrapper in std")]
fn current_uid() -> u32 {
    // SAFETY: geteuid takes no argument, touches no memory and cannot fail.
    unsafe { libc::geteuid() }
}

/// Why a directory cannot hold the cache (owned by `uid` and nobody else's to write),
/// or `None` when it can.
pub(crate) fn dir_problem(meta: &Metadata, uid: u32) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let rule = "the cache must be a directory of your own that no one else can write (mode 0700)";
    if meta.file_type().is_symlink() {
        Some(format!("{rule}: it is a symlink"))
    } else if !meta.is_dir() {
        Some(format!("{rule}: it is not a directory"))
    } else if meta.uid() != uid {
        Some(format!("{rule}: it is owned by user {}", meta.uid()))
    } else if meta.mode() & SHARED_WRITE_BITS != 0 {
        Some(format!(
            "{rule}: it is mode {:04o}, writable by others",
            meta.mode() & 0o7777
        ))
    } else {
        None
    }
}

/// Create `dir` (and missing parents) mode 0700, then check that it can hold the cache
/// ([`dir_problem`]); a refusal is a `PermissionDenied` error saying the rule.
pub(crate) fn private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    match dir_problem(&meta, current_uid()) {
        None => Ok(()),
        Some(problem) => Err(io::Error::new(io::ErrorKind::PermissionDenied, problem)),
    }
}

/// Whether an opened entry can be a copy of an object of `size` bytes: a regular file
/// (the open did not follow a symlink) owned by `uid`.
pub(crate) fn entry_usable(meta: &Metadata, uid: u32, size: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    meta.is_file() && meta.uid() == uid && meta.len() == size
}

/// The path of the digest file beside `copy`.
fn digest_path(copy: &Path) -> PathBuf {
    let mut name = copy.as_os_str().to_os_string();
    name.push(DIGEST_SUFFIX);
    PathBuf::from(name)
}

/// Open `path` for reading without following a symlink, when it is a regular file
/// owned by the user of `size` bytes (any size when `None`); `None` when it is not.
fn open_own(path: &Path, size: Option<u64>) -> io::Result<Option<File>> {
    let file = match open_checked(path, Follow::No) {
        Ok(Ok(file)) => file,
        Ok(Err(_)) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ELOOP) => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    let size = size.unwrap_or(meta.len());
    Ok(entry_usable(&meta, current_uid(), size).then_some(file))
}

/// Whether the copy at `copy` is an object of `size` bytes whose digest is `expected`;
/// `false` for a missing, planted (symlink, another user's) or edited copy.
pub(crate) fn verified(copy: &Path, size: u64, expected: Expected<'_>) -> io::Result<bool> {
    let Some(mut file) = open_own(copy, Some(size))? else {
        return Ok(false);
    };
    match expected {
        Expected::Sha256(want) => {
            use sha2::{Digest, Sha256};
            let mut h = Sha256::new();
            hash_all(&mut file, &mut |chunk| h.update(chunk))?;
            Ok(crate::digest::hex(&h.finalize()) == want)
        }
        Expected::Recorded => {
            let Some(want) = recorded_digest(copy)? else {
                return Ok(false);
            };
            let mut h = blake3::Hasher::new();
            hash_all(&mut file, &mut |chunk| {
                h.update(chunk);
            })?;
            Ok(h.finalize().to_hex().as_str() == want)
        }
    }
}

/// Feed every byte of `file` to `sink`, in chunks through one buffer.
fn hash_all(file: &mut File, sink: &mut dyn FnMut(&[u8])) -> io::Result<()> {
    let mut buf = vec![0u8; HASH_CHUNK_BYTES];
    loop {
        let got = match file.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        sink(buf.get(..got).unwrap_or(&[]));
    }
}

/// The blake3 the cache recorded beside `copy`, if a sound digest file is there.
fn recorded_digest(copy: &Path) -> io::Result<Option<String>> {
    let Some(file) = open_own(&digest_path(copy), None)? else {
        return Ok(None);
    };
    let mut text = String::new();
    file.take(MAX_DIGEST_FILE_BYTES)
        .read_to_string(&mut text)
        .ok();
    let text = text.trim_end();
    let hex = text.len() == blake3::OUT_LEN * 2 && text.bytes().all(|b| b.is_ascii_hexdigit());
    Ok(hex.then(|| text.to_ascii_lowercase()))
}

/// Record `blake3` (hex) as the digest of the copy about to be put at `copy`: written
/// under a temporary name in `dir`, synced, renamed into place (before the copy is).
pub(crate) fn record(dir: &Path, copy: &Path, blake3: &str) -> io::Result<()> {
    let mut tmp = tempfile::Builder::new()
        .prefix(".partial-")
        .tempfile_in(dir)?;
    tmp.write_all(blake3.as_bytes())?;
    tmp.write_all(b"\n")?;
    tmp.as_file().sync_all()?;
    tmp.persist(digest_path(copy)).map_err(|e| e.error)?;
    Ok(())
}

/// Remove the copy at `copy` and its digest file (a symlink is removed, never its
/// target); missing files are not an error.
pub(crate) fn discard(copy: &Path) {
    std::fs::remove_file(copy).ok();
    std::fs::remove_file(digest_path(copy)).ok();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_private_dir_is_made_0700_and_a_shared_one_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        private_dir(&dir).unwrap();
        for d in [tmp.path().join("a"), dir.clone()] {
            let mode = std::fs::metadata(&d).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", d.display());
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = private_dir(&dir).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(
            err.to_string().contains("mode 0777, writable by others"),
            "{err}"
        );
        // A symlink to a good directory is refused too (it could be swapped).
        let good = tmp.path().join("good");
        private_dir(&good).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let err = private_dir(&link).unwrap_err();
        assert!(err.to_string().contains("it is a symlink"), "{err}");
    }

    #[test]
    fn another_users_dir_or_entry_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let meta = std::fs::symlink_metadata(tmp.path()).unwrap();
        let me = current_uid();
        let other = me.wrapping_add(1);
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let meta_700 = std::fs::symlink_metadata(tmp.path()).unwrap();
        assert_eq!(dir_problem(&meta_700, me), None);
        let problem = dir_problem(&meta, other).unwrap();
        assert!(
            problem.contains(&format!("owned by user {me}")),
            "{problem}"
        );
        let file = tmp.path().join("f");
        std::fs::write(&file, b"abc").unwrap();
        let meta = std::fs::metadata(&file).unwrap();
        assert!(entry_usable(&meta, me, 3));
        assert!(!entry_usable(&meta, other, 3));
        assert!(!entry_usable(&meta, me, 4));
    }

    #[test]
    fn a_copy_is_used_only_with_its_digest_and_never_through_a_symlink() {
        use sha2::{Digest, Sha256};
        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path().join("x.bin");
        std::fs::write(&copy, b"the object").unwrap();
        let sha = crate::digest::hex(&Sha256::digest(b"the object"));
        assert!(verified(&copy, 10, Expected::Sha256(&sha)).unwrap());
        assert!(!verified(&copy, 11, Expected::Sha256(&sha)).unwrap());
        // No digest recorded yet: not used; recorded: used; edited: not used.
        assert!(!verified(&copy, 10, Expected::Recorded).unwrap());
        let b3 = blake3::hash(b"the object").to_hex().to_string();
        record(tmp.path(), &copy, &b3).unwrap();
        assert!(verified(&copy, 10, Expected::Recorded).unwrap());
        std::fs::write(&copy, b"the Object").unwrap();
        assert!(!verified(&copy, 10, Expected::Recorded).unwrap());
        assert!(!verified(&copy, 10, Expected::Sha256(&sha)).unwrap());
        // A symlink to a file with the right bytes is not followed.
        let target = tmp.path().join("target");
        std::fs::write(&target, b"the object").unwrap();
        discard(&copy);
        std::os::unix::fs::symlink(&target, &copy).unwrap();
        assert!(!verified(&copy, 10, Expected::Sha256(&sha)).unwrap());
        discard(&copy);
        assert!(std::fs::symlink_metadata(&copy).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"the object");
    }
}
