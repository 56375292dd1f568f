//! The reader rules of MX pairs in a model: which tensors pair up (MXFP4 `NAME_blocks`
//! with `NAME_scales`, MXFP8 `NAME.weight` F8_E4M3 with `NAME.weight_scale`), their
//! dtypes and shapes, and that the `quant` metadata is there exactly when pairs are.
//!
//! Invariant: every broken rule is one finding naming the tensor and the rule; the
//! tensors stay as stored (a pair is never half-read).

use super::mx::{
    MxFormat, BLOCK, BLOCKS_SUFFIX, FP4_SCALES_SUFFIX, FP8_SCALE_SUFFIX, MXFP4, WEIGHT_SUFFIX,
};
use super::{finding, Entry, Logical, Storage};
use crate::safetensors::verify::Findings;
use crate::safetensors::{Dtype, TensorInfo};
use crate::text::quote;

/// The MX pairs of `entries` (sorted by name) under `fmt` as logical tensors, and
/// which entries they hold; each broken rule is pushed to `problems` (its tensors stay
/// plain).
pub fn pairs(
    entries: &[Entry],
    fmt: MxFormat,
    problems: &mut Findings,
) -> (Vec<Logical>, Vec<bool>) {
    let find = |name: &str| {
        entries
            .binary_search_by(|e| e.info.name.as_str().cmp(name))
            .ok()
    };
    let (elem_suffix, scale_suffix) = suffixes(fmt);
    let mut out = Vec::new();
    let mut paired = vec![false; entries.len()];
    for (i, e) in entries.iter().enumerate() {
        let name = &e.info.name;
        if let Some(base) = name.strip_suffix(scale_suffix) {
            let partner = format!("{base}{elem_suffix}");
            if find(&partner).is_none() {
                let detail = format!(
                    "scales {} have no elements {}",
                    quote(name),
                    quote(&partner)
                );
                problems.push(rule(name, detail));
            }
            continue;
        }
        let Some(base) = name.strip_suffix(elem_suffix) else {
            continue;
        };
        let scale_name = format!("{base}{scale_suffix}");
        let Some(si) = find(&scale_name) else {
            // An MXFP8 model may keep unquantized `.weight` tensors of other dtypes.
            if fmt == MxFormat::Fp4 || e.info.dtype == Dtype::F8_E4M3 {
                let detail = format!(
                    "elements {} have no scales {}",
                    quote(name),
                    quote(&scale_name)
                );
                problems.push(rule(name, detail));
            }
            continue;
        };
        let Some(s) = entries.get(si) else { continue };
        match pair_shape(&e.info, &s.info, fmt) {
            Ok(shape) => {
                for k in [i, si] {
                    if let Some(p) = paired.get_mut(k) {
                        *p = true;
                    }
                }
                out.push(Logical {
                    name: logical_name(base, fmt, shape.len()),
                    shape,
                    storage: Storage::Mx {
                        elems: i,
                        scales: si,
                        fmt,
                    },
                });
            }
            Err(detail) => problems.push(rule(base, format!("tensor {}: {detail}", quote(base)))),
        }
    }
    (out, paired)
}

/// [`pairs`], and the rule that `quant` (`q`, naming `fmt`) has pairs to describe.
pub fn logical(
    entries: &[Entry],
    q: &str,
    fmt: MxFormat,
    problems: &mut Findings,
) -> (Vec<Logical>, Vec<bool>) {
    let found = pairs(entries, fmt, problems);
    if !has_candidates(entries, fmt) {
        problems.push(finding(
            "mx-quant",
            None,
            format!(
                "mx (quant): metadata quant is {} but the model has no MX pair",
                quote(q)
            ),
        ));
    }
    found
}

/// Whether any entry is named (and typed) as half of an MX pair of `fmt`.
pub fn has_candidates(entries: &[Entry], fmt: MxFormat) -> bool {
    let (elem_suffix, scale_suffix) = suffixes(fmt);
    entries.iter().any(|e| {
        let n = &e.info.name;
        n.ends_with(scale_suffix)
            || (n.ends_with(elem_suffix)
                && (fmt == MxFormat::Fp4 || e.info.dtype == Dtype::F8_E4M3))
    })
}

/// The key of `config.json` describing a quantized model (transformers).
pub const QUANTIZATION_CONFIG: &str = "quantization_config";

/// `"mxfp4"` when `config` says the model is MXFP4 (`quantization_config.quant_method`,
/// as gpt-oss ships it).
pub fn config_quant(config: Option<&serde_json::Map<String, serde_json::Value>>) -> Option<String> {
    let method = config?
        .get(QUANTIZATION_CONFIG)?
        .get("quant_method")?
        .as_str()?;
    (method == MXFP4).then(|| MXFP4.to_string())
}

