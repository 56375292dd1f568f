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
pub fn open_regular(path: &Path) -> io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path)?;
    match crate::atomic::irregular_kind(&file.metadata()?.file_type()) {
        None => Ok(file),
        Some(kind) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file but a {kind}"),
        )),
    }
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
