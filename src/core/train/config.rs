//! `DIR/config.json`: what defines a training run's trajectory, in deterministic bytes,
//! and the field-by-field check a resumed run makes against its checkpoint's copy.
//!
//! Invariants: the bytes depend only on the flags that change what the run computes
//! (method, data, vocabulary, batch, seq-len, seed, optimizer and its hyperparameters),
//! never on a path, a time or the machine; flags that only steer the run (`--out`,
//! `--max-steps`, `--ckpt-every`, `--keep`, `--log-every`, `--resume`) are left out, so
//! a run can be extended or checkpointed differently without changing its identity.
//! Shards are named by content (sha256 of the whole file and id count), not by path:
//! the same data under another name or directory is the same run.

use serde::{Deserialize, Serialize};

use super::Field;
use crate::optim::{Hyper, OptimConfig};

/// The `format` value of a train config.
pub const CONFIG_FORMAT: &str = "tlio-train-bigram";
/// The config schema's version.
pub const CONFIG_VERSION: u32 = 1;

/// One shard of the run's data, by content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataId {
    /// sha256 of the whole shard file (header and ids), lowercase hex.
    pub sha256: String,
    /// Number of ids in the shard.
    pub tokens: u64,
}

/// The run's identity, as written to `DIR/config.json` and into every checkpoint.
/// Keys in this order, every key always written (null where a method has no use for
/// it: the count model has no batch, seq-len, seed or optimizer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// [`CONFIG_FORMAT`].
    pub format: String,
    /// [`CONFIG_VERSION`].
    pub version: u32,
    /// `"bigram"`.
    pub model: String,
    /// `"gradient"` or `"counts"`.
    pub method: String,
    /// V.
    pub vocab_size: u32,
    /// The shards, in stream order.
    pub data: Vec<DataId>,
    /// B.
    pub batch: Option<u64>,
    /// T.
    pub seq_len: Option<u64>,
    /// `--seed`.
    pub seed: Option<u64>,
    /// The optimizer and its hyperparameters (the step count is state, not config).
    pub optimizer: Option<OptimConfig>,
}

/// A difference between the checkpoint's config and this run's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The field that differs.
    pub field: Field,
    /// The data shard that differs, when `field` is `data` and the counts agree.
    pub shard: Option<usize>,
    /// The checkpoint's value.
    pub checkpoint: String,
    /// This run's value.
    pub given: String,
}

fn opt_text<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or("none".to_string(), |x| x.to_string())
}

impl RunConfig {
    /// The compact JSON bytes, followed by a newline.
    #[allow(
        clippy::expect_used,
        reason = "serde_json fails only on non-string map keys or a failing Serialize impl; this struct has neither"
    )]
    pub fn to_bytes(&self) -> Vec<u8> {
        // A non-finite float (refused earlier by the optimizer's validation) would
        // become null and then fail the comparison, never pass silently.
        let mut bytes = serde_json::to_vec(self)
            .expect("invariant: a RunConfig of strings, integers and floats serializes");
        bytes.push(b'\n');
        bytes
    }

    /// Parse config bytes strictly (unknown keys refused).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    /// The first field where `self` (the checkpoint's) and `given` (this run's)
    /// differ, named by its field: the method, then the spec's order (data, vocabulary,
    /// batch, seq-len, seed, optimizer and its hyperparameters).
    pub fn first_mismatch(&self, given: &RunConfig) -> Option<Mismatch> {
        let m = |field: Field, c: String, g: String| {
            Some(Mismatch {
                field,
                shard: None,
                checkpoint: c,
                given: g,
            })
        };
        if self.format != given.format || self.version != given.version || self.model != given.model
        {
            return m(
                Field::ConfigFormat,
                format!("{} v{} {}", self.format, self.version, self.model),
                format!("{} v{} {}", given.format, given.version, given.model),
            );
        }
        // The method first: with another method every later field differs too.
        if self.method != given.method {
            return m(Field::Method, self.method.clone(), given.method.clone());
        }
        if self.data.len() != given.data.len() {
            return m(
                Field::Data,
                format!("{} shard(s)", self.data.len()),
                format!("{} shard(s)", given.data.len()),
            );
        }
        for (i, (c, g)) in self.data.iter().zip(&given.data).enumerate() {
            if c != g {
                return Some(Mismatch {
                    field: Field::Data,
                    shard: Some(i),
                    checkpoint: format!("sha256 {} with {} ids", c.sha256, c.tokens),
                    given: format!("sha256 {} with {} ids", g.sha256, g.tokens),
                });
            }
        }
        if self.vocab_size != given.vocab_size {
            return m(
                Field::VocabSize,
                self.vocab_size.to_string(),
                given.vocab_size.to_string(),
            );
        }
        if self.batch != given.batch {
            return m(Field::Batch, opt_text(&self.batch), opt_text(&given.batch));
        }
        if self.seq_len != given.seq_len {
            return m(
                Field::SeqLen,
                opt_text(&self.seq_len),
                opt_text(&given.seq_len),
            );
        }
        if self.seed != given.seed {
            return m(Field::Seed, opt_text(&self.seed), opt_text(&given.seed));
        }
        optim_mismatch(self.optimizer.as_ref(), given.optimizer.as_ref())
    }
}

