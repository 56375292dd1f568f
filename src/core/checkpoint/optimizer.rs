//! `optimizer.safetensors`: the optimizer's arrays as F32 tensors named
//! `<parameter>.<state key>` and the rest of its state as compact JSON in the metadata
//! key `state` (checkpoint.md).
//!
//! This module is the one home of the optimizer's on-disk form: the metadata keys, the
//! tensor naming and layout rules, the strict reading and canonical writing of the
//! file, and the JSON rules of `state` ([`OptimizerState::to_json`] and
//! [`OptimizerState::from_json`]). What it stores is defined once, in `optim`: the
//! hyper-parameters with AdamW's step ([`OptimizerState`], the same type a run's
//! config.json holds without the step) and the state keys; the update rules are
//! `optim`'s too. The trainer hands the optimizer's own state and tensors to
//! [`OptimizerFile`] without converting them.
//!
//! Invariants: AdamW holds exactly `<p>.exp_avg` and `<p>.exp_avg_sq` per parameter,
//! SGD `<p>.momentum_buffer` per parameter when momentum is nonzero (or none at all
//! before the first step, like torch) and nothing when it is zero; each array has its
//! parameter's shape; floats in the JSON are written in shortest round-trip form, so
//! reading them back gives the identical bits.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use crate::safetensors::{
    read_header, Dtype, Header, MappedFile, SafetensorsError, Tensor, TensorData,
};

/// Metadata key and value naming the format.
pub const FORMAT_KEY: &str = "format";
/// The format value of every tinyllm safetensors file.
pub const FORMAT_VALUE: &str = "tinyllm";
/// Metadata key holding the optimizer state JSON.
pub const STATE_KEY: &str = "state";
/// The per-parameter array keys, defined with the optimizer's hyper-parameters.
pub use crate::optim::{OptimizerState, ADAMW_KEYS, SGD_KEYS};

/// The on-disk rules of metadata `state`: its floats finite, its JSON compact and
/// strict. (Its fields and their order are [`crate::optim::Hyper`]'s.)
impl OptimizerState {
    fn floats(&self) -> Vec<(&'static str, f64)> {
        match *self {
            OptimizerState::AdamW {
                lr,
                betas,
                eps,
                weight_decay,
                ..
            } => vec![
                ("lr", lr),
                ("betas[0]", betas[0]),
                ("betas[1]", betas[1]),
                ("eps", eps),
                ("weight_decay", weight_decay),
            ],
            OptimizerState::Sgd {
                lr,
                momentum,
                dampening,
                weight_decay,
                ..
            } => vec![
                ("lr", lr),
                ("momentum", momentum),
                ("dampening", dampening),
                ("weight_decay", weight_decay),
            ],
        }
    }

    /// Every float finite (JSON cannot hold the others).
    pub fn check_finite(&self) -> Result<(), OptimizerError> {
        for (name, v) in self.floats() {
            if !v.is_finite() {
                return Err(OptimizerError::State(format!("{name} is {v}, not finite")));
            }
        }
        Ok(())
    }

    /// The compact JSON of metadata `state`.
    pub fn to_json(&self) -> Result<String, OptimizerError> {
        self.check_finite()?;
        serde_json::to_string(self).map_err(|e| OptimizerError::State(e.to_string()))
    }

    /// Parse metadata `state`.
    pub fn from_json(text: &str) -> Result<Self, OptimizerError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| OptimizerError::State(e.to_string()))?;
        if !value.is_object() {
            return Err(OptimizerError::State(
                "the state must be a JSON object".into(),
            ));
        }
        let s: OptimizerState =
            serde_json::from_str(text).map_err(|e| OptimizerError::State(e.to_string()))?;
        s.check_finite()?;
        Ok(s)
    }
}

/// Why an optimizer file was refused.
#[derive(Debug, thiserror::Error)]
pub enum OptimizerError {
    /// The `state` JSON is missing or breaks its schema.
    #[error("optimizer state: {0}")]
    State(String),
    /// Tensor names, shapes or dtypes do not match the optimizer and the model.
    #[error("{0}")]
    Layout(String),
    /// The file breaks a safetensors rule or cannot be read.
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
}

impl crate::failure::Failure for OptimizerError {
    fn kind(&self) -> crate::failure::FailureKind {
        match self {
            OptimizerError::Safetensors(e) => e.kind(),
            OptimizerError::State(_) | OptimizerError::Layout(_) => {
                crate::failure::FailureKind::Invalid
            }
        }
    }
}

