//! Streaming transfers of one object: [`ObjectWriter`], an upload fed through `Write`
//! whose parts go out while the caller produces the next ones, and
//! [`Store::read_object`], a download into owned memory seen chunk by chunk.
//!
//! Invariants: nothing appears at a key before its upload completes (one request, or
//! the completion of a multipart upload); an upload dropped unfinished is aborted; a
//! download never holds more than the size the caller expects.

use std::io::{self, Write};

use futures_util::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use super::{Store, MULTIPART_THRESHOLD, PARTS_IN_FLIGHT, PART_BYTES};
use crate::s3::S3Error;

impl Store {
    /// A writer that uploads what it is given to `key`: one request when it ends up
    /// smaller than [`MULTIPART_THRESHOLD`], else a multipart upload whose parts go
    /// out while the caller writes the next ones (at most [`PARTS_IN_FLIGHT`] parts in
    /// memory). Nothing is visible at `key` before [`ObjectWriter::finish`] succeeds;
    /// a writer dropped unfinished aborts its upload.
    pub fn writer(&self, key: &str) -> Result<ObjectWriter<'_>, S3Error> {
        Ok(ObjectWriter {
            store: self,
            name: key.to_string(),
            path: self.key(key)?,
            small: Vec::new(),
            upload: None,
            total: 0,
            failed: None,
        })
    }

    /// The whole object `key`, which the caller expects to be `size` bytes (the buffer
    /// is sized for it; a larger object is [`S3Error::TooLarge`]), calling `seen` with
    /// each chunk as it arrives, in order (the caller hashes what it reads).
    pub fn read_object(
        &self,
        key: &str,
        size: u64,
        seen: &mut dyn FnMut(&[u8]),
    ) -> Result<Vec<u8>, S3Error> {
        let path = self.key(key)?;
        let too_large = |got: u64| S3Error::TooLarge {
            url: self.url(key),
            size: got,
            limit: size,
        };
        self.runtime.block_on(async {
            let got = self
                .store
                .get_opts(&path, GetOptions::default())
                .await
                .map_err(|e| self.fail(key, &e))?;
            if got.meta.size > size {
                return Err(too_large(got.meta.size));
            }
            let mut out = Vec::with_capacity(usize::try_from(got.meta.size).unwrap_or(0));
            let mut stream = got.into_stream();
            while let Some(chunk) = stream.try_next().await.map_err(|e| self.fail(key, &e))? {
                if (out.len() as u64).saturating_add(chunk.len() as u64) > size {
                    return Err(too_large(size.saturating_add(1)));
                }
                seen(&chunk);
                out.extend_from_slice(&chunk);
            }
            Ok(out)
        })
    }
}

/// A streaming upload of one object ([`Store::writer`]).
pub struct ObjectWriter<'s> {
    store: &'s Store,
    name: String,
    path: Key,
    /// What was written while the object is still small enough for one request.
    small: Vec<u8>,
    /// The multipart upload, once the object outgrew `small`.
    upload: Option<WriteMultipart>,
    total: u64,
    /// The error that stopped the upload (returned again by `finish`).
    failed: Option<S3Error>,
}

impl std::fmt::Debug for ObjectWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectWriter")
            .field("key", &self.name)
            .field("written", &self.total)
            .finish_non_exhaustive()
    }
}

impl ObjectWriter<'_> {
    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.total
    }

    /// The error that stopped the upload, if one did (a `write` then failed with its
    /// text): the caller reports this one rather than the I/O error it saw.
    pub fn take_error(&mut self) -> Option<S3Error> {
        self.failed.take()
    }

    fn stop(&mut self, err: S3Error) -> io::Error {
        let text = crate::failure::full_text(&err);
        self.failed = Some(err);
        io::Error::other(text)
    }

    fn send(&mut self, buf: &[u8]) -> io::Result<()> {
        let store = self.store;
        if self.upload.is_none() {
            let started = store
                .runtime
                .block_on(store.store.put_multipart(&self.path));
            match started {
                Ok(u) => {
                    self.upload = Some(WriteMultipart::new_with_chunk_size(u, PART_BYTES));
                }
                Err(e) => {
                    let err = store.fail(&self.name, &e);
                    return Err(self.stop(err));
                }
            }
            let first = std::mem::take(&mut self.small);
            self.send(&first)?;
        }
        let Some(upload) = self.upload.as_mut() else {
            return Ok(());
        };
        if let Err(e) = store
            .runtime
            .block_on(upload.wait_for_capacity(PARTS_IN_FLIGHT))
        {
            let err = store.fail(&self.name, &e);
            return Err(self.stop(err));
        }
        // A full part is spawned onto the runtime's workers, so it is sent while the
        // caller produces the next one.
        let _inside = store.runtime.enter();
        upload.write(buf);
        Ok(())
    }

    /// Complete the upload: the object appears whole at its key; returns its size.
    pub fn finish(mut self) -> Result<u64, S3Error> {
        if let Some(err) = self.failed.take() {
            return Err(err);
        }
        let store = self.store;
        let done = match self.upload.take() {
            None => {
                let data = std::mem::take(&mut self.small);
                store
                    .runtime
                    .block_on(store.store.put(&self.path, PutPayload::from(data)))
                    .map(|_| ())
            }
            Some(upload) => {
                let _inside = store.runtime.enter();
                store.runtime.block_on(upload.finish()).map(|_| ())
            }
        };
        done.map_err(|e| store.fail(&self.name, &e))?;
        Ok(self.total)
    }
}

impl Write for ObjectWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.failed.is_some() {
            return Err(io::Error::other("the upload already failed"));
        }
        let fits = self.upload.is_none()
            && (self.small.len() as u64).saturating_add(buf.len() as u64) < MULTIPART_THRESHOLD;
        if fits {
            self.small.extend_from_slice(buf);
        } else {
            self.send(buf)?;
        }
        self.total = self.total.saturating_add(buf.len() as u64);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for ObjectWriter<'_> {
    fn drop(&mut self) {
        // An upload never finished is aborted (best effort), so its parts do not
        // linger as storage the bucket is billed for.
        if let Some(upload) = self.upload.take() {
            let _ = self.store.runtime.block_on(upload.abort());
        }
    }
}
