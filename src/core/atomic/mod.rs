//! Atomic file writes: write to a temporary name in the target's directory, fsync,
//! rename over the target, fsync the directory.
//!
//! Invariants: at every instant the target path holds either its old content (or
//! nothing) or the complete new content; on any error, and when the process is
//! interrupted (see [`abandon_all`]), the temporary file is removed. A temporary name is
//! `.NAME.tlio-tmp-PID-XXXXXX`: recognisably tlio's and tied to one target; its writer
//! holds a lock on it while it lives, so the next write into that directory removes the
//! ones nobody holds (what a `kill -9` leaves, on this host or another sharing the
//! directory), never a live writer's. A target that is a symlink is followed and
//! the file it points to is replaced in its own directory; a device, FIFO, socket or
//! directory is refused, never renamed over. New files are created with mode
//! `0666 & !umask`, like `cp`; a replaced file's permission bits are kept, like
//! `sed -i`. No error message names a temporary path.

mod temp;

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::failure::{Failure, FailureKind};
pub use temp::{abandon_all, TempDir};
use temp::{create_temp, registry, Temp};

/// Write buffer of an atomic file: large so a model file goes out in few system calls.
const WRITE_BUFFER_BYTES: usize = 1 << 20;
/// Symbolic links followed from a target before giving up (the kernel's own limit).
pub const MAX_SYMLINK_HOPS: usize = 40;

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
                    source: crate::files::name_non_directory(&path, source),
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
                if let Some(kind) = crate::files::irregular_kind(&meta.file_type()) {
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

/// Give the new file `file` the permission bits of the file it will replace, `dest`, as
/// `sed -i` does: a file the user made read-only (or group-writable) stays so. Only the
/// `rwx` bits are copied, never setuid, setgid or sticky.
#[cfg(unix)]
fn keep_mode(dest: &Path, file: &File) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(dest)?.permissions().mode() & 0o777;
    file.set_permissions(fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn keep_mode(dest: &Path, file: &File) -> io::Result<()> {
    file.set_permissions(fs::metadata(dest)?.permissions())
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
            crate::files::create_dir_all(&dir).map_err(|source| AtomicError::Parent {
                dir: dir.clone(),
                source,
            })?;
            // Make the new directory's own entry durable too.
            let _ = sync_dir(&parent_dir(&dir));
        }
        let (temp, file) = create_temp(target, &dest, &dir)?;
        if exists {
            keep_mode(&dest, &file).map_err(|source| AtomicError::Write {
                path: target.to_path_buf(),
                source,
            })?;
        }
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
                if let Some(kind) = crate::files::irregular_kind(&meta.file_type()) {
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
    use super::temp::{temp_name, temp_owner};
    use super::*;
    use std::ffi::OsStr;

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

    /// Hold the exclusive lock a live writer holds on its temporary entry.
    fn held_by_a_writer(path: &Path) -> File {
        let f = File::open(path).unwrap();
        f.lock().unwrap();
        f
    }

    #[test]
    fn stale_temps_are_judged_by_their_lock_not_their_process_id() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // A writer in another PID namespace or on another host: the pid in its name is
        // dead here (above the kernel's maximum) or belongs to an unrelated process
        // (1), or even to this one; only its lock says whether it is still writing.
        let live_dead_pid = d.join(".out.bin.tlio-tmp-2147483646-00ff00");
        let live_our_pid = d.join(format!(".b.tlio-tmp-{}-00ff01", std::process::id()));
        let live_dir = d.join(".c.tlio-tmp-2147483646-00ff02");
        let stale_alive_pid = d.join(".d.tlio-tmp-1-00ff03");
        let stale_dir = d.join(".e.tlio-tmp-1-00ff04");
        for f in [&live_dead_pid, &live_our_pid, &stale_alive_pid] {
            fs::write(f, b"partial").unwrap();
        }
        for dd in [&live_dir, &stale_dir] {
            fs::create_dir(dd).unwrap();
            fs::write(dd.join("part"), b"partial").unwrap();
        }
        let _held = [
            held_by_a_writer(&live_dead_pid),
            held_by_a_writer(&live_our_pid),
            held_by_a_writer(&live_dir),
        ];
        write_file(&d.join("out.bin"), b"x").unwrap();
        assert!(live_dead_pid.exists(), "a locked temporary file stays");
        assert!(live_our_pid.exists());
        assert!(live_dir.join("part").exists(), "a locked directory stays");
        assert!(
            !stale_alive_pid.exists(),
            "an unlocked one goes, whatever its pid"
        );
        assert!(!stale_dir.exists());
    }

    #[test]
    fn a_writer_holds_the_lock_on_its_temporary_until_the_rename() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = AtomicFile::create(&dir.path().join("out.bin")).unwrap();
        f.write_all(b"data").unwrap();
        let temp = dir.path().join(&names(dir.path())[0]);
        let probe = File::open(&temp).unwrap();
        assert!(probe.try_lock_shared().is_err(), "locked while written");
        let ready = f.prepare().unwrap();
        assert!(probe.try_lock_shared().is_err(), "locked until renamed");
        ready.publish().unwrap();
        assert_eq!(names(dir.path()), ["out.bin"]);
        let t = TempDir::create(&dir.path().join("o"), dir.path()).unwrap();
        let probe = File::open(t.path()).unwrap();
        assert!(
            probe.try_lock_shared().is_err(),
            "a directory is locked too"
        );
        drop(t);
        assert_eq!(names(dir.path()), ["out.bin"]);
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
    fn a_replaced_file_keeps_its_permission_bits() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o444, 0o640, 0o600, 0o664] {
            let path = dir.path().join(format!("out-{mode:o}.bin"));
            fs::write(&path, b"old").unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            write_file(&path, b"new content").unwrap();
            assert_eq!(fs::read(&path).unwrap(), b"new content");
            let now = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
            assert_eq!(now, mode, "{}", path.display());
        }
        // Through a symlink: the file pointed to keeps its bits; setuid is not copied.
        let real = dir.path().join("real.bin");
        fs::write(&real, b"old").unwrap();
        fs::set_permissions(&real, fs::Permissions::from_mode(0o4750)).unwrap();
        let link = dir.path().join("link.bin");
        std::os::unix::fs::symlink("real.bin", &link).unwrap();
        write_file(&link, b"new").unwrap();
        let now = fs::metadata(&real).unwrap().permissions().mode() & 0o7777;
        assert_eq!(now, 0o750);
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
