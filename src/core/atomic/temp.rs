//! The temporary files and directories of atomic writes: their names, the registry of
//! the live ones (so an interrupted process removes them, see [`abandon_all`]) and the
//! removal of those that dead writers left behind.
//!
//! Invariants: a temporary name is `.NAME.tlio-tmp-PID-XXXXXX`, created with `O_EXCL`
//! (or `mkdir`, for a directory) and registered before it is returned; once
//! [`abandon_all`] ran, no new temporary file or directory is created. Liveness is a
//! lock, never a process id: the writer holds an exclusive `flock` on its temporary
//! file (or directory) from before it is returned until it is renamed or removed, and
//! a sweeper removes an entry only while it holds a shared lock on it. A process id
//! means nothing in another PID namespace or on another host sharing the directory,
//! while the kernel (or the NFS lock manager) drops a lock exactly when its holder dies,
//! wherever it ran. An entry whose lock cannot be tested (a file system without locks)
//! is kept: it might be live.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::AtomicError;

/// Bytes of the target's name kept in its temporary name, so the temporary name stays
/// under the 255-byte limit of common file systems.
const MAX_NAME_IN_TEMP: usize = 200;
/// What marks a temporary name as tlio's: `.NAME` + this + `PID-XXXXXX`.
const TEMP_MARK: &str = ".tlio-tmp-";
/// Attempts at a fresh temporary name before giving up.
const TEMP_ATTEMPTS: u32 = 64;

/// How a fresh temporary entry's lock went.
enum Claim {
    /// This process holds the entry's exclusive lock (or locks are unsupported there,
    /// and the entry is never swept).
    Held(Option<File>),
    /// A sweeper got to the entry between its creation and the lock, and removes it:
    /// try another name.
    Lost,
}

/// Take the exclusive lock that marks a fresh temporary entry at `path` (opened as
/// `handle`) as live, and check that the name still refers to it (a sweeper may have
/// removed it before the lock was taken). Locks that the file system does not support
/// leave the entry unlocked, which every sweeper takes for live.
fn claim(path: &Path, handle: File) -> Claim {
    match handle.try_lock() {
        Ok(()) => {
            if same_entry(path, &handle) {
                Claim::Held(Some(handle))
            } else {
                Claim::Lost
            }
        }
        Err(std::fs::TryLockError::WouldBlock) => Claim::Lost,
        Err(std::fs::TryLockError::Error(_)) => Claim::Held(None),
    }
}

/// Whether `path` (not followed) is the entry `handle` has open: same device and inode.
fn same_entry(path: &Path, handle: &File) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (fs::symlink_metadata(path), handle.metadata()) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = handle;
        fs::symlink_metadata(path).is_ok()
    }
}

/// One registered temporary entry.
struct Entry {
    id: u64,
    path: PathBuf,
    dir: bool,
}

/// Every temporary file (or directory) this process has created and not yet renamed or
/// removed, and whether the process is going down.
pub(super) struct Registry {
    pub(super) dying: bool,
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

pub(super) fn registry() -> MutexGuard<'static, Registry> {
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

