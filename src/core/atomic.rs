//! Atomic file writes: write to a temporary name in the target's directory, fsync,
//! rename over the target, fsync the directory.
//!
//! Invariants: at every instant the target path holds either its old content (or
//! nothing) or the complete new content; on any error, and when the process is
//! interrupted (see [`abandon_all`]), the temporary file is removed. A temporary name is
//! `.NAME.tlio-tmp-PID-XXXXXX`: recognisably tlio's, tied to one target and to the
//! process writing it, so the next write into that directory removes the ones whose
//! process is gone (what a `kill -9` leaves). A target that is a symlink is followed and
//! the file it points to is replaced in its own directory; a device, FIFO, socket or
//! directory is refused, never renamed over. Files are created with mode
//! `0666 & !umask`, like `cp`. No error message names a temporary path.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::failure::{Failure, FailureKind};

/// Write buffer of an atomic file: large so a model file goes out in few system calls.
const WRITE_BUFFER_BYTES: usize = 1 << 20;
/// Symbolic links followed from a target before giving up (the kernel's own limit).
pub const MAX_SYMLINK_HOPS: usize = 40;
/// Bytes of the target's name kept in its temporary name, so the temporary name stays
/// under the 255-byte limit of common file systems.
const MAX_NAME_IN_TEMP: usize = 200;
/// What marks a temporary name as tlio's: `.NAME` + this + `PID-XXXXXX`.
const TEMP_MARK: &str = ".tlio-tmp-";
/// Attempts at a fresh temporary name before giving up.
const TEMP_ATTEMPTS: u32 = 64;

