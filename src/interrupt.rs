//! SIGINT, SIGTERM and SIGHUP: remove every temporary file the process has open, print
//! one error line and exit with 128 + the signal number (130 for Ctrl-C, 143 for
//! `kill`).
//!
//! Invariant: the signals are blocked in every thread and taken by one thread with
//! `sigwait`, so the cleanup runs as ordinary code (locks, allocation, file removal),
//! never inside an asynchronous signal handler. Child processes start with an empty
//! signal mask (the standard library resets it), so they see signals normally.

use std::io::Write;

/// The signals handled, with their names for the error line.
#[cfg(unix)]
const SIGNALS: [(libc::c_int, &str); 3] = [
    (libc::SIGINT, "SIGINT"),
    (libc::SIGTERM, "SIGTERM"),
    (libc::SIGHUP, "SIGHUP"),
];

/// Block the handled signals and start the thread that waits for them. Must run before
/// any other thread is started, so that every thread inherits the mask. When the
/// thread cannot be started the signals keep their default action.
#[cfg(unix)]
#[allow(
    unsafe_code,
    reason = "signal masks and sigwait have no safe wrapper in std; each block says why it is sound"
)]
pub fn install() {
    // SAFETY: `set` is initialised by sigemptyset before any other use; the calls only
    // read and write that local set and this thread's mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for (sig, _) in SIGNALS {
            libc::sigaddset(&mut set, sig);
        }
        set
    };
    // SAFETY: a valid set; the old mask is not needed.
    if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } != 0 {
        return;
    }
    let waiter = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` lives in this closure; sigwait writes one int.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                continue;
            }
            let removed = tlio_core::atomic::abandon_all();
            let name = SIGNALS
                .iter()
                .find(|(s, _)| *s == sig)
                .map_or("a signal", |(_, n)| n);
            let cleaned = if removed > 0 {
                "; temporary files removed"
            } else {
                ""
            };
            let _ = writeln!(
                std::io::stderr().lock(),
                "tlio: error: interrupted by {name}{cleaned}"
            );
            std::process::exit(128 + sig);
        });
    if waiter.is_err() {
        // SAFETY: as above; back to the default handling.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    }
}

/// Elsewhere signals keep their default action.
#[cfg(not(unix))]
pub fn install() {}