    pub(super) fn forget(&mut self, id: u64) {
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
    /// The directory, open: its exclusive lock says to every sweeper that it is live.
    _lock: Option<File>,
}

impl TempDir {
    /// Create and register a temporary directory for `dest` in `dir`, named as
    /// temporary files are (`.NAME.tlio-tmp-PID-XXXXXX`, mode 0700) and locked as
    /// they are, after removing what dead writers left in `dir`: a killed writer's
    /// directory is swept by the next write like its files.
    pub fn create(dest: &Path, dir: &Path) -> Result<TempDir, AtomicError> {
        let mut reg = registry();
        if reg.dying {
            return Err(AtomicError::Interrupted {
                path: dest.to_path_buf(),
            });
        }
        remove_stale(&mut reg, dir);
        let mut last = None;
        for attempt in 0..TEMP_ATTEMPTS {
            let path = dir.join(temp_name(dest, salt(attempt)));
            let mut builder = fs::DirBuilder::new();
            #[cfg(unix)]
            {
                use std::os::unix::fs::DirBuilderExt;
                builder.mode(0o700);
            }
            match builder.create(&path) {
                Ok(()) => {
                    let lock = match File::open(&path).map(|dir| claim(&path, dir)) {
                        Ok(Claim::Held(lock)) => lock,
                        // Removed by a sweeper before the lock: a new name.
                        Ok(Claim::Lost) => continue,
                        // Cannot open what was just made: left unlocked, so kept.
                        Err(_) => None,
                    };
                    let id = reg.add(path.clone(), true);
                    return Ok(TempDir {
                        id,
                        path,
                        live: true,
                        _lock: lock,
                    });
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
            _lock: None,
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
pub(super) struct Temp {
    pub(super) id: u64,
    pub(super) path: PathBuf,
    pub(super) live: bool,
    /// A second descriptor of the file's open description, which holds its exclusive
    /// lock until the file is renamed into place (or removed), however long the
    /// content's own descriptor lives.
    _lock: Option<File>,
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
pub(super) fn temp_name(dest: &Path, salt: u64) -> OsString {
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
pub(super) fn temp_owner(name: &OsStr) -> Option<u32> {
    let text = name.to_str()?;
    if !text.starts_with('.') {
        return None;
    }
    let (_, tail) = text.rsplit_once(TEMP_MARK)?;
    let (pid, salt) = tail.split_once('-')?;
    let salt_ok = salt.len() == 6 && salt.bytes().all(|b| b.is_ascii_hexdigit());
    salt_ok.then(|| pid.parse().ok()).flatten()
}

/// Remove the temporary files and directories that dead writers left in `dir` (once
/// per directory and process: a pack writing thousands of shards scans once). An entry
/// is dead when a shared lock on it can be taken: its writer, on whatever host or in
/// whatever PID namespace, held the exclusive lock for as long as it lived. A directory
/// is removed with its contents; `remove_dir_all` never follows a symlink inside it.
fn remove_stale(reg: &mut Registry, dir: &Path) {
    if !reg.scanned.insert(dir.to_path_buf()) {
        return;
    }
    let Ok(listing) = fs::read_dir(dir) else {
        return;
    };
    for entry in listing.flatten() {
        if temp_owner(&entry.file_name()).is_none() {
            continue;
        }
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if !(kind.is_file() || kind.is_dir()) {
            continue;
        }
        let path = entry.path();
        let Ok(handle) = open_entry(&path) else {
            continue;
        };
        // Held shared while removing, so a writer that created the name a moment ago
        // and has not locked it yet fails to lock it and takes another name.
        if handle.try_lock_shared().is_err() || !same_entry(&path, &handle) {
            continue;
        }
        let _ = if kind.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
    }
}

/// Open a stale candidate for its lock: read-only (what a shared lock needs, over NFS
/// too), never following a symlink, never blocking on a FIFO.
fn open_entry(path: &Path) -> io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    opts.open(path)
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
pub(super) fn create_temp(
    shown: &Path,
    dest: &Path,
    dir: &Path,
) -> Result<(Temp, File), AtomicError> {
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
        // umask reduces as for any file a user creates. Read and write, so that the
        // exclusive lock works over NFS too (it becomes a write lock there).
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path);
        match opened {
            Ok(file) => {
                let lock = match file.try_clone().map(|dup| claim(&path, dup)) {
                    Ok(Claim::Held(lock)) => lock,
                    // Removed by a sweeper before the lock: a new name.
                    Ok(Claim::Lost) => continue,
                    Err(_) => None,
                };
                let id = reg.add(path.clone(), false);
                return Ok((
                    Temp {
                        id,
                        path,
                        live: true,
                        _lock: lock,
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
