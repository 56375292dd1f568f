//! Opening inputs and naming what a path is: every input file is opened without
//! blocking and checked to be a regular file; small ones are read up to a named limit;
//! directories are created with a FIFO or file in the way named as what it is.
//!
//! Invariant: a FIFO, device or directory given where a file is expected is refused at
//! once (never waited on, never read forever), a FIFO or file where a directory is
//! expected is named (never the system's bare "File exists"), and no read allocates
//! past its limit.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

/// Open `path` for reading (following symlinks) without blocking in `open`, and refuse
/// anything but a regular file with an `InvalidInput` error naming what it is.
///
/// This is the opening rule of every input file tlio reads (safetensors files and
/// shards, indexes, configs, token shards, cursors, checkpoint inputs): the check is
/// `fstat` on the open descriptor, so no path can be swapped for a FIFO between a check
/// and the open.
pub fn open_regular(path: &Path) -> io::Result<File> {
    open_checked(path, Follow::Yes)?.map_err(not_regular)
}

/// Whether [`open_checked`] follows a symlink at the final component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// Follow it (an input named on the command line, a shard in the Hugging Face cache).
    Yes,
    /// Refuse it (`ELOOP`): an entry inside a checkpoint directory.
    No,
}

/// The opening rule itself: open read-only with `O_NONBLOCK` (a FIFO's `open` would
/// otherwise wait for a writer forever), `fstat` the descriptor, and return `Err(kind)`
/// inside for anything but a regular file. `O_NONBLOCK` is cleared again on a regular
/// file, so later reads keep their ordinary semantics whatever the file system.
pub fn open_checked(path: &Path, follow: Follow) -> io::Result<Result<File, &'static str>> {
    let mut opts = OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let no_follow = if follow == Follow::No {
            libc::O_NOFOLLOW
        } else {
            0
        };
        opts.custom_flags(libc::O_NONBLOCK | no_follow);
    }
    let file = opts.open(path)?;
    if let Some(kind) = irregular_kind(&file.metadata()?.file_type()) {
        return Ok(Err(kind));
    }
    clear_nonblock(&file)?;
    Ok(Ok(file))
}

#[cfg(unix)]
#[allow(unsafe_code, reason = "fcntl(F_SETFL) has no safe wrapper in std")]
fn clear_nonblock(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is an open descriptor owned by `file` for the whole call; F_GETFL and
    // F_SETFL read and set its status flags and touch no memory.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(unix))]
fn clear_nonblock(_file: &File) -> io::Result<()> {
    Ok(())
}

/// True when standard input is closed. The Rust runtime opens `/dev/null` in place of a
/// closed standard descriptor before `main`, so a closed input and `< /dev/null` look
/// the same here: both are the null device, and neither has anything to read.
pub fn stdin_is_closed() -> bool {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let Ok(fd) = io::stdin().as_fd().try_clone_to_owned() else {
            return true;
        };
        let (Ok(ours), Ok(null)) = (File::from(fd).metadata(), std::fs::metadata(NULL_DEVICE))
        else {
            return false;
        };
        ours.file_type().is_char_device() && ours.rdev() == null.rdev()
    }
    #[cfg(not(unix))]
    {
        false
    }
}

/// The null device, which stands in for a closed standard descriptor.
#[cfg(unix)]
const NULL_DEVICE: &str = "/dev/null";

/// The error for reading a closed standard input.
pub fn stdin_closed_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "standard input is closed (or the null device): there is nothing to read",
    )
}

/// `fs::create_dir_all`, except that a path (or a parent of it) that exists but is not a
/// directory is named with what it is ("not a directory but a FIFO"), where the system
/// only says "File exists" and leaves the user to guess which component is wrong.
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    std::fs::create_dir_all(path).map_err(|e| match e.kind() {
        // mkdir of a path that is a FIFO or file fails with EEXIST.
        io::ErrorKind::AlreadyExists => not_a_directory(path).unwrap_or(e),
        _ => name_non_directory(path, e),
    })
}

/// `err`, from an operation on `path`, with the component of `path` that exists but is
/// not a directory named as what it is, when that is the failure (`ENOTDIR`): the
/// system's text names no component. Other errors (an `EEXIST` of a file created
/// exclusively among them) are returned as they are.
pub fn name_non_directory(path: &Path, err: io::Error) -> io::Error {
    match err.kind() {
        io::ErrorKind::NotADirectory => not_a_directory(path).unwrap_or(err),
        _ => err,
    }
}

/// The error for the nearest existing component of `path` when it is not a directory,
/// or `None` when that component is a directory (the failure was something else).
fn not_a_directory(path: &Path) -> Option<io::Error> {
    let existing = path
        .ancestors()
        .filter(|p| !p.as_os_str().is_empty())
        .find_map(|p| std::fs::metadata(p).ok().map(|m| (p, m)))?;
    let (at, meta) = existing;
    if meta.is_dir() {
        return None;
    }
    let kind = kind_name(&meta.file_type());
    let message = if at == path {
        format!("not a directory but a {kind}")
    } else {
        format!("{} is not a directory but a {kind}", at.display())
    };
    Some(io::Error::new(io::ErrorKind::NotADirectory, message))
}

/// What a file-system entry is, for messages; `None` for a regular file.
pub(crate) fn irregular_kind(ft: &std::fs::FileType) -> Option<&'static str> {
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

/// What a file of type `ft` is, for a message: "FIFO", "directory", "regular file".
pub fn kind_name(ft: &std::fs::FileType) -> &'static str {
    irregular_kind(ft).unwrap_or("regular file")
}

/// The error for an input that is not a regular file.
fn not_regular(kind: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file but a {kind}"),
    )
}

/// Read all of the regular file `path`, refusing one larger than `limit` bytes (an
/// `InvalidData` error) before reading more than `limit + 1` bytes of it.
pub fn read_limited(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let size = file.metadata()?.len();
    if size > limit {
        return Err(too_large(limit));
    }
    let mut bytes = Vec::new();
    // The size may change under us: the bound holds whatever the file does.
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(limit));
    }
    Ok(bytes)
}

fn too_large(limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("larger than the limit of {limit} bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_kinds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"12345").unwrap();
        assert_eq!(read_limited(&p, 5).unwrap(), b"12345");
        assert_eq!(
            read_limited(&p, 4).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        assert_eq!(
            read_limited(dir.path(), 4).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_where_a_directory_is_expected_is_named_not_file_exists() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("run");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let err = create_dir_all(&fifo).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotADirectory);
        assert_eq!(err.to_string(), "not a directory but a FIFO");
        let err = create_dir_all(&fifo.join("a/b")).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{} is not a directory but a FIFO", fifo.display())
        );
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        let err = create_dir_all(&file).unwrap_err();
        assert_eq!(err.to_string(), "not a directory but a regular file");
        create_dir_all(&dir.path().join("x/y")).unwrap();
        assert!(dir.path().join("x/y").is_dir());
    }
}
