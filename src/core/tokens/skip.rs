//! Skipping whole global batches of a stream without reading a token (how DataLoader
//! worker `k` of `N` takes batches `k, k + N, ...` of one stream, python.md).
//!
//! Invariants: windows are a pure function of the position, so skipping `n` global
//! batches moves the position `n × B × world_size` windows on, a pass at a time (a
//! pass's generator draw where one starts), to exactly where `n` reads would leave it;
//! an interruption leaves the stream where it was.

use super::checks::Ticker;
use super::stream::TokenStream;
use super::TokensError;

impl TokenStream {
    /// Move past the next `n` global batches without reading them: afterwards the
    /// cursor is the one `n` calls of `next_batch` would leave (on every rank). Asks
    /// `cancel` every million or so passes started; `n` × the global batch above
    /// `u64::MAX` windows is [`TokensError::TooLarge`]; on an error nothing moved.
    pub fn skip_batches(
        &mut self,
        n: u64,
        cancel: &mut dyn FnMut() -> bool,
    ) -> Result<(), TokensError> {
        let global = self.global_batch() as u64;
        let windows = n
            .checked_mul(global)
            .and_then(|w| usize::try_from(w).ok())
            .ok_or(TokensError::TooLarge {
                name: "batches to skip",
                value: n,
                limit: (usize::MAX as u64) / global.max(1),
            })?;
        let before = self.mark();
        let mut ticks = Ticker::new(cancel);
        let result = self.skip(windows, &mut ticks);
        if result.is_err() {
            self.reset(before);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pcg::{Pcg32, DEFAULT_SEQ};
    use crate::tokens::{Ranks, TokensError};
    use crate::tokens::{Shard, ShardOrder, ShardWriter, StreamOptions};
    use proptest::prelude::*;
    use std::path::{Path, PathBuf};

    /// Shard `k` holds `k * 1000 + i` at position `i`, so an id names where it was read.
    fn tagged(dir: &Path, lens: &[usize]) -> Vec<PathBuf> {
        lens.iter()
            .enumerate()
            .map(|(k, &n)| {
                let path = dir.join(format!("s{k}.bin"));
                let mut w = ShardWriter::create(&path, 100_000).unwrap();
                let ids: Vec<u32> = (0..n).map(|i| (k * 1000 + i) as u32).collect();
                w.push(&ids).unwrap();
                w.finish().unwrap();
                path
            })
            .collect()
    }

    fn stream(paths: &[PathBuf], t: usize, b: usize, opts: StreamOptions) -> TokenStream {
        let shards = paths
            .iter()
            .map(|p| Shard::open(p, None).unwrap())
            .collect();
        TokenStream::with_options(shards, t, b, Pcg32::seed(5, DEFAULT_SEQ), None, opts).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Skipping n batches leaves the cursor (and so every later batch) where reading
        /// them leaves it, on every rank, shuffled or not, from any starting batch.
        #[test]
        fn skipping_batches_is_reading_them_without_the_tokens(
            lens in prop::collection::vec(6usize..60, 1..4),
            t in 1usize..5,
            b in 1usize..4,
            world in 1usize..4,
            shuffled in any::<bool>(),
            before in 0usize..6,
            n in 0u64..12,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let paths = tagged(dir.path(), &lens);
            let order = if shuffled { ShardOrder::Shuffled } else { ShardOrder::InOrder };
            for rank in 0..world {
                let opts = StreamOptions { ranks: Ranks { rank, world_size: world }, order };
                let mut read = stream(&paths, t, b, opts);
                let mut skipped = stream(&paths, t, b, opts);
                for _ in 0..before {
                    read.next_batch().unwrap();
                    skipped.next_batch().unwrap();
                }
                for _ in 0..n {
                    read.next_batch().unwrap();
                }
                skipped.skip_batches(n, &mut || false).unwrap();
                prop_assert_eq!(skipped.cursor(), read.cursor());
                prop_assert_eq!(skipped.next_batch().unwrap(), read.next_batch().unwrap());
            }
        }
    }

    #[test]
    fn an_interrupted_or_impossible_skip_moves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        // Shards of one window each: every window starts a pass, so the skip asks.
        let paths = tagged(dir.path(), &[3, 3]);
        let mut s = stream(&paths, 2, 4, StreamOptions::default());
        s.next_batch().unwrap();
        let at = s.cursor();
        let err = s.skip_batches(1 << 20, &mut || true).unwrap_err();
        assert!(matches!(err, TokensError::Interrupted), "{err}");
        assert_eq!(s.cursor(), at);
        let err = s.skip_batches(u64::MAX, &mut || false).unwrap_err();
        assert!(err.to_string().contains("batches to skip"), "{err}");
        assert_eq!(s.cursor(), at);
    }
}
