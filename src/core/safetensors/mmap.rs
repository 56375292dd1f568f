//! Memory-mapped loading: the header is validated first, then the file is mapped and
//! each tensor's bytes are handed out without copying; decoding is a separate step.
//!
//! Invariant: every slice handed out lies inside the mapping, because the header's
//! offsets were checked against the file size and the mapping's length is checked
//! against that same size.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, MmapOptions};

use super::float::{decode_f32, decode_f64, decode_ints};
use super::header::{read_header_from, Header, ReadFailure, TensorInfo};
use super::SafetensorsError;

/// A validated safetensors file mapped into memory.
pub struct MappedFile {
    path: PathBuf,
    header: Header,
    map: Mmap,
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("path", &self.path)
            .field("header", &self.header)
            .finish()
    }
}

/// Map `file` (opened from `path`) read-only, checking that it still has `size` bytes.
fn map_file(file: &File, path: &Path, size: u64) -> Result<Mmap, SafetensorsError> {
    // SAFETY: the file is opened read-only and tlio never writes to its inputs (its
    // outputs are new files renamed into place, so they never replace a file's
    // contents in place). Another process truncating the file while it is mapped
    // could fault on access; that is the documented risk of every memory-mapped
    // reader, the reference library included.
    #[allow(unsafe_code, reason = "memory-mapping an input; see SAFETY")]
    let map = unsafe { Mmap::map(file) }.map_err(|source| SafetensorsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if map.len() as u64 != size {
        return Err(SafetensorsError::Changed {
            path: path.to_path_buf(),
            expected: size,
            actual: map.len() as u64,
        });
    }
    Ok(map)
}

/// The mapped bytes of a file whose header was validated already (a model's shard):
/// tensors' slices without parsing and holding the header a second time.
///
/// Invariant: the mapping has exactly the size the header was validated against, so
/// every tensor of that header lies inside it.
pub struct MappedData {
    data_start: u64,
    map: Mmap,
}

impl std::fmt::Debug for MappedData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedData")
            .field("data_start", &self.data_start)
            .field("len", &self.map.len())
            .finish()
    }
}

impl MappedData {
    /// Map `path`, whose header `header` was read from it; fails with
    /// [`SafetensorsError::Changed`] when its size is no longer the header's file size.
    pub fn open(path: &Path, header: &Header) -> Result<Self, SafetensorsError> {
        let file = crate::files::open_regular(path).map_err(|source| SafetensorsError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(MappedData {
            data_start: header.data_start(),
            map: map_file(&file, path, header.file_size)?,
        })
    }

    /// The bytes of a tensor of the header, from the mapping.
    pub fn info_bytes(&self, info: &TensorInfo) -> Option<&[u8]> {
        let start = self.data_start.checked_add(info.data_offsets.0)?;
        let end = self.data_start.checked_add(info.data_offsets.1)?;
        self.map
            .get(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
    }
}

impl MappedFile {
    /// Open, validate the header and map `path` read-only.
    pub fn open(path: &Path) -> Result<Self, SafetensorsError> {
        let io = |source| SafetensorsError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = crate::files::open_regular(path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        let header = read_header_from(&mut file, size).map_err(|e| match e {
            ReadFailure::Io(source) => io(source),
            ReadFailure::Invalid(e) => e,
        })?;
        let map = map_file(&file, path, size)?;
        Ok(MappedFile {
            path: path.to_path_buf(),
            header,
            map,
        })
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The bytes of the tensor's info, from the mapping.
    pub fn info_bytes(&self, info: &TensorInfo) -> Option<&[u8]> {
        let start = self.header.data_start().checked_add(info.data_offsets.0)?;
        let end = self.header.data_start().checked_add(info.data_offsets.1)?;
        self.map
            .get(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
    }

    /// The raw bytes of tensor `name`, without copying.
    pub fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        self.info_bytes(self.header.get(name)?)
    }

    /// The whole file as mapped.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    fn lookup(&self, name: &str) -> Result<(&TensorInfo, &[u8]), SafetensorsError> {
        let missing = || SafetensorsError::NoSuchTensor {
            tensor: name.to_string(),
        };
        let info = self.header.get(name).ok_or_else(missing)?;
        let bytes = self.info_bytes(info).ok_or_else(missing)?;
        Ok((info, bytes))
    }

    /// Decode tensor `name` to f32 values (exact for every dtype of 32 bits or fewer
    /// except 32-bit integers beyond 2^24; C64 gives real and imaginary parts in turn).
    pub fn decode_f32(&self, name: &str) -> Result<Vec<f32>, SafetensorsError> {
        let (info, bytes) = self.lookup(name)?;
        let mut out = Vec::new();
        if !decode_f32(info.dtype, bytes, &mut out) {
            return Err(SafetensorsError::CannotDecode {
                tensor: name.to_string(),
                dtype: info.dtype,
            });
        }
        Ok(out)
    }

    /// Decode tensor `name` to f64 values (exact except 64-bit integers beyond 2^53).
    pub fn decode_f64(&self, name: &str) -> Result<Vec<f64>, SafetensorsError> {
        let (info, bytes) = self.lookup(name)?;
        let mut out = Vec::new();
        if !decode_f64(info.dtype, bytes, &mut out) {
            return Err(SafetensorsError::CannotDecode {
                tensor: name.to_string(),
                dtype: info.dtype,
            });
        }
        Ok(out)
    }

    /// Decode an integer or BOOL tensor exactly.
    pub fn decode_ints(&self, name: &str) -> Result<Vec<i128>, SafetensorsError> {
        let (info, bytes) = self.lookup(name)?;
        let mut out = Vec::new();
        if !decode_ints(info.dtype, bytes, &mut out) {
            return Err(SafetensorsError::CannotDecode {
                tensor: name.to_string(),
                dtype: info.dtype,
            });
        }
        Ok(out)
    }
}

/// Alignment of a window's start: a multiple of every page size Linux and macOS use
/// (4, 16 and 64 KiB), as mmap's offset must be.
const WINDOW_ALIGN: u64 = 64 << 10;

/// One chunk of the input, mapped read-only: `len` bytes at file offset `at`.
pub(crate) struct Window {
    map: Mmap,
    /// Bytes between the aligned start of the mapping and `at`.
    skip: usize,
}

impl Window {
    /// Map `len` bytes at `at` of `file` (whose validated size is `size`), pages
    /// populated. A range past `size` is refused before mapping, so no access can fall
    /// beyond the end the header was checked against.
    pub(crate) fn map(file: &File, size: u64, at: u64, len: usize) -> std::io::Result<Window> {
        let end = at.checked_add(len as u64).filter(|&e| e <= size);
        if end.is_none() || len == 0 {
            return Err(std::io::Error::other(
                "a chunk lies outside the file the header was validated against",
            ));
        }
        let base = at - at % WINDOW_ALIGN;
        let skip = usize::try_from(at - base).map_err(std::io::Error::other)?;
        // SAFETY: a read-only private view of a file tlio opened read-only and never
        // writes (outputs are new files renamed into place). Another process truncating
        // the input while it is read could fault on access: the documented risk of
        // every memory-mapped reader (see `map_file`).
        #[allow(unsafe_code, reason = "memory-mapping an input window; see SAFETY")]
        let map = unsafe {
            MmapOptions::new()
                .offset(base)
                .len(skip + len)
                .populate()
                .map(file)?
        };
        Ok(Window { map, skip })
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        self.map.get(self.skip..).unwrap_or_default()
    }
}
