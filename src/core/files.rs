//! Reading small files named on the command line (an index, a cursor, a JSON input):
//! opened without blocking, checked to be regular files, read up to a named limit.
//!
//! Invariant: a FIFO, device or directory given where a file is expected is refused at
//! once (never waited on, never read forever), and no read allocates past its limit.

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
    if let Some(kind) = crate::atomic::irregular_kind(&file.metadata()?.file_type()) {
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
}
