//! A model directory written atomically as a whole: every file goes into a temporary
//! sibling directory (`.NAME.tlio-tmp-PID-XXXXXX`, named as temporary files are), each file is fsynced, then the directory is
//! fsynced, renamed to its final name in one step, and the parent fsynced.
//!
//! Invariants: the final name never shows a partial model (it is absent, an empty
//! directory, or complete); an existing non-empty target is refused before anything is
//! written and a concurrent one makes the rename fail rather than merge; on any error
//! or drop before `commit` the temporary directory is removed; the committed directory
//! has the mode `mkdir` gives (0777 less the umask), not the temporary one's 0700.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::{parent, ModelError};
use crate::atomic::{sync_dir, AtomicError, TempDir};

/// A directory being written.
pub struct OutDir {
    target: PathBuf,
    parent: PathBuf,
    tmp: TempDir,
    /// The mode the committed directory gets (0777 less the umask).
    mode: u32,
}

/// The name of the directory made (and removed at once) inside the temporary one to
/// learn the mode `mkdir` gives: the umask cannot be read without changing it, which
/// would race with other threads creating files.
const MODE_PROBE: &str = ".tlio-mode-probe";

/// The mode a directory made now with `mkdir(path, 0777)` gets, learned by making one
/// inside `tmp`.
fn mkdir_mode(tmp: &Path) -> io::Result<u32> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let probe = tmp.join(MODE_PROBE);
    fs::DirBuilder::new().mode(0o777).create(&probe)?;
    let mode = fs::symlink_metadata(&probe).map(|m| m.permissions().mode() & 0o777);
    fs::remove_dir(&probe)?;
    mode
}

impl OutDir {
    /// Start writing `target`, refusing an existing file or non-empty directory and a
    /// target inside `input` (a model directory is never modified).
    pub fn create(target: &Path, input: Option<&Path>) -> Result<OutDir, ModelError> {
        check_target(target)?;
        let parent = parent(target);
        // The parent may not exist yet (it is created below): its nearest existing
        // ancestor decides whether the output would land inside the input directory.
        let existing = parent.ancestors().find_map(|a| {
            fs::canonicalize(if a.as_os_str().is_empty() {
                Path::new(".")
            } else {
                a
            })
            .ok()
        });
        if let (Some(input), Some(p)) = (input, existing) {
            if let Ok(i) = fs::canonicalize(input) {
                if p.starts_with(&i) {
                    return Err(ModelError::SameAsInput {
                        path: target.to_path_buf(),
                    });
                }
            }
        }
        // Missing parents are created, as for every other output (docs/cli.md).
        crate::files::create_dir_all(&parent).map_err(|source| ModelError::Write {
            path: parent.clone(),
            source,
        })?;
        // Named and registered by core::atomic, so that an interrupted conversion
        // (SIGINT, SIGTERM) removes the partial directory like any temporary file and the
        // next write sweeps the one a kill -9 left.
        let tmp = TempDir::create(target, &parent).map_err(|e| match e {
            // A read-only or full parent: the error names the output the user gave.
            AtomicError::Create { source, .. } => ModelError::Write {
                path: target.to_path_buf(),
                source,
            },
            other => other.into(),
        })?;
        let mode = mkdir_mode(tmp.path()).map_err(|source| ModelError::Write {
            path: target.to_path_buf(),
            source,
        })?;
        Ok(OutDir {
            target: target.to_path_buf(),
            parent,
            tmp,
            mode,
        })
    }

    /// The temporary directory files are written into.
    pub fn path(&self) -> &Path {
        self.tmp.path()
    }

    /// The final path.
    pub fn target(&self) -> &Path {
        &self.target
    }

    fn err(&self, name: &(impl AsRef<OsStr> + ?Sized)) -> impl Fn(io::Error) -> ModelError + '_ {
        let path = self.target.join(name.as_ref());
        move |source| ModelError::Write {
            path: path.clone(),
            source,
        }
    }

    /// Write `bytes` as file `name` and fsync it.
    pub fn write_file(&self, name: &str, bytes: &[u8]) -> Result<(), ModelError> {
        let mut f = File::create(self.path().join(name)).map_err(self.err(name))?;
        f.write_all(bytes).map_err(self.err(name))?;
        f.sync_all().map_err(self.err(name))
    }

    /// Copy `from` (following symlinks) as file `name` and fsync it.
    pub fn copy_file(
        &self,
        name: &(impl AsRef<OsStr> + ?Sized),
        from: &Path,
    ) -> Result<(), ModelError> {
        let name = name.as_ref();
        let mut src = crate::files::open_regular(from).map_err(|source| ModelError::Io {
            path: from.to_path_buf(),
            source,
        })?;
        let mut f = File::create(self.path().join(name)).map_err(self.err(name))?;
        io::copy(&mut src, &mut f).map_err(self.err(name))?;
        f.sync_all().map_err(self.err(name))
    }

    /// Copy the symlink `from` as a symlink `name` to the absolute path it resolves
    /// to: the file it points to is neither read nor copied (a link out of the model
    /// directory is never followed), and the new link names the same file from the
    /// output's place (the Hugging Face cache's relative `../../blobs/...` would not).
    pub fn copy_link(&self, name: &OsStr, from: &Path) -> Result<(), ModelError> {
        let resolved = fs::canonicalize(from).map_err(|source| ModelError::Io {
            path: from.to_path_buf(),
            source,
        })?;
        #[cfg(unix)]
        let made = std::os::unix::fs::symlink(&resolved, self.path().join(name));
        #[cfg(not(unix))]
        let made = fs::copy(&resolved, self.path().join(name)).map(|_| ());
        made.map_err(self.err(name))
    }

    /// Give the directory its final mode, fsync it, rename it to the target in one
    /// step, fsync the parent.
    pub fn commit(self) -> Result<(), ModelError> {
        use std::os::unix::fs::PermissionsExt;
        let err = |source| ModelError::Write {
            path: self.target.clone(),
            source,
        };
        fs::set_permissions(self.tmp.path(), fs::Permissions::from_mode(self.mode)).map_err(err)?;
        sync_dir(self.tmp.path()).map_err(err)?;
        // The target was absent or an empty directory when we started; rename(2)
        // replaces an empty directory and fails on a non-empty one, never merging.
        check_target(&self.target)?;
        fs::rename(self.tmp.path(), &self.target).map_err(err)?;
        // The temporary name is gone: nothing is left to remove.
        self.tmp.release();
        sync_dir(&self.parent).map_err(err)
    }
}

fn check_target(target: &Path) -> Result<(), ModelError> {
    match fs::symlink_metadata(target) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ModelError::Io {
            path: target.to_path_buf(),
            source: crate::files::name_non_directory(target, source),
        }),
        Ok(m) if m.is_dir() => {
            let mut entries = fs::read_dir(target).map_err(|source| ModelError::Io {
                path: target.to_path_buf(),
                source,
            })?;
            if entries.next().is_none() {
                Ok(())
            } else {
                Err(ModelError::OutputExists {
                    path: target.to_path_buf(),
                })
            }
        }
        Ok(_) => Err(ModelError::OutputExists {
            path: target.to_path_buf(),
        }),
    }
}
