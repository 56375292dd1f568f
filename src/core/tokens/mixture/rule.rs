//! The source of each window of a mixture (scale.md section 8): Megatron's and
//! nanotron's greedy rule. Window `k` of a stage comes from the source `j` that
//! maximises `w_j * (k + 1) - n_j`, `n_j` counting the stage's earlier windows from
//! `j`, ties to the lowest `j`; and the checks of the weights and stages it runs on.
//!
//! Invariants: the rule draws from no generator, so the sequence of sources is a
//! function of the weights and the window's index in its stage alone; a [`Rule`]'s
//! counts always sum to the windows it has assigned since its stage started; weights
//! that reach a rule are finite, positive and sum to 1 (normalised after a check that
//! their sum is within [`WEIGHT_SUM_TOLERANCE`] of 1, so a typo is refused, never
//! silently renormalised).

use super::super::TokensError;

/// How far from 1 the weights' sum may be before it is refused.
pub const WEIGHT_SUM_TOLERANCE: f64 = 1e-6;

/// Most sources of one mixture: each one's cursor travels in the mixture's cursor,
/// which must stay well under the cursor file limit.
pub const MAX_SOURCES: usize = 64;

/// From global batch `batch` on, the rule uses `weights` (one per source, in the
/// sources' order).
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// The first global batch of the stage.
    pub batch: u64,
    /// One weight per source, summing to 1.
    pub weights: Vec<f64>,
}

fn mixture_err(reason: impl Into<String>) -> TokensError {
    TokensError::BadMixture {
        reason: reason.into(),
    }
}

/// Check one stage's weights for `sources` sources (finite, > 0, summing to 1 within
/// [`WEIGHT_SUM_TOLERANCE`]) and return them normalised by their sum. `what` names the
/// stage in the error.
pub fn check_weights(weights: &[f64], sources: usize, what: &str) -> Result<Vec<f64>, TokensError> {
    if weights.len() != sources {
        return Err(mixture_err(format!(
            "{what} has {} weight(s) for {sources} source(s)",
            weights.len()
        )));
    }
    for (j, &w) in weights.iter().enumerate() {
        if !w.is_finite() || w <= 0.0 {
            return Err(mixture_err(format!(
                "{what}: the weight of source {j} is {w}; a weight is a finite number above 0"
            )));
        }
    }
    let sum: f64 = weights.iter().sum();
    if (sum - 1.0).abs() > WEIGHT_SUM_TOLERANCE {
        return Err(mixture_err(format!(
            "{what}: the weights sum to {sum}, not 1 (within {WEIGHT_SUM_TOLERANCE}); \
             weights are never renormalised silently"
        )));
    }
    Ok(weights.iter().map(|w| w / sum).collect())
}

/// Check a stage list: at least one stage, the first at batch 0, batches strictly
/// increasing, each stage's weights as [`check_weights`]; returns it normalised.
pub fn check_stages(stages: &[Stage], sources: usize) -> Result<Vec<Stage>, TokensError> {
    if sources == 0 {
        return Err(mixture_err("a mixture needs at least one source"));
    }
    if sources > MAX_SOURCES {
        return Err(TokensError::TooLarge {
            name: "the number of sources",
            value: sources as u64,
            limit: MAX_SOURCES as u64,
        });
    }
    let Some(first) = stages.first() else {
        return Err(mixture_err("a mixture needs at least one stage of weights"));
    };
    if first.batch != 0 {
        return Err(mixture_err(format!(
            "the first stage starts at global batch {}, it must start at 0",
            first.batch
        )));
    }
    let mut out = Vec::with_capacity(stages.len());
    for (k, stage) in stages.iter().enumerate() {
        if let Some(prev) = k.checked_sub(1).and_then(|p| stages.get(p)) {
            if stage.batch <= prev.batch {
                return Err(mixture_err(format!(
                    "stage {k} starts at global batch {}, not after stage {} (batch {}): \
                     stages start at increasing batches",
                    stage.batch,
                    k - 1,
                    prev.batch
                )));
            }
        }
        let weights = check_weights(&stage.weights, sources, &format!("stage {k}"))?;
        out.push(Stage {
            batch: stage.batch,
            weights,
        });
    }
    Ok(out)
}

/// The index of the stage in force at global batch `batch`: the last one starting at
/// or before it (stages are checked: the first starts at 0).
pub fn stage_at(stages: &[Stage], batch: u64) -> usize {
    stages.iter().rposition(|s| s.batch <= batch).unwrap_or(0)
}

/// The source of the next window given the weights, the window's index `k` in its
/// stage and the stage's counts so far: the `j` maximising `w_j * (k + 1) - n_j`,
/// ties to the lowest `j`.
pub fn choose(weights: &[f64], k: u64, counts: &[u64]) -> usize {
    let due = (k as f64) + 1.0;
    let mut best = 0;
    let mut best_lag = f64::NEG_INFINITY;
    for (j, (&w, &n)) in weights.iter().zip(counts).enumerate() {
        let lag = w * due - n as f64;
        // Strictly greater: a tie keeps the lower index.
        if lag > best_lag {
            best = j;
            best_lag = lag;
        }
    }
    best
}

/// The rule's state within a stage: which stage, the global window it started at,
/// and each source's count since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The stage's index.
    pub stage: usize,
    /// The global index of the stage's first window.
    pub start: u64,
    /// Windows assigned to each source since `start`.
    pub counts: Vec<u64>,
}

impl Rule {
    /// A stage `stage` starting at global window `start`, nothing assigned yet.
    pub fn fresh(stage: usize, start: u64, sources: usize) -> Rule {
        Rule {
            stage,
            start,
            counts: vec![0; sources],
        }
    }

    /// The source of global window `window` (the next one: `start + sum(counts)`),
    /// counted.
    pub fn next(&mut self, weights: &[f64], window: u64) -> usize {
        let k = window.saturating_sub(self.start);
        let j = choose(weights, k, &self.counts);
        if let Some(n) = self.counts.get_mut(j) {
            *n = n.saturating_add(1);
        }
        j
    }

    /// The windows assigned since the stage started.
    pub fn assigned(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, &n| a.saturating_add(n))
    }
}

/// The sources of global windows `0 .. count` of a mixture with `stages` and
/// `global_batch` windows per global batch, stage by stage (for reports and tests).
pub fn sources_of(stages: &[Stage], global_batch: u64, count: u64) -> Vec<usize> {
    let sources = stages.first().map_or(0, |s| s.weights.len());
    let mut rule = Rule::fresh(0, 0, sources);
    let mut out = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
    for g in 0..count {
        if global_batch > 0 && g.is_multiple_of(global_batch) {
            let stage = stage_at(stages, g / global_batch);
            if stage != rule.stage {
                rule = Rule::fresh(stage, g, sources);
            }
        }
        let weights = stages.get(rule.stage).map_or(&[][..], |s| &s.weights[..]);
        out.push(rule.next(weights, g));
    }
    out
}
