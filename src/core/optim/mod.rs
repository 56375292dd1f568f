//! AdamW and SGD with PyTorch's update rules, defaults and f32 arithmetic, over named
//! f32 parameters in a fixed order.
//!
//! Invariants: the update of one element depends only on that element's parameter,
//! gradient and state, so updating a tensor in slices (as the trainer does, to avoid a
//! full gradient buffer) gives the same bits as updating it whole; every scalar is
//! computed the way `torch.optim` computes it (in f64, as Python floats) and rounded to
//! f32 where torch's CPU kernel rounds it; the state (moments, step count and
//! hyperparameters) is the whole optimizer, so exporting and importing it continues a
//! run bit for bit.
//!
//! The per-element operations mirror torch's CPU kernels (`_single_tensor_adam` with
//! `decoupled_weight_decay`, `_single_tensor_sgd`): `lerp_` and `add_(.., alpha)` are
//! written with an explicit fused multiply-add there (`vec::fmadd`), so they are fused
//! here (`f32::mul_add`); `mul_`, `addcmul_`, `addcdiv_`, `sqrt` and `/` are separate
//! roundings in the order torch's kernels write them.
//!
//! The hyper-parameters are defined once, in [`Hyper`]: a run's configuration is
//! [`OptimConfig`] (no step count) and the optimizer's scalar state is
//! [`OptimizerState`] (AdamW's step count too); [`Hyper::with_step`] is the only
//! crossing between them. Their serde form is the JSON of config.json's `optimizer`
//! and of `optimizer.safetensors`' `state`, whose file rules live in
//! `checkpoint::optimizer` (the one home of the optimizer's on-disk form). The state
//! keys (`exp_avg`, ...) are torch's names and are defined here too.
//!
//! This file holds the optimizer over its parameters; the hyper-parameters are in
//! `hyper`, the per-element updates and their scalars in `kernels`.

#[cfg(test)]
pub(crate) mod fixture;
mod hyper;
mod kernels;

use crate::failure::{Failure, FailureKind};
pub use hyper::{
    Hyper, NoStep, OptimConfig, OptimizerState, StepSlot, ADAMW_BETAS, ADAMW_EPS,
    ADAMW_WEIGHT_DECAY, SGD_MOMENTUM,
};
use kernels::{AdamwScalars, SgdScalars};

/// AdamW's per-parameter state arrays (torch's state-dict keys), in file order.
pub const ADAMW_KEYS: [&str; 2] = ["exp_avg", "exp_avg_sq"];
/// SGD's per-parameter state array (with momentum).
pub const SGD_KEYS: [&str; 1] = ["momentum_buffer"];

/// Errors of the optimizers.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OptimError {
    /// A hyperparameter is out of its valid range (torch raises the same).
    #[error("invalid {name}: {value} ({why})")]
    Hyper {
        /// The hyperparameter's name.
        name: &'static str,
        /// The value given.
        value: f64,
        /// The valid range.
        why: &'static str,
    },
    /// A parameter index, slice or gradient does not fit the parameters the optimizer
    /// was built for.
    #[error("parameter {param}: {why}")]
    Shape {
        /// The parameter's name (or index when unknown).
        param: String,
        /// What does not fit.
        why: String,
    },
    /// Imported state is missing a tensor, has one too many, or has the wrong length.
    #[error("optimizer state: {0}")]
    State(String),
}

