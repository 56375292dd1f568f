//! The optimizer's hyper-parameters, defined once in [`Hyper`]: a run's configuration
//! ([`OptimConfig`], no step count) and the optimizer's scalar state
//! ([`OptimizerState`], AdamW's step count too), their torch defaults and their checks.
//!
//! Invariants: [`Hyper::with_step`] is the only crossing between a configuration and a
//! state; the serde form is the JSON of config.json's `optimizer` and of
//! `optimizer.safetensors`' `state`, so its field order is part of a run's identity
//! bytes; a configuration with a `step` key is refused.

use serde::{Deserialize, Serialize};

use super::{OptimError, ADAMW_KEYS, SGD_KEYS};

/// PyTorch's AdamW defaults.
pub const ADAMW_BETAS: [f64; 2] = [0.9, 0.999];
/// PyTorch's AdamW default epsilon.
pub const ADAMW_EPS: f64 = 1e-8;
/// PyTorch's AdamW default decoupled weight decay.
pub const ADAMW_WEIGHT_DECAY: f64 = 0.01;
/// The SGD momentum `tlio train` uses unless told otherwise (torch's own default is 0).
pub const SGD_MOMENTUM: f64 = 0.9;

/// Where a [`Hyper`] keeps AdamW's step count: `u64` in the optimizer's state
/// ([`OptimizerState`]), nothing in a run's configuration ([`OptimConfig`]).
pub trait StepSlot: Copy + PartialEq + std::fmt::Debug {
    /// True when the slot holds nothing and is left out of the JSON form.
    fn is_absent(&self) -> bool;
}

impl StepSlot for u64 {
    fn is_absent(&self) -> bool {
        false
    }
}

/// No step count: a configuration says how to step, not how far it got. Its JSON form
/// is absence; a `step` key in a configuration is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NoStep;

impl StepSlot for NoStep {
    fn is_absent(&self) -> bool {
        true
    }
}

impl Serialize for NoStep {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Never reached through `Hyper` (the field is skipped when absent).
        serializer.serialize_none()
    }
}

impl<'de> Deserialize<'de> for NoStep {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Absent;
        impl<'de> serde::de::Visitor<'de> for Absent {
            type Value = NoStep;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("no `step` (the step count is state, not config)")
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<NoStep, E> {
                Ok(NoStep)
            }
        }
        // A missing field reaches here as `none`; any present value is refused.
        deserializer.deserialize_option(Absent)
    }
}

/// The optimizer's hyper-parameters, defined once: with `S = NoStep` the `optimizer`
/// object of a run's config.json ([`OptimConfig`]), with `S = u64` the scalar state of
/// `optimizer.safetensors` ([`OptimizerState`], AdamW's step count after the tag; SGD's
/// update does not depend on the step, so its state has none). The serde form is both
/// files' JSON (the checkpoint core reads and writes it), so the field order is part
/// of a run's identity bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum Hyper<S: StepSlot> {
    /// `torch.optim.AdamW` (decoupled weight decay).
    #[serde(rename = "adamw")]
    AdamW {
        /// Steps taken (bias correction uses it); absent in a configuration.
        #[serde(skip_serializing_if = "StepSlot::is_absent")]
        step: S,
        /// Learning rate.
        lr: f64,
        /// (beta1, beta2).
        betas: [f64; 2],
        /// Added to the denominator.
        eps: f64,
        /// Decoupled weight decay.
        weight_decay: f64,
    },
    /// `torch.optim.SGD`.
    #[serde(rename = "sgd")]
    Sgd {
        /// Learning rate.
        lr: f64,
        /// Momentum factor (0 = plain SGD, no buffer).
        momentum: f64,
        /// Dampening for momentum.
        dampening: f64,
        /// Nesterov momentum.
        nesterov: bool,
        /// L2 penalty added to the gradient.
        weight_decay: f64,
    },
}

/// A run's optimizer configuration: the hyper-parameters without a step count.
pub type OptimConfig = Hyper<NoStep>;

/// The optimizer's scalar state: the hyper-parameters and AdamW's step count (the
/// metadata `state` of `optimizer.safetensors`; its file rules are in
/// `checkpoint::optimizer`).
pub type OptimizerState = Hyper<u64>;

impl OptimConfig {
    /// AdamW with torch's defaults and the given learning rate.
    pub fn adamw(lr: f64) -> Self {
        Hyper::AdamW {
            step: NoStep,
            lr,
            betas: ADAMW_BETAS,
            eps: ADAMW_EPS,
            weight_decay: ADAMW_WEIGHT_DECAY,
        }
    }

