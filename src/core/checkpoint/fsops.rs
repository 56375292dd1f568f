//! The one seam through which every file-system effect of a save (and of `gc`) goes:
//! the real implementation evaluates the `ckpt/fsync` and `ckpt/rename` failpoints
//! before every fsync and rename (and `ckpt/remove`, which fails a removal with an
//! error, before every removal); the recording one also keeps the sequence of
//! operations with the bytes written, so a test can replay any crash state.
//!
//! Invariant: the protocol code never calls `std::fs` for an effect directly; what the
//! seam records is exactly what the save did, in order.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Buffer for writing payloads; large so a model file goes out in few system calls.
const WRITE_BUFFER_BYTES: usize = 1 << 20;

/// A payload writer: fills one file through the given sink.
pub type Fill<'a> = dyn FnMut(&mut dyn Write) -> io::Result<()> + 'a;

/// The file-system operations of the save protocol.
pub trait FsOps {
    /// `mkdir -p`: the checkpoint directory itself.
    fn create_dir_all(&mut self, path: &Path) -> io::Result<()>;
    /// Create one directory (its parent must exist).
    fn create_dir(&mut self, path: &Path) -> io::Result<()>;
    /// Create (or truncate) a regular file and fill it; symlinks are not followed.
    fn write_file(&mut self, path: &Path, fill: &mut Fill<'_>) -> io::Result<()>;
    /// Make a file's content durable.
    fn fsync_file(&mut self, path: &Path) -> io::Result<()>;
    /// Make a directory's entries (creations, renames, removals) durable.
    fn fsync_dir(&mut self, path: &Path) -> io::Result<()>;
    /// Atomically rename `from` to `to` (replacing a file at `to`).
    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()>;
    /// Atomically swap two existing entries (used to replace a complete step directory).
    fn exchange(&mut self, a: &Path, b: &Path) -> io::Result<()>;
    /// Remove a directory tree without following symlinks.
    fn remove_dir_all(&mut self, path: &Path) -> io::Result<()>;
    /// Remove one non-directory entry (a file or a symlink).
    fn remove_file(&mut self, path: &Path) -> io::Result<()>;
}

/// Open options that refuse to follow a symlink at the final component and never
/// block in `open` (a FIFO planted in a checkpoint directory would otherwise wait for a
/// writer forever; on a regular file `O_NONBLOCK` changes nothing).
pub(crate) fn no_follow(opts: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    opts
}

/// Check that an opened file is a regular file: `Err(kind)` names what it is instead.
pub(crate) fn check_regular(file: File) -> io::Result<Result<File, &'static str>> {
    let ft = file.metadata()?.file_type();
    Ok(match crate::files::irregular_kind(&ft) {
        None => Ok(file),
        Some(kind) => Err(kind),
    })
}

/// The error for an entry that is not a regular file.
pub(crate) fn not_regular(kind: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("not a regular file but a {kind}"),
    )
}

/// Open (creating it if absent) a lock file for reading and writing, without following a
/// symlink or blocking on a FIFO planted at its name, and only when it is a regular
/// file: a symlink or directory there is named as such rather than as an obscure "too
/// many levels of symbolic links".
pub(crate) fn open_lock_file(path: &Path) -> io::Result<File> {
    let opened = no_follow(
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false),
    )
    .open(path)
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => not_regular("symbolic link"),
        Some(libc::EISDIR) => not_regular("directory"),
        _ => e,
    })?;
    check_regular(opened)?.map_err(not_regular)
}

/// Open a regular file for reading without following a symlink and without blocking;
/// `Err(kind)` inside when the entry is something else (a FIFO, a directory...).
pub fn open_regular(path: &Path) -> io::Result<Result<File, &'static str>> {
    crate::files::open_checked(path, crate::files::Follow::No)
}

/// Open a regular file for reading without following a symlink and without blocking;
/// any other kind of entry is an `InvalidData` error.
pub fn open_no_follow(path: &Path) -> io::Result<File> {
    open_regular(path)?.map_err(not_regular)
}

/// The real file system, with the protocol's failpoints.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

impl FsOps for RealFs {
    fn create_dir_all(&mut self, path: &Path) -> io::Result<()> {
        crate::files::create_dir_all(path)
    }

    fn create_dir(&mut self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)
    }

    fn write_file(&mut self, path: &Path, fill: &mut Fill<'_>) -> io::Result<()> {
        let file =
            no_follow(OpenOptions::new().write(true).create(true).truncate(true)).open(path)?;
        let mut w = BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
        fill(&mut w)?;
        w.flush()
    }

    fn fsync_file(&mut self, path: &Path) -> io::Result<()> {
        fail::fail_point!("ckpt/fsync", |_| std::process::abort());
        open_no_follow(path)?.sync_all()
    }

    fn fsync_dir(&mut self, path: &Path) -> io::Result<()> {
        fail::fail_point!("ckpt/fsync", |_| std::process::abort());
        File::open(path)?.sync_all()
    }

    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        fail::fail_point!("ckpt/rename", |_| std::process::abort());
        fs::rename(from, to)
    }

    fn exchange(&mut self, a: &Path, b: &Path) -> io::Result<()> {
        fail::fail_point!("ckpt/rename", |_| std::process::abort());
        exchange_paths(a, b)
    }

    fn remove_dir_all(&mut self, path: &Path) -> io::Result<()> {
        fail::fail_point!("ckpt/remove", |_| Err(io::Error::other(
            "failpoint ckpt/remove"
        )));
        fs::remove_dir_all(path)
    }

    fn remove_file(&mut self, path: &Path) -> io::Result<()> {
        fail::fail_point!("ckpt/remove", |_| Err(io::Error::other(
            "failpoint ckpt/remove"
        )));
        fs::remove_file(path)
    }
}