impl Failure for OptimError {
    fn kind(&self) -> FailureKind {
        match self {
            OptimError::Hyper { .. } | OptimError::Shape { .. } | OptimError::State(_) => {
                FailureKind::Invalid
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Slot {
    name: String,
    len: usize,
    /// AdamW: exp_avg, exp_avg_sq. SGD with momentum: the buffer (empty until the
    /// first step, as torch's `momentum_buffer` is `None` until then).
    state: Vec<Vec<f32>>,
}

/// The f32 scalars of one step, computed once (in f64, as torch's Python code does)
/// and rounded where torch's kernels round them.
#[derive(Debug, Clone, Copy)]
pub struct StepScalars {
    kind: StepKind,
}

#[derive(Debug, Clone, Copy)]
enum StepKind {
    Adamw(AdamwScalars),
    Sgd {
        weight_decay: Option<f32>,
        /// Some((momentum, 1 - dampening, first step)) when momentum != 0.
        momentum: Option<(f32, f32, bool)>,
        nesterov: bool,
        neg_lr: f32,
    },
}

/// An optimizer over a fixed, ordered list of named f32 parameters.
#[derive(Debug, Clone)]
pub struct Optimizer {
    config: OptimConfig,
    step: u64,
    slots: Vec<Slot>,
    /// Scalars of the step in progress (between `begin_step` and the last `update`).
    current: Option<StepScalars>,
}

impl Optimizer {
    /// A fresh optimizer (step 0, zero moments, no momentum buffer) for parameters
    /// given as (name, element count) in their fixed order.
    pub fn new(config: OptimConfig, params: &[(&str, usize)]) -> Result<Self, OptimError> {
        config.validate()?;
        let slots = params
            .iter()
            .map(|&(name, len)| Slot {
                name: name.to_string(),
                len,
                state: match config {
                    Hyper::AdamW { .. } => vec![vec![0.0; len], vec![0.0; len]],
                    Hyper::Sgd { .. } => Vec::new(),
                },
            })
            .collect();
        Ok(Optimizer {
            config,
            step: 0,
            slots,
            current: None,
        })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &OptimConfig {
        &self.config
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// The scalar state (hyper-parameters and AdamW's step) for the checkpoint.
    pub fn state(&self) -> OptimizerState {
        self.config.with_step(self.step)
    }

    /// Start a step: count it and compute its scalars. Every element of every
    /// parameter must then be passed to [`Optimizer::update`] exactly once.
    pub fn begin_step(&mut self) {
        self.step = self.step.saturating_add(1);
        let kind = match self.config {
            Hyper::AdamW {
                lr,
                betas: [beta1, beta2],
                eps,
                weight_decay,
                ..
            } => StepKind::Adamw(AdamwScalars::new(
                self.step,
                lr,
                (beta1, beta2),
                eps,
                weight_decay,
            )),
            Hyper::Sgd {
                lr,
                momentum,
                dampening,
                nesterov,
                weight_decay,
            } => {
                let first = self.slots.iter().any(|s| s.state.is_empty());
                if momentum != 0.0 {
                    for slot in &mut self.slots {
                        if slot.state.is_empty() {
                            slot.state.push(vec![0.0; slot.len]);
                        }
                    }
                }
                StepKind::Sgd {
                    weight_decay: (weight_decay != 0.0).then_some(weight_decay as f32),
                    momentum: (momentum != 0.0).then_some((
                        momentum as f32,
                        (1.0 - dampening) as f32,
                        first,
                    )),
                    nesterov,
                    neg_lr: (-lr) as f32,
                }
            }
        };
        self.current = Some(StepScalars { kind });
    }

    /// Update `param[offset .. offset + p.len()]` of parameter `index` with gradient
    /// `g` (same length), within the step opened by [`Optimizer::begin_step`].
    pub fn update(
        &mut self,
        index: usize,
        offset: usize,
        p: &mut [f32],
        g: &[f32],
    ) -> Result<(), OptimError> {
        let scalars = self.current.ok_or_else(|| {
            OptimError::State("update outside a step (begin_step was not called)".into())
        })?;
        let slot = self.slots.get_mut(index).ok_or_else(|| OptimError::Shape {
            param: index.to_string(),
            why: "no such parameter".into(),
        })?;
        let end = offset.checked_add(p.len()).filter(|&e| e <= slot.len);
        let end = match end {
            Some(end) if g.len() == p.len() => end,
            _ => {
                return Err(OptimError::Shape {
                    param: slot.name.clone(),
                    why: format!(
                        "slice [{offset}, +{}) with a gradient of {} does not fit {} elements",
                        p.len(),
                        g.len(),
                        slot.len
                    ),
                })
            }
        };
        match scalars.kind {
            StepKind::Adamw(scalars) => scalars.update(slot, offset..end, p, g),
            StepKind::Sgd {
                weight_decay,
                momentum,
                nesterov,
                neg_lr,
            } => {
                let sgd = SgdScalars {
                    weight_decay,
                    nesterov,
                    neg_lr,
                };
                match momentum {
                    None => {
                        sgd.update_plain(p, g);
                        Ok(())
                    }
                    Some(m) => sgd.update_momentum(m, slot, offset..end, p, g),
                }
            }
        }
    }

    /// Close the step opened by [`Optimizer::begin_step`].
    pub fn end_step(&mut self) {
        self.current = None;
    }

    /// One whole step over every parameter: `params[i]` and `grads[i]` are parameter
    /// `i` in full.
    pub fn step(&mut self, params: &mut [&mut [f32]], grads: &[&[f32]]) -> Result<(), OptimError> {
        if params.len() != self.slots.len() || grads.len() != self.slots.len() {
            return Err(OptimError::Shape {
                param: "*".into(),
                why: format!(
                    "{} parameters and {} gradients for an optimizer of {}",
                    params.len(),
                    grads.len(),
                    self.slots.len()
                ),
            });
        }
        for (i, slot) in self.slots.iter().enumerate() {
            let plen = params.get(i).map_or(0, |p| p.len());
            if plen != slot.len {
                return Err(OptimError::Shape {
                    param: slot.name.clone(),
                    why: format!("{plen} elements, expected {}", slot.len),
                });
            }
        }
        self.begin_step();
        let result = params
            .iter_mut()
            .zip(grads)
            .enumerate()
            .try_for_each(|(i, (p, g))| self.update(i, 0, p, g));
        self.end_step();
        result
    }

    /// The state tensors as (`<param>.<key>`, values), parameters in their order, keys
    /// in [`OptimConfig::state_keys`] order. SGD before its first step has none.
    pub fn state_tensors(&self) -> Vec<(String, &[f32])> {
        let keys = self.config.state_keys();
        let mut out = Vec::new();
        for slot in &self.slots {
            for (key, values) in keys.iter().zip(&slot.state) {
                out.push((format!("{}.{}", slot.name, key), values.as_slice()));
            }
        }
        out
    }

    /// Rebuild an optimizer from a header and its state tensors (by full name), for
    /// the given parameters. Every expected tensor must be present with the right
    /// length and nothing else; SGD's buffers are absent only at step 0.
    pub fn from_state(
        state: OptimizerState,
        params: &[(&str, usize)],
        mut tensors: std::collections::BTreeMap<String, Vec<f32>>,
    ) -> Result<Self, OptimError> {
        let mut opt = Optimizer::new(state.config(), params)?;
        opt.step = state.step();
        let keys = state.state_keys();
        let sgd_fresh = matches!(state, Hyper::Sgd { .. }) && tensors.is_empty();
        for slot in &mut opt.slots {
            if sgd_fresh {
                break;
            }
            slot.state.clear();
            for key in keys {
                let name = format!("{}.{}", slot.name, key);
                let values = tensors
                    .remove(&name)
                    .ok_or_else(|| OptimError::State(format!("missing tensor {name}")))?;
                if values.len() != slot.len {
                    return Err(OptimError::State(format!(
                        "tensor {name} has {} elements, expected {}",
                        values.len(),
                        slot.len
                    )));
                }
                slot.state.push(values);
            }
        }
        if let Some(name) = tensors.keys().next() {
            return Err(OptimError::State(format!("unexpected tensor {name}")));
        }
        Ok(opt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn adamw_default(lr: f64) -> OptimConfig {
        OptimConfig::adamw(lr)
    }

    #[test]
    fn slices_give_the_same_bits_as_whole_tensors() {
        let params: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        for config in [
            adamw_default(0.05),
            OptimConfig::sgd(0.1, 0.9),
            OptimConfig::sgd(0.1, 0.0),
        ] {
            let mut whole = params.clone();
            let mut sliced = params.clone();
            let mut a = Optimizer::new(config, &[("w", 37)]).unwrap();
            let mut b = Optimizer::new(config, &[("w", 37)]).unwrap();
            for step in 0..4 {
                let g: Vec<f32> = (0..37).map(|i| ((i + step) as f32 * 0.71).cos()).collect();
                a.step(&mut [&mut whole], &[&g]).unwrap();
                b.begin_step();
                for (k, (pc, gc)) in sliced.chunks_mut(5).zip(g.chunks(5)).enumerate() {
                    b.update(0, k * 5, pc, gc).unwrap();
                }
                b.end_step();
            }
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&whole), bits(&sliced), "{config:?}");
        }
    }

    #[test]
    fn first_adamw_step_moves_by_lr_against_the_gradient_sign() {
        // After one step m/(1-b1) = g and sqrt(v/(1-b2)) = |g|, so the update is
        // lr * g / (|g| + eps): about lr, whatever the gradient's scale.
        let mut p = vec![1.0f32, -2.0, 0.5];
        let g = vec![0.3f32, -4.0, 1e-3];
        let mut opt = Optimizer::new(adamw_default(0.01), &[("w", 3)]).unwrap();
        opt.step(&mut [&mut p], &[&g]).unwrap();
        let expect = [
            1.0 * (1.0 - 1e-4) - 0.01,
            -2.0 * (1.0 - 1e-4) + 0.01,
            0.5 * (1.0 - 1e-4) - 0.01,
        ];
        for (got, want) in p.iter().zip(expect) {
            assert!((*got as f64 - want).abs() < 1e-6, "{got} vs {want}");
        }
    }

    #[test]
    fn sgd_without_momentum_has_no_state_and_plain_updates() {
        let mut p = vec![1.0f32, 2.0];
        let mut opt = Optimizer::new(OptimConfig::sgd(0.5, 0.0), &[("w", 2)]).unwrap();
        opt.step(&mut [&mut p], &[&[2.0, -4.0]]).unwrap();
        assert_eq!(p, [0.0, 4.0]);
        assert!(opt.state_tensors().is_empty());
    }

    #[test]
    fn sgd_momentum_first_step_clones_the_gradient() {
        let mut p = vec![0.0f32];
        let mut opt = Optimizer::new(OptimConfig::sgd(1.0, 0.9), &[("w", 1)]).unwrap();
        assert!(
            opt.state_tensors().is_empty(),
            "no buffer before the first step"
        );
        opt.step(&mut [&mut p], &[&[1.0]]).unwrap();
        assert_eq!(p, [-1.0]);
        opt.step(&mut [&mut p], &[&[1.0]]).unwrap();
        // buf = 0.9 * 1 + 1 = 1.9 (in f32), p = -1 - 1.9
        assert_eq!(p, [-1.0 - (0.9f32 + 1.0)]);
        let names: Vec<String> = opt.state_tensors().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["w.momentum_buffer"]);
    }

    #[test]
    fn export_import_continues_bit_for_bit() {
        for config in [adamw_default(0.02), OptimConfig::sgd(0.3, 0.9)] {
            let params = [("a", 5usize), ("b", 3usize)];
            let grad = |s: usize, n: usize| -> Vec<f32> {
                (0..n).map(|i| ((i * 7 + s * 3) as f32).sin()).collect()
            };
            let mut pa = vec![0.1f32; 5];
            let mut pb = vec![-0.2f32; 3];
            let mut opt = Optimizer::new(config, &params).unwrap();
            for s in 0..3 {
                opt.step(&mut [&mut pa, &mut pb], &[&grad(s, 5), &grad(s + 9, 3)])
                    .unwrap();
            }
            let header = opt.state();
            let tensors: BTreeMap<String, Vec<f32>> = opt
                .state_tensors()
                .into_iter()
                .map(|(n, v)| (n, v.to_vec()))
                .collect();
            let mut restored = Optimizer::from_state(header, &params, tensors).unwrap();
            let (mut qa, mut qb) = (pa.clone(), pb.clone());
            for s in 3..6 {
                opt.step(&mut [&mut pa, &mut pb], &[&grad(s, 5), &grad(s + 9, 3)])
                    .unwrap();
                restored
                    .step(&mut [&mut qa, &mut qb], &[&grad(s, 5), &grad(s + 9, 3)])
                    .unwrap();
            }
            assert_eq!(pa, qa);
            assert_eq!(pb, qb);
        }
    }

    #[test]
    fn import_refuses_missing_extra_and_short_tensors() {
        let header = adamw_default(0.01).with_step(1);
        let params = [("w", 2usize)];
        let full = |extra: Option<&str>, len: usize| {
            let mut m = BTreeMap::new();
            m.insert("w.exp_avg".to_string(), vec![0.0; 2]);
            m.insert("w.exp_avg_sq".to_string(), vec![0.0; len]);
            if let Some(e) = extra {
                m.insert(e.to_string(), vec![0.0; 2]);
            }
            m
        };
        assert!(Optimizer::from_state(header, &params, full(None, 2)).is_ok());
        assert!(Optimizer::from_state(header, &params, full(None, 3)).is_err());
        assert!(Optimizer::from_state(header, &params, full(Some("v.exp_avg"), 2)).is_err());
        let mut missing = full(None, 2);
        missing.remove("w.exp_avg");
        assert!(Optimizer::from_state(header, &params, missing).is_err());
    }

    /// Every step of each fixture case against the independent reference
    /// (fixtures/optim), each step started from the reference's own state before it so
    /// that differences do not compound. The reference follows torch's *documented*
    /// formula with every operation rounded separately; this module follows torch's
    /// CPU *kernels* (fused lerp and add-with-alpha, `1 - lr*wd` as one factor,
    /// `lr/bc1` and `sqrt(bc2)` as double scalars), so the bits cannot match
    /// everywhere. Asserted, per element: within 2 ulp measured at the scale of the
    /// operation's operands and results (for the parameter: the parameter before and
    /// after and the update's scale, lr for AdamW, lr * |buffer or gradient| for SGD),
    /// which absorbs a last-bit difference in a subtraction that cancels; and within
    /// 1e-6 * max(1, |ref|) of the float64 evaluation (the fixture README's
    /// tolerance). `cargo test -- --nocapture` prints the largest distances seen.
    #[test]
    #[allow(
        clippy::too_many_lines,
        reason = "one scenario: every fixture case, step by step, against the reference"
    )]
    fn matches_the_independent_reference_fixtures() {
        use super::fixture::{f32s, load, ulps_at};
        let fx = load();
        let cases = fx["optimizers"].as_array().unwrap();
        assert_eq!(cases.len(), 7);
        let mut exact = 0usize;
        let mut total = 0usize;
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let h = &case["hyper"];
            let num = |k: &str| h[k].as_f64().unwrap();
            let config = match case["optimizer"].as_str().unwrap() {
                "adamw" => OptimConfig::AdamW {
                    step: NoStep,
                    lr: num("lr"),
                    betas: [num("beta1"), num("beta2")],
                    eps: num("eps"),
                    weight_decay: num("weight_decay"),
                },
                _ => Hyper::Sgd {
                    lr: num("lr"),
                    momentum: num("momentum"),
                    dampening: num("dampening"),
                    nesterov: h["nesterov"].as_bool().unwrap(),
                    weight_decay: num("weight_decay"),
                },
            };
            let keys = config.state_keys();
            let n = f32s(&case["param0"]).len();
            let mut prev_p = f32s(&case["param0"]);
            let mut prev_state: Vec<Vec<f32>> = match config {
                Hyper::AdamW { .. } => vec![vec![0.0; n], vec![0.0; n]],
                Hyper::Sgd { .. } => vec![],
            };
            let mut worst = 0.0f64;
            for (t, step) in case["steps"].as_array().unwrap().iter().enumerate() {
                let tensors = keys
                    .iter()
                    .zip(&prev_state)
                    .map(|(k, v)| (format!("w.{k}"), v.clone()))
                    .collect();
                let header = config.with_step(t as u64);
                let mut opt = Optimizer::from_state(header, &[("w", n)], tensors).unwrap();
                let g = f32s(&step["grad"]);
                let mut p = prev_p.clone();
                opt.step(&mut [&mut p], &[&g]).unwrap();
                let state: Vec<Vec<f32>> = opt
                    .state_tensors()
                    .iter()
                    .map(|(_, v)| v.to_vec())
                    .collect();
                let lr = config.lr() as f32;
                let mut compare = |label: &str, ours: &[f32], scale: &dyn Fn(usize) -> Vec<f32>| {
                    let want = f32s(&step[label]);
                    let want64: Vec<f64> = step[format!("{label}_f64").as_str()]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|s| {
                            f64::from_bits(u64::from_str_radix(s.as_str().unwrap(), 16).unwrap())
                        })
                        .collect();
                    for i in 0..n {
                        total += 1;
                        exact += usize::from(ours[i].to_bits() == want[i].to_bits());
                        let mut s = scale(i);
                        s.extend([ours[i], want[i]]);
                        let d = ulps_at(ours[i], want[i], &s);
                        worst = worst.max(d);
                        assert!(
                            d <= 2.0,
                            "{name} step {} {label}[{i}]: {} vs {} ({d} ulp)",
                            t + 1,
                            ours[i],
                            want[i]
                        );
                        let tol = 1e-6 * want64[i].abs().max(1.0);
                        assert!(
                            (ours[i] as f64 - want64[i]).abs() <= tol,
                            "{name} {label}[{i}] vs f64"
                        );
                    }
                };
                match config {
                    Hyper::AdamW { .. } => {
                        compare("param", &p, &|i| vec![prev_p[i], lr]);
                        compare("exp_avg", &state[0], &|i| vec![prev_state[0][i], g[i]]);
                        compare("exp_avg_sq", &state[1], &|i| {
                            vec![prev_state[1][i], g[i] * g[i]]
                        });
                    }
                    Hyper::Sgd {
                        momentum,
                        weight_decay,
                        ..
                    } => {
                        let wd = weight_decay as f32;
                        let d: Vec<f32> = if momentum != 0.0 {
                            state[0].clone()
                        } else {
                            g.clone()
                        };
                        compare("param", &p, &|i| vec![prev_p[i], lr * d[i], lr * g[i]]);
                        if momentum != 0.0 {
                            let prev_b =
                                prev_state.first().cloned().unwrap_or_else(|| vec![0.0; n]);
                            compare("momentum_buffer", &state[0], &|i| {
                                vec![prev_b[i], g[i], prev_p[i] * wd]
                            });
                        } else {
                            assert!(state.is_empty());
                        }
                    }
                }
                prev_p = f32s(&step["param"]);
                prev_state = keys.iter().map(|k| f32s(&step[*k])).collect();
            }
            eprintln!("{name}: at most {worst} ulp (operand scale) from the reference");
        }
        eprintln!("{exact} of {total} values bit-identical to the documented-order reference");
    }

    /// A configuration and a state are one type: the state is the configuration with
    /// AdamW's step after the tag; SGD's has none and reads back at step 0.
    #[test]
    fn config_and_state_are_one_definition() {
        let config = OptimConfig::adamw(0.003).with_weight_decay(0.0);
        let state = config.with_step(7);
        assert_eq!(state.step(), 7);
        assert_eq!(state.config(), config);
        assert_eq!(
            serde_json::to_string(&config).unwrap(),
            r#"{"type":"adamw","lr":0.003,"betas":[0.9,0.999],"eps":1e-8,"weight_decay":0.0}"#
        );
        assert_eq!(
            serde_json::to_string(&state).unwrap(),
            r#"{"type":"adamw","step":7,"lr":0.003,"betas":[0.9,0.999],"eps":1e-8,"weight_decay":0.0}"#
        );
        // A configuration never carries a step; a state always does (AdamW).
        let with_step = serde_json::to_string(&state).unwrap();
        assert!(serde_json::from_str::<OptimConfig>(&with_step).is_err());
        let without = serde_json::to_string(&config).unwrap();
        assert!(serde_json::from_str::<OptimizerState>(&without).is_err());
        let sgd = OptimConfig::sgd(0.1, 0.9);
        assert_eq!(sgd.with_step(5).step(), 0);
        assert_eq!(sgd.with_step(5).config(), sgd);
        assert_eq!(
            serde_json::to_string(&sgd).unwrap(),
            serde_json::to_string(&sgd.with_step(5)).unwrap()
        );
    }

    #[test]
    fn invalid_hyperparameters_are_refused() {
        assert!(Optimizer::new(OptimConfig::adamw(-1.0), &[]).is_err());
        assert!(Optimizer::new(OptimConfig::adamw(f64::NAN), &[]).is_err());
        assert!(Optimizer::new(OptimConfig::sgd(0.1, -0.5), &[]).is_err());
        let bad_beta = OptimConfig::AdamW {
            step: NoStep,
            lr: 0.1,
            betas: [1.0, 0.999],
            eps: 1e-8,
            weight_decay: 0.0,
        };
        assert!(bad_beta.validate().is_err());
    }
}