    /// SGD with the given learning rate and momentum, torch's defaults otherwise.
    pub fn sgd(lr: f64, momentum: f64) -> Self {
        Hyper::Sgd {
            lr,
            momentum,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }
}

impl OptimizerState {
    /// Optimizer steps taken (0 for SGD, whose state does not count them).
    pub fn step(&self) -> u64 {
        match *self {
            Hyper::AdamW { step, .. } => step,
            Hyper::Sgd { .. } => 0,
        }
    }
}

/// One hyper-parameter check: `Ok` when `ok`, else the value and its valid range.
fn check(name: &'static str, value: f64, ok: bool, why: &'static str) -> Result<(), OptimError> {
    if ok {
        Ok(())
    } else {
        Err(OptimError::Hyper { name, value, why })
    }
}

/// Finite and not negative (learning rates, epsilons, weight decays, momenta).
fn check_non_negative(name: &'static str, value: f64) -> Result<(), OptimError> {
    check(
        name,
        value,
        value.is_finite() && value >= 0.0,
        "must be finite and >= 0",
    )
}

impl<S: StepSlot> Hyper<S> {
    /// The same hyper-parameters with `step` in the step slot (AdamW only: SGD has
    /// none). The one crossing between a configuration and a state.
    pub fn with_step<T: StepSlot>(self, step: T) -> Hyper<T> {
        match self {
            Hyper::AdamW {
                lr,
                betas,
                eps,
                weight_decay,
                ..
            } => Hyper::AdamW {
                step,
                lr,
                betas,
                eps,
                weight_decay,
            },
            Hyper::Sgd {
                lr,
                momentum,
                dampening,
                nesterov,
                weight_decay,
            } => Hyper::Sgd {
                lr,
                momentum,
                dampening,
                nesterov,
                weight_decay,
            },
        }
    }

    /// The hyper-parameters without the step count.
    pub fn config(self) -> OptimConfig {
        self.with_step(NoStep)
    }

    /// The same hyper-parameters with weight decay `wd` (AdamW's is decoupled, SGD's
    /// an L2 penalty).
    pub fn with_weight_decay(mut self, wd: f64) -> Self {
        match &mut self {
            Hyper::AdamW { weight_decay, .. } | Hyper::Sgd { weight_decay, .. } => {
                *weight_decay = wd;
            }
        }
        self
    }

    /// The learning rate.
    pub fn lr(&self) -> f64 {
        match *self {
            Hyper::AdamW { lr, .. } | Hyper::Sgd { lr, .. } => lr,
        }
    }

    /// `"adamw"` or `"sgd"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Hyper::AdamW { .. } => "adamw",
            Hyper::Sgd { .. } => "sgd",
        }
    }

    /// The state keys stored per parameter (`<param>.<key>`), in file order.
    pub fn state_keys(&self) -> &'static [&'static str] {
        match *self {
            Hyper::AdamW { .. } => &ADAMW_KEYS,
            Hyper::Sgd { momentum, .. } if momentum != 0.0 => &SGD_KEYS,
            Hyper::Sgd { .. } => &[],
        }
    }

    /// Check every hyperparameter the way torch's constructors do.
    pub fn validate(&self) -> Result<(), OptimError> {
        match *self {
            Hyper::AdamW {
                lr,
                betas: [beta1, beta2],
                eps,
                weight_decay,
                ..
            } => {
                check_non_negative("lr", lr)?;
                let unit = "must be in [0, 1)";
                check("beta1", beta1, (0.0..1.0).contains(&beta1), unit)?;
                check("beta2", beta2, (0.0..1.0).contains(&beta2), unit)?;
                check_non_negative("eps", eps)?;
                check_non_negative("weight_decay", weight_decay)
            }
            Hyper::Sgd {
                lr,
                momentum,
                dampening,
                nesterov,
                weight_decay,
            } => {
                check_non_negative("lr", lr)?;
                check_non_negative("momentum", momentum)?;
                check(
                    "dampening",
                    dampening,
                    dampening.is_finite(),
                    "must be finite",
                )?;
                check_non_negative("weight_decay", weight_decay)?;
                check(
                    "momentum",
                    momentum,
                    !nesterov || (momentum > 0.0 && dampening == 0.0),
                    "nesterov needs momentum > 0 and dampening 0",
                )
            }
        }
    }
}
