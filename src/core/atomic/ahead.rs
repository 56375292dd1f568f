//! Allocating an output file's pages ahead of its writer, on another thread, when the
//! file lives in memory (tmpfs): there a write's main cost is allocating the pages it
//! fills, done under the file's lock by the one writing thread, and a second core can
//! take that cost off the writer's path.
//!
//! Invariants: the allocation never changes the file's size or bytes
//! (`FALLOC_FL_KEEP_SIZE`, and a write over an allocated page replaces the whole of it),
//! so the output is the same with or without it; it is a hint whose failures are
//! ignored (the writer meets the real error, such as a full file system, itself); the
//! thread stops and is joined when the handle is dropped. On a disk file system nothing
//! is started: allocating there turns the written ranges into unwritten extents that
//! the final fsync must convert, a cost without a gain.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Bytes allocated per call: small enough that the writer, which takes the same lock,
/// never waits long behind one call.
const STEP_BYTES: u64 = 4 << 20;

/// Files smaller than this are not worth a thread.
const MIN_BYTES: u64 = 32 << 20;

/// A thread allocating a file's pages ahead of its writer; stops when dropped.
pub struct AllocAhead {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl AllocAhead {
    /// Allocate the first `len` bytes of `file` on another thread when the file is in
    /// memory (tmpfs) and large; `None` (nothing started) otherwise.
    pub fn start(file: &File, len: u64) -> Option<AllocAhead> {
        if len < MIN_BYTES || !in_memory(file) {
            return None;
        }
        let file = file.try_clone().ok()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("tlio-alloc-ahead".into())
            .spawn(move || {
                let mut at = 0u64;
                while at < len && !flag.load(Ordering::Relaxed) {
                    let n = STEP_BYTES.min(len - at);
                    if allocate(&file, at, n).is_err() {
                        return;
                    }
                    at += n;
                }
            })
            .ok()?;
        Some(AllocAhead {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for AllocAhead {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // The thread only makes system calls whose errors it ignores: it cannot
            // panic, and a join error would have nothing to report.
            let _ = t.join();
        }
    }
}

/// Whether `file` is on tmpfs.
#[cfg(target_os = "linux")]
fn in_memory(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs writes one `statfs` into the pointer it is given, which points to
    // storage of that type, and only reads the descriptor, open for the call.
    #[allow(unsafe_code, reason = "fstatfs has no safe wrapper; see SAFETY")]
    let r = unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) };
    if r != 0 {
        return false;
    }
    // SAFETY: fstatfs returned 0, so it filled the whole struct.
    #[allow(unsafe_code, reason = "reading what fstatfs filled; see SAFETY")]
    let st = unsafe { st.assume_init() };
    st.f_type == libc::TMPFS_MAGIC
}

#[cfg(not(target_os = "linux"))]
fn in_memory(_file: &File) -> bool {
    false
}

/// Allocate `len` bytes of `file` at `at` without changing its size.
#[cfg(target_os = "linux")]
fn allocate(file: &File, at: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(at), Ok(len)) = (libc::off64_t::try_from(at), libc::off64_t::try_from(len)) else {
        return Err(std::io::ErrorKind::InvalidInput.into());
    };
    // SAFETY: fallocate only reads the descriptor, open for the call; KEEP_SIZE leaves
    // the size and every byte of the file as they are.
    #[allow(unsafe_code, reason = "fallocate has no safe wrapper; see SAFETY")]
    let r = unsafe { libc::fallocate64(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, at, len) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn allocate(_file: &File, _at: u64, _len: u64) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}
