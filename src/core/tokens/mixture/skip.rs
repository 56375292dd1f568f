//! Skipping whole global batches of a mixture without reading a token (how DataLoader
//! worker `k` of `N` takes batches `k, k + N, ...` of one mixture, python.md).
//!
//! Invariants: a skipped batch walks the rule and every source exactly as a read one
//! does (the same stage entry, the same counts, each source moved past its windows a
//! pass at a time), so the position afterwards is the one `n` reads would leave; an
//! interruption leaves every source and the rule where they were.

use super::super::checks::Ticker;
use super::super::stream::{Mark, TokenStream};
use super::super::TokensError;
use super::Mixture;

impl Mixture {
    /// Move past the next `n` global batches without reading them: afterwards the
    /// cursor is the one `n` calls of `next_batch` would leave (on every rank). Asks
    /// `cancel` every million or so windows walked; on an error (including
    /// [`TokensError::Interrupted`]) nothing moved.
    pub fn skip_batches(
        &mut self,
        n: u64,
        cancel: &mut dyn FnMut() -> bool,
    ) -> Result<(), TokensError> {
        let marks: Vec<Mark> = self.sources.iter().map(TokenStream::mark).collect();
        let before = (self.window, self.rule.clone());
        let mut ticks = Ticker::new(cancel);
        let mut result = Ok(());
        for _ in 0..n {
            result = self.walk_batch(&mut [], &mut [], &mut Vec::new(), 0..0, &mut ticks);
            if result.is_err() {
                break;
            }
        }
        if result.is_err() {
            for (source, mark) in self.sources.iter_mut().zip(marks) {
                source.reset(mark);
            }
            (self.window, self.rule) = before;
        }
        result
    }
}