/// A whole optimizer file: the state and every array by `<parameter>.<key>`.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerFile {
    /// Scalars and hyperparameters.
    pub state: OptimizerState,
    /// `<parameter>.<key>` to (shape, values).
    pub tensors: BTreeMap<String, (Vec<u64>, Vec<f32>)>,
}

/// Split `<parameter>.<key>` for one of `keys` (parameter names may hold dots).
fn split_name<'n>(name: &'n str, keys: &[&'static str]) -> Option<(&'n str, &'static str)> {
    // Longest key first, so `exp_avg_sq` is never read as `exp_avg`.
    let mut sorted: Vec<&'static str> = keys.to_vec();
    sorted.sort_by_key(|k| std::cmp::Reverse(k.len()));
    sorted.into_iter().find_map(|key| {
        let param = name.strip_suffix(key)?.strip_suffix('.')?;
        (!param.is_empty()).then_some((param, key))
    })
}

/// Check that `names_shapes` (tensor name to shape) is exactly the arrays `state`
/// needs for `params` (parameter name to shape); with `params` absent, that every
/// parameter it implies has all its arrays with one shape.
pub fn check_layout(
    state: &OptimizerState,
    names_shapes: &BTreeMap<&str, &[u64]>,
    params: Option<&BTreeMap<String, Vec<u64>>>,
) -> Result<(), OptimizerError> {
    let keys = state.state_keys();
    let mut implied: BTreeMap<&str, &[u64]> = BTreeMap::new();
    for (&name, &shape) in names_shapes {
        let (param, _) = split_name(name, keys).ok_or_else(|| {
            OptimizerError::Layout(format!(
                "tensor {} is not <parameter>.<{}>",
                crate::text::quote(name),
                if keys.is_empty() {
                    "nothing: SGD without momentum stores no arrays".to_string()
                } else {
                    keys.join("|")
                }
            ))
        })?;
        if let Some(prev) = implied.insert(param, shape) {
            if prev != shape {
                return Err(OptimizerError::Layout(format!(
                    "the arrays of parameter {} have different shapes",
                    crate::text::quote(param)
                )));
            }
        }
    }
    // SGD's momentum buffers exist only from the first step on (torch's are `None`
    // until then): with momentum, every parameter has one or none has.
    let sgd_before_first_step = matches!(state, OptimizerState::Sgd { .. }) && implied.is_empty();
    let expected: BTreeMap<&str, &[u64]> = match params {
        Some(_) if sgd_before_first_step => BTreeMap::new(),
        Some(p) => p.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect(),
        None => implied.clone(),
    };
    for (param, shape) in &expected {
        for key in keys {
            let name = format!("{param}.{key}");
            match names_shapes.get(name.as_str()) {
                None => {
                    return Err(OptimizerError::Layout(format!(
                        "missing tensor {}",
                        crate::text::quote(&name)
                    )))
                }
                Some(s) if s != shape => {
                    return Err(OptimizerError::Layout(format!(
                        "tensor {} has shape {s:?}, its parameter {shape:?}",
                        crate::text::quote(&name)
                    )))
                }
                Some(_) => {}
            }
        }
    }
    if let Some(param) = implied.keys().find(|p| !expected.contains_key(*p)) {
        return Err(OptimizerError::Layout(format!(
            "arrays for {}, which is not a parameter of the model",
            crate::text::quote(param)
        )));
    }
    Ok(())
}

/// Check a header as an optimizer file: format metadata, state JSON, F32 tensors, the
/// names and shapes the state implies (and exactly the model's parameters when given).
pub fn check_header(
    header: &Header,
    params: Option<&BTreeMap<String, Vec<u64>>>,
) -> Result<OptimizerState, OptimizerError> {
    check_format_keys(header)?;
    let text = header
        .metadata
        .get(STATE_KEY)
        .ok_or_else(|| OptimizerError::State("metadata has no `state`".into()))?;
    let state = OptimizerState::from_json(text)?;
    if let Some(t) = header.tensors().iter().find(|t| t.dtype != Dtype::F32) {
        return Err(OptimizerError::Layout(format!(
            "tensor {} is {}, not F32",
            crate::text::quote(&t.name),
            t.dtype.name()
        )));
    }
    let names: BTreeMap<&str, &[u64]> = header
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.shape.as_slice()))
        .collect();
    check_layout(&state, &names, params)?;
    Ok(state)
}

