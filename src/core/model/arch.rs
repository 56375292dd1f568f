//! Architecture checks against `config.json`: the tensor names and shapes of `bigram`
//! and `llama` (Hugging Face names), and the summary `st inspect` shows.
//!
//! Invariants: the architecture is `tl_arch` when present, else `llama` when
//! `model_type` is `llama` or `architectures` names `LlamaForCausalLM`, else unknown (no
//! name check); missing, unexpected and mis-shaped tensors are each one finding naming
//! the tensor; sizes from the config are checked (layer count limit, checked products)
//! before anything is built from them.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{finding, Model};
use crate::safetensors::verify::Findings;
use crate::safetensors::{Dtype, TensorInfo};
use crate::text::quote;

/// Most layers a config may declare before the check refuses to enumerate them.
pub const MAX_LAYERS: u64 = 100_000;
/// The bigram model's only tensor.
pub const BIGRAM_TENSOR: &str = "bigram.weight";

/// Which architecture a config describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arch {
    /// The tracer's bigram model.
    Bigram,
    /// Llama with Hugging Face names.
    Llama,
    /// Anything else (named, or not named at all).
    Unknown(Option<String>),
}

impl Arch {
    /// The name shown by `st inspect`.
    pub fn name(&self) -> String {
        match self {
            Arch::Bigram => "bigram".to_string(),
            Arch::Llama => "llama".to_string(),
            Arch::Unknown(Some(n)) => format!("unknown ({n})"),
            Arch::Unknown(None) => "unknown".to_string(),
        }
    }
}

/// The architecture `config` describes.
pub fn detect(config: Option<&Map<String, Value>>) -> Arch {
    let Some(c) = config else {
        return Arch::Unknown(None);
    };
    if let Some(a) = c.get("tl_arch") {
        return match a.as_str() {
            Some("bigram") => Arch::Bigram,
            Some("llama") => Arch::Llama,
            Some(other) => Arch::Unknown(Some(other.to_string())),
            None => Arch::Unknown(Some(a.to_string())),
        };
    }
    let llama_type = c.get("model_type").and_then(Value::as_str) == Some("llama");
    let llama_class = c
        .get("architectures")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some("LlamaForCausalLM")));
    if llama_type || llama_class {
        return Arch::Llama;
    }
    Arch::Unknown(
        c.get("model_type")
            .and_then(Value::as_str)
            .map(str::to_string),
    )
}

/// The llama sizes of a config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LlamaDims {
    /// h.
    pub hidden: u64,
    /// L.
    pub layers: u64,
    /// nh.
    pub heads: u64,
    /// nkv.
    pub kv_heads: u64,
    /// d.
    pub head_dim: u64,
    /// I.
    pub intermediate: u64,
    /// V.
    pub vocab: u64,
    /// tie_word_embeddings.
    pub tied: bool,
    /// attention_bias.
    pub attention_bias: bool,
}

fn int(c: &Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("config: {key} is {v}, not a non-negative integer")),
    }
}

fn flag(c: &Map<String, Value>, key: &str) -> Result<bool, String> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(format!("config: {key} is {v}, not true or false")),
    }
}

/// The llama sizes of `c`, or what is missing or wrong.
pub fn llama_dims(c: &Map<String, Value>) -> Result<LlamaDims, String> {
    let need = |key: &str| {
        int(c, key)?.ok_or_else(|| format!("config: {key} is missing (llama needs it)"))
    };
    let hidden = need("hidden_size")?;
    let layers = need("num_hidden_layers")?;
    let heads = need("num_attention_heads")?;
    let intermediate = need("intermediate_size")?;
    let vocab = need("vocab_size")?;
    let kv_heads = int(c, "num_key_value_heads")?.unwrap_or(heads);
    let head_dim = match int(c, "head_dim")? {
        Some(d) => d,
        None => {
            if heads == 0 || hidden % heads != 0 {
                return Err(format!(
                    "config: hidden_size {hidden} is not a multiple of num_attention_heads {heads} (and head_dim is not given)"
                ));
            }
            hidden / heads
        }
    };
    if layers > MAX_LAYERS {
        return Err(format!(
            "config: num_hidden_layers {layers} is over the limit of {MAX_LAYERS}"
        ));
    }
    Ok(LlamaDims {
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        vocab,
        tied: flag(c, "tie_word_embeddings")?,
        attention_bias: flag(c, "attention_bias")?,
    })
}

