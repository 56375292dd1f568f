//! A zstd stream of one or more frames for the corpus reader (ruzstd's streaming
//! decoder stops after one frame).
//!
//! Invariant: every frame of the input is decoded in order, and the stream ends only
//! at the end of the input.

use std::io::{self, BufRead, Read};

/// A zstd stream of one or more frames (ruzstd's streaming decoder stops after one).
pub(super) struct Zstd<R: BufRead> {
    decoder: Option<ruzstd::decoding::StreamingDecoder<R, ruzstd::decoding::FrameDecoder>>,
}

impl<R: BufRead> Zstd<R> {
    pub(super) fn new(source: R) -> io::Result<Self> {
        let decoder = ruzstd::decoding::StreamingDecoder::new(source).map_err(io::Error::other)?;
        Ok(Zstd {
            decoder: Some(decoder),
        })
    }
}

impl<R: BufRead> Read for Zstd<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(decoder) = self.decoder.as_mut() else {
                return Ok(0);
            };
            let n = decoder.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // This frame is done: another may follow.
            let Some(decoder) = self.decoder.take() else {
                return Ok(0);
            };
            let (mut source, frame) = decoder.into_parts();
            if source.fill_buf()?.is_empty() {
                return Ok(0);
            }
            self.decoder = Some(
                ruzstd::decoding::StreamingDecoder::new_with_decoder(source, frame)
                    .map_err(io::Error::other)?,
            );
        }
    }
}