/// The metadata of an optimizer file: `format` is tinyllm's, no key but `format` and
/// `state`.
fn check_format_keys(header: &Header) -> Result<(), OptimizerError> {
    match header.metadata.get(FORMAT_KEY) {
        Some(v) if v == FORMAT_VALUE => {}
        other => {
            return Err(OptimizerError::Layout(format!(
                "metadata format is {}, not {FORMAT_VALUE:?}",
                other.map_or_else(|| "missing".to_string(), |s| crate::text::quote(s))
            )))
        }
    }
    if let Some(extra) = header
        .metadata
        .keys()
        .find(|k| *k != FORMAT_KEY && *k != STATE_KEY)
    {
        return Err(OptimizerError::Layout(format!(
            "unknown metadata key {}",
            crate::text::quote(extra)
        )));
    }
    Ok(())
}

/// The `type` prefix of an optimizer state written by `tlio.torch` (python.md): its
/// JSON is `{"type": "torch.<ClassName>", "param_groups": [..], "state": {..}}` and its
/// tensors keep their own dtypes under any `<param>.<key>` names.
pub const TORCH_TYPE_PREFIX: &str = "torch.";

/// True when the header's `state` JSON names a torch optimizer (python.md's form).
pub fn is_torch_state(header: &Header) -> bool {
    header.metadata.get(STATE_KEY).is_some_and(|text| {
        serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|v| v.get("type").and_then(|t| t.as_str().map(str::to_string)))
            .is_some_and(|t| t.starts_with(TORCH_TYPE_PREFIX))
    })
}

/// Check a header as a torch optimizer file: format metadata, the `state` JSON's shape
/// (`type`, `param_groups`, `state`), every tensor named `<param>.<key>` (the key holds
/// no dot) for a parameter of the model when `params` is given. Any dtype: torch keeps
/// each state tensor in its own.
pub fn check_torch_header(
    header: &Header,
    params: Option<&BTreeMap<String, Vec<u64>>>,
) -> Result<(), OptimizerError> {
    check_format_keys(header)?;
    let text = header
        .metadata
        .get(STATE_KEY)
        .ok_or_else(|| OptimizerError::State("metadata has no `state`".into()))?;
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| OptimizerError::State(e.to_string()))?;
    let groups = value.get("param_groups").and_then(|g| g.as_array());
    let state_ok = value.get("state").is_some_and(serde_json::Value::is_object);
    let Some(groups) = groups.filter(|_| state_ok) else {
        return Err(OptimizerError::State(
            "a torch optimizer state needs `param_groups` (a list) and `state` (an object)".into(),
        ));
    };
    let known = |p: &str| params.is_none_or(|ps| ps.contains_key(p));
    for group in groups {
        let names = group.get("params").and_then(|p| p.as_array());
        let Some(names) = names else {
            return Err(OptimizerError::State(
                "every param group needs `params`, a list of parameter names".into(),
            ));
        };
        for name in names {
            match name.as_str() {
                Some(n) if known(n) => {}
                _ => {
                    return Err(OptimizerError::Layout(format!(
                        "param group names {name}, which is not a parameter of the model"
                    )))
                }
            }
        }
    }
    for t in header.tensors() {
        let param = t.name.rsplit_once('.').map(|(p, _)| p);
        if !param.is_some_and(|p| !p.is_empty() && known(p)) {
            return Err(OptimizerError::Layout(format!(
                "tensor {} is not <parameter>.<key> for a parameter of the model",
                crate::text::quote(&t.name)
            )));
        }
    }
    Ok(())
}

/// Check a header as an optimizer file of either form: tlio's own optimizers
/// ([`check_header`]) or a torch optimizer's ([`check_torch_header`]).
pub fn check_any_header(
    header: &Header,
    params: Option<&BTreeMap<String, Vec<u64>>>,
) -> Result<(), OptimizerError> {
    if is_torch_state(header) {
        check_torch_header(header, params)
    } else {
        check_header(header, params).map(|_| ())
    }
}

/// The parameters (name to shape) of a model file, for `check_header`.
pub fn model_params(path: &Path) -> Result<BTreeMap<String, Vec<u64>>, SafetensorsError> {
    Ok(read_header(path)?
        .into_tensors()
        .into_iter()
        .map(|t| (t.name, t.shape))
        .collect())
}

impl OptimizerFile {
    /// Check the arrays against the state (and the model's parameters when given).
    pub fn validate(
        &self,
        params: Option<&BTreeMap<String, Vec<u64>>>,
    ) -> Result<(), OptimizerError> {
        self.state.check_finite()?;
        for (name, (shape, values)) in &self.tensors {
            let numel = crate::safetensors::dtype::numel(shape);
            if numel != Some(values.len() as u64) {
                return Err(OptimizerError::Layout(format!(
                    "tensor {} has {} values for shape {shape:?}",
                    crate::text::quote(name),
                    values.len()
                )));
            }
        }
        let names: BTreeMap<&str, &[u64]> = self
            .tensors
            .iter()
            .map(|(k, (s, _))| (k.as_str(), s.as_slice()))
            .collect();
        check_layout(&self.state, &names, params)
    }