/// Errors of an atomic write.
#[derive(Debug, thiserror::Error)]
pub enum AtomicError {
    /// The temporary file could not be created next to the target.
    #[error("cannot create a temporary file in {}", .dir.display())]
    Create {
        /// The directory the target lives in.
        dir: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The directory the target goes into could not be created.
    #[error("cannot create directory {}", .dir.display())]
    Parent {
        /// The directory.
        dir: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Writing, syncing or renaming failed.
    #[error("cannot write {}", .path.display())]
    Write {
        /// The target path.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The target exists and is not a regular file (a device, FIFO, socket or directory).
    #[error("refusing to write {}: it is a {kind}, not a regular file", .path.display())]
    NotRegular {
        /// The target path as given.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// Following the target's symbolic links did not end.
    #[error("cannot write {}: more than {MAX_SYMLINK_HOPS} levels of symbolic links", .path.display())]
    SymlinkLoop {
        /// The target path as given.
        path: PathBuf,
    },
    /// The target is one of the command's own inputs (same device and inode).
    #[error("refusing to write {}: it is the input {}", .path.display(), .input.display())]
    IsInput {
        /// The target path as given.
        path: PathBuf,
        /// The input it would replace.
        input: PathBuf,
    },
    /// The process is being interrupted by a signal; nothing more is written.
    #[error("cannot write {}: interrupted", .path.display())]
    Interrupted {
        /// The target path as given.
        path: PathBuf,
    },
}

impl Failure for AtomicError {
    fn kind(&self) -> FailureKind {
        FailureKind::Operational
    }
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Fsync a directory so that renames and creations inside it are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What a file-system entry is, for messages; `None` for a regular file.
pub(crate) fn irregular_kind(ft: &fs::FileType) -> Option<&'static str> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return Some("FIFO");
        }
        if ft.is_socket() {
            return Some("socket");
        }
        if ft.is_char_device() {
            return Some("character device");
        }
        if ft.is_block_device() {
            return Some("block device");
        }
    }
    if ft.is_dir() {
        return Some("directory");
    }
    if ft.is_file() {
        None
    } else {
        Some("special file")
    }
}

/// Follow `target`'s symbolic links to the path that will really be replaced, and
/// refuse a target that is not a regular file. Returns the path and whether it exists.
fn resolve(target: &Path) -> Result<(PathBuf, bool), AtomicError> {
    let mut path = target.to_path_buf();
    for _ in 0..MAX_SYMLINK_HOPS {
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((path, false)),
            Err(source) => {
                return Err(AtomicError::Write {
                    path: target.to_path_buf(),
                    source,
                })
            }
            Ok(meta) if meta.file_type().is_symlink() => {
                let link = fs::read_link(&path).map_err(|source| AtomicError::Write {
                    path: target.to_path_buf(),
                    source,
                })?;
                path = if link.is_absolute() {
                    link
                } else {
                    parent_dir(&path).join(link)
                };
            }
            Ok(meta) => {
                if let Some(kind) = irregular_kind(&meta.file_type()) {
                    return Err(AtomicError::NotRegular {
                        path: target.to_path_buf(),
                        kind,
                    });
                }
                return Ok((path, true));
            }
        }
    }
    Err(AtomicError::SymlinkLoop {
        path: target.to_path_buf(),
    })
}

/// Check now what [`AtomicFile::create`] would check later (symlinks resolve, the
/// target is absent or a regular file), so a command can refuse a bad output path
/// before it does any work or prints anything.
pub fn check_target(target: &Path) -> Result<(), AtomicError> {
    resolve(target).map(|_| ())
}

/// Refuse to write `output` when it is the same file (device and inode, so hard links
/// and symlinks count) as one of `inputs`. An output that does not exist yet is fine.
pub fn refuse_inputs(output: &Path, inputs: &[&Path]) -> Result<(), AtomicError> {
    for input in inputs {
        if same_file(output, input) {
            return Err(AtomicError::IsInput {
                path: output.to_path_buf(),
                input: input.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// True when `a` and `b` name the same existing file: same device and inode, after
/// following symlinks.
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) => file_id(&x) == file_id(&y),
        _ => false,
    }
}

#[cfg(unix)]
fn file_id(meta: &fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

#[cfg(not(unix))]
fn file_id(meta: &fs::Metadata) -> (u64, u64) {
    // No inode numbers: fall back to size and modification time, which at least never
    // calls two different existing files the same when they differ in either.
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    (meta.len(), mtime)
}

// ---------------------------------------------------------------------------------
// The registry of live temporary files, so an interrupted process can remove them.

/// One registered temporary entry.
struct Entry {
    id: u64,
    path: PathBuf,
    dir: bool,
}

/// Every temporary file (or directory) this process has created and not yet renamed or
/// removed, and whether the process is going down.
struct Registry {
    dying: bool,
    next: u64,
    entries: Vec<Entry>,
    scanned: BTreeSet<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    dying: false,
    next: 0,
    entries: Vec::new(),
    scanned: BTreeSet::new(),
});

fn registry() -> MutexGuard<'static, Registry> {
    // A panic while holding the lock cannot leave the list inconsistent (every update
    // is one push or one removal), so a poisoned lock is still usable.
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Registry {
    fn add(&mut self, path: PathBuf, dir: bool) -> u64 {
        self.next = self.next.wrapping_add(1);
        let id = self.next;
        self.entries.push(Entry { id, path, dir });
        id
    }

    fn forget(&mut self, id: u64) {
        self.entries.retain(|e| e.id != id);
    }
}

/// Remove every registered temporary file and directory and refuse any new one: called
/// once, by the signal handler thread, right before the process exits. Returns how many
/// entries were removed.
pub fn abandon_all() -> usize {
    let mut reg = registry();
    reg.dying = true;
    let mut removed = 0;
    // Newest first, so the temporary files inside a temporary directory go before it.
    for entry in reg.entries.drain(..).rev() {
        let gone = if entry.dir {
            remove_dir_while_written(&entry.path)
        } else {
            fs::remove_file(&entry.path)
        };
        if gone.is_ok() {
            removed += 1;
        }
    }
    removed
}

/// How often [`abandon_all`] tries to remove a temporary directory that another thread
/// is still writing into.
const ABANDON_DIR_ATTEMPTS: u32 = 50;

/// Remove a directory that the interrupted thread may still be writing into: that
/// thread runs on until the process exits, so a file it creates after `remove_dir_all`
/// listed the directory makes the final rmdir fail (ENOTEMPTY). Removing again, for a
/// bounded number of attempts, wins once the directory is gone, because then nothing
/// can be created in it any more.
fn remove_dir_while_written(path: &Path) -> io::Result<()> {
    let mut last = Ok(());
    for _ in 0..ABANDON_DIR_ATTEMPTS {
        match fs::remove_dir_all(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last = Err(e),
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    last
}

/// A temporary directory removed when dropped and on interruption (see [`abandon_all`]).
#[derive(Debug)]
pub struct TempDir {
    id: u64,
    path: PathBuf,
    live: bool,
}

impl TempDir {
    /// Wrap a directory this process just created (it must not be shared).
    pub fn adopt(path: PathBuf) -> Result<TempDir, AtomicError> {
        let mut reg = registry();
        if reg.dying {
            return Err(AtomicError::Interrupted { path });
        }
        let id = reg.add(path.clone(), true);
        Ok(TempDir {
            id,
            path,
            live: true,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stop tracking the directory without removing it: its contents were renamed
    /// into place under another name, so nothing is left to clean up.
    pub fn release(mut self) {
        self.live = false;
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let mut reg = registry();
        reg.forget(self.id);
        if self.live {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// A registered temporary file: removed on drop unless it was renamed into place.
struct Temp {
    id: u64,
    path: PathBuf,
    live: bool,
}

impl Drop for Temp {
    fn drop(&mut self) {
        if self.live {
            let mut reg = registry();
            reg.forget(self.id);
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// The temporary name for `dest`, with this process's id and a distinguishing number.
fn temp_name(dest: &Path, salt: u64) -> OsString {
    let name = dest.file_name().unwrap_or(OsStr::new("out"));
    let mut bytes = name.as_encoded_bytes();
    if bytes.len() > MAX_NAME_IN_TEMP {
        bytes = bytes.get(..MAX_NAME_IN_TEMP).unwrap_or(bytes);
    }
    let mut out = OsString::from(".");
    out.push(String::from_utf8_lossy(bytes).as_ref());
    out.push(format!(
        "{TEMP_MARK}{}-{:06x}",
        std::process::id(),
        salt & 0xff_ffff
    ));
    out
}

/// The process id in a tlio temporary name, or `None` when `name` is not one.
fn temp_owner(name: &OsStr) -> Option<u32> {
    let text = name.to_str()?;
    if !text.starts_with('.') {
        return None;
    }
    let (_, tail) = text.rsplit_once(TEMP_MARK)?;
    let (pid, salt) = tail.split_once('-')?;
    let salt_ok = salt.len() == 6 && salt.bytes().all(|b| b.is_ascii_hexdigit());
    salt_ok.then(|| pid.parse().ok()).flatten()
}

/// Whether process `pid` still exists (then its temporary files are in use).
fn process_alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        if pid <= 0 {
            return false;
        }
        // SAFETY: kill with signal 0 sends nothing; it only checks that the process
        // exists and may be signalled.
        #[allow(unsafe_code, reason = "libc::kill has no safe wrapper in std")]
        let rc = unsafe { libc::kill(pid, 0) };
        rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// Remove the temporary files that earlier, dead tlio processes left in `dir` (once
/// per directory and process: a pack writing thousands of shards scans once).
fn remove_stale(reg: &mut Registry, dir: &Path) {
    if !reg.scanned.insert(dir.to_path_buf()) {
        return;
    }
    let Ok(listing) = fs::read_dir(dir) else {
        return;
    };
    let me = std::process::id();
    for entry in listing.flatten() {
        let name = entry.file_name();
        let Some(pid) = temp_owner(&name) else {
            continue;
        };
        let regular = entry.file_type().is_ok_and(|t| t.is_file());
        if regular && pid != me && !process_alive(pid) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// A distinguishing number for temporary names: time, a counter and the stack address
/// mixed, so names of concurrent processes rarely collide (a collision only retries).
fn salt(attempt: u32) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut x = u64::from(t) ^ n.rotate_left(24) ^ u64::from(attempt).rotate_left(40);
    // splitmix64 finalizer: spreads the bits over the six hex digits kept.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Create the temporary file for `dest` in `dir` and register it.
fn create_temp(shown: &Path, dest: &Path, dir: &Path) -> Result<(Temp, File), AtomicError> {
    let mut reg = registry();
    if reg.dying {
        return Err(AtomicError::Interrupted {
            path: shown.to_path_buf(),
        });
    }
    remove_stale(&mut reg, dir);
    let mut last = None;
    for attempt in 0..TEMP_ATTEMPTS {
        let path = dir.join(temp_name(dest, salt(attempt)));
        // create_new: O_EXCL, never an existing file or a symlink; mode 0666, which the
        // umask reduces as for any file a user creates.
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => {
                let id = reg.add(path.clone(), false);
                return Ok((
                    Temp {
                        id,
                        path,
                        live: true,
                    },
                    file,
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(source) => {
                return Err(AtomicError::Create {
                    dir: dir.to_path_buf(),
                    source,
                })
            }
        }
    }
    Err(AtomicError::Create {
        dir: dir.to_path_buf(),
        source: last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)),
    })
}

/// A file being written atomically. Write through it (or `writer()`), then `commit()`;
/// dropping it without committing removes the temporary file and leaves the target
/// untouched.
pub struct AtomicFile {
    shown: PathBuf,
    dest: PathBuf,
    dir: PathBuf,
    temp: Temp,
    writer: BufWriter<File>,
}

impl AtomicFile {
    /// Start writing `target`. A symlink is followed (the file it points to is
    /// replaced, in its own directory); a target that exists and is not a regular file
    /// is refused; missing parent directories are created. The temporary file lives in
    /// the same directory as the file replaced, so the final rename never crosses a
    /// file system.
    pub fn create(target: &Path) -> Result<Self, AtomicError> {
        let (dest, exists) = resolve(target)?;
        let dir = parent_dir(&dest);
        if !exists && dest == target && !dir.is_dir() {
            fs::create_dir_all(&dir).map_err(|source| AtomicError::Parent {
                dir: dir.clone(),
                source,
            })?;
            // Make the new directory's own entry durable too.
            let _ = sync_dir(&parent_dir(&dir));
        }
        let (temp, file) = create_temp(target, &dest, &dir)?;
        Ok(AtomicFile {
            shown: target.to_path_buf(),
            dest,
            dir,
            temp,
            writer: BufWriter::with_capacity(WRITE_BUFFER_BYTES, file),
        })
    }

    /// The writer for the content (seekable, for headers patched at the end).
    pub fn writer(&mut self) -> &mut BufWriter<File> {
        &mut self.writer
    }

    /// The path as given.
    pub fn target(&self) -> &Path {
        &self.shown
    }

    /// Flush and fsync the content; the result is renamed into place by
    /// [`Prepared::publish`] (or [`publish_all`]), or removed when dropped.
    pub fn prepare(self) -> Result<Prepared, AtomicError> {
        let shown = self.shown;
        let err = |source| AtomicError::Write {
            path: shown.clone(),
            source,
        };
        let file = self.writer.into_inner().map_err(|e| err(e.into_error()))?;
        file.sync_all().map_err(err)?;
        Ok(Prepared {
            shown,
            dest: self.dest,
            dir: self.dir,
            temp: self.temp,
        })
    }

    /// Flush, fsync, rename over the target and fsync the directory.
    pub fn commit(self) -> Result<(), AtomicError> {
        self.prepare()?.publish()
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.writer.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }
}

impl Seek for AtomicFile {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.writer.seek(pos)
    }
}

/// A complete, fsynced file under its temporary name, waiting to be renamed into place.
pub struct Prepared {
    shown: PathBuf,
    dest: PathBuf,
    dir: PathBuf,
    temp: Temp,
}

impl Prepared {
    /// The path as given.
    pub fn target(&self) -> &Path {
        &self.shown
    }

    /// Rename over the target (without the directory fsync).
    fn rename(&mut self) -> Result<(), AtomicError> {
        let err = |source| AtomicError::Write {
            path: self.shown.clone(),
            source,
        };
        let mut reg = registry();
        if reg.dying {
            return Err(AtomicError::Interrupted {
                path: self.shown.clone(),
            });
        }
        // Checked again right before the rename: something may have appeared at the
        // target since `create` (a FIFO, a directory) that must not be renamed over.
        match fs::symlink_metadata(&self.dest) {
            Ok(meta) => {
                if let Some(kind) = irregular_kind(&meta.file_type()) {
                    if !meta.file_type().is_symlink() {
                        return Err(AtomicError::NotRegular {
                            path: self.shown.clone(),
                            kind,
                        });
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(err(source)),
        }
        fs::rename(&self.temp.path, &self.dest).map_err(err)?;
        reg.forget(self.temp.id);
        self.temp.live = false;
        Ok(())
    }

    /// Rename over the target and fsync its directory.
    pub fn publish(mut self) -> Result<(), AtomicError> {
        self.rename()?;
        sync_dir(&self.dir).map_err(|source| AtomicError::Write {
            path: self.shown.clone(),
            source,
        })
    }
}

/// Rename every prepared file into place, in order, then fsync each directory once.
/// On error the files this call already renamed are removed again (and the rest go
/// with their temporary names), so a failed publish leaves none of them behind.
pub fn publish_all(files: Vec<Prepared>) -> Result<(), AtomicError> {
    let mut done: Vec<(PathBuf, PathBuf)> = Vec::with_capacity(files.len());
    let mut dirs = BTreeSet::new();
    let mut failure = None;
    for mut file in files {
        if failure.is_some() {
            continue;
        }
        match file.rename() {
            Ok(()) => {
                dirs.insert(file.dir.clone());
                done.push((file.dest.clone(), file.shown.clone()));
            }
            Err(e) => failure = Some(e),
        }
    }
    if failure.is_none() {
        for dir in &dirs {
            if let Err(source) = sync_dir(dir) {
                let shown = done.last().map(|(_, s)| s.clone()).unwrap_or_default();
                failure = Some(AtomicError::Write {
                    path: shown,
                    source,
                });
                break;
            }
        }
    }
    match failure {
        None => Ok(()),
        Some(e) => {
            for (dest, _) in &done {
                let _ = fs::remove_file(dest);
            }
            Err(e)
        }
    }
}

/// Write `bytes` to `path` atomically.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), AtomicError> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes).map_err(|source| AtomicError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    file.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn commit_replaces_and_drop_discards() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        write_file(&path, b"one").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"one");
        {
            let mut f = AtomicFile::create(&path).unwrap();
            f.write_all(b"two, never committed").unwrap();
            let temps = names(dir.path());
            assert_eq!(temps.len(), 2);
            assert!(temps[0].starts_with(".out.bin.tlio-tmp-"), "{temps:?}");
        }
        assert_eq!(fs::read(&path).unwrap(), b"one");
        assert_eq!(
            names(dir.path()),
            ["out.bin"],
            "the temporary file is removed"
        );
    }

    #[test]
    fn temp_names_are_tied_to_target_and_process() {
        let name = temp_name(Path::new("d/out.bin"), 0xabc);
        let text = name.to_str().unwrap();
        assert_eq!(
            text,
            format!(".out.bin.tlio-tmp-{}-000abc", std::process::id())
        );
        assert_eq!(temp_owner(&name), Some(std::process::id()));
        assert_eq!(temp_owner(OsStr::new("out.bin")), None);
        assert_eq!(temp_owner(OsStr::new(".x.tlio-tmp-12-zzzzzz")), None);
        let long = "n".repeat(300);
        assert!(temp_name(Path::new(&long), 1).len() < 255);
    }

    #[test]
    fn stale_temps_of_dead_processes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        // A pid that cannot exist (above the kernel's maximum) stands for a dead writer.
        let stale = dir.path().join(".out.bin.tlio-tmp-2147483646-00ff00");
        let alive = dir
            .path()
            .join(format!(".other.tlio-tmp-{}-00ff00", std::process::id()));
        fs::write(&stale, b"left by kill -9").unwrap();
        fs::write(&alive, b"ours").unwrap();
        write_file(&dir.path().join("out.bin"), b"x").unwrap();
        assert!(!stale.exists());
        assert!(alive.exists(), "a live process's temporary file stays");
    }

    #[test]
    fn symlink_target_is_followed_and_replaced_in_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let real_dir = dir.path().join("real");
        fs::create_dir(&real_dir).unwrap();
        let real = real_dir.join("file.bin");
        fs::write(&real, b"old").unwrap();
        let link = dir.path().join("link.bin");
        std::os::unix::fs::symlink("real/file.bin", &link).unwrap();
        write_file(&link, b"new").unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read(&real).unwrap(), b"new");
    }

    #[test]
    fn special_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = write_file(dir.path(), b"x").unwrap_err();
        assert!(matches!(
            err,
            AtomicError::NotRegular {
                kind: "directory",
                ..
            }
        ));
        let err = write_file(Path::new("/dev/null"), b"x").unwrap_err();
        assert!(
            matches!(
                err,
                AtomicError::NotRegular {
                    kind: "character device",
                    ..
                }
            ),
            "{err}"
        );
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        #[allow(unsafe_code, reason = "test set-up: std cannot make a FIFO")]
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
        assert_eq!(rc, 0);
        let err = write_file(&fifo, b"x").unwrap_err();
        assert!(matches!(err, AtomicError::NotRegular { kind: "FIFO", .. }));
        assert!(!err.to_string().contains("tlio-tmp"));
        let looped = dir.path().join("loop");
        std::os::unix::fs::symlink("loop", &looped).unwrap();
        assert!(matches!(
            write_file(&looped, b"x").unwrap_err(),
            AtomicError::SymlinkLoop { .. }
        ));
    }

    #[test]
    fn missing_parents_are_created_and_mode_follows_umask() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/out.bin");
        write_file(&path, b"x").unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        // SAFETY: umask only swaps the process's mask; it is set back at once.
        #[allow(unsafe_code, reason = "test set-up: std cannot read the umask")]
        let mask = unsafe {
            let m = libc::umask(0o022);
            libc::umask(m);
            m
        };
        assert_eq!(mode, 0o666 & !(mask as u32));
    }

    #[test]
    fn inputs_are_compared_by_inode() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.bin");
        fs::write(&input, b"x").unwrap();
        let hard = dir.path().join("hard.bin");
        fs::hard_link(&input, &hard).unwrap();
        assert!(matches!(
            refuse_inputs(&hard, &[&input]),
            Err(AtomicError::IsInput { .. })
        ));
        assert!(refuse_inputs(&dir.path().join("new.bin"), &[&input]).is_ok());
    }

    #[test]
    fn publish_all_renames_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut ready = Vec::new();
        for i in 0..3 {
            let mut f = AtomicFile::create(&dir.path().join(format!("s{i}"))).unwrap();
            f.write_all(b"x").unwrap();
            ready.push(f.prepare().unwrap());
            assert_eq!(
                names(dir.path())
                    .iter()
                    .filter(|n| n.starts_with('s'))
                    .count(),
                0
            );
        }
        publish_all(ready).unwrap();
        assert_eq!(names(dir.path()), ["s0", "s1", "s2"]);
    }
}
