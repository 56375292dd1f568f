//! What a mixture yields over its first batches, without reading a token (`tokens
//! mix-report`): each source's windows and share beside the share its weights ask
//! for, the worst gap within one global batch, and the passes and epochs it went
//! through.
//!
//! Invariants: the walk is the one `next_batch` and `skip_batches` make (the same
//! stage entry, the same rule, each source moved window by window), so the report is
//! of exactly the windows those batches hold; an interruption leaves the mixture where
//! it was.

use super::super::checks::Ticker;
use super::super::stream::{Mark, TokenStream};
use super::super::TokensError;
use super::Mixture;

/// One source's part of a [`MixReport`].
#[derive(Debug, Clone, PartialEq)]
pub struct SourceReport {
    /// Windows that came from the source.
    pub windows: u64,
    /// The share its weights ask for over these batches (stage by stage).
    pub expected: f64,
    /// The largest distance, in windows, between the source's windows in one global
    /// batch and its weight times the global batch.
    pub worst_batch_gap: f64,
    /// Passes over one of its shards that ended (a source starts at a pass).
    pub passes: u64,
    /// Epochs that ended: every shard of the source passed over once per epoch, so
    /// this is `passes` divided by its shard count.
    pub epochs: u64,
}

/// The windows of a mixture's next batches, source by source.
#[derive(Debug, Clone, PartialEq)]
pub struct MixReport {
    /// Global batches walked.
    pub batches: u64,
    /// Windows walked (batches times the global batch).
    pub windows: u64,
    /// One entry per source, in the sources' order.
    pub sources: Vec<SourceReport>,
}

impl Mixture {
    /// Walk the next `batches` global batches without reading a token and report
    /// where their windows came from; afterwards the mixture is where `batches` reads
    /// leave it. Asks `cancel` every million or so windows; on an error nothing moved.
    pub fn report(
        &mut self,
        batches: u64,
        cancel: &mut dyn FnMut() -> bool,
    ) -> Result<MixReport, TokensError> {
        let marks: Vec<Mark> = self.sources.iter().map(TokenStream::mark).collect();
        let before = (self.window, self.rule.clone());
        let mut ticks = Ticker::new(cancel);
        let mut report = MixReport {
            batches,
            windows: 0,
            sources: vec![
                SourceReport {
                    windows: 0,
                    expected: 0.0,
                    worst_batch_gap: 0.0,
                    passes: 0,
                    epochs: 0,
                };
                self.sources.len()
            ],
        };
        let mut result = Ok(());
        for _ in 0..batches {
            result = self.report_batch(&mut report, &mut ticks);
            if result.is_err() {
                break;
            }
        }
        if let Err(e) = result {
            for (source, mark) in self.sources.iter_mut().zip(marks) {
                source.reset(mark);
            }
            (self.window, self.rule) = before;
            return Err(e);
        }
        let total = report.windows.max(1) as f64;
        for (s, stream) in report.sources.iter_mut().zip(&self.sources) {
            s.expected /= total;
            s.epochs = s.passes / (stream.shards().len().max(1) as u64);
        }
        Ok(report)
    }

    /// One global batch of [`Mixture::report`].
    fn report_batch(
        &mut self,
        report: &mut MixReport,
        ticks: &mut Ticker<'_>,
    ) -> Result<(), TokensError> {
        self.enter_stage();
        let global = self.global_batch();
        let weights = self
            .stages
            .get(self.rule.stage)
            .map(|s| s.weights.clone())
            .unwrap_or_default();
        let mut here = vec![0u64; self.sources.len()];
        for i in 0..global {
            let g = self.window.saturating_add(i as u64);
            let j = self.rule.next(&weights, g);
            let (Some(source), Some(n), Some(s)) = (
                self.sources.get_mut(j),
                here.get_mut(j),
                report.sources.get_mut(j),
            ) else {
                continue;
            };
            if source.windows_left() == 0 {
                s.passes = s.passes.saturating_add(1);
            }
            source.advance(ticks)?;
            *n = n.saturating_add(1);
            ticks.add(1)?;
        }
        for ((s, n), w) in report.sources.iter_mut().zip(here).zip(&weights) {
            let due = w * global as f64;
            s.windows = s.windows.saturating_add(n);
            s.expected += due;
            s.worst_batch_gap = s.worst_batch_gap.max((n as f64 - due).abs());
        }
        self.window = self.window.saturating_add(global as u64);
        report.windows = report.windows.saturating_add(global as u64);
        Ok(())
    }
}