fn mul(a: u64, b: u64) -> Result<u64, String> {
    a.checked_mul(b)
        .ok_or_else(|| format!("config: {a} x {b} overflows 64 bits"))
}

/// Tensor name to shape.
type Shapes = BTreeMap<String, Vec<u64>>;

/// Expected llama tensors (name to shape) and the optional ones (attention biases).
fn llama_expected(d: &LlamaDims) -> Result<(Shapes, Shapes), String> {
    let (h, i_, v) = (d.hidden, d.intermediate, d.vocab);
    let q = mul(d.heads, d.head_dim)?;
    let kv = mul(d.kv_heads, d.head_dim)?;
    let mut want = BTreeMap::new();
    let mut optional = BTreeMap::new();
    want.insert("model.embed_tokens.weight".to_string(), vec![v, h]);
    for l in 0..d.layers {
        let p = format!("model.layers.{l}.");
        for (n, shape) in [
            ("self_attn.q_proj", vec![q, h]),
            ("self_attn.k_proj", vec![kv, h]),
            ("self_attn.v_proj", vec![kv, h]),
            ("self_attn.o_proj", vec![h, q]),
            ("mlp.gate_proj", vec![i_, h]),
            ("mlp.up_proj", vec![i_, h]),
            ("mlp.down_proj", vec![h, i_]),
        ] {
            want.insert(format!("{p}{n}.weight"), shape);
        }
        want.insert(format!("{p}input_layernorm.weight"), vec![h]);
        want.insert(format!("{p}post_attention_layernorm.weight"), vec![h]);
        if d.attention_bias {
            for (n, len) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv), ("o_proj", h)] {
                optional.insert(format!("{p}self_attn.{n}.bias"), vec![len]);
            }
        }
    }
    want.insert("model.norm.weight".to_string(), vec![h]);
    if !d.tied {
        want.insert("lm_head.weight".to_string(), vec![v, h]);
    }
    Ok((want, optional))
}

/// Check the model's logical tensors against its architecture.
pub fn check(model: &Model, problems: &mut Findings) {
    let config = model.config.as_ref();
    match detect(config) {
        Arch::Unknown(_) => {}
        Arch::Bigram => check_bigram(model, config, problems),
        Arch::Llama => {
            let Some(c) = config else { return };
            let dims = match llama_dims(c) {
                Ok(d) => d,
                Err(e) => {
                    return problems.push(finding(
                        "arch-config",
                        None,
                        format!("arch (llama): {e}"),
                    ))
                }
            };
            let (want, optional) = match llama_expected(&dims) {
                Ok(w) => w,
                Err(e) => {
                    return problems.push(finding(
                        "arch-config",
                        None,
                        format!("arch (llama): {e}"),
                    ))
                }
            };
            compare(model, "llama", &want, &optional, problems);
        }
    }
}

fn compare(
    model: &Model,
    arch: &str,
    want: &BTreeMap<String, Vec<u64>>,
    optional: &BTreeMap<String, Vec<u64>>,
    problems: &mut Findings,
) {
    for l in &model.logical {
        let expected = want.get(&l.name).or_else(|| optional.get(&l.name));
        match expected {
            None => problems.push(finding(
                "arch-unexpected",
                Some(&l.name),
                format!("arch ({arch}): unexpected tensor {}", quote(&l.name)),
            )),
            Some(shape) if *shape != l.shape => problems.push(finding(
                "arch-shape",
                Some(&l.name),
                format!(
                    "arch ({arch}): tensor {} has shape {:?}, the config needs {:?}",
                    quote(&l.name),
                    l.shape,
                    shape
                ),
            )),
            Some(_) => {}
        }
    }
    for name in want.keys() {
        if model.logical(name).is_none() {
            problems.push(finding(
                "arch-missing",
                Some(name),
                format!("arch ({arch}): missing tensor {}", quote(name)),
            ));
        }
    }
}