/// The (elements, scales) name suffixes of `fmt`.
pub fn suffixes(fmt: MxFormat) -> (&'static str, &'static str) {
    match fmt {
        MxFormat::Fp4 => (BLOCKS_SUFFIX, FP4_SCALES_SUFFIX),
        MxFormat::Fp8 => (WEIGHT_SUFFIX, FP8_SCALE_SUFFIX),
    }
}

/// The name of the tensor a pair stands for (what dequantizing writes): MXFP8 keeps its
/// `.weight`; an MXFP4 pair of rank 3 or more is a gpt-oss experts parameter, named
/// without `.weight` as transformers names it, and a 2-D one a linear `NAME.weight`.
pub fn logical_name(base: &str, fmt: MxFormat, rank: usize) -> String {
    match fmt {
        MxFormat::Fp8 => format!("{base}{WEIGHT_SUFFIX}"),
        MxFormat::Fp4 if rank >= 3 => base.to_string(),
        MxFormat::Fp4 => format!("{base}{WEIGHT_SUFFIX}"),
    }
}

/// Whether dequantizing an MXFP4 pair of this logical rank swaps its last two axes (the
/// gpt-oss experts, stored `[E, out, in]` and used `[E, in, out]` by transformers).
pub fn transposed(fmt: MxFormat, rank: usize) -> bool {
    fmt == MxFormat::Fp4 && rank >= 3
}

fn rule(tensor: &str, detail: String) -> crate::safetensors::verify::Finding {
    finding("mx-pair", Some(tensor), format!("mx (pair): {detail}"))
}