    /// The metadata: `format` and the compact `state` JSON.
    pub fn metadata(&self) -> Result<BTreeMap<String, String>, OptimizerError> {
        Ok(BTreeMap::from([
            (FORMAT_KEY.to_string(), FORMAT_VALUE.to_string()),
            (STATE_KEY.to_string(), self.state.to_json()?),
        ]))
    }

    /// Write the file canonically to `out` (validated first); returns its size.
    pub fn write(&self, out: &mut dyn Write) -> Result<u64, OptimizerError> {
        self.validate(None)?;
        let meta = self.metadata()?;
        let tensors: Vec<Tensor<'_>> = self
            .tensors
            .iter()
            .map(|(name, (shape, values))| Tensor {
                name: name.clone(),
                dtype: Dtype::F32,
                shape: shape.clone(),
                data: TensorData::F32(values),
            })
            .collect();
        Ok(crate::safetensors::write(out, &tensors, &meta)?)
    }

    /// Read and validate an optimizer file (against the model's parameters when given).
    pub fn read(
        path: &Path,
        params: Option<&BTreeMap<String, Vec<u64>>>,
    ) -> Result<Self, OptimizerError> {
        let file = MappedFile::open(path)?;
        let state = check_header(file.header(), params)?;
        let mut tensors = BTreeMap::new();
        for t in file.header().tensors() {
            let values = file.decode_f32(&t.name)?;
            tensors.insert(t.name.clone(), (t.shape.clone(), values));
        }
        Ok(OptimizerFile { state, tensors })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_json_is_the_spec_example() {
        let a = OptimizerState::AdamW {
            step: 50,
            lr: 0.01,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.01,
        };
        assert_eq!(
            a.to_json().unwrap(),
            r#"{"type":"adamw","step":50,"lr":0.01,"betas":[0.9,0.999],"eps":1e-8,"weight_decay":0.01}"#
        );
        let s = OptimizerState::Sgd {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        };
        assert_eq!(
            s.to_json().unwrap(),
            r#"{"type":"sgd","lr":0.1,"momentum":0.9,"dampening":0.0,"nesterov":false,"weight_decay":0.0}"#
        );
        assert_eq!(OptimizerState::from_json(&a.to_json().unwrap()).unwrap(), a);
        for bad in [
            r#"{"type":"adamw","step":1,"lr":0.01,"betas":[0.9,0.999],"eps":1e-8}"#,
            r#"{"type":"adamw","step":-1,"lr":0.01,"betas":[0.9,0.999],"eps":1e-8,"weight_decay":0}"#,
            r#"{"type":"sgd","lr":0.1,"momentum":0.9,"dampening":0.0,"nesterov":false,"weight_decay":0.0,"x":1}"#,
            r#"{"type":"adam","lr":0.1}"#,
            r#"["sgd",0.1,0.9,0.0,false,0.0]"#,
        ] {
            assert!(OptimizerState::from_json(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn floats_roundtrip_bit_for_bit(lr: f64, b1: f64, b2: f64, eps: f64, wd: f64, step: u64) {
            let fin = |x: f64| if x.is_finite() { x } else { 0.5 };
            let a = OptimizerState::AdamW { step, lr: fin(lr), betas: [fin(b1), fin(b2)], eps: fin(eps), weight_decay: fin(wd) };
            let back = OptimizerState::from_json(&a.to_json().unwrap()).unwrap();
            let bits = |s: &OptimizerState| s.floats().iter().map(|(_, v)| v.to_bits()).collect::<Vec<_>>();
            proptest::prop_assert_eq!(bits(&back), bits(&a));
        }
    }

    #[test]
    fn names_split_on_the_longest_key() {
        assert_eq!(
            split_name("fc.weight.exp_avg_sq", &ADAMW_KEYS),
            Some(("fc.weight", "exp_avg_sq"))
        );
        assert_eq!(
            split_name("fc.weight.exp_avg", &ADAMW_KEYS),
            Some(("fc.weight", "exp_avg"))
        );
        assert_eq!(split_name(".exp_avg", &ADAMW_KEYS), None);
        assert_eq!(split_name("w.momentum_buffer", &ADAMW_KEYS), None);
    }
}
