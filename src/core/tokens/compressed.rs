//! Decoders of compressed corpora (`.gz` through flate2, `.zst` through ruzstd) that
//! read what `gzip -dc` and `zstd -dc` read (concatenated members and frames, zstd's
//! skippable frames skipped).
//!
//! Invariant: corrupt or truncated data is reported as [`Corrupt`] inside the
//! `io::Error`, one readable sentence (never a decoder's debug dump), so the caller can
//! tell bad data (exit 1) from a file that fails to read.

use std::io::{self, BufRead, Read};

/// The reason of a data error of a decoder here, if `error` is one.
pub(super) fn corrupt_reason(error: &io::Error) -> Option<String> {
    error
        .get_ref()
        .and_then(|e| e.downcast_ref::<Corrupt>())
        .map(|c| c.0.clone())
}

/// Why compressed data cannot be decoded (corrupt or truncated): bad data, unlike a
/// read error of the file under it. Carried inside an `io::Error` of kind InvalidData.
#[derive(Debug)]
struct Corrupt(String);

impl std::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Corrupt {}

fn corrupt(format: &str, reason: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        Corrupt(format!("not valid {format} data: {reason}")),
    )
}

/// A gzip decoder whose data errors (corrupt, truncated) become [`Corrupt`].
pub(super) struct Gzip<R: BufRead>(pub(super) flate2::bufread::MultiGzDecoder<R>);

impl<R: BufRead> Read for Gzip<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf).map_err(|e| match e.kind() {
            io::ErrorKind::InvalidData
            | io::ErrorKind::InvalidInput
            | io::ErrorKind::UnexpectedEof => corrupt("gzip", e),
            _ => e,
        })
    }
}

/// The magic number of a zstd frame, and the range of skippable frames' (RFC 8878).
const ZSTD_MAGIC: u32 = 0xFD2F_B528;
const ZSTD_SKIPPABLE: std::ops::RangeInclusive<u32> = 0x184D_2A50..=0x184D_2A5F;

/// The source of one zstd frame: the magic bytes already read, then the rest.
type FrameSource<R> = io::Chain<io::Cursor<[u8; 4]>, R>;

/// A zstd stream of frames, skippable frames skipped, as `zstd -d` reads it (ruzstd's
/// streaming decoder stops after one frame and reports a skippable one as an error).
pub(super) struct Zstd<R: BufRead> {
    decoder:
        Option<ruzstd::decoding::StreamingDecoder<FrameSource<R>, ruzstd::decoding::FrameDecoder>>,
}

/// Read up to `buf.len()` bytes; fewer only at the end of the stream.
fn read_full(source: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match source.read(buf.get_mut(got..).unwrap_or(&mut [])) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn zstd_reason(e: &ruzstd::decoding::errors::FrameDecoderError) -> String {
    use ruzstd::decoding::errors::{FrameDecoderError as E, ReadFrameHeaderError as H};
    match e {
        E::ReadFrameHeaderError(H::InvalidFrameDescriptor(_)) => {
            "invalid frame descriptor".to_string()
        }
        E::ReadFrameHeaderError(h) => h.to_string(),
        E::FrameHeaderError(_) => "invalid frame header".to_string(),
        E::DictionaryDecodeError(_) => "a frame needs a dictionary".to_string(),
        other => other.to_string(),
    }
}

impl<R: BufRead> Zstd<R> {
    pub(super) fn new(source: R) -> io::Result<Self> {
        Ok(Zstd {
            decoder: Zstd::next_frame(source, true)?,
        })
    }

    /// The decoder of the next data frame of `source`, skipping skippable frames;
    /// None at the end of the stream.
    fn next_frame(
        mut source: R,
        first: bool,
    ) -> io::Result<
        Option<ruzstd::decoding::StreamingDecoder<FrameSource<R>, ruzstd::decoding::FrameDecoder>>,
    > {
        let mut seen = !first;
        loop {
            let mut magic = [0u8; 4];
            match read_full(&mut source, &mut magic)? {
                0 if seen => return Ok(None),
                0 => return Err(corrupt("zstd", "the file is empty")),
                4 => {}
                _ => return Err(corrupt("zstd", "truncated frame header")),
            }
            seen = true;
            let number = u32::from_le_bytes(magic);
            if ZSTD_SKIPPABLE.contains(&number) {
                let mut len = [0u8; 4];
                if read_full(&mut source, &mut len)? != 4 {
                    return Err(corrupt("zstd", "truncated skippable frame"));
                }
                let len = u64::from(u32::from_le_bytes(len));
                let skipped = io::copy(&mut (&mut source).take(len), &mut io::sink())?;
                if skipped != len {
                    return Err(corrupt("zstd", "truncated skippable frame"));
                }
                continue;
            }
            if number != ZSTD_MAGIC {
                return Err(corrupt(
                    "zstd",
                    format!("bad magic number {number:#010x} (not a zstd frame)"),
                ));
            }
            let chained = io::Cursor::new(magic).chain(source);
            return ruzstd::decoding::StreamingDecoder::new(chained)
                .map(Some)
                .map_err(|e| corrupt("zstd", zstd_reason(&e)));
        }
    }
}

impl<R: BufRead> Read for Zstd<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(decoder) = self.decoder.as_mut() else {
                return Ok(0);
            };
            let n = decoder.read(buf).map_err(|e| {
                // ruzstd's messages end in debug dumps of its inner errors: keep the
                // sentence before the first colon, which says what failed.
                let text = e.to_string();
                let what = text.split(':').next().unwrap_or("").trim();
                corrupt("zstd", format!("{what} (the data is truncated or corrupt)"))
            })?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // This frame is done: another may follow.
            let Some(decoder) = self.decoder.take() else {
                return Ok(0);
            };
            let (chained, _) = decoder.into_parts();
            let (_, source) = chained.into_inner();
            self.decoder = Zstd::next_frame(source, false)?;
        }
    }
}
