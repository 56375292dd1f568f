//! Argument types shared by several commands, so that one concept is spelled and
//! completed the same way everywhere (docs/cli.md, "Grammar").
//!
//! Invariant: the canonical name of every value is what tlio prints; aliases are only
//! ever accepted, never shown.

use clap::ValueEnum;

use tlio_core::safetensors::Dtype;

/// A float dtype tlio can encode (`st convert --dtype`): the safetensors name is
/// canonical, and the names people type in PyTorch, NumPy and ML papers are accepted
/// in any case. Completion offers the canonical names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FloatDtype {
    /// IEEE binary64 (also f64, float64, double).
    #[value(name = "F64", alias = "float64", alias = "double")]
    F64,
    /// IEEE binary32 (also f32, float32, float).
    #[value(name = "F32", alias = "float32", alias = "float")]
    F32,
    /// bfloat16 (also bf16, bfloat16).
    #[value(name = "BF16", alias = "bfloat16")]
    Bf16,
    /// IEEE binary16 (also f16, fp16, float16, half).
    #[value(name = "F16", alias = "fp16", alias = "float16", alias = "half")]
    F16,
    /// fp8 E4M3 "fn", max 448, no infinity (also fp8_e4m3, float8_e4m3fn).
    #[value(name = "F8_E4M3", alias = "fp8_e4m3", alias = "float8_e4m3fn")]
    F8E4m3,
    /// fp8 E5M2 (also fp8_e5m2, float8_e5m2).
    #[value(name = "F8_E5M2", alias = "fp8_e5m2", alias = "float8_e5m2")]
    F8E5m2,
}

impl From<FloatDtype> for Dtype {
    fn from(d: FloatDtype) -> Dtype {
        match d {
            FloatDtype::F64 => Dtype::F64,
            FloatDtype::F32 => Dtype::F32,
            FloatDtype::Bf16 => Dtype::BF16,
            FloatDtype::F16 => Dtype::F16,
            FloatDtype::F8E4m3 => Dtype::F8_E4M3,
            FloatDtype::F8E5m2 => Dtype::F8_E5M2,
        }
    }
}

/// A float flag of the trainer (`--lr`, `--weight-decay`, `--momentum`): a number that
/// is finite in f32, where the trainer computes, and not negative. Every such flag is
/// checked here, when the command line is parsed, so a bad value is a usage error
/// (exit 2) naming the flag and the range, before anything is read or created.
pub fn train_float(s: &str) -> Result<f64, String> {
    let range = format!("a number in [0, {:e}] (finite in f32)", f32::MAX);
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("not a number; expected {range}"))?;
    if !v.is_finite() || v.abs() > f64::from(f32::MAX) {
        return Err(format!(
            "{} is not finite in f32; expected {range}",
            s.trim()
        ));
    }
    if v < 0.0 {
        return Err(format!("{} is negative; expected {range}", s.trim()));
    }
    Ok(v)
}

/// A byte size as Hugging Face's `max_shard_size` spells it: a number of bytes, or a
/// number with a decimal (`KB`, `MB`, `GB`, `TB`) or binary (`KiB`, `MiB`, `GiB`,
/// `TiB`) unit, case-insensitive (`5GB`, `500MiB`, `1000000`). At least one byte.
pub fn byte_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 5GB, 500MiB or a number of bytes)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "{s:?} has an unknown unit (KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            ))
        }
    };
    match n.checked_mul(scale) {
        Some(0) => Err("a shard size must be at least one byte".to_string()),
        Some(v) => Ok(v),
        None => Err(format!("{s:?} is too large")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn train_floats_are_finite_in_f32_and_not_negative() {
        assert_eq!(train_float("0.01"), Ok(0.01));
        assert_eq!(train_float("0"), Ok(0.0));
        for bad in ["1e39", "nan", "NaN", "inf", "-inf", "-1", "-0.5", "x", ""] {
            assert!(train_float(bad).is_err(), "{bad}");
        }
        assert!(train_float("1e39")
            .unwrap_err()
            .contains("not finite in f32"));
        assert!(train_float("-1").unwrap_err().contains("negative"));
    }

    fn parse(s: &str) -> Option<Dtype> {
        FloatDtype::from_str(s, true).ok().map(Dtype::from)
    }

    #[test]
    fn every_name_people_type_is_accepted_in_any_case() {
        let cases: &[(&[&str], Dtype)] = &[
            (&["bf16", "BF16", "bfloat16", "BFloat16"], Dtype::BF16),
            (
                &["fp16", "F16", "float16", "half", "HALF", "f16"],
                Dtype::F16,
            ),
            (&["f32", "float32", "float", "F32", "Float"], Dtype::F32),
            (&["f64", "float64", "F64", "double"], Dtype::F64),
            (
                &["fp8_e4m3", "float8_e4m3fn", "F8_E4M3", "f8_e4m3"],
                Dtype::F8_E4M3,
            ),
            (
                &["fp8_e5m2", "float8_e5m2", "F8_E5M2", "f8_e5m2"],
                Dtype::F8_E5M2,
            ),
        ];
        for (names, want) in cases {
            for name in *names {
                assert_eq!(parse(name), Some(*want), "{name}");
            }
        }
        for bad in ["I32", "int8", "f8", "", "bf 16"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_canonical_name_is_the_safetensors_name() {
        for v in FloatDtype::value_variants() {
            let shown = v.to_possible_value().map(|p| p.get_name().to_string());
            assert_eq!(shown, Some(Dtype::from(*v).to_string()));
        }
    }

    #[test]
    fn byte_sizes_take_decimal_and_binary_units() {
        assert_eq!(byte_size("5GB"), Ok(5_000_000_000));
        assert_eq!(byte_size("500MiB"), Ok(500 << 20));
        assert_eq!(byte_size("1000"), Ok(1000));
        assert!(byte_size("0").is_err());
        assert!(byte_size("5 parsecs").is_err());
        assert!(byte_size("99999999999999999999TB").is_err());
    }
}