fn check_bigram(model: &Model, config: Option<&Map<String, Value>>, problems: &mut Findings) {
    let vocab = match config.map(|c| int(c, "vocab_size")).transpose() {
        Ok(v) => v.flatten(),
        Err(e) => {
            return problems.push(finding("arch-config", None, format!("arch (bigram): {e}")))
        }
    };
    let found = model.entries.iter().find(|e| e.info.name == BIGRAM_TENSOR);
    let shape_ok = |t: &TensorInfo| match (t.shape.as_slice(), vocab) {
        (&[a, b], Some(v)) => a == v && b == v,
        (&[a, b], None) => a == b,
        _ => false,
    };
    match found {
        None => problems.push(finding(
            "arch-missing",
            Some(BIGRAM_TENSOR),
            format!("arch (bigram): missing tensor {}", quote(BIGRAM_TENSOR)),
        )),
        Some(e) if e.info.dtype != Dtype::F32 => problems.push(finding(
            "arch-dtype",
            Some(BIGRAM_TENSOR),
            format!(
                "arch (bigram): tensor {} is {}, not F32",
                quote(BIGRAM_TENSOR),
                e.info.dtype
            ),
        )),
        Some(e) if !shape_ok(&e.info) => problems.push(finding(
            "arch-shape",
            Some(BIGRAM_TENSOR),
            format!(
                "arch (bigram): tensor {} has shape {:?}, it must be [V, V]{}",
                quote(BIGRAM_TENSOR),
                e.info.shape,
                vocab.map_or(String::new(), |v| format!(" with V = vocab_size = {v}"))
            ),
        )),
        Some(_) => {}
    }
    for l in &model.logical {
        if l.name != BIGRAM_TENSOR {
            problems.push(finding(
                "arch-unexpected",
                Some(&l.name),
                format!("arch (bigram): unexpected tensor {}", quote(&l.name)),
            ));
        }
    }
}

/// What `st inspect` says about a model as a whole.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Summary {
    /// The architecture name.
    pub arch: String,
    /// Layers (llama).
    pub layers: Option<u64>,
    /// Hidden size (llama).
    pub hidden: Option<u64>,
    /// Attention heads (llama).
    pub heads: Option<u64>,
    /// Key/value heads (llama).
    pub kv_heads: Option<u64>,
    /// MLP intermediate size (llama).
    pub intermediate: Option<u64>,
    /// Vocabulary size (config's vocab_size).
    pub vocab: Option<u64>,
    /// Tied input and output embeddings (llama).
    pub tied_embeddings: Option<bool>,
    /// Parameters of every logical tensor.
    pub params: u64,
    /// Stored bytes by dtype (`int4-gG-sym` counts qweight and scales).
    pub dtypes: BTreeMap<String, u64>,
    /// Stored tensor bytes in total.
    pub bytes: u64,
    /// The quantization (`quant` metadata), if any.
    pub quantization: Option<String>,
    /// Number of safetensors files.
    pub shards: usize,
    /// The config's torch_dtype, when given.
    pub torch_dtype: Option<String>,
}

/// The summary of `model`.
pub fn summary(model: &Model) -> Summary {
    let config = model.config.as_ref();
    let arch = detect(config);
    let dims = match (&arch, config) {
        (Arch::Llama, Some(c)) => llama_dims(c).ok(),
        _ => None,
    };
    let vocab = config.and_then(|c| int(c, "vocab_size").ok().flatten());
    Summary {
        arch: arch.name(),
        layers: dims.map(|d| d.layers),
        hidden: dims.map(|d| d.hidden),
        heads: dims.map(|d| d.heads),
        kv_heads: dims.map(|d| d.kv_heads),
        intermediate: dims.map(|d| d.intermediate),
        vocab,
        tied_embeddings: dims.map(|d| d.tied),
        params: model.params(),
        dtypes: model.dtype_mix(),
        bytes: model.data_bytes(),
        quantization: model.quant.clone(),
        shards: model.shards.len(),
        torch_dtype: config
            .and_then(|c| c.get("torch_dtype").or_else(|| c.get("dtype")))
            .and_then(Value::as_str)
            .map(str::to_string),
    }
}
