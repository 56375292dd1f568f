//! The count model (`--method counts`): one pass over every token, then
//! W[i][j] = ln((count(i -> j) + 1) / (count(i) + V)), add-one smoothed log-probabilities.
//!
//! Invariants: count(i) counts i as an input, i.e. every position of a sequence but its
//! last, so each row of exp(W) sums to 1; pairs never span two sequences (shards); the
//! weights are computed in f64 and rounded to f32 once; the reported loss is the mean
//! cross-entropy of softmax(W[x]) over every counted position, the same definition as
//! the gradient method's training loss, summed rows ascending, columns ascending.

use super::bigram::Bigram;
use super::TrainError;

/// Accumulates bigram counts over one or more sequences.
#[derive(Debug, Clone)]
pub struct CountsBuilder {
    vocab: usize,
    /// count(i -> j), row-major [V, V].
    pairs: Vec<u64>,
    /// count(i) as an input.
    inputs: Vec<u64>,
    prev: Option<u32>,
    positions: u64,
}

/// The fitted count model and its mean cross-entropy on the counted data.
#[derive(Debug, Clone)]
pub struct CountsFit {
    /// The model, W = ln((c + 1) / (n + V)).
    pub model: Bigram,
    /// Mean cross-entropy over every counted position (0 when there were none).
    pub loss: f32,
    /// Positions counted (pairs i -> j).
    pub positions: u64,
}

impl CountsBuilder {
    /// Zero counts for vocabulary `vocab`, after checking it against the memory limit
    /// (u64 counts and f32 weights: 12 bytes per entry, the limit's figure).
    pub fn new(vocab: u32) -> Result<Self, TrainError> {
        super::check_model_vocab(vocab)?;
        let v = vocab as usize;
        Ok(CountsBuilder {
            vocab: v,
            pairs: vec![0; v * v],
            inputs: vec![0; v],
            prev: None,
            positions: 0,
        })
    }

    /// Count the next ids of the current sequence (continuing across calls).
    pub fn feed(&mut self, ids: impl IntoIterator<Item = u32>) -> Result<(), TrainError> {
        let v = self.vocab;
        for id in ids {
            if id as usize >= v {
                return Err(TrainError::TokenOutOfRange {
                    id: id as i64,
                    vocab: v as u64,
                });
            }
            if let Some(prev) = self.prev {
                let prev = prev as usize;
                if let Some(c) = self.pairs.get_mut(prev * v + id as usize) {
                    *c += 1;
                }
                if let Some(n) = self.inputs.get_mut(prev) {
                    *n += 1;
                }
                self.positions += 1;
            }
            self.prev = Some(id);
        }
        Ok(())
    }

    /// End the current sequence: the next id starts a new one (no pair across).
    pub fn end_sequence(&mut self) {
        self.prev = None;
    }

    /// Positions counted so far.
    pub fn positions(&self) -> u64 {
        self.positions
    }