/// The logical `[..., n]` of a pair, or what is wrong with its dtypes and shapes.
pub fn pair_shape(
    elems: &TensorInfo,
    scales: &TensorInfo,
    fmt: MxFormat,
) -> Result<Vec<u64>, String> {
    if !matches!(scales.dtype, Dtype::U8 | Dtype::F8_E8M0) {
        return Err(format!("scales are {}, not U8 or F8_E8M0", scales.dtype));
    }
    let block = BLOCK as u64;
    let logical = match fmt {
        MxFormat::Fp4 => {
            if elems.dtype != Dtype::U8 {
                return Err(format!("blocks are {}, not U8", elems.dtype));
            }
            let Some((&16, rest)) = elems.shape.split_last() else {
                return Err(format!(
                    "blocks {:?} must end in 16 bytes (32 E2M1 codes) a block",
                    elems.shape
                ));
            };
            let Some((&nb, prefix)) = rest.split_last() else {
                return Err(format!("blocks {:?} must be [..., n/32, 16]", elems.shape));
            };
            let n = nb
                .checked_mul(block)
                .ok_or_else(|| format!("blocks {:?} are too large", elems.shape))?;
            let mut l = prefix.to_vec();
            l.push(n);
            l
        }
        MxFormat::Fp8 => {
            if elems.dtype != Dtype::F8_E4M3 {
                return Err(format!("elements are {}, not F8_E4M3", elems.dtype));
            }
            match elems.shape.last() {
                Some(&n) if n % block == 0 => elems.shape.clone(),
                _ => {
                    return Err(format!(
                        "elements {:?}: the last axis must be a multiple of {BLOCK}",
                        elems.shape
                    ))
                }
            }
        }
    };
    let (Some((&n, prefix)), Some((&sn, sprefix))) =
        (logical.split_last(), scales.shape.split_last())
    else {
        return Err("elements and scales must have at least one axis".to_string());
    };
    if prefix != sprefix || sn != n / block {
        return Err(format!(
            "elements mean [..., n] = {logical:?}, so scales must be {:?} (one per 32 values), but scales are {:?}",
            [prefix, &[n / block]].concat(),
            scales.shape
        ));
    }
    Ok(logical)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, dtype: Dtype, shape: &[u64]) -> Entry {
        Entry {
            shard: 0,
            info: TensorInfo {
                name: name.to_string(),
                dtype,
                shape: shape.to_vec(),
                data_offsets: (0, 0),
            },
        }
    }

    fn messages(mut entries: Vec<Entry>, fmt: MxFormat) -> (usize, Vec<String>) {
        entries.sort_by(|a, b| a.info.name.cmp(&b.info.name));
        let mut p = Findings::new();
        let n = pairs(&entries, fmt, &mut p).0.len();
        (n, p.kept().iter().map(|f| f.message.clone()).collect())
    }

    /// gpt-oss's layout pairs up; a missing half and scales of the wrong shape or
    /// dtype are each refused with the rule named.
    #[test]
    fn mxfp4_pairs_follow_the_gpt_oss_layout() {
        let ok = vec![
            entry("e.gate_up_proj_blocks", Dtype::U8, &[4, 64, 2, 16]),
            entry("e.gate_up_proj_scales", Dtype::U8, &[4, 64, 2]),
            entry("norm.weight", Dtype::BF16, &[64]),
        ];
        assert_eq!(messages(ok, MxFormat::Fp4), (1, vec![]));
        let (_, m) = messages(
            vec![entry("a_blocks", Dtype::U8, &[2, 1, 16])],
            MxFormat::Fp4,
        );
        assert!(
            m[0].contains("mx (pair)") && m[0].contains("no scales"),
            "{m:?}"
        );
        let (_, m) = messages(vec![entry("a_scales", Dtype::U8, &[2, 1])], MxFormat::Fp4);
        assert!(m[0].contains("no elements"), "{m:?}");
        let bad = vec![
            entry("a_blocks", Dtype::U8, &[2, 1, 16]),
            entry("a_scales", Dtype::U8, &[2, 2]),
        ];
        let (_, m) = messages(bad, MxFormat::Fp4);
        assert!(m[0].contains("scales must be [2, 1]"), "{m:?}");
        let bad = vec![
            entry("a_blocks", Dtype::U8, &[2, 1, 16]),
            entry("a_scales", Dtype::F16, &[2, 1]),
        ];
        assert!(messages(bad, MxFormat::Fp4).1[0].contains("not U8 or F8_E8M0"));
    }

    /// MXFP8 pairs: F8_E4M3 elements whose last axis is a multiple of 32, F8_E8M0
    /// scales one per block; a plain BF16 `.weight` without scales is not a pair.
    #[test]
    fn mxfp8_pairs_need_whole_blocks() {
        let ok = vec![
            entry("l.weight", Dtype::F8_E4M3, &[3, 64]),
            entry("l.weight_scale", Dtype::F8_E8M0, &[3, 2]),
            entry("norm.weight", Dtype::BF16, &[64]),
        ];
        assert_eq!(messages(ok, MxFormat::Fp8), (1, vec![]));
        let bad = vec![
            entry("l.weight", Dtype::F8_E4M3, &[3, 40]),
            entry("l.weight_scale", Dtype::F8_E8M0, &[3, 1]),
        ];
        assert!(messages(bad, MxFormat::Fp8).1[0].contains("multiple of 32"));
        let lone = vec![entry("l.weight", Dtype::F8_E4M3, &[3, 64])];
        assert!(messages(lone, MxFormat::Fp8).1[0].contains("no scales"));
    }

    /// A pair is one logical tensor named as dequantizing writes it: gpt-oss experts
    /// (rank 3) without `.weight`, a 2-D MXFP4 pair and every MXFP8 pair with it.
    #[test]
    fn pairs_are_named_as_their_dequantized_tensor() {
        let mut entries = vec![
            entry("e.down_proj_blocks", Dtype::U8, &[2, 8, 2, 16]),
            entry("e.down_proj_scales", Dtype::U8, &[2, 8, 2]),
            entry("l_blocks", Dtype::U8, &[3, 1, 16]),
            entry("l_scales", Dtype::F8_E8M0, &[3, 1]),
        ];
        entries.sort_by(|a, b| a.info.name.cmp(&b.info.name));
        let mut p = Findings::new();
        let (l, paired) = pairs(&entries, MxFormat::Fp4, &mut p);
        assert!(p.is_empty());
        assert!(paired.iter().all(|&b| b));
        let named: Vec<_> = l
            .iter()
            .map(|l| (l.name.as_str(), l.shape.clone()))
            .collect();
        assert_eq!(
            named,
            vec![("e.down_proj", vec![2, 8, 64]), ("l.weight", vec![3, 32])]
        );
        assert!(transposed(MxFormat::Fp4, 3) && !transposed(MxFormat::Fp4, 2));
        assert!(!transposed(MxFormat::Fp8, 3));
    }

    /// The rule of a broken pair is named in every finding.
    #[test]
    fn broken_pairs_name_the_rule() {
        let bad = vec![entry("a_blocks", Dtype::U8, &[2, 1, 8])];
        let mut p = Findings::new();
        pairs(&bad, MxFormat::Fp4, &mut p);
        assert_eq!(p.kept()[0].rule, "mx-pair");
        assert_eq!(p.kept()[0].tensor.as_deref(), Some("a_blocks"));
    }

    /// gpt-oss's config names MXFP4 without any `quant` metadata in its shards.
    #[test]
    fn the_config_can_name_mxfp4() {
        let c = serde_json::json!({"quantization_config": {"quant_method": "mxfp4"}});
        assert_eq!(config_quant(c.as_object()).as_deref(), Some("mxfp4"));
        let c = serde_json::json!({"quantization_config": {"quant_method": "fp8"}});
        assert_eq!(config_quant(c.as_object()), None);
        assert_eq!(config_quant(None), None);
    }
}
