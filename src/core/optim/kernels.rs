//! The per-element updates of AdamW and SGD and the per-step scalars they use, the way
//! torch's CPU kernels compute them (`_single_tensor_adam` with decoupled weight decay,
//! `_single_tensor_sgd`).
//!
//! Invariants: one element's update reads only that element's parameter, gradient and
//! state, so a tensor updated in slices gets the same bits as one updated whole; the
//! scalars are computed in f64 (as Python floats) and rounded to f32 where torch
//! rounds them; `lerp_` and `add_(.., alpha)` are fused multiply-adds, the other
//! operations separate roundings in torch's order.

use super::{OptimError, Slot};

/// AdamW's per-step scalars, computed once per step in f64 and rounded to f32 as
/// torch does.
#[derive(Debug, Clone, Copy)]
pub(super) struct AdamwScalars {
    /// `1 - lr * weight_decay`, or `None` when weight_decay is 0 (torch skips it).
    decay: Option<f32>,
    /// `1 - beta1`, the lerp weight.
    lerp_w: f32,
    beta2: f32,
    /// `1 - beta2`.
    one_minus_beta2: f32,
    /// `sqrt(1 - beta2^t)`.
    bc2_sqrt: f32,
    eps: f32,
    /// `-lr / (1 - beta1^t)`.
    neg_step_size: f32,
}

impl AdamwScalars {
    /// The scalars of step `t` (counted from 1). torch keeps `step` as an f32 tensor
    /// and reads it back with `.item()`, so the exponent is a Python float; `powf` is
    /// C's `pow`, as Python's `**` on floats.
    pub(super) fn new(
        t: u64,
        lr: f64,
        (beta1, beta2): (f64, f64),
        eps: f64,
        weight_decay: f64,
    ) -> Self {
        let t = t as f64;
        let bias_correction1 = 1.0 - beta1.powf(t);
        let bias_correction2 = 1.0 - beta2.powf(t);
        let step_size = lr / bias_correction1;
        let bias_correction2_sqrt = bias_correction2.powf(0.5);
        AdamwScalars {
            decay: (weight_decay != 0.0).then_some((1.0 - lr * weight_decay) as f32),
            lerp_w: (1.0 - beta1) as f32,
            beta2: beta2 as f32,
            one_minus_beta2: (1.0 - beta2) as f32,
            bc2_sqrt: bias_correction2_sqrt as f32,
            eps: eps as f32,
            neg_step_size: (-step_size) as f32,
        }
    }

    /// Update the elements `range` of `slot`'s parameter (`p`, gradient `g`).
    pub(super) fn update(
        &self,
        slot: &mut Slot,
        range: std::ops::Range<usize>,
        p: &mut [f32],
        g: &[f32],
    ) -> Result<(), OptimError> {
        let [m, v] = slot.state.as_mut_slice() else {
            return Err(OptimError::State(format!("{}: missing moments", slot.name)));
        };
        let (Some(m), Some(v)) = (m.get_mut(range.clone()), v.get_mut(range)) else {
            return Err(OptimError::State(format!("{}: short moments", slot.name)));
        };
        for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            self.element(p, g, m, v);
        }
        Ok(())
    }
}

/// SGD's per-step scalars (the momentum part is passed separately: it exists only
/// with momentum).
#[derive(Debug, Clone, Copy)]
pub(super) struct SgdScalars {
    pub(super) weight_decay: Option<f32>,
    pub(super) nesterov: bool,
    pub(super) neg_lr: f32,
}

impl SgdScalars {
    /// grad.add(param, alpha=wd): vec::fmadd(param, wd, grad).
    #[inline]
    fn decayed(&self, p: f32, g: f32) -> f32 {
        match self.weight_decay {
            Some(wd) => p.mul_add(wd, g),
            None => g,
        }
    }

    /// Plain SGD: `param.add_(grad, alpha=-lr)`.
    pub(super) fn update_plain(&self, p: &mut [f32], g: &[f32]) {
        for (p, &g) in p.iter_mut().zip(g) {
            let g = self.decayed(*p, g);
            *p = g.mul_add(self.neg_lr, *p);
        }
    }

    /// SGD with momentum `(momentum, 1 - dampening, first step)` over the elements
    /// `range` of `slot`'s buffer.
    pub(super) fn update_momentum(
        &self,
        (mom, one_minus_damp, first): (f32, f32, bool),
        slot: &mut Slot,
        range: std::ops::Range<usize>,
        p: &mut [f32],
        g: &[f32],
    ) -> Result<(), OptimError> {
        let buf = slot
            .state
            .first_mut()
            .and_then(|b| b.get_mut(range))
            .ok_or_else(|| OptimError::State(format!("{}: missing momentum buffer", slot.name)))?;
        for ((p, &g), b) in p.iter_mut().zip(g).zip(buf.iter_mut()) {
            let g = self.decayed(*p, g);
            // First step: buf = clone(grad). Then buf.mul_(m) (one rounding)
            // .add_(grad, alpha=1-dampening) (fused).
            *b = if first {
                g
            } else if one_minus_damp == 1.0 {
                // fma(g, 1, x) rounds g + x once: a plain add, same bits.
                *b * mom + g
            } else {
                g.mul_add(one_minus_damp, *b * mom)
            };
            let d = if self.nesterov {
                (*b).mul_add(mom, g)
            } else {
                *b
            };
            // param.add_(d, alpha=-lr): vec::fmadd(d, -lr, param).
            *p = d.mul_add(self.neg_lr, *p);
        }
        Ok(())
    }
}

/// One AdamW element, torch's `_single_tensor_adam` with decoupled weight decay:
/// `param.mul_(1 - lr*wd)`; `exp_avg.lerp_(grad, 1 - beta1)`;
/// `exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)`;
/// `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`;
/// `param.addcdiv_(exp_avg, denom, value=-step_size)`.
impl AdamwScalars {
    /// One element of the step: parameter `p`, gradient `g`, moments `m` and `v`.
    #[inline]
    fn element(&self, p: &mut f32, g: f32, m: &mut f32, v: &mut f32) {
        if let Some(decay) = self.decay {
            *p *= decay;
        }
        // torch's lerp: weight < 0.5 → fmadd(w, end - self, self), else
        // fmadd(w - 1, end - self, end) (Lerp.h, lerp_vec).
        let lerp_w = self.lerp_w;
        *m = if lerp_w.abs() < 0.5 {
            lerp_w.mul_add(g - *m, *m)
        } else {
            (lerp_w - 1.0).mul_add(g - *m, g)
        };
        // addcmul: self + value * t1 * t2, left to right, unfused.
        *v = *v * self.beta2 + self.one_minus_beta2 * g * g;
        let denom = v.sqrt() / self.bc2_sqrt + self.eps;
        // addcdiv: self + value * t1 / t2, left to right, unfused.
        *p += self.neg_step_size * *m / denom;
    }
}
