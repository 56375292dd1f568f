//! One batch of the token stream: B windows as fresh row-major [B, T] arrays of inputs
//! and targets (tokens.md).
//!
//! Invariants: `inputs` and `targets` each hold `batch * seq_len` values, row `b` being
//! window `b`; a row accessor never indexes out of range.

/// One batch: B windows as fresh row-major [B, T] arrays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// inputs[b * T + t] = ids[o_b + t].
    pub inputs: Vec<i64>,
    /// targets[b * T + t] = ids[o_b + t + 1]: the next token of each input.
    pub targets: Vec<i64>,
    /// B, the number of rows.
    pub batch: usize,
    /// T, the number of columns.
    pub seq_len: usize,
}

impl Batch {
    /// Row `b` of the inputs.
    pub fn input_row(&self, b: usize) -> Option<&[i64]> {
        row(&self.inputs, b, self.seq_len)
    }

    /// Row `b` of the targets.
    pub fn target_row(&self, b: usize) -> Option<&[i64]> {
        row(&self.targets, b, self.seq_len)
    }
}

fn row(values: &[i64], b: usize, t: usize) -> Option<&[i64]> {
    let start = b.checked_mul(t)?;
    values.get(start..start.checked_add(t)?)
}