#[cfg(target_os = "linux")]
fn exchange_paths(a: &Path, b: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let ca = CString::new(a.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let cb = CString::new(b.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: both pointers are valid NUL-terminated strings that outlive the call;
    // renameat2 only reads them.
    #[allow(unsafe_code, reason = "renameat2 has no safe wrapper in std")]
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Without an atomic exchange, move `b` aside and `a` into place: a crash in between
/// leaves `b`'s name empty, and loading falls back to an older step.
#[cfg(not(target_os = "linux"))]
fn exchange_paths(a: &Path, b: &Path) -> io::Result<()> {
    let mut aside = b.as_os_str().to_owned();
    aside.push(".swap");
    let aside = PathBuf::from(aside);
    fs::rename(b, &aside)?;
    fs::rename(a, b)?;
    fs::rename(&aside, a)
}

/// One recorded operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `create_dir_all`.
    CreateDirAll(PathBuf),
    /// `create_dir`.
    CreateDir(PathBuf),
    /// A file created (or truncated) and filled with these bytes.
    WriteFile {
        /// The path.
        path: PathBuf,
        /// Every byte written.
        data: Vec<u8>,
    },
    /// `fsync` of a file.
    FsyncFile(PathBuf),
    /// `fsync` of a directory.
    FsyncDir(PathBuf),
    /// `rename(from, to)`.
    Rename {
        /// Source.
        from: PathBuf,
        /// Destination.
        to: PathBuf,
    },
    /// Atomic swap of two entries.
    Exchange {
        /// One entry.
        a: PathBuf,
        /// The other.
        b: PathBuf,
    },
    /// A directory tree removed.
    RemoveDirAll(PathBuf),
    /// A file removed.
    RemoveFile(PathBuf),
}

/// The real file system plus a record of every operation, for tests and drills.
#[derive(Debug, Default)]
pub struct RecordingFs {
    inner: RealFs,
    /// The operations in the order they happened.
    pub ops: Vec<Op>,
}

impl RecordingFs {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }
}

/// A sink that forwards to the file and keeps a copy.
struct Tee<'a> {
    out: &'a mut dyn Write,
    copy: &'a mut Vec<u8>,
}

impl Write for Tee<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.copy.extend_from_slice(super::save::written(buf, n)?);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl FsOps for RecordingFs {
    fn create_dir_all(&mut self, path: &Path) -> io::Result<()> {
        self.ops.push(Op::CreateDirAll(path.to_path_buf()));
        self.inner.create_dir_all(path)
    }

    fn create_dir(&mut self, path: &Path) -> io::Result<()> {
        self.ops.push(Op::CreateDir(path.to_path_buf()));
        self.inner.create_dir(path)
    }

    fn write_file(&mut self, path: &Path, fill: &mut Fill<'_>) -> io::Result<()> {
        let mut data = Vec::new();
        let result = self.inner.write_file(path, &mut |w: &mut dyn Write| {
            let mut tee = Tee {
                out: w,
                copy: &mut data,
            };
            fill(&mut tee)
        });
        self.ops.push(Op::WriteFile {
            path: path.to_path_buf(),
            data,
        });
        result
    }

    fn fsync_file(&mut self, path: &Path) -> io::Result<()> {
        self.ops.push(Op::FsyncFile(path.to_path_buf()));
        self.inner.fsync_file(path)
    }

    fn fsync_dir(&mut self, path: &Path) -> io::Result<()> {
        self.ops.push(Op::FsyncDir(path.to_path_buf()));
        self.inner.fsync_dir(path)
    }

    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        self.ops.push(Op::Rename {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
        });
        self.inner.rename(from, to)
    }

    fn exchange(&mut self, a: &Path, b: &Path) -> io::Result<()> {
        self.ops.push(Op::Exchange {
            a: a.to_path_buf(),
            b: b.to_path_buf(),
        });
        self.inner.exchange(a, b)
    }

    fn remove_dir_all(&mut self, path: &Path) -> io::Result<()> {
        self.ops.push(Op::RemoveDirAll(path.to_path_buf()));
        self.inner.remove_dir_all(path)
    }

    fn remove_file(&mut self, path: &Path) -> io::Result<()> {
        self.ops.push(Op::RemoveFile(path.to_path_buf()));
        self.inner.remove_file(path)
    }
}