    /// The weights and the loss of the counted data under them.
    pub fn finish(self) -> Result<CountsFit, TrainError> {
        let v = self.vocab;
        let vf = v as f64;
        let mut weight = vec![0.0f32; v * v];
        let mut exp = vec![0.0f64; v];
        let mut sum = 0.0f64;
        for ((w_row, c_row), &n) in weight
            .chunks_exact_mut(v)
            .zip(self.pairs.chunks_exact(v))
            .zip(&self.inputs)
        {
            let denom = n as f64 + vf;
            for (w, &c) in w_row.iter_mut().zip(c_row) {
                *w = ((c as f64 + 1.0) / denom).ln() as f32;
            }
            if n == 0 {
                continue;
            }
            // The loss of the f32 model actually saved, through the same softmax as
            // the gradient method (its lse is 0 up to the f32 rounding of W).
            let max = w_row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let mut z = 0.0f64;
            for (e, &w) in exp.iter_mut().zip(w_row.iter()) {
                *e = (w as f64 - max).exp();
                z += *e;
            }
            let lse = max + z.ln();
            for (&w, &c) in w_row.iter().zip(c_row) {
                if c != 0 {
                    sum += c as f64 * (lse - w as f64);
                }
            }
        }
        let loss = if self.positions == 0 {
            0.0
        } else {
            (sum / self.positions as f64) as f32
        };
        let model = Bigram::from_weights(v as u32, weight)?;
        Ok(CountsFit {
            model,
            loss,
            positions: self.positions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn weights_are_add_one_smoothed_log_probabilities() {
        let v = 6u32;
        let seqs: [&[u32]; 2] = [&[0, 1, 1, 2, 0, 1, 5, 5, 5], &[3, 1, 3, 1]];
        let mut b = CountsBuilder::new(v).unwrap();
        for s in seqs {
            b.feed(s.iter().copied()).unwrap();
            b.end_sequence();
        }
        let fit = b.finish().unwrap();
        // Independent count with a hash map of pairs, within each sequence only.
        let mut pair: HashMap<(u32, u32), u64> = HashMap::new();
        let mut n: HashMap<u32, u64> = HashMap::new();
        for s in seqs {
            for w in s.windows(2) {
                *pair.entry((w[0], w[1])).or_default() += 1;
                *n.entry(w[0]).or_default() += 1;
            }
        }
        assert_eq!(fit.positions, 8 + 3);
        for i in 0..v {
            let mut total = 0.0f64;
            for j in 0..v {
                let c = *pair.get(&(i, j)).unwrap_or(&0) as f64;
                let ni = *n.get(&i).unwrap_or(&0) as f64;
                let want = ((c + 1.0) / (ni + v as f64)).ln() as f32;
                let got = fit.model.weight()[(i * v + j) as usize];
                assert_eq!(got.to_bits(), want.to_bits(), "W[{i}][{j}]");
                total += (got as f64).exp();
            }
            assert!((total - 1.0).abs() < 1e-6, "row {i} sums to {total}");
        }
        // The pair 5 -> 3 spans the two sequences and must not be counted.
        assert_eq!(
            fit.model.weight()[5 * 6 + 3],
            (1.0f64 / (2.0 + 6.0)).ln() as f32
        );
        // Loss: mean of -ln p over the counted positions.
        let mut want = 0.0f64;
        for s in seqs {
            for w in s.windows(2) {
                let c = pair[&(w[0], w[1])] as f64;
                want -= ((c + 1.0) / (n[&w[0]] as f64 + 6.0)).ln();
            }
        }
        want /= 11.0;
        assert!(
            (fit.loss as f64 - want).abs() < 1e-6,
            "{} vs {want}",
            fit.loss
        );
    }

    #[test]
    fn feeding_in_pieces_equals_feeding_whole() {
        let ids: Vec<u32> = (0..200u32).map(|i| (i * i + 3) % 11).collect();
        let mut whole = CountsBuilder::new(11).unwrap();
        whole.feed(ids.iter().copied()).unwrap();
        let mut pieces = CountsBuilder::new(11).unwrap();
        for chunk in ids.chunks(7) {
            pieces.feed(chunk.iter().copied()).unwrap();
        }
        let (a, b) = (whole.finish().unwrap(), pieces.finish().unwrap());
        assert_eq!(a.model, b.model);
        assert_eq!(a.loss.to_bits(), b.loss.to_bits());
    }

    /// The count cases of fixtures/optim: ln((c + 1) / (n + V)) in float64 rounded
    /// once, the same formula, so every weight is expected bit for bit; the counts and
    /// row totals are checked through the weights.
    #[test]
    fn matches_the_independent_reference_fixtures() {
        use crate::optim::fixture::{f32s, ints, load};
        let fx = load();
        let cases = fx["counts"].as_array().unwrap();
        assert_eq!(cases.len(), 2);
        for case in cases {
            let v = case["V"].as_u64().unwrap() as u32;
            let ids: Vec<u32> = ints(&case["ids"]).into_iter().map(|i| i as u32).collect();
            let mut b = CountsBuilder::new(v).unwrap();
            b.feed(ids.iter().copied()).unwrap();
            let total: i64 = ints(&case["row_totals"]).iter().sum();
            assert_eq!(b.positions() as i64, total);
            assert_eq!(ints(&case["counts"]).iter().sum::<i64>(), total);
            let fit = b.finish().unwrap();
            let want = f32s(&case["weight"]);
            let got: Vec<u32> = fit.model.weight().iter().map(|w| w.to_bits()).collect();
            let want: Vec<u32> = want.iter().map(|w| w.to_bits()).collect();
            assert_eq!(got, want, "{}", case["name"]);
        }
    }

    #[test]
    fn out_of_range_id_is_refused() {
        let mut b = CountsBuilder::new(4).unwrap();
        assert!(matches!(
            b.feed([1, 4]),
            Err(TrainError::TokenOutOfRange { id: 4, vocab: 4 })
        ));
    }
}