/// Floats compare by bits: a resumed run must use the identical value.
fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits()
}

fn optim_mismatch(c: Option<&OptimConfig>, g: Option<&OptimConfig>) -> Option<Mismatch> {
    let m = |field: Field, c: String, g: String| {
        Some(Mismatch {
            field,
            shard: None,
            checkpoint: c,
            given: g,
        })
    };
    let kind = |o: Option<&OptimConfig>| o.map_or("none", OptimConfig::kind).to_string();
    match (c, g) {
        (None, None) => None,
        (
            Some(&Hyper::AdamW {
                lr: l1,
                betas: b1,
                eps: e1,
                weight_decay: w1,
                ..
            }),
            Some(&Hyper::AdamW {
                lr: l2,
                betas: b2,
                eps: e2,
                weight_decay: w2,
                ..
            }),
        ) => {
            if !same(l1, l2) {
                m(Field::Lr, l1.to_string(), l2.to_string())
            } else if !same(w1, w2) {
                m(Field::WeightDecay, w1.to_string(), w2.to_string())
            } else if !b1.iter().zip(&b2).all(|(x, y)| same(*x, *y)) {
                // Written as the config.json array.
                m(Field::Betas, format!("{b1:?}"), format!("{b2:?}"))
            } else if !same(e1, e2) {
                m(Field::Eps, e1.to_string(), e2.to_string())
            } else {
                None
            }
        }
        (
            Some(&Hyper::Sgd {
                lr: l1,
                momentum: m1,
                dampening: d1,
                nesterov: n1,
                weight_decay: w1,
            }),
            Some(&Hyper::Sgd {
                lr: l2,
                momentum: m2,
                dampening: d2,
                nesterov: n2,
                weight_decay: w2,
            }),
        ) => {
            if !same(l1, l2) {
                m(Field::Lr, l1.to_string(), l2.to_string())
            } else if !same(m1, m2) {
                m(Field::Momentum, m1.to_string(), m2.to_string())
            } else if !same(w1, w2) {
                m(Field::WeightDecay, w1.to_string(), w2.to_string())
            } else if !same(d1, d2) {
                m(Field::Dampening, d1.to_string(), d2.to_string())
            } else if n1 != n2 {
                m(Field::Nesterov, n1.to_string(), n2.to_string())
            } else {
                None
            }
        }
        (c, g) => m(Field::Optimizer, kind(c), kind(g)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::NoStep;

    fn config() -> RunConfig {
        RunConfig {
            format: CONFIG_FORMAT.into(),
            version: CONFIG_VERSION,
            model: "bigram".into(),
            method: "gradient".into(),
            vocab_size: 256,
            data: vec![DataId {
                sha256: "ab".repeat(32),
                tokens: 1000,
            }],
            batch: Some(4),
            seq_len: Some(16),
            seed: Some(7),
            optimizer: Some(OptimConfig::adamw(0.01)),
        }
    }

    #[test]
    fn bytes_are_fixed_and_round_trip() {
        let c = config();
        let text = String::from_utf8(c.to_bytes()).unwrap();
        assert_eq!(
            text,
            format!(
                "{{\"format\":\"tlio-train-bigram\",\"version\":1,\"model\":\"bigram\",\"method\":\"gradient\",\"vocab_size\":256,\"data\":[{{\"sha256\":\"{}\",\"tokens\":1000}}],\"batch\":4,\"seq_len\":16,\"seed\":7,\"optimizer\":{{\"type\":\"adamw\",\"lr\":0.01,\"betas\":[0.9,0.999],\"eps\":1e-8,\"weight_decay\":0.01}}}}\n",
                "ab".repeat(32)
            )
        );
        assert_eq!(RunConfig::from_bytes(text.as_bytes()).unwrap(), c);
        assert!(
            RunConfig::from_bytes(text.replace("\"seed\"", "\"x\":1,\"seed\"").as_bytes()).is_err()
        );
    }

    /// The exact config.json bytes of one AdamW and one SGD run: the optimizer's JSON
    /// form is part of the run's identity and must never drift.
    #[test]
    fn optimizer_bytes_are_fixed() {
        let head = format!(
            "{{\"format\":\"tlio-train-bigram\",\"version\":1,\"model\":\"bigram\",\"method\":\"gradient\",\"vocab_size\":256,\"data\":[{{\"sha256\":\"{}\",\"tokens\":1000}}],\"batch\":4,\"seq_len\":16,\"seed\":7,\"optimizer\":",
            "ab".repeat(32)
        );
        let cases = [
            (
                OptimConfig::AdamW {
                    step: NoStep,
                    lr: 0.003,
                    betas: [0.8, 0.95],
                    eps: 1e-6,
                    weight_decay: 0.0,
                },
                "{\"type\":\"adamw\",\"lr\":0.003,\"betas\":[0.8,0.95],\"eps\":1e-6,\"weight_decay\":0.0}}\n",
            ),
            (
                OptimConfig::Sgd {
                    lr: 0.1,
                    momentum: 0.9,
                    dampening: 0.0,
                    nesterov: true,
                    weight_decay: 0.0001,
                },
                "{\"type\":\"sgd\",\"lr\":0.1,\"momentum\":0.9,\"dampening\":0.0,\"nesterov\":true,\"weight_decay\":0.0001}}\n",
            ),
        ];
        for (optim, tail) in cases {
            let mut c = config();
            c.optimizer = Some(optim);
            let bytes = c.to_bytes();
            assert_eq!(
                String::from_utf8(bytes.clone()).unwrap(),
                format!("{head}{tail}")
            );
            assert_eq!(RunConfig::from_bytes(&bytes).unwrap(), c);
        }
        let mut counts = config();
        counts.method = "counts".into();
        counts.batch = None;
        counts.seq_len = None;
        counts.seed = None;
        counts.optimizer = None;
        assert!(String::from_utf8(counts.to_bytes())
            .unwrap()
            .ends_with("\"batch\":null,\"seq_len\":null,\"seed\":null,\"optimizer\":null}\n"));
    }

    #[test]
    fn optimizer_mismatch_texts_are_fixed() {
        let with = |o: Option<OptimConfig>| {
            let mut g = config();
            g.optimizer = o;
            g
        };
        let betas = OptimConfig::AdamW {
            step: NoStep,
            lr: 0.01,
            betas: [0.8, 0.999],
            eps: 1e-8,
            weight_decay: 0.01,
        };
        let m = config().first_mismatch(&with(Some(betas))).unwrap();
        assert_eq!(
            (m.field, m.checkpoint.as_str(), m.given.as_str()),
            (Field::Betas, "[0.9, 0.999]", "[0.8, 0.999]")
        );
        let m = config()
            .first_mismatch(&with(Some(OptimConfig::sgd(0.01, 0.9))))
            .unwrap();
        assert_eq!((m.checkpoint.as_str(), m.given.as_str()), ("adamw", "sgd"));
        let m = config().first_mismatch(&with(None)).unwrap();
        assert_eq!(
            (m.field, m.checkpoint.as_str(), m.given.as_str()),
            (Field::Optimizer, "adamw", "none")
        );
    }

    #[test]
    fn mismatches_name_the_field() {
        let c = config();
        assert_eq!(c.first_mismatch(&c), None);
        type Change = Box<dyn Fn(&mut RunConfig)>;
        let cases: Vec<((Field, Option<usize>), Change)> = vec![
            ((Field::Batch, None), Box::new(|g| g.batch = Some(5))),
            ((Field::SeqLen, None), Box::new(|g| g.seq_len = Some(5))),
            ((Field::Seed, None), Box::new(|g| g.seed = Some(8))),
            (
                (Field::Method, None),
                Box::new(|g| g.method = "counts".into()),
            ),
            (
                (Field::Data, None),
                Box::new(|g| g.data.push(g.data[0].clone())),
            ),
            ((Field::Data, Some(0)), Box::new(|g| g.data[0].tokens = 999)),
            (
                (Field::Lr, None),
                Box::new(|g| g.optimizer = Some(OptimConfig::adamw(0.02))),
            ),
            (
                (Field::Optimizer, None),
                Box::new(|g| g.optimizer = Some(OptimConfig::sgd(0.01, 0.9))),
            ),
            (
                (Field::WeightDecay, None),
                Box::new(|g| {
                    g.optimizer = Some(OptimConfig::AdamW {
                        step: NoStep,
                        lr: 0.01,
                        betas: [0.9, 0.999],
                        eps: 1e-8,
                        weight_decay: 0.0,
                    })
                }),
            ),
        ];
        for (field, change) in cases {
            let mut g = config();
            change(&mut g);
            let m = c.first_mismatch(&g).unwrap();
            assert_eq!((m.field, m.shard), field);
        }
        let sgd = |mom| {
            let mut g = config();
            g.optimizer = Some(OptimConfig::sgd(0.1, mom));
            g
        };
        assert_eq!(
            sgd(0.9).first_mismatch(&sgd(0.5)).unwrap().field,
            Field::Momentum
        );
    }
}
